"""`.logdir`: a read-only mirror of the data dir in Kafka's layout, consistent for backups.

    .logdir/                          (with several log dirs: .logdir/0/, .logdir/1/, …)
        recovery-point-offset-checkpoint, replication-offset-checkpoint,
        log-start-offset-checkpoint, cleaner-offset-checkpoint     generated from the logs now
        meta.properties, bootstrap.checkpoint,                      as on disk (every other
        .seglogfs-topic-configs.json, …                             regular file of the log dir)
        <topic>-<partition>/
            <base>.log        sealed segments as on disk; the active one up to its last whole batch
            <base>.index      sealed: as on disk (trimmed); active: the entries that point into
            <base>.timeindex  the part of the log shown
            <base>.txnindex   where the broker wrote one
            <offset>.snapshot (producer state), leader-epoch-checkpoint, partition.metadata,
            quorum-state and <offset>-<epoch>.checkpoint (KRaft's metadata log), …   as on disk

What a broker needs to start from a copy is there. Left out is what belongs to a process or a
moment: `.lock`; `.kafka_cleanshutdown` (a copy opens as after an unclean stop and checks what
lies past its recovery points); files being written or replaced (`*.tmp`, `*.part`, `.cleaned`,
`.swap`, `.deleted`); partition dirs being deleted, moved or of no live partition; and segment
files of segments the log does not hold (a reader's log learns of a roll at its next refresh).

A symbolic link in the log dir or a partition dir is shown as a link (its target's name, as
`readlink` gives it), never followed: neither its target's content nor its attributes are shown,
and a lookup of any name resolves inside the data dir or not at all. A partition dir that is a
link is such a link too (its partition is offline). FIFOs, sockets and devices are not shown.
An offline partition (engine: one holding such a file, or data no reader can decode) shows its
files as they are on disk, none of them loaded.

Files show the mtime, the owner and the mode of the file they mirror (a generated checkpoint:
those of the file it stands for, 0644 and the log dir's owner when there is none), directories
theirs: `rsync -a` finds unchanged
sealed segments unchanged and copies only what grew or is new, and a copy is as writable as the
data dir (0644/0755 as Kafka leaves them). The mount still refuses writes to `.logdir`.

The active segment's bound is the engine's `segment.size`: for a log this process writes, the
bytes it has appended; for a log another process writes (a read-only open), the whole batches
the last refresh found. Its index files are cut to match: offset-index entries whose batch
starts below that size, time-index entries whose offset is below the log end offset read
*before* the size (a writer publishes the log end offset after the bytes, and an index entry
before the size), so every entry shown points into the bytes shown, then or at any later look.
The index files are cut to the `.log` as last shown, if it was shown since: rsync copies a
partition's files in name order, the `.timeindex` after the `.log`, and a writer appends between.
Mirror objects are thread-safe: they keep no state but the data dir and that bound.
"""

from __future__ import annotations

import errno
import os
import stat
import weakref
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from seglogfs.engine import DataDir, PartitionLog
from seglogfs.engine.datadir import LOCK_FILE
from seglogfs.engine.fetched_files import FetchedFile, fetched_file
from seglogfs.engine.files import open_regular
from seglogfs.engine.log.checkpoint import (
    CLEAN_SHUTDOWN_FILE,
    CLEANER_OFFSET_CHECKPOINT,
    LOG_START_OFFSET_CHECKPOINT,
    RECOVERY_POINT_CHECKPOINT,
    REPLICATION_OFFSET_CHECKPOINT,
    format_offset_checkpoint,
)
from seglogfs.engine.log.file_records import read_cached
from seglogfs.engine.log.index import entries_in_use, read_index_prefix
from seglogfs.engine.log.naming import (
    CLEANED_SUFFIX,
    DELETED_SUFFIX,
    INDEX_SUFFIX,
    LOG_SUFFIX,
    SWAP_SUFFIX,
    TIME_INDEX_SUFFIX,
    TXN_INDEX_SUFFIX,
    filename_prefix_from_offset,
    parse_segment_file_name,
    partition_dir_name,
)
from seglogfs.engine.log.offset_index import OFFSET_INDEX_DTYPE
from seglogfs.engine.log.segment import LogSegment
from seglogfs.engine.log.time_index import TIME_INDEX_DTYPE
from seglogfs.engine.log.transaction_index import ABORTED_TXN_DTYPE

