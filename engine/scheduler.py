"""The background work of a data dir, as one synchronous scheduler with an injectable clock.

Kafka's LogManager runs these periodic tasks; here the caller decides how time passes (the mount
from a trio task, the CLI once, tests with a fake clock) and calls `run_due(now_ms)`:

    retention                   every log.retention.check.interval.ms
    compaction                  every log.cleaner.backoff.ms (when log.cleaner.enable)
    flush (flush.ms per topic)  every log.flush.scheduler.interval.ms, else every second
    root checkpoints            every log.flush.offset.checkpoint.interval.ms (recovery points,
                                high watermarks and log start offsets together)
    delayed deletes             with every retention run and every flush run

`next_due_ms` tells the caller when to come back. Not thread-safe: one caller drives it; the
partitions it works on take their own locks.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from seglogfs.engine.config import LONG_MAX
from seglogfs.engine.datadir import DataDir

_DEFAULT_FLUSH_CHECK_MS = 1000


@dataclass
class _Task:
    name: str
    interval_ms: int
    next_ms: int


@dataclass
class SchedulerReport:
    """What one `run_due` call did."""

    ran: list[str] = field(default_factory=list)
    deleted_segments: int = 0
    cleaned_logs: int = 0


class Scheduler:
    """Periodic retention, flushes, checkpoints and delayed deletes for one DataDir."""

    def __init__(self, data_dir: DataDir, now_ms: int) -> None:
        config = data_dir.config
        flush_every = config.log_flush_scheduler_interval_ms
        if flush_every >= LONG_MAX:
            flush_every = _DEFAULT_FLUSH_CHECK_MS  # flush.ms per topic still decides what flushes
        self.data_dir = data_dir
        self._tasks = [
            _Task("retention", config.log_retention_check_interval_ms, now_ms + config.log_retention_check_interval_ms),
            _Task("flush", flush_every, now_ms + flush_every),
            _Task("compaction", config.log_cleaner_backoff_ms, now_ms + config.log_cleaner_backoff_ms),
            _Task(
                "checkpoint",
                config.log_flush_offset_checkpoint_interval_ms,
                now_ms + config.log_flush_offset_checkpoint_interval_ms,
            ),
        ]

    @property
    def next_due_ms(self) -> int:
        return min(task.next_ms for task in self._tasks)

    def run_due(self, now_ms: int) -> SchedulerReport:
        """Run every task whose time has come (each once, however late), then schedule it again
        one interval from now."""
        report = SchedulerReport()
        for task in self._tasks:
            if task.next_ms > now_ms:
                continue
            if task.name == "retention":
                for _log, decision in self.data_dir.delete_old_segments(now_ms):
                    report.deleted_segments += len(decision.segments)
            elif task.name == "compaction":
                report.cleaned_logs += len(self.data_dir.compact(now_ms).compaction)
            elif task.name == "flush":
                for log in self.data_dir.partitions():
                    log.maybe_flush(now_ms)
                    log.delete_pending(now_ms)
            else:
                self.data_dir.checkpoint()
            report.ran.append(task.name)
            task.next_ms = now_ms + max(task.interval_ms, 1)
        return report
