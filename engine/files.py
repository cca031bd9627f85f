"""Opening files in an untrusted data dir: never through a link, never blocking, regular files only.

A data dir is written by other programs and other users (a broker, its operators, a backup tool)
while seglogfs runs as root. A name where a segment, an index, a checkpoint or a config file
belongs may hold a symbolic link (to `/etc/shadow`, to `/root/.ssh/authorized_keys`), a FIFO (an
`open` that never returns), a socket, a device or a directory. Every file below a data dir's root
is therefore opened here:

* `O_NOFOLLOW`: a link as the last component fails with ELOOP instead of being followed, for
  reads and writes alike; partition directories are checked without following links where they
  are listed (`is_directory`);
* `O_NONBLOCK`: a FIFO's open returns at once (and a write-only one fails with ENXIO) instead of
  waiting for a writer; the flag is cleared again on the regular file that is kept;
* `lstat` before an open that creates nothing, so that a device node is refused without being
  opened (opening some devices has effects), and `fstat` after, so that what was opened is what
  is kept: a regular file, or `UnsafeFileError` naming the path and what it holds.

The data dir's root itself may be a link (`/var/lib/kafka` often is): callers pass paths built
from the root as the user named it, and only the components below it are held to these rules.

Thread-safe: functions only.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Callable

from seglogfs.engine.errors import UnsafeFileError

_SAFE_FLAGS = os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC


def describe_mode(mode: int) -> str:
    """What a non-regular file is, in the words of `ls -l`'s first letter, for error messages."""
    if stat.S_ISLNK(mode):
        return "a symbolic link"
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode):
        return "a character device"
    if stat.S_ISBLK(mode):
        return "a block device"
    return "not a regular file"


def check_regular(path: str | os.PathLike[str], mode: int) -> None:
    """`UnsafeFileError` unless `mode` (an `lstat`'s or `fstat`'s) is a regular file's."""
    if not stat.S_ISREG(mode):
        raise UnsafeFileError(path, describe_mode(mode))


def open_regular(path: str | os.PathLike[str], flags: int = os.O_RDONLY, mode: int = 0o644) -> int:
    """`os.open(path, flags)` for a file in a data dir: the descriptor of a regular file, never
    of what a link names, never blocking on a FIFO.

    `flags` are `os.open`'s (`O_RDONLY`, `O_RDWR | O_CREAT`, `O_WRONLY | O_APPEND`, …); the safety
    flags are added here. A missing file is `FileNotFoundError` as from `os.open`; anything but a
    regular file (or a link, whatever it points at) is `UnsafeFileError(path, what)`. Other
    `OSError`s (EACCES, EMFILE, ENOSPC, …) pass through unchanged."""
    if not flags & os.O_CREAT:
        with contextlib.suppress(FileNotFoundError):  # the open below says so, with the path
            check_regular(path, os.lstat(path).st_mode)
    try:
        fd = os.open(path, flags | _SAFE_FLAGS, mode)
    except OSError as error:
        if error.errno in (errno.ELOOP, errno.EISDIR, errno.ENXIO, errno.EOPNOTSUPP):
            # ELOOP: a link (O_NOFOLLOW); EISDIR: a directory opened for writing; ENXIO: a
            # FIFO with no reader, or a socket, opened for writing. lstat says which.
            try:
                found = os.lstat(path).st_mode
            except OSError:
                raise error from None
            check_regular(path, found)
        raise
    try:
        check_regular(path, os.fstat(fd).st_mode)
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_regular(path: str | os.PathLike[str], limit: int) -> bytes:
    """The whole content of a small regular file (a checkpoint, `meta.properties`, a config),
    opened as `open_regular` opens; `UnsafeFileError` if it holds more than `limit` bytes (a file
    that size is not what belongs there, and is not read into memory)."""
    fd = open_regular(path)
    try:
        size = os.fstat(fd).st_size
        if size > limit:
            raise UnsafeFileError(path, f"a file of {size} bytes (at most {limit} belong there)")
        chunks = []
        remaining = limit + 1
        while remaining > 0:
            chunk = os.read(fd, min(remaining, 1 << 16))
            if not chunk:
                break
            chunks.append(chunk)
            remaining -= len(chunk)
        data = b"".join(chunks)
        if len(data) > limit:  # it grew since the fstat
            raise UnsafeFileError(path, f"a file of more than {limit} bytes")
        return data
    finally:
        os.close(fd)


def decode_text(path: str | os.PathLike[str], data: bytes, error: Callable[[str], Exception]) -> str:
    """`data` (a small text file's, read from `path`) as UTF-8 text, or `error(message)` raised
    naming the file, the line and the byte that is not UTF-8: such a file was written by
    something else than its owner (a stray `\\xff`), and the message says where to look."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as bad:
        line = data.count(b"\n", 0, bad.start) + 1
        column = bad.start - (data.rfind(b"\n", 0, bad.start) + 1) + 1
        raise error(
            f"{os.fspath(path)}: line {line}, column {column}: byte 0x{data[bad.start]:02x} is not UTF-8 text"
        ) from None


def is_directory(path: str | os.PathLike[str]) -> bool:
    """Whether `path` is a directory itself, not a link to one (`os.path.isdir` follows links)."""
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except OSError:
        return False


def is_regular(path: str | os.PathLike[str]) -> bool:
    """Whether `path` is a regular file itself, not a link to one (`Path.is_file` follows links)."""
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except OSError:
        return False


__all__ = [
    "check_regular",
    "decode_text",
    "describe_mode",
    "is_directory",
    "is_regular",
    "open_regular",
    "read_regular",
]


def write_all(fd: int, data: bytes | bytearray | memoryview, position: int | None = None) -> None:
    """All of `data` to `fd`, at `position` (pwrite) or at the file's offset (write): a short
    write (a signal, a full disk's last bytes before ENOSPC) is continued, not taken for done."""
    view = memoryview(data)
    while view:
        if position is None:
            written = os.write(fd, view)
        else:
            written = os.pwrite(fd, view, position)
            position += written
        view = view[written:]
