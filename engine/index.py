"""Kafka's sparse segment indexes: `.index` (offset → position) and `.timeindex` (time → offset).

Both are arrays of fixed-size big-endian entries, memory-mapped and read through numpy views,
and written with `pwrite` (never through the mapping: a store into a preallocated, sparse page
that the file system cannot back — a full disk — kills the process with SIGBUS, where `pwrite`
returns ENOSPC as an error the append reports):

    .index       OFFSET_INDEX_DTYPE  8 bytes:  relative_offset int32 | position int32
    .timeindex   TIME_INDEX_DTYPE   12 bytes:  timestamp int64      | relative_offset int32

`relative_offset` is the absolute offset minus the segment's base offset. Invariants: offsets
strictly increase in `.index`; in `.timeindex` timestamps strictly increase and offsets never
decrease. An entry is written when more than `index.interval.bytes` were appended since the last
one (the segment decides; see `engine.segment`).

While a segment is active its index files are preallocated to `segment.index.bytes` rounded down
to the entry size, the tail zero-filled; `trim_to_valid_size` cuts them to the entries in use on
roll and on close. After a crash the file may therefore be longer than its entries: the entry
count is only trusted after a clean shutdown, and the loader rebuilds the indexes of every
segment from the recovery point on. `sanity_check` catches the damage a crash or a stray write
can leave (a length that is not a multiple of the entry size, entries out of order, positions
past the log), so that a damaged index is rebuilt rather than trusted.

Look-ups, appends and resizes are thread-safe: each index guards its mapping with a lock, since
a reader may look up while the writer appends, trims or closes. An index is closed when its
segment gives back its files (a roll, a release, or an eviction by `engine.handles`); a reader
that still holds the object reopens it read-only on its next look-up. `fsync` runs only for an
index written (or resized) since its last one: closing an untouched index costs no disk flush.
Look-ups are binary searches on the mapped column (`np.searchsorted`, with numpy scalars as
needles: a Python int needle makes numpy convert the whole array on every call).
"""

from __future__ import annotations

import errno
import mmap
import os
import struct
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import numpy as np
import numpy.typing as npt

from seglogfs.engine.errors import CorruptIndexError, IndexFullError, InvalidOffsetError, OffsetOverflowError

OFFSET_INDEX_DTYPE = np.dtype([("relative_offset", ">i4"), ("position", ">i4")])
TIME_INDEX_DTYPE = np.dtype([("timestamp", ">i8"), ("relative_offset", ">i4")])
NO_TIMESTAMP = -1
_INT32_MAX = 2**31 - 1
_OFFSET_ENTRY = struct.Struct(">ii")
_TIME_ENTRY = struct.Struct(">qi")


@dataclass(frozen=True, slots=True)
class OffsetPosition:
    """An offset-index entry in absolute terms."""

    offset: int
    position: int


@dataclass(frozen=True, slots=True)
class TimestampOffset:
    """A time-index entry in absolute terms."""

    timestamp: int
    offset: int


def entries_in_use(entries: npt.NDArray[np.void]) -> npt.NDArray[np.void]:
    """The entries of a read-in index file up to its preallocated zero tail: a slot after the
    first that repeats relative offset 0 ends them (Kafka's dump stops there too). An index whose
    only entry is all zeros holds none."""
    if len(entries) == 0:
        return entries
    repeats = np.flatnonzero(entries["relative_offset"][1:] == 0)
    if len(repeats):
        entries = entries[: repeats[0] + 1]
    if len(entries) == 1 and not entries.tobytes().strip(b"\0") and len(repeats):
        return entries[:0]
    return entries


def round_down_to_entries(size_bytes: int, entry_bytes: int) -> int:
    return size_bytes - size_bytes % entry_bytes


