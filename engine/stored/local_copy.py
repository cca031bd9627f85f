"""A backup in object storage read where it is: its newest complete run laid out in a local
directory as the data dir it copies, for everything that reads a data dir (the CLI's readers,
a read-only mount, Spark's planning).

Every file but the segments' `.log`s is fetched whole (indexes, checkpoints, producer snapshots,
`meta.properties`: what a reader opens first, small beside the logs); each `.log` is a sparse
*placeholder* of its size whose bytes are fetched as they are read (engine.fetched_files), so a
reader fetches the indexes and the byte ranges it reads, and nothing else.

`refresh()` moves the copy to the newest complete run the way a writer changes a data dir: a
`.log` that grew is made longer in place; a file that changed otherwise (a compacted segment, a
rewritten checkpoint) is replaced by a rename; new files appear (a segment's indexes before its
`.log`) and removed ones go (a segment's `.log` first). A read-only open of the copy follows it as
it follows a broker writing.

A copy may lay out only some partitions (`Partitions`: a Spark query's subscription): the
others' directories and files are left out, and nothing of them is fetched; `want` adds more to
it. The metadata log's partition and the files outside partitions (checkpoints,
`meta.properties`) are always laid out.

The directory is this process's: a temporary one, removed by `close`.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import os
import re
import shutil
import tempfile
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path

from seglogfs.engine.fetched_files import FetchedFile, register, unregister
from seglogfs.engine.files import write_all
from seglogfs.engine.log.file_records import FileRecords
from seglogfs.engine.log.naming import LOG_SUFFIX, parse_partition_dir
from seglogfs.engine.object_store import ObjectStore, ObjectStoreError, open_object_store
from seglogfs.engine.stored.catalogue import (
    Catalogue,
    FileAttributes,
    StoredFile,
    StoredFileReader,
    catalogue_runs,
    read_catalogue,
)

FETCHES_AT_ONCE = 8  # small files fetched at once while a run is laid out

FOLLOW_INTERVAL_S = 2.0  # how often a follower (consume --follow, a mount) looks for a newer run


def private_directory(kind: str) -> Path:
    """A new temporary directory of this process's, `KIND-PID-…`; first, those of processes that
    are gone are removed (a Spark Python worker ends without running exit handlers)."""
    scratch = Path(tempfile.gettempdir())
    with contextlib.suppress(OSError), os.scandir(scratch) as entries:
        for entry in entries:
            match = re.fullmatch(rf"{re.escape(kind)}-(\d+)-\w+", entry.name)
            if match is None or not entry.is_dir(follow_symlinks=False):
                continue
            if entry.stat(follow_symlinks=False).st_uid != os.geteuid() or _alive(int(match.group(1))):
                continue
            shutil.rmtree(entry.path, ignore_errors=True)
    return Path(tempfile.mkdtemp(prefix=f"{kind}-{os.getpid()}-"))


def _alive(pid: int) -> bool:
    """Whether process `pid` runs (a zombie, killed but not yet reaped, does not)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as status:
            return status.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except FileNotFoundError:
        return False
    except (OSError, IndexError):
        return True  # (cannot tell: its directory stays)


def _own(target: int | Path, attributes: FileAttributes) -> None:
    """As root, a file or directory of the copy gets the owner the backup's source gave it, as
    its mode (a mount of the copy shows each node's owner and mode as the data dir's, and the
    kernel checks other users' requests against them: the copy is as open as the source was)."""
    if attributes.owner is None or os.geteuid() != 0:
        return
    if isinstance(target, Path):
        os.chown(target, *attributes.owner, follow_symlinks=False)
    else:
        os.fchown(target, *attributes.owner)


def _is_log(path: str) -> bool:
    return path.endswith(LOG_SUFFIX) and "/" in path  # (a segment's, in a partition dir)


METADATA_TOPIC = "__cluster_metadata"  # (topic configs and ids: every reader of a copy needs it)


