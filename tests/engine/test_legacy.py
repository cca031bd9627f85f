"""Legacy message formats (magic 0 and 1), read-only: the broker fixtures, kafka-python's legacy
builders, mixed segments, recovery, `check` and `consume`.

Oracles: the `golden/` values shipped with `kafkalite-magic0`; the key/value table of kafka-go's
TestMessageFixtures for its captured record sets; and, for data built here, the records handed
to kafka-python's `LegacyRecordBatchBuilder`.
"""

from __future__ import annotations

import json
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import cramjam
import lz4.frame
import pytest
from kafka.record.legacy_records import LegacyRecordBatchBuilder

from seglogfs.engine import DataDir
from seglogfs.engine.check import check_log_dirs
from seglogfs.engine.errors import CorruptRecordError, UnsupportedFormatError
from seglogfs.engine.record.builder import build_batch
from seglogfs.engine.record.records import LegacyBatchHeader, TimestampType
from tests.conftest import NOW_MS, REPO, assert_log_dir_valid, broker_config, kafka_fixtures

MAGIC0 = kafka_fixtures() / "kafkalite-magic0"
KAFKA_GO = kafka_fixtures() / "kafka-go-fetch-fixtures"
SEGMENT = "00000000000000000000.log"
NONE, GZIP, SNAPPY, LZ4 = 0, 1, 2, 3
LOG_APPEND_TIME_BIT = 0x08

Expected = tuple[int, int, str, bytes | None, bytes | None]  # offset, timestamp, type, key, value


def golden(name: str) -> list[tuple[int, bytes]]:
    """`golden/<partition>`: `offset: "value"` lines, the value a JSON-style quoted string."""
    pairs = []
    for line in (MAGIC0 / "golden" / name).read_text().splitlines():
        offset, quoted = line.split(": ", 1)
        pairs.append((int(offset), json.loads(quoted).encode()))
    return pairs


def consume(log_dir: Path, topic: str, *args: str) -> list[str]:
    result = subprocess.run(
        [sys.executable, "-m", "seglogfs.mount_tools.cli", "consume", str(log_dir), "--topic", topic, *args],
        capture_output=True,
        cwd=REPO,
        timeout=120,
        check=True,
    )
    return result.stdout.decode().splitlines()


def read_records(log_dir: Path, topic: str, *, read_only: bool = True) -> list[Expected]:
    with DataDir.open(broker_config(log_dir), read_only=read_only, now_ms=NOW_MS) as data_dir:
        log = data_dir.partition(topic, 0)
        return [(r.offset, r.timestamp, r.timestamp_type.display_name, r.key, r.value) for r in log.records(0)]


# -- building legacy data ----------------------------------------------------------------------
def message_set(
    magic: int, codec: int, records: list[tuple[int, bytes | None, bytes | None]], first_offset: int
) -> bytes:
    """`records` (timestamp, key, value) as a broker stores them: one message each when `codec` is
    none, else one wrapper whose offset is its last inner offset and whose timestamp is the
    largest inner one (the broker's rewrite of a producer's wrapper; kafka-python's builder
    leaves both 0). Inner offsets absolute for magic 0, relative for magic 1."""
    if codec == NONE:
        out = bytearray()
        for i, (timestamp, key, value) in enumerate(records):
            builder = LegacyRecordBatchBuilder(magic, NONE, 1 << 20)
            assert builder.append(first_offset + i, timestamp, key, value) is not None
            out += builder.build()
        return bytes(out)
    builder = LegacyRecordBatchBuilder(magic, codec, 1 << 20)
    for i, (timestamp, key, value) in enumerate(records):
        assert builder.append(first_offset + i if magic == 0 else i, timestamp, key, value) is not None
    wrapper = bytearray(builder.build())
    struct.pack_into(">q", wrapper, 0, first_offset + len(records) - 1)
    if magic == 1:
        restamp(wrapper, max(timestamp for timestamp, _, _ in records), log_append_time=False)
    return bytes(wrapper)