_GENERATED = (
    RECOVERY_POINT_CHECKPOINT,
    REPLICATION_OFFSET_CHECKPOINT,
    LOG_START_OFFSET_CHECKPOINT,
    CLEANER_OFFSET_CHECKPOINT,
)
_NOT_MIRRORED = frozenset({LOCK_FILE, CLEAN_SHUTDOWN_FILE})
# Written under a temporary name then renamed (Kafka's checkpoints, meta.properties, KRaft
# snapshots `.checkpoint.part`), or on their way out or in (deleted, cleaned, swapped segments).
_TRANSIENT_SUFFIXES = (".tmp", ".part", DELETED_SUFFIX, CLEANED_SUFFIX, SWAP_SUFFIX)
_SEGMENT_KINDS = (LOG_SUFFIX, INDEX_SUFFIX, TIME_INDEX_SUFFIX, TXN_INDEX_SUFFIX)
_NEW_FILE_MODE = 0o644  # what Kafka (and the engine) create files with
_VIRTUAL_DIR_MODE = 0o755


@dataclass(frozen=True)
class MirrorEntry:
    """One file or directory of the mirror, resolved now. `mode` is the permission bits, `uid`
    and `gid` the owner: those of what it mirrors."""

    is_dir: bool
    size: int = 0
    mtime_ns: int = 0
    mode: int = _NEW_FILE_MODE
    uid: int = 0
    gid: int = 0
    path: Path | None = None  # the file whose first `size` bytes are shown
    content: bytes | None = None  # or generated content
    link: str | None = None  # a symbolic link: its target's name (what readlink gives), never followed


def _as_is_name(name: str) -> bool:
    """Whether a file of a log dir or a partition dir is mirrored as it is on disk (by name)."""
    return name not in _NOT_MIRRORED and not name.endswith(_TRANSIENT_SUFFIXES)


def _listed_files(directory: Path) -> set[str]:
    """The regular files and symbolic links of a directory (links shown as links); not FIFOs,
    sockets, devices."""
    with os.scandir(directory) as entries:
        return {entry.name for entry in entries if entry.is_file(follow_symlinks=False) or entry.is_symlink()}


def _directory_entry(status: os.stat_result) -> MirrorEntry:
    """A directory as its status shows it: its own times, owner, group and mode."""
    return MirrorEntry(
        is_dir=True,
        mtime_ns=status.st_mtime_ns,
        mode=stat.S_IMODE(status.st_mode),
        uid=status.st_uid,
        gid=status.st_gid,
    )


def _link(path: Path, status: os.stat_result) -> MirrorEntry:
    """A symbolic link's entry: its target's name, read with readlink (nothing of the target)."""
    target = os.readlink(path)
    return MirrorEntry(
        is_dir=False,
        size=len(os.fsencode(target)),
        mtime_ns=status.st_mtime_ns,
        mode=0o777,
        uid=status.st_uid,
        gid=status.st_gid,
        path=path,
        link=target,
    )


def _segment_file(name: str) -> tuple[int, str] | None:
    """(base offset, kind) of a segment's `.log`/`.index`/`.timeindex`/`.txnindex`, else None
    (producer snapshots share the naming, not the segments' life)."""
    parsed = parse_segment_file_name(name)
    if parsed is None or parsed[2] or parsed[1] not in _SEGMENT_KINDS:
        return None
    return parsed[0], parsed[1]


