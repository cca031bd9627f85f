"""Compaction of a data dir's logs (Kafka's LogCleaner, its one cleaner thread's loop, and the
state its LogCleanerManager keeps for the logs).

For each compacted log it keeps:

* the cleaner checkpoint, the first dirty offset (`cleaner-offset-checkpoint` in each log dir,
  read at open and written when it changes): a checkpoint outside its log is reset to the log
  start, as Kafka does;
* whether a failed pass marked the log uncleanable (its files are left as they are, the other
  logs go on; it stays so until the data dir is opened again);
* when its tombstones may next go (the earliest delete horizon a pass stamped), so that a log
  with nothing dirty is still rewritten once they may.

A pass (`clean`) cleans each cleanable log once, the filthiest first (engine.cleaner.
cleaner_manager judges, engine.cleaner.cleaner cleans). `plan` says what a pass would clean of a
log as a retention decision would leave it, changing nothing: `seglogfs clean --dry-run`.
Passes are one caller's at a time (the data dir's scheduler, or `seglogfs clean`); the partition
table is read through `logs`, whatever table it is now.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import cast

from seglogfs.engine.cleaner.cleaner import Cleaner, CleanResult, earliest_delete_horizon
from seglogfs.engine.cleaner.cleaner_manager import LogToClean, filthiest, is_cleanable, log_to_clean
from seglogfs.engine.config import BrokerConfig
from seglogfs.engine.errors import EngineError
from seglogfs.engine.log.log import PartitionLog
from seglogfs.engine.log.retention import RetentionDecision
from seglogfs.engine.log.segment import LogSegment

logger = logging.getLogger(__name__)

TopicPartition = tuple[str, int]


@dataclass
class CleanupReport:
    """What one cleanup pass did: retention per partition, compaction passes, and the
    partitions the cleaner gave up on (with the reason; they are left as they were)."""

    retention: list[tuple[PartitionLog, RetentionDecision]] = field(default_factory=list)
    compaction: list[CleanResult] = field(default_factory=list)
    failed: list[tuple[TopicPartition, str]] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.retention or self.compaction or self.failed)


@dataclass
class CleanupPlan:
    """What a cleanup pass would do now (`DataDir.plan_cleanup`): the segments retention would
    delete, per partition, and the compacted logs the cleaner would pass over, filthiest first,
    each with its dirty section as it would be after retention."""

    retention: list[tuple[PartitionLog, RetentionDecision]] = field(default_factory=list)
    compaction: list[LogToClean] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.retention or self.compaction)


class _AfterRetention:
    """A log as a retention decision would leave it, for `plan`'s estimate: the attributes
    engine.cleaner.cleaner_manager and `earliest_delete_horizon` read, nothing else."""

    def __init__(self, log: PartitionLog, kept: list[LogSegment]) -> None:
        self.topic = log.topic
        self.partition = log.partition
        self.config = log.config
        self.segments = kept
        self.log_start_offset = max(log.log_start_offset, kept[0].base_offset)
        self.log_end_offset = log.log_end_offset
        self.high_watermark = log.high_watermark


class LogCleaner:
    """The compaction of a data dir's logs: see the module docstring."""

    def __init__(self, config: BrokerConfig, logs: Callable[[], Mapping[TopicPartition, PartitionLog]]) -> None:
        self._enabled = config.log_cleaner_enable
        self._logs = logs
        self._cleaner = Cleaner(config.log_cleaner_dedupe_buffer_size, config.log_cleaner_io_buffer_load_factor)
        self._checkpoints: dict[TopicPartition, int] = {}
        self._uncleanable: dict[TopicPartition, str] = {}
        self._delete_horizons: dict[TopicPartition, int | None] = {}

    def load_checkpoints(self, offsets: Mapping[TopicPartition, int]) -> None:
        """Take the entries of a log dir's `cleaner-offset-checkpoint`."""
        self._checkpoints.update(offsets)

    def checkpoints_in(self, log_dir: Path) -> dict[TopicPartition, int]:
        """What `cleaner-offset-checkpoint` of `log_dir` holds now: the first dirty offset of each
        of its partitions that has one."""
        logs = self._logs()
        return {
            key: offset
            for key, offset in self._checkpoints.items()
            if key in logs and logs[key].directory.parent == log_dir
        }

    def forget(self, key: TopicPartition) -> None:
        """A deleted partition's state goes with it."""
        self._checkpoints.pop(key, None)
        self._uncleanable.pop(key, None)
        self._delete_horizons.pop(key, None)

    def would_clean(self, log: PartitionLog) -> bool:
        """Whether a pass looks at `log` at all: compacted, cleanable, and the cleaner on."""
        key = (log.topic, log.partition)
        return self._enabled and log.config.compact and key not in self._uncleanable and log.offline_reason is None

    def plan(self, log: PartitionLog, decision: RetentionDecision, now_ms: int) -> LogToClean | None:
        """The cleaning state of `log` as `decision` would leave it, when a pass would clean it
        then; changes nothing (a checkpoint outside the log is not reset)."""
        if not self.would_clean(log):
            return None
        gone = {id(segment) for segment in decision.segments}
        kept = [segment for segment in log.segments if id(segment) not in gone]
        if not kept:
            return None  # every segment goes: the pass rolls, and only an empty active one is left
        # The cleaner's state functions read only what `_AfterRetention` has.
        view = cast(PartitionLog, _AfterRetention(log, kept)) if decision else log
        candidate = log_to_clean(view, self._checkpoints.get((log.topic, log.partition)), now_ms)
        horizon = earliest_delete_horizon(view, candidate.first_dirty_offset)
        if is_cleanable(candidate) or (horizon is not None and horizon <= now_ms):
            return candidate
        return None

    def cleanable_logs(self, now_ms: int) -> list[LogToClean]:
        """Every compacted log's cleaning state now (uncleanable ones left out); a cleaner
        checkpoint outside its log is reset to the log start here. Safe beside topic creation in
        another thread (it reads one partition table)."""
        candidates = []
        for key, log in self._logs().items():
            if not self.would_clean(log):
                continue
            candidate = log_to_clean(log, self._checkpoints.get(key), now_ms)
            self._checkpoints[key] = candidate.first_dirty_offset
            candidates.append(candidate)
        return candidates

    def _delete_horizon_due(self, candidate: LogToClean, now_ms: int) -> bool:
        """Whether tombstones stamped by an earlier pass may now go (the pass then rewrites the
        clean section even though nothing is dirty)."""
        key = (candidate.log.topic, candidate.log.partition)
        if key not in self._delete_horizons:
            self._delete_horizons[key] = earliest_delete_horizon(candidate.log, candidate.first_dirty_offset)
        horizon = self._delete_horizons[key]
        return horizon is not None and horizon <= now_ms

    def clean(self, now_ms: int, write_checkpoints: Callable[[], None]) -> CleanupReport:
        """Clean every cleanable compacted log once, filthiest first; a log whose cleaning fails
        is marked uncleanable and left as it was, and the others go on. `write_checkpoints` is
        called after each log cleaned and once at the end (reset checkpoints too, even when
        nothing was cleaned)."""
        report = CleanupReport()
        if not self._enabled:
            return report
        done: set[TopicPartition] = set()
        try:
            while True:
                candidates = [c for c in self.cleanable_logs(now_ms) if (c.log.topic, c.log.partition) not in done]
                chosen = filthiest(candidates)
                if chosen is None:
                    chosen = next((c for c in candidates if self._delete_horizon_due(c, now_ms)), None)
                if chosen is None:
                    break
                key = (chosen.log.topic, chosen.log.partition)
                done.add(key)
                try:
                    result = self._cleaner.clean(chosen, now_ms)
                except (EngineError, OSError) as error:  # the cleaner's own writes: ENOSPC, EIO
                    self._uncleanable[key] = str(error)
                    report.failed.append((key, str(error)))
                    logger.error("cleaning %s-%d failed, leaving it uncleanable: %s", key[0], key[1], error)
                    continue
                self._checkpoints[key] = result.next_dirty_offset
                self._delete_horizons[key] = result.stats.earliest_delete_horizon
                report.compaction.append(result)
                write_checkpoints()
        finally:
            self._cleaner.release()
            write_checkpoints()
        return report