def restamp(wrapper: bytearray, timestamp: int, *, log_append_time: bool) -> None:
    """Set a magic 1 wrapper's timestamp and timestamp type, as a broker does, CRC updated."""
    wrapper[17] = (wrapper[17] & 0x07) | (LOG_APPEND_TIME_BIT if log_append_time else 0)
    struct.pack_into(">q", wrapper, 18, timestamp)
    struct.pack_into(">I", wrapper, 12, zlib.crc32(wrapper[16:]))


def wrapper_around(magic: int, codec: int, offset: int, value: bytes) -> bytes:
    """A wrapper message around an already compressed `value` (for framings kafka-python's
    builder does not write), null key, timestamp 0."""
    body = bytes([magic, codec]) + (struct.pack(">q", 0) if magic == 1 else b"")
    body += struct.pack(">i", -1) + struct.pack(">i", len(value)) + value
    return struct.pack(">qiI", offset, len(body) + 4, zlib.crc32(body)) + body


def write_segment(log_dir: Path, topic: str, data: bytes) -> Path:
    directory = log_dir / f"{topic}-0"
    directory.mkdir(parents=True, exist_ok=True)
    (directory / SEGMENT).write_bytes(data)
    return directory / SEGMENT


def sample(magic: int, n: int, start: int) -> list[tuple[int, bytes | None, bytes | None]]:
    """`n` records with keys, a null key, a null value (tombstone) and an empty value."""
    records: list[tuple[int, bytes | None, bytes | None]] = []
    for i in range(n):
        key = None if i % 4 == 1 else f"key-{start + i}".encode()
        value = None if i % 5 == 2 else b"" if i % 7 == 3 else f"value {start + i} \u00e9".encode()
        records.append((1_600_000_000_000 + 10 * (start + i), key, value))
    return records


def expected_for(magic: int, sets: list[list[tuple[int, bytes | None, bytes | None]]]) -> list[Expected]:
    out: list[Expected] = []
    for records in sets:
        for timestamp, key, value in records:
            if magic == 0:
                out.append((len(out), -1, "NoTimestampType", key, value))
            else:
                out.append((len(out), timestamp, "CreateTime", key, value))
    return out


# -- the broker fixtures -----------------------------------------------------------------------
@pytest.mark.parametrize("name", ["numbers-0", "hamlet-none-0", "hamlet-gzip-0", "hamlet-snappy-0"])
def test_kafkalite_magic0_reads_back_its_golden_values(name: str) -> None:
    topic = name.rsplit("-", 1)[0]
    records = read_records(MAGIC0, topic)
    assert [(offset, value) for offset, _, _, _, value in records] == golden(name)
    assert {(timestamp, kind, key) for _, timestamp, kind, key, _ in records} == {(-1, "NoTimestampType", None)}


def test_kafkalite_magic0_checks_clean_and_consumes_as_its_golden_values() -> None:
    report = check_log_dirs([MAGIC0])
    assert report.clean, [str(p) for p in report.problems]
    assert report.records == sum(len(golden(p.name)) for p in (MAGIC0 / "golden").iterdir())
    lines = consume(MAGIC0, "hamlet-snappy", "--from-beginning", "--property", "print.offset=true")
    assert lines == [f"Offset:{o}\t{v.decode()}" for o, v in golden("hamlet-snappy-0")]
    jsonl = [json.loads(line) for line in consume(MAGIC0, "numbers", "--offset", "11390", "--format", "jsonl")]
    assert [(d["offset"], d["value"], d["timestamp"], d["timestampType"]) for d in jsonl] == [
        (o, v.decode(), -1, "NoTimestampType") for o, v in golden("numbers-0")[11390:]
    ]


