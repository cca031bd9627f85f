"""The engine against data written by real Kafka brokers (`tests/fixtures/kafka`).

The oracle is an independent decoder, kafka-python's record classes: every record the engine
reads, every line the CLI prints, every batch `dump` shows and every index look-up is compared
with what kafka-python decodes from the same `.log` bytes, or with the broker's own index files.
The fixtures are read-only: tests that write work on copies under `tmp_path`.
"""

from __future__ import annotations

import base64
import bisect
import functools
import itertools
import json
import shutil
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import pytest
from kafka.record.memory_records import MemoryRecords

from seglogfs.engine import BrokerConfig, DataDir
from seglogfs.engine.check import check_log_dirs
from seglogfs.engine.log.loader import segment_for
from seglogfs.engine.log.segment import LogSegment
from seglogfs.mount_tools.cli import main as cli_main
from tests.conftest import NOW_MS, kafka_fixtures

FIXTURES = kafka_fixtures()
EXCLUDED_DIRS = {
    "kafkalite-magic0",  # legacy magic 0 message sets: tests/engine/test_legacy.py (golden values)
    "kafka-go-fetch-fixtures",  # record sets captured from fetch responses, not a broker log dir
}
EXPECTED_DATA_DIRS = {
    "bigdata-sensor-suhu",
    "experts-kafka-data",
    "flink-on-prem-cp760",
    "ne-streaming-d95be01",
    "spooldir-cp512",
}
LOG_APPEND_TIME = 1
TIMESTAMP_TYPE_NAMES = {0: "CreateTime", 1: "LogAppendTime"}
EXHAUSTIVE_OFFSETS_BELOW = 5000  # segments with fewer offsets have every one looked up
OFFSET_SAMPLE = 3000
TIMESTAMP_SAMPLE_BATCHES = 1500


# -- discovery ------------------------------------------------------------------------------------
def _is_partition_dir(path: Path) -> bool:
    return path.is_dir() and any(path.glob("*.log"))


def _data_dirs() -> list[Path]:
    """Fixture folders that hold partition dirs, less the explicit exclusions."""
    return sorted(
        d
        for d in FIXTURES.iterdir()
        if d.is_dir() and d.name not in EXCLUDED_DIRS and any(map(_is_partition_dir, d.iterdir()))
    )


DATA_DIRS = _data_dirs()
PARTITION_DIRS = [p for d in DATA_DIRS for p in sorted(d.iterdir()) if _is_partition_dir(p)]
LOG_FILES = [log for p in PARTITION_DIRS for log in sorted(p.glob("*.log"))]


def _relative(path: Path) -> str:
    return path.relative_to(FIXTURES).as_posix()


def _topic_partition(partition_dir: Path) -> tuple[str, int]:
    topic, _, partition = partition_dir.name.rpartition("-")
    return topic, int(partition)


def _index_exact() -> list[str]:
    lines = (FIXTURES / "INDEX_EXACT.txt").read_text(encoding="utf-8").splitlines()
    return [line.strip() for line in lines if line.strip() and not line.startswith("#")]


INDEX_EXACT = _index_exact()
# Segments whose broker indexes are present (an empty file is an index with no entries) but were
# not written in one pass: rebuilt indexes must answer look-ups as the broker's do.
INDEX_EQUIVALENT = [
    log
    for log in LOG_FILES
    if _relative(log) not in INDEX_EXACT
    and log.with_suffix(".index").exists()
    and log.with_suffix(".timeindex").exists()
]


# -- the oracle: kafka-python ---------------------------------------------------------------------
class OracleRecord(NamedTuple):
    offset: int
    timestamp: int
    timestamp_type: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...]


@dataclass(frozen=True)
class OracleBatch:
    position: int
    size: int
    base_offset: int
    last_offset: int
    max_timestamp: int
    leader_epoch: int
    is_control: bool
    crc_valid: bool
    records: tuple[OracleRecord, ...]


