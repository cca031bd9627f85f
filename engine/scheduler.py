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

Failures never leave `run_due` (Kafka's log-dir failure handling, s3ql's failsafe mode): each
partition's work is guarded on its own. A transient error (a full disk, too many open files,
no memory) is logged and the task retried with back-off, doubling up to
`MAX_BACKOFF_MS`; anything else that fails a partition's work (EIO, a damaged segment, a bug)
takes that partition offline (`PartitionLog.take_offline`: its reads and appends fail naming
why, its status says it), logged with the traceback, and the other partitions go on. A
checkpoint that cannot be written is retried with back-off: the data is safe, only the next
open's recovery is longer.
"""

from __future__ import annotations

import errno
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import TypeVar

from seglogfs.engine.config import LONG_MAX
from seglogfs.engine.datadir import DataDir
from seglogfs.engine.errors import LogOfflineError
from seglogfs.engine.log.log import PartitionLog

logger = logging.getLogger(__name__)

_DEFAULT_FLUSH_CHECK_MS = 1000
_FIRST_BACKOFF_MS = 1000
MAX_BACKOFF_MS = 60_000
T = TypeVar("T")
TRANSIENT_ERRNOS = frozenset(
    {errno.ENOSPC, errno.EDQUOT, errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.EAGAIN, errno.EINTR}
)


def is_transient(error: BaseException) -> bool:
    """Whether retrying later may succeed (the OS said "not now"), rather than the storage
    having failed."""
    return isinstance(error, OSError) and error.errno in TRANSIENT_ERRNOS


@dataclass
class _Task:
    name: str
    interval_ms: int
    next_ms: int
    failures: int = 0  # transient failures in a row: the back-off doubles with each


@dataclass
class SchedulerReport:
    """What one `run_due` call did."""

    ran: list[str] = field(default_factory=list)
    deleted_segments: int = 0
    cleaned_logs: int = 0
    failed: list[str] = field(default_factory=list)  # tasks that hit a transient error (retried)
    retried: list[PartitionLog] = field(default_factory=list)  # partitions whose work will be retried
    offline: list[PartitionLog] = field(default_factory=list)  # partitions taken offline now


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
        one interval from now, or sooner, after a back-off, when it hit a transient error.
        Never raises (see the module docstring)."""
        report = SchedulerReport()
        with self.data_dir.maintenance_lock:  # (a topic deleted meanwhile waits, and is not met halfway)
            self._run_due(now_ms, report)
        return report

    def _run_due(self, now_ms: int, report: SchedulerReport) -> None:
        for task in self._tasks:
            if task.next_ms > now_ms:
                continue
            try:
                retry = self._run(task.name, now_ms, report)
            except Exception as error:  # the task as a whole: a checkpoint, the cleaner's set-up
                retry = True
                first = task.failures == 0  # the traceback once, not at every retry
                logger.warning(
                    "%s failed, retried later: %s", task.name, error, exc_info=first and not is_transient(error)
                )
            report.ran.append(task.name)
            task.failures = task.failures + 1 if retry else 0
            wait_ms = max(task.interval_ms, 1)
            if retry:
                report.failed.append(task.name)
                wait_ms = min(wait_ms, _FIRST_BACKOFF_MS << min(task.failures - 1, 16), MAX_BACKOFF_MS)
            task.next_ms = now_ms + wait_ms

    def _run(self, name: str, now_ms: int, report: SchedulerReport) -> bool:
        """One task; whether to retry it soon (a partition's work hit a transient error)."""
        if name == "checkpoint":
            self.data_dir.checkpoint()
            return False
        if name == "compaction":
            report.cleaned_logs += len(self.data_dir.compact(now_ms).compaction)
            return False
        retried_before = len(report.retried)
        deleted = 0
        for log in self.data_dir.partitions():
            if log.offline_reason is not None:
                continue
            if name == "retention":
                decision = self._guarded(log, "retention", report, partial(log.delete_old_segments, now_ms))
                if decision:
                    deleted += len(decision.segments)
                    logger.info(
                        "%s-%d: deleted %d segments by %s; log start offset now %d",
                        log.topic,
                        log.partition,
                        len(decision.segments),
                        decision.reason,
                        log.log_start_offset,
                    )
            else:
                self._guarded(log, "flush", report, partial(log.maybe_flush, now_ms))
            self._guarded(log, "deleting segments", report, partial(log.delete_pending, now_ms))
        if deleted:
            report.deleted_segments += deleted
            self.data_dir.checkpoint()
        return len(report.retried) > retried_before

    @staticmethod
    def _guarded(log: PartitionLog, what: str, report: SchedulerReport, work: Callable[[], T]) -> T | None:
        """`work()` on one partition; None when it failed: a transient error is logged and the
        partition noted for a retry, anything else takes the partition offline."""
        try:
            return work()
        except LogOfflineError:
            return None
        except Exception as error:
            where = f"{log.topic}-{log.partition}: {what}"
            if is_transient(error):
                logger.warning("%s failed, retried later: %s", where, error)
                report.retried.append(log)
            else:
                logger.exception("%s failed", where)
                log.take_offline(f"{what} failed: {error}")
                report.offline.append(log)
            return None
