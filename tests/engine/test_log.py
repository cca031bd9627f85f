"""The partition log and its loader: Kafka's log-level cases (LogLoaderTest, UnifiedLogTest), numbered in comments."""

from __future__ import annotations

import os
import random
import threading
import time
from pathlib import Path

import pytest

from seglogfs.engine import (
    BrokerConfig,
    DataDir,
    EngineError,
    InvalidRecordError,
    PartitionLog,
    RecordTooLargeError,
)
from seglogfs.engine.config import LogConfig
from seglogfs.engine.errors import CorruptRecordError, LogOfflineError
from seglogfs.engine.log import follower
from seglogfs.engine.log.follower import FollowedDirectory
from seglogfs.engine.log.transactions import TransactionTracker
from seglogfs.engine.record.builder import build_batch
from tests.conftest import NOW_MS, assert_log_dir_valid, broker_config, make_log


def reopen(log: PartitionLog, *, clean: bool, recovery_point: int | None = None) -> PartitionLog:
    directory, config = log.directory, log.config
    point = log.recovery_point if recovery_point is None else recovery_point
    if clean:
        log.close()
    else:
        for segment in log.segments:  # drop the handles without the clean-close work
            segment.close_handlers()
    return PartitionLog.open(
        directory, "t", 0, config, writable=True, clean_shutdown=clean, recovery_point=point, now_ms=NOW_MS
    )


@pytest.fixture
def part_dir(log_dir: Path) -> Path:
    return log_dir / "t-0"


def values_of(log: PartitionLog, start: int = 0) -> list[bytes | None]:
    return [record.value for record in log.records(start)]


# -- A. append and read ---------------------------------------------------------------------------
def test_sequential_single_record_appends_read_back_one_by_one(part_dir: Path) -> None:
    # Case 9: tiny segments, every offset read back as its own batch; nothing at the log end.
    log = make_log(part_dir, segment_bytes=71)
    for i in range(50):
        log.append_records([str(i).encode()], now_ms=NOW_MS + i)
    assert len(log.segments) > 10
    for i in range(50):
        _, header, _ = next(log.batches(i))
        assert header.base_offset == header.last_offset == i
        (record,) = list(log.records(i, i + 1))
        assert record.key is None and record.value == str(i).encode()
    assert list(log.batches(50)) == [] and list(log.records(50)) == []
    log.close()


def test_non_sequential_offsets_read_the_next_record(part_dir: Path) -> None:
    # Case 10: a follower appends offsets 0..49 then 50, 57, ..., reads return the smallest offset ≥ i.
    log = make_log(part_dir)
    offsets = list(range(50)) + list(range(50, 200, 7))
    for offset in offsets:
        batch = build_batch([f"v{offset}".encode()], timestamps=NOW_MS, base_offset=offset)
        log.append_batches(batch, assign_offsets=False, now_ms=NOW_MS)
    for target in range(50, offsets[-1] + 1):
        expected = next(o for o in offsets if o >= target)
        _, header, _ = next(log.batches(target))
        assert header.base_offset == expected
        assert next(log.records(target)).value == f"v{expected}".encode()
    log.close()


def test_compressed_batches_are_read_whole(part_dir: Path) -> None:
    # Case 14: reading from any offset of a compressed batch gives the whole batch.
    from seglogfs.engine.record.compression import CompressionType

    log = make_log(part_dir)
    log.append_records([b"a", b"b"], now_ms=NOW_MS, compression=CompressionType.GZIP)
    log.append_records([b"c", b"d"], now_ms=NOW_MS, compression=CompressionType.GZIP)
    for target, first in ((0, 0), (1, 0), (2, 2), (3, 2)):
        _, header, _ = next(log.batches(target))
        assert header.base_offset == first
    assert values_of(log, 1) == [b"b", b"c", b"d"]
    log.close()


def test_size_checks(part_dir: Path) -> None:
    # Case 16: a batch above max.message.bytes or segment.bytes is refused, nothing stored.
    log = make_log(part_dir, max_message_bytes=500, segment_bytes=400)
    with pytest.raises(RecordTooLargeError, match=r"max\.message\.bytes=500"):
        log.append_records([b"x" * 600], now_ms=NOW_MS)
    with pytest.raises(RecordTooLargeError, match=r"segment\.bytes=400"):
        log.append_batches(build_batch([b"y" * 420], timestamps=NOW_MS), assign_offsets=True, now_ms=NOW_MS)
    assert log.log_end_offset == 0 and log.size_in_bytes() == 0
    log.append_records([b"small"], now_ms=NOW_MS)
    assert values_of(log) == [b"small"]
    log.close()


def test_many_records_split_into_batches_within_max_message_bytes(part_dir: Path) -> None:
    log = make_log(part_dir, max_message_bytes=1000)
    info = log.append_records([b"%04d" % i * 10 for i in range(200)], now_ms=NOW_MS)
    assert info.records == 200 and info.batches > 1
    assert all(h.size_in_bytes <= 1000 for s in log.segments for h in s.iter_headers())
    assert values_of(log) == [b"%04d" % i * 10 for i in range(200)]
    log.close()


def test_compacted_topic_refuses_records_without_key(part_dir: Path) -> None:
    # Case 17: the error names the record's index; keyed batches pass.
    log = make_log(part_dir, cleanup_policy="compact")
    with pytest.raises(InvalidRecordError, match="record 1, which has no key"):
        log.append_records([b"a", b"b"], keys=[b"k", None], now_ms=NOW_MS)
    from seglogfs.engine.record.compression import CompressionType

    unkeyed = build_batch([b"a"], timestamps=NOW_MS, compression=CompressionType.GZIP)
    with pytest.raises(InvalidRecordError, match="record 0"):
        log.append_batches(unkeyed, assign_offsets=True, now_ms=NOW_MS)
    log.append_records([b"a", b"b"], keys=[b"k1", b"k2"], now_ms=NOW_MS)
    assert log.log_end_offset == 2
    log.close()


