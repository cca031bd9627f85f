"""`seglogfs backup` and `seglogfs restore`: incremental, consistent copies of a data dir.

    seglogfs backup SRC DEST [--stats] [--json] [-v]
    seglogfs restore BACKUP DATADIR [--force] [--stats] [--json] [-v]

What a backup holds is the mount's `.logdir` mirror (fs.mirror): Kafka's layout with everything a
broker needs to start from the copy (meta.properties, bootstrap.checkpoint, quorum-state, KRaft
snapshots, producer snapshots, leader-epoch checkpoints, …), sealed segments as on disk, the
active segment up to its last whole batch, indexes cut to match, root checkpoints generated from
the logs; no `.lock`, no `.kafka_cleanshutdown` (a copy opens as after an unclean stop). SRC is:

* a seglogfs mount point (or its `.logdir`): the mount's mirror is read through the filesystem;
* a data dir (several log dirs separated by commas, as `log.dirs`): the same mirror is resolved
  in this process over a read-only open of it (no lock taken, nothing written), so a writer — a
  mount, `seglogfs produce`, a broker — goes on writing; the copy is the data dir as that open
  found it: each partition's active segment up to the last batch that was whole then.

With several log dirs the backup holds them as `0/`, `1/`, … (as `.logdir` does), and a restore
gives them back to as many DATADIRs. Modes are kept (the mirror shows the files' own, 0644/0755
as Kafka leaves them), and owners too when run as root (a mount shows its own user's).

Incremental rules, per file (rsync's quick check and --append-verify, by kind of file — rsync
itself cannot stop a growing file at a batch boundary, and its --append keeps a copy that is
longer than a compacted segment):

* segment files (`.log`, `.index`, `.timeindex`, `.txnindex`): unchanged when size and mtime
  match — sealed segments already in DEST are never sent again; a `.log` that grew (the active
  segment, or one sealed since) is appended to when DEST's copy is a prefix of it (its first
  4 KiB and last 64 KiB compare equal), else sent whole (compaction replaced it);
* every other file (checkpoints, snapshots, metadata: small, and generated ones change without
  their mtime) is compared byte for byte and sent whole when it differs;
* what is no longer in SRC (segments retention deleted, topics deleted) is deleted from DEST.

Order, so that DEST is consistent after an interruption too. In each directory the small files
and indexes are read first and staged beside their targets (`.NAME.PID.seglogfs-tmp`), then the
subdirectories and `.log` files are copied, then the staged files renamed into place, then what
SRC no longer holds deleted. Read first: a checkpoint or index read before the logs it describes
never points past the bytes copied of them (logs only grow, and the mirror cuts an active index
to the bytes it shows). Renamed last: an interrupted backup leaves old indexes and checkpoints
beside logs that only grew, which is what a crash leaves; the next backup finishes the work. Every
file written is fsynced, and each directory it changed.

DEST holds `.seglogfs-backup.json` (source, log dir count, times, `"complete"`) and a `.lock`
that the backup or restore holds (POSIX record lock, as Kafka's): two runs never write one dir at
once, and a writer cannot open it meanwhile. The manifest is how a backup says it is whole, as a
backup tool's catalogue does: each run writes it first with `"complete": false` (fsynced, before
it changes a file of DEST) and replaces it with `"complete": true` as its very last step (fsynced,
after every file and directory). So whatever ends a run early — a reader of `-v` that went away
(`| head`), ENOSPC or EIO, SIGINT, SIGTERM, `kill -9`, a power cut — leaves DEST marked
incomplete: the run exits non-zero (1; 130 after SIGINT, 143 after SIGTERM; a closed pipe
quietly, with no line), `restore` refuses DEST, `check` and `consume` of it say in one line that
it is an incomplete backup (`incomplete_backup`; check exits 4), and the next backup into DEST
completes it, removing what the cut-short run left (its `.*.seglogfs-tmp` files, files SRC no
longer holds). A backup is otherwise a data dir: `seglogfs check`, `consume` and `mount` read it
as it is.

Links, FIFOs, sockets and devices are refused, never followed or read: a backup or a restore that
meets one (a symbolic link named like a segment, a FIFO in a backup) names it in one line on
stderr, copies everything else (an offline partition's files as they are on disk), records the
names in the manifest (`"refused"`), and exits 1. Files of the copy are written through
temporary files of its own (O_EXCL, O_NOFOLLOW) renamed into place, never through a link.

Refusals (one line on stderr): SRC or DEST missing or of the wrong kind, DEST inside SRC or SRC
inside DEST, DEST neither empty nor a backup, a non-empty DATADIR without --force: exit 2;
DEST or DATADIR a live data dir (its `.lock` held: a mount, a broker, a writer): exit 3; a backup
that did not complete (restore): exit 1. A backup or restore that fails or is cut short exits 1
(a backup: 130 after SIGINT, 143 after SIGTERM), a backup with one line naming the failure and
DEST as incomplete.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import fcntl
import json
import os
import shlex
import shutil
import signal
import stat
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from seglogfs.engine import BrokerConfig, DataDir, EngineError, LogDirLockedError
from seglogfs.engine.check import log_dir_in_use
from seglogfs.engine.datadir import LOCK_FILE, META_PROPERTIES, describe_process
from seglogfs.engine.errors import UnsafeFileError
from seglogfs.engine.files import is_regular, open_regular, read_regular, write_all
from seglogfs.engine.log.checkpoint import (
    CLEAN_SHUTDOWN_FILE,
    CLEANER_OFFSET_CHECKPOINT,
    LOG_START_OFFSET_CHECKPOINT,
    RECOVERY_POINT_CHECKPOINT,
    REPLICATION_OFFSET_CHECKPOINT,
    fsync_dir,
    write_atomically,
)
from seglogfs.engine.log.naming import INDEX_SUFFIXES, LOG_SUFFIX, parse_segment_file_name, partition_dirs
from seglogfs.fs.mirror import Mirror, MirrorFile
from seglogfs.mount_tools.common import discard_stdout, quiet_broken_pipe
from seglogfs.mount_tools.progress import Progress

COMMANDS = ("backup", "restore")
MANIFEST = ".seglogfs-backup.json"
MANIFEST_VERSION = 1
MOUNT_MIRROR = ".logdir"

EXIT_OK = 0
EXIT_DATA = 1
EXIT_USAGE = 2
EXIT_LOCKED = 3
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as a shell reports a process Ctrl-C ended
EXIT_TERMINATED = 143  # 128 + SIGTERM

_TMP_SUFFIX = ".seglogfs-tmp"
_CHUNK_BYTES = 1 << 20
_MANIFEST_MAX_BYTES = 1 << 20  # a manifest is a few hundred bytes
_HEAD_BYTES = 4096  # compared, with the tail, before appending to a copy
_TAIL_BYTES = 64 * 1024
_OPEN_ATTEMPTS = 3  # a read-only open may meet a segment that retention deletes under it
_LOG_DIR_MARKERS = (
    LOCK_FILE,
    CLEAN_SHUTDOWN_FILE,
    META_PROPERTIES,
    RECOVERY_POINT_CHECKPOINT,
    REPLICATION_OFFSET_CHECKPOINT,
    LOG_START_OFFSET_CHECKPOINT,
    CLEANER_OFFSET_CHECKPOINT,
)
_NOT_DATA = frozenset({LOCK_FILE, "lost+found"})  # what an empty DATADIR or DEST may hold


class Refused(Exception):
    """A backup or restore turned down before it changed anything: one line, an exit code."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code