@functools.cache
def decode_log(log_path: Path) -> tuple[OracleBatch, ...]:
    """Every batch of a `.log` file as kafka-python decodes it, control batches included."""
    data = log_path.read_bytes()
    memory_records = MemoryRecords(data)
    batches = []
    position = 0
    while (batch := memory_records.next_batch()) is not None:
        assert batch.magic == 2, f"{log_path} position {position}: magic {batch.magic}"
        crc_valid = batch.validate_crc()  # must come before iterating the records
        records = []
        for record in batch:
            # Kafka's DefaultRecordBatch gives every record of a LogAppendTime batch the batch's max
            # timestamp (the broker's append time). kafka-python 3.0 does the same; the expected
            # value is taken from the batch header here, so the oracle does not depend on that.
            timestamp = batch.max_timestamp if batch.timestamp_type == LOG_APPEND_TIME else record.timestamp
            headers = tuple((key, value) for key, value in record.headers)
            records.append(
                OracleRecord(record.offset, timestamp, batch.timestamp_type, record.key, record.value, headers)
            )
        batches.append(
            OracleBatch(
                position=position,
                size=batch.size_in_bytes,
                base_offset=batch.base_offset,
                last_offset=batch.last_offset,
                max_timestamp=batch.max_timestamp,
                leader_epoch=batch.leader_epoch,
                is_control=batch.is_control_batch,
                crc_valid=crc_valid,
                records=tuple(records),
            )
        )
        position += batch.size_in_bytes
    assert position == len(data), f"{log_path}: {len(data) - position} bytes after the last whole batch"
    return tuple(batches)


def _log_start_offsets(data_dir: Path) -> dict[tuple[str, int], int]:
    """`log-start-offset-checkpoint` (version, count, `topic partition offset` lines), parsed here."""
    path = data_dir / "log-start-offset-checkpoint"
    if not path.exists():
        return {}
    lines = path.read_text(encoding="utf-8").splitlines()
    assert lines[0] == "0" and int(lines[1]) == len(lines) - 2, f"{path}: unexpected frame"
    out = {}
    for line in lines[2:]:
        topic, partition, offset = line.split(" ")
        out[(topic, int(partition))] = int(offset)
    return out


def expected_user_records(partition_dir: Path) -> tuple[int, int, list[OracleRecord]]:
    """(log start offset, log end offset, user records from the log start on) of a partition."""
    logs = sorted(partition_dir.glob("*.log"))
    first_base = int(logs[0].name.split(".")[0])
    start = max(_log_start_offsets(partition_dir.parent).get(_topic_partition(partition_dir), 0), first_base)
    batches = [batch for log in logs for batch in decode_log(log)]
    end = batches[-1].last_offset + 1 if batches else first_base
    records = [r for b in batches if not b.is_control for r in b.records if r.offset >= start]
    return start, end, records


def _engine_tuple(record) -> OracleRecord:
    return OracleRecord(
        record.offset,
        record.timestamp,
        int(record.timestamp_type),
        record.key,
        record.value,
        tuple(tuple(header) for header in record.headers),
    )


def assert_same_sequence(expected: list, actual: list, what: str) -> None:
    """Element-wise equality, reporting the first difference rather than a diff of huge lists."""
    for slot, (want, got) in enumerate(zip(expected, actual, strict=False)):
        assert got == want, f"{what}: item {slot} differs\n  expected {want!r}\n  got      {got!r}"
    assert len(actual) == len(expected), f"{what}: {len(actual)} items, expected {len(expected)}"


def _json_bytes(data: bytes | None) -> object:
    if data is None:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return {"base64": base64.b64encode(data).decode("ascii")}


def _expected_json(record: OracleRecord, topic: str, partition: int) -> dict:
    return {
        "topic": topic,
        "partition": partition,
        "offset": record.offset,
        "timestamp": record.timestamp,
        "timestampType": TIMESTAMP_TYPE_NAMES[record.timestamp_type],
        "key": _json_bytes(record.key),
        "value": _json_bytes(record.value),
        "headers": [{"key": key, "value": _json_bytes(value)} for key, value in record.headers],
    }


def _ids(paths: list[Path]) -> list[str]:
    return [_relative(p) for p in paths]


# -- inventory ------------------------------------------------------------------------------------
def test_fixture_inventory():
    """Discovery finds the five magic-2 data dirs and something to compare in each test group."""
    assert {d.name for d in DATA_DIRS} == EXPECTED_DATA_DIRS
    assert INDEX_EXACT
    assert INDEX_EQUIVALENT
    for entry in INDEX_EXACT:
        assert (FIXTURES / entry).is_file(), f"INDEX_EXACT.txt lists a missing segment: {entry}"