def test_follower_append_below_log_end_is_refused(part_dir: Path) -> None:
    # Case 18: offsets going backwards or starting below the log end offset.
    log = make_log(part_dir)
    log.append_records([b"a", b"b", b"c"], now_ms=NOW_MS)
    with pytest.raises(InvalidRecordError, match="below the expected offset 3"):
        log.append_batches(build_batch([b"x"], timestamps=NOW_MS, base_offset=1), assign_offsets=False, now_ms=NOW_MS)
    two = build_batch([b"p"], timestamps=NOW_MS, base_offset=10) + build_batch([b"q"], timestamps=NOW_MS, base_offset=5)
    with pytest.raises(InvalidRecordError, match="below the expected offset 11"):
        log.append_batches(two, assign_offsets=False, now_ms=NOW_MS)
    assert log.log_end_offset == 3
    log.close()


def test_corrupt_input_batch_is_refused_whole(part_dir: Path) -> None:
    log = make_log(part_dir)
    good = build_batch([b"fine"], timestamps=NOW_MS)
    bad = bytearray(build_batch([b"broken"], timestamps=NOW_MS))
    bad[-1] ^= 0xFF
    with pytest.raises(Exception, match="CRC-32C mismatch"):
        log.append_batches(good + bytes(bad), assign_offsets=True, now_ms=NOW_MS)
    assert log.log_end_offset == 0
    log.close()


def test_reads_bounded_by_max_offset(part_dir: Path) -> None:
    # Case 20: start < max returns records; start == max returns none.
    log = make_log(part_dir)
    for i in range(5):
        log.append_records([bytes([65 + i])], now_ms=NOW_MS)
    assert [header.base_offset for _, header, _ in log.batches(1, 3)] == [1, 2]
    assert values_of(log, 1)[:2] == [b"B", b"C"]
    assert list(log.records(1, 3)) == list(log.records(1))[:2]
    assert list(log.batches(3, 3)) == [] and list(log.records(3, 3)) == []
    log.close()


# -- D. roll conditions ----------------------------------------------------------------------------
def test_size_based_roll(part_dir: Path) -> None:
    # Case 46: segment.bytes = 10 batches - 10 bytes → 11 appends make 2 segments.
    batch_size = len(build_batch([b"0123456789"], timestamps=NOW_MS))
    log = make_log(part_dir, segment_bytes=10 * batch_size - 10)
    for _ in range(11):
        log.append_records([b"0123456789"], now_ms=NOW_MS)
    assert [s.base_offset for s in log.segments] == [0, 9]
    log.close()


def test_time_based_roll_uses_record_timestamps(part_dir: Path) -> None:
    # Case 47: roll when (new batch max timestamp − first batch timestamp) > segment.ms.
    hour = 3_600_000
    log = make_log(part_dir, segment_ms=hour)
    log.append_records([b"a"], timestamps=[NOW_MS], now_ms=NOW_MS)
    log.append_records([b"b"], timestamps=[NOW_MS], now_ms=NOW_MS + 2 * hour)  # old timestamp: no roll
    assert len(log.segments) == 1
    log.append_records([b"c"], timestamps=[NOW_MS + hour + 1], now_ms=NOW_MS + 2 * hour)
    assert [s.base_offset for s in log.segments] == [0, 2]
    log.close()


def test_empty_segment_never_rolls_for_age(part_dir: Path) -> None:
    # Case 47/49: appending to an empty segment never rolls, however old it is.
    log = make_log(part_dir, segment_ms=1)
    log.append_records([b"a"], now_ms=NOW_MS + 10_000)
    assert len(log.segments) == 1
    log.close()


