"""The scheduler, driven by a fake clock."""

from __future__ import annotations

import errno
import logging
from pathlib import Path

import pytest

from seglogfs.engine import BrokerConfig, DataDir
from seglogfs.engine.errors import LogOfflineError
from seglogfs.engine.log.checkpoint import read_offset_checkpoint
from seglogfs.engine.scheduler import Scheduler
from seglogfs.engine.status import partition_status
from tests.conftest import NOW_MS, assert_log_dir_valid


def test_tasks_run_when_due_and_not_before(log_dir: Path, caplog: pytest.LogCaptureFixture) -> None:
    config = BrokerConfig.load(
        overrides=[
            "log.retention.check.interval.ms=300000",
            "log.flush.offset.checkpoint.interval.ms=60000",
            "log.retention.ms=600000",
            "log.segment.bytes=200",
            "log.flush.interval.ms=5000",
            "log.segment.delete.delay.ms=60000",
        ],
        log_dirs=[log_dir],
    )
    with DataDir.open(config, now_ms=NOW_MS) as data_dir:
        log = data_dir.partition_for_append("s", 0, now_ms=NOW_MS)[0]
        for i in range(10):
            log.append_records([b"record-%d" % i * 5], timestamps=[NOW_MS], now_ms=NOW_MS)
        scheduler = Scheduler(data_dir, NOW_MS)
        assert scheduler.next_due_ms == NOW_MS + 1000  # the flush check
        assert scheduler.run_due(NOW_MS + 999).ran == []
        assert log.recovery_point < log.log_end_offset
        assert scheduler.run_due(NOW_MS + 5000).ran == ["flush"]  # flush.ms has passed
        assert log.recovery_point == log.log_end_offset
        assert scheduler.run_due(NOW_MS + 60_000).ran == ["flush", "compaction", "checkpoint"]
        checkpoint = read_offset_checkpoint(log_dir / "recovery-point-offset-checkpoint")
        assert checkpoint[("s", 0)] == log.log_end_offset
        segments = len(log.segments)
        report = scheduler.run_due(NOW_MS + 300_000)  # retention runs, nothing has expired yet
        assert "retention" in report.ran and report.deleted_segments == 0 and len(log.segments) == segments
        with caplog.at_level(logging.INFO, logger="seglogfs.engine.scheduler"):
            report = scheduler.run_due(NOW_MS + 700_000)  # every record is now older than 600 s
        assert report.deleted_segments == segments and log.log_start_offset == 10
        # The mount's log says what retention removed, and why.
        assert f"s-0: deleted {segments} segments by retention.ms=600000; log start offset now 10" in caplog.text
        assert any(p.name.endswith(".deleted") for p in (log_dir / "s-0").iterdir())
        scheduler.run_due(NOW_MS + 761_000)  # file.delete.delay.ms later the files go
        assert not any(p.name.endswith(".deleted") for p in (log_dir / "s-0").iterdir())
    assert_log_dir_valid(log_dir)


def test_compaction_runs_every_cleaner_backoff(log_dir: Path) -> None:
    config = BrokerConfig.load(overrides=["log.cleaner.backoff.ms=15000", "log.segment.bytes=300"], log_dirs=[log_dir])
    with DataDir.open(config, now_ms=NOW_MS) as data_dir:
        data_dir.create_topic("c", 1, {"cleanup.policy": "compact"}, now_ms=NOW_MS)
        log = data_dir.partition("c", 0)
        for i in range(40):
            log.append_records([b"value-%d" % i], keys=[b"key-%d" % (i % 4)], timestamps=[NOW_MS], now_ms=NOW_MS)
        scheduler = Scheduler(data_dir, NOW_MS)
        assert scheduler.run_due(NOW_MS + 14_999).cleaned_logs == 0
        report = scheduler.run_due(NOW_MS + 15_000)
        assert "compaction" in report.ran and report.cleaned_logs == 1
        assert sum(1 for _ in log.records(0)) < 40
        survivors = {record.key: record.value for record in log.records(0)}
        assert survivors == {b"key-%d" % k: b"value-%d" % (36 + k) for k in range(4)}
        # Nothing new is dirty: the next run finds nothing to do.
        assert scheduler.run_due(NOW_MS + 30_000).cleaned_logs == 0
        assert read_offset_checkpoint(log_dir / "cleaner-offset-checkpoint")[("c", 0)] == log.active_segment.base_offset
    assert_log_dir_valid(log_dir)