@pytest.mark.parametrize("data_dir", DATA_DIRS, ids=_ids(DATA_DIRS))
def test_engine_finds_every_partition(data_dir):
    expected: dict[str, list[int]] = {}
    for partition_dir in PARTITION_DIRS:
        if partition_dir.parent == data_dir:
            topic, partition = _topic_partition(partition_dir)
            expected.setdefault(topic, []).append(partition)
    with DataDir.open(BrokerConfig.load(log_dirs=[data_dir]), read_only=True, now_ms=NOW_MS) as opened:
        assert opened.topics() == {topic: sorted(parts) for topic, parts in expected.items()}


# -- 1. records and JSON Lines --------------------------------------------------------------------
@pytest.mark.parametrize("partition_dir", PARTITION_DIRS, ids=_ids(PARTITION_DIRS))
def test_records_match_kafka_python(partition_dir):
    topic, partition = _topic_partition(partition_dir)
    start, end, expected = expected_user_records(partition_dir)
    config = BrokerConfig.load(log_dirs=[partition_dir.parent])
    with DataDir.open(config, read_only=True, now_ms=NOW_MS) as data_dir:
        log = data_dir.partition(topic, partition)
        assert (log.log_start_offset, log.log_end_offset) == (start, end)
        actual = [_engine_tuple(record) for record in log.records(log.log_start_offset)]
    assert_same_sequence(expected, actual, f"records of {topic}-{partition}")


@pytest.mark.parametrize("partition_dir", PARTITION_DIRS, ids=_ids(PARTITION_DIRS))
def test_consume_jsonl_matches_kafka_python(partition_dir, capsysbinary):
    topic, partition = _topic_partition(partition_dir)
    _start, _end, expected = expected_user_records(partition_dir)
    argv = ["consume", str(partition_dir.parent), "--topic", topic, "--partition", str(partition)]
    code = cli_main([*argv, "--from-beginning", "--format", "jsonl"])
    out, err = capsysbinary.readouterr()
    assert code == 0, err.decode(errors="replace")
    assert out.endswith(b"\n") or not expected
    lines = out.split(b"\n")[:-1] if out else []
    actual = [json.loads(line) for line in lines]
    assert_same_sequence(
        [_expected_json(r, topic, partition) for r in expected], actual, f"JSON lines of {topic}-{partition}"
    )
    assert f"Processed a total of {len(expected)} messages".encode() in err


# -- 2. dump --deep-iteration ---------------------------------------------------------------------
@pytest.mark.parametrize("log_path", LOG_FILES, ids=_ids(LOG_FILES))
def test_dump_deep_iteration(log_path, capsys):
    batches = decode_log(log_path)
    assert all(batch.crc_valid for batch in batches), "kafka-python finds a CRC mismatch"
    code = cli_main(["dump", "--deep-iteration", str(log_path)])
    out, err = capsys.readouterr()
    assert code == 0, err
    lines = out.splitlines()
    assert not [line for line in lines if "invalid bytes" in line]
    batch_lines = [line for line in lines if line.startswith("baseOffset:")]
    assert [line for line in batch_lines if not line.endswith("isvalid: true")] == []
    assert len(batch_lines) == len(batches)
    record_offsets = [int(line.split()[2]) for line in lines if line.startswith("| offset:")]
    assert_same_sequence(
        [record.offset for batch in batches for record in batch.records], record_offsets, f"dump of {log_path}"
    )


@pytest.mark.parametrize("log_path", LOG_FILES, ids=_ids(LOG_FILES))
def test_headers_read_alone_are_those_of_the_whole_batches(log_path):
    """LogSegment.iter_headers (a window of headers after small batches, a header after large
    ones) gives the batches kafka-python finds, as iter_batches parses them."""
    config = BrokerConfig.load(log_dirs=[log_path.parent.parent]).topic_defaults
    segment = segment_for(log_path.parent, int(log_path.name.split(".")[0]), config, writable=False, now_ms=NOW_MS)
    try:
        headers = list(segment.iter_headers())
        assert headers == [header for header, _ in segment.iter_batches()]
    finally:
        segment.close()
    assert [(h.position, h.base_offset, h.last_offset) for h in headers] == [
        (batch.position, batch.base_offset, batch.last_offset) for batch in decode_log(log_path)
    ]