def test_roll_jitter_shortens_each_segment_by_its_own_amount(part_dir: Path) -> None:
    # Case 48: each segment rolls after segment.ms minus its jitter, never before.
    hour = 3_600_000
    log = make_log(part_dir, segment_ms=hour, segment_jitter_ms=hour // 3)
    log._rng = random.Random(7)
    log.append_records([b"a"], timestamps=[NOW_MS], now_ms=NOW_MS)
    rolled = log.roll(NOW_MS)
    jitter = rolled.roll_jitter_ms
    assert 0 <= jitter < hour // 3
    log.append_records([b"b"], timestamps=[NOW_MS], now_ms=NOW_MS)
    log.append_records([b"c"], timestamps=[NOW_MS + hour - jitter], now_ms=NOW_MS)
    assert len(log.segments) == 2
    log.append_records([b"d"], timestamps=[NOW_MS + hour - jitter + 1], now_ms=NOW_MS)
    assert len(log.segments) == 3
    log.close()


def test_full_index_rolls(part_dir: Path) -> None:
    # An index with room for 3 entries (time index: 2, one slot reserved) forces rolls.
    log = make_log(part_dir, segment_index_bytes=36, index_interval_bytes=1)
    for i in range(20):
        log.append_records([b"v%d" % i], timestamps=[NOW_MS + i], now_ms=NOW_MS)
    assert len(log.segments) > 3
    assert values_of(log) == [b"v%d" % i for i in range(20)]
    log.close()


def test_offset_overflow_rolls_to_a_new_base(part_dir: Path) -> None:
    # Cases 31/49: offsets that do not fit relative to the base start a segment at the batch's first offset.
    log = make_log(part_dir)
    log.append_batches(build_batch([b"zero"], timestamps=NOW_MS, base_offset=0), assign_offsets=False, now_ms=NOW_MS)
    far = build_batch([b"a", b"b", b"c"], timestamps=NOW_MS, base_offset=2**31 + 1)
    log.append_batches(far, assign_offsets=False, now_ms=NOW_MS)
    assert [s.base_offset for s in log.segments] == [0, 2**31 + 1]
    reopened = reopen(log, clean=True)
    assert reopened.log_end_offset == 2**31 + 4
    assert [r.value for r in reopened.records(1)] == [b"a", b"b", b"c"]
    reopened.close()


def test_roll_of_empty_active_segment_returns_it(part_dir: Path) -> None:
    # Case 51.
    log = make_log(part_dir)
    first = log.active_segment
    assert log.roll(NOW_MS) is first and len(log.segments) == 1
    log.append_records([b"x"], now_ms=NOW_MS)
    assert log.roll(NOW_MS).base_offset == 1 == log.log_end_offset
    log.close()


def test_roll_flushes_and_moves_recovery_point(part_dir: Path) -> None:
    # Case 15: after rolls the recovery point is at least the active segment's base (once the
    # last roll's flush, which runs on a thread of its own as Kafka schedules it, is done).
    log = make_log(part_dir, segment_bytes=100)
    for i in range(30):
        log.append_records([b"record-%d" % i], now_ms=NOW_MS)
    deadline = time.monotonic() + 10
    while log.recovery_point < log.active_segment.base_offset and time.monotonic() < deadline:
        time.sleep(0.001)
    assert log.recovery_point >= log.active_segment.base_offset > 0
    log.close()


@pytest.mark.expect_warnings(r"t-0 is offline: flush of .* failed: \[Errno 5\] Input/output error")
def test_a_roll_leaves_the_sealed_segment_s_fsync_to_a_thread_of_its_own(part_dir: Path, monkeypatch) -> None:
    """The fsync of the `.log` a roll seals runs on a thread of its own (a GiB's took a quarter
    of a second and more in the appending thread): the roll and the appends after it do not
    wait for it; the recovery point passes the segment once it is done, and a flush or a close
    waits for it. Its failure is raised by the next flush and takes the partition offline, as
    Kafka takes a log dir offline (a second fsync would succeed without the data)."""
    import errno as errno_module

    log = make_log(part_dir, segment_bytes=300)  # (a batch of a 100-byte record: about 170 bytes)
    log.append_records([b"x" * 100], now_ms=NOW_MS)
    release, fail = threading.Event(), [False]
    real_fsync = os.fsync

    def slow_fsync(fd: int) -> None:
        if threading.current_thread().name.startswith("flush "):
            assert release.wait(10)
            if fail[0]:
                raise OSError(errno_module.EIO, "Input/output error")
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", slow_fsync)
    sealed = log.active_segment
    log.append_records([b"y" * 100], now_ms=NOW_MS)  # rolls: the fsync waits in its thread
    log.append_records([b"z" * 10], now_ms=NOW_MS)
    assert log.active_segment is not sealed and log.recovery_point < log.active_segment.base_offset
    release.set()
    log.flush()
    assert log.recovery_point == log.log_end_offset
    release.clear()
    fail[0] = True
    log.append_records([b"w"], now_ms=NOW_MS)
    log.roll(NOW_MS)  # (the segment that record went to: its fsync fails)
    behind = log.active_segment.base_offset
    release.set()
    with pytest.raises(OSError, match="Input/output error"):
        log.flush()
    assert log.recovery_point < behind
    with pytest.raises(LogOfflineError, match=r"flush of .* failed"):
        log.append_records([b"v"], now_ms=NOW_MS)
    fail[0] = False
    log.flush()
    log.close()  # (nothing flushed again: the recovery point stays, and the next open recovers)
    assert log.recovery_point < behind


@pytest.mark.expect_warnings("t-0 is offline: flush of .* Input/output error")
def test_a_roll_makes_the_new_segments_names_durable_after_the_sealed_segments_batches(
    part_dir: Path, monkeypatch
) -> None:
    """A roll's flush thread fsyncs the sealed segment, then the directory (the new segment's
    names): a power cut between the two must not keep the new segment without the batches below
    its base. A failure of the directory's fsync is the flush's: raised by the next flush, the
    partition offline (the sealed segment's batches were fsynced before it)."""
    import errno as errno_module

    from seglogfs.engine.log import log as log_module

    log = make_log(part_dir, segment_bytes=300)
    log.append_records([b"x" * 100], now_ms=NOW_MS)
    sealed = log.active_segment
    order: list[str] = []
    real_fsync = os.fsync

    def recording_fsync(fd: int) -> None:
        if os.fstat(fd).st_ino == sealed.log_path.stat().st_ino:
            order.append("sealed")
        real_fsync(fd)

    def failing_fsync_dir(path: object) -> None:
        order.append("directory")
        raise OSError(errno_module.EIO, "Input/output error")

    monkeypatch.setattr(os, "fsync", recording_fsync)
    with monkeypatch.context() as patched:
        patched.setattr(log_module, "fsync_dir", failing_fsync_dir)
        log.append_records([b"y" * 100], now_ms=NOW_MS)  # rolls: its flush runs behind
        assert len(log.segments) == 2
        with pytest.raises(OSError, match="Input/output error"):
            log.flush()
    assert order == ["sealed", "directory"]
    assert log.offline_reason is not None and "Input/output error" in log.offline_reason
    log.close()


# -- E. recovery and truncation ---------------------------------------------------------------------
@pytest.mark.expect_warnings(r"cut 300 bytes after the last valid batch")
def test_corrupt_tail_of_log_and_index_is_cut(part_dir: Path) -> None:
    # Case 56: garbage after valid data in .log and .index; unclean reopen keeps every record.
    log = make_log(part_dir, index_interval_bytes=1)
    for i in range(60):
        log.append_records([b"value-%d" % i], keys=[b"k%d" % i], now_ms=NOW_MS + i)
    before = [(r.offset, r.key, r.value, r.timestamp) for r in log.records(0)]
    active = log.active_segment
    log.flush()
    for segment in log.segments:
        segment.close_handlers()
    with open(active.log_path, "ab") as handle:
        handle.write(os.urandom(300))
    with open(active.offset_index_path, "r+b") as handle:
        handle.seek(0, os.SEEK_END)
        handle.write(os.urandom(37))
    reopened = PartitionLog.open(
        part_dir, "t", 0, log.config, writable=True, clean_shutdown=False, recovery_point=50, now_ms=NOW_MS
    )
    assert reopened.log_end_offset == 60
    assert [(r.offset, r.key, r.value, r.timestamp) for r in reopened.records(0)] == before
    reopened.close()
    assert_log_dir_valid(part_dir.parent)


@pytest.mark.expect_warnings(r"cut \d+ bytes after the last valid batch at position \d+ \(rebuilding its indexes\)")
def test_a_cut_while_rebuilding_missing_indexes_is_a_warning(part_dir: Path, caplog) -> None:
    # Kafka's LogSegment.recover warns when it truncates invalid bytes, whatever made it recover:
    # a segment whose indexes are missing is recovered even after a clean shutdown.
    log = make_log(part_dir, index_interval_bytes=1)
    for i in range(20):
        log.append_records([b"value-%d" % i], now_ms=NOW_MS + i)
    log.close()
    segment = next(part_dir.glob("*.log"))
    with open(segment, "r+b") as handle:
        handle.seek(segment.stat().st_size // 2)
        handle.write(os.urandom(16))
    for index in [*part_dir.glob("*.index"), *part_dir.glob("*.timeindex")]:
        index.unlink()
    reopened = PartitionLog.open(
        part_dir, "t", 0, log.config, writable=True, clean_shutdown=True, recovery_point=20, now_ms=NOW_MS
    )
    assert 0 < reopened.log_end_offset < 20
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1 and str(segment) in warnings[0], warnings
    reopened.close()


@pytest.mark.parametrize("damage", ["delete", "two-spaces"])
def test_index_rebuild(part_dir: Path, damage: str) -> None:
    # Cases 57/58: indexes deleted or overwritten with 2 bytes are rebuilt on an unclean open.
    log = make_log(part_dir, segment_bytes=600, index_interval_bytes=1)
    for i in range(40):
        log.append_records([b"value-%d" % i], timestamps=[NOW_MS + 10 * i], now_ms=NOW_MS)
    log.close()
    for path in list(part_dir.glob("*.index")) + list(part_dir.glob("*.timeindex")):
        if damage == "delete":
            path.unlink()
        else:
            path.write_bytes(b"  ")
    reopened = PartitionLog.open(part_dir, "t", 0, log.config, writable=True, clean_shutdown=False, now_ms=NOW_MS)
    assert all(s.offset_index.entries > 0 for s in reopened.segments[:-1])
    assert values_of(reopened) == [b"value-%d" % i for i in range(40)]
    assert reopened.offset_for_timestamp(NOW_MS).offset == 0
    assert reopened.offset_for_timestamp(NOW_MS + 105).offset == 11
    reopened.close()
    assert_log_dir_valid(part_dir.parent)


def test_bogus_index_files_and_deleted_leftovers_are_removed(part_dir: Path) -> None:
    # Cases 59/60.
    log = make_log(part_dir)
    log.append_records([b"x"], now_ms=NOW_MS)
    log.close()
    (part_dir / "00000000000000000005.index").write_bytes(b"")
    (part_dir / "00000000000000000005.timeindex").write_bytes(b"")
    (part_dir / "00000000000000000007.log.deleted").write_bytes(b"old")
    (part_dir / "00000000000000000007.index.deleted").write_bytes(b"")
    reopened = PartitionLog.open(part_dir, "t", 0, log.config, writable=True, clean_shutdown=True, now_ms=NOW_MS)
    names = sorted(p.name for p in part_dir.iterdir() if p.name[0].isdigit())
    assert names == ["00000000000000000000.index", "00000000000000000000.log", "00000000000000000000.timeindex"]
    reopened.close()


def test_reopen_then_truncate(part_dir: Path) -> None:
    # Case 61: the first segment holds offsets 0..3, later ones the rest.
    log = make_log(part_dir, segment_bytes=300)
    for i in range(20):
        log.append_records([b"r%d" % i], now_ms=NOW_MS)
    reopened = reopen(log, clean=True)
    reopened.truncate_to(3, NOW_MS)
    assert len(reopened.segments) == 1 and reopened.log_end_offset == 3
    reopened.append_records([b"next"], now_ms=NOW_MS)
    assert values_of(reopened) == [b"r0", b"r1", b"r2", b"next"]
    reopened.close()


def test_clean_shutdown_skips_recovery(part_dir: Path) -> None:
    # Case 62: with the clean flag nothing is scanned (a torn tail would otherwise be cut).
    log = make_log(part_dir)
    log.append_records([b"a", b"b"], now_ms=NOW_MS)
    log.close()
    calls = []
    from seglogfs.engine.log import segment as segment_module

    original = segment_module.LogSegment.recover
    segment_module.LogSegment.recover = lambda self: calls.append(self) or original(self)  # type: ignore[method-assign]
    try:
        reopened = PartitionLog.open(
            part_dir, "t", 0, log.config, writable=True, clean_shutdown=True, recovery_point=0, now_ms=NOW_MS
        )
    finally:
        segment_module.LogSegment.recover = original  # type: ignore[method-assign]
    assert calls == [] and reopened.log_end_offset == 2
    reopened.close()


def test_recovery_point_survives_until_flush(part_dir: Path) -> None:
    # Case 63.
    log = make_log(part_dir)
    for i in range(20):
        log.append_records([b"%d" % i], now_ms=NOW_MS)
    reopened = reopen(log, clean=False, recovery_point=10)
    assert reopened.recovery_point == 10
    reopened.flush()
    assert reopened.recovery_point == 20
    reopened.close()


def test_log_end_below_start_after_reopen(part_dir: Path) -> None:
    # Case 64: everything below the log start offset → one empty segment at the start.
    log = make_log(part_dir, segment_bytes=100)
    for i in range(6):
        log.append_records([b"r%d" % i], now_ms=NOW_MS)
    log.close()
    reopened = PartitionLog.open(
        part_dir, "t", 0, log.config, writable=True, clean_shutdown=True, log_start_offset=9, now_ms=NOW_MS
    )
    assert reopened.log_start_offset == reopened.log_end_offset == 9
    assert [s.base_offset for s in reopened.segments] == [9]
    reopened.close()


def test_recover_with_empty_active_segment(part_dir: Path) -> None:
    # Case 65: roll, unclean stop with an empty active segment without index files.
    log = make_log(part_dir)
    log.append_records([b"a", b"b"], now_ms=NOW_MS)
    active = log.roll(NOW_MS)
    log.flush()
    for segment in log.segments:
        segment.close_handlers()
    active.offset_index_path.unlink(missing_ok=True)
    active.time_index_path.unlink(missing_ok=True)
    reopened = PartitionLog.open(
        part_dir, "t", 0, log.config, writable=True, clean_shutdown=False, recovery_point=2, now_ms=NOW_MS
    )
    assert reopened.recovery_point == 2 and reopened.log_end_offset == 2
    assert reopened.active_segment.time_index.entries == 0
    assert reopened.active_segment.offset_index_path.exists()
    reopened.close()


def test_truncate_to(part_dir: Path) -> None:
    # Case 71.
    log = make_log(part_dir)
    for i in range(10):
        log.append_records([b"%d" % i], now_ms=NOW_MS)
    size = log.size_in_bytes()
    log.truncate_to(10, NOW_MS)
    log.truncate_to(11, NOW_MS)
    assert log.log_end_offset == 10 and log.size_in_bytes() == size
    log.truncate_to(5, NOW_MS)
    assert log.log_end_offset == 5 and log.size_in_bytes() < size
    log.truncate_to(0, NOW_MS)
    assert log.log_end_offset == 0 and log.size_in_bytes() == 0
    # Below the first segment (here after delete-records) the log starts afresh: Kafka's
    # truncateFullyAndStartAt, which its truncateTo calls then.
    for i in range(50):
        log.append_records([b"%d" % i], now_ms=NOW_MS)
    log.roll(NOW_MS)
    log.delete_records(50, NOW_MS)
    assert [s.base_offset for s in log.segments] == [50]
    log.truncate_to(42, NOW_MS)
    assert [s.base_offset for s in log.segments] == [42] and log.log_end_offset == 42
    assert log.log_start_offset == 42 and log.size_in_bytes() == 0
    log.close()


def test_truncate_across_segments(part_dir: Path) -> None:
    # Case 72: 12 records, 3 per segment; truncate to 7 → 3 segments, active base 6, end 7.
    size = len(build_batch([b"r00"], timestamps=NOW_MS))
    log = make_log(part_dir, segment_bytes=3 * size)
    for i in range(12):
        log.append_records([b"r%02d" % i], now_ms=NOW_MS)
    assert [s.base_offset for s in log.segments] == [0, 3, 6, 9]
    log.truncate_to(7, NOW_MS)
    assert [s.base_offset for s in log.segments] == [0, 3, 6] and log.log_end_offset == 7
    log.append_records([b"seven"], now_ms=NOW_MS)
    assert values_of(log, 6) == [b"r06", b"seven"]
    log.close()


def test_offset_for_timestamp_picks_first_record_at_or_after(part_dir: Path) -> None:
    log = make_log(part_dir, segment_bytes=300, index_interval_bytes=1)
    for i in range(30):
        log.append_records([b"%d" % i], timestamps=[NOW_MS + 10 * i], now_ms=NOW_MS)
    assert log.offset_for_timestamp(NOW_MS - 5).offset == 0
    for i in range(30):
        assert log.offset_for_timestamp(NOW_MS + 10 * i).offset == i
        if i < 29:
            assert log.offset_for_timestamp(NOW_MS + 10 * i + 1).offset == i + 1
    assert log.offset_for_timestamp(NOW_MS + 1000) is None
    log.close()


def test_a_read_only_log_finds_by_time_what_its_writer_appended_since_the_last_lookup(part_dir: Path) -> None:
    """A read-only log's segment keeps its max timestamp once a lookup by time or retention
    loaded it; the writer (a broker) goes on appending to that segment. Each look takes in the
    timestamps appended: a live mount's `by-time/T` started past the first record at T (in the
    next segment) when the active segment's max timestamp was the one of an earlier look."""
    writer = make_log(part_dir)
    writer.append_records([b"early-%d" % i for i in range(3)], timestamps=[NOW_MS + i for i in range(3)], now_ms=NOW_MS)
    writer.flush()
    reader = PartitionLog.open(part_dir, "t", 0, writer.config, writable=False, clean_shutdown=True, now_ms=NOW_MS)
    assert reader.offset_for_timestamp(NOW_MS + 1000) is None  # (loads the segment's max timestamp)
    writer.append_records(
        [b"late-%d" % i for i in range(3)], timestamps=[NOW_MS + 1000 + i for i in range(3)], now_ms=NOW_MS
    )
    writer.flush()
    assert reader.refresh(NOW_MS)
    found = reader.offset_for_timestamp(NOW_MS + 1001)
    assert found is not None and (found.offset, found.timestamp) == (4, NOW_MS + 1001)
    assert reader.active_segment.largest_timestamp == NOW_MS + 1002
    writer.close()
    reader.close()


# -- data dir, config --------------------------------------------------------------------------------
def test_data_dir_creates_topics_and_survives_reopen(log_dir: Path) -> None:
    config = broker_config(log_dir, num_partitions=3)
    with DataDir.open(config, now_ms=NOW_MS) as data_dir:
        data_dir.create_topic("events", overrides={"segment.bytes": "2048"}, now_ms=NOW_MS)
        assert data_dir.topics() == {"events": [0, 1, 2]}
        assert data_dir.topic_config("events").segment_bytes == 2048
        data_dir.partition("events", 1).append_records([b"x"], now_ms=NOW_MS)
    assert (log_dir / ".kafka_cleanshutdown").exists()
    with DataDir.open(config, now_ms=NOW_MS) as data_dir:
        assert not (log_dir / ".kafka_cleanshutdown").exists()
        assert data_dir.topic_config("events").segment_bytes == 2048
        assert data_dir.partition("events", 1).log_end_offset == 1
    assert_log_dir_valid(log_dir)


@pytest.mark.expect_warnings("No space left on device")
@pytest.mark.parametrize("failing", ["recovery-point-offset-checkpoint", ".kafka_cleanshutdown"])
def test_a_data_dir_that_fails_to_close_never_hides_the_error_that_ended_its_use(
    log_dir: Path, monkeypatch, caplog, failing: str
) -> None:
    """A with-block that raised: the close's failure (a full disk: a checkpoint, or the
    clean-shutdown marker after them) is logged, the block's error goes on; no marker is left,
    so the next open recovers as after a crash. Without a block error, the close's is raised."""
    from seglogfs.engine import datadir

    for name in ("write_atomically", "write_offset_checkpoint"):
        real = getattr(datadir, name)

        def full_disk(path: Path, *args, real=real) -> None:
            if failing in path.name:
                raise OSError(28, "No space left on device", str(path))
            real(path, *args)

        monkeypatch.setattr(datadir, name, full_disk)
    config = broker_config(log_dir)
    with pytest.raises(ValueError, match="the block's own"), DataDir.open(config, now_ms=NOW_MS) as data_dir:
        data_dir.create_topic("t", now_ms=NOW_MS)
        raise ValueError("the block's own")
    logged = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert len(logged) == 1 and failing in logged[0] and "No space left on device" in logged[0]
    assert logged[0].endswith("the next open recovers as after a crash")
    with (
        pytest.raises(EngineError, match=r"No space left on device.*the next open recovers as after a crash"),
        DataDir.open(config, now_ms=NOW_MS),
    ):
        pass
    assert not (log_dir / ".kafka_cleanshutdown").exists()


def test_config_precedence_follows_kafka() -> None:
    config = BrokerConfig.load(overrides=["log.retention.hours=1", "log.retention.minutes=5"], log_dirs=[Path("/x")])
    assert config.topic_defaults.retention_ms == 5 * 60_000
    config = BrokerConfig.load(
        overrides=["log.retention.ms=7", "log.retention.minutes=5", "log.roll.hours=2"], log_dirs=[Path("/x")]
    )
    assert config.topic_defaults.retention_ms == 7
    assert config.topic_defaults.segment_ms == 2 * 3_600_000
    defaults = LogConfig.__dataclass_fields__
    assert "segment_bytes" in defaults
    plain = BrokerConfig.load(log_dirs=[Path("/x")]).topic_defaults
    assert (plain.segment_bytes, plain.index_interval_bytes, plain.segment_index_bytes) == (1 << 30, 4096, 10 << 20)
    assert plain.retention_ms == 168 * 3_600_000 and plain.max_message_bytes == 1048588


def test_server_properties_file_and_overrides(tmp_path: Path) -> None:
    properties = tmp_path / "server.properties"
    properties.write_text(
        "# comment\nlog.dirs=/a,/b\nnum.partitions = 4\nlog.segment.bytes:2048\nlog.retention.hours=\\\n  2\n"
    )
    config = BrokerConfig.load(properties, ["num.partitions=6"])
    assert config.log_dirs == (Path("/a"), Path("/b"))
    assert config.num_partitions == 6
    assert config.topic_defaults.segment_bytes == 2048
    assert config.topic_defaults.retention_ms == 2 * 3_600_000


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("log.segment.bytes=lots", "--override log.segment.bytes: invalid value 'lots'"),
        ("log.segment.bytes=10", "below the minimum of 14"),
        ("log.cleanup.policy=shred", "expected delete, compact or both"),
        ("novalue", "expected key=value"),
        # A topic config's name where the broker's is meant would change nothing (a broker
        # ignores names it does not know): the broker's name is given.
        (
            "segment.bytes=70000",
            "--override segment.bytes: a topic config, not a broker's; "
            "the broker's default for it is log.segment.bytes",
        ),
        ("max.message.bytes=200", "the broker's default for it is message.max.bytes"),
    ],
)
def test_bad_config_names_key_and_source(override: str, message: str) -> None:
    from seglogfs.engine import ConfigError

    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        BrokerConfig.load(overrides=[override], log_dirs=[Path("/x")])


