"""A FUSE passthrough file system that knows what a power cut would keep (ALICE/CrashMonkey style).

    python -m tests.powercut.passthrough BACKING MOUNTPOINT CONTROL_SOCKET
        [--mode 1|2] [--seed N] [--cut-at-op K] [--durability strict|ext4] [--debug]

Every request is passed through to BACKING, so programs on MOUNTPOINT see an ordinary file
system. Beside it, `DurabilityModel` keeps what a power cut would leave:

* a file's *durable content* is its content as of its last `fsync`/`fdatasync` (an `msync` of a
  mapping reaches us as its dirty pages written, then an `fsync`);
* a directory's *durable entries* are its entries as of its last directory `fsync`. A create,
  link, unlink, mkdir, rmdir or rename becomes durable only with an `fsync` of the directory that
  holds the name (both directories for a rename across two): the `fsync` of a new file does not
  make its name durable, as on a strict POSIX file system. `--durability ext4` models ext4's
  stronger behaviour instead: any `fsync` commits the journal, so every name change made so far
  becomes durable (file contents still need their own `fsync`).

Changes not yet durable are kept as an ordered list of operations (a write with its bytes, a
truncate, a directory entry added, removed or renamed). Inodes are the model's own: a name
points at an inode, an inode's content is independent of its names, so a durable write to a
file whose name is not durable is kept but unreachable after the cut, as on a real disk.

The power cut: `cut` on the control socket (or reaching operation number `--cut-at-op`, which
freezes the file system first: the request that reached it and every later one never get an
answer) unmounts, then rewrites BACKING to hold the crash state and nothing else:

* mode 1: only what is durable;
* mode 2: what is durable plus a random prefix, in their order, of the operations that were not
  (seeded by `--seed`); when the last operation kept is a write, it may itself be torn at a
  512-byte sector boundary. This is the "in-order" crash state of a journaling file system.

File modes are kept; modification times are the ones the files had at the cut (metadata is not
modelled). Operations counted for `--cut-at-op` are the ones that change something or sync:
write, truncate (setattr size, O_TRUNC), create, mkdir, unlink, rmdir, rename, fsync, fsyncdir.

Control socket (one command per connection, one line, one line of answer):

    wait     answers `frozen N KIND` once the file system froze at operation N
    status   answers a JSON object: operations so far, pending ones, frozen or not
    cut      freezes (if not yet), unmounts, writes the crash state, answers a JSON summary of
             it, and the process exits with status 0

SIGTERM or SIGINT unmounts without a cut (exit status 0). The process prints `ready` on stdout
once mounted and listening; its log goes to stderr.

Handlers run on one trio task (`pyfuse3.main(max_tasks=1)`): requests are handled one at a time,
in the order the kernel sends them, so the order of the model's operations is that order.
Writes are not cached by the kernel (no writeback cache): each `write(2)` reaches the model
before it returns. `fallocate` is not offered (pyfuse3 3.5 has no handler for it; the kernel
then answers EOPNOTSUPP).
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import json
import logging
import os
import random
import shutil
import signal
import socket
import stat
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pyfuse3
import trio
from pyfuse3 import FUSEError

log = logging.getLogger("powercut.passthrough")

SECTOR_BYTES = 512
# Only this process changes the backing dir while it is mounted, so the kernel's caches of names
# and attributes stay right for as long as we let it keep them.
CACHE_TIMEOUT_S = 300.0
# The operations counted, as the letters of the `kinds` string a cut reports.
KIND_LETTERS = {
    "write": "w",
    "truncate": "t",
    "create": "c",
    "mkdir": "m",
    "unlink": "u",
    "rmdir": "r",
    "rename": "n",
    "fsync": "f",
    "fsyncdir": "d",
}
_OPEN_FLAGS_DROPPED = os.O_CREAT | os.O_EXCL | os.O_APPEND | os.O_NOCTTY | getattr(os, "O_DIRECT", 0)


# -- the durability model ---------------------------------------------------------------------


@dataclass(eq=False)
class Node:
    """One inode of the model. `parent`/`name`/`children` describe the live tree (what the
    backing dir holds now); `durable_data`/`durable_entries` what a power cut keeps; `pending`
    the operations on this inode not yet durable, oldest first."""

    ino: int
    is_dir: bool
    mode: int
    mtime_ns: int
    parent: Node | None = None
    name: str = ""
    children: dict[str, Node] = field(default_factory=dict)
    durable_data: bytearray = field(default_factory=bytearray)
    durable_entries: dict[str, Node] = field(default_factory=dict)
    pending: list[Op] = field(default_factory=list)
    fds: set[int] = field(default_factory=set)


@dataclass(frozen=True, slots=True, eq=False)
class Op:
    """A change not yet durable. On a file (`target`): `write` (`offset`, `data`) or `truncate`
    (`offset` is the new size). On a directory: `link` (`name` → `child`), `unlink` (`name`),
    `rename` (`name` → `new_name`, both in `target`)."""

    seq: int
    kind: str
    target: Node
    offset: int = 0
    data: bytes = b""
    name: str = ""
    new_name: str = ""
    child: Node | None = None


def apply_to_content(content: bytearray, op: Op) -> None:
    if op.kind == "write":
        if len(content) < op.offset:
            content.extend(bytes(op.offset - len(content)))
        content[op.offset : op.offset + len(op.data)] = op.data
    elif op.kind == "truncate":
        if op.offset < len(content):
            del content[op.offset :]
        else:
            content.extend(bytes(op.offset - len(content)))
    else:
        raise ValueError(f"not a file operation: {op.kind}")


def apply_to_entries(entries: dict[str, Node], op: Op) -> None:
    if op.kind == "link":
        assert op.child is not None
        entries[op.name] = op.child
    elif op.kind == "unlink":
        entries.pop(op.name, None)
    elif op.kind == "rename":
        moved = entries.pop(op.name, None)
        if moved is not None:
            entries[op.new_name] = moved
    else:
        raise ValueError(f"not a directory operation: {op.kind}")


@dataclass
class CrashState:
    """What the disk holds after the cut: the entries of every reachable directory and the
    content of every reachable file, from the root."""

    root: Node
    entries: dict[Node, dict[str, Node]]
    contents: dict[Node, bytes]
    pending_ops: int
    kept_ops: int
    torn: dict[str, int] | None

    def walk(self) -> Iterator[tuple[str, Node]]:
        """(relative path, node) of everything reachable, parents before children; a directory
        reachable twice (a rename across directories half durable) is listed once."""
        seen = {self.root}
        stack = [("", self.root)]
        while stack:
            prefix, directory = stack.pop()
            for name, child in sorted(self.entries[directory].items()):
                path = f"{prefix}{name}"
                if child.is_dir:
                    if child in seen:
                        continue
                    seen.add(child)
                    stack.append((f"{path}/", child))
                yield path, child


class DurabilityModel:
    """The model: inodes, pending operations, syncs and the crash state. No FUSE here."""

    def __init__(self, root: Node, *, durability: str = "strict") -> None:
        if durability not in ("strict", "ext4"):
            raise ValueError(f"unknown durability {durability!r}")
        self.root = root
        self.durability = durability
        self.inodes: dict[int, Node] = {root.ino: root}
        self._next_ino = root.ino + 1
        self._seq = 0
        self._dirty: set[Node] = set()  # nodes with pending operations

    @classmethod
    def from_directory(cls, backing: Path, *, durability: str = "strict") -> DurabilityModel:
        """Everything already in `backing` is durable."""
        st = os.lstat(backing)
        model = cls(Node(pyfuse3.ROOT_INODE, True, stat.S_IMODE(st.st_mode), st.st_mtime_ns), durability=durability)
        stack = [(backing, model.root)]
        while stack:
            path, directory = stack.pop()
            for entry in os.scandir(path):
                st = entry.stat(follow_symlinks=False)
                if stat.S_ISDIR(st.st_mode):
                    node = model.new_node(directory, entry.name, True, st.st_mode, st.st_mtime_ns)
                    stack.append((Path(entry.path), node))
                elif stat.S_ISREG(st.st_mode):
                    node = model.new_node(directory, entry.name, False, st.st_mode, st.st_mtime_ns)
                    node.durable_data = bytearray(Path(entry.path).read_bytes())
                else:
                    raise ValueError(f"{entry.path}: only regular files and directories are modelled")
                directory.durable_entries[entry.name] = node
        return model

    def new_node(self, parent: Node, name: str, is_dir: bool, mode: int, mtime_ns: int) -> Node:
        """A new inode linked live (not durably) as `name` in `parent`."""
        node = Node(self._next_ino, is_dir, stat.S_IMODE(mode), mtime_ns, parent=parent, name=name)
        self._next_ino += 1
        self.inodes[node.ino] = node
        parent.children[name] = node
        return node

    def record(self, kind: str, target: Node, **fields: object) -> None:
        self._seq += 1
        target.pending.append(Op(self._seq, kind, target, **fields))  # type: ignore[arg-type]
        self._dirty.add(target)

    @property
    def pending_ops(self) -> int:
        return sum(len(node.pending) for node in self._dirty)

    def _commit(self, node: Node) -> None:
        for op in node.pending:
            if node.is_dir:
                apply_to_entries(node.durable_entries, op)
            else:
                apply_to_content(node.durable_data, op)
        node.pending.clear()
        self._dirty.discard(node)

    def sync(self, node: Node) -> None:
        """`fsync` of a file (its content) or a directory (its entries)."""
        self._commit(node)
        if self.durability == "ext4":
            for other in [n for n in self._dirty if n.is_dir]:
                self._commit(other)

    def crash_state(self, mode: int, rng: random.Random) -> CrashState:
        """The state a power cut leaves now (mode 1: durable only; mode 2: plus a random prefix
        of the pending operations, the last one possibly a torn write)."""
        pending = sorted((op for node in self._dirty for op in node.pending), key=lambda op: op.seq)
        kept = 0 if mode == 1 else rng.randint(0, len(pending))
        applied = pending[:kept]
        torn = None
        if applied and applied[-1].kind == "write" and len(applied[-1].data) > 1 and rng.random() < 0.5:
            last = applied[-1]
            # Sectors reach the disk whole: the write is cut at a sector boundary of the file.
            boundaries = [
                b - last.offset
                for b in range(last.offset - last.offset % SECTOR_BYTES, last.offset + len(last.data), SECTOR_BYTES)
                if last.offset <= b < last.offset + len(last.data)
            ] or [0]
            keep_bytes = rng.choice(boundaries)
            applied[-1] = Op(last.seq, "write", last.target, offset=last.offset, data=last.data[:keep_bytes])
            torn = {"ino": last.target.ino, "offset": last.offset, "bytes": len(last.data), "kept": keep_bytes}
        by_node: dict[Node, list[Op]] = {}
        for op in applied:
            by_node.setdefault(op.target, []).append(op)
        entries: dict[Node, dict[str, Node]] = {}
        contents: dict[Node, bytes] = {}
        stack = [self.root]
        while stack:
            directory = stack.pop()
            if directory in entries:
                continue
            names = dict(directory.durable_entries)
            for op in by_node.get(directory, []):
                apply_to_entries(names, op)
            entries[directory] = names
            for child in names.values():
                if child.is_dir:
                    stack.append(child)
                elif child not in contents:
                    content = bytearray(child.durable_data)
                    for op in by_node.get(child, []):
                        apply_to_content(content, op)
                    contents[child] = bytes(content)
        return CrashState(self.root, entries, contents, len(pending), kept, torn)


def write_crash_state(backing: Path, state: CrashState, mtimes: dict[Node, int]) -> dict[str, int]:
    """Replace everything under `backing` with the crash state."""
    for entry in os.scandir(backing):
        if entry.is_dir(follow_symlinks=False):
            shutil.rmtree(entry.path)
        else:
            os.unlink(entry.path)
    files = dirs = data_bytes = 0
    made: list[tuple[Path, Node]] = []
    for relative, node in state.walk():
        path = backing / relative
        if node.is_dir:
            path.mkdir()
            dirs += 1
        else:
            content = state.contents[node]
            path.write_bytes(content)
            files += 1
            data_bytes += len(content)
        made.append((path, node))
    for path, node in reversed(made):  # children first: a directory's mtime is set last
        os.chmod(path, node.mode)
        mtime = mtimes.get(node, node.mtime_ns)
        os.utime(path, ns=(mtime, mtime))
    return {"files": files, "dirs": dirs, "bytes": data_bytes}


# -- the pyfuse3 adapter ------------------------------------------------------------------------


class Operations(pyfuse3.Operations):
    """Passthrough to the backing dir, reporting every change to the model."""

    def __init__(self, backing: Path, model: DurabilityModel, cut_at_op: int | None) -> None:
        super().__init__()
        self.backing = backing
        self.model = model
        self.cut_at_op = cut_at_op
        self.ops = 0
        self.kinds: list[str] = []  # one letter per operation, in order (see KIND_LETTERS)
        self.frozen_at: tuple[int, str] | None = None
        self.frozen_event = trio.Event()
        self._handles: dict[int, Node] = {}

    # -- helpers ----------------------------------------------------------------------------
    def freeze(self, kind: str) -> None:
        if self.frozen_at is None:
            self.frozen_at = (self.ops, kind)
            self.frozen_event.set()
            log.info("frozen after operation %d (%s): no request is answered from now on", self.ops, kind)

    async def _gate(self) -> None:
        if self.frozen_at is not None:
            await trio.sleep_forever()

    async def _done(self, kind: str, node: Node, detail: object = "") -> None:
        """Count a changing operation; at the cut point freeze, leaving it unanswered."""
        self.ops += 1
        self.kinds.append(KIND_LETTERS[kind])
        if log.isEnabledFor(logging.DEBUG):
            try:
                where = self._path(node)
            except FUSEError:
                where = f"<inode {node.ino}, unlinked>"
            log.debug("operation %d: %s %s %s", self.ops, kind, where, detail)
        if self.ops == self.cut_at_op:
            self.freeze(kind)
        await self._gate()

    def _path(self, node: Node) -> str:
        parts = []
        while node is not self.model.root:
            if node.parent is None:
                raise FUSEError(errno.ENOENT)
            parts.append(node.name)
            node = node.parent
        return os.path.join(self.backing, *reversed(parts))

    def _node(self, inode: int) -> Node:
        try:
            return self.model.inodes[inode]
        except KeyError:
            raise FUSEError(errno.ENOENT) from None

    def _dir(self, inode: int) -> Node:
        node = self._node(inode)
        if not node.is_dir:
            raise FUSEError(errno.ENOTDIR)
        return node

    def _stat(self, node: Node) -> os.stat_result:
        if node.fds:
            return os.fstat(next(iter(node.fds)))
        return os.lstat(self._path(node))

    def _attributes(self, node: Node) -> pyfuse3.EntryAttributes:
        st = self._stat(node)
        entry = pyfuse3.EntryAttributes()
        for name in ("st_mode", "st_nlink", "st_uid", "st_gid", "st_rdev", "st_size", "st_blocks"):
            setattr(entry, name, getattr(st, name))
        entry.st_atime_ns, entry.st_mtime_ns, entry.st_ctime_ns = st.st_atime_ns, st.st_mtime_ns, st.st_ctime_ns
        entry.st_ino = node.ino
        entry.generation = 0
        entry.entry_timeout = entry.attr_timeout = CACHE_TIMEOUT_S
        entry.st_blksize = 4096
        return entry

    def _name(self, raw: bytes) -> str:
        return os.fsdecode(raw)

    # -- names ------------------------------------------------------------------------------
    async def lookup(self, parent_inode: int, name: bytes, ctx: pyfuse3.RequestContext) -> pyfuse3.EntryAttributes:
        await self._gate()
        child = self._dir(parent_inode).children.get(self._name(name))
        if child is None:
            raise FUSEError(errno.ENOENT)
        return self._attributes(child)

    async def forget(self, inode_list: list[tuple[int, int]]) -> None:
        pass  # inodes stay in the model: names and durable state may still point at them

    async def getattr(self, inode: int, ctx: pyfuse3.RequestContext) -> pyfuse3.EntryAttributes:
        await self._gate()
        return self._attributes(self._node(inode))

    async def setattr(
        self,
        inode: int,
        attr: pyfuse3.EntryAttributes,
        fields: pyfuse3.SetattrFields,
        fh: int | None,
        ctx: pyfuse3.RequestContext,
    ) -> pyfuse3.EntryAttributes:
        await self._gate()
        node = self._node(inode)
        target: int | str = fh if fh is not None else self._path(node)
        if fields.update_size:
            if isinstance(target, int):
                os.ftruncate(target, attr.st_size)
            else:
                os.truncate(target, attr.st_size)
            self.model.record("truncate", node, offset=attr.st_size)
        if fields.update_mode:
            os.chmod(target, stat.S_IMODE(attr.st_mode))
            node.mode = stat.S_IMODE(attr.st_mode)
        if fields.update_uid or fields.update_gid:
            os.chown(target, attr.st_uid if fields.update_uid else -1, attr.st_gid if fields.update_gid else -1)
        if fields.update_atime or fields.update_mtime:
            old = os.stat(target)
            atime = attr.st_atime_ns if fields.update_atime else old.st_atime_ns
            mtime = attr.st_mtime_ns if fields.update_mtime else old.st_mtime_ns
            os.utime(target, ns=(atime, mtime))
        if fields.update_size:
            await self._done("truncate", node, attr.st_size)
        return self._attributes(node)

    async def mkdir(
        self, parent_inode: int, name: bytes, mode: int, ctx: pyfuse3.RequestContext
    ) -> pyfuse3.EntryAttributes:
        await self._gate()
        parent, text = self._dir(parent_inode), self._name(name)
        path = os.path.join(self._path(parent), text)
        os.mkdir(path, mode & ~ctx.umask)
        node = self.model.new_node(parent, text, True, mode & ~ctx.umask, os.lstat(path).st_mtime_ns)
        self.model.record("link", parent, name=text, child=node)
        await self._done("mkdir", parent, text)
        return self._attributes(node)

    async def _remove(self, parent_inode: int, name: bytes, kind: str) -> None:
        await self._gate()
        parent, text = self._dir(parent_inode), self._name(name)
        child = parent.children.get(text)
        if child is None:
            raise FUSEError(errno.ENOENT)
        path = os.path.join(self._path(parent), text)
        if kind == "rmdir":
            os.rmdir(path)
        else:
            os.unlink(path)
        del parent.children[text]
        child.parent = None
        self.model.record("unlink", parent, name=text)
        await self._done(kind, parent, text)

    async def unlink(self, parent_inode: int, name: bytes, ctx: pyfuse3.RequestContext) -> None:
        await self._remove(parent_inode, name, "unlink")

    async def rmdir(self, parent_inode: int, name: bytes, ctx: pyfuse3.RequestContext) -> None:
        await self._remove(parent_inode, name, "rmdir")

    async def rename(
        self,
        parent_inode_old: int,
        name_old: bytes,
        parent_inode_new: int,
        name_new: bytes,
        flags: int,
        ctx: pyfuse3.RequestContext,
    ) -> None:
        await self._gate()
        old, new = self._dir(parent_inode_old), self._dir(parent_inode_new)
        text_old, text_new = self._name(name_old), self._name(name_new)
        moved = old.children.get(text_old)
        if moved is None:
            raise FUSEError(errno.ENOENT)
        if flags & pyfuse3.RENAME_EXCHANGE:
            raise FUSEError(errno.EINVAL)
        if flags & pyfuse3.RENAME_NOREPLACE and text_new in new.children:
            raise FUSEError(errno.EEXIST)
        os.rename(os.path.join(self._path(old), text_old), os.path.join(self._path(new), text_new))
        del old.children[text_old]
        replaced = new.children.get(text_new)
        if replaced is not None:
            replaced.parent = None
        new.children[text_new] = moved
        moved.parent, moved.name = new, text_new
        if old is new:
            self.model.record("rename", old, name=text_old, new_name=text_new)
        else:
            self.model.record("unlink", old, name=text_old)
            self.model.record("link", new, name=text_new, child=moved)
        await self._done("rename", moved, f"from {text_old}")

    # -- files ------------------------------------------------------------------------------
    def _register(self, fd: int, node: Node) -> None:
        self._handles[fd] = node
        node.fds.add(fd)

    async def open(self, inode: int, flags: int, ctx: pyfuse3.RequestContext) -> pyfuse3.FileInfo:
        await self._gate()
        node = self._node(inode)
        if node.is_dir:
            raise FUSEError(errno.EISDIR)
        # The kernel gives the offset of every write (O_APPEND included): the backing fd must not
        # move it.
        fd = os.open(self._path(node), (flags & ~_OPEN_FLAGS_DROPPED) | os.O_CLOEXEC)
        self._register(fd, node)
        if flags & os.O_TRUNC and flags & os.O_ACCMODE != os.O_RDONLY:
            self.model.record("truncate", node, offset=0)
            await self._done("truncate", node, 0)
        return pyfuse3.FileInfo(fh=fd, keep_cache=True)

    async def create(
        self, parent_inode: int, name: bytes, mode: int, flags: int, ctx: pyfuse3.RequestContext
    ) -> tuple[pyfuse3.FileInfo, pyfuse3.EntryAttributes]:
        await self._gate()
        parent, text = self._dir(parent_inode), self._name(name)
        if text in parent.children:
            if flags & os.O_EXCL:
                raise FUSEError(errno.EEXIST)
            node = parent.children[text]
            info = await self.open(node.ino, flags, ctx)
            return info, self._attributes(node)
        path = os.path.join(self._path(parent), text)
        fd = os.open(path, (flags & ~_OPEN_FLAGS_DROPPED) | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, mode & ~ctx.umask)
        node = self.model.new_node(parent, text, False, mode & ~ctx.umask, os.fstat(fd).st_mtime_ns)
        self._register(fd, node)
        self.model.record("link", parent, name=text, child=node)
        await self._done("create", parent, text)
        return pyfuse3.FileInfo(fh=fd, keep_cache=True), self._attributes(node)

    async def read(self, fh: int, off: int, size: int) -> bytes:
        await self._gate()
        return os.pread(fh, size, off)

    async def write(self, fh: int, off: int, buf: bytes) -> int:
        await self._gate()
        node = self._handles[fh]
        written = os.pwrite(fh, buf, off)
        self.model.record("write", node, offset=off, data=bytes(buf[:written]))
        await self._done("write", node, f"{written} bytes at {off}")
        return written

    async def flush(self, fh: int) -> None:
        await self._gate()  # close(2) promises nothing about durability

    async def release(self, fh: int) -> None:
        await self._gate()
        node = self._handles.pop(fh)
        node.fds.discard(fh)
        os.close(fh)

    async def fsync(self, fh: int, datasync: bool) -> None:
        await self._gate()
        self.model.sync(self._handles[fh])
        await self._done("fsync", self._handles[fh])

    # -- directories --------------------------------------------------------------------------
    async def opendir(self, inode: int, ctx: pyfuse3.RequestContext) -> int:
        await self._gate()
        return self._dir(inode).ino

    async def readdir(self, fh: int, start_id: int, token: pyfuse3.ReaddirToken) -> None:
        await self._gate()
        directory = self._dir(fh)
        names = sorted(directory.children)
        for slot in range(start_id, len(names)):
            child = directory.children[names[slot]]
            if not pyfuse3.readdir_reply(token, os.fsencode(names[slot]), self._attributes(child), slot + 1):
                break

    async def releasedir(self, fh: int) -> None:
        pass

    async def fsyncdir(self, fh: int, datasync: bool) -> None:
        await self._gate()
        self.model.sync(self._dir(fh))
        await self._done("fsyncdir", self._dir(fh))

    async def statfs(self, ctx: pyfuse3.RequestContext) -> pyfuse3.StatvfsData:
        await self._gate()
        st = os.statvfs(self.backing)
        data = pyfuse3.StatvfsData()
        for name in ("f_bsize", "f_frsize", "f_blocks", "f_bfree", "f_bavail", "f_files", "f_ffree", "f_favail"):
            setattr(data, name, getattr(st, name))
        data.f_namemax = st.f_namemax
        return data

    def close_backing_files(self) -> dict[Node, int]:
        """Close every backing descriptor still open; returns the files' modification times."""
        mtimes = {}
        for fd, node in self._handles.items():
            mtimes[node] = os.fstat(fd).st_mtime_ns
            os.close(fd)
            node.fds.clear()
        self._handles.clear()
        return mtimes

    def live_mtimes(self) -> dict[Node, int]:
        mtimes = {}
        for node in self.model.inodes.values():
            if node.parent is not None:
                with contextlib.suppress(OSError, FUSEError):
                    mtimes[node] = os.lstat(self._path(node)).st_mtime_ns
        return mtimes


