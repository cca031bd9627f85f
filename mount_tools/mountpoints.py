"""What is mounted at a path, whether a FUSE mount there lost its process, and unmounting.

The kernel's table of this process's mounts is /proc/self/mountinfo (what `findmnt` reads): one
line per mount, the mount point as the fifth field with space, tab, newline and backslash
written as octal escapes, then after a lone `-` the filesystem type (`fuse.seglogfs`), the
source (a seglogfs mount's data dir, as `fsname=` gave it) and the superblock options. Mounts
stacked on one mount point are listed in the order they were made: the last one is on top.

A FUSE mount whose process died (kill -9, a crash, the OOM killer) stays in the table, and every
request that reaches it fails with ENOTCONN ("Transport endpoint is not connected"; only what the
kernel has cached, such as the mount point's attributes, still answers) until it is unmounted; a
lazy unmount (`fusermount3 -u -z`, `umount -l`) detaches it even while descriptors into it are
still open.
"""

from __future__ import annotations

import errno
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

SEGLOGFS_TYPE = "fuse.seglogfs"
_STALE_ERRNOS = (errno.ENOTCONN, errno.ECONNABORTED)  # (the kernel's answers with no FUSE process)
_OCTAL_ESCAPE = re.compile(r"\\([0-7]{3})")


@dataclass(frozen=True)
class MountEntry:
    """One line of /proc/self/mountinfo."""

    mount_point: str
    fs_type: str
    source: str
    read_only: bool = False  # (`ro` among the mount's own options)

    @property
    def is_seglogfs(self) -> bool:
        return self.fs_type == SEGLOGFS_TYPE

    @property
    def is_fuse(self) -> bool:
        return self.fs_type == "fuse" or self.fs_type.startswith(("fuse.", "fuseblk"))

    def describe(self) -> str:
        """`fuse.seglogfs from /var/lib/seglogfs`, as an admin reads it in `findmnt`."""
        return f"{self.fs_type} from {self.source}"


def _unescape(field: str) -> str:
    return _OCTAL_ESCAPE.sub(lambda match: chr(int(match.group(1), 8)), field)


def mounts(table: Path = Path("/proc/self/mountinfo")) -> list[MountEntry]:
    """This process's mounts, in the kernel's order (stacked mounts: the top one last)."""
    entries = []
    for line in table.read_text(errors="surrogateescape").splitlines():
        fields = line.split(" ")
        try:
            separator = fields.index("-", 6)
            entries.append(
                MountEntry(
                    _unescape(fields[4]),
                    _unescape(fields[separator + 1]),
                    _unescape(fields[separator + 2]),
                    read_only="ro" in fields[5].split(","),
                )
            )
        except (ValueError, IndexError):  # not a line of the documented shape: not ours to judge
            continue
    return entries


def real(path: Path) -> str:
    """`path` made absolute with its symbolic links resolved, as mountinfo names mount points.
    A stale mount point itself cannot be looked at (ENOTCONN); its parents are resolved and its
    own name kept."""
    return os.path.realpath(path)


def mount_containing(where: str) -> MountEntry | None:
    """The mount `where` (a `real` path) lies on: the top one of those with the longest mount
    point that is `where` or one of its parents."""
    best: MountEntry | None = None
    for entry in mounts():
        point = entry.mount_point
        inside = where == point or where.startswith(point.rstrip("/") + "/")
        if inside and (best is None or len(point) >= len(best.mount_point)):
            best = entry
    return best


def is_stale(path: Path | str) -> bool:
    """Whether asking about `path` fails as it does on a FUSE mount whose process is gone. The
    question is statfs, which the kernel always forwards to the FUSE process: a `stat` of a mount
    point looked at a moment before the process died is answered from the kernel's attribute
    cache, as if all were well."""
    try:
        os.statvfs(path)
    except OSError as error:
        return error.errno in _STALE_ERRNOS
    return False


def unmount_command(where: str, *, lazy: bool) -> list[str]:
    """fusermount3 (which lets a user unmount the FUSE mounts they made), else umount(8)."""
    tool = shutil.which("fusermount3") or shutil.which("fusermount")
    if tool:
        return [tool, "-u", "-z", where] if lazy else [tool, "-u", where]
    return ["umount", "-l", where] if lazy else ["umount", where]


def unmount(where: str, *, lazy: bool = False) -> str | None:
    """Unmount the mount at `where`; None when done, else what the tool said (one line)."""
    import subprocess  # noqa: PLC0415 (only the commands that unmount need it, not every start)

    done = subprocess.run(unmount_command(where, lazy=lazy), capture_output=True, text=True, check=False)
    if done.returncode == 0:
        return None
    said = " ".join(done.stderr.split())
    return said or f"{' '.join(unmount_command(where, lazy=lazy))} exited with {done.returncode}"
