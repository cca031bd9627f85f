"""Local files whose bytes are fetched from object storage as they are read.

A *placeholder* is a sparse local file of a stored file's size (engine.stored.local_copy lays
out a backup's copy of them; a Spark task makes the one it reads). Registered here by its inode,
it is a `FetchedFile`, which knows which of its CHUNK_BYTES chunks hold the stored bytes. The
segment file (engine.log.file_records) reads a placeholder through `FetchedFile.reading`: the
chunks a read covers are fetched first — one ranged GET per run of missing chunks — and written
into the placeholder, and then the read is done as on any file. So everything that reads a
segment (its iterators, the core's renderers, the mount's views, a Spark task) reads a stored one
unchanged, and only the ranges it reads are fetched; the same range is fetched once while it is
kept. A scan of batches in order (`FetchedFile.scanning`: a task's slice, a consumer's run) takes
READ_AHEAD_BYTES at a time in one request instead, and reads them from memory: bytes a scan reads
once cost no write into the placeholder and no read back.

How much a process keeps is bounded (`FetchBudget`, its size an option of the mount and of
the readers): past it, the least recently read chunks are given back (a hole punched in their
place; a file system that cannot punch has its file emptied instead), and fetched again if read
again. Scans' blocks in memory are SCAN_BLOCKS at most.

Locks: a file's `_lock` is held over a read's fetch and the read itself, so a chunk is never
given back under a read → the budget's lock. Giving back another file's chunks only
try-acquires its lock (a file being read keeps its chunks for now).
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import functools
import logging
import os
import queue
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TypeVar

from seglogfs.engine.files import write_all
from seglogfs.engine.object_store import ObjectReader, ObjectStore, ObjectStoreError

T = TypeVar("T")
logger = logging.getLogger(__name__)

CHUNK_BYTES = 64 << 10  # what is fetched, kept and given back as a unit
READ_AHEAD_BYTES = 8 << 20  # how far ahead of a scan one request fetches (up to where it ends)
DEFAULT_CACHE_BYTES = 1 << 30

_FALLOC_FL_KEEP_SIZE = 0x01
_FALLOC_FL_PUNCH_HOLE = 0x02


@dataclass(frozen=True)
class SegmentSummary:
    """What a backup recorded of a stored `.log`'s first `size` bytes as it read them (whole
    batches): the offset after the last batch, the largest batch timestamp with the last offset
    of the first batch that holds it, and whether any batch is transactional (a transaction's
    data or marker). A reader of the placeholder takes these instead of scanning the segment
    (the log end, a segment's largest timestamp, a read_committed reader's look for
    transactions), so opening a backup's copy and finding offsets by time fetch no segment
    bytes."""

    size: int
    next_offset: int
    max_timestamp: int
    max_timestamp_offset: int
    transactional: bool


class FetchBudget:
    """The chunks all placeholders of a process hold, least recently read first, and how many
    they may hold (`limit_bytes`)."""

    def __init__(self, limit_bytes: int = DEFAULT_CACHE_BYTES) -> None:
        self.limit_bytes = max(limit_bytes, CHUNK_BYTES)
        self._lock = threading.Lock()
        self._chunks: OrderedDict[tuple[FetchedFile, int], None] = OrderedDict()
        self.fetched_bytes = 0  # (over the process's life: what the store was asked for)
        self.requests = 0

    @property
    def held_bytes(self) -> int:
        return len(self._chunks) * CHUNK_BYTES

    def _count(self, fetched: int, requests: int) -> None:
        with self._lock:
            self.fetched_bytes += fetched
            self.requests += requests

    def _read(self, file: FetchedFile, chunks: range) -> list[tuple[FetchedFile, int]]:
        """Chunks of `file` were read (some just fetched): they become the most recent. Returns
        the chunks to give back, oldest first (never one of `chunks`: a read's own chunks stay
        until the next read, so the bound is passed by at most one read's span)."""
        with self._lock:
            for chunk in chunks:
                key = (file, chunk)
                self._chunks[key] = None
                self._chunks.move_to_end(key)
            over = len(self._chunks) - self.limit_bytes // CHUNK_BYTES
            victims = []
            for key in self._chunks:
                if over <= 0:
                    break
                if key[0] is file and key[1] in chunks:
                    continue
                victims.append(key)
                over -= 1
            return victims

    def _given_back(self, file: FetchedFile, chunks: Sequence[int]) -> None:
        with self._lock:
            for chunk in chunks:
                self._chunks.pop((file, chunk), None)


BUDGET = FetchBudget()

SCAN_BLOCKS = 4  # scans' blocks held in memory at once in a process (READ_AHEAD_BYTES each)


class _ScanBlocks:
    """The files whose scan block is in memory, least recently used first: past SCAN_BLOCKS, the
    oldest block is dropped (its scan fetches again)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._files: OrderedDict[FetchedFile, None] = OrderedDict()

    def using(self, file: FetchedFile) -> None:
        with self._lock:
            self._files[file] = None
            self._files.move_to_end(file)
            while len(self._files) > SCAN_BLOCKS:
                oldest, _ = self._files.popitem(last=False)
                oldest.scan_block = None  # (a reader holding it keeps its bytes)


_SCANS = _ScanBlocks()


class _FetchAhead:
    """Ranges of placeholders fetched ahead of a reader that said it will read them (a
    consumer's segment: `FileRecords.advise_read_ahead`), READ_AHEAD_BYTES at a time, from a
    thread of its own; the reader meanwhile reads what is there and fetches itself what is not
    yet. Advice: a failure is the reader's to meet. Thread-safe."""

    def __init__(self) -> None:
        self._ranges: queue.SimpleQueue[tuple[FetchedFile, int, int]] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def fetch(self, file: FetchedFile, position: int, end: int) -> None:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="seglogfs-fetch-ahead", daemon=True)
                self._thread.start()
        self._ranges.put((file, position, end))

    def _run(self) -> None:
        while True:
            file, position, end = self._ranges.get()
            try:
                file.fetch_range(position, end)
            except Exception as error:  # (advice: the reader meets what went wrong itself)
                logger.debug("%s: fetching ahead: %s", file.name, error)


_AHEAD = _FetchAhead()

_REGISTRY: dict[tuple[int, int], FetchedFile] = {}
_REGISTRY_LOCK = threading.Lock()


def register(fetched: FetchedFile) -> FetchedFile:
    """Readers find the placeholder by its inode from now on: register it before anything may
    open it."""
    with _REGISTRY_LOCK:
        _REGISTRY[fetched.file_id] = fetched
    return fetched


def unregister(fetched: FetchedFile) -> None:
    """No new reader finds the placeholder (it is replaced or removed in its copy); readers that
    hold it go on until its `forget`."""
    with _REGISTRY_LOCK:
        if _REGISTRY.get(fetched.file_id) is fetched:
            del _REGISTRY[fetched.file_id]


@contextlib.contextmanager
def whole_file(fd: int) -> Iterator[None]:
    """For a reader that reads a `.log` itself, whole (not through the segment file): when `fd`
    is open on a placeholder, all its bytes are fetched first and none is given back while the
    block runs. Nothing for any other file."""
    fetched = None
    if _REGISTRY:
        status = os.fstat(fd)
        fetched = fetched_file((status.st_dev, status.st_ino))
    if fetched is None:
        yield
        return
    fetched.pin()
    try:
        yield
    finally:
        fetched.unpin()


def fetched_file(file_id: tuple[int, int] | None) -> FetchedFile | None:
    """The placeholder of inode `file_id` (device, inode), None for any other file."""
    if file_id is None or not _REGISTRY:
        return None
    return _REGISTRY.get(file_id)


class FetchedFile:
    """A placeholder and the stored file it stands for (see the module docstring): the
    placeholder of inode `file_id` (device, inode), which has or is about to have the name
    `path` (a regular file of the pieces' total size, made by the caller), holds the stored file
    made of `pieces` (object keys and sizes, in order); `name` is what errors call it; `summary`,
    the backup's of the stored bytes, when it has one."""

    def __init__(
        self,
        path: str,
        file_id: tuple[int, int],
        store: ObjectStore,
        pieces: Sequence[tuple[str, int]],
        name: str,
        *,
        summary: SegmentSummary | None = None,
    ) -> None:
        self.path = path
        self.file_id = file_id
        self.store = store
        self.pieces = tuple(pieces)
        self.name = name
        self.size = sum(size for _, size in self.pieces)
        self._summary = summary
        self._lock = threading.Lock()
        self._present: set[int] = set()  # chunks holding the stored bytes
        self._readers: dict[int, ObjectReader] = {}
        self._gone = False
        # A scan's block: bytes [start, start + len) fetched ahead of a scan and read from memory,
        # not written into the placeholder (a scan reads them once). SCAN_BLOCKS of them at most
        # in the process (`_SCANS`).
        self.scan_block: tuple[int, memoryview] | None = None
        self._retired_fd: int | None = None  # (`retire`: written through it once its name is another's)
        self._pins = 0  # (`pin`: its chunks are not given back while a reader reads it whole)

    def __hash__(self) -> int:
        return id(self)

    def scanning(self, fd: int, position: int, length: int, end_of_scan: int) -> bytes | memoryview:
        """Bytes [position, position + length) for a scan that goes on to `end_of_scan` (its
        reads in order, each read once: a task's slice, a consumer's run): from chunks already
        here, else from a block fetched in one request up to READ_AHEAD_BYTES ahead and kept in
        memory for the scan's next reads (the placeholder is not written: what a scan fetches
        costs no write and read back, and no room in the cache)."""
        end = min(position + max(length, 0), self.size)
        if position >= end:
            return b""
        with self._lock:
            block = self.scan_block
            if block is not None and block[0] <= position and end <= block[0] + len(block[1]):
                return block[1][position - block[0] : end - block[0]]
            if all(chunk in self._present for chunk in self._chunks(position, end)):
                data = os.pread(fd, end - position, position)
            else:
                if self._gone:
                    raise OSError(errno.ESTALE, f"{self.name}: no longer in the backup's copy")
                high = max(end, min(end_of_scan, position + READ_AHEAD_BYTES, self.size))
                kept: bytes | memoryview = b""  # (the block's bytes from `position` on, when the read starts in it)
                if block is not None and block[0] <= position < block[0] + len(block[1]):
                    kept = block[1][position - block[0] :]
                more = self._get(position + len(kept), high)
                BUDGET._count(len(more), 1)
                fetched = memoryview(b"".join((kept, more)) if kept else more)
                self.scan_block = (position, fetched)
                _SCANS.using(self)
                return fetched[: end - position]
        self._after_read(self._chunks(position, end))
        return data

    def reading(self, position: int, length: int, action: Callable[[], T]) -> T:
        """`action()` (a read of bytes [position, position + length) of the placeholder), after
        the chunks it reads were fetched and written in. ObjectStoreError naming the object when
        the store fails the fetch."""
        end = min(position + max(length, 0), self.size)
        try:
            with self._lock:
                if position < end:
                    self._fetch(position, end)
                result = action()
        finally:  # (counted even when a fetch failed part way: what it fetched is held)
            self._after_read(self._chunks(position, end))
        return result

    def fetch_ahead(self, position: int, end: int) -> None:
        """Fetch bytes [position, end) from a thread of its own (advice: see `_FetchAhead`), no
        more than half the budget's bound."""
        end = min(end, self.size, position + BUDGET.limit_bytes // 2)
        if position < end:
            _AHEAD.fetch(self, position, end)

    def fetch_range(self, position: int, end: int) -> None:
        """Bytes [position, end) fetched and written in, READ_AHEAD_BYTES at a time (the lock
        taken for each: readers go on between them)."""
        for start in range(position, end, READ_AHEAD_BYTES):
            stop = min(start + READ_AHEAD_BYTES, end)
            with self._lock:
                if self._gone:
                    return
                self._fetch(start, stop)
            self._after_read(self._chunks(start, stop))

    def present(self, position: int, length: int, action: Callable[[], T]) -> T:
        """`action()` if the bytes [position, position + length) are here, without fetching
        them (BlockingIOError when they are not: a read on an event loop must not wait)."""
        end = min(position + max(length, 0), self.size)
        with self._lock:
            if any(chunk not in self._present for chunk in self._chunks(position, end)):
                raise BlockingIOError(errno.EAGAIN, f"{self.name}: not fetched from the store yet")
            return action()

    def summary(self, size: int) -> SegmentSummary | None:
        """The backup's summary of the stored bytes, when it covers exactly the first `size`
        bytes (what the reader's segment holds: a summary of another length says nothing)."""
        summary = self._summary
        return summary if summary is not None and summary.size == size else None

    @staticmethod
    def _chunks(position: int, end: int) -> range:
        return range(position // CHUNK_BYTES, (end - 1) // CHUNK_BYTES + 1) if position < end else range(0)

    # -- fetching (under _lock) --------------------------------------------------------------------
    def _fetch(self, position: int, end: int) -> None:
        missing = [chunk for chunk in self._chunks(position, end) if chunk not in self._present]
        if not missing:
            return
        if self._gone:
            raise OSError(errno.ESTALE, f"{self.name}: no longer in the backup's copy")
        runs: list[list[int]] = []
        for chunk in missing:
            if runs and runs[-1][-1] + 1 == chunk:
                runs[-1].append(chunk)
            else:
                runs.append([chunk])
        fd = self._open()
        fetched = 0
        try:
            for run in runs:
                low = run[0] * CHUNK_BYTES
                high = min((run[-1] + 1) * CHUNK_BYTES, self.size)
                data = self._get(low, high)
                write_all(fd, data, low)
                self._present.update(run)
                fetched += len(data)
        except OSError as error:
            if isinstance(error, ObjectStoreError) or error.errno not in (errno.ENOSPC, errno.EDQUOT):
                raise
            raise OSError(
                error.errno,
                f"{self.path}: no room for what is fetched from the store ({error.strerror}; a reader's "
                "local copy is in TMPDIR: give it a file system with room, or a smaller cache)",
            ) from None
        finally:
            os.close(fd)
        BUDGET._count(fetched, len(runs))

    def retire(self) -> None:
        """The placeholder is about to be replaced or removed in its copy (a newer backup run
        compacted or deleted the segment): readers that hold it open go on reading it, as a
        reader of a data dir holds a segment a writer removed, through a descriptor opened now
        (its objects stay in the store for one more run), until `forget`. The caller unregisters
        it once another file has its name (a reader opening the name meanwhile finds it)."""
        with self._lock:
            if self._retired_fd is not None or self._gone:
                return
            try:
                fd = os.open(self.path, os.O_WRONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
            except OSError:
                return
            status = os.fstat(fd)
            if (status.st_dev, status.st_ino) == self.file_id:
                self._retired_fd = fd
            else:
                os.close(fd)

    def _open(self) -> int:
        """The placeholder, for writing what was fetched; ESTALE when another file has its
        name now (the copy replaced it) and it was not retired."""
        if self._retired_fd is not None:
            return os.dup(self._retired_fd)
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
        except FileNotFoundError:
            raise OSError(errno.ESTALE, f"{self.name}: no longer in the backup's copy") from None
        status = os.fstat(fd)
        if (status.st_dev, status.st_ino) != self.file_id:
            os.close(fd)
            raise OSError(errno.ESTALE, f"{self.name}: replaced in the backup's copy")
        return fd

    def _get(self, low: int, high: int) -> bytes:
        """The stored bytes [low, high), from the pieces that hold them (a ranged GET each)."""
        out = []
        start = 0
        for index, (key, size) in enumerate(self.pieces):
            lo, hi = max(low, start), min(high, start + size)
            if lo < hi:
                out.append(self._reader(index, key, size).read(lo - start, hi - lo))
            start += size
            if start >= high:
                break
        data = b"".join(out)
        if len(data) != high - low:
            raise ObjectStoreError(f"{self.name}: the store gave {len(data)} bytes at {low}, {high - low} asked")
        return data

    def _reader(self, index: int, key: str, size: int) -> ObjectReader:
        reader = self._readers.get(index)
        if reader is None:
            try:
                reader = self.store.open(key)
            except FileNotFoundError:
                raise ObjectStoreError(
                    f"{self.store.name(key)}: no such object (the backup's catalogue names it)"
                ) from None
            if reader.size != size:
                reader.close()
                raise ObjectStoreError(
                    f"{self.store.name(key)}: {reader.size} bytes, the backup's catalogue says {size}"
                )
            self._readers[index] = reader
        return reader

    # -- giving back ---------------------------------------------------------------------------------
    def _after_read(self, touched: range) -> None:
        if not touched:
            return
        victims = BUDGET._read(self, touched)
        by_file: dict[FetchedFile, list[int]] = {}
        for file, chunk in victims:
            by_file.setdefault(file, []).append(chunk)
        for file, chunks in by_file.items():
            file._give_back(chunks)

    def _give_back(self, chunks: list[int]) -> None:
        if not self._lock.acquire(blocking=False):
            return  # (being read: asked again after the next read)
        try:
            if self._pins:
                return
            held = [chunk for chunk in chunks if chunk in self._present]
            self._present.difference_update(chunks)  # (before the holes: never present and a hole)
            if held and not self._gone:
                try:
                    fd = self._open()
                except OSError as error:
                    if error.errno in (errno.ESTALE, errno.ENOENT):
                        self._gone = True
                    return  # (kept on disk, uncounted: what a fetch writes there again is the same)
                try:
                    self._punch(fd, held)
                except OSError as error:  # (the bytes stay: a reader's read is not failed for it)
                    logger.debug("%s: giving back fetched bytes: %s", self.path, error)
                finally:
                    os.close(fd)
        finally:
            self._lock.release()
            BUDGET._given_back(self, chunks)

    def _punch(self, fd: int, chunks: list[int]) -> None:
        for chunk in chunks:
            if _punch_hole(fd, chunk * CHUNK_BYTES, CHUNK_BYTES):
                continue
            # (no hole punching here: the file is emptied, all its chunks given back)
            os.ftruncate(fd, 0)
            os.ftruncate(fd, self.size)
            dropped = sorted(self._present)
            self._present.clear()
            BUDGET._given_back(self, dropped)
            return

    def pin(self) -> None:
        """Fetch every byte, and give none back until as many `unpin`s (a reader that reads the
        file itself, past these hooks)."""
        with self._lock:
            self._pins += 1
            try:
                self._fetch(0, self.size)
            except BaseException:
                self._pins -= 1
                raise
        self._after_read(self._chunks(0, self.size))  # (counted in the budget: none is given back while pinned)

    def unpin(self) -> None:
        with self._lock:
            self._pins -= 1

    def grow(self, pieces: Sequence[tuple[str, int]], summary: SegmentSummary | None = None) -> None:
        """The stored file grew: `pieces` are its pieces now (the old ones first, unchanged), and
        the placeholder is made that long here, under the lock (a reader never finds the new
        size before the new pieces); `summary`, the backup's of the longer file. The chunk that
        held its old end is fetched again."""
        with self._lock:
            if self.pieces != tuple(pieces[: len(self.pieces)]):
                raise ValueError(f"{self.name}: not grown from the pieces it had")
            if self.size % CHUNK_BYTES:
                self._present.discard(self.size // CHUNK_BYTES)
            self.pieces = tuple(pieces)
            self.size = sum(size for _, size in self.pieces)
            self._summary = summary
            fd = self._open()
            try:
                os.ftruncate(fd, self.size)
            finally:
                os.close(fd)

    def forget(self) -> None:
        """The placeholder is done with: no more fetches (ESTALE), its chunks uncounted."""
        unregister(self)
        with self._lock:
            self._gone = True
            self.scan_block = None
            if self._retired_fd is not None:
                os.close(self._retired_fd)
                self._retired_fd = None
            dropped = sorted(self._present)
            self._present.clear()
            for reader in self._readers.values():
                reader.close()
            self._readers.clear()
        BUDGET._given_back(self, dropped)


@functools.cache
def _fallocate() -> Callable[[int, int, int, int], int]:
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    call = libc.fallocate
    call.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
    call.restype = ctypes.c_int
    return call


def _punch_hole(fd: int, offset: int, length: int) -> bool:
    """Free the blocks of [offset, offset + length) of the file (they read as zeros, the size
    stays); False where the file system cannot."""
    if _fallocate()(fd, _FALLOC_FL_PUNCH_HOLE | _FALLOC_FL_KEEP_SIZE, offset, length) == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.EOPNOTSUPP, errno.ENOSYS):
        return False
    raise OSError(code, os.strerror(code))
