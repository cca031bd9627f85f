"""`.logdir` in the tree: its directories and files (engine.mirror resolves what they hold)."""

from __future__ import annotations

import errno
import stat
from typing import TYPE_CHECKING

from seglogfs.engine.mirror import MirrorEntry, MirrorFile
from seglogfs.fs.node import IO_BLOCK_BYTES, Attributes, Changes, Handle, Node, NoEntry, Refused, join
from seglogfs.fs.permissions import Access

if TYPE_CHECKING:
    from seglogfs.fs.tree import Tree


class MirrorNode(Node):
    """A path below `.logdir` (`parts`, () for `.logdir` itself), resolved again at each stat:
    rsync must see what a mirrored file is now. Its stat shows the owner, group and mode of the
    file on disk (what `rsync -a` gives the copy, and what the kernel checks: whoever cannot
    read a segment in the data dir cannot read it here), without write bits on a read-only
    mount; opening it for writing is refused all the same (EACCES, or the kernel's EROFS on a
    read-only mount)."""

    def __init__(self, tree: Tree, inode: int, key: tuple[object, ...], path: str, parts: tuple[str, ...]) -> None:
        super().__init__(tree, inode, key, path)
        self.parts = parts
        self.entry = self.resolve()

    def resolve(self) -> MirrorEntry:
        try:
            self.entry = self.tree.mirror.entry(self.parts)
        except FileNotFoundError:
            raise NoEntry(f"lookup {self.path}") from None
        return self.entry

    @property
    def is_dir(self) -> bool:  # type: ignore[override]
        return self.entry.is_dir

    def attributes(self) -> Attributes:
        entry = self.resolve()
        kind = stat.S_IFLNK if entry.link is not None else stat.S_IFDIR if entry.is_dir else stat.S_IFREG
        mtime_ns = entry.mtime_ns or self.tree.mounted_ns
        access = Access(entry.uid, entry.gid, entry.mode)
        blocks = (entry.size + 511) // 512 if kind == stat.S_IFREG else 0  # (the data: `du` counts it here)
        return self.shown(
            kind, access, size=entry.size, mtime_ns=mtime_ns, block_bytes=IO_BLOCK_BYTES, valid_s=0, blocks=blocks
        )

    def children(self) -> list[tuple[str, Node]]:
        if not self.entry.is_dir:
            return super().children()
        return [(name, self.child(name)) for name in self.tree.mirror.names(self.parts)]

    def child(self, name: str) -> Node:
        if not self.entry.is_dir:
            raise Refused(errno.ENOTDIR, f"lookup {join(self.path, name)}")
        return self.tree.mirror_node((*self.parts, name))

    def open(self, flags: int) -> Handle:
        self.refuse_writes(flags)
        if self.entry.is_dir:
            return super().open(flags)
        if self.entry.link is not None:  # (the kernel follows a link itself; nothing opens one here)
            raise Refused(errno.ELOOP, f"open {self.path}: a symbolic link")
        return MirrorHandle(self, MirrorFile(self.tree.mirror, self.parts))

    def readlink(self) -> str:
        """A link's target, as the data dir's link names it: the kernel resolves it in the
        caller's own namespace and with the caller's own rights, never the mount's."""
        target = self.resolve().link
        if target is None:
            return super().readlink()
        return target

    def forgettable(self) -> bool:
        return bool(self.parts)


class MirrorHandle(Handle):
    def __init__(self, node: MirrorNode, file: MirrorFile) -> None:
        super().__init__(node)
        self.file = file

    def read_now(self, position: int, length: int) -> bytes | bytearray | None:
        return self.file.read_now(position, length)

    def read(self, position: int, length: int) -> bytes:
        return self.file.read(position, length)

    def release(self) -> Changes:
        self.file.close()
        return Changes()