KAFKA_GO_MESSAGES = {  # kafka-go's message_test.go TestMessageFixtures: file → message ids
    "v2b-v1": "abab",
    "v2bc-v1c": "abab",
    "v2bc-v1": "abcd",
    "v2bc-v1-v1c": "abcdef",
    "v1-v1": "abcd",
    "v1c-v1c": "abcd",
    "v1c-v1-v1c": "abcdef",
    "v2-v2": "abcd",
    "v2c-v2c": "abcd",
    "v2c-v2-v2c": "abcdef",
    "v1-v1c-v2-v2c-v2b-v2b-v2b-v2bc-v1b-v1bc": "ababcdcdefefghghghgh",
}
KAFKA_GO_KEYS = dict(
    zip("abcdefgh", ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta"], strict=True)
)


@pytest.mark.parametrize("name", sorted(KAFKA_GO_MESSAGES))
def test_kafka_go_record_sets_decode_as_their_repository_documents(name: str, tmp_path: Path) -> None:
    log_dir = tmp_path / "logs"
    write_segment(log_dir, "fetched", (KAFKA_GO / f"{name}.p0.records").read_bytes())
    records = read_records(log_dir, "fetched", read_only=False)
    ids = KAFKA_GO_MESSAGES[name]
    assert [(key, value) for _, _, _, key, value in records] == [
        (KAFKA_GO_KEYS[i].encode(), b'{"count":0,"filler":"%s"}' % (i.encode() * 10)) for i in ids
    ]
    assert [offset for offset, *_ in records] == list(range(len(ids)))
    assert all(kind == "CreateTime" and timestamp > 1_633_000_000_000 for _, timestamp, kind, _, _ in records)
    assert_log_dir_valid(log_dir)


# -- kafka-python's legacy builders --------------------------------------------------------------
@pytest.mark.parametrize(
    ("magic", "codec"),
    # (kafka-python writes magic 0 lz4 only with xxhash installed: that framing has a test below)
    [(0, NONE), (0, GZIP), (0, SNAPPY), (1, NONE), (1, GZIP), (1, SNAPPY), (1, LZ4)],
    ids=["v0-none", "v0-gzip", "v0-snappy", "v1-none", "v1-gzip", "v1-snappy", "v1-lz4"],
)
def test_legacy_data_built_by_kafka_python_reads_back_record_for_record(tmp_path: Path, magic: int, codec: int) -> None:
    log_dir = tmp_path / "logs"
    sets = [sample(magic, 3, 0), sample(magic, 1, 3), sample(magic, 12, 4), sample(magic, 2, 16)]
    data = b"".join(message_set(magic, codec, records, sum(map(len, sets[:i]))) for i, records in enumerate(sets))
    path = write_segment(log_dir, "t", data)
    expected = expected_for(magic, sets)

    assert read_records(log_dir, "t") == expected
    assert check_log_dirs([log_dir]).clean
    jsonl = [json.loads(line) for line in consume(log_dir, "t", "--from-beginning", "--format", "jsonl")]
    assert [(d["offset"], d["timestamp"], d["timestampType"], d["key"], d["value"]) for d in jsonl] == [
        (o, t, k, None if key is None else key.decode(), None if value is None else value.decode())
        for o, t, k, key, value in expected
    ]
    text = consume(log_dir, "t", "--offset", "5", "--property", "print.key=true", "--property", "print.offset=true")
    assert text[: len(expected) - 5] == [
        f"Offset:{o}\t{'null' if key is None else key.decode()}\t{'null' if value is None else value.decode()}"
        for o, _, _, key, value in expected[5:]
    ]

    # An unclean open recovers the segment: every legacy byte stays, and appends go after it, v2.
    before = path.read_bytes()
    with DataDir.open(broker_config(log_dir), now_ms=NOW_MS) as data_dir:
        log = data_dir.partition("t", 0)
        assert log.log_end_offset == len(expected)
        log.append_records([b"after"], keys=[b"k"], now_ms=NOW_MS)
    assert path.read_bytes()[: len(before)] == before
    records = read_records(log_dir, "t")
    assert records[:-1] == expected
    assert records[-1] == (len(expected), NOW_MS, "CreateTime", b"k", b"after")
    assert_log_dir_valid(log_dir)


def test_a_log_append_time_wrapper_gives_its_timestamp_to_every_inner_record(tmp_path: Path) -> None:
    log_dir = tmp_path / "logs"
    wrapper = bytearray(message_set(1, GZIP, sample(1, 4, 0), 0))
    restamp(wrapper, NOW_MS, log_append_time=True)
    plain = message_set(1, NONE, sample(1, 1, 4), 4)
    write_segment(log_dir, "t", bytes(wrapper) + plain)
    records = read_records(log_dir, "t")
    assert [(o, t, k) for o, t, k, _, _ in records[:4]] == [(o, NOW_MS, "LogAppendTime") for o in range(4)]
    assert records[4][1:3] == (sample(1, 1, 4)[0][0], "CreateTime")
    with DataDir.open(broker_config(log_dir), read_only=True, now_ms=NOW_MS) as data_dir:
        log = data_dir.partition("t", 0)
        found = log.offset_for_timestamp(NOW_MS)
        assert found is not None and (found.timestamp, found.offset) == (NOW_MS, 0)
        assert log.offset_for_timestamp(NOW_MS + 1) is None


def test_magic0_lz4_with_the_old_broken_frame_checksum_reads(tmp_path: Path) -> None:
    """Kafka 0.8-0.10 computed a magic 0 lz4 wrapper's frame descriptor checksum wrongly; a
    standard LZ4 reader refuses the frame, Kafka (and seglogfs) ignore that byte for magic 0."""
    records = sample(0, 5, 10)
    inner = message_set(0, NONE, records, 10)
    frame = bytearray(
        lz4.frame.compress(inner, block_size=lz4.frame.BLOCKSIZE_MAX64KB, content_checksum=False, block_linked=False)
    )
    frame[6] ^= 0x5A  # the HC byte (no content size): as the old writer got it, wrong
    with pytest.raises(RuntimeError):
        lz4.frame.decompress(bytes(frame))
    log_dir = tmp_path / "logs"
    directory = log_dir / "t-0"
    directory.mkdir(parents=True)
    (directory / "00000000000000000010.log").write_bytes(wrapper_around(0, LZ4, 14, bytes(frame)))
    with DataDir.open(broker_config(log_dir), read_only=True, now_ms=NOW_MS) as data_dir:
        got = [(r.offset, r.key, r.value) for r in data_dir.partition("t", 0).records(10)]
    assert got == [(10 + i, key, value) for i, (_, key, value) in enumerate(records)]
    assert_log_dir_valid(log_dir)


def test_snappy_wrappers_without_xerial_framing_read(tmp_path: Path) -> None:
    records = sample(1, 6, 0)
    inner = b"".join(message_set(1, NONE, [record], i) for i, record in enumerate(records))
    log_dir = tmp_path / "logs"
    write_segment(log_dir, "t", wrapper_around(1, SNAPPY, 5, bytes(cramjam.snappy.compress_raw(inner))))
    assert [(o, key, value) for o, _, _, key, value in read_records(log_dir, "t")] == [
        (i, key, value) for i, (_, key, value) in enumerate(records)
    ]


def test_a_segment_of_magic_1_then_v2_reads_in_order_and_appends_continue(tmp_path: Path) -> None:
    """A broker upgraded in place: legacy messages first, v2 batches after them in one segment."""
    log_dir = tmp_path / "logs"
    legacy = message_set(1, NONE, sample(1, 2, 0), 0) + message_set(1, GZIP, sample(1, 3, 2), 2)
    v2 = build_batch([b"v2-a", b"v2-b"], keys=[b"ka", None], timestamps=[NOW_MS, NOW_MS + 1], base_offset=5)
    path = write_segment(log_dir, "t", legacy + bytes(v2))
    expected = [
        *expected_for(1, [sample(1, 2, 0), sample(1, 3, 2)]),
        (5, NOW_MS, "CreateTime", b"ka", b"v2-a"),
        (6, NOW_MS + 1, "CreateTime", None, b"v2-b"),
    ]
    assert read_records(log_dir, "t") == expected
    assert check_log_dirs([log_dir]).clean
    with DataDir.open(broker_config(log_dir), now_ms=NOW_MS) as data_dir:
        data_dir.partition("t", 0).append_records([b"next"], now_ms=NOW_MS)
    assert read_records(log_dir, "t") == [*expected, (7, NOW_MS, "CreateTime", None, b"next")]
    assert path.read_bytes().startswith(legacy + bytes(v2))
    assert_log_dir_valid(log_dir)


@pytest.mark.expect_warnings(r"cut 38 bytes after the last valid batch at position 232 \(rebuilding its indexes\)")
def test_recovery_cuts_a_torn_legacy_tail_and_keeps_every_whole_message(tmp_path: Path) -> None:
    log_dir = tmp_path / "logs"
    whole = message_set(0, NONE, sample(0, 3, 0), 0) + message_set(0, GZIP, sample(0, 4, 3), 3)
    torn = message_set(0, NONE, sample(0, 1, 7), 7)[:-3]
    path = write_segment(log_dir, "t", whole + torn)
    with DataDir.open(broker_config(log_dir), now_ms=NOW_MS) as data_dir:
        assert data_dir.partition("t", 0).log_end_offset == 7
    assert path.read_bytes() == whole
    assert [o for o, *_ in read_records(log_dir, "t")] == list(range(7))
    assert_log_dir_valid(log_dir)


def test_an_intact_legacy_message_that_cannot_be_decoded_is_never_cut(tmp_path: Path) -> None:
    """A wrapper whose CRC-32 holds but whose codec no legacy reader knows (zstd, id 4): opening
    the log refuses it with the reason, and every byte stays."""
    log_dir = tmp_path / "logs"
    good = message_set(1, NONE, sample(1, 2, 0), 0)
    odd = wrapper_around(1, 4, 5, b"\x28\xb5\x2f\xfd not a message set")
    path = write_segment(log_dir, "t", good + odd)
    with pytest.raises(UnsupportedFormatError, match=r"legacy message \(magic 0 or 1\) at position \d+ cannot be read"):
        DataDir.open(broker_config(log_dir), now_ms=NOW_MS)
    assert path.read_bytes() == good + odd
    report = check_log_dirs([log_dir])
    assert [p.message for p in report.problems] == [
        f"invalid batch at position {len(good)}: legacy message (magic 0 or 1) that cannot be read: "
        "undecodable legacy message: compression codec id 4 in a legacy message (0-3 only)"
    ]


def test_a_legacy_message_with_a_bad_crc_is_damage(tmp_path: Path) -> None:
    log_dir = tmp_path / "logs"
    data = bytearray(message_set(1, NONE, sample(1, 3, 0), 0))
    data[-1] ^= 0xFF
    write_segment(log_dir, "t", bytes(data))
    with (
        DataDir.open(broker_config(log_dir), read_only=True, now_ms=NOW_MS) as data_dir,
        pytest.raises(CorruptRecordError, match="CRC-32 mismatch"),
    ):
        list(data_dir.partition("t", 0).records(0))


def test_legacy_messages_are_read_never_appended(tmp_path: Path) -> None:
    log_dir = tmp_path / "logs"
    with DataDir.open(broker_config(log_dir), now_ms=NOW_MS) as data_dir:
        log = data_dir.create_topic("t", 1, now_ms=NOW_MS)[0]
        data = message_set(1, NONE, sample(1, 2, 0), 0) + bytes(build_batch([b"x"] * 3, timestamps=NOW_MS))
        with pytest.raises(CorruptRecordError, match=r"legacy message format \(magic 1\) is read, never written"):
            log.append_batches(data, assign_offsets=True, now_ms=NOW_MS)
        assert log.log_end_offset == 0


def test_a_wrapper_header_knows_its_first_offset_count_and_max_timestamp() -> None:
    records = sample(1, 5, 0)
    wrapper = message_set(1, GZIP, records, 20)
    header = LegacyBatchHeader.parse_message(wrapper, 0, 0)
    assert (header.base_offset, header.last_offset, header.records_count) == (20, 24, 5)
    assert header.max_timestamp == max(t for t, _, _ in records)
    assert header.timestamp_type is TimestampType.CREATE_TIME and header.problem is None
    assert LegacyBatchHeader.parse_message(wrapper[:40], 0, 0).records_count == -1  # only its first bytes
