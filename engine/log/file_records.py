"""A segment's `.log` file: a sequence of record batches (Kafka's FileRecords).

The file is a plain sequence of v2 batches (see `engine.record.records`); a segment a broker wrote
before Kafka 0.11 holds legacy messages (magic 0 or 1, see `engine.record.legacy`) instead, or
first, which read as batches of their own (`LegacyBatchHeader`) and may be shorter than a v2
header. `FileRecords` reads them by position: whole batches or their headers alone, checked or
not, in large reads, from the page cache only for an event loop (`nowait`), with the kernel
asked to read ahead of a long scan. What positions mean in offsets — the indexes, appends, roll,
recovery — is the segment's (engine.log.segment.LogSegment, which extends this).

Open files: the `.log` is opened on first use and given back when the process holds too many
(`engine.log.handles`: a process-wide LRU with a budget derived from the descriptor limit), or
when it is released or closed; it reopens on next use. Every method that uses the descriptor
holds a *lease* for as long as it does (an iterator: until it is exhausted or closed): a leased
file is never evicted, and `release_handles`, `close_handlers` and a segment's `delete_files` on
a leased file only mark it, the file closing when the last lease ends. So a descriptor is never
closed under a `pread` (EBADF, or a read of whatever file reused the number). Never evicted
either, pinned: a file this object created, until it is sealed (`_writing`). A reopen checks it
found the file it had open, or renamed (device and inode): a name another file has since taken
is ESTALE, not that file's bytes.

Locks: `_handle_lock` (the descriptor, the lease count, the pending release) → the cache's lock
(`engine.log.handles`). A segment takes its own index lock before this one. Eviction only ever
try-acquires them, and skips the file when one is taken.
"""

from __future__ import annotations

import errno
import mmap
import os
import queue
import struct
import threading
from collections.abc import Callable, Generator, Iterator
from pathlib import Path
from typing import TypeVar

from seglogfs.engine import _core
from seglogfs.engine.errors import CorruptRecordError, UnsafeFileError, UnsupportedFormatError
from seglogfs.engine.fetched_files import FetchedFile, SegmentSummary, fetched_file
from seglogfs.engine.files import check_regular, open_regular
from seglogfs.engine.log.handles import OPEN_SEGMENTS, opening
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
)

T = TypeVar("T")
_READ_CHUNK_BYTES = 4 * 1024 * 1024
# iter_headers: after two batches of at most _SMALL_BATCH_BYTES in a row it reads a window of
# the headers that follow, from _FIRST_WINDOW_BYTES up to _HEADER_WINDOW_BYTES; else a header.
_FIRST_WINDOW_BYTES = 4 * 1024
_HEADER_WINDOW_BYTES = 64 * 1024
_SMALL_BATCH_BYTES = 8 * 1024
_MIN_BATCH_LENGTH = BATCH_OVERHEAD_BYTES - LOG_OVERHEAD_BYTES
# An append of at least this many bytes has its blocks allocated first where that makes the
# write faster (_core.allocate_ahead; ext4: the gain passes the call's cost at about 96 KiB).
ALLOCATE_AHEAD_BYTES = 128 * 1024


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