class SourceChanged(EngineError):
    """A file got shorter while it was copied (truncated under the copy)."""


def now_ms() -> int:
    return time.time_ns() // 1_000_000


# -- what was done --------------------------------------------------------------------------------
@dataclass
class CopyStats:
    """What a backup or restore wrote: `files_sent` counts files written whole or appended to
    (`files_appended` of them), `bytes_sent` the bytes written; `files_skipped` were unchanged;
    `files_deleted` counts files and directories removed from the target."""

    bytes_sent: int = 0
    files_sent: int = 0
    files_appended: int = 0
    files_skipped: int = 0
    files_deleted: int = 0

    def lines(self) -> list[str]:
        return [
            f"bytes sent: {self.bytes_sent}",
            f"files sent: {self.files_sent} ({self.files_appended} appended)",
            f"files skipped: {self.files_skipped}",
            f"files deleted: {self.files_deleted}",
        ]

    def as_json(self) -> dict[str, int]:
        return {
            "bytesSent": self.bytes_sent,
            "filesSent": self.files_sent,
            "filesAppended": self.files_appended,
            "filesSkipped": self.files_skipped,
            "filesDeleted": self.files_deleted,
        }


# -- sources --------------------------------------------------------------------------------------
@dataclass
class _Attributes:
    """What the copy gives a file or directory besides its bytes."""

    mode: int  # permission bits
    mtime_ns: int
    owner: tuple[int, int] | None  # (uid, gid), applied when running as root


class _Item:
    """A source file open for the copy: its size and attributes as found at open, its bytes.
    `exact`: the size is the file's for as long as it is open (a mirror file resolved in this
    process); else the bytes may end before it — through a mount, a generated file's content is
    the one resolved at open, which a later stat may already find longer."""

    def __init__(
        self,
        name: str,
        size: int,
        attributes: _Attributes,
        read: Callable[[int, int], bytes],
        close: Callable[[], None],
        *,
        exact: bool,
    ) -> None:
        self.name = name  # for messages
        self.size = size
        self.attributes = attributes
        self.read = read
        self.close = close
        self.exact = exact

    def chunks(self, start: int = 0) -> Iterator[bytes]:
        """The bytes from `start` up to the size found at open (or, not `exact`, an end of file
        before it); SourceChanged when an exact file ends early (truncated under the copy)."""
        position = start
        while position < self.size:
            data = self.read(position, min(_CHUNK_BYTES, self.size - position))
            if not data:
                if not self.exact:
                    return
                raise SourceChanged(f"{self.name}: got shorter while it was copied (at byte {position} of {self.size})")
            yield data
            position += len(data)


class _Source(Protocol):
    def names(self, parts: tuple[str, ...]) -> list[tuple[str, bool]]:
        """(name, is a directory) of the directory `parts`; FileNotFoundError when gone."""
        ...

    def directory(self, parts: tuple[str, ...]) -> _Attributes: ...

    def open(self, parts: tuple[str, ...]) -> _Item:
        """The file `parts`, open; FileNotFoundError when gone."""
        ...