def _segment_path(segment: LogSegment, kind: str) -> Path:
    if kind == LOG_SUFFIX:
        return segment.log_path
    if kind == INDEX_SUFFIX:
        return segment.offset_index_path
    if kind == TIME_INDEX_SUFFIX:
        return segment.time_index_path
    return segment.directory / f"{filename_prefix_from_offset(segment.base_offset)}{TXN_INDEX_SUFFIX}"


def _read_entries(path: Path, dtype: np.dtype, limit_bytes: int | None) -> tuple[np.ndarray, os.stat_result]:
    """The entries in use of an index file (up to `limit_bytes`; else up to its preallocated
    zero tail), and the file's stat."""
    with os.fdopen(open_regular(path), "rb", buffering=0) as file:
        status = os.fstat(file.fileno())
        end = status.st_size if limit_bytes is None else min(limit_bytes, status.st_size)
        return entries_in_use(read_index_prefix(file.fileno(), dtype, end)), status


class Mirror:
    """Resolves mirror paths (tuples of names below `.logdir`) against a DataDir."""

    def __init__(self, data_dir: DataDir) -> None:
        self.data_dir = data_dir
        self.log_dirs = list(data_dir.config.log_dirs)
        # The active segments' `.log` as last shown: (size, log end offset read before it). Their
        # index files are cut to it, so that an index copied after its `.log` (rsync copies a
        # partition's files in name order: `.index`, `.log`, `.timeindex`) never points past
        # the bytes copied, while a writer appends between the two.
        self._shown: weakref.WeakKeyDictionary[LogSegment, tuple[int, int]] = weakref.WeakKeyDictionary()

    def _log_dir(self, parts: tuple[str, ...]) -> tuple[Path, tuple[str, ...]] | None:
        if len(self.log_dirs) == 1:
            return self.log_dirs[0], parts
        if not parts:
            return None
        if not (parts[0].isascii() and parts[0].isdigit()) or int(parts[0]) >= len(self.log_dirs):
            raise FileNotFoundError(parts[0])
        return self.log_dirs[int(parts[0])], parts[1:]

    def _logs_in(self, log_dir: Path) -> dict[str, PartitionLog]:
        logs = {}
        for topic, partitions in self.data_dir.topics().items():
            for partition in partitions:
                log = self.data_dir.partition(topic, partition)
                if log.directory.parent == log_dir:
                    logs[partition_dir_name(topic, partition)] = log
        return logs

    def names(self, parts: tuple[str, ...]) -> list[str]:
        """Names in the mirror directory `parts`."""
        resolved = self._log_dir(parts)
        if resolved is None:
            return [str(i) for i in range(len(self.log_dirs))]
        log_dir, rest = resolved
        logs = self._logs_in(log_dir)
        if not rest:
            as_is = sorted(name for name in _listed_files(log_dir) if _as_is_name(name) and name not in _GENERATED)
            return [*_GENERATED, *sorted(logs), *as_is]
        if len(rest) == 1 and rest[0] in logs and not os.path.islink(logs[rest[0]].directory):
            log = logs[rest[0]]
            present = _listed_files(log.directory)
            links = {name for name in present if os.path.islink(log.directory / name)}
            if log.offline_reason is not None:  # (no segments loaded: its files as on disk, untouched)
                return sorted(name for name in present if _as_is_name(name))
            names = []
            for segment in log.segments:
                names += [name for kind in _SEGMENT_KINDS if (name := _segment_path(segment, kind).name) in present]
            names += sorted(
                name for name in present if _as_is_name(name) and (_segment_file(name) is None or name in links)
            )
            return names
        raise FileNotFoundError("/".join(parts))

    def entry(self, parts: tuple[str, ...]) -> MirrorEntry:
        """What `parts` names now; FileNotFoundError when nothing."""
        resolved = self._log_dir(parts)
        if resolved is None:
            return MirrorEntry(is_dir=True, mode=_VIRTUAL_DIR_MODE)
        log_dir, rest = resolved
        if not rest:
            # (the root as the user named it: it may be a link, as /var/lib/kafka often is)
            return _directory_entry(os.stat(log_dir))
        logs = self._logs_in(log_dir)
        if len(rest) == 1:
            name = rest[0]
            if name in logs:
                return self._directory(logs[name].directory)
            if name in _GENERATED:
                return self._generated(name, list(logs.values()), log_dir)
            if _as_is_name(name):
                return self._file(log_dir / name)
            raise FileNotFoundError(name)
        if len(rest) == 2 and rest[0] in logs and not os.path.islink(logs[rest[0]].directory):
            return self._partition_file(logs[rest[0]], rest[1])
        raise FileNotFoundError("/".join(parts))

    @staticmethod
    def _directory(path: Path) -> MirrorEntry:
        status = os.lstat(path)
        if stat.S_ISLNK(status.st_mode):
            return _link(path, status)
        return _directory_entry(status)

    @staticmethod
    def _file(path: Path, size: int | None = None) -> MirrorEntry:
        status = os.lstat(path)  # (never followed: a link is shown as one, whatever it names)
        if stat.S_ISLNK(status.st_mode):
            return _link(path, status)
        if not stat.S_ISREG(status.st_mode):
            raise FileNotFoundError(path)
        shown = status.st_size if size is None else min(size, status.st_size)
        return MirrorEntry(
            is_dir=False,
            size=shown,
            mtime_ns=status.st_mtime_ns,
            mode=stat.S_IMODE(status.st_mode),
            uid=status.st_uid,
            gid=status.st_gid,
            path=path,
        )

    def _generated(self, name: str, logs: list[PartitionLog], log_dir: Path) -> MirrorEntry:
        path = log_dir / name
        if name == RECOVERY_POINT_CHECKPOINT:
            offsets = {(log.topic, log.partition): min(log.recovery_point, log.log_end_offset) for log in logs}
        elif name == REPLICATION_OFFSET_CHECKPOINT:
            offsets = {(log.topic, log.partition): log.high_watermark for log in logs}
        elif name == LOG_START_OFFSET_CHECKPOINT:
            offsets = {
                (log.topic, log.partition): log.log_start_offset
                for log in logs
                if not log.segments or log.log_start_offset > log.segments[0].base_offset
            }
        else:
            if os.path.lexists(path):
                return self._file(path)
            offsets = {}
        content = format_offset_checkpoint(offsets).encode()
        directory = os.stat(log_dir)
        try:
            status = os.lstat(path)  # (a link there: shown generated, with a new file's mode)
            if not stat.S_ISREG(status.st_mode):
                raise FileNotFoundError(path)
            mode, uid, gid = stat.S_IMODE(status.st_mode), status.st_uid, status.st_gid
        except FileNotFoundError:  # (the log dir's owner's, as the file would be if written now)
            mode, uid, gid = _NEW_FILE_MODE, directory.st_uid, directory.st_gid
        return MirrorEntry(
            is_dir=False,
            size=len(content),
            mtime_ns=directory.st_mtime_ns,
            mode=mode,
            uid=uid,
            gid=gid,
            content=content,
        )

    def _partition_file(self, log: PartitionLog, name: str) -> MirrorEntry:
        kind = _segment_file(name)
        if kind is None:
            if _as_is_name(name):
                return self._file(log.directory / name)
            raise FileNotFoundError(name)
        base, suffix = kind
        end_offset = log.log_end_offset  # before the segments and their sizes: see the module docstring
        segments = log.segments
        for segment in segments:
            if segment.base_offset == base:
                break
        else:
            if log.offline_reason is not None:  # (an offline partition's files: as on disk, a link as a link)
                return self._file(log.directory / name)
            raise FileNotFoundError(name)
        path = _segment_path(segment, suffix)
        if segment is not segments[-1]:
            return self._file(path)
        size = segment.size
        if suffix == LOG_SUFFIX:
            self._shown[segment] = (size, end_offset)
            return self._file(path, size)
        shown_size, shown_end = self._shown.get(segment, (size, end_offset))
        size, end_offset = min(size, shown_size), min(end_offset, shown_end)
        if suffix == TXN_INDEX_SUFFIX:
            status = os.lstat(path)
            if not stat.S_ISREG(status.st_mode):
                return self._file(path)  # (a link shown as one; anything else not at all)
            return self._file(path, status.st_size - status.st_size % ABORTED_TXN_DTYPE.itemsize)
        return self._active_index(log, segment, suffix, size, end_offset)

    @staticmethod
    def _active_index(log: PartitionLog, segment: LogSegment, suffix: str, size: int, end_offset: int) -> MirrorEntry:
        """The active segment's index: its entries in use that point into the first `size` bytes
        of the log (offset index) or below `end_offset` (time index)."""
        offset_index = suffix == INDEX_SUFFIX
        path = _segment_path(segment, suffix)
        limit = None
        if log.writable:  # the engine knows its entries; the file past them is preallocated
            limit = (segment.offset_index if offset_index else segment.time_index).size_in_bytes
        entries, status = _read_entries(path, OFFSET_INDEX_DTYPE if offset_index else TIME_INDEX_DTYPE, limit)
        if offset_index:
            entries = entries[entries["position"] < size]
        else:
            entries = entries[entries["relative_offset"].astype(np.int64) < end_offset - segment.base_offset]
        content = entries.tobytes()
        return MirrorEntry(
            is_dir=False,
            size=len(content),
            mtime_ns=status.st_mtime_ns,
            mode=stat.S_IMODE(status.st_mode),
            uid=status.st_uid,
            gid=status.st_gid,
            content=content,
        )


