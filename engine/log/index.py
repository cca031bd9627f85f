"""What Kafka's sparse segment indexes share (its `AbstractIndex`): `.index` (offset → position,
`engine.log.offset_index`) and `.timeindex` (time → offset, `engine.log.time_index`).

Both are arrays of fixed-size big-endian entries, read with `pread` and written with `pwrite`
(never through a mapping: a store into a preallocated, sparse page that the file system cannot
back — a full disk — kills the process with SIGBUS, and so does a read of a mapped page that
another process's trim cut off):

    .index       OFFSET_INDEX_DTYPE  8 bytes:  relative_offset int32 | position int32
    .timeindex   TIME_INDEX_DTYPE   12 bytes:  timestamp int64      | relative_offset int32

`relative_offset` is the absolute offset minus the segment's base offset. Invariants: offsets
strictly increase in `.index`; in `.timeindex` timestamps strictly increase and offsets never
decrease. An entry is written when more than `index.interval.bytes` were appended since the last
one (the segment decides; see `engine.log.segment`).

While a segment is active its index files are preallocated to `segment.index.bytes` rounded down
to the entry size, the tail zero-filled; `trim_to_valid_size` cuts them to the entries in use on
roll and on close. After a crash the file may therefore be longer than its entries: the entry
count is only trusted after a clean shutdown, and the loader rebuilds the indexes of every
segment from the recovery point on.

The files are not trusted (another program, or a user, may have written them): nothing is read
or allocated by a file's length before `sanity_check` has held it against what an index of its
segment can be, and no look-up reads more than one block of entries. `sanity_check` refuses, in
this order and before reading anything past what it needs:

* a length that is not a multiple of the entry size (Kafka's check);
* a length above `max_index_bytes` (`segment.index.bytes`, the broker's
  `log.index.size.max.bytes`) plus the entries the segment's log can hold (one per message set,
  each at least `MIN_ENTRY_BYTES`): a preallocated index is never longer, nor is one that
  recovery grew past its maximum for a log written with a larger one;
* entries out of order, or a relative offset below zero (Kafka's last offset below the base
  offset), or a position at or past the end of the log.

It reads the entries once, a chunk at a time, and stops at the first fault: a sparse file's hole
reads as zero entries, which are out of order from the second on, so the time to refuse a file
does not grow with its holes. A writable index must hold its whole length in entries (a clean
shutdown trimmed it); a read-only one may be another process's active index, preallocated: its
entries end at the zero tail, and the ones that point past the log as this reader sized it are
not counted (the writer appended them later). The caller decides what a refusal means (Kafka's
LogLoader: a writable segment is recovered, its indexes rebuilt from the log; a read-only reader
builds them in memory and leaves the file alone).

Look-ups are binary searches in two steps: over the first key of each block of
`BLOCK_ENTRIES` entries (the fences, kept in memory, a 128th of the index), then within the one
block read. An index holds no more than its fences and its last entry in memory, whatever its
size; an index with no file (`path=None`: what a read-only reader builds for a segment whose
index file is missing or damaged) keeps its entries in anonymous memory, sized by its log.

Look-ups, appends and resizes are thread-safe: each index guards its file and its fences with a
lock, since a reader may look up while the writer appends, trims or closes. An index is closed
when its segment gives back its files (a roll, a release, or an eviction by `engine.log.handles`); a
reader that still holds the object reopens it read-only on its next look-up. `fsync` runs only
for an index written (or resized) since its last one: closing an untouched index costs no disk
flush.
"""

from __future__ import annotations

import errno
import logging
import mmap
import os
import struct
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import ClassVar

import numpy as np
import numpy.typing as npt

from seglogfs.engine.errors import CorruptIndexError, InvalidOffsetError, OffsetOverflowError
from seglogfs.engine.files import open_regular
from seglogfs.engine.record.legacy import MIN_ENTRY_BYTES

log = logging.getLogger(__name__)

