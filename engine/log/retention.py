"""Which segments retention deletes (Kafka's UnifiedLog.deleteOldSegments), as a pure policy.

Three reasons, in Kafka's order:

* `retention.ms` (topics whose `cleanup.policy` contains `delete`): a segment whose largest
  timestamp is more than `retention.ms` before now; -1 disables it;
* `retention.bytes` (same topics): the oldest segments, while the log would still be at least that
  large without them; -1 disables it;
* the log start offset (every topic, compacted ones too): a segment whose offsets all lie below
  it, i.e. the next segment starts at or below the log start offset.

Segments are taken oldest first and only while the reason holds (Kafka stops at the first
segment that must stay), and only when wholly below the high watermark. The active segment is
deletable only when it has data and every segment is: the caller rolls first, so that the log
end offset survives in an empty segment.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from seglogfs.engine.config import LogConfig
from seglogfs.engine.log.segment import LogSegment


@dataclass(frozen=True)
class RetentionDecision:
    """Segments to delete (oldest first) and why; empty when nothing is due."""

    segments: list[LogSegment]
    reason: str

    def __bool__(self) -> bool:
        return bool(self.segments)


def _take_while(
    segments: list[LogSegment],
    high_watermark: int,
    log_end_offset: int,
    keep: Callable[[LogSegment, LogSegment | None], bool],
) -> list[LogSegment]:
    taken = []
    for slot, segment in enumerate(segments):
        following = segments[slot + 1] if slot + 1 < len(segments) else None
        upper = following.base_offset if following is not None else log_end_offset
        if high_watermark < upper or not keep(segment, following):
            break
        if following is None and segment.size == 0:
            break  # an empty active segment is never deleted
        taken.append(segment)
    return taken


def segments_to_delete(
    segments: list[LogSegment],
    config: LogConfig,
    *,
    log_start_offset: int,
    high_watermark: int,
    log_end_offset: int,
    now_ms: int,
) -> RetentionDecision:
    """The oldest segments retention removes now, by the first reason that applies."""
    if config.delete and config.retention_ms >= 0:
        expired = _take_while(
            segments,
            high_watermark,
            log_end_offset,
            lambda segment, _next: now_ms - segment.largest_timestamp > config.retention_ms,
        )
        if expired:
            return RetentionDecision(expired, f"retention.ms={config.retention_ms}")
    if config.delete and config.retention_bytes >= 0:
        excess = sum(segment.size for segment in segments) - config.retention_bytes
        state = {"excess": excess}

        def over(segment: LogSegment, _next: LogSegment | None) -> bool:
            if state["excess"] - segment.size < 0:
                return False
            state["excess"] -= segment.size
            return True

        oversized = _take_while(segments, high_watermark, log_end_offset, over)
        if oversized:
            return RetentionDecision(oversized, f"retention.bytes={config.retention_bytes}")
    return segments_below_log_start(
        segments, log_start_offset=log_start_offset, high_watermark=high_watermark, log_end_offset=log_end_offset
    )


def segments_below_log_start(
    segments: list[LogSegment], *, log_start_offset: int, high_watermark: int, log_end_offset: int
) -> RetentionDecision:
    """The oldest segments whose offsets all lie below the log start offset (Kafka's
    deleteLogStartOffsetBreachedSegments): what `delete-records` removes, whatever the topic's
    time and size retention say."""
    below_start = _take_while(
        segments,
        high_watermark,
        log_end_offset,
        lambda _segment, following: (following.base_offset if following else log_end_offset) <= log_start_offset,
    )
    if below_start:
        return RetentionDecision(below_start, f"log start offset {log_start_offset}")
    return RetentionDecision([], "")
