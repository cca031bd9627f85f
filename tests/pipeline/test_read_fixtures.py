"""Reading the real broker data dirs of `tests/fixtures/kafka` through Spark.

The oracle is kafka-python's `DefaultRecordBatch`, decoding the same `.log` files batch by batch:
every partition's rows (key, value, topic, partition, offset, timestamp, timestampType, headers)
must be what it decodes, from the log start offset on, control batches left out. Every folder of
the fixtures is accounted for: the broker data dirs are read, the legacy (magic 0) dir reads as
its `golden/` values (tests/pipeline/test_legacy_read.py reads more legacy data), and the one
folder that is not a log dir is checked to be one (it holds record sets captured from fetch
responses).
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pytest
from kafka.record.default_records import DefaultRecordBatch

from tests.conftest import kafka_fixtures
from tests.pipeline.conftest import read_table

FIXTURES = kafka_fixtures()
DATA_DIRS = {
    "bigdata-sensor-suhu": "one partition, clean shutdown",
    "experts-kafka-data": "KRaft: __consumer_offsets, __cluster_metadata, idempotent producers",
    "flink-on-prem-cp760": "KRaft, 35 partitions, lz4, LogAppendTime, a control batch",
    "ne-streaming-d95be01": "small KRaft dir, control batches in the metadata log",
    "spooldir-cp512": "ZooKeeper mode, lz4 + LogAppendTime, no index files",
}
LEGACY_DIRS = {"kafkalite-magic0": "legacy magic 0 segments"}
NOT_LOG_DIRS = {"kafka-go-fetch-fixtures": "record sets captured from fetch responses"}
LOG_APPEND_TIME = 1

Row = tuple  # (topic, partition, offset, key, value, timestamp ms, timestampType, headers)


def _partition_dirs(data_dir: Path) -> list[Path]:
    return sorted(p for p in data_dir.iterdir() if p.is_dir() and any(p.glob("*.log")))


def _topic_partition(directory: Path) -> tuple[str, int]:
    topic, _, partition = directory.name.rpartition("-")
    return topic, int(partition)


def _log_start_offsets(data_dir: Path) -> dict[tuple[str, int], int]:
    path = data_dir / "log-start-offset-checkpoint"
    if not path.exists():
        return {}
    lines = path.read_text(encoding="utf-8").splitlines()[2:]
    return {(t, int(p)): int(o) for t, p, o in (line.split(" ") for line in lines)}


def oracle_rows(data_dir: Path) -> list[Row]:
    """Every user record of every partition, as kafka-python decodes the `.log` files."""
    starts = _log_start_offsets(data_dir)
    rows = []
    for directory in _partition_dirs(data_dir):
        topic, partition = _topic_partition(directory)
        logs = sorted(directory.glob("*.log"))
        start = max(starts.get((topic, partition), 0), int(logs[0].name.split(".")[0]))
        for log in logs:
            data = log.read_bytes()
            position = 0
            while position < len(data):
                size = int.from_bytes(data[position + 8 : position + 12], "big") + 12
                batch = DefaultRecordBatch(data[position : position + size])
                assert batch.validate_crc(), f"{log} position {position}: CRC"
                position += size
                if batch.is_control_batch:
                    continue
                for record in batch:
                    if record.offset < start:
                        continue
                    timestamp = batch.max_timestamp if batch.timestamp_type == LOG_APPEND_TIME else record.timestamp
                    headers = tuple((key, value) for key, value in record.headers)
                    rows.append(
                        (
                            topic,
                            partition,
                            record.offset,
                            record.key,
                            record.value,
                            timestamp,
                            batch.timestamp_type,
                            headers,
                        )
                    )
    return rows


def table_rows(table: pa.Table) -> list[Row]:
    """The rows of a seglog read, in the oracle's shape (timestamps back to epoch ms)."""
    columns = {name: table.column(name).to_pylist() for name in table.column_names if name != "timestamp"}
    micros = table.column("timestamp").cast(pa.int64()).to_pylist()
    headers = columns.get("headers") or [None] * table.num_rows
    return [
        (
            columns["topic"][i],
            columns["partition"][i],
            columns["offset"][i],
            columns["key"][i],
            columns["value"][i],
            micros[i] // 1000,
            columns["timestampType"][i],
            tuple((h["key"], h["value"]) for h in headers[i] or ()),
        )
        for i in range(table.num_rows)
    ]


def test_every_fixture_folder_is_accounted_for() -> None:
    folders = {p.name for p in FIXTURES.iterdir() if p.is_dir()}
    assert folders == set(DATA_DIRS) | set(LEGACY_DIRS) | set(NOT_LOG_DIRS)
    for name in DATA_DIRS:
        assert _partition_dirs(FIXTURES / name), f"{name} holds no partition dirs"
    for name in NOT_LOG_DIRS:
        assert not _partition_dirs(FIXTURES / name)


@pytest.mark.parametrize("name", sorted(DATA_DIRS))
def test_broker_data_dir_reads_as_kafka_python_decodes_it(spark, name: str) -> None:
    data_dir = FIXTURES / name
    assign: dict[str, list[int]] = {}
    for directory in _partition_dirs(data_dir):
        topic, partition = _topic_partition(directory)
        assign.setdefault(topic, []).append(partition)
    table = read_table(spark, data_dir, assign=json.dumps(assign), includeHeaders="true")
    expected = oracle_rows(data_dir)
    actual = table_rows(table)
    counts = Counter((row[0], row[1]) for row in actual)
    expected_counts = Counter((row[0], row[1]) for row in expected)
    assert counts == expected_counts
    actual.sort(key=lambda row: (row[0], row[1], row[2]))
    expected.sort(key=lambda row: (row[0], row[1], row[2]))
    for got, want in zip(actual, expected, strict=True):
        assert got == want, f"{name}: {got!r} != {want!r}"
    assert table.schema.field("timestamp").type == pa.timestamp("us", tz="UTC")


def test_broker_data_dir_without_headers_has_the_kafka_schema(spark) -> None:
    data_dir = FIXTURES / "flink-on-prem-cp760"
    table = read_table(spark, data_dir, subscribe="orders")
    assert table.column_names == ["key", "value", "topic", "partition", "offset", "timestamp", "timestampType"]
    assert [str(t) for t in table.schema.types] == [
        "binary",
        "binary",
        "string",
        "int32",
        "int64",
        "timestamp[us, tz=UTC]",
        "int32",
    ]
    assert table.num_rows == sum(1 for row in oracle_rows(data_dir) if row[0] == "orders")


def test_legacy_message_format_dir_reads_as_its_golden_values(spark) -> None:
    table = read_table(spark, FIXTURES / "kafkalite-magic0", subscribePattern=".*")
    rows = sorted(
        zip(
            table.column("topic").to_pylist(),
            table.column("offset").to_pylist(),
            table.column("value").to_pylist(),
            strict=True,
        )
    )
    expected = []
    for path in sorted((FIXTURES / "kafkalite-magic0" / "golden").iterdir()):
        topic = path.name.rsplit("-", 1)[0]
        for line in path.read_text().splitlines():
            offset, quoted = line.split(": ", 1)
            expected.append((topic, int(offset), json.loads(quoted).encode()))
    assert rows == sorted(expected)
    assert set(table.column("timestampType").to_pylist()) == {-1}


def test_a_folder_that_is_not_a_log_dir_has_no_topics(spark) -> None:
    assert read_table(spark, FIXTURES / "kafka-go-fetch-fixtures", subscribePattern=".*").num_rows == 0