class FileRecords:
    """A `.log` file of record batches, read by position. See the module docstring."""

    def __init__(self, log_path: Path, *, writable: bool) -> None:
        """The file at `log_path`, opened on first use; created now when `writable` and missing
        (pinned open until sealed: `_writing`). FileNotFoundError when read-only and missing;
        UnsafeFileError when a link, a FIFO or a directory has its name (checked with lstat,
        before anything opens it)."""
        self.log_path = log_path
        self.writable = writable
        self._handle: int | None = None
        self._handle_lock = threading.Lock()
        self._leases = 0
        self._release_pending = False
        self._closed = False
        # Appended to or cut since the last fsync: a release or an eviction fsyncs first.
        self._log_dirty = False
        # Whether large appends allocate their blocks first (asked of the file system once).
        self._allocates_ahead: bool | None = None
        # (st_dev, st_ino) of the file once opened or renamed: a reopen must find that file.
        self._file_id: tuple[int, int] | None = None
        # A file this object created takes appends until it is sealed: pinned until then.
        self._writing = False
        # Batches below this position passed a `checked_batches(once=True)` check (each view's
        # first measure reads the segment: the CRCs are computed once). Cut back with the file.
        self._verified_to = 0
        # A placeholder whose bytes are fetched from object storage as they are read
        # (engine.fetched_files): found by the file's identity when it is opened read-only.
        self._fetched: FetchedFile | None = None
        try:
            stat = os.lstat(log_path)
            check_regular(log_path, stat.st_mode)
            self._size = stat.st_size
            if not writable:  # (a writer's compaction may replace the file: see `replaced_on_disk`)
                self._file_id = (stat.st_dev, stat.st_ino)
                self._fetched = fetched_file(self._file_id)
        except FileNotFoundError:
            if not writable:
                raise
            self._size = 0
            self._writing = True
            self._lease()  # create it now
            self._unlease()

    def __repr__(self) -> str:
        return f"FileRecords({self.log_path}, size={self._size})"

    @classmethod
    def open_for_reading(cls, log_path: Path, file_id: tuple[int, int]) -> FileRecords:
        """A sealed `.log`, open, for reading its batches by position (positions another process
        found, as a Spark task's come from planning): the file must be the one `file_id` names
        ((st_dev, st_ino)). FileNotFoundError when it is not there any more, OSError ESTALE when
        another file took its name, UnsafeFileError when that is no regular file; the caller
        `close`s it."""
        records = cls(log_path, writable=False)
        records._file_id = file_id
        records._lease()  # (opened now: its identity is checked here, not at the first read)
        records._unlease()
        return records

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
            if not self.writable:  # (a reopen keeps what it had: the copy may have unregistered it)
                self._fetched = fetched_file(file_id) or self._fetched
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
        """Whether the cache may ask for the file now: not leased and not pinned (a hint, read
        without locks; `try_release_handles` decides)."""
        return not (self._leases or self._writing)

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
        """Whether the file is open now."""
        return self._handle is not None

    @property
    def size(self) -> int:
        """Bytes of batches in the `.log` file."""
        return self._size

    def _size_on_disk(self) -> int:
        with self._handle_lock:  # an open descriptor cannot be closed meanwhile
            handle = self._handle
            if handle is not None:
                return os.fstat(handle).st_size
        return os.lstat(self.log_path).st_size

    def replaced_on_disk(self) -> bool:
        """Read-only: whether the `.log` at this segment's name is no longer the file it opened
        (another process's compaction swapped it in, or retention renamed it away)."""
        try:
            stat = os.lstat(self.log_path)  # (a link put in its place is another file: refused at reopen)
        except FileNotFoundError:
            return True
        return self._file_id is not None and (stat.st_dev, stat.st_ino) != self._file_id

    # -- reading ------------------------------------------------------------------------------
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
                    view = memoryview(self._read_cached(handle, position, end - position))
                else:
                    view = memoryview(self._scan_read(handle, min(_READ_CHUNK_BYTES, end - position), position, end))
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
                    whole = memoryview(self._pread(handle, header.size_in_bytes, position))
                    if len(whole) < header.size_in_bytes:
                        return
                    if isinstance(header, LegacyBatchHeader):
                        header = BatchHeader.parse(whole, 0, position)
                    yield header, whole
                    offset = header.size_in_bytes
                position += offset
        finally:
            self._unlease()

    def with_descriptor(self, work: Callable[[int], T], position: int, end_position: int, *, nowait: bool = False) -> T:
        """`work(fd)` with the `.log` file's descriptor, held open until it returns (for a call
        of the core that reads the file itself), reading bytes [position, end_position) of it:
        a stored segment's are fetched first, or with `nowait` (work that reads only from the
        page cache) must have been (BlockingIOError). OSError when the segment is closed."""
        handle = self._lease()
        try:
            fetched = self._fetched
            if fetched is None:
                return work(handle)
            if nowait:
                return fetched.present(position, end_position - position, lambda: work(handle))
            return fetched.reading(position, end_position - position, lambda: work(handle))
        finally:
            self._unlease()

    def stored_summary(self, size: int | None = None) -> SegmentSummary | None:
        """A stored segment's summary from its backup (engine.fetched_files.SegmentSummary) when
        it covers the first `size` bytes (default: what the file holds now): what saves a scan
        of its tail. None for any other file."""
        fetched = self._fetched
        return fetched.summary(self._size if size is None else size) if fetched is not None else None

    def _pread(self, handle: int, length: int, position: int) -> bytes:
        """`os.pread` of the leased descriptor; a stored segment's bytes fetched first."""
        fetched = self._fetched
        if fetched is None:
            return os.pread(handle, length, position)
        return fetched.reading(position, length, lambda: os.pread(handle, length, position))

    def _scan_read(self, handle: int, length: int, position: int, end: int) -> bytes | memoryview:
        """`_pread` for a scan in order up to `end` (`_batches_from`): a stored segment's bytes
        fetched ahead of it into memory (engine.fetched_files: `FetchedFile.scanning`)."""
        fetched = self._fetched
        if fetched is None:
            return os.pread(handle, length, position)
        return fetched.scanning(handle, position, length, end)

    def _read_cached(self, handle: int, position: int, length: int) -> bytearray:
        """`read_cached`; of a stored segment, only bytes already fetched."""
        fetched = self._fetched
        if fetched is None:
            return read_cached(handle, position, length)
        return fetched.present(position, length, lambda: read_cached(handle, position, length))

    def advise_read_ahead(self, position: int, end_position: int | None = None) -> None:
        """Have the kernel read the file from `position` up to `end_position` (default: the size
        now) into the page cache, from a thread of its own, for a scan about to read it in
        pieces (`iter_headers`, then the batches). Advice only: nothing when it cannot be given.
        Thread-safe."""
        end = self._size if end_position is None else end_position
        if self._fetched is not None:  # (a stored segment's bytes are fetched ahead instead)
            self._fetched.fetch_ahead(position, end)
            return
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
            head = self._pread(handle, LOG_OVERHEAD_BYTES, position)
            if len(head) < LOG_OVERHEAD_BYTES:
                return False
            size = int.from_bytes(head[8:12], "big", signed=True)
            if not 14 <= size <= self._size - position - LOG_OVERHEAD_BYTES:
                return False
            return is_legacy_message(self._pread(handle, LOG_OVERHEAD_BYTES + size, position))
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
            batch = self._pread(handle, header.size_in_bytes, header.position)
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
                head = self._pread(handle, LOG_OVERHEAD_BYTES, position)
                size = int.from_bytes(head[8:12], "big", signed=True)
                entry = self._pread(handle, LOG_OVERHEAD_BYTES + size, position)
            finally:
                self._unlease()
            problem = LegacyBatchHeader.parse_message(entry, 0, position).problem
            raise UnsupportedFormatError(
                f"{self.log_path}: legacy message (magic 0 or 1) at position {position} cannot be read: "
                f"{problem or 'not a message set'}; the data is left untouched"
            )

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
                        memoryview(self._pread(handle, min(wanted, end - position), position)),
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
                    whole = self._pread(handle, header.size_in_bytes, position)
                    if len(whole) < header.size_in_bytes:
                        return
                    header = BatchHeader.parse(whole, 0, position)
                yield header
                headers_read += 1
                small_run = small_run + 1 if header.size_in_bytes <= _SMALL_BATCH_BYTES else 0
                position = header.next_position
        finally:
            self._unlease()

    # -- writing and closing --------------------------------------------------------------------
    def _allocate_ahead(self, handle: int, position: int, length: int) -> None:
        """Have a large append's blocks allocated before it is written, where that makes the
        write faster (`_core.allocate_ahead`). Advice: a write it could not help (ENOSPC, EIO)
        fails on its own, and what a failed write leaves allocated past the end, its cut frees."""
        if length < ALLOCATE_AHEAD_BYTES:
            return
        if self._allocates_ahead is None:
            self._allocates_ahead = _core.allocates_ahead(handle)
        if self._allocates_ahead and _core.allocate_ahead(handle, position, length) == errno.EOPNOTSUPP:
            self._allocates_ahead = False  # (ext2 or ext3: ext4's magic number, not its fallocate)

    def flush_file(self) -> None:
        """fsync what was written since the last fsync (a release or an eviction fsyncs what it
        closes)."""
        if self._log_dirty:
            handle = self._lease()
            try:
                os.fsync(handle)
                self._log_dirty = False
            finally:
                self._unlease()

    def take_file_flush(self) -> int | None:
        """`flush_file` left to the caller (a roll's, on a thread of its own): a duplicate of the
        descriptor when batches were written since the last fsync, which the caller fsyncs and
        closes (counted flushed from now on), else None."""
        if not self._log_dirty:
            return None
        handle = self._lease()
        try:
            descriptor = os.dup(handle)
            self._log_dirty = False
        finally:
            self._unlease()
        return descriptor

    def release_handles(self) -> None:
        """Close the file (fsyncing what was written since the last fsync); it reopens on next
        use. While a reader holds a lease this only marks it, and the last lease to end closes
        it: it never waits for readers (the writer may call it under the partition lock)."""
        with self._handle_lock:
            if self._leases:
                self._release_pending = True
                return
        self._release_now()

    def _release_now(self) -> None:
        released, handle = self._give_back_handle()
        if released and handle is not None:
            self._close_log(handle)

    def _give_back_handle(self) -> tuple[bool, int | None]:
        """Take the descriptor out of use, unless a lease holds it (the last lease then releases
        it: pending); returns whether it was taken, and the descriptor (None: not open)."""
        with self._handle_lock:
            if self._leases:  # a reader came in meanwhile: it closes when done
                self._release_pending = True
                return False, None
            self._release_pending = False
            handle, self._handle = self._handle, None
            OPEN_SEGMENTS.forget(self)
        return True, handle

    def try_release_handles(self) -> bool:
        """Eviction (`engine.log.handles`): close the file as `release_handles` does, unless it
        is leased or pinned, or another thread holds its lock at this moment; never waits.
        Returns whether the files were closed."""
        if not self._handle_lock.acquire(blocking=False):
            return False
        try:
            if not self.evictable or not self._release_other_files():
                return False
            handle, self._handle = self._handle, None
            self._release_pending = False
            OPEN_SEGMENTS.forget(self)
        finally:
            self._handle_lock.release()
        if handle is not None:
            self._close_log(handle)
        return True

    def _release_other_files(self) -> bool:
        """What else eviction closes with the file, under its lock (a segment's index files),
        unless busy: whether it did. Nothing here."""
        return True

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
        """Release the file without changing it (fsyncing what was written); it cannot be
        opened again. Leases still held keep the `.log` open until they end."""
        with self._handle_lock:
            if self._closed:
                return
            self._closed = True
        self.release_handles()

    def close(self) -> None:
        """`close_handlers`: the file is released and cannot be opened again."""
        self.close_handlers()