def test_names_both_levels_share_are_broker_overrides() -> None:
    assert (
        BrokerConfig.load(overrides=["compression.type=gzip"], log_dirs=[Path("/x")]).topic_defaults.compression_type
        == "gzip"
    )


def test_unknown_topic_config_is_refused(log_dir: Path) -> None:
    from seglogfs.engine import ConfigError

    with (
        DataDir.open(broker_config(log_dir), now_ms=NOW_MS) as data_dir,
        pytest.raises(ConfigError, match=r"unknown topic config 'segment\.size'"),
    ):
        data_dir.create_topic("t", overrides={"segment.size": "1"}, now_ms=NOW_MS)


def test_several_log_dirs_spread_partitions_and_read_back(tmp_path: Path) -> None:
    dirs = [tmp_path / "a", tmp_path / "b"]
    config = BrokerConfig.load(overrides=["num.partitions=4"], log_dirs=dirs)
    with DataDir.open(config, now_ms=NOW_MS) as data_dir:
        data_dir.create_topic("spread", now_ms=NOW_MS)
        for partition in range(4):
            data_dir.partition("spread", partition).append_records([b"p%d" % partition], now_ms=NOW_MS)
    assert sorted(p.name for p in dirs[0].iterdir() if p.is_dir()) == ["spread-0", "spread-2"]
    assert sorted(p.name for p in dirs[1].iterdir() if p.is_dir()) == ["spread-1", "spread-3"]
    for log_dir in dirs:
        assert (log_dir / ".kafka_cleanshutdown").exists()
        assert_log_dir_valid(log_dir)
    with DataDir.open(config, read_only=True, now_ms=NOW_MS) as data_dir:
        assert [next(data_dir.partition("spread", p).records(0)).value for p in range(4)] == [
            b"p0",
            b"p1",
            b"p2",
            b"p3",
        ]