class _MappedIndex:
    """What both index kinds share: the file, its mapping, the entry count and the search keys.

    The search column (relative offsets, or timestamps) is also kept as a native contiguous
    array, filled from the mapping as entries arrive: `np.searchsorted` on the big-endian field of
    a structured view would convert the whole column on every call."""

    DTYPE: ClassVar[np.dtype]
    KEY_FIELD: ClassVar[str]
    KEY_DTYPE: ClassVar[type[np.integer]]

    def __init__(self, path: Path | None, base_offset: int, max_index_bytes: int, *, writable: bool) -> None:
        """Open (or, when writable, create) the index at `path`.

        An existing file is mapped at its length, its entry count the length over the entry size
        (trusting a clean shutdown's trim); a new one is preallocated to `max_index_bytes`.
        `path=None` makes an index in anonymous memory: what a read-only reader builds for a
        segment whose index file is missing or damaged, since it may not write one."""
        self.path = path
        self.base_offset = base_offset
        self.writable = writable or path is None
        self._lock = threading.Lock()
        self._entry_bytes = self.DTYPE.itemsize
        self._max_index_bytes = max(round_down_to_entries(max_index_bytes, self._entry_bytes), self._entry_bytes)
        self._file = None
        length = 0
        newly_created = path is None
        if path is not None:
            newly_created = writable and not path.exists()
            self._file = open(path, "w+b" if newly_created else "r+b" if writable else "rb")  # noqa: SIM115
            length = os.fstat(self._file.fileno()).st_size
        self._entries = length // self._entry_bytes
        self._length = length
        self._mmap: mmap.mmap | None = None
        self._keys = np.empty(0, dtype=self.KEY_DTYPE)
        self._keys_count = 0
        self._closed = False
        # Written or resized through this object since its last fsync (only a file's index).
        self._dirty = False
        if newly_created:
            # Only a new index is preallocated; an existing one keeps its length until its
            # segment becomes the active one (`resize`), as Kafka does.
            self._resize_locked(self._max_index_bytes)
        else:
            self._map_locked()

    @property
    def name(self) -> str:
        return str(self.path) if self.path is not None else f"<in-memory index of segment {self.base_offset}>"

    # -- mapping ----------------------------------------------------------------------------
    def _map_locked(self) -> None:
        if self._mmap is not None:
            self._mmap.close()
            self._mmap = None
        if self._length > 0 and self._file is not None:
            if self.writable:
                self._mmap = mmap.mmap(self._file.fileno(), self._length, access=mmap.ACCESS_READ)
            else:
                self._mmap = self._copy_locked()

    def _copy_locked(self) -> mmap.mmap | None:
        """A read-only index's bytes, copied into anonymous memory rather than mapped: the file
        may belong to a writer in another process, whose trim at a roll or close would make a
        mapped page past the new end kill this process with SIGBUS. What the file no longer
        holds when read is not counted."""
        assert self._file is not None
        copy = mmap.mmap(-1, self._length)
        read = os.preadv(self._file.fileno(), [copy], 0)
        if read < self._length:  # trimmed since its length was taken (a damaged length stays seen)
            whole = round_down_to_entries(read, self._entry_bytes)
            self._length = whole
            self._entries = min(self._entries, whole // self._entry_bytes)
            if not whole:
                copy.close()
                return None
            shorter = mmap.mmap(-1, whole)
            shorter[:] = copy[:whole]
            copy.close()
            return shorter
        return copy

    def _resize_locked(self, new_length: int) -> bool:
        new_length = round_down_to_entries(new_length, self._entry_bytes)
        if new_length == self._length and (self._mmap is not None or new_length == 0):
            return False
        self._entries = min(self._entries, new_length // self._entry_bytes)
        if self._file is None:
            # Anonymous memory: a new mapping with the entries in use copied over.
            fresh = mmap.mmap(-1, new_length) if new_length else None
            if self._mmap is not None:
                if fresh is not None:
                    used = self._entries * self._entry_bytes
                    fresh[:used] = self._mmap[:used]
                self._mmap.close()
            self._mmap = fresh
            self._length = new_length
            return True
        if self._mmap is not None:
            self._mmap.close()
            self._mmap = None
        self._file.truncate(new_length)
        self._dirty = True
        self._length = new_length
        self._map_locked()
        return True

    def _view(self) -> npt.NDArray[np.void]:
        """The entries in use; callers hold the lock for as long as they use the view."""
        if self._mmap is None or self._entries == 0:
            return np.empty(0, dtype=self.DTYPE)
        return np.frombuffer(self._mmap, dtype=self.DTYPE, count=self._entries)

    def _reopen_if_closed_locked(self) -> None:
        """A reader may still hold an index its segment closed (a roll closes sealed indexes):
        it reopens, read-only, at the file's trimmed length, so look-ups stay right."""
        if not self._closed or self.path is None:
            return
        self._closed = False
        self.writable = False
        self._dirty = False
        self._file = open(self.path, "rb")  # noqa: SIM115 - closed by close()
        self._length = os.fstat(self._file.fileno()).st_size
        self._entries = self._length // self._entry_bytes
        self._map_locked()

    def _keys_locked(self) -> npt.NDArray[np.integer]:
        """The native search keys of the entries in use (caller holds the lock)."""
        entries = self._entries
        self._keys_count = min(self._keys_count, entries)
        if self._keys_count < entries:
            if len(self._keys) < entries:
                grown = np.empty(max(entries, 2 * len(self._keys), 1024), dtype=self.KEY_DTYPE)
                grown[: self._keys_count] = self._keys[: self._keys_count]
                self._keys = grown
            fresh = self._view()[self.KEY_FIELD][self._keys_count : entries]
            self._keys[self._keys_count : entries] = fresh
            self._keys_count = entries
        return self._keys[:entries]

    # -- size ---------------------------------------------------------------------------------
    @property
    def entries(self) -> int:
        return self._entries

    @property
    def max_entries(self) -> int:
        return self._length // self._entry_bytes

    @property
    def max_index_bytes(self) -> int:
        return self._max_index_bytes

    @property
    def size_in_bytes(self) -> int:
        """Bytes of valid entries (not the preallocated file length)."""
        return self._entries * self._entry_bytes

    @property
    def file_length(self) -> int:
        return self._length

    def resize(self, new_size_bytes: int) -> bool:
        """Set the file length (rounded down to whole entries, never below the entries in use).
        Returns whether the length changed."""
        with self._lock:
            return self._resize_locked(max(new_size_bytes, self._entries * self._entry_bytes))

    def trim_to_valid_size(self) -> None:
        """Cut the preallocated tail: the file holds exactly its entries (on roll and close)."""
        with self._lock:
            self._resize_locked(self._entries * self._entry_bytes)

    def _write_locked(self, position: int, data: bytes) -> None:
        """Store `data` at `position`: `pwrite` to the file (the read-only mapping sees it: one
        page cache), or into anonymous memory. OSError (ENOSPC, EIO) leaves the entry count
        as it was: the caller counts an entry only once it is written."""
        if self._file is None:
            assert self._mmap is not None
            self._mmap[position : position + len(data)] = data
            return
        self._dirty = True
        written = os.pwrite(self._file.fileno(), data, position)
        if written != len(data):  # a short write to a regular file: the disk is full
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(self.path))

    def flush(self) -> None:
        """fsync what was written since the last fsync (nothing to do for an untouched index)."""
        with self._lock:
            if self._file is not None and not self._file.closed and self.writable and self._dirty:
                os.fsync(self._file.fileno())
                self._dirty = False

    def close(self) -> None:
        """Trim (when writable), fsync (when written since the last fsync) and release the file
        and the mapping. Safe to call twice; a reader holding the object reopens it read-only."""
        with self._lock:
            self._close_locked()

    def _close_locked(self) -> None:
        self._closed = True
        if self._file is None or self._file.closed:
            if self._mmap is not None:
                self._mmap.close()
                self._mmap = None
            return
        if self.writable:
            self._resize_locked(self._entries * self._entry_bytes)
            if self._dirty:
                os.fsync(self._file.fileno())
                self._dirty = False
        if self._mmap is not None:
            self._mmap.close()
            self._mmap = None
        self._file.close()

    def moved_to(self, path: Path) -> None:
        """The file was renamed (`.deleted`, `.swap`, …): a reopen finds it under `path`."""
        with self._lock:
            if self.path is not None:
                self.path = path

    def __del__(self) -> None:
        # An index reopened for a reader after its segment let it go (`_reopen_if_closed_locked`)
        # belongs to no segment: its file and mapping go with the reader's last reference.
        # (No module globals here: they may be gone when this runs at interpreter exit.)
        file, mapping = getattr(self, "_file", None), getattr(self, "_mmap", None)
        if mapping is not None:
            try:  # noqa: SIM105 - contextlib may be gone
                mapping.close()
            except BufferError:  # a view still holds it: unmapped with the view
                pass
        if file is not None:
            try:  # noqa: SIM105 - contextlib may be gone
                file.close()
            except OSError:
                pass

    def _check_writable(self) -> None:
        if not self.writable:
            raise InvalidOffsetError(f"{self.name}: index is open read-only")

    def _relative(self, offset: int) -> int:
        relative = offset - self.base_offset
        if not 0 <= relative <= _INT32_MAX:
            raise OffsetOverflowError(
                f"{self.name}: offset {offset} does not fit relative to base offset {self.base_offset}"
            )
        return relative

    def _truncate_entries_locked(self, entries: int) -> None:
        """Keep the first `entries` entries; the ones cut are zeroed (the tail past them is
        zeros already: preallocated, or zeroed before)."""
        cut = self._entries
        self._entries = min(entries, cut)
        self._keys_count = min(self._keys_count, self._entries)
        if self._mmap is not None and self.writable and cut > self._entries:
            start = self._entries * self._entry_bytes
            self._write_locked(start, bytes((cut - self._entries) * self._entry_bytes))

    def truncate_to(self, offset: int) -> None:
        """Remove every entry with offset ≥ `offset` (offsets never decrease in either
        kind of index, so one binary search finds the cut)."""
        with self._lock:
            view = self._view()
            relative = offset - self.base_offset
            if relative > _INT32_MAX:
                return  # every entry is below an offset past the relative range
            keep = int(np.searchsorted(view["relative_offset"], np.int32(max(relative, -1)), side="left"))
            self._truncate_entries_locked(keep)

    def truncate(self) -> None:
        """Remove every entry."""
        with self._lock:
            self._truncate_entries_locked(0)


def close_unless_busy(indexes: Sequence[_MappedIndex]) -> bool:
    """Close all of `indexes`, or none when another thread holds the lock of one of them (a
    look-up in progress): for eviction, which never waits. Returns whether they were closed."""
    taken: list[_MappedIndex] = []
    try:
        for index in indexes:
            if not index._lock.acquire(blocking=False):
                return False
            taken.append(index)
        for index in indexes:
            index._close_locked()
        return True
    finally:
        for index in taken:
            index._lock.release()


class OffsetIndex(_MappedIndex):
    """`.index`: maps an offset to the file position of the batch that holds it."""

    DTYPE = OFFSET_INDEX_DTYPE
    KEY_FIELD = "relative_offset"
    KEY_DTYPE = np.int32

    @property
    def is_full(self) -> bool:
        return self._entries >= self.max_entries

    def entry(self, n: int) -> OffsetPosition:
        """The n-th entry; raises IndexError outside 0..entries-1."""
        with self._lock:
            self._reopen_if_closed_locked()
            if not 0 <= n < self._entries:
                raise IndexError(f"{self.name}: entry {n} of an index holding {self._entries}")
            relative, position = self._view()[n].item()
            return OffsetPosition(self.base_offset + relative, position)

    @property
    def last_offset(self) -> int:
        """Offset of the last entry; the base offset when empty."""
        return self.last_entry().offset

    def last_entry(self) -> OffsetPosition:
        with self._lock:
            self._reopen_if_closed_locked()
            if self._entries == 0:
                return OffsetPosition(self.base_offset, 0)
            relative, position = self._view()[-1].item()
            return OffsetPosition(self.base_offset + relative, position)

    def lookup(self, target_offset: int) -> OffsetPosition:
        """The entry with the largest offset ≤ target; below the first entry (or empty) →
        (base offset, 0), the start of the segment."""
        relative = target_offset - self.base_offset
        if relative < 0:
            return OffsetPosition(self.base_offset, 0)
        relative = min(relative, _INT32_MAX)
        with self._lock:
            self._reopen_if_closed_locked()
            slot = int(np.searchsorted(self._keys_locked(), np.int32(relative), side="right")) - 1
            if slot < 0:
                return OffsetPosition(self.base_offset, 0)
            assert self._mmap is not None
            found, position = _OFFSET_ENTRY.unpack_from(self._mmap, slot * 8)
            return OffsetPosition(self.base_offset + found, position)

    def lookup_many(self, target_offsets: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
        """Vectorised lookup: the position for each target (0 below the first entry)."""
        relative = np.clip(target_offsets - self.base_offset, -1, _INT32_MAX).astype(np.int32)
        with self._lock:
            self._reopen_if_closed_locked()
            view = self._view()
            slots = np.searchsorted(self._keys_locked(), relative, side="right") - 1
            positions = np.zeros(len(relative), dtype=np.int64)
            hit = slots >= 0
            positions[hit] = view["position"][slots[hit]]
            return positions

    def append(self, offset: int, position: int) -> None:
        """Add (offset, position). Raises IndexFullError when full, InvalidOffsetError unless the
        offset is above the last entry's."""
        self._check_writable()
        relative = self._relative(offset)
        with self._lock:
            if self._entries >= self._length // self._entry_bytes:
                raise IndexFullError(f"{self.name}: index is full ({self._entries} entries)")
            if self._entries > 0:
                last = int(self._view()[-1]["relative_offset"])
                if relative <= last:
                    raise InvalidOffsetError(
                        f"{self.name}: offset {offset} is not above the last indexed offset {self.base_offset + last}"
                    )
            start = self._entries * self._entry_bytes
            self._write_locked(start, relative.to_bytes(4, "big") + position.to_bytes(4, "big", signed=True))
            self._entries += 1

    def sanity_check(self, log_size_bytes: int | None = None) -> None:
        """Raise CorruptIndexError unless the file length is a multiple of 8, offsets strictly
        increase from ≥ the base, positions never decrease and (when given) stay inside the log."""
        with self._lock:
            if self._length % self._entry_bytes:
                raise CorruptIndexError(self.name, f"{self._length} bytes is not a multiple of {self._entry_bytes}")
            view = self._view()
            offsets = view["relative_offset"].astype(np.int64)
            positions = view["position"].astype(np.int64)
            del view  # no view of the mapping may outlive this call (an error's traceback would keep it)
            if len(offsets) == 0:
                return
            if offsets[0] < 0:
                raise CorruptIndexError(self.name, f"first entry's relative offset {offsets[0]} is negative")
            if len(offsets) > 1 and (np.any(np.diff(offsets) <= 0) or np.any(np.diff(positions) < 0)):
                raise CorruptIndexError(self.name, "entries are out of order")
            if positions[0] < 0 or (log_size_bytes is not None and positions[-1] >= max(log_size_bytes, 1)):
                raise CorruptIndexError(self.name, f"position {positions[-1]} lies outside the log")


class TimeIndex(_MappedIndex):
    """`.timeindex`: maps a timestamp to the offset from which records reach it."""

    DTYPE = TIME_INDEX_DTYPE
    KEY_FIELD = "timestamp"
    KEY_DTYPE = np.int64

    @property
    def is_full(self) -> bool:
        # One slot stays free for the entry that closing the segment adds (Kafka does the same).
        return self._entries >= self.max_entries - 1

    def entry(self, n: int) -> TimestampOffset:
        with self._lock:
            self._reopen_if_closed_locked()
            if not 0 <= n < self._entries:
                raise IndexError(f"{self.name}: entry {n} of an index holding {self._entries}")
            timestamp, relative = self._view()[n].item()
            return TimestampOffset(timestamp, self.base_offset + relative)

    def last_entry(self) -> TimestampOffset:
        """The last entry; (-1, base offset) when empty."""
        with self._lock:
            self._reopen_if_closed_locked()
            if self._entries == 0:
                return TimestampOffset(NO_TIMESTAMP, self.base_offset)
            timestamp, relative = self._view()[-1].item()
            return TimestampOffset(timestamp, self.base_offset + relative)

    def lookup(self, target_timestamp: int) -> TimestampOffset:
        """The entry with the largest timestamp ≤ target; below the first entry (or empty) →
        (-1, base offset)."""
        with self._lock:
            self._reopen_if_closed_locked()
            slot = int(np.searchsorted(self._keys_locked(), np.int64(target_timestamp), side="right")) - 1
            if slot < 0:
                return TimestampOffset(NO_TIMESTAMP, self.base_offset)
            assert self._mmap is not None
            timestamp, relative = _TIME_ENTRY.unpack_from(self._mmap, slot * 12)
            return TimestampOffset(timestamp, self.base_offset + relative)

    def maybe_append(self, timestamp: int, offset: int, *, skip_full_check: bool = False) -> None:
        """Add (timestamp, offset) if the timestamp is above the last entry's (Kafka's rule).

        Raises IndexFullError when full (unless skip_full_check, used for the closing entry) and
        InvalidOffsetError when the offset or timestamp would go backwards."""
        self._check_writable()
        relative = self._relative(offset)
        with self._lock:
            last_timestamp, last_relative = NO_TIMESTAMP, 0
            if self._entries > 0:
                last_timestamp, last_relative = self._view()[-1].item()
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
            start = self._entries * self._entry_bytes
            self._write_locked(start, timestamp.to_bytes(8, "big", signed=True) + relative.to_bytes(4, "big"))
            self._entries += 1

    def sanity_check(self) -> None:
        """Raise CorruptIndexError unless the length is a multiple of 12, timestamps strictly
        increase and offsets never decrease from ≥ the base."""
        with self._lock:
            if self._length % self._entry_bytes:
                raise CorruptIndexError(self.name, f"{self._length} bytes is not a multiple of {self._entry_bytes}")
            view = self._view()
            timestamps = view["timestamp"].astype(np.int64)
            offsets = view["relative_offset"].astype(np.int64)
            del view
            if len(offsets) == 0:
                return
            if offsets[0] < 0:
                raise CorruptIndexError(self.name, f"first entry's relative offset {offsets[0]} is negative")
            if len(offsets) > 1 and (np.any(np.diff(timestamps) <= 0) or np.any(np.diff(offsets) < 0)):
                raise CorruptIndexError(self.name, "entries are out of order")
