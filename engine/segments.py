"""The ordered map of a partition's segments by base offset (Kafka's LogSegments).

Copy-on-write: every change builds new lists, so a reader that took `snapshot()` keeps a
consistent view while the writer rolls, deletes or truncates. Mutations happen under the
partition's lock; look-ups need no lock.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator

from seglogfs.engine.segment import LogSegment


class LogSegments:
    """Segments sorted by base offset, with floor/higher look-ups. See the module docstring."""

    def __init__(self, segments: list[LogSegment] | None = None) -> None:
        ordered = sorted(segments or [], key=lambda segment: segment.base_offset)
        self._segments = ordered
        self._bases = [segment.base_offset for segment in ordered]

    def __len__(self) -> int:
        return len(self._segments)

    def __iter__(self) -> Iterator[LogSegment]:
        return iter(self._segments)

    def snapshot(self) -> list[LogSegment]:
        """The segments now, in order; unaffected by later changes."""
        return self._segments

    @property
    def first(self) -> LogSegment | None:
        return self._segments[0] if self._segments else None

    @property
    def last(self) -> LogSegment | None:
        return self._segments[-1] if self._segments else None

    def floor_index(self, offset: int) -> int:
        """Index of the segment with the largest base ≤ offset; -1 when below all."""
        return bisect.bisect_right(self._bases, offset) - 1

    def from_offset(self, offset: int) -> list[LogSegment]:
        """Segments that may hold offsets ≥ `offset`: the floor segment and every later one."""
        return self._segments[max(self.floor_index(offset), 0) :]

    def add(self, segment: LogSegment) -> None:
        """Add or replace (same base offset) a segment."""
        slot = bisect.bisect_left(self._bases, segment.base_offset)
        segments = list(self._segments)
        bases = list(self._bases)
        if slot < len(bases) and bases[slot] == segment.base_offset:
            segments[slot] = segment
        else:
            segments.insert(slot, segment)
            bases.insert(slot, segment.base_offset)
        self._segments, self._bases = segments, bases

    def remove(self, base_offset: int) -> LogSegment | None:
        slot = bisect.bisect_left(self._bases, base_offset)
        if slot >= len(self._bases) or self._bases[slot] != base_offset:
            return None
        segment = self._segments[slot]
        self._segments = self._segments[:slot] + self._segments[slot + 1 :]
        self._bases = self._bases[:slot] + self._bases[slot + 1 :]
        return segment

    def replace(self, old: list[LogSegment], new: LogSegment) -> None:
        """Swap `old` (consecutive segments, the first at `new`'s base offset) for `new` in one
        step: a reader sees either the old segments or the new one, never a gap."""
        bases = {segment.base_offset for segment in old}
        kept = [segment for segment in self._segments if segment.base_offset not in bases]
        self._segments = sorted([*kept, new], key=lambda segment: segment.base_offset)
        self._bases = [segment.base_offset for segment in self._segments]

    def size_in_bytes(self) -> int:
        return sum(segment.size for segment in self._segments)
