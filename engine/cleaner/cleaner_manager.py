"""Which compacted logs are cleanable and how dirty they are (Kafka's LogCleanerManager, with its
LogToClean, for one cleaner thread).

A compacted log is split at the first dirty offset (`cleaner-offset-checkpoint`, else the log
start): below it the log was cleaned before; from it up to the first uncleanable offset it is
dirty. The first uncleanable offset is the lowest of the active segment's base offset, the high
watermark and, with `min.compaction.lag.ms`, the base of the first dirty segment holding a record
younger than the lag. A log is worth a pass when its dirty bytes are more than
`min.cleanable.dirty.ratio` of its clean and dirty bytes together, or when `max.compaction.lag.ms`
has passed for its first dirty batches; the filthiest such log goes first. The pass itself is
engine.cleaner.cleaner's.

Everything here only looks at the log: its segment snapshot and its sealed segments' batch
headers and indexes, read without the partition's lock, on the cleaner's thread.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from seglogfs.engine.log.log import PartitionLog
    from seglogfs.engine.log.segment import LogSegment


@dataclass(frozen=True, slots=True)
class LogToClean:
    """A compacted log's cleaning state (Kafka's LogToClean)."""

    log: PartitionLog
    first_dirty_offset: int
    first_uncleanable_offset: int
    clean_bytes: int
    cleanable_bytes: int
    needs_compaction_now: bool

    @property
    def total_bytes(self) -> int:
        return self.clean_bytes + self.cleanable_bytes

    @property
    def cleanable_ratio(self) -> float:
        return self.cleanable_bytes / self.total_bytes if self.total_bytes else 0.0


def first_dirty_offset(log: PartitionLog, checkpoint: int | None) -> int:
    """Where the dirty section starts: the checkpoint, reset to the log start offset when it is
    missing or lies outside the log (Kafka resets such a checkpoint too)."""
    if checkpoint is None or checkpoint < log.log_start_offset or checkpoint > log.log_end_offset:
        return log.log_start_offset
    return checkpoint


def first_uncleanable_offset(log: PartitionLog, first_dirty: int, now_ms: int) -> int:
    """Kafka's cleanableOffsets: the active segment, the high watermark and, with
    `min.compaction.lag.ms`, the first dirty segment holding a record younger than the lag."""
    segments = log.segments
    limit = min(segments[-1].base_offset, log.high_watermark)
    lag = max(log.config.min_compaction_lag_ms, 0)
    if lag > 0:
        for segment in _segments_from(segments[:-1], first_dirty):
            if segment.largest_timestamp > now_ms - lag:
                limit = min(limit, segment.base_offset)
                break
    return limit


def _segments_from(segments: list[LogSegment], offset: int) -> list[LogSegment]:
    """Segments that may hold offsets ≥ `offset`: the one holding it and every later one."""
    start = 0
    for i, segment in enumerate(segments):
        if segment.base_offset <= offset:
            start = i
    return segments[start:]


def segments_between(segments: list[LogSegment], start: int, end: int) -> list[LogSegment]:
    """Kafka's logSegments(from, to): from the segment holding `start` through the last one
    whose base offset is below `end`."""
    if start >= end:
        return []
    return [segment for segment in _segments_from(segments, start) if segment.base_offset < end]


def needs_compaction_now(log: PartitionLog, first_dirty: int, now_ms: int) -> bool:
    """`max.compaction.lag.ms` has passed for the first dirty record (by its batch's first
    timestamp)."""
    lag = max(log.config.max_compaction_lag_ms, 0)
    if lag >= 2**62:
        return False
    firsts = (segment.first_batch_timestamp() for segment in _segments_from(log.segments[:-1], first_dirty))
    timestamps = [timestamp for timestamp in firsts if timestamp > 0]
    return bool(timestamps) and min(timestamps) < now_ms - lag


def log_to_clean(log: PartitionLog, checkpoint: int | None, now_ms: int) -> LogToClean:
    """`log`'s cleaning state now, from its `cleaner-offset-checkpoint` entry (None: none)."""
    first_dirty = first_dirty_offset(log, checkpoint)
    uncleanable = max(first_dirty, first_uncleanable_offset(log, first_dirty, now_ms))
    segments = log.segments
    return LogToClean(
        log=log,
        first_dirty_offset=first_dirty,
        first_uncleanable_offset=uncleanable,
        clean_bytes=sum(s.size for s in segments if s.base_offset < first_dirty),
        cleanable_bytes=sum(s.size for s in segments_between(segments, first_dirty, uncleanable)),
        needs_compaction_now=needs_compaction_now(log, first_dirty, now_ms),
    )


def is_cleanable(candidate: LogToClean) -> bool:
    """Worth a pass: dirty enough, or holding a record past `max.compaction.lag.ms`."""
    return (
        candidate.needs_compaction_now and candidate.cleanable_bytes > 0
    ) or candidate.cleanable_ratio > candidate.log.config.min_cleanable_dirty_ratio


def filthiest(candidates: Sequence[LogToClean]) -> LogToClean | None:
    """The cleanable log with the highest dirty ratio, None when none is cleanable."""
    cleanable = [candidate for candidate in candidates if is_cleanable(candidate)]
    return max(cleanable, key=lambda candidate: candidate.cleanable_ratio, default=None)