def test_failed_write_leaves_nothing_behind(part_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    log = make_log(part_dir)
    log.append_records([b"kept"], now_ms=NOW_MS)
    size = log.active_segment.size
    real_pwrite = os.pwrite

    def torn_then_full(fd: int, data: bytes, position: int) -> int:
        real_pwrite(fd, bytes(data)[:50], position)
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "pwrite", torn_then_full)
    with pytest.raises(OSError, match="No space left"):
        log.append_records([b"lost" * 30], now_ms=NOW_MS)
    monkeypatch.setattr(os, "pwrite", real_pwrite)
    assert log.log_end_offset == 1 and log.active_segment.size == size
    assert os.path.getsize(log.active_segment.log_path) == size
    log.append_records([b"next"], now_ms=NOW_MS)
    reopened = reopen(log, clean=True)
    assert values_of(reopened) == [b"kept", b"next"]
    reopened.close()
    assert_log_dir_valid(part_dir.parent)


def test_truncating_inside_a_batch_drops_its_index_entries(part_dir: Path) -> None:
    log = make_log(part_dir, index_interval_bytes=1)
    log.append_records([b"a"], timestamps=[100], now_ms=NOW_MS)
    log.append_records([b"b", b"c", b"d"], timestamps=[300, 200, 250], now_ms=NOW_MS)
    log.truncate_to(2, NOW_MS)  # offset 2 lies in the batch 1..3: the whole batch goes
    assert log.log_end_offset == 1
    assert log.active_segment.time_index.last_entry().timestamp < 300
    log.close()
    assert_log_dir_valid(part_dir.parent)