@dataclass(frozen=True)
class Partitions:
    """Which partitions a copy lays out: those of `topics`, of topics a regular expression of
    `patterns` finds (`re.search`, as Spark's subscribePattern) and `partitions`; every one with
    `everything`. The metadata log's is always laid out."""

    topics: frozenset[str] = frozenset()
    patterns: frozenset[str] = frozenset()
    partitions: frozenset[tuple[str, int]] = frozenset()
    everything: bool = False

    def wants(self, topic: str, partition: int) -> bool:
        return (
            self.everything
            or topic == METADATA_TOPIC
            or topic in self.topics
            or (topic, partition) in self.partitions
            or any(re.search(pattern, topic) for pattern in self.patterns)
        )

    def covers(self, other: Partitions) -> bool:
        """Whether every partition `other` wants is wanted here, whatever the backup holds."""
        if self.everything:
            return True
        return (
            not other.everything
            and other.topics <= self.topics
            and other.patterns <= self.patterns
            and all(topic in self.topics or (topic, p) in self.partitions for topic, p in other.partitions)
        )

    def union(self, other: Partitions) -> Partitions:
        return Partitions(
            self.topics | other.topics,
            self.patterns | other.patterns,
            self.partitions | other.partitions,
            self.everything or other.everything,
        )


EVERY_PARTITION = Partitions(everything=True)


