"""Retention by time, size and log start offset: Kafka's retention cases (numbered in comments)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from seglogfs.engine import BrokerConfig, DataDir, OffsetOutOfRangeError, PartitionLog
from seglogfs.engine.record.builder import build_batch
from tests.conftest import NOW_MS, REPO, assert_log_dir_valid, make_log

RECORD = b"0123456789"
BATCH_BYTES = len(build_batch([RECORD], timestamps=NOW_MS))


def fill(log: PartitionLog, count: int, timestamp: int = NOW_MS) -> None:
    for _ in range(count):
        log.append_records([RECORD], timestamps=[timestamp], now_ms=NOW_MS)


def five_per_segment(log_dir: Path, **overrides: object) -> PartitionLog:
    return make_log(log_dir / "t-0", segment_bytes=5 * BATCH_BYTES, **overrides)


def test_time_retention_deletes_expired_segments_and_keeps_the_log_end(log_dir: Path) -> None:
    # Case 77: 15 records stamped 10 in 3 segments, retention.ms 10 s, HW = end → 1 segment remains.
    log = five_per_segment(log_dir, retention_ms=10_000)
    fill(log, 15, timestamp=10)
    assert [s.base_offset for s in log.segments] == [0, 5, 10]
    decision = log.delete_old_segments(NOW_MS)
    assert decision.reason == "retention.ms=10000"
    assert len(log.segments) == 1 and log.log_end_offset == 15 == log.log_start_offset
    assert log.active_segment.size == 0  # every segment was due: rolled first (case 19)
    assert not log.delete_old_segments(NOW_MS)  # a second pass deletes nothing
    assert log.append_records([b"next"], now_ms=NOW_MS).first_offset == 15
    log.close()
    assert_log_dir_valid(log_dir)


def test_time_retention_keeps_records_stamped_now(log_dir: Path) -> None:
    log = five_per_segment(log_dir, retention_ms=3_600_000)
    fill(log, 15)
    assert not log.delete_old_segments(NOW_MS)
    assert len(log.segments) == 3
    log.close()


def test_size_retention_deletes_oldest_whole_segments(log_dir: Path) -> None:
    # Case 76: retention.bytes = 10 records → 2 segments remain; 15 records → 3 remain.
    log = five_per_segment(log_dir, retention_bytes=10 * BATCH_BYTES)
    fill(log, 15)
    assert log.delete_old_segments(NOW_MS).reason == f"retention.bytes={10 * BATCH_BYTES}"
    assert [s.base_offset for s in log.segments] == [5, 10]
    assert log.log_start_offset == 5
    assert [r.offset for r in log.records(5)][:1] == [5]
    assert [r.offset for r in log.records(0)][:1] == [5]  # nothing below the new log start
    log.close()
    (log_dir / "roomy").mkdir()
    roomy = five_per_segment(log_dir / "roomy", retention_bytes=15 * BATCH_BYTES)
    fill(roomy, 15)
    assert not roomy.delete_old_segments(NOW_MS) and len(roomy.segments) == 3
    roomy.close()


def test_compact_policy_ignores_time_but_not_the_log_start(log_dir: Path) -> None:
    # Cases 78/79.
    keyed = len(build_batch([RECORD], keys=[b"k00"], timestamps=10))
    log = make_log(log_dir / "t-0", segment_bytes=5 * keyed, retention_ms=10, cleanup_policy="compact")
    for i in range(15):
        log.append_records([RECORD], keys=[b"k%02d" % i], timestamps=[10], now_ms=NOW_MS)
    assert not log.delete_old_segments(NOW_MS)
    log.delete_records(5, NOW_MS)
    assert [s.base_offset for s in log.segments] == [5, 10] and log.log_start_offset == 5
    log.close()
    (log_dir / "both").mkdir()
    both = make_log(
        log_dir / "both" / "t-0", segment_bytes=5 * keyed, retention_ms=10_000, cleanup_policy="compact,delete"
    )
    for i in range(15):
        both.append_records([RECORD], keys=[b"k%02d" % i], timestamps=[10], now_ms=NOW_MS)
    both.delete_old_segments(NOW_MS)
    assert len(both.segments) == 1
    both.close()


def test_delete_records_moves_the_start_and_drops_whole_segments(log_dir: Path) -> None:
    # Case 80: start → 1 deletes nothing; → 6 deletes the first segment; → 15 leaves the empty active.
    log = five_per_segment(log_dir)
    fill(log, 15)
    assert log.delete_records(1, NOW_MS) == 1 and len(log.segments) == 3
    assert [r.offset for r in log.records(log.log_start_offset)][:1] == [1]
    assert log.delete_records(6, NOW_MS) == 6 and [s.base_offset for s in log.segments] == [5, 10]
    assert log.delete_records(15, NOW_MS) == 15
    assert len(log.segments) == 1 and log.active_segment.size == 0
    with pytest.raises(OffsetOutOfRangeError):
        log.delete_records(16, NOW_MS)
    log.close()
    assert_log_dir_valid(log_dir)


def test_delete_records_runs_no_time_or_size_retention(log_dir: Path) -> None:
    # Data older than retention.ms and over retention.bytes: delete-records raises the log start
    # offset and removes the segments wholly below it, nothing more (the retention pass decides
    # the rest); before, it ran a whole retention pass and removed every segment.
    log = five_per_segment(log_dir, retention_ms=1000, retention_bytes=1)
    fill(log, 15, timestamp=10)
    assert log.delete_records(7, NOW_MS) == 7
    assert [s.base_offset for s in log.segments] == [5, 10]
    assert [r.offset for r in log.records(log.log_start_offset)] == list(range(7, 15))
    log.close()
    assert_log_dir_valid(log_dir)


def test_deleted_segments_wait_as_dot_deleted_and_readers_keep_reading(log_dir: Path) -> None:
    # Case 83: renamed .deleted, removed after file.delete.delay.ms.
    log = five_per_segment(log_dir, retention_ms=10_000, file_delete_delay_ms=60_000)
    fill(log, 10, timestamp=10)
    reader = log.batches(0)
    first = next(reader)
    decision = log.delete_old_segments(NOW_MS)
    assert [s.base_offset for s in decision.segments] == [0, 5]
    names = sorted(p.name for p in (log_dir / "t-0").iterdir())
    assert "00000000000000000000.log.deleted" in names and "00000000000000000000.log" not in names
    assert first[1].base_offset == 0
    assert [h.base_offset for _, h, _ in reader][:4] == [1, 2, 3, 4]  # the held segment still reads
    assert log.delete_pending(NOW_MS + 59_999) == 0
    assert log.delete_pending(NOW_MS + 60_000) == 2
    assert not any(p.name.endswith(".deleted") for p in (log_dir / "t-0").iterdir())
    log.close()


def test_log_start_offset_survives_reopen(log_dir: Path) -> None:
    config = BrokerConfig.load(overrides=[f"log.segment.bytes={5 * BATCH_BYTES}"], log_dirs=[log_dir])
    with DataDir.open(config, now_ms=NOW_MS) as data_dir:
        log = data_dir.partition_for_append("t", 0, now_ms=NOW_MS)[0]
        fill(log, 12)
        log.delete_records(7, NOW_MS)
    assert (log_dir / "log-start-offset-checkpoint").read_text().splitlines()[2:] == ["t 0 7"]
    with DataDir.open(config, now_ms=NOW_MS) as data_dir:
        log = data_dir.partition("t", 0)
        assert log.log_start_offset == 7
        assert [r.offset for r in log.records(7)][:1] == [7]
    assert_log_dir_valid(log_dir)


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "seglogfs.mount_tools.cli", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_clean_and_delete_records_commands(log_dir: Path) -> None:
    config = BrokerConfig.load(
        overrides=[f"log.segment.bytes={5 * BATCH_BYTES}", "log.retention.ms=10000"], log_dirs=[log_dir]
    )
    with DataDir.open(config, now_ms=NOW_MS) as data_dir:
        fill(data_dir.partition_for_append("t", 0, now_ms=NOW_MS)[0], 12, timestamp=NOW_MS)
    overrides = ["--override", f"log.segment.bytes={5 * BATCH_BYTES}", "--override", "log.retention.ms=10000"]
    early = run_cli("clean", str(log_dir), "--now", str(NOW_MS + 5_000), *overrides)
    assert early.returncode == 0 and early.stdout.strip() == "nothing to delete or compact"
    late = run_cli("clean", str(log_dir), "--now", str(NOW_MS + 20_000), *overrides)
    assert late.returncode == 0, late.stderr
    assert late.stdout.strip() == "t-0: deleted 3 segments (0, 5, 10) by retention.ms=10000; log start offset now 12"
    moved = run_cli("delete-records", str(log_dir), "--topic", "t", "--partition", "0", "--offset", "99")
    assert moved.returncode == 1 and "offset 99 is out of range" in moved.stderr
    assert_log_dir_valid(log_dir)