def test_an_index_held_across_a_roll_still_answers(part_dir: Path) -> None:
    log = make_log(part_dir, index_interval_bytes=1)
    for i in range(5):
        log.append_records([b"%d" % i], timestamps=[NOW_MS + i], now_ms=NOW_MS)
    sealed = log.active_segment
    offset_index, time_index = sealed.offset_index, sealed.time_index
    expected = (offset_index.lookup(3), time_index.lookup(NOW_MS + 3))
    log.roll(NOW_MS)  # closes the sealed segment's index files
    assert (offset_index.lookup(3), time_index.lookup(NOW_MS + 3)) == expected
    assert offset_index.entry(0).offset == 1
    log.close()


def test_sizes_are_capped_where_kafka_types_them_as_int() -> None:
    from seglogfs.engine import ConfigError

    with pytest.raises(ConfigError, match="above the maximum of 2147483647"):
        BrokerConfig.load(overrides=["log.segment.bytes=5000000000"], log_dirs=[Path("/x")])


def quick(log: PartitionLog, most_bytes: int, most_records: int, now_ms: int) -> bool:
    with log.quick_append(most_bytes, most_records, now_ms) as answer:
        return answer


def test_quick_append_only_for_a_page_cache_write(part_dir: Path) -> None:
    """An event loop may append only when the append writes to the page cache and nothing more:
    the lock free, no roll due by size or time, no flush due (the mount's test counts which
    appends were quick)."""
    log = make_log(part_dir, segment_bytes=1000, segment_ms=60_000)
    log.append_records([b"first"], now_ms=NOW_MS)
    with log.quick_append(100, 1, NOW_MS) as answer:
        assert answer
        log.append_records([b"quick"], now_ms=NOW_MS)  # the block holds the lock: its append goes through
    assert not quick(log, 1000, 1, NOW_MS), "would roll by size"
    assert not quick(log, 100, 1, NOW_MS + 60_001), "would roll by time"
    holder, release = threading.Event(), threading.Event()

    def hold() -> None:
        with log.lock:
            holder.set()
            release.wait(10)

    thread = threading.Thread(target=hold)
    thread.start()
    holder.wait(10)
    try:
        assert not quick(log, 100, 1, NOW_MS), "another thread holds the lock"
    finally:
        release.set()
        thread.join()
    assert quick(log, 100, 1, NOW_MS)
    assert log.lock.acquire(blocking=False), "the lock is not released after the block"
    log.lock.release()
    assert values_of(log) == [b"first", b"quick"]
    log.close()
    flushing = make_log(part_dir.parent / "t-1", flush_messages=2)
    flushing.append_records([b"one"], now_ms=NOW_MS)
    assert not quick(flushing, 100, 1, NOW_MS), "would flush (flush.messages)"
    flushing.close()


