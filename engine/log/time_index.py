"""Kafka's `.timeindex`: a segment's sparse map from a timestamp to the offset from which its
records reach it, entries of 12 big-endian bytes (timestamp int64 | relative offset int32).
Timestamps strictly increase and offsets never decrease; an entry is added only for a timestamp
above the last one's, and one slot stays free for the entry that closes the segment. What every
index shares is `engine.log.index`."""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import numpy.typing as npt

from seglogfs.engine.errors import IndexFullError, InvalidOffsetError
from seglogfs.engine.log.index import INT32, INT64, AbstractIndex, FieldAt
from seglogfs.engine.record.records import NO_TIMESTAMP

TIME_INDEX_DTYPE = np.dtype([("timestamp", ">i8"), ("relative_offset", ">i4")])
_TIME_ENTRY = struct.Struct(">qi")


@dataclass(frozen=True, slots=True)
class TimestampOffset:
    """A time-index entry in absolute terms."""

    timestamp: int
    offset: int


class TimeIndex(AbstractIndex):
    """`.timeindex`: maps a timestamp to the offset from which records reach it."""

    DTYPE = TIME_INDEX_DTYPE
    KEY_FIELD = "timestamp"
    FENCE_FIELDS = ("timestamp", "relative_offset")
    FIELD_AT: ClassVar[FieldAt] = {"timestamp": (0, INT64.unpack_from), "relative_offset": (8, INT32.unpack_from)}
    ENTRY = _TIME_ENTRY

    @property
    def is_full(self) -> bool:
        # One slot stays free for the entry that closing the segment adds (Kafka does the same).
        return self._entries >= self.max_entries - 1

    def entry(self, n: int) -> TimestampOffset:
        """The n-th entry; raises IndexError outside 0..entries-1."""
        timestamp, relative = self._stored_entry(n)
        return TimestampOffset(timestamp, self.base_offset + relative)

    def last_entry(self) -> TimestampOffset:
        """The last entry; (-1, base offset) when empty."""
        last = self._stored_last()
        if last is None:
            return TimestampOffset(NO_TIMESTAMP, self.base_offset)
        return TimestampOffset(last[0], self.base_offset + last[1])

    def lookup(self, target_timestamp: int) -> TimestampOffset:
        """The entry with the largest timestamp ≤ target; below the first entry (or empty) →
        (-1, base offset)."""
        with self._lock:
            found = self._floor_locked(np.int64(target_timestamp))
        if found is None:
            return TimestampOffset(NO_TIMESTAMP, self.base_offset)
        return TimestampOffset(found[0], self.base_offset + found[1])

    def maybe_append(self, timestamp: int, offset: int, *, skip_full_check: bool = False) -> None:
        """Add (timestamp, offset) if the timestamp is above the last entry's (Kafka's rule).

        Raises IndexFullError when full (unless skip_full_check, used for the closing entry) and
        InvalidOffsetError when the offset or timestamp would go backwards."""
        self._check_writable()
        relative = self._relative(offset)
        with self._lock:
            self._ensure_scanned_locked()
            last_timestamp = NO_TIMESTAMP
            if self._last is not None:
                last_timestamp, last_relative = self._last
                if relative < last_relative:
                    raise InvalidOffsetError(
                        f"{self.name}: offset {offset} is below the last indexed offset "
                        f"{self.base_offset + last_relative}"
                    )
                if timestamp < last_timestamp:
                    raise InvalidOffsetError(
                        f"{self.name}: timestamp {timestamp} is below the last indexed timestamp {last_timestamp}"
                    )
            if timestamp <= last_timestamp:
                return
            slots = self._length // self._entry_bytes
            if not skip_full_check and self._entries >= slots - 1:
                raise IndexFullError(f"{self.name}: time index is full ({self._entries} entries)")
            if self._entries >= slots:
                # The closing entry of a trimmed index: grow the file by that one entry.
                self._resize_locked((self._entries + 1) * self._entry_bytes)
            self._append_locked(_TIME_ENTRY.pack(timestamp, relative), (timestamp, relative))

    def _check_chunk(
        self, chunk: npt.NDArray[np.void], previous: tuple[int, int] | None, first: int, log_size_bytes: int | None
    ) -> None:
        timestamps = chunk["timestamp"].astype(np.int64)
        offsets = chunk["relative_offset"].astype(np.int64)
        before_timestamp, before_offset = previous if previous is not None else (None, -1)
        if before_timestamp is None and offsets[0] < 0:
            raise self._corrupt(first, chunk[0], "is not at or above the base offset")
        bad = np.flatnonzero((timestamps[1:] <= timestamps[:-1]) | (offsets[1:] < offsets[:-1]))
        if before_timestamp is not None and (timestamps[0] <= before_timestamp or offsets[0] < before_offset):
            raise self._corrupt(first, chunk[0], "is not above the previous entry")
        if len(bad):
            slot = int(bad[0]) + 1
            raise self._corrupt(first + slot, chunk[slot], "is not above the previous entry")