class LocalCopy:
    """The newest complete run of the backup in `store`, laid out below `directory`. See the
    module docstring."""

    def __init__(self, store: ObjectStore, directory: Path, partitions: Partitions = EVERY_PARTITION) -> None:
        self.store = store
        self.directory = directory
        self.partitions = partitions
        self._lock = threading.Lock()
        self.catalogue: Catalogue | None = None
        self._fetched: dict[str, FetchedFile] = {}
        self._closing = threading.Event()
        self._retiring: list[FetchedFile] = []  # replaced or removed by the run being laid out
        self._retired: list[FetchedFile] = []  # by the run laid out last: forgotten after the next
        self._follower: threading.Thread | None = None

    @classmethod
    def open(cls, uri: str, partitions: Partitions = EVERY_PARTITION) -> LocalCopy:
        """The backup at `uri` (its `partitions`), laid out in a temporary directory of its own.
        ObjectStoreError when the store fails or holds no complete backup run."""
        store = open_object_store(uri)
        copy = cls(store, private_directory("seglogfs-stored"), partitions)
        try:
            if not copy.refresh():
                raise ObjectStoreError(
                    f"{store.name()}: no complete backup there (`seglogfs backup SRC {store.name()}` writes one)"
                )
        except BaseException:
            copy.close()
            raise
        return copy

    @property
    def log_dirs(self) -> list[Path]:
        """The copy's log dirs: the directory, or its `0/`, `1/`, … for a backup of several."""
        count = self.catalogue.log_dirs if self.catalogue is not None else 1
        return [self.directory] if count == 1 else [self.directory / str(index) for index in range(count)]

    def refresh(self) -> bool:
        """Lay out the newest complete run, if it is not the one laid out: whether the copy
        changed. ObjectStoreError when the store fails (the copy stays as it was, or partly
        moved to the newer run: each file whole, old or new)."""
        with self._lock:
            runs = catalogue_runs(self.store)  # (one LIST; the catalogue is fetched only when newer)
            if not runs or (self.catalogue is not None and runs[-1] == self.catalogue.run):
                return False
            newest = read_catalogue(self.store, runs[-1])
            self._apply(self._laid_out(self.catalogue) if self.catalogue is not None else None, self._laid_out(newest))
            self.catalogue = newest
            # Placeholders this run replaced or removed stay readable to those who hold them
            # until the next run (their objects stay in the store as long: see the catalogue).
            for fetched in self._retired:
                fetched.forget()
            self._retired, self._retiring = self._retiring, []
            return True

    def want(self, partitions: Partitions) -> None:
        """Lay out `partitions` too, of the run laid out (their files fetched now), unless the
        copy has them already. ObjectStoreError when the store fails (the copy wants them only
        once they are laid out: the next call fetches them again)."""
        with self._lock:
            if self.partitions.covers(partitions):
                return
            wider = self.partitions.union(partitions)
            if self.catalogue is not None:
                self._apply(self._laid_out(self.catalogue), self._laid_out(self.catalogue, wider))
            self.partitions = wider

    def _laid_out(self, catalogue: Catalogue, partitions: Partitions | None = None) -> Catalogue:
        """`catalogue` as far as the copy lays it out: the files and directories of the
        partitions it wants (or `partitions`), and every other."""
        wants = self.partitions if partitions is None else partitions
        if wants.everything:
            return catalogue
        in_partition = 1 if catalogue.log_dirs > 1 else 0  # (a backup of several: `0/topic-0/…`)

        def wanted(path: str) -> bool:
            parts = path.split("/")
            if len(parts) <= in_partition:
                return True
            named = parse_partition_dir(parts[in_partition])
            return named is None or wants.wants(*named)

        return replace(
            catalogue,
            files={path: stored for path, stored in catalogue.files.items() if wanted(path)},
            directories={path: a for path, a in catalogue.directories.items() if not path or wanted(path)},
        )

    def follow(self, interval_s: float, tell: Callable[[str], None]) -> None:
        """Refresh every `interval_s` seconds from a thread of its own until `close`, as new
        backup runs complete (a reader following the copy sees them as a writer's changes).
        A failed refresh is told once (`tell`, one line naming the object) and tried again."""
        if self._follower is not None:
            return

        def run() -> None:
            said = None
            while not self._closing.wait(interval_s):
                try:
                    self.refresh()
                    said = None
                except (OSError, ValueError) as error:  # (ObjectStoreError among them)
                    if str(error) != said:
                        said = str(error)
                        tell(f"following {self.store.name()}: {error}")

        self._follower = threading.Thread(target=run, name="seglogfs-follow-backup", daemon=True)
        self._follower.start()

    def close(self) -> None:
        """Forget the placeholders, and remove the directory."""
        self._closing.set()
        if self._follower is not None and self._follower is not threading.current_thread():
            self._follower.join()
        with self._lock:
            for fetched in [*self._fetched.values(), *self._retired, *self._retiring]:
                fetched.forget()
            self._fetched.clear()
            self._retired, self._retiring = [], []
            shutil.rmtree(self.directory, ignore_errors=True)

    def __enter__(self) -> LocalCopy:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    # -- laying out a run ------------------------------------------------------------------------
    def _apply(self, old: Catalogue | None, new: Catalogue) -> None:
        before = old.files if old is not None else {}
        for path in sorted(new.directories, key=len):
            if path:
                (self.directory / path).mkdir(parents=True, exist_ok=True)
        changed = [path for path, stored in new.files.items() if before.get(path) != stored]
        for path in changed:  # (a file whose directory the catalogue does not list)
            (self.directory / path).parent.mkdir(parents=True, exist_ok=True)
        small = [path for path in changed if not _is_log(path)]
        with ThreadPoolExecutor(FETCHES_AT_ONCE, thread_name_prefix="seglogfs-fetch") as pool:
            for done in [pool.submit(self._fetch_whole, path, new.files[path]) for path in small]:
                done.result()
        for path in changed:
            if _is_log(path):
                self._place_log(path, before.get(path), new.files[path])
        gone = [path for path in before if path not in new.files]
        for path in sorted(gone, key=lambda p: not _is_log(p)):  # (a segment's `.log` first)
            fetched = self._fetched.pop(path, None)
            if fetched is not None:
                fetched.retire()
                self._retiring.append(fetched)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.directory / path)
            if fetched is not None:
                unregister(fetched)
        if old is not None:
            for path in sorted(set(old.directories) - set(new.directories), key=len, reverse=True):
                if path:
                    shutil.rmtree(self.directory / path, ignore_errors=True)
        for path, attributes in new.directories.items():
            with contextlib.suppress(FileNotFoundError):
                _own(self.directory / path, attributes)
                os.chmod(self.directory / path, attributes.mode | 0o500)

    def materialize(self, path: str) -> Path:
        """The local file of `path` (relative to the copy's directory), a `.log` fetched whole:
        for a reader that reads it itself (dump). FileNotFoundError when the copy has no such file."""
        target = self.directory / path
        with self._lock:
            if self.catalogue is None or path not in self.catalogue.files:
                raise FileNotFoundError(self.store.name(path))
            fetched = self._fetched.get(path)
        if fetched is not None:
            fetched.pin()  # (for this process's life: its reader reads the file itself)
        return target

    def _fetch_whole(self, path: str, stored: StoredFile) -> None:
        """A small file fetched whole (its CRC-32 checked) and put in place by a rename."""
        target = self.directory / path
        temporary = target.with_name(f".{target.name}.fetching")
        reader = StoredFileReader(self.store, path, stored)
        try:
            fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
            try:
                position = 0
                while position < stored.size:
                    data = reader.read(position, min(stored.size - position, 8 << 20))
                    if not data:
                        raise ObjectStoreError(f"{self.store.name(path)}: ends at {position} of {stored.size} bytes")
                    write_all(fd, data, position)
                    position += len(data)
                _own(fd, stored.attributes)
                os.fchmod(fd, stored.attributes.mode & 0o666 | 0o400)
            finally:
                os.close(fd)
            os.utime(temporary, ns=(stored.attributes.mtime_ns, stored.attributes.mtime_ns))
            os.rename(temporary, target)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(temporary)
            raise
        finally:
            reader.close()

    def _place_log(self, path: str, before: StoredFile | None, stored: StoredFile) -> None:
        """A segment's `.log`: grown in place when it only grew, else a new placeholder."""
        target = self.directory / path
        fetched = self._fetched.get(path)
        grew = (
            fetched is not None
            and before is not None
            and stored.size >= before.size
            and stored.pieces[: len(before.pieces)] == before.pieces
        )
        if grew and fetched is not None:
            fetched.grow(stored.pieces, stored.summary)
            os.utime(target, ns=(stored.attributes.mtime_ns, stored.attributes.mtime_ns))
            return
        temporary = target.with_name(f".{target.name}.placing")
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        try:
            os.ftruncate(fd, stored.size)
            _own(fd, stored.attributes)
            os.fchmod(fd, stored.attributes.mode & 0o666 | 0o600)  # (its owner writes what is fetched)
            os.utime(fd, ns=(stored.attributes.mtime_ns, stored.attributes.mtime_ns))
            status = os.fstat(fd)
        finally:
            os.close(fd)
        placed = register(
            FetchedFile(
                str(target),
                (status.st_dev, status.st_ino),
                self.store,
                stored.pieces,
                self.store.name(path),
                summary=stored.summary,
            )
        )
        if fetched is not None:
            fetched.retire()
            self._retiring.append(fetched)
        os.rename(temporary, target)
        if fetched is not None:
            unregister(fetched)
        self._fetched[path] = placed