def test_a_reader_takes_in_what_its_last_segment_got_before_several_rolls(part_dir: Path) -> None:
    """Between two looks of a read-only reader, a writer appends to the segment that was the
    last and then rolls twice: the reader takes in the batches that segment got before it was
    sealed (it looked again only at the one before the last, and missed them: a mount beside
    `produce` runs skipped 18,724 of 400,000 records)."""
    writer = make_log(part_dir, segment_bytes=3000)
    writer.append_records([b"first-%d" % i for i in range(3)], now_ms=NOW_MS)
    reader = PartitionLog.open(part_dir, "t", 0, writer.config, writable=False, clean_shutdown=True, now_ms=NOW_MS)
    assert len(reader.segments) == 1 and reader.log_end_offset == 3
    n = 3
    while len(writer.segments) < 4:  # (the reader's last segment grows, then two rolls and more)
        writer.append_records([b"record-%d-" % n + b"x" * 200], now_ms=NOW_MS)
        n += 1
    writer.flush()
    assert reader.refresh(NOW_MS)
    assert reader.log_end_offset == writer.log_end_offset
    assert values_of(reader) == values_of(writer)
    writer.close()
    reader.close()


def test_a_read_only_look_that_finds_no_segment_keeps_the_log_as_it_was(part_dir: Path, monkeypatch) -> None:
    """A read-only look lists the directory, then opens the segments it has not seen: under
    load, retention can remove every one of them in between (a mount's live loop did: `stat`
    of a view then failed on a log with no segment). The log stays as last seen, and the next
    look lists again and takes in the log as it is."""
    writer = make_log(part_dir, segment_bytes=300, retention_ms=1)
    writer.append_records([b"first-%d" % i for i in range(3)], now_ms=NOW_MS)
    writer.flush()
    reader = PartitionLog.open(part_dir, "t", 0, writer.config, writable=False, clean_shutdown=True, now_ms=NOW_MS)
    writer.delete_old_segments(NOW_MS + 10_000)  # (rolls, and renames every earlier segment `.deleted`)
    writer.append_records([b"later"], now_ms=NOW_MS + 10_000)
    writer.flush()

    def removed_meanwhile(*args: object, **kwargs: object) -> None:
        raise FileNotFoundError("removed by retention after the listing")

    monkeypatch.setattr(follower, "segment_for", removed_meanwhile)
    reader.refresh(NOW_MS)
    assert reader.segments and reader.active_segment.base_offset == 0
    assert values_of(reader) == [b"first-0", b"first-1", b"first-2"]
    monkeypatch.undo()
    assert reader.refresh(NOW_MS)
    assert [segment.base_offset for segment in reader.segments] == [3]
    assert reader.log_start_offset == 3 and values_of(reader, 3) == [b"later"]
    writer.close()
    reader.close()


@pytest.mark.expect_warnings(r"cut \d+ bytes after the last valid batch .* \(unclean stop\)")
def test_a_read_only_log_whose_last_batch_is_cut_ends_after_the_batch_before(part_dir: Path) -> None:
    """A crash cut the last batch, which the offset index holds (an entry has its batch's last
    offset): a read-only reader's log end is the offset after the last whole batch, not the cut
    one's last offset, and it follows a writer's recovery and appends from there."""
    log = make_log(part_dir)
    for i in range(5):
        log.append_records([b"%d" % i * 3000, b"x"], now_ms=NOW_MS)  # (a batch per index entry)
    config, path = log.config, log.segments[0].log_path
    log.close()
    os.truncate(path, path.stat().st_size - 100)
    reader = PartitionLog.open(part_dir, "t", 0, config, writable=False, clean_shutdown=False, now_ms=NOW_MS)
    assert reader.log_end_offset == 8
    assert values_of(reader)[-1] == b"x"
    writer = PartitionLog.open(part_dir, "t", 0, config, writable=True, clean_shutdown=False, now_ms=NOW_MS)
    writer.append_records([b"after"], now_ms=NOW_MS)
    writer.flush()
    reader.refresh(NOW_MS)
    assert reader.log_end_offset == 9
    assert values_of(reader, 8) == [b"after"]
    writer.close()
    reader.close()