# -- 3. indexes rebuilt byte for byte -------------------------------------------------------------
def rebuild_indexes(log_path: Path, tmp_path: Path) -> Path:
    """Copy only the `.log` under `tmp_path`, recover it as a writable segment with the default
    topic config, close it; returns the directory that now holds the rebuilt indexes."""
    directory = tmp_path / log_path.parent.name
    directory.mkdir()
    shutil.copyfile(log_path, directory / log_path.name)
    config = BrokerConfig.load(log_dirs=[tmp_path]).topic_defaults
    segment = segment_for(directory, int(log_path.name.split(".")[0]), config, writable=True, now_ms=NOW_MS)
    try:
        truncated = segment.recover()
    finally:
        segment.close()
    assert truncated == 0, f"recovery cut {truncated} bytes of {log_path}"
    return directory


def as_kafka_writes_now(time_index: bytes, log_path: Path) -> bytes:
    """A broker's `.timeindex` with each entry's offset moved to the last offset of the batch
    that holds it: older brokers (these fixtures' Confluent Platform 7.6 among them) named the
    record with the greatest timestamp of an uncompressed batch, Kafka 3.9 and 4.x name the
    batch's last offset (`shallowOffsetOfMaxTimestamp`), and their recovery rebuilds the
    fixtures' indexes so."""
    base = int(log_path.name.split(".")[0])
    last_offsets = [batch.last_offset for batch in decode_log(log_path)]
    out = bytearray()
    for at in range(0, len(time_index) - len(time_index) % 12, 12):
        timestamp, relative = struct.unpack_from(">qi", time_index, at)
        holder = last_offsets[bisect.bisect_left(last_offsets, base + relative)]
        out += struct.pack(">qi", timestamp, holder - base)
    return bytes(out)


@pytest.mark.parametrize("entry", INDEX_EXACT)
def test_rebuilt_indexes_are_byte_exact(entry, tmp_path):
    log_path = FIXTURES / entry
    rebuilt = rebuild_indexes(log_path, tmp_path)
    for suffix in (".index", ".timeindex"):
        broker = log_path.with_suffix(suffix).read_bytes()
        if suffix == ".timeindex":
            broker = as_kafka_writes_now(broker, log_path)
        ours = (rebuilt / log_path.name).with_suffix(suffix).read_bytes()
        assert ours == broker, f"{suffix}: {len(ours)} bytes rebuilt, broker wrote {len(broker)}"


# -- 4. indexes rebuilt with the same answers -----------------------------------------------------
def open_read_only(directory: Path, base_offset: int) -> LogSegment:
    segment = LogSegment(
        directory,
        base_offset,
        index_interval_bytes=4096,
        max_index_bytes=10 * 1024 * 1024,
        writable=False,
        created_ms=0,
    )
    # The look-ups below must go through the index files, not through indexes a read-only
    # segment builds in memory when it finds its files missing or damaged.
    assert segment.offset_index.path == segment.offset_index_path, f"{segment.offset_index_path} was not used"
    assert segment.time_index.path == segment.time_index_path, f"{segment.time_index_path} was not used"
    return segment


def _spread(values: list[int], limit: int) -> list[int]:
    if len(values) <= limit:
        return list(values)
    step = (len(values) - 1) / (limit - 1)
    return [values[round(i * step)] for i in range(limit)]


def _index_entries(path: Path, layout: str) -> list[tuple[int, int]]:
    data = path.read_bytes()
    size = struct.calcsize(layout)
    return [struct.unpack_from(layout, data, at) for at in range(0, len(data) - len(data) % size, size)]


def _sample_offsets(log_path: Path, batches: tuple[OracleBatch, ...], base: int) -> list[int]:
    last = batches[-1].last_offset
    if last - base + 1 < EXHAUSTIVE_OFFSETS_BELOW:
        return list(range(base - 1, last + 2))
    indexed = [base + relative for relative, _ in _index_entries(log_path.with_suffix(".index"), ">ii")]
    boundaries = {base - 1, base, last, last + 1}
    boundaries |= {o + delta for o in indexed for delta in (-1, 0, 1)}
    return sorted(boundaries | set(_spread(list(range(base, last + 1)), OFFSET_SAMPLE)))


def _sample_timestamps(log_path: Path, batches: tuple[OracleBatch, ...]) -> list[int]:
    indexed = {t for t, _ in _index_entries(log_path.with_suffix(".timeindex"), ">qi")}
    chosen = {b.max_timestamp for b in _spread(list(batches), TIMESTAMP_SAMPLE_BATCHES)} | indexed
    timestamps = {t + delta for t in chosen for delta in (-1, 0, 1)}
    all_max = [b.max_timestamp for b in batches]
    return sorted(timestamps | {min(all_max) - 1, max(all_max) + 1})