class _MirrorSource:
    """The mirror resolved in this process (a data dir open read-only)."""

    def __init__(self, mirror: Mirror) -> None:
        self.mirror = mirror

    def names(self, parts: tuple[str, ...]) -> list[tuple[str, bool]]:
        out = []
        for name in self.mirror.names(parts):
            if not parts and name == MANIFEST:
                continue  # a data dir that is itself a backup: the manifest is this backup's own
            try:
                out.append((name, self.mirror.entry((*parts, name)).is_dir))
            except FileNotFoundError:
                continue
        return out

    def directory(self, parts: tuple[str, ...]) -> _Attributes:
        entry = self.mirror.entry(parts)
        return _Attributes(entry.mode, entry.mtime_ns, self._owner(parts, None))

    def _owner(self, parts: tuple[str, ...], path: Path | None) -> tuple[int, int] | None:
        """The owner of the file on disk; of a generated checkpoint, its log dir's; of the
        virtual root of several log dirs, the first log dir's."""
        if path is None:
            log_dirs = self.mirror.log_dirs
            if len(log_dirs) > 1 and parts:
                path = log_dirs[int(parts[0])].joinpath(*parts[1:])
            else:
                path = log_dirs[0].joinpath(*parts)
        for candidate in (path, path.parent):
            with contextlib.suppress(FileNotFoundError):
                status = os.stat(candidate)
                return status.st_uid, status.st_gid
        return None

    def open(self, parts: tuple[str, ...]) -> _Item:
        entry = self.mirror.entry(parts)
        if entry.link is not None:  # (never its target: refused, as a FIFO or a device is)
            raise UnsafeFileError(entry.path or "/".join(parts), "a symbolic link")
        file = MirrorFile(self.mirror, parts)
        entry = file.entry
        if entry.is_dir:
            file.close()
            raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), "/".join(parts))
        attributes = _Attributes(entry.mode, entry.mtime_ns, self._owner(parts, entry.path))
        return _Item("/".join(parts), entry.size, attributes, file.read, file.close, exact=True)


class _TreeSource:
    """A directory tree read through the filesystem: a mount's `.logdir`, or a backup."""

    def __init__(self, root: Path, hidden: frozenset[str]) -> None:
        self.root = root
        self.hidden = hidden  # names at the root that are not copied

    def names(self, parts: tuple[str, ...]) -> list[tuple[str, bool]]:
        out = []
        with os.scandir(self.root.joinpath(*parts)) as entries:
            for entry in entries:
                if not parts and entry.name in self.hidden:
                    continue
                # Anything but a directory is a file to the copy: a link, a FIFO, a device is
                # refused when opened, with a line naming it (never followed, never read).
                out.append((entry.name, entry.is_dir(follow_symlinks=False)))
        return sorted(out)

    def directory(self, parts: tuple[str, ...]) -> _Attributes:
        status = os.stat(self.root.joinpath(*parts))
        return _Attributes(stat.S_IMODE(status.st_mode), status.st_mtime_ns, (status.st_uid, status.st_gid))

    def open(self, parts: tuple[str, ...]) -> _Item:
        fd = open_regular(self.root.joinpath(*parts))  # (UnsafeFileError for a link, a FIFO, …)
        status = os.fstat(fd)
        attributes = _Attributes(stat.S_IMODE(status.st_mode), status.st_mtime_ns, (status.st_uid, status.st_gid))
        path = str(self.root.joinpath(*parts))
        return _Item(
            path,
            status.st_size,
            attributes,
            lambda offset, length: os.pread(fd, length, offset),
            lambda: os.close(fd),
            exact=False,
        )

    def total_bytes(self) -> int:
        return sum(path.lstat().st_size for path in self.root.rglob("*") if is_regular(path))


# -- the copy -------------------------------------------------------------------------------------
def _segment_kind(name: str) -> str | None:
    parsed = parse_segment_file_name(name)
    if parsed is None or parsed[2] or parsed[1] not in (LOG_SUFFIX, *INDEX_SUFFIXES):
        return None
    return parsed[1]


def _orphan_index(name: str, present: set[str]) -> bool:
    """Whether `name` is an index file whose segment's `.log` is not among `present`."""
    parsed = parse_segment_file_name(name)
    if parsed is None or parsed[2] or parsed[1] not in INDEX_SUFFIXES:
        return False
    return f"{parsed[0]:020d}{LOG_SUFFIX}" not in present


def _regular_stat(path: Path) -> os.stat_result | None:
    """`path`'s stat when it is a regular file; anything else in its place is removed."""
    try:
        status = os.lstat(path)
    except FileNotFoundError:
        return None
    if stat.S_ISREG(status.st_mode):
        return status
    if stat.S_ISDIR(status.st_mode):
        shutil.rmtree(path)
    else:
        path.unlink()
    return None


