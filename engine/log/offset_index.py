"""Kafka's `.index`: a segment's sparse map from offset to the file position of the batch that
holds it, entries of 8 big-endian bytes (relative offset int32 | position int32). Offsets
strictly increase and positions never decrease; what every index shares (the file, the fences,
the checks of a file not trusted) is `engine.log.index`."""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import numpy.typing as npt

from seglogfs.engine.errors import IndexFullError, InvalidOffsetError
from seglogfs.engine.log.index import INT32, INT32_MAX, AbstractIndex, FieldAt

OFFSET_INDEX_DTYPE = np.dtype([("relative_offset", ">i4"), ("position", ">i4")])
_OFFSET_ENTRY = struct.Struct(">ii")


@dataclass(frozen=True, slots=True)
class OffsetPosition:
    """An offset-index entry in absolute terms."""

    offset: int
    position: int


class OffsetIndex(AbstractIndex):
    """`.index`: maps an offset to the file position of the batch that holds it."""

    DTYPE = OFFSET_INDEX_DTYPE
    KEY_FIELD = "relative_offset"
    FENCE_FIELDS = ("relative_offset", "position")
    FIELD_AT: ClassVar[FieldAt] = {"relative_offset": (0, INT32.unpack_from), "position": (4, INT32.unpack_from)}
    ENTRY = _OFFSET_ENTRY

    @property
    def is_full(self) -> bool:
        return self._entries >= self.max_entries

    def entry(self, n: int) -> OffsetPosition:
        """The n-th entry; raises IndexError outside 0..entries-1."""
        relative, position = self._stored_entry(n)
        return OffsetPosition(self.base_offset + relative, position)

    @property
    def last_offset(self) -> int:
        """Offset of the last entry; the base offset when empty."""
        return self.last_entry().offset

    def last_entry(self) -> OffsetPosition:
        """The last entry; (base offset, 0) when empty."""
        last = self._stored_last()
        if last is None:
            return OffsetPosition(self.base_offset, 0)
        return OffsetPosition(self.base_offset + last[0], last[1])

    def lookup(self, target_offset: int) -> OffsetPosition:
        """The entry with the largest offset ≤ target; below the first entry (or empty) →
        (base offset, 0), the start of the segment."""
        relative = target_offset - self.base_offset
        if relative < 0:
            return OffsetPosition(self.base_offset, 0)
        with self._lock:
            found = self._floor_locked(np.int32(min(relative, INT32_MAX)))
        if found is None:
            return OffsetPosition(self.base_offset, 0)
        return OffsetPosition(self.base_offset + found[0], found[1])

    def first_at_or_after(self, offset: int) -> OffsetPosition | None:
        """The first entry whose offset is `offset` or above; None when there is none (the
        batches that hold it and all after are past the last entry)."""
        relative = offset - self.base_offset
        return None if relative > INT32_MAX else self._first_reaching("relative_offset", max(relative, -1))

    def first_at_or_past_position(self, position: int) -> OffsetPosition | None:
        """The first entry whose position is `position` or past it (positions never fall along
        an index); None when there is none."""
        return None if position > INT32_MAX else self._first_reaching("position", max(position, -1))

    def _first_reaching(self, field: str, key: int) -> OffsetPosition | None:
        with self._lock:
            n, _, _ = self._slot_locked(field, np.int64(key), right=False)
            if n >= self._entries:
                return None
            relative, position = self._entry_locked(n)
        return OffsetPosition(self.base_offset + relative, position)

    def append(self, offset: int, position: int) -> None:
        """Add (offset, position). Raises IndexFullError when full, InvalidOffsetError unless the
        offset is above the last entry's."""
        self._check_writable()
        relative = self._relative(offset)
        with self._lock:
            self._ensure_scanned_locked()
            if self._entries >= self._length // self._entry_bytes:
                raise IndexFullError(f"{self.name}: index is full ({self._entries} entries)")
            if self._last is not None and relative <= self._last[0]:
                last = self.base_offset + self._last[0]
                raise InvalidOffsetError(f"{self.name}: offset {offset} is not above the last indexed offset {last}")
            self._append_locked(_OFFSET_ENTRY.pack(relative, position), (relative, position))

    def _check_chunk(
        self, chunk: npt.NDArray[np.void], previous: tuple[int, int] | None, first: int, log_size_bytes: int | None
    ) -> None:
        # Strictly increasing offsets from ≥ 0 (Kafka: the last offset is not below the base),
        # positions never decreasing from ≥ 0.
        before_offset, before_position = previous if previous is not None else (-1, 0)
        offsets = np.concatenate(([before_offset], chunk["relative_offset"].astype(np.int64)))
        positions = np.concatenate(([before_position], chunk["position"].astype(np.int64)))
        bad = np.flatnonzero((offsets[1:] <= offsets[:-1]) | (positions[1:] < positions[:-1]))
        if len(bad):
            slot = int(bad[0])
            if previous is None and slot == 0:
                reason = "is not at or above the base offset" if offsets[1] < 0 else "has a negative position"
            else:
                reason = "is not above the previous entry"
            raise self._corrupt(first + slot, chunk[slot], reason)
        if log_size_bytes is not None and positions[-1] >= max(log_size_bytes, 1):
            slot = int(np.flatnonzero(positions[1:] >= max(log_size_bytes, 1))[0])
            raise self._corrupt(first + slot, chunk[slot], f"points past the end of the log ({log_size_bytes} bytes)")