def _translate(segment: LogSegment, offset: int) -> tuple[int, int] | None:
    header = segment.translate_offset(offset)
    return None if header is None else (header.position, header.last_offset)


def _find(segment: LogSegment, timestamp: int, start: int) -> tuple[int, int, int | None] | None:
    found = segment.find_offset_by_timestamp(timestamp, start)
    return None if found is None else (found.timestamp, found.offset, found.leader_epoch)


def _oracle_translate(batches: tuple[OracleBatch, ...], offsets: list[int]) -> list[tuple[int, int] | None]:
    last_offsets = [b.last_offset for b in batches]
    out = []
    for offset in offsets:
        slot = bisect.bisect_left(last_offsets, offset)
        out.append((batches[slot].position, batches[slot].last_offset) if slot < len(batches) else None)
    return out


def _oracle_find(batches: tuple[OracleBatch, ...], timestamps: list[int]) -> list[tuple[int, int, int | None] | None]:
    """The first record (control records included, as Kafka's search does) whose timestamp reaches
    each target: the first place where the running maximum of record timestamps reaches it."""
    found = [(r, b.leader_epoch if b.leader_epoch >= 0 else None) for b in batches for r in b.records]
    running_max = list(itertools.accumulate((r.timestamp for r, _ in found), max))
    out = []
    for timestamp in timestamps:
        slot = bisect.bisect_left(running_max, timestamp)
        if slot == len(found):
            out.append(None)
        else:
            record, epoch = found[slot]
            out.append((record.timestamp, record.offset, epoch))
    return out


@pytest.mark.parametrize("log_path", INDEX_EQUIVALENT, ids=_ids(INDEX_EQUIVALENT))
def test_rebuilt_indexes_answer_like_the_brokers(log_path, tmp_path):
    base = int(log_path.name.split(".")[0])
    batches = decode_log(log_path)
    rebuilt_dir = rebuild_indexes(log_path, tmp_path)
    broker = open_read_only(log_path.parent, base)
    rebuilt = open_read_only(rebuilt_dir, base)
    try:
        offsets = _sample_offsets(log_path, batches, base)
        with_broker = [_translate(broker, o) for o in offsets]
        with_rebuilt = [_translate(rebuilt, o) for o in offsets]
        what = f"translate_offset over {len(offsets)} offsets"
        assert_same_sequence(with_broker, with_rebuilt, f"{what} (broker's indexes vs rebuilt)")
        # Both must also give what kafka-python's decoding implies: the first batch reaching the offset.
        assert_same_sequence(_oracle_translate(batches, offsets), with_broker, f"{what} (kafka-python vs engine)")

        timestamps = _sample_timestamps(log_path, batches)
        with_broker = [_find(broker, t, base) for t in timestamps]
        with_rebuilt = [_find(rebuilt, t, base) for t in timestamps]
        what = f"find_offset_by_timestamp over {len(timestamps)} timestamps"
        assert_same_sequence(with_broker, with_rebuilt, f"{what} (broker's indexes vs rebuilt)")
        assert_same_sequence(_oracle_find(batches, timestamps), with_broker, f"{what} (kafka-python vs engine)")
    finally:
        broker.close_handlers()
        rebuilt.close_handlers()


# -- 5. check -------------------------------------------------------------------------------------
@pytest.mark.parametrize("data_dir", DATA_DIRS, ids=_ids(DATA_DIRS))
def test_check_finds_no_problems(data_dir):
    report = check_log_dirs([data_dir])
    assert report.clean, "\n".join(str(p) for p in report.problems)
    batches = [batch for log in LOG_FILES if log.parent.parent == data_dir for batch in decode_log(log)]
    assert report.batches == len(batches)
    assert report.records == sum(len(b.records) for b in batches if not b.is_control)
    # Missing index files are not damage (they are rebuilt), but check must name exactly those.
    missing_list = data_dir / "MISSING.txt"
    expected_missing = set()
    if missing_list.exists():
        expected_missing = {
            line.strip() for line in missing_list.read_text().splitlines() if line.strip() and not line.startswith("#")
        }
    assert {str(p.relative_to(data_dir)) for p in report.missing_indexes} == expected_missing
