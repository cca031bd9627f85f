"""The copy `backup` and `restore` make (mount_tools.backup says what they promise): a source
tree — a data dir's mirror (`engine.mirror`, resolved in this process over a read-only open) or a
directory of files (a mount's `.logdir`, a backup) — copied into a target directory, incremental
by kind of file, in the order that keeps the target consistent when the copy is cut short, every
file written through a temporary file of its own and fsynced, links and special files refused.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import stat
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from seglogfs.engine import EngineError
from seglogfs.engine.errors import UnsafeFileError
from seglogfs.engine.files import is_regular, open_regular, write_all
from seglogfs.engine.log.checkpoint import (
    fsync_dir,
)
from seglogfs.engine.log.naming import INDEX_SUFFIXES, LOG_SUFFIX, parse_segment_file_name
from seglogfs.engine.mirror import Mirror, MirrorFile
from seglogfs.engine.stored.catalogue import FileAttributes
from seglogfs.mount_tools.progress import Progress

_TMP_SUFFIX = ".seglogfs-tmp"


_CHUNK_BYTES = 1 << 20


HEAD_BYTES = 4096  # compared, with the tail, before appending to a copy


TAIL_BYTES = 64 * 1024


class SourceChanged(EngineError):
    """A file got shorter while it was copied (truncated under the copy)."""


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


class SourceFile:
    """A source file open for the copy: its size and attributes as found at open, its bytes.
    `exact`: the size is the file's for as long as it is open (a mirror file resolved in this
    process); else the bytes may end before it — through a mount, a generated file's content is
    the one resolved at open, which a later stat may already find longer."""

    def __init__(
        self,
        name: str,
        size: int,
        attributes: FileAttributes,
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


class Source(Protocol):
    def names(self, parts: tuple[str, ...]) -> list[tuple[str, bool]]:
        """(name, is a directory) of the directory `parts`; FileNotFoundError when gone."""
        ...

    def directory(self, parts: tuple[str, ...]) -> FileAttributes: ...

    def open(self, parts: tuple[str, ...]) -> SourceFile:
        """The file `parts`, open; FileNotFoundError when gone."""
        ...


class MirrorSource:
    """The mirror resolved in this process (a data dir open read-only)."""

    def __init__(self, mirror: Mirror, hidden: frozenset[str]) -> None:
        self.mirror = mirror
        self.hidden = hidden  # names at the root left out (a data dir that is itself a backup: its manifest)

    def names(self, parts: tuple[str, ...]) -> list[tuple[str, bool]]:
        out = []
        for name in self.mirror.names(parts):
            if not parts and name in self.hidden:
                continue
            try:
                out.append((name, self.mirror.entry((*parts, name)).is_dir))
            except FileNotFoundError:
                continue
        return out

    def directory(self, parts: tuple[str, ...]) -> FileAttributes:
        entry = self.mirror.entry(parts)
        return FileAttributes(entry.mode, entry.mtime_ns, self._owner(parts, None))

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

    def open(self, parts: tuple[str, ...]) -> SourceFile:
        entry = self.mirror.entry(parts)
        if entry.link is not None:  # (never its target: refused, as a FIFO or a device is)
            raise UnsafeFileError(entry.path or "/".join(parts), "a symbolic link")
        file = MirrorFile(self.mirror, parts)
        entry = file.entry
        if entry.is_dir:
            file.close()
            raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), "/".join(parts))
        attributes = FileAttributes(entry.mode, entry.mtime_ns, self._owner(parts, entry.path))
        return SourceFile("/".join(parts), entry.size, attributes, file.read, file.close, exact=True)


class TreeSource:
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

    def directory(self, parts: tuple[str, ...]) -> FileAttributes:
        status = os.stat(self.root.joinpath(*parts))
        return FileAttributes(stat.S_IMODE(status.st_mode), status.st_mtime_ns, (status.st_uid, status.st_gid))

    def open(self, parts: tuple[str, ...]) -> SourceFile:
        fd = open_regular(self.root.joinpath(*parts))  # (UnsafeFileError for a link, a FIFO, …)
        status = os.fstat(fd)
        attributes = FileAttributes(stat.S_IMODE(status.st_mode), status.st_mtime_ns, (status.st_uid, status.st_gid))
        path = str(self.root.joinpath(*parts))
        return SourceFile(
            path,
            status.st_size,
            attributes,
            lambda offset, length: os.pread(fd, length, offset),
            lambda: os.close(fd),
            exact=False,
        )

    def total_bytes(self) -> int:
        return sum(path.lstat().st_size for path in self.root.rglob("*") if is_regular(path))


def segment_kind(name: str) -> str | None:
    parsed = parse_segment_file_name(name)
    if parsed is None or parsed[2] or parsed[1] not in (LOG_SUFFIX, *INDEX_SUFFIXES):
        return None
    return parsed[1]


def orphan_index(name: str, present: set[str]) -> bool:
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


class Copier:
    """Makes a target directory hold what a source holds, by the rules of the module docstring.
    `restoring`: the copy is to be written to (modes get owner read and write)."""

    def __init__(
        self,
        source: Source,
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
        logs = [name for name in files if segment_kind(name) == LOG_SUFFIX]
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
            if orphan_index(name, present):  # its segment went (retention) while the logs were copied
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
            kind = segment_kind(name)
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

    def _same_prefix(self, target: Path, item: SourceFile, have: int) -> bool:
        """Whether the copy's `have` bytes are the source's first (head and tail compared)."""
        tail = min(TAIL_BYTES, have)
        with os.fdopen(open_regular(target), "rb", buffering=0) as file:
            for position, length in ((0, min(HEAD_BYTES, have)), (have - tail, tail)):
                if os.pread(file.fileno(), length, position) != item.read(position, length):
                    return False
        return True

    def _mode(self, attributes: FileAttributes, *, is_dir: bool) -> int:
        if self.restoring:
            return attributes.mode | (0o700 if is_dir else 0o600)
        return attributes.mode

    def _apply(self, fd: int, attributes: FileAttributes) -> None:
        """Mode, owner (as root) and mtime of a file written, through its descriptor."""
        os.fchmod(fd, self._mode(attributes, is_dir=False))
        if self._as_root and attributes.owner is not None:
            os.fchown(fd, *attributes.owner)
        os.utime(fd, ns=(attributes.mtime_ns, attributes.mtime_ns))

    def _set_attributes(self, path: Path, attributes: FileAttributes, *, is_dir: bool) -> None:
        status = os.lstat(path)
        mode = self._mode(attributes, is_dir=is_dir)
        if stat.S_IMODE(status.st_mode) != mode:
            os.chmod(path, mode)
        if self._as_root and attributes.owner is not None and (status.st_uid, status.st_gid) != attributes.owner:
            os.chown(path, *attributes.owner, follow_symlinks=False)
        if status.st_mtime_ns != attributes.mtime_ns:
            os.utime(path, ns=(attributes.mtime_ns, attributes.mtime_ns), follow_symlinks=False)

    def _skip(self, target: Path, item: SourceFile) -> None:
        self.stats.files_skipped += 1
        self._set_attributes(target, item.attributes, is_dir=False)

    def _write_whole(self, target: Path, chunks: Iterator[bytes], item: SourceFile, where: str) -> Path:
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

    def _append(self, target: Path, item: SourceFile, have: int, where: str) -> None:
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
