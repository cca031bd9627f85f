"""One log segment: a `.log` file of record batches and its two sparse indexes (and its
`.txnindex` when a transaction aborted in it: engine.log.transaction_index).

The `.log` file (engine.log.file_records.FileRecords, which a segment extends: reading batches
by position, the descriptor's leases and eviction) is named for the segment's base offset.
Appends are v2, after whatever the segment holds (legacy messages, in an old broker's
segments). The segment appends whole batches and keeps Kafka's index rules:

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

Open files: a segment opens its `.log` (FileRecords) and its indexes on first use and gives them
back together when the process holds too many, or when it is released or closed. Pinned, never
evicted: the active segment, and a new one still being written (a `.cleaned` segment, until
sealed). A segment marked deleted is not pinned (a retention pass may remove thousands at once):
evicted, it reopens its files under their `.deleted` names until `delete_files`, checking it is
the same `.log`.

Locks, in order: `_index_lock` (an RLock: opening, checking and recovering the indexes, closing
them, renaming the files) → FileRecords' `_handle_lock` (the descriptor, the lease count, the
pending release) → the cache's lock (`engine.log.handles`) and each index's own lock. Eviction
only ever try-acquires a segment's locks, and skips the segment when one is taken.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from seglogfs.engine.errors import CorruptIndexError, CorruptRecordError, OffsetOverflowError
from seglogfs.engine.files import write_all
from seglogfs.engine.log.file_records import ALLOCATE_AHEAD_BYTES, FileRecords, allocated_past
from seglogfs.engine.log.handles import OPEN_SEGMENTS, opening
from seglogfs.engine.log.index import INT32_MAX, close_unless_busy
from seglogfs.engine.log.naming import (
    DELETED_SUFFIX,
    TXN_INDEX_SUFFIX,
    filename_prefix_from_offset,
    log_file,
    offset_index_file,
    time_index_file,
)
from seglogfs.engine.log.offset_index import OffsetIndex
from seglogfs.engine.log.time_index import TimeIndex, TimestampOffset
from seglogfs.engine.log.transaction_index import TransactionIndex
from seglogfs.engine.record.columns import record_columns
from seglogfs.engine.record.records import NO_TIMESTAMP, BatchHeader, check_batch, plausible_record_count

log = logging.getLogger(__name__)
# Given what recovery is about to cut: (the .log's path, its descriptor, the cut position, the
# size, the offset the log ends at after the cut). See engine.log.set_aside.
KeepTail = Callable[[Path, int, int, int, int], object]


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


class LogSegment(FileRecords):
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
        self.created_ms = created_ms
        self.roll_jitter_ms = roll_jitter_ms
        self.file_suffix = file_suffix
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
        # Read-only: where the scan for complete batches another process appended resumes.
        self._complete_to: int | None = None
        self._followed_next_offset: int | None = None
        # The `.log` is opened on first use (a data dir of many segments opens in no time and
        # holds descriptors only for the segments in use; Kafka keeps every one open).
        super().__init__(log_file(directory, base_offset, file_suffix), writable=writable)

    def __repr__(self) -> str:
        return f"LogSegment({self.log_path}, size={self._size})"

    # -- files --------------------------------------------------------------------------------
    @property
    def evictable(self) -> bool:
        """Whether the cache may ask for this segment's files now: not leased and not pinned (a
        hint, read without locks; `try_release_handles` decides)."""
        return super().evictable and not self._active

    @property
    def handles_open(self) -> bool:
        """Whether the `.log` or a file-backed index is open now."""
        return super().handles_open or any(
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
        summary = self.stored_summary(self._size_on_disk()) if self._fetched is not None else None
        if summary is not None:  # (a stored segment's end, from its backup: no scan of its tail)
            self._complete_to, self._followed_next_offset = summary.size, summary.next_offset
            self._size = summary.size
            with self._index_lock:
                known = self._max_timestamp_so_far
                if known is None or summary.max_timestamp > known.timestamp:
                    self._max_timestamp_so_far = TimestampOffset(summary.max_timestamp, summary.max_timestamp_offset)
            return summary.size
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

    @property
    def followed_next_offset(self) -> int:
        """Read-only, after `refresh_size`: the offset after the last complete batch found."""
        return self.base_offset if self._followed_next_offset is None else self._followed_next_offset

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
            data = self._pread(handle, length, header.position) if length > 0 else b""
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

    def offset_for_timestamp_bound(self, timestamp: int, starting_offset: int) -> int:
        """A lower bound of the offset `find_offset_by_timestamp` finds, from the indexes alone
        (no batch is read): the first offset the batch its scan starts at can hold — one past
        the offset-index entry before the one it starts from (an entry holds its batch's last
        offset), or the segment's base offset."""
        self._lease()
        try:
            entry = self.time_index.lookup(timestamp)
            start = self.offset_index.lookup(max(entry.offset, starting_offset))
            if start.position == 0:
                return max(self.base_offset, starting_offset)
            return max(self.offset_index.lookup(start.offset - 1).offset + 1, starting_offset)
        finally:
            self._unlease()

    # -- timestamps -----------------------------------------------------------------------------
    def _load_max_timestamp(self) -> TimestampOffset:
        """(max timestamp, its offset) over the segment: the time index's last entry, then a scan
        of the batches after the offset it points at (Kafka's loadLargestTimestamp)."""
        self._lease()
        try:
            summary = self.stored_summary()
            if summary is not None:  # (a stored segment's, from its backup: no scan of its tail)
                return TimestampOffset(summary.max_timestamp, summary.max_timestamp_offset)
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
        return 0 <= offset - self.base_offset <= INT32_MAX

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
            if allocated_past(before, valid_bytes) >= ALLOCATE_AHEAD_BYTES:
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
            summary = self.stored_summary()
            if summary is not None and summary.next_offset >= self.base_offset:
                return summary.next_offset  # (a stored segment's, from its backup: no scan of its tail)
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
        self.flush_file()
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
        descriptor = self.take_file_flush()
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
        super().release_handles()

    def _release_now(self) -> None:
        with self._index_lock:
            released, handle = self._give_back_handle()
            if not released:
                return
            self._close_indexes()
            if self.writable:
                self.transaction_index.flush()
        if handle is not None:
            self._close_log(handle)

    def try_release_handles(self) -> bool:
        """Eviction (`engine.log.handles`): close the file and the indexes as `release_handles`
        does, unless the segment is leased or pinned, or another thread holds one of its locks or
        its indexes' at this moment; never waits. In-memory indexes (a read-only segment without
        index files) are kept: they hold no descriptor, and rebuilding them means a scan.
        Returns whether the files were closed."""
        if not self._index_lock.acquire(blocking=False):
            return False
        try:
            return super().try_release_handles()
        finally:
            self._index_lock.release()

    def _release_other_files(self) -> bool:
        indexes = [index for index in (self._offset_index, self._time_index) if index is not None]
        if indexes and indexes[0].path is not None:
            if not close_unless_busy(indexes):
                return False
            self._indexes_ready = False
            self._offset_index = self._time_index = None
        return True

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