_HANDLERS = (
    "lookup",
    "getattr",
    "setattr",
    "mkdir",
    "unlink",
    "rmdir",
    "rename",
    "open",
    "create",
    "read",
    "write",
    "flush",
    "release",
    "fsync",
    "opendir",
    "readdir",
    "releasedir",
    "fsyncdir",
    "statfs",
)


def _wrap_errors(operations: type[Operations]) -> None:
    """Backing-dir errors become their errno; anything unexpected is logged with its traceback
    and becomes EIO. Only FUSEError (and trio's cancellation at the cut) leaves a handler."""
    for name in _HANDLERS:
        handler = getattr(operations, name)

        async def wrapped(self: Operations, *args: object, _handler: object = handler, _name: str = name) -> object:
            try:
                return await _handler(self, *args)  # type: ignore[operator]
            except FUSEError:
                raise
            except OSError as error:
                raise FUSEError(error.errno or errno.EIO) from None
            except Exception:  # (trio.Cancelled, at the cut, is no Exception: it goes through)
                log.exception("%s%r failed", _name, args)
                raise FUSEError(errno.EIO) from None

        wrapped.__name__ = name
        setattr(operations, name, wrapped)


_wrap_errors(Operations)


# -- the process ----------------------------------------------------------------------------------


class Server:
    """The mount's trio side: pyfuse3's loop, the control socket, signals, the cut."""

    def __init__(self, operations: Operations, control: socket.socket, mode: int, seed: int) -> None:
        self.operations = operations
        self.control = control
        self.mode = mode
        self.seed = seed
        self.fuse_scope = trio.CancelScope()
        self.cut_requested: trio.SocketStream | None = None
        self.stopped_by: str | None = None

    async def run(self) -> int:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._serve_control)
            nursery.start_soon(self._watch_signals)
            with self.fuse_scope:
                await pyfuse3.main(min_tasks=1, max_tasks=1)
            cut_stream = self.cut_requested
            if cut_stream is not None:
                summary = self._cut()
                await cut_stream.send_all(json.dumps(summary).encode() + b"\n")
                await cut_stream.aclose()
            else:
                pyfuse3.close(unmount=True)
                self.operations.close_backing_files()
                log.info("unmounted without a cut (%s)", self.stopped_by or "unmounted from outside")
            nursery.cancel_scope.cancel()
        return 0

    def _cut(self) -> dict[str, object]:
        operations = self.operations
        operations.freeze("cut")
        # Closing the session aborts the connection: requests left unanswered fail in the
        # processes that made them, which can then die.
        pyfuse3.close(unmount=True)
        mtimes = operations.live_mtimes()
        mtimes.update(operations.close_backing_files())
        state = operations.model.crash_state(self.mode, random.Random(self.seed))
        written = write_crash_state(operations.backing, state, mtimes)
        assert operations.frozen_at is not None
        summary = {
            "mode": self.mode,
            "seed": self.seed,
            "durability": operations.model.durability,
            "ops": operations.ops,
            "cut_at_op": operations.cut_at_op,
            "frozen_at": operations.frozen_at[0],
            "frozen_kind": operations.frozen_at[1],
            "pending_ops": state.pending_ops,
            "kept_ops": state.kept_ops,
            "torn": state.torn,
            **written,
            "kinds": "".join(operations.kinds),
        }
        log.info("power cut: %s", json.dumps({k: v for k, v in summary.items() if k != "kinds"}))
        return summary

    async def _serve_control(self) -> None:
        listener = trio.SocketListener(trio.socket.from_stdlib_socket(self.control))
        async with trio.open_nursery() as nursery:
            while True:
                stream = await listener.accept()
                nursery.start_soon(self._command, stream)

    async def _command(self, stream: trio.SocketStream) -> None:
        try:
            line = b""
            while not line.endswith(b"\n"):
                chunk = await stream.receive_some(256)
                if not chunk:
                    break
                line += chunk
            command = line.decode().strip()
            if command == "cut":
                self.operations.freeze("cut")
                self.cut_requested = stream
                self.fuse_scope.cancel()
                return  # answered by run() once the cut is done
            await stream.send_all(await self._answer(command))
            await stream.aclose()
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass  # the client went away (it stops waiting when the workload ends by itself)

    async def _answer(self, command: str) -> bytes:
        operations = self.operations
        if command == "wait":
            await operations.frozen_event.wait()
            assert operations.frozen_at is not None
            return b"frozen %d %s\n" % (operations.frozen_at[0], operations.frozen_at[1].encode())
        if command == "status":
            status = {
                "ops": operations.ops,
                "pending_ops": operations.model.pending_ops,
                "frozen_at": operations.frozen_at,
            }
            return json.dumps(status).encode() + b"\n"
        return b"error unknown command\n"

    async def _watch_signals(self) -> None:
        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            async for signum in signals:
                self.stopped_by = signal.Signals(signum).name
                self.fuse_scope.cancel()
                return


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("backing", type=Path)
    parser.add_argument("mountpoint", type=Path)
    parser.add_argument("control", type=Path, help="path of the control socket (created)")
    parser.add_argument("--mode", type=int, choices=(1, 2), default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--cut-at-op", type=int, default=None)
    parser.add_argument("--durability", choices=("strict", "ext4"), default="strict")
    parser.add_argument("--debug", action="store_true", help="log every counted operation")
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO,
        stream=sys.stderr,
        format="%(asctime)s.%(msecs)03d %(levelname)s %(name)s: %(message)s",
        datefmt="%H:%M:%S",
    )
    if args.debug:
        log.setLevel(logging.DEBUG)
    backing = args.backing.resolve()
    model = DurabilityModel.from_directory(backing, durability=args.durability)
    operations = Operations(backing, model, args.cut_at_op)
    control = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    control.bind(str(args.control))
    control.listen(8)
    pyfuse3.init(operations, str(args.mountpoint), {"fsname=powercut", "subtype=powercut"})
    log.info(
        "mounted %s on %s (durability %s, mode %d, seed %d, cut at operation %s)",
        backing,
        args.mountpoint,
        args.durability,
        args.mode,
        args.seed,
        args.cut_at_op,
    )
    print("ready", flush=True)
    started = time.monotonic()
    try:
        status = trio.run(Server(operations, control, args.mode, args.seed).run)
    finally:
        control.close()
        args.control.unlink(missing_ok=True)
    log.info("exiting after %.2f s", time.monotonic() - started)
    return status


if __name__ == "__main__":
    sys.exit(main())
