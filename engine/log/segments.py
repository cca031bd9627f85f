"""The ordered map of a partition's segments by base offset (Kafka's LogSegments).

Copy-on-write: every change builds new lists and publishes them together, as one tuple in one
assignment, so a reader that took `snapshot()` (or any look-up) sees one consistent state while
the writer rolls, deletes or truncates (published one after the other, a reader could pair a
new segment list with old bases and skip a segment). Mutations happen under the partition's
lock; look-ups need no lock.
"""

from __future__ import annotations

import bisect

from seglogfs.engine.log.segment import LogSegment


class LogSegments:
    """Segments sorted by base offset, with floor look-ups. See the module docstring."""

    def __init__(self, segments: list[LogSegment] | None = None) -> None:
        ordered = sorted(segments or [], key=lambda segment: segment.base_offset)
        self._state = (ordered, [segment.base_offset for segment in ordered])

    def _publish(self, segments: list[LogSegment]) -> None:
        self._state = (segments, [segment.base_offset for segment in segments])

    def snapshot(self) -> list[LogSegment]:
        """The segments now, in order; unaffected by later changes."""
        return self._state[0]

    @property
    def last(self) -> LogSegment | None:
        segments = self._state[0]
        return segments[-1] if segments else None

    def from_offset(self, offset: int) -> list[LogSegment]:
        """Segments that may hold offsets ≥ `offset`: the floor segment and every later one."""
        segments, bases = self._state
        return segments[max(bisect.bisect_right(bases, offset) - 1, 0) :]

    def add(self, segment: LogSegment) -> None:
        """Add or replace (same base offset) a segment."""
        segments, bases = self._state
        slot = bisect.bisect_left(bases, segment.base_offset)
        changed = list(segments)
        if slot < len(bases) and bases[slot] == segment.base_offset:
            changed[slot] = segment
        else:
            changed.insert(slot, segment)
        self._publish(changed)

    def remove(self, base_offset: int) -> LogSegment | None:
        segments, bases = self._state
        slot = bisect.bisect_left(bases, base_offset)
        if slot >= len(bases) or bases[slot] != base_offset:
            return None
        self._publish(segments[:slot] + segments[slot + 1 :])
        return segments[slot]

    def replace(self, old: list[LogSegment], new: LogSegment) -> None:
        """Swap `old` (consecutive segments, the first at `new`'s base offset) for `new` in one
        step: a reader sees either the old segments or the new one, never a gap."""
        bases = {segment.base_offset for segment in old}
        kept = [segment for segment in self._state[0] if segment.base_offset not in bases]
        self._publish(sorted([*kept, new], key=lambda segment: segment.base_offset))

    def size_in_bytes(self) -> int:
        return sum(segment.size for segment in self._state[0])