class MirrorFile:
    """An open mirror file: the entry as resolved at open, and its file held open (a segment
    renamed `.deleted` meanwhile stays readable). A read past the size seen at open looks again:
    the active segment may have grown since, and a reader (rsync) may expect the size a later
    stat reported."""

    def __init__(self, mirror: Mirror, parts: tuple[str, ...]) -> None:
        self._mirror = mirror
        self._parts = parts
        self.entry = entry = mirror.entry(parts)
        if entry.link is not None:  # (a link is read with readlink, never opened)
            raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), "/".join(parts))
        # (a link or a FIFO put in the file's place since the look: UnsafeFileError, not followed)
        self._fd = open_regular(entry.path) if entry.path is not None else None
        # A backup's segment in object storage (engine.fetched_files): its bytes fetched as read.
        self._fetched: FetchedFile | None = None
        if self._fd is not None:
            status = os.fstat(self._fd)
            self._fetched = fetched_file((status.st_dev, status.st_ino))

    def read_now(self, offset: int, length: int) -> bytes | bytearray | None:
        """`read`, when it needs no look at the log and its bytes are in the OS page cache (for
        the event loop), else None."""
        end = offset + length
        if end > self.entry.size:
            return None
        if self._fd is None:
            assert self.entry.content is not None
            return self.entry.content[offset:end]
        fd = self._fd
        try:
            if self._fetched is not None:
                return self._fetched.present(offset, length, lambda: read_cached(fd, offset, length))
            return read_cached(fd, offset, length)
        except OSError:  # not cached; or an I/O error, which the worker thread's read reports
            return None

    def read(self, offset: int, length: int) -> bytes:
        if offset + length > self.entry.size and self.entry.path is not None:
            try:
                again = self._mirror.entry(self._parts)
            except FileNotFoundError:  # deleted since it was opened: what was there stays
                again = self.entry
            if again.path == self.entry.path and again.size > self.entry.size:
                self.entry = again
        end = min(offset + length, self.entry.size)
        if offset >= end:
            return b""
        if self._fd is None:
            assert self.entry.content is not None
            return self.entry.content[offset:end]
        fd = self._fd
        if self._fetched is not None:
            return self._fetched.reading(offset, end - offset, lambda: os.pread(fd, end - offset, offset))
        return os.pread(fd, end - offset, offset)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
