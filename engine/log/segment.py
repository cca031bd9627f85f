"""One log segment: a `.log` file of record batches and its two sparse indexes (and its
`.txnindex` when a transaction aborted in it: engine.log.transaction_index).

The `.log` file is a plain sequence of v2 batches (see `engine.record.records`), the base offset in the
file name; a segment a broker wrote before Kafka 0.11 holds legacy messages (magic 0 or 1, see
`engine.record.legacy`) instead, or first, which read as batches of their own (`LegacyBatchHeader`) and
may be shorter than a v2 header. Appends are v2, after whatever the segment holds. The segment
appends whole batches and keeps Kafka's index rules:

* an offset-index entry (batch last offset, batch start position) and a time-index entry
  (max timestamp so far, the last offset of the first batch that reached it: Kafka's
  `shallowOffsetOfMaxTimestamp`, what Kafka's brokers write and `kafka-dump-log
  --verify-index-only` expects) are added for a batch when more than `index.interval.bytes` were
  appended since the last entry — so the first batch of a segment is never indexed;
* a time-index entry is only added when its timestamp is above the last one;
* when the segment stops being active (roll, close) a last time-index entry (segment max
  timestamp, its offset) is added and both indexes are trimmed to their entries.

The `.txnindex` is written by the partition (`transaction_index`), cut with the segment
(`truncate_to`), fsynced with it (`flush`, a release), renamed and deleted with it.

Crash behaviour: `append` writes the batches it is given (one per call from the log, about a
megabyte of them from the cleaner) with `os.pwrite` at the end of the file, calling it again until
every byte is written, so one append may take several writes; when a write or the index update
fails, the file and the indexes are cut back to where they were. Batches become durable on
`flush`; after a crash the tail of the active segment may be torn and its preallocated indexes
hold stale entries. `recover` re-reads every batch, checks it, rebuilds both indexes and
truncates the log at the first invalid batch.

Thread safety: one writer at a time. For the segments in a partition's log that is the holder of
the partition's lock (appends, rolls, flushes, truncation, retention and the cleaner's swap take
it: see engine.log.log); a `.cleaned` segment is written by the cleaner alone, without that lock,
until it is swapped in. Readers may call the read methods concurrently with appends: they read
with `os.pread` up to a size they were given or read once.

Open files: a segment opens its `.log` and its indexes on first use and gives them back when the
process holds too many (`engine.log.handles`: a process-wide LRU with a budget derived from the
descriptor limit), or when it is released or closed; they reopen on next use. Every method that
uses the `.log` descriptor holds a *lease* for as long as it does (an iterator: until it is
exhausted or closed): a leased segment is never evicted, and `release_handles`, `close_handlers`
and `delete_files` on a leased segment only mark it, the files closing when the last lease ends.
So a descriptor is never closed under a `pread` (EBADF, or a read of whatever file reused the
number). Never evicted either, pinned: the active segment, and a new one still being written (a
`.cleaned` segment, until sealed). A segment marked deleted is not pinned (a retention pass may
remove thousands at once): evicted, it reopens its files under their `.deleted` names until
`delete_files`. A reopen checks it found the file it had open, or renamed (device and inode): a
`.deleted` name that the delete of a later segment of the same base has since taken is ESTALE,
not that segment's bytes.

Locks, in order: `_index_lock` (an RLock: opening, checking and recovering the indexes, closing
them, renaming the files) → `_handle_lock` (the descriptor, the lease count, the pending
release) → the cache's lock (`engine.log.handles`) and each index's own lock. Eviction only ever
try-acquires a segment's locks, and skips the segment when one is taken.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import mmap
import os
import queue
import threading
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import numpy as np

from seglogfs.engine import _core
from seglogfs.engine.errors import CorruptIndexError, CorruptRecordError, OffsetOverflowError, UnsupportedFormatError
from seglogfs.engine.files import check_regular, open_regular, write_all
from seglogfs.engine.log.handles import OPEN_SEGMENTS, opening
from seglogfs.engine.log.index import NO_TIMESTAMP, OffsetIndex, TimeIndex, TimestampOffset, close_unless_busy
from seglogfs.engine.log.naming import (
    DELETED_SUFFIX,
    TXN_INDEX_SUFFIX,
    filename_prefix_from_offset,
    log_file,
    offset_index_file,
    time_index_file,
)
from seglogfs.engine.log.transaction_index import TransactionIndex
from seglogfs.engine.record.columns import record_columns
from seglogfs.engine.record.legacy import MIN_ENTRY_BYTES, message_overhead
from seglogfs.engine.record.records import (
    BATCH_OVERHEAD_BYTES,
    CURRENT_MAGIC,
    LOG_OVERHEAD_BYTES,
    MAGIC_OFFSET,
    BatchHeader,
    LegacyBatchHeader,
    check_batch,
    is_legacy_message,
    plausible_record_count,
)

log = logging.getLogger(__name__)

T = TypeVar("T")
# Given what recovery is about to cut: (the .log's path, its descriptor, the cut position, the
# size, the offset the log ends at after the cut). See engine.log.set_aside.
KeepTail = Callable[[Path, int, int, int, int], object]

_READ_CHUNK_BYTES = 4 * 1024 * 1024
# iter_headers: after two batches of at most _SMALL_BATCH_BYTES in a row it reads a window of
# the headers that follow, from _FIRST_WINDOW_BYTES up to _HEADER_WINDOW_BYTES; else a header.
_FIRST_WINDOW_BYTES = 4 * 1024
_HEADER_WINDOW_BYTES = 64 * 1024
_SMALL_BATCH_BYTES = 8 * 1024
_MIN_BATCH_LENGTH = BATCH_OVERHEAD_BYTES - LOG_OVERHEAD_BYTES
_INT32_MAX = 2**31 - 1
# An append of at least this many bytes has its blocks allocated first where that makes the
# write faster (_core.allocate_ahead; ext4: the gain passes the call's cost at about 96 KiB).
_ALLOCATE_AHEAD_BYTES = 128 * 1024


def _impossible_length(header: BatchHeader) -> bool:
    """A length field no batch (or legacy message) of this magic can have: the end of what a
    scan can read (a torn tail, preallocated zeros)."""
    if header.magic == CURRENT_MAGIC:
        return header.batch_length < _MIN_BATCH_LENGTH
    return header.magic not in (0, 1) or header.batch_length < message_overhead(header.magic)


def _header_fits(view: memoryview | bytes, offset: int) -> bool:
    """Whether `view` holds enough bytes at `offset` to parse the header there: 61 for a batch,
    26 for a legacy message (which may be shorter than a batch header)."""
    left = len(view) - offset
    if left >= BATCH_OVERHEAD_BYTES:
        return True
    return left >= MIN_ENTRY_BYTES and view[offset + MAGIC_OFFSET] < CURRENT_MAGIC


@dataclass(frozen=True, slots=True)
class FetchSlice:
    """Bytes read from a segment: whole batches from `position`, possibly ending in a partial
    one when the read was bounded by size (as Kafka's FileRecords slices are)."""

    segment_base_offset: int
    position: int
    data: bytes


@dataclass(frozen=True, slots=True)
class TimestampAndOffset:
    """The answer to an offset-for-timestamp look-up: the first record at or after a time."""

    timestamp: int
    offset: int
    leader_epoch: int | None


class LogSegment:
    """A segment's files and its in-memory bookkeeping. See the module docstring."""

    def __init__(
        self,
        directory: Path,
        base_offset: int,
        *,
        index_interval_bytes: int,
        max_index_bytes: int,
        writable: bool,
        created_ms: int,
        roll_jitter_ms: int = 0,
        file_suffix: str = "",
    ) -> None:
        """Open or (when writable) create the segment with this base offset in `directory`.
        Index files are opened lazily, on first use."""
        self.directory = directory
        self.base_offset = base_offset
        self.index_interval_bytes = index_interval_bytes
        self.max_index_bytes = max_index_bytes
        self.writable = writable
        self.created_ms = created_ms
        self.roll_jitter_ms = roll_jitter_ms
        self.file_suffix = file_suffix
        self.log_path = log_file(directory, base_offset, file_suffix)
        # The file is opened on first use: a data dir of many segments opens in no time and holds
        # descriptors only for the segments in use (Kafka keeps every one open). See the module
        # docstring for leases and eviction.
        self._handle: int | None = None
        self._handle_lock = threading.Lock()
        self._leases = 0
        self._release_pending = False
        self._closed = False
        # Appended to or cut since the last fsync: a release or an eviction fsyncs first.
        self._log_dirty = False
        # Whether large appends allocate their blocks first (asked of the file system once).
        self._allocates_ahead: bool | None = None
        # (st_dev, st_ino) of the `.log` once opened or renamed: a reopen must find that file.
        self._file_id: tuple[int, int] | None = None
        # A segment this object created takes appends until it is sealed: pinned until then.
        self._writing = False
        self._offset_index: OffsetIndex | None = None
        self._time_index: TimeIndex | None = None
        # The `.txnindex` (engine.log.transaction_index): no descriptor, no lazy opening.
        self.transaction_index = TransactionIndex(self.transaction_index_path)
        # Whether the last `recover` met a transactional batch (recovery rebuilds `.txnindex`).
        self.holds_transactions = False
        # Indexes open lazily, on whichever thread (a reader's, without the partition lock)
        # first needs them: opened, checked (and for a writable segment recovered) under this
        # lock, and used without it only once `_indexes_ready` says they are whole.
        self._index_lock = threading.RLock()
        self._indexes_ready = False
        self._active = False
        self._max_timestamp_so_far: TimestampOffset | None = None
        self._rolling_based_timestamp: int | None = None
        self._bytes_since_last_index_entry = 0
        self.deleted = False
        # Batches below this position passed a `checked_batches(once=True)` check (each view's
        # first measure reads the segment: the CRCs are computed once). Cut back with the file.
        self._verified_to = 0
        # Read-only: where the scan for complete batches another process appended resumes.
        self._complete_to: int | None = None
        self._followed_next_offset: int | None = None
        try:
            # lstat: a link, a FIFO or a directory named like a segment is refused here, before
            # anything opens it (engine.files); its partition goes offline.
            stat = os.lstat(self.log_path)
            check_regular(self.log_path, stat.st_mode)
            self._size = stat.st_size
            if not writable:  # (a writer's compaction may replace the file: see `replaced_on_disk`)
                self._file_id = (stat.st_dev, stat.st_ino)
        except FileNotFoundError:
            if not writable:
                raise
            self._size = 0
            self._writing = True
            self._lease()  # create it now
            self._unlease()

    def __repr__(self) -> str:
        return f"LogSegment({self.log_path}, size={self._size})"

    # -- files --------------------------------------------------------------------------------
    @classmethod
    def open_for_reading(cls, directory: Path, base_offset: int, file_id: tuple[int, int]) -> LogSegment:
        """A sealed segment's `.log`, open, for reading its batches by position (positions
        another process found, as a Spark task's come from planning): the file must be the one
        `file_id` names ((st_dev, st_ino)). Its indexes are never opened. FileNotFoundError when
        it is not there any more, OSError ESTALE when another file took its name, UnsafeFileError
        when that is no regular file; the caller `close`s it."""
        # (the index settings only matter to indexes, which reading by position never opens)
        segment = cls(
            directory, base_offset, index_interval_bytes=4096, max_index_bytes=1 << 20, writable=False, created_ms=0
        )
        segment._file_id = file_id
        segment._lease()  # (opened now: its identity is checked here, not at the first read)
        segment._unlease()
        return segment

    def _lease(self) -> int:
        """The `.log` descriptor, opened if need be, held open until the matching `_unlease`:
        neither eviction nor a release closes it meanwhile. OSError when the segment is closed
        (and no lease keeps its file open). Thread-safe; no syscall unless it opens."""
        with self._handle_lock:
            handle = self._handle
            if handle is None:
                handle = self._open_log_locked()
            self._leases += 1
        OPEN_SEGMENTS.touch(self)
        return handle

    def _unlease(self) -> None:
        """End a lease; the last one runs a release that was asked for meanwhile."""
        with self._handle_lock:
            self._leases -= 1
            if self._leases or not self._release_pending:
                return
        self._release_now()

    def hold_open(self) -> None:
        """Keep the `.log` open until `let_close`, as a lease (a reader holding a view laid out
        over this segment: it stays readable after retention or compaction removed it, as a
        rotated log file does to a process holding it). OSError when the segment is closed."""
        self._lease()

    def let_close(self) -> None:
        """End a `hold_open`."""
        self._unlease()

    def _open_log_locked(self) -> int:
        if self._closed:
            raise OSError(f"{self.log_path}: segment is closed")
        flags = os.O_RDWR | os.O_CREAT if self.writable else os.O_RDONLY
        path = self.log_path
        handle = opening(lambda: open_regular(path, flags, 0o644))
        try:
            stat = os.fstat(handle)
            file_id = (stat.st_dev, stat.st_ino)
            if self._file_id is None:
                self._file_id = file_id
            elif file_id != self._file_id:
                # Renamed `.deleted`, then replaced by the `.deleted` file of a later segment of the
                # same base (two deletes within file.delete.delay.ms); or, read-only, replaced by
                # the writing process's compaction since this segment last had it open.
                raise OSError(errno.ESTALE, f"{path}: the segment's file was replaced since it was opened")
        except BaseException:
            os.close(handle)
            raise
        self._handle = handle
        return handle

    @property
    def evictable(self) -> bool:
        """Whether the cache may ask for this segment's files now: not leased and not pinned (a
        hint, read without locks; `try_release_handles` decides)."""
        return not (self._leases or self._active or self._writing)

    @property
    def closed(self) -> bool:
        """Whether the segment left its log (deleted, replaced, or its log closed): its files
        cannot be opened again."""
        return self._closed

    @property
    def leased(self) -> bool:
        """Whether a read, an iteration or a write holds the `.log` open now."""
        return self._leases > 0

    @property
    def handles_open(self) -> bool:
        """Whether the `.log` or a file-backed index is open now."""
        return self._handle is not None or any(
            index is not None and index.path is not None for index in (self._offset_index, self._time_index)
        )

    @property
    def offset_index_path(self) -> Path:
        return offset_index_file(self.directory, self.base_offset, self.file_suffix)

    @property
    def time_index_path(self) -> Path:
        return time_index_file(self.directory, self.base_offset, self.file_suffix)

    @property
    def transaction_index_path(self) -> Path:
        return self.directory / f"{filename_prefix_from_offset(self.base_offset)}{TXN_INDEX_SUFFIX}{self.file_suffix}"

    @property
    def size(self) -> int:
        """Bytes of batches in the `.log` file."""
        return self._size

    def refresh_size(self, *, sealed: bool = False) -> int:
        """A read-only segment of a log another process appends to: the size grows to the end of
        the last *complete* batch in the file now (a batch still being written, or cut by a
        crash, stays out). Only the bytes appended since the last look are scanned (the first
        time, from the last offset index entry). `sealed` (no longer the log's last: nothing is
        written to it any more): the file's size, whatever it holds (a batch cut short there is
        damage, which its readers report, not a batch being written). Returns the size; a
        writable segment's is already exact."""
        if self.writable:
            return self._size
        if sealed:
            size = self._size_on_disk()
            if size != self._size:
                self._forget_max_timestamp()
            self._size = size
            return size
        start, next_offset = self._complete_to, self._followed_next_offset
        if start is None:
            entry = self.offset_index.last_entry()  # (read before the size: a writer indexes a batch after writing it)
            # (an entry holds its batch's last offset: the offset before it is known once that
            # batch is read whole)
            start, next_offset = entry.position, (None if entry.position else self.base_offset)
        on_disk = self._size_on_disk()
        if start > on_disk:  # cut back (the writer's recovery): scan it again from the start
            start, next_offset = 0, self.base_offset
            self._verified_to = 0
            self._forget_max_timestamp()
        end = start
        newest = TimestampOffset(-1, -1)  # (the greatest timestamp appended, the first batch with it)
        for header in self.iter_headers(start, on_disk):
            end, next_offset = header.next_position, header.next_offset
            if header.max_timestamp > newest.timestamp:
                newest = TimestampOffset(header.max_timestamp, header.last_offset)
        if next_offset is None:  # the indexed batch is cut (a crash): the batches before it, from the start
            end, next_offset = 0, self.base_offset
            for header in self.iter_headers(0, on_disk):
                end, next_offset = header.next_position, header.next_offset
            self._forget_max_timestamp()
        self._complete_to, self._followed_next_offset = end, next_offset
        self._size = end
        # Lookups by time and retention see the timestamps appended since the segment's max
        # timestamp was loaded (a broker's active segment grows under a read-only mount).
        with self._index_lock:
            known = self._max_timestamp_so_far
            if known is not None and newest.timestamp > known.timestamp:
                self._max_timestamp_so_far = newest
        return end

    def _forget_max_timestamp(self) -> None:
        """Read-only: the file changed otherwise than by whole batches appended (cut back, a
        sealed segment's last bytes): its max timestamp is loaded again when next asked."""
        with self._index_lock:
            self._max_timestamp_so_far = None

    def _size_on_disk(self) -> int:
        with self._handle_lock:  # an open descriptor cannot be closed meanwhile
            handle = self._handle
            if handle is not None:
                return os.fstat(handle).st_size
        return os.lstat(self.log_path).st_size

    @property
    def followed_next_offset(self) -> int:
        """Read-only, after `refresh_size`: the offset after the last complete batch found."""
        return self.base_offset if self._followed_next_offset is None else self._followed_next_offset

    def replaced_on_disk(self) -> bool:
        """Read-only: whether the `.log` at this segment's name is no longer the file it opened
        (another process's compaction swapped it in, or retention renamed it away)."""
        try:
            stat = os.lstat(self.log_path)  # (a link put in its place is another file: refused at reopen)
        except FileNotFoundError:
            return True
        return self._file_id is not None and (stat.st_dev, stat.st_ino) != self._file_id

    def _open_indexes(self) -> None:
        """Open both index files and hold them against the log (`sanity_check`: their length,
        their order, their positions), as Kafka's LogLoader does. A file that fails is rebuilt
        from the log on a writable segment (Kafka: "Found a corrupted index file ... rebuilding
        index files"); a read-only segment leaves it as it is and builds its indexes in memory
        from the log instead, one scan of the segment. Either way with a warning naming the
        file. A missing file is not damage: rebuilt (writable) or built in memory, silently. A
        link or anything but a regular file where an index belongs is UnsafeFileError."""
        offset_path, time_path = self.offset_index_path, self.time_index_path
        usable = self.writable or (os.path.lexists(offset_path) and os.path.lexists(time_path))
        if usable:
            damage = None
            try:
                offset_index = OffsetIndex(offset_path, self.base_offset, self.max_index_bytes, writable=self.writable)
                self._offset_index = offset_index
                time_index = TimeIndex(time_path, self.base_offset, self.max_index_bytes, writable=self.writable)
                self._time_index = time_index
                offset_index.sanity_check(self._size)
                time_index.sanity_check(self._size)
                if self._active:
                    offset_index.resize(self.max_index_bytes)
                    time_index.resize(self.max_index_bytes)
                return
            except CorruptIndexError as error:
                damage = str(error)
            except OSError as error:
                if error.errno in (errno.EMFILE, errno.ENFILE):
                    self._close_indexes()
                    raise  # no damage: too many open files (`opening` sheds some and retries)
                if not isinstance(error, FileNotFoundError):
                    damage = f"{error.filename or offset_path}: {error.strerror or error}"
            except BaseException:
                self._close_indexes()  # (a link where an index belongs: refused, nothing kept open)
                raise
            # (handled here, once the error and what its traceback holds are gone)
            if self.writable:
                if damage is not None:
                    log.warning("%s; rebuilding the segment's indexes from the log", damage)
                self.recover()
                return
            self._close_indexes()
            if damage is not None:
                log.warning("%s; not used: the indexes are built in memory from the log (read-only)", damage)
        # Read-only and no usable index files: build the indexes in memory from the log.
        self._offset_index = OffsetIndex(None, self.base_offset, self.max_index_bytes, writable=True)
        self._time_index = TimeIndex(None, self.base_offset, self.max_index_bytes, writable=True)
        self._rebuild_indexes(truncate=False)

    def _close_indexes(self) -> None:
        with self._index_lock:
            self._indexes_ready = False
            for index in (self._offset_index, self._time_index):
                if index is not None:
                    index.close()
            self._offset_index = self._time_index = None

    def _ensure_indexes(self) -> tuple[OffsetIndex, TimeIndex]:
        """Both indexes, opened (checked, recovered) if need be. Under a lease: the segment
        counts as holding open files, and a release asked for meanwhile waits until the objects
        are handed out (then closes them: their holders reopen them)."""
        self._lease()
        try:
            with self._index_lock:
                if not self._indexes_ready or self._offset_index is None or self._time_index is None:
                    if self._offset_index is None or self._time_index is None:
                        opening(self._open_indexes)
                    self._indexes_ready = True
                offset_index, time_index = self._offset_index, self._time_index
                assert offset_index is not None and time_index is not None
                return offset_index, time_index
        finally:
            self._unlease()

    # The index objects are returned as read, never looked up again: an eviction may set the
    # attributes to None at any moment, and an index closed under its holder reopens itself.
    @property
    def offset_index(self) -> OffsetIndex:
        index = self._offset_index
        if index is None or not self._indexes_ready:
            return self._ensure_indexes()[0]
        return index

    @property
    def time_index(self) -> TimeIndex:
        index = self._time_index
        if index is None or not self._indexes_ready:
            return self._ensure_indexes()[1]
        return index

    @property
    def indexes_loaded(self) -> bool:
        return self._offset_index is not None

    def make_active(self) -> None:
        """This segment takes appends from now on (pinned: never evicted): its indexes get their
        preallocated size."""
        with self._index_lock:  # no eviction closes the indexes between the flag and the resize
            self._active = True
            if self._offset_index is not None and self._time_index is not None:
                self._offset_index.resize(self.max_index_bytes)
                self._time_index.resize(self.max_index_bytes)

    # -- reading ------------------------------------------------------------------------------
    def iter_batches(
        self, start_position: int = 0, end_position: int | None = None, *, nowait: bool = False, to_end: bool = False
    ) -> Generator[tuple[BatchHeader, memoryview], None, None]:
        """Whole batches (header, bytes) from `start_position` up to `end_position` (default:
        the size now). Stops at a batch that is cut short or whose length is impossible; checks
        nothing else. Reads in large chunks, so a scan costs about one read of the file.

        With `to_end` (bytes that must be whole batches up to the end: a sealed segment's, up
        to its size) a scan that stops short of the end raises `check_whole`'s error there
        instead: the batches after it would otherwise be skipped without a word.

        With `nowait` (for small ranges read on an event loop) the range is read at once and
        only from the OS page cache: BlockingIOError, before any batch, when part of it would
        have to come from the disk.

        The segment is leased from the first batch read until the iterator ends or is closed."""
        end = self._size if end_position is None else end_position
        batches = self._batches_from(start_position, end, nowait)
        yield from self._to_end(batches, start_position, end, _batch_header) if to_end else batches

    def _to_end(
        self, items: Iterator[T], position: int, end: int, header_of: Callable[[T], BatchHeader]
    ) -> Iterator[T]:
        """`items` (batches or headers read from `position`), then `check_whole` where they
        stopped, for bytes that must be whole batches up to `end`. (A caller that stops early
        closes the iterator: nothing is checked then.)"""
        for item in items:
            yield item
            position = header_of(item).next_position
        self.check_whole(position, end)

    def _batches_from(
        self, start_position: int, end: int, nowait: bool
    ) -> Generator[tuple[BatchHeader, memoryview], None, None]:
        position = start_position
        if position + MIN_ENTRY_BYTES > end:
            return
        handle = self._lease()
        try:
            if not nowait and end - position > _READ_CHUNK_BYTES:
                # A long scan: the kernel reads ahead of it from the disk while it works.
                _ADVICE.read_ahead(handle, position, end - position)
            while position + MIN_ENTRY_BYTES <= end:
                if nowait:
                    view = memoryview(read_cached(handle, position, end - position))
                else:
                    view = memoryview(os.pread(handle, min(_READ_CHUNK_BYTES, end - position), position))
                if not _header_fits(view, 0):
                    return
                offset = 0
                while _header_fits(view, offset):
                    # (a legacy message the chunk cuts parses from its first bytes: read again below)
                    header = BatchHeader.parse(view, offset, position + offset)
                    size = header.size_in_bytes
                    if _impossible_length(header) or header.next_position > end:
                        return
                    if offset + size > len(view):
                        break
                    yield header, view[offset : offset + size]
                    offset += size
                if offset == 0:
                    # A single batch larger than the chunk: read it whole (and a legacy message
                    # parsed again from all of its bytes).
                    header = BatchHeader.parse(view, 0, position)
                    whole = memoryview(os.pread(handle, header.size_in_bytes, position))
                    if len(whole) < header.size_in_bytes:
                        return
                    if isinstance(header, LegacyBatchHeader):
                        header = BatchHeader.parse(whole, 0, position)
                    yield header, whole
                    offset = header.size_in_bytes
                position += offset
        finally:
            self._unlease()

    def with_descriptor(self, work: Callable[[int], T]) -> T:
        """`work(fd)` with the `.log` file's descriptor, held open until it returns (for a call
        of the core that reads the file itself). OSError when the segment is closed."""
        handle = self._lease()
        try:
            return work(handle)
        finally:
            self._unlease()

    def advise_read_ahead(self, position: int, end_position: int | None = None) -> None:
        """Have the kernel read the file from `position` up to `end_position` (default: the size
        now) into the page cache, from a thread of its own, for a scan about to read it in
        pieces (`iter_headers`, then the batches). Advice only: nothing when it cannot be given.
        Thread-safe."""
        end = self._size if end_position is None else end_position
        if end - position <= _READ_CHUNK_BYTES:
            return
        try:
            handle = self._lease()
        except OSError:
            return
        try:
            _ADVICE.read_ahead(handle, position, end - position)
        finally:
            self._unlease()

    def checked_batches(
        self,
        start_position: int = 0,
        end_position: int | None = None,
        *,
        nowait: bool = False,
        once: bool = False,
        to_end: bool = False,
    ) -> Generator[tuple[BatchHeader, memoryview], None, None]:
        """`iter_batches` (`to_end` as there), each batch checked whole (magic, length, CRC) before it is yielded:
        CorruptRecordError at the first that fails, UnsupportedFormatError when it is intact
        legacy data. For whoever uses every batch it reads (views, the cleaner). With `once` (a
        view's first measure: each format reads the whole segment), batches an earlier `once`
        pass checked are not checked again; every other read checks what it reads."""
        for header, batch in self.iter_batches(start_position, end_position, nowait=nowait, to_end=to_end):
            if not once or header.next_position > self._verified_to:
                self.check(header, batch)
                if once and header.position == self._verified_to:
                    self._verified_to = header.next_position
            yield header, batch

    def _iter_mapped_batches(self) -> Generator[tuple[BatchHeader, memoryview], None, None]:
        """Like iter_batches from 0, over a read-only mapping of the file instead of copies of
        it: recovery checks every byte once, in place. Writable segments only: their data dir's
        `.lock` keeps other processes from truncating the file, which would make the mapping
        fault. Not necessarily under the partition's lock: besides the loader's `recover`
        (before the log is shared), `_open_indexes` gets here when a writable segment's index
        files prove unusable, on whichever thread first touches the index — a reader
        (`PartitionLog.batches`, `offset_for_timestamp`, the cleaner) holds no lock."""
        if self._size < MIN_ENTRY_BYTES:
            return
        handle = self._lease()
        try:
            mapping = mmap.mmap(handle, self._size, access=mmap.ACCESS_READ)
        except BaseException:
            self._unlease()
            raise
        view = memoryview(mapping)
        position = 0
        try:
            while _header_fits(view, position):
                header = BatchHeader.parse(view, position)
                if _impossible_length(header) or header.next_position > self._size:
                    return
                batch = view[position : header.next_position]
                yield header, batch
                batch.release()
                position = header.next_position
        finally:
            try:
                view.release()
                mapping.close()
            except BufferError:
                pass  # the caller still holds a batch's view: the mapping goes when that does
            self._unlease()

    def legacy_message_at(self, position: int) -> bool:
        """Whether a legacy message (magic 0/1) whose CRC-32 holds starts at `position`: old
        data, not damage, even where it cannot be read."""
        handle = self._lease()
        try:
            head = os.pread(handle, LOG_OVERHEAD_BYTES, position)
            if len(head) < LOG_OVERHEAD_BYTES:
                return False
            size = int.from_bytes(head[8:12], "big", signed=True)
            if not 14 <= size <= self._size - position - LOG_OVERHEAD_BYTES:
                return False
            return is_legacy_message(os.pread(handle, LOG_OVERHEAD_BYTES + size, position))
        finally:
            self._unlease()

    def check(self, header: BatchHeader, batch: bytes | bytearray | memoryview) -> None:
        """Check a batch read from this segment whole (magic, length, CRC): CorruptRecordError
        naming the file and position when it fails, UnsupportedFormatError when it is intact
        legacy data. Thread-safe."""
        reason = check_batch(header, batch)
        if reason is not None:
            self.check_not_legacy(header.position)
            raise CorruptRecordError(self.log_path, header.position, reason)

    def checked_batch(self, header: BatchHeader) -> bytes:
        """The whole batch a header from `iter_headers` heads, checked (see `check`)."""
        handle = self._lease()
        try:
            batch = os.pread(handle, header.size_in_bytes, header.position)
        finally:
            self._unlease()
        self.check(header, batch)
        return batch

    def check_whole(self, position: int, end: int) -> None:
        """Where a scan of bytes that must be whole batches (a sealed segment's, up to its size)
        stopped at `position`, short of `end`: UnsupportedFormatError for intact legacy data
        there, else CorruptRecordError naming the position (a batch cut short or with an
        impossible length field: the batches after it are still on disk, but cannot be found
        from it). Nothing when the scan reached `end`."""
        if position < end:
            self.check_not_legacy(position)
            raise CorruptRecordError(
                self.log_path,
                position,
                f"a batch is cut short or has an impossible length ({end - position} bytes to the segment's end)",
            )

    def check_not_legacy(self, position: int) -> None:
        """Where a batch failed its check (or a scan stopped): raise UnsupportedFormatError when
        a legacy message whose CRC-32 holds starts at `position` all the same (a wrapper whose
        content cannot be decoded), so that intact old data is never taken for a torn tail and
        cut. Legacy messages that decode are read as any batch and never get here."""
        if self.legacy_message_at(position):
            handle = self._lease()
            try:
                head = os.pread(handle, LOG_OVERHEAD_BYTES, position)
                size = int.from_bytes(head[8:12], "big", signed=True)
                entry = os.pread(handle, LOG_OVERHEAD_BYTES + size, position)
            finally:
                self._unlease()
            problem = LegacyBatchHeader.parse_message(entry, 0, position).problem
            raise UnsupportedFormatError(
                f"{self.log_path}: legacy message (magic 0 or 1) at position {position} cannot be read: "
                f"{problem or 'not a message set'}; the data is left untouched"
            )

    def translate_offset(self, offset: int, start_position: int = 0) -> BatchHeader | None:
        """The first batch whose last offset is ≥ `offset`, searching from the index entry at or
        below it (never before `start_position`); None when the segment has no such batch."""
        self._lease()
        try:
            position = max(start_position, self.offset_index.lookup(offset).position)
            for header in self.iter_headers(position):
                if header.last_offset >= offset:
                    return header
            return None
        finally:
            self._unlease()

    def iter_headers(
        self, position: int = 0, end_position: int | None = None, *, to_end: bool = False
    ) -> Iterator[BatchHeader]:
        """Batch headers from `position` up to `end_position` (default: the size now), without
        reading whole batches. Each read is the next header alone (61 bytes), or, after two
        small batches in a row, a window that holds the headers of the batches that follow:
        4 KiB, doubling up to `_HEADER_WINDOW_BYTES` while windows hold more than one header.
        A scan costs a read per large batch, about one read of the file when batches are small
        (one record each, say), and at most a small window's waste where sizes alternate.
        Stops where `iter_batches` does (`to_end` as there)."""
        end = self._size if end_position is None else end_position
        headers = self._headers_from(position, end)
        yield from self._to_end(headers, position, end, _itself) if to_end else headers

    def _headers_from(self, position: int, end: int) -> Iterator[BatchHeader]:
        if position + MIN_ENTRY_BYTES > end:
            return
        handle = self._lease()
        try:
            window, window_at = memoryview(b""), position  # file bytes read, and where they start
            window_bytes, windowed, headers_read = _FIRST_WINDOW_BYTES, False, 0  # (of the last read)
            small_run = 0  # small batches in a row just before `position`
            while position + MIN_ENTRY_BYTES <= end:
                offset = position - window_at
                if not _header_fits(window, offset):
                    if windowed:
                        window_bytes = (
                            min(2 * window_bytes, _HEADER_WINDOW_BYTES) if headers_read > 1 else _FIRST_WINDOW_BYTES
                        )
                    windowed = small_run >= 2
                    wanted = window_bytes if windowed else BATCH_OVERHEAD_BYTES
                    window, window_at, offset = (
                        memoryview(os.pread(handle, min(wanted, end - position), position)),
                        position,
                        0,
                    )
                    headers_read = 0
                    if not _header_fits(window, 0):
                        return
                header = BatchHeader.parse(window, offset, position)
                if _impossible_length(header) or header.next_position > end:
                    return
                if isinstance(header, LegacyBatchHeader) and offset + header.size_in_bytes > len(window):
                    # A legacy wrapper's first offset and records need all of its bytes.
                    whole = os.pread(handle, header.size_in_bytes, position)
                    if len(whole) < header.size_in_bytes:
                        return
                    header = BatchHeader.parse(whole, 0, position)
                yield header
                headers_read += 1
                small_run = small_run + 1 if header.size_in_bytes <= _SMALL_BATCH_BYTES else 0
                position = header.next_position
        finally:
            self._unlease()

    def read(
        self, start_offset: int, max_bytes: int, max_position: int | None = None, min_one_message: bool = False
    ) -> FetchSlice | None:
        """Bytes from the first batch holding an offset ≥ `start_offset`, at most `max_bytes`
        (or the whole first batch when `min_one_message`), never past `max_position`.

        None when no batch in the segment reaches `start_offset` (Kafka returns null then, not an
        empty result); an empty slice when the first batch does not fit and not min_one_message."""
        limit = self._size if max_position is None else min(max_position, self._size)
        handle = self._lease()
        try:
            header = self.translate_offset(start_offset)
            if header is None or header.position >= limit:
                return None
            wanted = max(max_bytes, header.size_in_bytes) if min_one_message else max_bytes
            length = min(limit - header.position, wanted)
            data = os.pread(handle, length, header.position) if length > 0 else b""
            return FetchSlice(self.base_offset, header.position, data)
        finally:
            self._unlease()

    def find_offset_by_timestamp(self, timestamp: int, starting_offset: int) -> TimestampAndOffset | None:
        """The first record with timestamp ≥ `timestamp` and offset ≥ `starting_offset`, found as
        Kafka does: time index → offset index → scan of batches, opening only the first batch
        whose max timestamp reaches the target. None when no record qualifies."""
        self._lease()
        try:
            entry = self.time_index.lookup(timestamp)
            position = self.offset_index.lookup(max(entry.offset, starting_offset)).position
            for header, batch in self.iter_batches(position):
                if header.max_timestamp < timestamp or header.last_offset < starting_offset:
                    continue
                reason = check_batch(header, batch)
                if reason is not None:
                    raise CorruptRecordError(self.log_path, header.position, reason)
                columns = record_columns(header, batch)  # (the compiled core's walk, no object per record)
                stamps = columns.consumer_timestamps()
                found = np.flatnonzero((stamps >= timestamp) & (columns.offsets >= starting_offset))
                if len(found):
                    epoch = header.partition_leader_epoch
                    first = int(found[0])
                    return TimestampAndOffset(
                        int(stamps[first]), int(columns.offsets[first]), epoch if epoch >= 0 else None
                    )
            return None
        finally:
            self._unlease()

    # -- timestamps -----------------------------------------------------------------------------
    def _load_max_timestamp(self) -> TimestampOffset:
        """(max timestamp, its offset) over the segment: the time index's last entry, then a scan
        of the batches after the offset it points at (Kafka's loadLargestTimestamp)."""
        self._lease()
        try:
            last = self.time_index.last_entry()
            best = last
            position = self.offset_index.lookup(last.offset).position
            for header in self.iter_headers(position):
                if header.max_timestamp > best.timestamp:
                    best = TimestampOffset(header.max_timestamp, header.last_offset)
            return best
        finally:
            self._unlease()

    @property
    def max_timestamp_so_far(self) -> TimestampOffset:
        known = self._max_timestamp_so_far
        if known is None:
            with self._index_lock:  # loaded once; never over a newer value an append set
                if self._max_timestamp_so_far is None:
                    self._max_timestamp_so_far = self._load_max_timestamp()
                known = self._max_timestamp_so_far
        return known

    @property
    def largest_timestamp(self) -> int:
        """The segment's largest record timestamp; the file's mtime when it holds none (Kafka
        uses the same stand-in for retention)."""
        timestamp = self.max_timestamp_so_far.timestamp
        if timestamp >= 0:
            return timestamp
        return int(os.lstat(self.log_path).st_mtime * 1000)

    def first_batch_timestamp(self) -> int:
        """Max timestamp of the first batch (what time-based rolling measures from);
        2^63-1 for an empty segment."""
        for header in self.iter_headers(0):
            return header.max_timestamp
        return 2**63 - 1

    def time_waited_for_roll(self, now_ms: int, message_timestamp: int) -> int:
        if self._rolling_based_timestamp is None and self._size > 0:
            self._rolling_based_timestamp = self.first_batch_timestamp()
        if self._rolling_based_timestamp is not None and self._rolling_based_timestamp >= 0:
            return message_timestamp - self._rolling_based_timestamp
        return now_ms - self.created_ms

    def should_roll(
        self, *, messages_bytes: int, max_timestamp: int, max_offset: int, now_ms: int, max_bytes: int, max_ms: int
    ) -> bool:
        """Kafka's roll rules (LogSegment.shouldRoll) for an append of `messages_bytes` bytes whose
        largest timestamp and offset are `max_timestamp` and `max_offset`: `max_bytes` is
        `segment.bytes`, `max_ms` the log's `max_segment_ms`. (Arguments, not a RollParams
        object: this is asked for every append.)"""
        return (
            self._size > max_bytes - messages_bytes
            or (self._size > 0 and self.time_waited_for_roll(now_ms, max_timestamp) > max_ms - self.roll_jitter_ms)
            or self.offset_index.is_full
            or self.time_index.is_full
            or not self.can_convert_to_relative_offset(max_offset)
        )

    def appends_in_memory(self, most_bytes: int, last_offset: int, now_ms: int, max_bytes: int, max_ms: int) -> bool:
        """Whether an append of at most `most_bytes` of batches timestamped `now_ms`, up to offset
        `last_offset`, is a write to the page cache and nothing more: no roll by any of
        `should_roll`'s rules, and no file or index to open or read first. For an event loop,
        which must not wait on a disk."""
        # What `should_roll` and the append would otherwise open or read: the `.log`, the
        # indexes, the first batch's timestamp (the time rule) and the largest timestamp.
        if self._handle is None or not self._indexes_ready or self._closed:
            return False
        if self._offset_index is None or self._time_index is None:
            return False
        if self._size and (self._rolling_based_timestamp is None or self._max_timestamp_so_far is None):
            return False
        return not self.should_roll(
            messages_bytes=most_bytes,
            max_timestamp=now_ms,
            max_offset=last_offset,
            now_ms=now_ms,
            max_bytes=max_bytes,
            max_ms=max_ms,
        )

    def can_convert_to_relative_offset(self, offset: int) -> bool:
        return 0 <= offset - self.base_offset <= _INT32_MAX

    # -- writing ------------------------------------------------------------------------------
    def append(self, data: bytes | bytearray, headers: list[BatchHeader]) -> None:
        """Append whole, valid batches (`headers` parsed from `data`, positions relative to it)
        and index them by Kafka's rules. Raises OffsetOverflowError, writing nothing, when the
        last offset does not fit relative to the base offset."""
        if not data:
            return
        largest_offset = headers[-1].last_offset
        if not self.can_convert_to_relative_offset(largest_offset) or headers[0].base_offset < self.base_offset:
            raise OffsetOverflowError(
                f"{self.log_path}: offsets {headers[0].base_offset}..{largest_offset} do not fit "
                f"relative to base offset {self.base_offset}"
            )
        handle = self._lease()
        try:
            self._append_leased(handle, data, headers)
        finally:
            self._unlease()

    def _append_leased(self, handle: int, data: bytes | bytearray, headers: list[BatchHeader]) -> None:
        physical_position = self._size
        if physical_position == 0:
            self._rolling_based_timestamp = headers[0].max_timestamp
        offset_index, time_index = self.offset_index, self.time_index
        max_so_far = self.max_timestamp_so_far  # loaded (if need be) before the new batches exist
        bytes_since_last_index_entry = self._bytes_since_last_index_entry
        self._log_dirty = True
        try:
            self._allocate_ahead(handle, physical_position, len(data))
            write_all(handle, data, physical_position)
            self._index_appended(data, headers, physical_position, max_so_far)
            # Published last: a reader bounded by the size never sees a batch that may be cut.
            self._size = physical_position + len(data)
        except BaseException as error:
            # A failed write (ENOSPC, EIO) or index update leaves nothing behind: the file, the
            # indexes and the bookkeeping go back to where they were.
            os.ftruncate(handle, physical_position)
            with contextlib.suppress(OSError):  # the cut made durable: a failed write never reappears
                os.fsync(handle)
            self._size = physical_position
            self._bytes_since_last_index_entry = bytes_since_last_index_entry
            offset_index.truncate_to(headers[0].base_offset)
            time_index.truncate_to(headers[0].base_offset)
            self._max_timestamp_so_far = None
            if isinstance(error, OSError) and error.filename is None and error.errno:
                raise OSError(error.errno, f"appending to {self.log_path}: {error.strerror}") from None
            raise

    def _allocate_ahead(self, handle: int, position: int, length: int) -> None:
        """Have a large append's blocks allocated before it is written, where that makes the
        write faster (`_core.allocate_ahead`). Advice: a write it could not help (ENOSPC, EIO)
        fails on its own, and what a failed write leaves allocated past the end, its cut frees."""
        if length < _ALLOCATE_AHEAD_BYTES:
            return
        if self._allocates_ahead is None:
            self._allocates_ahead = _core.allocates_ahead(handle)
        if self._allocates_ahead and _core.allocate_ahead(handle, position, length) == errno.EOPNOTSUPP:
            self._allocates_ahead = False  # (ext2 or ext3: ext4's magic number, not its fallocate)

    def adopt(self, path: Path) -> None:
        """Make the file at `path` this empty segment's `.log` by renaming it (its bytes are not
        copied): whole v2 batches from the segment's base offset on, already checked by the
        caller. Both indexes are rebuilt from it. `path` must be on the segment's filesystem
        (OSError EXDEV otherwise, the segment unchanged); if the file does not read back as
        whole valid batches it is renamed back to `path` and CorruptRecordError raised."""
        with self._index_lock:
            with self._handle_lock:  # (no lease can reopen the `.log` meanwhile)
                if not self.writable or self._size or self._leases or self._closed:
                    raise ValueError(f"{self.log_path}: only an empty, idle, writable segment adopts a file")
                handle, self._handle = self._handle, None
                OPEN_SEGMENTS.forget(self)
                if handle is not None:
                    os.close(handle)  # (empty: nothing to fsync)
                # Not a rename over the empty file: on ext4 that starts writing the whole file
                # back at once (auto_da_alloc). A crash in between leaves index files without a
                # `.log`, which loading removes.
                os.unlink(self.log_path)
                try:
                    os.rename(path, self.log_path)
                finally:
                    self._file_id = None
            self._size = os.lstat(self.log_path).st_size
            self._log_dirty = True  # the next flush or release fsyncs it
            try:
                invalid = self._rebuild_indexes(truncate=False)
            except BaseException:
                self._disown(path)
                raise
            if invalid:
                self._disown(path)
                raise CorruptRecordError(str(path), self._size - invalid, "invalid batch in an adopted file")

    def _disown(self, path: Path) -> None:
        """Undo `adopt`: the file goes back to `path` and the segment is empty again."""
        with self._handle_lock:
            handle, self._handle = self._handle, None
            OPEN_SEGMENTS.forget(self)
        if handle is not None:
            os.close(handle)
        os.replace(self.log_path, path)
        self._file_id = None
        self._size = 0
        self._verified_to = 0
        self._log_dirty = False
        self._bytes_since_last_index_entry = 0
        self.offset_index_unchecked.truncate()
        self.time_index_unchecked.truncate()
        with self._index_lock:
            self._max_timestamp_so_far = None
        self._lease()  # the empty `.log` again
        self._unlease()

    def _index_appended(
        self, data: bytes | bytearray, headers: list[BatchHeader], physical_position: int, max_so_far: TimestampOffset
    ) -> None:
        offset_index, time_index = self.offset_index, self.time_index
        before = max_so_far
        for header in headers:
            if header.max_timestamp > max_so_far.timestamp:
                max_so_far = TimestampOffset(header.max_timestamp, header.last_offset)
            if self._bytes_since_last_index_entry > self.index_interval_bytes:
                offset_index.append(header.last_offset, physical_position)
                time_index.maybe_append(max_so_far.timestamp, max_so_far.offset)
                self._bytes_since_last_index_entry = 0
            physical_position += header.size_in_bytes
            self._bytes_since_last_index_entry += header.size_in_bytes
        if max_so_far is not before:
            with self._index_lock:  # see max_timestamp_so_far
                self._max_timestamp_so_far = max_so_far

    def _rebuild_indexes(self, *, truncate: bool, keep: KeepTail | None = None) -> int:
        """Re-read every batch, check it and rebuild both indexes; with `truncate`, cut the log
        at the first invalid batch, after `keep` (if given) has kept what is cut. Returns the
        number of invalid bytes found at the end. Holds the index lock and a lease throughout."""
        with self._index_lock:
            handle = self._lease()
            try:
                return self._rebuild_indexes_leased(handle, truncate=truncate, keep=keep)
            finally:
                self._unlease()

    def _intact_batches(
        self, batches: Iterator[tuple[BatchHeader, memoryview]]
    ) -> Iterator[tuple[BatchHeader, memoryview]]:
        """The batches recovery keeps, in order, up to the first it cuts at: one not where the
        previous ended, failing its checks, or whose offsets go backwards or do not fit the
        segment (Kafka's LogSegment.recover and its offset checks), or that reach the next
        segment's base offset (`next_base_offset`, where the loader knows it: a flipped bit in a
        base offset, which no CRC covers, would otherwise leave a log whose offsets go back), or
        whose record count its own bytes cannot hold (every reader refuses such a batch)."""
        valid_bytes = 0
        previous_last_offset = self.base_offset - 1
        for header, batch in batches:
            if header.position != valid_bytes:
                return
            if check_batch(header, batch) is not None or not plausible_record_count(header):
                return
            if (
                header.base_offset <= previous_last_offset
                or not self.can_convert_to_relative_offset(header.last_offset)
                or (self.next_base_offset is not None and header.last_offset >= self.next_base_offset)
            ):
                return
            yield header, batch
            valid_bytes = header.next_position
            previous_last_offset = header.last_offset

    def recovery_cut(self) -> tuple[int, int]:
        """Where recovery would cut this segment, read without changing anything: (the bytes it
        keeps, the offset after them). Equal to the size when nothing would be cut."""
        valid_bytes, next_offset = 0, self.base_offset
        batches = self.iter_batches(0)
        try:
            for header, _batch in self._intact_batches(batches):
                valid_bytes, next_offset = header.next_position, header.last_offset + 1
        finally:
            batches.close()
        return valid_bytes, next_offset

    def _rebuild_indexes_leased(self, handle: int, *, truncate: bool, keep: KeepTail | None) -> int:
        offset_index, time_index = self.offset_index_unchecked, self.time_index_unchecked
        # Emptied without reading what the files held (they may be anything: recovery is what
        # follows a failed sanity check).
        offset_index.reset()
        time_index.reset()
        max_so_far = TimestampOffset(NO_TIMESTAMP, self.base_offset)
        valid_bytes = 0
        last_index_entry = 0
        previous_last_offset = self.base_offset - 1
        transactional = False
        batches = self._iter_mapped_batches() if self.writable else self.iter_batches(0)
        for header, _batch in self._intact_batches(batches):
            if header.max_timestamp > max_so_far.timestamp:
                max_so_far = TimestampOffset(header.max_timestamp, header.last_offset)
            if valid_bytes - last_index_entry > self.index_interval_bytes:
                if offset_index.is_full or time_index.is_full:
                    offset_index.resize(offset_index.file_length + self.max_index_bytes)
                    time_index.resize(time_index.file_length + self.max_index_bytes)
                offset_index.append(header.last_offset, valid_bytes)
                time_index.maybe_append(max_so_far.timestamp, max_so_far.offset)
                last_index_entry = valid_bytes
            valid_bytes += header.size_in_bytes
            previous_last_offset = header.last_offset
            transactional = transactional or header.is_transactional
        self.holds_transactions = transactional
        _batch = memoryview(b"")  # drop the last view of the mapping, then unmap it
        batches.close()
        truncated = self._size - valid_bytes
        if truncated > 0:
            self.check_not_legacy(valid_bytes)
        if truncate:
            # Recovery: what it keeps may be as the crash left it, never fsynced; the next flush
            # or release fsyncs it (and so does the loader's release).
            self._log_dirty = True
        if truncate and truncated > 0:
            if keep is not None:
                # What is cut is kept first (engine.log.set_aside): a failure there cuts nothing.
                keep(self.log_path, handle, valid_bytes, self._size, previous_last_offset + 1)
            self._verified_to = min(self._verified_to, valid_bytes)
            os.ftruncate(handle, valid_bytes)
        elif truncate:
            # Nothing to cut, but blocks a crash left allocated past the end (between a large
            # append's allocation and its write) are freed. The modification time is put back:
            # retention goes by it where a segment's records carry no timestamps.
            before = os.fstat(handle)
            if _allocated_past(before, valid_bytes) >= _ALLOCATE_AHEAD_BYTES:
                os.ftruncate(handle, valid_bytes)
                os.utime(handle, ns=(before.st_atime_ns, before.st_mtime_ns))
        if truncate or truncated == 0:
            self._size = valid_bytes
        if max_so_far.timestamp != NO_TIMESTAMP:
            time_index.maybe_append(max_so_far.timestamp, max_so_far.offset, skip_full_check=True)
        if not self._active:
            offset_index.trim_to_valid_size()
            time_index.trim_to_valid_size()
        with self._index_lock:
            self._max_timestamp_so_far = max_so_far
        self._bytes_since_last_index_entry = valid_bytes - last_index_entry
        self._rolling_based_timestamp = None
        return truncated

    @property
    def offset_index_unchecked(self) -> OffsetIndex:
        if self._offset_index is None:
            self._offset_index = OffsetIndex(
                self.offset_index_path, self.base_offset, self.max_index_bytes, writable=self.writable
            )
        return self._offset_index

    @property
    def time_index_unchecked(self) -> TimeIndex:
        if self._time_index is None:
            self._time_index = TimeIndex(
                self.time_index_path, self.base_offset, self.max_index_bytes, writable=self.writable
            )
        return self._time_index

    # What keeps the bytes of a cut no caller gave a `keep` for (a damaged index found on first
    # use recovers the segment): the loader sets it on the segments it opens writable.
    keep_cut: KeepTail | None = None
    # The base offset of the segment after this one, where the loader or a repair's plan knows
    # it: recovery keeps no batch whose offsets reach it (see `_intact_batches`).
    next_base_offset: int | None = None

    def recover(self, keep: KeepTail | None = None) -> int:
        """Validate every batch, rebuild both indexes from the log and truncate the log at the
        first invalid batch (bad CRC, length, magic, or offsets that go backwards or overflow).
        Before the cut, `keep(log_path, descriptor, position, size, next_offset)` (default
        `keep_cut`) is given the bytes to be cut (engine.log.set_aside keeps them); an error it
        raises cuts nothing. Returns the number of bytes truncated. Writable segments only."""
        return self._rebuild_indexes(truncate=True, keep=keep or self.keep_cut)

    def truncate_to(self, offset: int, now_ms: int) -> int:
        """Remove every batch from the one holding `offset` on, and every index entry at or above
        it; returns the bytes removed. The segment becomes writable-active sized."""
        header = self.translate_offset(offset)
        # Whole batches go: the indexes are cut at the first offset of the batch that is removed.
        cut = offset if header is None else min(offset, header.base_offset)
        handle = self._lease()
        try:
            self.transaction_index.truncate_to(cut)
            self.offset_index.truncate_to(cut)
            self.time_index.truncate_to(cut)
            self.offset_index.resize(self.max_index_bytes)
            self.time_index.resize(self.max_index_bytes)
            removed = 0
            if header is not None:
                removed = self._size - header.position
                self._log_dirty = True
                self._verified_to = min(self._verified_to, header.position)
                os.ftruncate(handle, header.position)
                self._size = header.position
        finally:
            self._unlease()
        if self._size == 0:
            self.created_ms = now_ms
            self._rolling_based_timestamp = None
        self._bytes_since_last_index_entry = 0
        self._max_timestamp_so_far = None
        return removed

    def read_next_offset(self, *, trust_index: bool = True) -> int:
        """The offset after the segment's last batch (its base offset when empty): a scan of
        batch headers from the last index entry, or from the start when the index is not to be
        trusted (a `.swap` file being completed)."""
        self._lease()
        try:
            position = self.offset_index.last_entry().position if trust_index else 0
            next_offset = self.base_offset
            for header in self.iter_headers(position):
                next_offset = header.next_offset
            return next_offset
        finally:
            self._unlease()

    def flush(self) -> None:
        """Make appended batches and index entries durable: fsync what was written since the
        last fsync (a release or an eviction fsyncs what it closes)."""
        if self._log_dirty:
            handle = self._lease()
            try:
                os.fsync(handle)
                self._log_dirty = False
            finally:
                self._unlease()
        self._flush_indexes()

    def _flush_indexes(self) -> None:
        for index in (self._offset_index, self._time_index):
            if index is not None:
                index.flush()  # nothing to do once closed: closing fsynced it
        self.transaction_index.flush()

    def take_flush(self) -> int | None:
        """`flush`, with the `.log`'s fsync left to the caller (a roll's, on a thread of its own):
        a duplicate of its descriptor when batches were appended since the last fsync, which the
        caller fsyncs and closes (the segment counts them flushed from now on), else None. The
        indexes are flushed here."""
        descriptor = None
        if self._log_dirty:
            handle = self._lease()
            try:
                descriptor = os.dup(handle)
                self._log_dirty = False
            finally:
                self._unlease()
        self._flush_indexes()
        return descriptor

    def on_become_inactive(self) -> None:
        """Roll: add the closing time-index entry and trim both indexes to their entries. The
        segment is sealed: no longer pinned in the open-file cache."""
        with self._index_lock:  # no eviction closes the indexes half-way
            self._active = False
            max_so_far = self.max_timestamp_so_far
            if max_so_far.timestamp != NO_TIMESTAMP:
                self.time_index.maybe_append(max_so_far.timestamp, max_so_far.offset, skip_full_check=True)
            self.offset_index.trim_to_valid_size()
            self.time_index.trim_to_valid_size()
            # Sealed: the indexes are closed (fsynced) and reopen on the next read that needs them.
            self._close_indexes()
            self._writing = False

    def close(self) -> None:
        """Flush and release the files; writable segments get the closing time-index entry and
        trimmed indexes (the state Kafka leaves after a clean shutdown). Safe to call twice."""
        if self._closed:
            return
        if self.writable and not self.deleted and (self._active or self.indexes_loaded):
            # Sealed segments whose indexes were never opened are left as they are on disk.
            self.on_become_inactive()
        self.close_handlers()

    def release_handles(self) -> None:
        """Close the file and the indexes (fsyncing what was written since the last fsync); they
        reopen on next use. The loader does this for each sealed segment it recovers. While a
        reader holds a lease this only marks the segment, and the last lease to end closes the
        files: it never waits for readers (the writer may call it under the partition lock)."""
        with self._handle_lock:
            if self._leases:
                self._release_pending = True
                return
        self._release_now()

    def _release_now(self) -> None:
        with self._index_lock:
            with self._handle_lock:
                if self._leases:  # a reader came in meanwhile: it closes when done
                    self._release_pending = True
                    return
                self._release_pending = False
                handle, self._handle = self._handle, None
                OPEN_SEGMENTS.forget(self)
            self._close_indexes()
            if self.writable:
                self.transaction_index.flush()
        if handle is not None:
            self._close_log(handle)

    def try_release_handles(self) -> bool:
        """Eviction (`engine.log.handles`): close the file and the indexes as `release_handles` does,
        unless the segment is leased or pinned, or another thread holds one of its locks or its
        indexes' at this moment; never waits. In-memory indexes (a read-only segment without
        index files) are kept: they hold no descriptor, and rebuilding them means a scan.
        Returns whether the files were closed."""
        if not self._index_lock.acquire(blocking=False):
            return False
        try:
            if not self._handle_lock.acquire(blocking=False):
                return False
            try:
                if self._leases or self._active or self._writing:
                    return False
                indexes = [index for index in (self._offset_index, self._time_index) if index is not None]
                if indexes and indexes[0].path is not None:
                    if not close_unless_busy(indexes):
                        return False
                    self._indexes_ready = False
                    self._offset_index = self._time_index = None
                handle, self._handle = self._handle, None
                self._release_pending = False
                OPEN_SEGMENTS.forget(self)
            finally:
                self._handle_lock.release()
            if handle is not None:
                self._close_log(handle)
            return True
        finally:
            self._index_lock.release()

    def _close_log(self, handle: int) -> None:
        """Close a `.log` descriptor nobody uses any more, fsyncing it first if written since the
        last fsync (the segment's data stays durable however its descriptors come and go)."""
        try:
            if self._log_dirty and self.writable:
                os.fsync(handle)
                self._log_dirty = False
        finally:
            os.close(handle)

    def close_handlers(self) -> None:
        """Release the files without changing them (fsyncing what was written); the segment
        cannot be opened again. Leases still held keep the `.log` open until they end."""
        with self._handle_lock:
            if self._closed:
                return
            self._closed = True
        self.release_handles()

    def change_file_suffixes(self, old_suffix: str, new_suffix: str) -> None:
        """Rename the segment's files from one suffix to another (`.deleted`, `.swap`, …).
        Under both segment locks: a lazy (re)open finds the files under one name or the other,
        never between; open indexes learn their new names."""
        with self._index_lock, self._handle_lock:
            if self._file_id is None and os.path.lexists(self.log_path):
                stat = os.lstat(self.log_path)  # the file renamed is the one a reopen must find
                self._file_id = (stat.st_dev, stat.st_ino)
            for path in (self.log_path, self.offset_index_path, self.time_index_path, self.transaction_index_path):
                if path.name.endswith(old_suffix) or not old_suffix:
                    target = path.with_name(path.name[: len(path.name) - len(old_suffix)] + new_suffix)
                    if os.path.lexists(path):  # (a rename moves a link itself, never its target)
                        os.replace(path, target)
            self.file_suffix = self.file_suffix[: len(self.file_suffix) - len(old_suffix)] + new_suffix
            self.log_path = log_file(self.directory, self.base_offset, self.file_suffix)
            if self._offset_index is not None:
                self._offset_index.moved_to(self.offset_index_path)
            if self._time_index is not None:
                self._time_index.moved_to(self.time_index_path)
            self.transaction_index.moved_to(self.transaction_index_path)

    def mark_deleted(self) -> None:
        """Rename to `.deleted` (Kafka's asynchronous delete). Readers holding the segment keep
        reading it until `delete_files`: a lease keeps its descriptor, and a segment evicted
        meanwhile reopens its files under the new names (checking it is the same `.log`)."""
        self.deleted = True
        self.change_file_suffixes("", DELETED_SUFFIX)

    def delete_files(self) -> None:
        """Remove the segment's files for good. A reader still iterating it keeps reading the
        unlinked file; its descriptor closes when its lease ends."""
        self.close_handlers()
        for path in (self.log_path, self.offset_index_path, self.time_index_path, self.transaction_index_path):
            path.unlink(missing_ok=True)


def read_cached(fd: int, position: int, length: int) -> bytearray:
    """`length` bytes of the file at `position` (fewer at its end), read only if they are in the
    OS page cache: BlockingIOError when the read would wait for the disk, or when the file
    system cannot tell (no RWF_NOWAIT)."""
    buffer = bytearray(length)
    try:
        read = os.preadv(fd, [buffer], position, os.RWF_NOWAIT)
    except OSError as error:
        if error.errno in (errno.EAGAIN, errno.EOPNOTSUPP, errno.EINVAL):
            raise BlockingIOError(errno.EAGAIN, "not in the page cache") from error
        raise
    if read < length:
        # Short: the file ends, or only part of the range is cached (then it is not cached).
        if position + read < os.fstat(fd).st_size:
            raise BlockingIOError(errno.EAGAIN, "partly in the page cache")
        del buffer[read:]
    return buffer


class _ReadAheadAdvice:
    """Asks the kernel to read ranges of files into the page cache (POSIX_FADV_WILLNEED) from a
    thread of its own. The call allocates the pages and queues their reads itself, which for a
    segment of a GiB takes a good part of the time the disk takes to read it; the scan that asked
    goes on meanwhile, and finds the pages coming in. The thread starts with the first advice and
    lives as long as the process (a daemon, idle on its queue, in a CLI, a mount or a Spark
    executor alike); an advice holds its own descriptor only until it is given. Thread-safe."""

    def __init__(self) -> None:
        self._ranges: queue.SimpleQueue[tuple[int, int, int]] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def read_ahead(self, fd: int, position: int, length: int) -> None:
        """Read `length` bytes of `fd` from `position` ahead (a descriptor of its own: `fd` may be
        closed before the advice is given)."""
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._advise, name="read-ahead advice", daemon=True)
                self._thread.start()
        try:
            own = os.dup(fd)
        except OSError:  # (EMFILE) advice only: the scan reads what it needs either way
            return
        self._ranges.put((own, position, length))

    def _advise(self) -> None:
        while True:
            fd, position, length = self._ranges.get()
            try:
                os.posix_fadvise(fd, position, length, os.POSIX_FADV_WILLNEED)
            except OSError:  # advice only: the scan reads what it needs either way
                pass
            finally:
                os.close(fd)


_ADVICE = _ReadAheadAdvice()


def _batch_header(item: tuple[BatchHeader, memoryview]) -> BatchHeader:
    return item[0]


def _itself(header: BatchHeader) -> BatchHeader:
    return header


def _allocated_past(status: os.stat_result, size: int) -> int:
    """Bytes a file has allocated beyond `size` bytes of data, in whole blocks (its extent
    tree's few blocks count too: far below an allocation ahead)."""
    return status.st_blocks * 512 - -(-size // status.st_blksize) * status.st_blksize
