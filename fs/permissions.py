"""Who may do what through the mount: every node's owner, group and mode come from the data dir.

The kernel checks them (the mount asks for FUSE's `default_permissions` whenever it lets other
users in, `allow_other`), so a node must show exactly who may read or write what it stands for:

    mount root, <topic>/          the data dir's (its first log dir's) owner, group and mode
    <topic>/config                the same, without x bits: writing it changes the data dir
    <topic>/<p>/ and the dirs     the partition's files': read bits give r-x, write bits w and x
      below it (by-offset/, …)    (w on dirs that hold only views too: `rm -r` of the topic
                                  unlinks what is in them, see fs.operations)
    views, status                 the partition's files' owner and group, their read bits
    <topic>/<p>/append[.*]        the partition's files' owner and group, their write bits
    <topic>/append[.jsonl]        the write bits every partition of the topic shares, when they
                                  have one owner and group (else root's, write for root only)
    .logdir/…                     each file's and directory's own (engine.mirror)

"The partition's files" are its active segment's `.log` (the one appends go to; where a
partition's segments differ, that one decides), or, for a partition with no segment (offline),
its directory's permission bits without x. A read-only mount shows no write bits anywhere.

Modes are read from the disk at each stat the kernel asks for. It keeps a directory's for a
second (`DIRECTORY_VALID_S`), a file's as long as it keeps the file's size (until the file
changes, at most an hour: a view's size is costly to keep asking for). Every path goes through
directories that take their bits from the same files as the node at its end, so a chmod or chown
in the data dir that takes a user's access away takes effect within a second for every path
opened after it (a descriptor already open stays open, as on disk). Free of any FUSE binding, as
the rest of the tree model.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path

READ_BITS = 0o444
WRITE_BITS = 0o222
PERMISSION_BITS = 0o777  # no set-id or sticky bits on a node the mount makes up
DIRECTORY_VALID_S = 1.0  # how long the kernel may keep a directory's owner and mode (see above)


@dataclass(frozen=True)
class Access:
    """An owner, a group and permission bits (`mode`, as stat's, without the file type)."""

    uid: int
    gid: int
    mode: int

    @classmethod
    def of(cls, path: Path, *, follow: bool = False) -> Access:
        """`path`'s, as it is on disk (its link's own unless `follow`)."""
        return cls.of_status(os.stat(path, follow_symlinks=follow))

    @classmethod
    def of_status(cls, status: os.stat_result) -> Access:
        return cls(status.st_uid, status.st_gid, stat.S_IMODE(status.st_mode))

    def with_mode(self, mode: int) -> Access:
        return Access(self.uid, self.gid, mode)

    def reading(self) -> Access:
        """A file that only reads what this guards (a view, `status`)."""
        return self.with_mode(self.mode & READ_BITS)

    def writing(self) -> Access:
        """A file that only writes to what this guards (an append file)."""
        return self.with_mode(self.mode & WRITE_BITS)

    def file(self) -> Access:
        """A file that reads and writes what this directory guards (`config`)."""
        return self.with_mode(self.mode & (READ_BITS | WRITE_BITS))

    def directory(self) -> Access:
        """A directory leading to files with these bits: x for whoever may read or write them."""
        bits = self.mode & (READ_BITS | WRITE_BITS)
        return self.with_mode(bits | (bits & READ_BITS) >> 2 | (bits & WRITE_BITS) >> 1)


@dataclass(frozen=True)
class Caller:
    """Who asks (a FUSE request's uid and gid, and the supplementary groups of its process),
    for the one check the kernel cannot make itself: deleting a topic through `rmdir` removes
    its partitions' files too, which on disk takes write permission on each partition dir."""

    uid: int
    gid: int
    groups: frozenset[int] = frozenset()

    def may_write(self, access: Access) -> bool:
        """Whether the caller may write what `access` guards (root may write anything)."""
        if self.uid == 0:
            return True
        if self.uid == access.uid:
            return bool(access.mode & 0o200)
        if access.gid == self.gid or access.gid in self.groups:
            return bool(access.mode & 0o020)
        return bool(access.mode & 0o002)


ROOT_ONLY = Access(0, 0, 0)  # where nothing on disk says who may: root alone (it needs no bits)


def shared_access(accesses: list[Access]) -> Access:
    """The access every one of `accesses` grants: their bits in common when they have one owner
    and group, else root's alone (a topic's append writes to any of its partitions)."""
    owners = {(access.uid, access.gid) for access in accesses}
    if len(owners) != 1:
        return ROOT_ONLY
    mode = PERMISSION_BITS
    for access in accesses:
        mode &= access.mode
    return accesses[0].with_mode(mode)


def chown_created(paths: list[Path], uid: int, gid: int) -> None:
    """Give what a caller made through the mount (a topic's partition dirs and their files) to
    the caller, as a file it makes on disk would be; nothing followed through a link."""
    for path in paths:
        os.chown(path, uid, gid, follow_symlinks=False)
        with os.scandir(path) as entries:
            for entry in entries:
                os.chown(entry.path, uid, gid, follow_symlinks=False)