def batch_header_at(path: Path, position: int) -> BatchHeader | None:
    """The header of the batch at `position` of the `.log` file at `path`, read through a
    descriptor of its own (an open segment's is not touched); a legacy message's too. None where
    the file holds no whole header there, is not a regular file (a link or a FIFO put there: refused, not read), or
    cannot be read."""
    try:
        fd = open_regular(path)
        try:
            status = os.fstat(fd)
            fetched = fetched_file((status.st_dev, status.st_ino))  # (a stored segment's placeholder)
            if fetched is None:
                data = os.pread(fd, BATCH_OVERHEAD_BYTES, position)
            else:
                data = fetched.reading(
                    position, BATCH_OVERHEAD_BYTES, lambda: os.pread(fd, BATCH_OVERHEAD_BYTES, position)
                )
        finally:
            os.close(fd)
    except (OSError, UnsafeFileError):
        return None
    if not _header_fits(data, 0):
        return None
    try:
        return BatchHeader.parse(data, 0, position)
    except (ValueError, struct.error):  # (a legacy message's header that does not hold)
        return None


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


def allocated_past(status: os.stat_result, size: int) -> int:
    """Bytes a file has allocated beyond `size` bytes of data, in whole blocks (its extent
    tree's few blocks count too: far below an allocation ahead)."""
    return status.st_blocks * 512 - -(-size // status.st_blksize) * status.st_blksize