def _two_partitions(log_dir: Path) -> DataDir:
    config = BrokerConfig.load(overrides=["log.flush.interval.messages=1"], log_dirs=[log_dir])
    data_dir = DataDir.open(config, now_ms=NOW_MS)
    data_dir.create_topic("t", 2, now_ms=NOW_MS)
    for partition in (0, 1):
        data_dir.partition("t", partition).append_records([b"before"], now_ms=NOW_MS)
    return data_dir


@pytest.mark.expect_warnings(r"t-0: flush failed", r"t-0 is offline")
def test_a_raising_task_takes_its_partition_offline_and_the_others_go_on(log_dir: Path) -> None:
    data_dir = _two_partitions(log_dir)
    broken, fine = data_dir.partition("t", 0), data_dir.partition("t", 1)

    def fail(now_ms: int) -> None:
        raise OSError(errno.EIO, "Input/output error")

    broken.maybe_flush = fail  # type: ignore[method-assign]
    scheduler = Scheduler(data_dir, NOW_MS)
    report = scheduler.run_due(NOW_MS + 1000)  # raised out of run_due and unmounted before
    assert report.offline == [broken] and "flush failed" in (broken.offline_reason or "")
    assert partition_status(broken)["offline"] == broken.offline_reason
    with pytest.raises(LogOfflineError, match="t-0 is offline: flush failed"):
        broken.append_records([b"x"], now_ms=NOW_MS)
    with pytest.raises(LogOfflineError):
        list(broken.records(0))
    fine.append_records([b"after"], now_ms=NOW_MS)
    assert [r.value for r in fine.records(0)] == [b"before", b"after"]
    assert scheduler.run_due(NOW_MS + 2000).offline == []  # not offline twice, the rest still runs
    data_dir.close()
    assert not (log_dir / ".kafka_cleanshutdown").exists()  # an offline partition: recover at open


@pytest.mark.expect_warnings(r"t-0: retention failed, retried later")
def test_a_transient_error_is_retried_with_back_off(log_dir: Path) -> None:
    data_dir = _two_partitions(log_dir)
    log = data_dir.partition("t", 0)
    calls: list[int] = []
    original = log.delete_old_segments

    def full_disk(now_ms: int):  # type: ignore[no-untyped-def]
        calls.append(now_ms)
        if len(calls) < 3:
            raise OSError(errno.ENOSPC, "No space left on device")
        return original(now_ms)

    log.delete_old_segments = full_disk  # type: ignore[method-assign]
    scheduler = Scheduler(data_dir, NOW_MS)
    interval = data_dir.config.log_retention_check_interval_ms
    now = NOW_MS + interval
    report = scheduler.run_due(now)
    assert report.failed == ["retention"] and report.offline == [] and log.offline_reason is None
    retry = next(task for task in scheduler._tasks if task.name == "retention").next_ms
    assert retry == now + 1000  # a second, not a whole check interval
    scheduler.run_due(retry)
    retry_again = next(task for task in scheduler._tasks if task.name == "retention").next_ms
    assert retry_again == retry + 2000  # doubled
    assert scheduler.run_due(retry_again).failed == []  # the disk has room again
    assert len(calls) == 3
    data_dir.close()


@pytest.mark.expect_warnings(r"checkpoint failed, retried later")
def test_a_failing_checkpoint_write_is_retried_and_harms_nothing(log_dir: Path) -> None:
    data_dir = _two_partitions(log_dir)
    (log_dir / "recovery-point-offset-checkpoint").unlink(missing_ok=True)
    (log_dir / "recovery-point-offset-checkpoint").mkdir()  # the rename onto it fails
    scheduler = Scheduler(data_dir, NOW_MS)
    report = scheduler.run_due(NOW_MS + data_dir.config.log_flush_offset_checkpoint_interval_ms)
    assert "checkpoint" in report.failed and report.offline == []
    data_dir.partition("t", 1).append_records([b"still"], now_ms=NOW_MS)
    (log_dir / "recovery-point-offset-checkpoint").rmdir()
    assert "checkpoint" not in scheduler.run_due(scheduler.next_due_ms + 120_000).failed
    data_dir.close()
    assert_log_dir_valid(log_dir)
