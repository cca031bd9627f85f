"""Recovery keeps exactly the intact prefix, whatever byte is damaged (property tests)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from seglogfs.engine import BrokerConfig, PartitionLog
from seglogfs.engine.record.compression import CompressionType
from seglogfs.engine.record.records import BATCH_OVERHEAD_BYTES
from tests.conftest import NOW_MS, assert_log_dir_valid

# Bytes of a batch header that the CRC does not cover and whose damage leaves a valid batch:
# the base offset (0-7) and the partition leader epoch (12-15). Kafka keeps them outside the CRC
# so a broker can rewrite them in place; neither Kafka nor seglogfs can tell them damaged, so the
# property is stated for every other byte. Damage to the base offset that breaks offset order is
# covered by test_offsets_going_backwards_end_the_intact_prefix.
pytestmark = pytest.mark.expect_warnings(r"cut \d+ bytes after the last valid batch")

UNPROTECTED = set(range(8)) | set(range(12, 16))


def write_log(directory: Path, sizes: list[int], codec: CompressionType) -> tuple[PartitionLog, list[list[bytes]]]:
    config = BrokerConfig.load(overrides=["log.index.interval.bytes=64"], log_dirs=[directory.parent]).topic_defaults
    log = PartitionLog.create(directory, "t", 0, config, topic_id="AAAAAAAAAAAAAAAAAAAAAA", now_ms=NOW_MS)
    batches = []
    for number, count in enumerate(sizes):
        values = [b"batch-%d-record-%d-" % (number, i) * (1 + i % 3) for i in range(count)]
        log.append_records(values, timestamps=[NOW_MS + number] * count, now_ms=NOW_MS, compression=codec)
        batches.append(values)
    log.close()
    return log, batches


def reopen_unclean(log: PartitionLog) -> PartitionLog:
    return PartitionLog.open(
        log.directory, "t", 0, log.config, writable=True, clean_shutdown=False, recovery_point=0, now_ms=NOW_MS
    )


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    sizes=st.lists(st.integers(min_value=1, max_value=6), min_size=1, max_size=12),
    codec=st.sampled_from(list(CompressionType)),
    victim=st.integers(min_value=0),
    byte_in_batch=st.integers(min_value=0),
    flip=st.integers(min_value=1, max_value=255),
)
def test_damaged_byte_keeps_exactly_the_batches_before_it(
    tmp_path: Path, sizes: list[int], codec: CompressionType, victim: int, byte_in_batch: int, flip: int
) -> None:
    root = tmp_path / "case"
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir()
    log, batches = write_log(root / "t-0", sizes, codec)
    data = bytearray(log.segments[0].log_path.read_bytes())
    positions = []
    position = 0
    while position < len(data):
        positions.append(position)
        position += 12 + int.from_bytes(data[position + 8 : position + 12], "big")
    k = victim % len(positions)
    start = positions[k]
    end = positions[k + 1] if k + 1 < len(positions) else len(data)
    candidates = [i for i in range(end - start) if i not in UNPROTECTED]
    offset = candidates[byte_in_batch % len(candidates)]
    data[start + offset] ^= flip
    log.segments[0].log_path.write_bytes(bytes(data))

    recovered = reopen_unclean(log)
    try:
        expected = [value for batch in batches[:k] for value in batch]
        assert [r.value for r in recovered.records(0)] == expected
        assert recovered.log_end_offset == len(expected)
        assert recovered.active_segment.size == start
        recovered.append_records([b"after"], now_ms=NOW_MS)  # appending continues at the right offset
        assert [r.offset for r in recovered.records(len(expected))] == [len(expected)]
    finally:
        recovered.close()
    assert_log_dir_valid(root)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(sizes=st.lists(st.integers(min_value=1, max_value=5), min_size=1, max_size=10), cut=st.integers(min_value=0))
def test_torn_tail_keeps_the_whole_batches(tmp_path: Path, sizes: list[int], cut: int) -> None:
    root = tmp_path / "torn"
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir()
    log, batches = write_log(root / "t-0", sizes, CompressionType.NONE)
    path = log.segments[0].log_path
    data = path.read_bytes()
    length = cut % (len(data) + 1)
    path.write_bytes(data[:length])
    whole = []
    position = 0
    while position + BATCH_OVERHEAD_BYTES <= length:
        size = 12 + int.from_bytes(data[position + 8 : position + 12], "big")
        if position + size > length:
            break
        whole.append(len(whole))
        position += size
    recovered = reopen_unclean(log)
    try:
        assert [r.value for r in recovered.records(0)] == [v for b in batches[: len(whole)] for v in b]
    finally:
        recovered.close()
    assert_log_dir_valid(root)


def test_offsets_going_backwards_end_the_intact_prefix(tmp_path: Path) -> None:
    root = tmp_path / "backwards"
    root.mkdir()
    log, batches = write_log(root / "t-0", [2, 2, 2], CompressionType.NONE)
    path = log.segments[0].log_path
    data = bytearray(path.read_bytes())
    second = 12 + int.from_bytes(data[8:12], "big")
    data[second : second + 8] = (0).to_bytes(8, "big")  # batch 2 claims offset 0 again
    path.write_bytes(bytes(data))
    recovered = reopen_unclean(log)
    try:
        assert [r.value for r in recovered.records(0)] == batches[0]
    finally:
        recovered.close()