INT32_MAX = 2**31 - 1
INT32 = struct.Struct(">i")
INT64 = struct.Struct(">q")
# A searched field: where it lies in an entry, and how it is read.
FieldAt = dict[str, tuple[int, Callable[[bytes, int], tuple[int, ...]]]]
# Entries per block of a look-up: one read of 1 KiB (offset index) or 1.5 KiB (time index), and a
# fence each in memory.
BLOCK_ENTRIES = 128
# Entries read at a time by a scan (a whole number of blocks): 512 KiB or 768 KiB.
_SCAN_ENTRIES = 512 * BLOCK_ENTRIES
# Bytes of zeros written at a time where entries are cut.
_ZEROS = bytes(1 << 20)


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


def read_index_prefix(fd: int, dtype: np.dtype, limit_bytes: int) -> npt.NDArray[np.void]:
    """The entries of an index file up to and including the first slot after the first whose
    relative offset is 0 (where a preallocated zero tail, or a hole, begins: `entries_in_use`
    drops it, a check of a trimmed index reports it), reading at most `limit_bytes`, a chunk at a
    time: what a dump or a check reads, in memory proportional to the entries before the zeros,
    whatever the file's length and holes."""
    entry_bytes = dtype.itemsize
    limit = limit_bytes - limit_bytes % entry_bytes
    chunks: list[bytes] = []
    read = 0
    while read < limit:
        chunk = os.pread(fd, min(_SCAN_ENTRIES * entry_bytes, limit - read), read)
        chunk = chunk[: len(chunk) - len(chunk) % entry_bytes]
        if not chunk:
            break
        relative = np.frombuffer(chunk, dtype=dtype)["relative_offset"]
        skip = 1 if read == 0 else 0
        zeros = np.flatnonzero(relative[skip:] == 0)
        if len(zeros):
            chunks.append(chunk[: (zeros[0] + skip + 1) * entry_bytes])
            break
        chunks.append(chunk)
        read += len(chunk)
    return np.frombuffer(b"".join(chunks), dtype=dtype)


def native(values: npt.NDArray[np.integer]) -> npt.NDArray[np.integer]:
    """Big-endian values as a native, contiguous array: `np.searchsorted` on a big-endian
    field would convert the whole array on every call."""
    return values.astype(values.dtype.newbyteorder("="))


def round_down_to_entries(size_bytes: int, entry_bytes: int) -> int:
    return size_bytes - size_bytes % entry_bytes