def damage_batch_length(path: Path, nth: int, length: int) -> int:
    """Write `length` into the length field of the file's `nth` batch; returns its position."""
    from seglogfs.engine.record.records import iter_batch_headers

    content = bytearray(path.read_bytes())
    position = list(iter_batch_headers(content))[nth].position
    content[position + 8 : position + 12] = length.to_bytes(4, "big", signed=True)
    path.write_bytes(bytes(content))
    return position


@pytest.mark.parametrize("length", [10, 1 << 30], ids=["impossible", "past-the-end"])
def test_a_damaged_batch_length_in_a_sealed_segment_is_an_error_not_its_end(part_dir: Path, length: int) -> None:
    """A sealed segment is whole batches to its end: a length field no batch can have, or one
    that runs past the end, is damage named by file and position after the records before it,
    not the segment's end (the records after it were skipped without a word). In the last
    segment the same is a batch being written or a torn tail: the records before it, and no
    error."""
    log = make_log(part_dir, segment_bytes=3000)
    for n in range(60):
        log.append_records([b"record-%d-" % n + b"x" * 100], now_ms=NOW_MS)
    first, last = log.segments[0], log.segments[-1]
    assert len(log.segments) > 2 and last.size > 0
    position = damage_batch_length(first.log_path, 3, length)
    seen: list[int] = []
    with pytest.raises(
        CorruptRecordError, match=rf"{first.log_path.name}: .* at position {position}: a batch is cut short"
    ):
        seen.extend(record.offset for record in log.records(0))
    assert seen == [0, 1, 2]
    damage_batch_length(last.log_path, 0, length)  # (its first and only batch)
    assert [r.offset for r in log.records(last.base_offset)] == []
    config, sealed_last = log.config, log.segments[-2]
    log.close()
    # A reader following the partition: after a refresh, which looks again at the segment sealed
    # last (it takes its file's size, not where its batch headers stop), the same error.
    position = damage_batch_length(sealed_last.log_path, 1, length)
    reader = PartitionLog.open(part_dir, "t", 0, config, writable=False, clean_shutdown=True, now_ms=NOW_MS)
    reader.refresh(NOW_MS)
    with pytest.raises(CorruptRecordError, match=rf"{sealed_last.log_path.name}: .* at position {position}: a batch"):
        list(reader.records(sealed_last.base_offset))
    reader.close()


def test_a_read_only_look_lists_again_when_a_segment_goes_before_its_size_is_looked_at(
    part_dir: Path, monkeypatch
) -> None:
    """A read-only look lists the directory, then looks at the size of the segment that was
    last at the previous look and of the new last one. Retention can remove the former in
    between, when no descriptor holds it (a mount's descriptor budget took it back): `stat` of a
    live mount's view then failed with EIO naming the removed `.log`. The look lists again and
    takes in the log as it is now."""
    writer = make_log(part_dir, segment_bytes=300, retention_ms=1)
    writer.append_records([b"first-%d" % i for i in range(3)], now_ms=NOW_MS)
    writer.flush()
    reader = PartitionLog.open(part_dir, "t", 0, writer.config, writable=False, clean_shutdown=True, now_ms=NOW_MS)
    writer.roll(NOW_MS)
    writer.append_records([b"second"], now_ms=NOW_MS)
    writer.flush()
    listings = []
    real_listing = FollowedDirectory._list_segments

    def then_retention(self: FollowedDirectory, current: list, config: LogConfig, now_ms: int) -> tuple[list, bool]:
        listed = real_listing(self, current, config, now_ms)
        if not listings:  # (once: retention runs between the first listing and the look at sizes)
            writer.delete_old_segments(NOW_MS + 10_000)
            writer.append_records([b"later"], now_ms=NOW_MS + 10_000)
            writer.flush()
            current[0].close_handlers()
        listings.append([segment.base_offset for segment in listed[0]])
        return listed

    monkeypatch.setattr(FollowedDirectory, "_list_segments", then_retention)
    assert reader.refresh(NOW_MS)
    assert listings[0] == [0, 3] and len(listings) == 2
    assert [segment.base_offset for segment in reader.segments] == [4]
    assert reader.log_start_offset == 4 and values_of(reader, 4) == [b"later"]
    writer.close()
    reader.close()


def test_a_read_committed_look_at_a_segment_removed_since_the_last_look_reads_on_after_the_next(
    part_dir: Path,
) -> None:
    """A read-only reader's transactions are caught up (`TransactionTracker.catch_up`, what
    read_committed views, `consume` and a Spark stream do at each look) over the segments of its
    last look; a broker's cleaner or retention removed some of them meanwhile. What was read
    stands (no error: a Spark stream beside a broker compacting its topic failed so, and a
    mount's `stat` of a read_committed view was EIO), and after the next look the catch-up reads
    on to the log end."""
    writer = make_log(part_dir, segment_bytes=300, retention_ms=1)
    for i in range(6):  # (a batch each: segments of two batches)
        writer.append_records([b"first-%d-" % i + b"x" * 100], now_ms=NOW_MS)
    writer.flush()
    reader = PartitionLog.open(part_dir, "t", 0, writer.config, writable=False, clean_shutdown=True, now_ms=NOW_MS)
    assert len(reader.segments) > 2
    writer.delete_old_segments(NOW_MS + 10_000)  # (renames every segment but a new active one `.deleted`)
    writer.append_records([b"later"], now_ms=NOW_MS + 10_000)
    writer.flush()
    tracker = TransactionTracker()
    assert tracker.catch_up(reader) <= reader.log_end_offset
    assert reader.refresh(NOW_MS)
    assert tracker.catch_up(reader) == writer.log_end_offset == reader.log_end_offset
    writer.close()
    reader.close()