# -- one process's copies, for Spark ------------------------------------------------------------
_SHARED: dict[str, LocalCopy] = {}
_SHARED_LOCK = threading.Lock()


def shared_copy(uri: str, partitions: Partitions = EVERY_PARTITION) -> LocalCopy:
    """This process's copy of the backup at `uri` (a Spark driver's or executor's: kept across
    queries and tasks), moved to the newest complete run first, with `partitions` laid out
    (and those earlier callers wanted); removed when the process exits."""
    with _SHARED_LOCK:
        copy = _SHARED.get(uri)
        if copy is None:
            copy = _SHARED[uri] = LocalCopy.open(uri, partitions)
            atexit.register(copy.close)
            return copy
    copy.refresh()  # (first: what `want` fetches is of the newest run)
    copy.want(partitions)
    return copy


_SEGMENTS: dict[tuple[str, tuple[tuple[str, int], ...]], tuple[Path, FetchedFile]] = {}
_SEGMENTS_LOCK = threading.Lock()


@functools.cache
def _segments_dir() -> Path:
    """Where this process keeps the placeholders of `stored_segment` (removed at exit)."""
    where = private_directory("seglogfs-segments")
    atexit.register(shutil.rmtree, where, True)
    return where


@functools.cache
def _store(uri: str) -> ObjectStore:
    return open_object_store(uri)


def stored_segment(uri: str, pieces: tuple[tuple[str, int], ...]) -> FileRecords:
    """A backup's `.log` known by the objects that hold it (`pieces`: key, size), open for reading
    by position, its bytes fetched as they are read: for a task that reads what planning found
    in another process. The placeholder is this process's (kept for the next task that reads
    the segment, removed when the process exits); the caller closes what this returns.
    ObjectStoreError naming the object when one is gone (two newer backup runs completed since
    planning) or changed."""
    key = (uri, pieces)
    with _SEGMENTS_LOCK:
        known = _SEGMENTS.get(key)
        if known is None:
            store = _store(uri)
            path = _segments_dir() / f"{len(_SEGMENTS):08d}{LOG_SUFFIX}"
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
            try:
                os.ftruncate(fd, sum(size for _, size in pieces))
                status = os.fstat(fd)
            finally:
                os.close(fd)
            fetched = register(
                FetchedFile(str(path), (status.st_dev, status.st_ino), store, pieces, store.name(pieces[0][0]))
            )
            known = _SEGMENTS[key] = (path, fetched)
    return FileRecords.open_for_reading(known[0], known[1].file_id)
