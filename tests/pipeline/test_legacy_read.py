"""The Spark source over legacy message data (magic 0 and 1, every codec, magic 1 then v2 in one
segment): the rows are the records the engine reads, in Spark's Kafka schema (magic 0: timestamp
-1 ms and timestampType -1, as Kafka's NO_TIMESTAMP and NO_TIMESTAMP_TYPE), and pushed-down
offset and timestamp bounds select the same rows as over v2 data."""

from __future__ import annotations

import datetime
import shutil
from pathlib import Path

from seglogfs.engine import DataDir
from seglogfs.engine.record.builder import build_batch
from tests.conftest import NOW_MS, broker_config, kafka_fixtures
from tests.engine.test_legacy import GZIP, LZ4, NONE, SNAPPY, golden, message_set, sample, write_segment
from tests.pipeline.conftest import read_table

Row = tuple  # (offset, key, value, timestamp ms, timestampType)


def legacy_data(tmp_path: Path) -> Path:
    data = tmp_path / "data"
    data.mkdir()
    shutil.copytree(kafka_fixtures() / "kafkalite-magic0" / "hamlet-snappy-0", data / "hamlet-snappy-0")
    parts, offset = [], 0
    for codec in (NONE, GZIP, SNAPPY, LZ4):
        parts.append(message_set(1, codec, sample(1, 6, offset), offset))
        offset += 6
    parts.append(bytes(build_batch([b"v2-a", None], keys=[b"k", None], timestamps=NOW_MS, base_offset=offset)))
    write_segment(data, "mixed", b"".join(parts))
    return data


def engine_rows(data: Path, topic: str) -> list[Row]:
    with DataDir.open(broker_config(data), read_only=True, now_ms=NOW_MS) as data_dir:
        return [
            (r.offset, r.key, r.value, r.timestamp, int(r.timestamp_type))
            for r in data_dir.partition(topic, 0).records(0)
        ]


def spark_rows(table) -> list[Row]:
    epoch = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)
    return [
        (
            row["offset"],
            row["key"],
            row["value"],
            (row["timestamp"] - epoch) // datetime.timedelta(milliseconds=1),
            row["timestampType"],
        )
        for row in sorted(table.to_pylist(), key=lambda row: row["offset"])
    ]


def test_legacy_partitions_read_as_the_engine_reads_them(spark, tmp_path: Path) -> None:
    data = legacy_data(tmp_path)
    hamlet = read_table(spark, data, subscribe="hamlet-snappy")
    rows = spark_rows(hamlet)
    assert [(offset, value) for offset, _, value, _, _ in rows] == golden("hamlet-snappy-0")
    assert {(key, timestamp, kind) for _, key, _, timestamp, kind in rows} == {(None, -1, -1)}
    mixed = spark_rows(read_table(spark, data, subscribe="mixed"))
    assert mixed == engine_rows(data, "mixed")
    assert [offset for offset, *_ in mixed] == list(range(26))


def test_offset_and_timestamp_bounds_over_legacy_data(spark, tmp_path: Path) -> None:
    data = legacy_data(tmp_path)
    everything = engine_rows(data, "mixed")
    by_offset = read_table(
        spark,
        data,
        assign='{"mixed":[0]}',
        startingOffsets='{"mixed":{"0":8}}',
        endingOffsets='{"mixed":{"0":20}}',
    )
    assert spark_rows(by_offset) == everything[8:20]
    start = everything[13][3]
    by_time = read_table(spark, data, subscribe="mixed", startingTimestamp=str(start))
    assert spark_rows(by_time) == [row for row in everything if row[0] >= 13]