class _Copier:
    """Makes a target directory hold what a source holds, by the rules of the module docstring.
    `restoring`: the copy is to be written to (modes get owner read and write)."""

    def __init__(
        self,
        source: _Source,
        *,
        restoring: bool,
        progress: Progress,
        say: Callable[[str], None] | None,
    ) -> None:
        self.source = source
        self.restoring = restoring
        self.progress = progress
        self.say = say
        self.stats = CopyStats()
        self.refused: list[str] = []  # what was not copied: a link, a FIFO, … (one line each)
        self._as_root = os.geteuid() == 0

    def copy(self, target: Path, keep: frozenset[str]) -> None:
        """Copy the source's root into `target`; `keep`: names in `target` never deleted."""
        self._directory((), target, keep)

    def _directory(self, parts: tuple[str, ...], target: Path, keep: frozenset[str]) -> bool:
        """Whether the source directory still existed."""
        try:
            listed = self.source.names(parts)
            attributes = self.source.directory(parts)
        except FileNotFoundError:
            return False
        try:
            status: os.stat_result | None = os.lstat(target)
        except FileNotFoundError:
            status = None
        if status is not None and not stat.S_ISDIR(status.st_mode):  # a file where the directory goes
            target.unlink()
            status = None
        if status is None:
            target.mkdir(mode=0o700)
        elif not os.access(target, os.W_OK | os.X_OK):  # made read-only by an earlier copy
            os.chmod(target, stat.S_IMODE(status.st_mode) | 0o700)
        files = [name for name, is_dir in listed if not is_dir]
        logs = [name for name in files if _segment_kind(name) == LOG_SUFFIX]
        present = set(keep)
        # Read first, put in place last (module docstring): indexes, checkpoints, metadata.
        staged: list[tuple[Path, str]] = []
        try:
            for name in files:
                if name not in logs:
                    found, tmp = self._file(parts, name, target, stage=True)
                    if found:
                        present.add(name)
                    if tmp is not None:
                        staged.append((tmp, name))
            for name, is_dir in listed:
                if is_dir and self._directory((*parts, name), target / name, frozenset()):
                    present.add(name)
            for name in logs:
                if self._file(parts, name, target, stage=False)[0]:
                    present.add(name)
        except BaseException:
            for tmp, _name in staged:
                tmp.unlink(missing_ok=True)
            raise
        for tmp, name in staged:
            if _orphan_index(name, present):  # its segment went (retention) while the logs were copied
                tmp.unlink()
                present.discard(name)
            else:
                os.replace(tmp, target / name)
        self._delete_others(parts, target, present)
        fsync_dir(target)
        self._set_attributes(target, attributes, is_dir=True)
        return True

    def _file(self, parts: tuple[str, ...], name: str, target_dir: Path, *, stage: bool) -> tuple[bool, Path | None]:
        """Bring one file up to date. Returns whether the source had it, and the staged copy
        to rename into place (when `stage`) or None."""
        try:
            item = self.source.open((*parts, name))
        except (FileNotFoundError, IsADirectoryError):
            return False, None
        except UnsafeFileError as error:
            self.refused.append(error.path)
            print(f"seglogfs: {error} (not copied)", file=sys.stderr)
            return False, None
        target = target_dir / name
        where = "/".join((*parts, name))
        try:
            current = _regular_stat(target)
            kind = _segment_kind(name)
            if kind is not None:
                if current is not None and (current.st_size, current.st_mtime_ns) == (
                    item.size,
                    item.attributes.mtime_ns,
                ):
                    self._skip(target, item)
                    return True, None
                # A segment's copy that is the start of it (or all of it, the mtime having moved
                # since the copy was made: a write the size had not yet shown) is appended to, or
                # left as it is: never sent whole again.
                held = kind == LOG_SUFFIX and current is not None and 0 < current.st_size <= item.size
                if held and current is not None and self._same_prefix(target, item, current.st_size):
                    if current.st_size == item.size:
                        self._skip(target, item)
                    else:
                        self._append(target, item, current.st_size, where)
                    return True, None
                tmp = self._write_whole(target, item.chunks(), item, where)
            else:
                data = b"".join(item.chunks())
                if current is not None and current.st_size == len(data) and _read_copy(target) == data:
                    self._skip(target, item)
                    return True, None
                tmp = self._write_whole(target, iter((data,)), item, where)
        except OSError as error:
            if error.filename is None and error.errno:  # (pwrite, fsync: name the file they failed on)
                raise OSError(error.errno, f"{target}: {error.strerror}") from None
            raise
        finally:
            item.close()
            self.progress.advance(item.size)
        if stage:
            return True, tmp
        os.replace(tmp, target)
        return True, None

    def _same_prefix(self, target: Path, item: _Item, have: int) -> bool:
        """Whether the copy's `have` bytes are the source's first (head and tail compared)."""
        tail = min(_TAIL_BYTES, have)
        with os.fdopen(open_regular(target), "rb", buffering=0) as file:
            for position, length in ((0, min(_HEAD_BYTES, have)), (have - tail, tail)):
                if os.pread(file.fileno(), length, position) != item.read(position, length):
                    return False
        return True

    def _mode(self, attributes: _Attributes, *, is_dir: bool) -> int:
        if self.restoring:
            return attributes.mode | (0o700 if is_dir else 0o600)
        return attributes.mode

    def _apply(self, fd: int, attributes: _Attributes) -> None:
        """Mode, owner (as root) and mtime of a file written, through its descriptor."""
        os.fchmod(fd, self._mode(attributes, is_dir=False))
        if self._as_root and attributes.owner is not None:
            os.fchown(fd, *attributes.owner)
        os.utime(fd, ns=(attributes.mtime_ns, attributes.mtime_ns))

    def _set_attributes(self, path: Path, attributes: _Attributes, *, is_dir: bool) -> None:
        status = os.lstat(path)
        mode = self._mode(attributes, is_dir=is_dir)
        if stat.S_IMODE(status.st_mode) != mode:
            os.chmod(path, mode)
        if self._as_root and attributes.owner is not None and (status.st_uid, status.st_gid) != attributes.owner:
            os.chown(path, *attributes.owner, follow_symlinks=False)
        if status.st_mtime_ns != attributes.mtime_ns:
            os.utime(path, ns=(attributes.mtime_ns, attributes.mtime_ns), follow_symlinks=False)

    def _skip(self, target: Path, item: _Item) -> None:
        self.stats.files_skipped += 1
        self._set_attributes(target, item.attributes, is_dir=False)

    def _write_whole(self, target: Path, chunks: Iterator[bytes], item: _Item, where: str) -> Path:
        """The file written whole beside `target` under a temporary name (fsynced, attributes
        set), for the caller to rename into place."""
        tmp = target.with_name(f".{target.name}.{os.getpid()}{_TMP_SUFFIX}")
        # A new file of its own, never through a link left at the name (O_EXCL; O_NOFOLLOW).
        tmp.unlink(missing_ok=True)
        fd = open_regular(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        written = 0
        try:
            for chunk in chunks:
                write_all(fd, chunk, written)
                written += len(chunk)
            os.fsync(fd)
            self._apply(fd, item.attributes)
            os.close(fd)
            fd = -1
            self.stats.files_sent += 1
            self.stats.bytes_sent += written
            if self.say is not None:  # (a reader of -v gone: BrokenPipeError, and the copy is not kept)
                self.say(f"sent {where} ({written} bytes)")
        except BaseException:
            if fd >= 0:
                os.close(fd)
            tmp.unlink(missing_ok=True)
            raise
        return tmp

    def _append(self, target: Path, item: _Item, have: int, where: str) -> None:
        if not os.access(target, os.W_OK):
            os.chmod(target, stat.S_IMODE(os.lstat(target).st_mode) | 0o200)
        fd = open_regular(target, os.O_WRONLY)
        position = have
        try:
            for chunk in item.chunks(have):
                write_all(fd, chunk, position)
                position += len(chunk)
            os.fsync(fd)
            self._apply(fd, item.attributes)
        finally:
            os.close(fd)
        self.stats.files_sent += 1
        self.stats.files_appended += 1
        self.stats.bytes_sent += position - have
        if self.say is not None:
            self.say(f"appended {where} (+{position - have} bytes)")

    def _delete_others(self, parts: tuple[str, ...], target: Path, present: set[str]) -> None:
        with os.scandir(target) as entries:
            gone = [entry for entry in entries if entry.name not in present]
        for entry in gone:
            if entry.is_dir(follow_symlinks=False):
                shutil.rmtree(entry.path)
            else:
                os.unlink(entry.path)
            if entry.name.endswith(_TMP_SUFFIX):
                continue  # a leftover of an interrupted run: not something SRC deleted
            self.stats.files_deleted += 1
            if self.say is not None:
                self.say(f"deleted {'/'.join((*parts, entry.name))}")


def _read_copy(target: Path) -> bytes:
    """A small file of the copy (found regular by `_regular_stat`), read without following a link."""
    with os.fdopen(open_regular(target), "rb") as file:
        return file.read()


# -- checks and locks -----------------------------------------------------------------------------
def _holder(directory: Path) -> str:
    """Who holds the data dir's `.lock`: `process N (command line)` when the kernel says."""
    return describe_process(log_dir_in_use(directory)[1])


def _refuse_live(directory: Path, what: str) -> None:
    if directory.is_dir() and log_dir_in_use(directory)[0]:
        raise Refused(f"{directory}: {what} is a data dir in use by {_holder(directory)}", EXIT_LOCKED)


def _check_apart(first: Path, first_what: str, second: Path, second_what: str) -> None:
    """Neither directory may be, or lie inside, the other."""
    one, two = os.path.realpath(first), os.path.realpath(second)
    if one == two:
        raise Refused(f"{second}: {second_what} is {first_what} itself", EXIT_USAGE)
    if two.startswith(one.rstrip(os.sep) + os.sep):
        raise Refused(f"{second}: {second_what} is inside {first_what} {first}", EXIT_USAGE)
    if one.startswith(two.rstrip(os.sep) + os.sep):
        raise Refused(f"{first}: {first_what} is inside {second_what} {second}", EXIT_USAGE)


def _data_names(directory: Path) -> set[str]:
    return set(os.listdir(directory)) - _NOT_DATA


def _is_mount_point(path: Path) -> bool:
    return (path / MOUNT_MIRROR).is_dir() and os.path.ismount(path)


def _looks_like_log_dir(directory: Path, *, lock_counts: bool = True) -> bool:
    """Whether partition dirs or Kafka's root files are there (`lock_counts`: a `.lock` alone,
    which a new data dir has, is enough)."""
    markers = _LOG_DIR_MARKERS if lock_counts else _LOG_DIR_MARKERS[1:]
    return bool(partition_dirs(directory)) or any((directory / name).exists() for name in markers)


@contextlib.contextmanager
def _locked(directory: Path, what: str, *, optional: bool = False) -> Iterator[None]:
    """Hold `directory/.lock` (made if need be, with the directory), as a writer of a data dir
    does: no writer, mount, backup or restore opens it meanwhile. `optional`: a directory where
    no lock file can be made (read-only media) is used without one."""
    if not optional:
        directory.mkdir(parents=True, exist_ok=True)
    try:
        fd = open_regular(directory / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as error:
        if optional and error.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
            yield
            return
        raise
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        raise Refused(f"{directory}: {what} is in use by {_holder(directory)}", EXIT_LOCKED) from None
    try:
        yield
    finally:
        os.close(fd)  # drops the lock


def _read_manifest(directory: Path) -> dict[str, object] | None:
    path = directory / MANIFEST
    try:
        document = json.loads(read_regular(path, _MANIFEST_MAX_BYTES).decode("utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError, UnsafeFileError) as error:
        raise Refused(f"{path}: unreadable backup manifest: {error}", EXIT_DATA) from None
    if not isinstance(document, dict) or document.get("format") != "seglogfs-backup":
        raise Refused(f"{path}: not a seglogfs backup manifest", EXIT_DATA)
    return document


def _write_manifest(directory: Path, document: dict[str, object]) -> None:
    """Replace the manifest durably (a temporary file fsynced, renamed, the directory fsynced):
    a crash leaves the one before or this one, never half of one."""
    write_atomically(directory / MANIFEST, json.dumps(document, indent=2) + "\n")


def incomplete_backup(log_dirs: Iterable[Path]) -> str | None:
    """The line saying a DATADIR is a backup that did not complete, for `seglogfs check` and
    `consume` to print (None when it is not one): a log dir holding the manifest of a backup
    whose last run was cut short or failed, or a numbered log dir (`B/0`) of such a backup of
    several log dirs. A manifest that cannot be read is said as such (its copy is not known to
    be whole either)."""
    for log_dir in log_dirs:
        candidates = [(log_dir, False)]
        if log_dir.name.isascii() and log_dir.name.isdigit():
            candidates.append((log_dir.parent, True))
        for directory, numbered in candidates:
            try:
                manifest = _read_manifest(directory)
            except Refused as error:
                return str(error)
            if manifest is None or manifest.get("complete") is True:
                continue
            if numbered and manifest.get("logDirs", 1) == 1:
                continue  # (a directory named 0 inside a backup of one log dir is not one of its log dirs)
            started = manifest.get("startedMs")
            when = (
                time.strftime(" %Y-%m-%dT%H:%M:%SZ", time.gmtime(started / 1000))
                if isinstance(started, int) and started >= 0
                else ""
            )
            source = manifest.get("source")
            again = (
                f"seglogfs backup {shlex.quote(source)} {shlex.quote(str(directory))}"
                if isinstance(source, str) and source
                else "a backup into it"
            )
            return (
                f"{directory}: an incomplete backup: the backup into it started{when} did not complete "
                f"(cut short or failed), so its files are not a consistent copy; {again} completes it"
            )
    return None


def _report(stats: CopyStats, args: argparse.Namespace) -> None:
    if args.json:
        print(json.dumps(stats.as_json(), indent=2))
    elif args.stats:
        print("\n".join(stats.lines()))


def _say(args: argparse.Namespace) -> Callable[[str], None] | None:
    return (lambda line: print(line, flush=True)) if args.verbose else None


# -- backup ---------------------------------------------------------------------------------------
def _open_read_only(config: BrokerConfig) -> DataDir:
    for attempt in range(_OPEN_ATTEMPTS):
        try:
            return DataDir.open(config, read_only=True, now_ms=now_ms())
        except FileNotFoundError:  # a segment deleted (retention) while the open listed it
            if attempt == _OPEN_ATTEMPTS - 1:
                raise
    raise AssertionError("unreachable")


def _refusals_answered(command: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """A command whose `Refused` is one line on stderr and its exit code."""

    def run(args: argparse.Namespace) -> int:
        try:
            return command(args)
        except Refused as error:
            print(f"seglogfs: {error}", file=sys.stderr)
            return error.exit_code

    return run


def _backup(args: argparse.Namespace) -> int:
    dest = Path(args.dest)
    given = Path(args.src)
    mirror_root: Path | None = None
    if "," not in args.src and _is_mount_point(given):
        mirror_root, sources = given / MOUNT_MIRROR, [given]
    elif "," not in args.src and given.name == MOUNT_MIRROR and os.path.ismount(given.parent):
        mirror_root, sources = given, [given.parent]
    else:
        sources = [Path(part) for part in args.src.split(",") if part]
        if not sources:
            raise Refused("SRC names no directory", EXIT_USAGE)
        for log_dir in sources:
            if not log_dir.is_dir():
                raise Refused(f"{log_dir}: SRC is no data dir or mount point (no such directory)", EXIT_USAGE)
            if not _looks_like_log_dir(log_dir):
                raise Refused(
                    f"{log_dir}: SRC is no data dir or mount point (no partition dirs, no checkpoints)", EXIT_USAGE
                )
    for root in sources:
        _check_apart(root, "SRC", dest, "DEST")
    if dest.exists() and not dest.is_dir():
        raise Refused(f"{dest}: DEST is not a directory", EXIT_USAGE)
    if dest.is_dir():
        _refuse_live(dest, "DEST")
        if _is_mount_point(dest):
            raise Refused(f"{dest}: DEST is a seglogfs mount point", EXIT_USAGE)
        if _data_names(dest) and _read_manifest(dest) is None:
            raise Refused(
                f"{dest}: DEST holds files and is no seglogfs backup (no {MANIFEST}): give a new or empty directory",
                EXIT_USAGE,
            )
    source: _Source
    with contextlib.ExitStack() as stack:
        # The source first (a data dir that cannot be read leaves DEST as it was), then DEST.
        if mirror_root is not None:
            tree = _TreeSource(mirror_root, hidden=frozenset({MANIFEST}))
            names = {name for name, _ in tree.names(())}
            log_dirs = 1 if RECOVERY_POINT_CHECKPOINT in names else len(names)
            source, total = tree, tree.total_bytes()
        else:
            config = BrokerConfig.load(args.config, args.override or (), log_dirs=sources)
            data_dir = stack.enter_context(_open_read_only(config))
            log_dirs = len(config.log_dirs)
            source, total = _MirrorSource(Mirror(data_dir)), sum(log.size_in_bytes() for log in data_dir.partitions())
        stack.enter_context(_locked(dest, "DEST, a data dir,"))
        manifest: dict[str, object] = {
            "format": "seglogfs-backup",
            "version": MANIFEST_VERSION,
            "source": str(given.absolute()) if mirror_root else ",".join(str(s.absolute()) for s in sources),
            "sourceKind": "mount" if mirror_root is not None else "data dir",
            "logDirs": log_dirs,
            "startedMs": now_ms(),
            "complete": False,
        }
        # Marked incomplete before any file of DEST changes, complete after the last (module
        # docstring): a run that ends in between, however, leaves DEST saying so.
        _write_manifest(dest, manifest)
        try:
            with _terminated_as_interrupted(), Progress("backing up", total, plain=not args.json) as progress:
                copier = _Copier(source, restoring=False, progress=progress, say=_say(args))
                copier.copy(dest, frozenset({LOCK_FILE, MANIFEST}))
                manifest.update(complete=True, finishedMs=now_ms(), stats=copier.stats.as_json())
                if copier.refused:
                    manifest["refused"] = copier.refused
                _write_manifest(dest, manifest)
        except BrokenPipeError:  # the reader of -v went away (`| head`): quietly, but not as a success
            quiet_broken_pipe()
            return EXIT_DATA
        except (KeyboardInterrupt, _Terminated) as signalled:
            _tell(f"{dest}: the backup was interrupted: {_incomplete(dest)}")
            discard_stdout()  # (its -v lines: a reader that stopped reading must not hold the exit)
            return EXIT_TERMINATED if isinstance(signalled, _Terminated) else EXIT_INTERRUPTED
        except (OSError, EngineError) as error:
            _tell(f"{_one_line(error)}; {_incomplete(dest)}")
            return EXIT_DATA
    _report(copier.stats, args)
    return _refused_answer(copier.refused)


def _incomplete(dest: Path) -> str:
    return f"the backup did not complete ({dest} is marked incomplete until a backup into it completes)"


class _Terminated(BaseException):
    """SIGTERM during a copy: it ends as Ctrl-C does, removing the files it had staged."""


@contextlib.contextmanager
def _terminated_as_interrupted() -> Iterator[None]:
    """SIGTERM raises `_Terminated` meanwhile (in the main thread, where handlers belong)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def terminate(_signal: int, _frame: object) -> None:
        raise _Terminated

    previous = signal.signal(signal.SIGTERM, terminate)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _one_line(error: BaseException) -> str:
    """An error as the CLI prints it (an OSError as `path: reason`)."""
    if isinstance(error, OSError) and error.strerror:
        return f"{error.filename}: {error.strerror}" if error.filename else error.strerror
    return str(error)


def _tell(line: str) -> None:
    """One line on stderr, `seglogfs: …`; a stderr that is gone too (`2>&1 | head`) is let be."""
    with contextlib.suppress(OSError):
        print(f"seglogfs: {line}", file=sys.stderr, flush=True)


# -- restore --------------------------------------------------------------------------------------
def _backup_log_dirs(backup: Path, manifest: dict[str, object] | None) -> int:
    """How many log dirs the backup holds (a backup made by hand, `rsync -a MNT/.logdir/`, has
    no manifest: its layout tells)."""
    if manifest is not None:
        count = manifest.get("logDirs", 1)
        if not isinstance(count, int) or count < 1:
            raise Refused(f"{backup / MANIFEST}: bad logDirs {count!r}", EXIT_DATA)
        return count
    if _looks_like_log_dir(backup, lock_counts=False):  # (the restore made the .lock it holds)
        return 1
    numbered = sorted(name for name in _data_names(backup) if name.isascii() and name.isdigit())
    in_order = numbered == [str(i) for i in range(len(numbered))]
    if numbered and in_order and all(_looks_like_log_dir(backup / name, lock_counts=False) for name in numbered):
        return len(numbered)
    raise Refused(f"{backup}: BACKUP is no seglogfs backup nor a copy of a log dir", EXIT_USAGE)


def _restore(args: argparse.Namespace) -> int:
    backup = Path(args.backup)
    if not backup.is_dir():
        raise Refused(f"{backup}: BACKUP is no directory", EXIT_USAGE)
    targets = [Path(part) for part in args.datadir.split(",") if part]
    for target in targets:
        _check_apart(backup, "BACKUP", target, "DATADIR")
        if target.exists() and not target.is_dir():
            raise Refused(f"{target}: DATADIR is not a directory", EXIT_USAGE)
        _refuse_live(target, "DATADIR")
    stats = CopyStats()
    refused: list[str] = []
    with contextlib.ExitStack() as locks:
        locks.enter_context(_locked(backup, "BACKUP", optional=True))  # no backup into it meanwhile
        manifest = _read_manifest(backup)
        if manifest is not None and manifest.get("complete") is not True:
            raise Refused(
                f"{backup}: the backup did not complete (a backup into it was interrupted): run the backup again",
                EXIT_DATA,
            )
        count = _backup_log_dirs(backup, manifest)
        if len(targets) != count:
            raise Refused(f"the backup holds {count} log dirs, DATADIR names {len(targets)}", EXIT_USAGE)
        for target in targets:
            if target.is_dir() and _data_names(target) and not args.force:
                raise Refused(f"{target}: DATADIR is not empty (--force replaces what it holds)", EXIT_USAGE)
        for target in targets:
            locks.enter_context(_locked(target, "DATADIR, a data dir,"))
        for slot, target in enumerate(targets):
            root = backup if count == 1 else backup / str(slot)
            tree = _TreeSource(root, hidden=frozenset({MANIFEST, LOCK_FILE}))
            with Progress("restoring", tree.total_bytes(), plain=not getattr(args, "json", False)) as progress:
                copier = _Copier(tree, restoring=True, progress=progress, say=_say(args))
                try:
                    copier.copy(target, _NOT_DATA)
                except BrokenPipeError:  # the reader of -v went away: quietly, but the restore is not whole
                    quiet_broken_pipe()
                    return EXIT_DATA
            for field in ("bytes_sent", "files_sent", "files_appended", "files_skipped", "files_deleted"):
                setattr(stats, field, getattr(stats, field) + getattr(copier.stats, field))
            refused += copier.refused
    _report(stats, args)
    return _refused_answer(refused)


def _refused_answer(refused: list[str]) -> int:
    """The exit status of a copy that refused files (each named on stderr as it was met): all
    else is copied, but the copy is not the whole source, and a script must know."""
    if not refused:
        return EXIT_OK
    print(
        f"seglogfs: {len(refused)} files not copied (links, FIFOs, sockets and devices never are), "
        f"e.g. {refused[0]}; everything else is",
        file=sys.stderr,
    )
    return EXIT_DATA


# -- command line ---------------------------------------------------------------------------------
cmd_backup = _refusals_answered(_backup)
cmd_restore = _refusals_answered(_restore)


def add_commands(commands: argparse._SubParsersAction) -> None:
    """Register `backup` and `restore` with the `seglogfs` parser's subcommands."""
    backup = commands.add_parser(
        "backup",
        help="copy a data dir or a mount's .logdir into a backup dir, incrementally and consistently",
        description="Copy SRC (a data dir, even one being written, or a seglogfs mount point) into DEST: "
        "only what is new or grew since the last backup is sent, and what SRC no longer holds is deleted. "
        "DEST is marked incomplete (its .seglogfs-backup.json) until the backup has completed: a backup cut "
        "short or failed (a closed pipe, a full disk, a signal, kill -9) exits non-zero, check and consume of "
        "DEST say it is incomplete, restore refuses it, and the next backup into DEST completes it.",
        epilog="Exit codes: 0 complete, 1 failed or cut short (DEST marked incomplete) or files refused, "
        "2 bad command line, 3 DEST in use, 130 Ctrl-C, 143 SIGTERM.",
    )
    backup.add_argument("src", metavar="SRC", help="data dir (log dirs separated by commas) or seglogfs mount point")
    backup.add_argument("dest", metavar="DEST", help="backup dir: new, empty, or an earlier backup of SRC")
    backup.add_argument("-c", "--config", type=Path, metavar="server.properties", help="broker properties file")
    backup.add_argument("--override", action="append", metavar="KEY=VALUE", help="a config setting (repeatable)")
    _add_output(backup)
    backup.set_defaults(handler=cmd_backup)

    restore = commands.add_parser(
        "restore",
        help="copy a backup into a data dir (not one in use)",
        description="Copy BACKUP into DATADIR, which must not be in use (its .lock held) and must be "
        "empty unless --force: then it is made to hold exactly what the backup holds.",
    )
    restore.add_argument("backup", metavar="BACKUP", help="a dir made by seglogfs backup")
    restore.add_argument("datadir", metavar="DATADIR", help="log dir, or several separated by commas (log.dirs)")
    restore.add_argument("--force", action="store_true", help="replace what a non-empty DATADIR holds")
    _add_output(restore)
    restore.set_defaults(handler=cmd_restore)


def _add_output(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--stats", action="store_true", help="print bytes sent, files sent, skipped and deleted")
    parser.add_argument("--json", action="store_true", help="print those figures as one JSON object")
    parser.add_argument("-v", "--verbose", action="store_true", help="print each file sent, appended or deleted")


def main(argv: list[str] | None = None) -> int:
    """`python -m seglogfs.mount_tools.backup backup|restore …`: the two commands on their own,
    with the CLI's exit codes."""
    parser = argparse.ArgumentParser(prog="seglogfs", description="Backups of Kafka data dirs.")
    add_commands(parser.add_subparsers(dest="command", required=True, metavar="COMMAND"))
    args = parser.parse_args(argv)
    handler: Callable[[argparse.Namespace], int] = args.handler
    try:
        return handler(args)
    except LogDirLockedError as error:
        print(f"seglogfs: {error}", file=sys.stderr)
        return EXIT_LOCKED
    except EngineError as error:
        print(f"seglogfs: {error}", file=sys.stderr)
        return EXIT_DATA
    except OSError as error:
        where = f"{error.filename}: " if error.filename else ""
        print(f"seglogfs: {where}{error.strerror or error}", file=sys.stderr)
        return EXIT_DATA
    except KeyboardInterrupt:
        discard_stdout()  # (as an interrupted backup does)
        return EXIT_INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