def max_index_file_bytes(max_index_bytes: int, log_size_bytes: int, entry_bytes: int) -> int:
    """The longest index file a segment whose log holds `log_size_bytes` can have: preallocated
    to `max_index_bytes`, plus an entry for each message set the log can hold (recovery grows an
    index past its maximum when the log was written with a larger one), plus the time index's
    closing entry."""
    return round_down_to_entries(max_index_bytes, entry_bytes) + (log_size_bytes // MIN_ENTRY_BYTES + 1) * entry_bytes


class AbstractIndex:
    """What both index kinds share: the file (or anonymous memory), the entry count, the
    fences of the blocks and the last entry. See the module docstring."""

    DTYPE: ClassVar[np.dtype]
    KEY_FIELD: ClassVar[str]
    # The fields searched: the key, and the relative offset a cut searches (the same for `.index`).
    FENCE_FIELDS: ClassVar[tuple[str, ...]]
    # Where each searched field lies in an entry, and how it is read.
    FIELD_AT: ClassVar[FieldAt]
    ENTRY: ClassVar[struct.Struct]

    def __init__(self, path: Path | None, base_offset: int, max_index_bytes: int, *, writable: bool) -> None:
        """Open (or, when writable, create) the index at `path`; nothing is read.

        An existing file's entry count is its length over the entry size (trusting a clean
        shutdown's trim) until `sanity_check` has read it; a new one is preallocated to
        `max_index_bytes`. `path=None` makes an index in anonymous memory: what a read-only
        reader builds for a segment whose index file is missing or damaged, since it may not
        write one. A file that is not a regular one (a link, a FIFO) is `UnsafeFileError`."""
        self.path = path
        self.base_offset = base_offset
        self.writable = writable or path is None
        self._lock = threading.Lock()
        self._entry_bytes = self.DTYPE.itemsize
        self._max_index_bytes = max(round_down_to_entries(max_index_bytes, self._entry_bytes), self._entry_bytes)
        self._fd: int | None = None
        self._memory: mmap.mmap | None = None
        self._length = 0
        self._entries = 0
        # For each searched field, its value in entry i·BLOCK_ENTRIES of each block in use.
        self._fences = self._no_fences()
        self._last: tuple[int, int] | None = None  # the last entry in use, as stored
        # Whether the fences and the last entry describe the entries (a scan built them).
        self._scanned = path is None
        self._closed = False
        # Written or resized through this object since its last fsync (only a file's index).
        self._dirty = False
        # How long the file may be before a scan reads it (what `sanity_check` last allowed).
        self._length_bound = self._max_index_bytes
        newly_created = path is None
        if path is not None:
            if writable:
                try:
                    self._fd = open_regular(path, os.O_RDWR)
                except FileNotFoundError:
                    self._fd = open_regular(path, os.O_RDWR | os.O_CREAT | os.O_EXCL)
                    newly_created = True
            else:
                self._fd = open_regular(path, os.O_RDONLY)
            self._length = os.fstat(self._fd).st_size
            self._entries = self._length // self._entry_bytes
        if newly_created:
            # Only a new index is preallocated; an existing one keeps its length until its
            # segment becomes the active one (`resize`), as Kafka does.
            self._scanned = True
            self._resize_locked(self._max_index_bytes)

    @property
    def name(self) -> str:
        return str(self.path) if self.path is not None else f"<in-memory index of segment {self.base_offset}>"

    # -- reading ------------------------------------------------------------------------------
    def _read_locked(self, first: int, stop: int) -> npt.NDArray[np.void]:
        """Entries first..stop-1 as stored (fewer if the file is shorter now: another process
        trimmed it). Caller holds the lock."""
        start, end = first * self._entry_bytes, stop * self._entry_bytes
        if end <= start:
            return np.empty(0, dtype=self.DTYPE)
        if self._memory is not None:
            data: bytes = self._memory[start:end]
        elif self._fd is not None:
            data = os.pread(self._fd, end - start, start)
        else:
            data = b""
        return np.frombuffer(data[: len(data) - len(data) % self._entry_bytes], dtype=self.DTYPE)

    def _entry_locked(self, n: int) -> tuple[int, int]:
        entry = self._read_locked(n, n + 1)
        if not len(entry):
            raise IndexError(f"{self.name}: entry {n} is past the end of the file")
        first, second = entry[0].item()
        return int(first), int(second)

    def _scan_locked(self, *, check: bool, log_size_bytes: int | None) -> None:
        """Read the entries once, a chunk at a time: the fences and the last entry, and with
        `check` the invariants (CorruptIndexError at the first fault, the file left as it is).
        Read-only, the entries end at the zero tail and before the first that points at or
        past `log_size_bytes` (see the module docstring)."""
        self._scanned = False
        fences: dict[str, list[npt.NDArray[np.integer]]] = {field: [] for field in self.FENCE_FIELDS}
        count, done = self._entries, 0
        previous: tuple[int, int] | None = None
        while done < count:
            chunk = self._read_locked(done, min(count, done + _SCAN_ENTRIES))
            if not self.writable:
                relative = chunk["relative_offset"]
                skip = 1 if done == 0 else 0
                zeros = np.flatnonzero(relative[skip:] == 0)
                if len(zeros):
                    cut = int(zeros[0]) + skip
                    if done == 0 and cut == 1 and not chunk[:1].tobytes().strip(b"\0"):
                        cut = 0  # a preallocated file with no entry yet
                    chunk, count = chunk[:cut], done + cut
                if log_size_bytes is not None and self.KEY_FIELD == "relative_offset":
                    # (the offset index only: a time index's entries hold no position)
                    beyond = np.flatnonzero(chunk["position"] >= max(log_size_bytes, 1))
                    if len(beyond):
                        chunk, count = chunk[: beyond[0]], done + int(beyond[0])
            if not len(chunk):
                count = done
                break
            if check:
                self._check_chunk(chunk, previous, done, log_size_bytes)
            for field, found in fences.items():
                found.append(native(chunk[field][::BLOCK_ENTRIES]))
            first, second = chunk[-1].item()
            previous = (int(first), int(second))
            done += len(chunk)
        self._entries = count
        self._fences = self._no_fences()
        if previous is not None:
            self._fences = {field: np.concatenate(found) for field, found in fences.items()}
        self._last = previous
        self._scanned = True

    def _no_fences(self) -> dict[str, npt.NDArray[np.integer]]:
        return {field: native(np.empty(0, dtype=self.DTYPE[field])) for field in self.FENCE_FIELDS}

    def sanity_check(self, log_size_bytes: int | None = None) -> None:
        """Raise CorruptIndexError unless the file's length is a whole number of entries and
        within what an index of a log of `log_size_bytes` can be, and its entries keep the order
        of their kind (`_check_chunk`; an offset index's positions inside the log when its size
        is given). Reads the entries once, a chunk at a time, up to the first fault (see the
        module docstring)."""
        with self._lock:
            self._reopen_if_closed_locked()
            _check_length(self, log_size_bytes)
            self._scan_locked(check=True, log_size_bytes=log_size_bytes)

    def _check_chunk(
        self, chunk: npt.NDArray[np.void], previous: tuple[int, int] | None, first: int, log_size_bytes: int | None
    ) -> None:
        raise NotImplementedError

    def _corrupt(self, slot: int, entry: npt.NDArray[np.void] | np.void, reason: str) -> CorruptIndexError:
        return CorruptIndexError(
            self.name, f"entry {tuple(entry.item())} at position {slot * self._entry_bytes} {reason}"
        )

    def _ensure_scanned_locked(self) -> None:
        """The fences, built without checking when no `sanity_check` did (an index used as it
        is, or reopened); a file longer than allowed counts no entries."""
        self._reopen_if_closed_locked()
        if not self._scanned:
            if self._length > self._length_bound:
                self._entries = 0
            self._scan_locked(check=False, log_size_bytes=None)

    def _stored_entry(self, n: int) -> tuple[int, int]:
        """The n-th entry as stored; IndexError outside 0..entries-1."""
        with self._lock:
            self._ensure_scanned_locked()
            if not 0 <= n < self._entries:
                raise IndexError(f"{self.name}: entry {n} of an index holding {self._entries}")
            return self._entry_locked(n)

    def _stored_last(self) -> tuple[int, int] | None:
        """The last entry as stored; None when there is none."""
        with self._lock:
            self._ensure_scanned_locked()
            return self._last

    def _slot_locked(self, field: str, key: np.integer, right: bool) -> tuple[int, bytes, int]:
        """(n, block, first): n is the number of entries whose `field` (one of FENCE_FIELDS,
        never decreasing) is below `key` (or at or below it, `right`); block holds the entries
        (as stored) of the block searched, from entry `first`. A search of the fences, one read
        of a block and a binary search in it."""
        self._ensure_scanned_locked()
        count = self._entries
        if count == 0:
            return 0, b"", 0
        side = "right" if right else "left"
        fences = self._fences[field][: (count + BLOCK_ENTRIES - 1) // BLOCK_ENTRIES]
        block = int(fences.searchsorted(key, side)) - 1  # type: ignore[call-overload]
        if block < 0:
            return 0, b"", 0
        first = block * BLOCK_ENTRIES
        entry_bytes = self._entry_bytes
        stop = min(count, first + BLOCK_ENTRIES)
        if self._memory is not None:
            data: bytes = self._memory[first * entry_bytes : stop * entry_bytes]
        else:
            assert self._fd is not None
            data = os.pread(self._fd, (stop - first) * entry_bytes, first * entry_bytes)
        at, unpack = self.FIELD_AT[field]
        lo, hi, target = 0, len(data) // entry_bytes, int(key)
        while lo < hi:
            middle = (lo + hi) // 2
            value = unpack(data, middle * entry_bytes + at)[0]
            if value < target or (right and value == target):
                lo = middle + 1
            else:
                hi = middle
        return first + lo, data, first

    def _floor_locked(self, key: np.integer) -> tuple[int, int] | None:
        """The last entry whose key is at or below `key`, or None."""
        n, block, first = self._slot_locked(self.KEY_FIELD, key, right=True)
        if n == 0:
            return None
        a, b = self.ENTRY.unpack_from(block, (n - 1 - first) * self._entry_bytes)
        return a, b

    def _reopen_if_closed_locked(self) -> None:
        """A reader may still hold an index its segment closed (a roll closes sealed indexes):
        it reopens, read-only, at the file's trimmed length, so look-ups stay right. A file
        that fails the checks now is not used: look-ups start from the segment's start."""
        if not self._closed or self.path is None:
            return
        self._closed = False
        self.writable = False
        self._dirty = False
        self._fd = open_regular(self.path, os.O_RDONLY)
        self._length = os.fstat(self._fd).st_size
        self._entries = self._length // self._entry_bytes
        try:
            if self._length % self._entry_bytes or self._length > self._length_bound:
                raise CorruptIndexError(self.name, f"{self._length} bytes is not what an index of this segment can be")
            self._scan_locked(check=True, log_size_bytes=None)
        except CorruptIndexError as error:
            log.warning("%s; not used (looked up from the segment's start instead)", error)
            self._entries = 0
            self._scan_locked(check=False, log_size_bytes=None)

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

    def reset(self) -> None:
        """Remove every entry and give the file its preallocated length of zeros (Kafka's
        reset, before recovery rebuilds the index): whatever the file held, nothing of it is
        read or rewritten."""
        with self._lock:
            self._entries = 0
            self._fences = self._no_fences()
            self._last = None
            self._scanned = True
            self._resize_locked(0)
            self._resize_locked(self._max_index_bytes)

    def _resize_locked(self, new_length: int) -> bool:
        new_length = round_down_to_entries(new_length, self._entry_bytes)
        if new_length == self._length and (self._fd is not None or self._memory is not None or new_length == 0):
            return False
        if new_length // self._entry_bytes < self._entries:
            self._set_entries_locked(new_length // self._entry_bytes)
        if self.path is None:
            # Anonymous memory: a new mapping with the entries in use copied over.
            fresh = mmap.mmap(-1, new_length) if new_length else None
            if self._memory is not None:
                if fresh is not None:
                    used = self._entries * self._entry_bytes
                    fresh[:used] = self._memory[:used]
                self._memory.close()
            self._memory = fresh
            self._length = new_length
            return True
        assert self._fd is not None
        os.ftruncate(self._fd, new_length)
        self._dirty = True
        self._length = new_length
        self._length_bound = max(self._length_bound, new_length)
        return True

    def _set_entries_locked(self, entries: int) -> None:
        """Count the first `entries` entries only (no more than counted now): the fences and
        the last entry follow."""
        self._entries = min(entries, self._entries)
        blocks = (self._entries + BLOCK_ENTRIES - 1) // BLOCK_ENTRIES
        self._fences = {field: found[:blocks] for field, found in self._fences.items()}
        self._last = self._entry_locked(self._entries - 1) if self._entries else None

    def _write_locked(self, position: int, data: bytes | memoryview) -> None:
        """Store `data` at `position`: `pwrite` to the file, or into anonymous memory. OSError
        (ENOSPC, EIO) leaves the entry count as it was: the caller counts an entry only once it
        is written."""
        if self._memory is not None:
            self._memory[position : position + len(data)] = data
            return
        assert self._fd is not None
        self._dirty = True
        written = os.pwrite(self._fd, data, position)
        if written != len(data):  # a short write to a regular file: the disk is full
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(self.path))

    def _append_locked(self, data: bytes, entry: tuple[int, int]) -> None:
        """Write the next entry (`data`: `entry` as stored) and count it, with its block's
        fences when it starts one."""
        self._write_locked(self._entries * self._entry_bytes, data)
        if self._entries % BLOCK_ENTRIES == 0:
            stored = np.frombuffer(data, dtype=self.DTYPE)
            self._fences = {
                field: np.concatenate((found, native(stored[field]))) for field, found in self._fences.items()
            }
        self._entries += 1
        self._last = entry

    def flush(self) -> None:
        """fsync what was written since the last fsync (nothing to do for an untouched index)."""
        with self._lock:
            if self._fd is not None and self.writable and self._dirty:
                os.fsync(self._fd)
                self._dirty = False

    def close(self) -> None:
        """Trim (when writable), fsync (when written since the last fsync) and release the file.
        Safe to call twice; a reader holding the object reopens it read-only."""
        with self._lock:
            self._close_locked()

    def _close_locked(self) -> None:
        self._closed = True
        if self._fd is None:
            if self._memory is not None:
                self._memory.close()
                self._memory = None
            return
        if self.writable:
            self._resize_locked(self._entries * self._entry_bytes)
            if self._dirty:
                os.fsync(self._fd)
                self._dirty = False
        os.close(self._fd)
        self._fd = None

    def moved_to(self, path: Path) -> None:
        """The file was renamed (`.deleted`, `.swap`, …): a reopen finds it under `path`."""
        with self._lock:
            if self.path is not None:
                self.path = path

    def __del__(self, _close: Callable[[int], None] = os.close) -> None:
        # An index reopened for a reader after its segment let it go (`_reopen_if_closed_locked`)
        # belongs to no segment: its file goes with the reader's last reference.
        # (No module globals here: they may be gone when this runs at interpreter exit; `os.close`
        # is bound as a default.)
        fd, memory = getattr(self, "_fd", None), getattr(self, "_memory", None)
        if memory is not None:
            memory.close()
        if fd is not None:
            try:  # noqa: SIM105 - contextlib may be gone
                _close(fd)
            except OSError:
                pass

    def _check_writable(self) -> None:
        if not self.writable:
            raise InvalidOffsetError(f"{self.name}: index is open read-only")

    def _relative(self, offset: int) -> int:
        relative = offset - self.base_offset
        if not 0 <= relative <= INT32_MAX:
            raise OffsetOverflowError(
                f"{self.name}: offset {offset} does not fit relative to base offset {self.base_offset}"
            )
        return relative

    def _truncate_entries_locked(self, entries: int) -> None:
        """Keep the first `entries` entries; the ones cut are zeroed (the tail past them is
        zeros already: preallocated, or zeroed before), a MiB at a time."""
        cut = self._entries
        self._set_entries_locked(entries)
        if self.writable and cut > self._entries:
            start, end = self._entries * self._entry_bytes, cut * self._entry_bytes
            while start < end:
                zeros = memoryview(_ZEROS)[: min(len(_ZEROS), end - start)]
                self._write_locked(start, zeros)
                start += len(zeros)

    def truncate_to(self, offset: int) -> None:
        """Remove every entry with offset ≥ `offset` (offsets never decrease in either
        kind of index, so one binary search finds the cut)."""
        with self._lock:
            relative = offset - self.base_offset
            if relative > INT32_MAX:
                return  # every entry is below an offset past the relative range
            keep, _, _ = self._slot_locked("relative_offset", np.int32(max(relative, -1)), right=False)
            self._truncate_entries_locked(keep)

    def truncate(self) -> None:
        """Remove every entry."""
        with self._lock:
            self._ensure_scanned_locked()
            self._truncate_entries_locked(0)


def close_unless_busy(indexes: Sequence[AbstractIndex]) -> bool:
    """Close all of `indexes`, or none when another thread holds the lock of one of them (a
    look-up in progress): for eviction, which never waits. Returns whether they were closed."""
    taken: list[AbstractIndex] = []
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


def _check_length(index: AbstractIndex, log_size_bytes: int | None) -> None:
    """Kafka's length check (a whole number of entries), and the length an index of its
    segment can have (see `max_index_file_bytes`); the caller holds the lock. Nothing is read."""
    length, entry_bytes = index._length, index._entry_bytes
    if length % entry_bytes:
        raise CorruptIndexError(index.name, f"{length} bytes is not a multiple of {entry_bytes}")
    bound = index._max_index_bytes
    if log_size_bytes is not None:
        bound = max_index_file_bytes(index._max_index_bytes, log_size_bytes, entry_bytes)
    index._length_bound = bound
    if length > bound:
        index._entries = 0
        index._scanned = False
        raise CorruptIndexError(
            index.name,
            f"{length} bytes is more than an index of this segment can hold ({bound} bytes: "
            f"segment.index.bytes {index._max_index_bytes}"
            + (f" and a log of {log_size_bytes} bytes)" if log_size_bytes is not None else ")"),
        )
