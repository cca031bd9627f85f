"""What every node of the mounted tree has in common, free of any FUSE binding.

A `Node` is a directory or a file of the tree (`fs.tree.Tree` holds them by inode). It answers
`attributes()`, a directory `children()` and `child(name)`, a file `open(flags)` with a
`Handle`, the object a file descriptor reads and writes through. A request the filesystem
turns down raises `Refused` (an errno and what was asked, where); engine errors pass through
as they are. The FUSE adapter (`fs.operations`) maps both to errno values, in one place.

Writes report what they changed as `Changes`: the inodes whose attributes (sizes) changed and
the directory entries that now name another inode, for the adapter to tell the kernel.

Unless a method says "on the loop", it may block (disk, rendering) and is called in a worker
thread.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from seglogfs.engine import PartitionLog
from seglogfs.fs.permissions import DIRECTORY_VALID_S, ROOT_ONLY, WRITE_BITS, Access, Caller

if TYPE_CHECKING:
    from seglogfs.fs.tree import Tree

IO_BLOCK_BYTES = 1 << 20  # st_blksize where large requests are cheap (see Attributes.block_bytes)
PAGE_BYTES = 4096


class Refused(OSError):
    """A request the filesystem turns down: `errno` and what was asked, where (`what`)."""

    def __init__(self, number: int, what: str) -> None:
        super().__init__(number, os.strerror(number))
        self.what = what

    def __str__(self) -> str:
        return f"{self.what}: {self.strerror}"


class NoEntry(Refused):
    """ENOENT for a name that is simply not there: ordinary (a shell probes names, mkdir looks
    the name up first), so not worth a warning."""

    def __init__(self, what: str) -> None:
        super().__init__(errno.ENOENT, what)


@dataclass(frozen=True)
class Attributes:
    """A node's `stat`, as the tree knows it. `valid_s` None: valid until the filesystem says
    otherwise (the adapter invalidates); 0: look again on every stat.

    The preferred I/O size (`block_bytes`) tells cat and cp how much to move at once: each write
    to an append file becomes one record batch and each read of a mirror file or a view one
    request, so large is cheap there (FUSE passes up to 1 MiB a request; a view renders a
    megabyte in about half a millisecond, and `cat` of a view ran half again as fast with 1 MiB
    requests as with its own 128 KiB).

    `uid` and `gid` own the node, and `mode` holds its permission bits, as the data dir says
    (fs.permissions): the kernel checks them.

    `blocks` (st_blocks, of 512 bytes) counts what the node's bytes take on disk: none for what
    the mount renders (views, `status`, `config`: /proc's files have none either), so that `du`
    of a mount counts the data once, in `.logdir`, whose files are the data dir's."""

    mode: int
    size: int = 0
    mtime_ns: int = 0
    block_bytes: int = PAGE_BYTES
    valid_s: float | None = None
    uid: int = 0
    gid: int = 0
    blocks: int = 0

    @property
    def is_dir(self) -> bool:
        return stat.S_ISDIR(self.mode)

    @property
    def nlink(self) -> int:
        return 2 if self.is_dir else 1


@dataclass
class Changes:
    """What a request changed that the kernel may have cached."""

    inodes: list[int] = field(default_factory=list)  # attributes (sizes) changed
    entries: list[tuple[int, str]] = field(default_factory=list)  # (directory inode, name) names another inode

    def __iadd__(self, other: Changes) -> Changes:
        self.inodes += other.inodes
        self.entries += other.entries
        return self

    def __bool__(self) -> bool:
        return bool(self.inodes or self.entries)


class Handle:
    """An open file. Refuses what its kind of file does not do."""

    seekable = True
    writable = False  # flush, fsync and release do work (in a worker thread)

    def __init__(self, node: Node) -> None:
        self.node = node

    def read_now(self, position: int, length: int) -> bytes | bytearray | memoryview | None:
        """`read` when it needs neither the disk nor much work (on the loop), else None."""
        return None

    def read(self, position: int, length: int) -> bytes | bytearray | memoryview:
        raise Refused(errno.EBADF, f"read {self.node.path}")

    def grown_size(self) -> int | None:
        """For a file that grows while open, a size it has at least now (cheap: on the loop);
        None for one that does not grow under its readers."""
        return None

    def write(self, position: int, data: bytes) -> Changes:
        raise Refused(errno.EBADF, f"write {self.node.path}")

    def write_now(self, position: int, data: bytes) -> Changes | None:
        """`write` when it needs neither the disk nor another thread (on the loop), else None."""
        return None

    def truncate(self, size: int) -> None:
        """`ftruncate` of a descriptor of the handle."""
        self.node.truncate(size)

    def flush(self) -> Changes:
        """A descriptor of the handle is closed (`close`, and each `dup` of it)."""
        return Changes()

    def flush_now(self) -> Changes | None:
        """`flush` when it has nothing to do off the loop (on the loop), else None."""
        return None if self.writable else self.flush()

    def fsync(self) -> Changes:
        return Changes()

    def release(self) -> Changes:
        """The last descriptor of the handle is gone."""
        return Changes()

    def release_now(self) -> Changes | None:
        """`release` when it has nothing to do off the loop (on the loop), else None."""
        return None if self.writable else self.release()


class BytesHandle(Handle):
    """A small file's content as it was at open."""

    def __init__(self, node: Node, content: bytes) -> None:
        super().__init__(node)
        self.content = content

    def read_now(self, position: int, length: int) -> bytes:
        return self.content[position : position + length]

    def read(self, position: int, length: int) -> bytes:
        return self.read_now(position, length)


class Node:
    """A directory or file of the tree. `key` names it in the tree's inode table; `path` is its
    place in the mount, for log lines."""

    is_dir = False

    def __init__(self, tree: Tree, inode: int, key: tuple[object, ...], path: str) -> None:
        self.tree = tree
        self.inode = inode
        self.key = key
        self.path = path
        self.lookups = 0  # the kernel's lookup count of the inode (Tree.note_lookup, Tree.forget)

    @property
    def looked_up(self) -> bool:
        """Whether the kernel knows the inode (it may cache its attributes)."""
        return self.lookups > 0

    def attributes(self) -> Attributes:
        raise NotImplementedError

    def listed_attributes(self) -> Attributes:
        """The attributes for a lookup or a directory listing: as `attributes`, except where
        those cost a measure (a view's first look), which waits for a `stat` or a read."""
        return self.attributes()

    def children(self) -> list[tuple[str, Node]]:
        raise Refused(errno.ENOTDIR, f"list {self.path}")

    def child(self, name: str) -> Node:
        """The entry called `name` (ENOENT when there is none)."""
        for child_name, node in self.children():
            if child_name == name:
                return node
        raise NoEntry(f"lookup {join(self.path, name)}")

    def mkdir(self, name: str, owner: tuple[int, int] | None = None) -> Node:
        """A new directory `name` in this one, its files given to `owner` (the caller's uid and
        gid; None: the mount's)."""
        if not self.is_dir:
            raise Refused(errno.ENOTDIR, f"mkdir {join(self.path, name)}")
        raise Refused(errno.EPERM, f"mkdir {join(self.path, name)}: topics only at the top")

    def create(self, name: str, mode: int, owner: tuple[int, int]) -> Node:
        """A new file `name` in this directory (open(2) with O_CREAT), `owner`'s."""
        raise Refused(errno.EPERM, f"create {join(self.path, name)}")

    def unlink(self, name: str) -> None:
        raise Refused(errno.EPERM, f"unlink {join(self.path, name)}")

    def rmdir(self, name: str, caller: Caller) -> None:
        """Remove this directory's entry `name`, a directory, for `caller`."""
        raise Refused(errno.EPERM, f"rmdir {join(self.path, name)}")

    def remove_below(self, name: str) -> None:
        """`rm -r`'s unlink or rmdir of this directory's entry `name` while it removes a topic
        dir or a partition dir above (fs.operations, "Removing"): what the mount makes up stays
        as it is, since only the rmdir of what is held decides. A directory named here is
        superseded, because the kernel takes it for removed and would refuse any lookup in it;
        a file made beside `config` goes for real. NoEntry when there is no such entry."""
        node = self.child(name)
        if node.is_dir:
            self.tree.supersede(node)

    def rename(self, name: str, new_parent: Node, new_name: str) -> Changes:
        """Rename this directory's entry `name` to `new_parent`'s `new_name`."""
        raise Refused(errno.EPERM, f"rename {join(self.path, name)}")

    def open_now(self, flags: int) -> Handle | None:
        """`open` when it needs no work off the loop (on the loop), else None."""
        return None

    def open(self, flags: int) -> Handle:
        """`flags` are open(2)'s (the access mode, O_TRUNC, O_APPEND, …)."""
        if self.is_dir:
            raise Refused(errno.EISDIR, f"open {self.path}")
        raise Refused(errno.EACCES, f"open {self.path}")

    def truncate(self, size: int) -> None:
        raise Refused(errno.EINVAL, f"truncate {self.path}")

    def readlink(self) -> str:
        """A symbolic link's target (only `.logdir` shows links: those of the data dir)."""
        raise Refused(errno.EINVAL, f"readlink {self.path}: not a symbolic link")

    def forgettable(self) -> bool:
        """Whether the node goes when the kernel forgets it (it is made again on a lookup)."""
        return False

    # -- helpers for subclasses ----------------------------------------------------------------------
    def shown(self, kind: int, access: Access, **attributes: Any) -> Attributes:
        """Attributes of a node of `kind` (S_IFREG, S_IFDIR) owned and guarded as `access`
        says (without write bits on a read-only mount)."""
        mode = access.mode & ~WRITE_BITS if self.tree.read_only else access.mode
        return Attributes(kind | mode, uid=access.uid, gid=access.gid, **attributes)

    def directory_attributes(self) -> Attributes:
        """A directory of the data dir's as a whole (the mount root, a topic's)."""
        return self.shown(
            stat.S_IFDIR, self.tree.data_dir_access(), mtime_ns=self.tree.mounted_ns, valid_s=DIRECTORY_VALID_S
        )

    def refuse_writes(self, flags: int) -> None:
        """EACCES unless the open only reads."""
        if flags & os.O_ACCMODE != os.O_RDONLY:
            raise Refused(errno.EACCES, f"write {self.path}: read-only file")


class PartitionNode(Node):
    """A node that belongs to one partition."""

    def __init__(
        self, tree: Tree, inode: int, key: tuple[object, ...], path: str, *, topic: str, partition: int
    ) -> None:
        super().__init__(tree, inode, key, path)
        self.topic = topic
        self.partition = partition

    @property
    def log(self) -> PartitionLog:
        return self.tree.data_dir.partition(self.topic, self.partition)

    def partition_access(self) -> Access:
        return log_access(self.log)

    def check_online(self, what: str) -> None:
        """EIO naming why for a partition taken offline (its storage failed); its `status`
        stays readable and says why."""
        reason = self.log.offline_reason
        if reason is not None:
            raise Refused(errno.EIO, f"{what} {self.path}: the partition is offline ({reason})")


def log_access(log: PartitionLog) -> Access:
    """Who may read and write a partition's files: its active segment's `.log` (where segments
    differ, the one appends go to); for a partition with no segment (offline), its directory's
    bits without x; root's alone when neither is there as it should be."""
    with contextlib.suppress(OSError):
        segments = log.segments
        if segments:
            status = os.lstat(segments[-1].log_path)
            if stat.S_ISREG(status.st_mode):
                return Access.of_status(status)
        else:
            status = os.lstat(log.directory)
            if stat.S_ISDIR(status.st_mode):
                return Access.of_status(status).file()
    return ROOT_ONLY


def join(directory: str, name: str) -> str:
    """A path in the mount for log lines: `t/0` and `records` → `t/0/records`."""
    if not name:
        return directory
    return f"{directory}/{name}" if directory else name
