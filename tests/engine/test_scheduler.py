"""The scheduler, driven by a fake clock."""

from __future__ import annotations

from pathlib import Path

from seglogfs.engine import BrokerConfig, DataDir
from seglogfs.engine.checkpoint import read_offset_checkpoint
from seglogfs.engine.scheduler import Scheduler
from tests.conftest import NOW_MS, assert_log_dir_valid


def test_tasks_run_when_due_and_not_before(log_dir: Path) -> None:
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
        report = scheduler.run_due(NOW_MS + 700_000)  # every record is now older than 600 s
        assert report.deleted_segments == segments and log.log_start_offset == 10
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
