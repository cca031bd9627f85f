"""The pyfuse3 adapter: FUSE requests onto the tree (fs.tree), and nothing else.

Each handler resolves the node or handle, runs the tree's work in a worker thread (or on the
trio loop where the tree says it needs neither the disk nor much work: `open_now`,
`read_now`), maps errors to errno values in one place (`_errors`), and tells the kernel what a
write changed (`_tell_kernel`): before the request returns for files someone holds open (a
follower's next fstat must see the growth), soon after (coalesced by `notify_in_background`) for
`records` files not open. By-offset and by-time views are watched only while open (see
`Tree.grown`): a write's latency does not grow with the number of views the kernel knows.

Only `FUSEError` leaves a handler: a refusal or an engine error is logged as one line naming
what and where; anything unexpected is logged with its traceback and answers EIO.

Removing. `rmdir` of a topic deletes it (Tree.delete_topic). `rm -r` of it (GNU rm, `find
-delete`, Python's `shutil.rmtree`) first unlinks every file and removes every directory below
it, each through a descriptor of the directory above, which it holds open meanwhile; each of
those must succeed, or rm prints an error for it and never removes the topic. So an unlink or
rmdir below a topic's directory (or a partition's, or one below that) that the calling thread
holds open (`opendir` to `releasedir`, per thread id) answers done and changes nothing
(`Node.remove_below`): only the rmdir of the held directory itself decides, the topic deleted
or the partition refused with one line. An unlink or rmdir by anyone else is judged on its own
(an unlink of a view or a partition's rmdir is refused, as before).
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, TypeVar

import pyfuse3
import trio

from seglogfs.engine.errors import (
    ConfigError,
    CorruptRecordError,
    EngineError,
    InvalidRecordError,
    InvalidTopicError,
    OffsetOutOfRangeError,
    ReadOnlyError,
    RecordTooLargeError,
    TimestampParseError,
    TopicExistsError,
    UnknownTopicOrPartitionError,
    UnsupportedFormatError,
)
from seglogfs.fs.config_file import TemporaryFile
from seglogfs.fs.node import Attributes, Changes, Handle, Node, NoEntry, Refused, join
from seglogfs.fs.page_cache import RenderingAhead
from seglogfs.fs.permissions import Caller
from seglogfs.fs.tree import Tree

logger = logging.getLogger(__name__)

T = TypeVar("T")

_VALID_S = 3600.0  # attributes and entries the tree does not time out stay valid until invalidated
# Test hooks, to hold the kernel's cached sizes stale as long as a test needs (see `read`):
# milliseconds each invalidation a request sends waits first, and each getattr's answer.
INVALIDATE_DELAY_ENV = "SEGLOGFS_TEST_INVALIDATE_DELAY_MS"
_INVALIDATE_DELAY_S = float(os.environ.get(INVALIDATE_DELAY_ENV, "0") or 0) / 1000
GETATTR_DELAY_ENV = "SEGLOGFS_TEST_GETATTR_DELAY_MS"
_GETATTR_DELAY_S = float(os.environ.get(GETATTR_DELAY_ENV, "0") or 0) / 1000
_NAME_MAX = 249  # Kafka's longest topic name
_ERRNO: list[tuple[type[BaseException], int]] = [
    (ReadOnlyError, errno.EROFS),
    (RecordTooLargeError, errno.EFBIG),
    (TimestampParseError, errno.EINVAL),
    (InvalidRecordError, errno.EINVAL),
    (InvalidTopicError, errno.EINVAL),
    (ConfigError, errno.EINVAL),
    (TopicExistsError, errno.EEXIST),
    (UnknownTopicOrPartitionError, errno.ENOENT),
    (OffsetOutOfRangeError, errno.ENOENT),
    (CorruptRecordError, errno.EIO),
    (UnsupportedFormatError, errno.EIO),
    (EngineError, errno.EIO),
]


# What an OS error from the storage may tell the caller as it is: the rest is EIO to a reader or
# writer of the mount, with the log line naming what and where.
_CALLERS_ERRNOS = frozenset(
    {
        errno.ENOSPC,
        errno.EDQUOT,
        errno.EFBIG,
        errno.EROFS,
        errno.EACCES,
        errno.EPERM,
        errno.EMFILE,
        errno.ENFILE,
        errno.ENOMEM,
        errno.EINTR,
        errno.EAGAIN,
        errno.EIO,
    }
)


_SIGNAL_POLL_S = 0.05
# A read on the loop that meets pages being rendered ahead waits for them this long at most (a
# run takes about a millisecond from the OS page cache), then goes to a worker thread.
_RENDERING_WAIT_S = 1.0
FOLLOW_PERIOD_S = 0.5  # a read-only mount looks for other writers' changes this often


def _signal_pending(pid: int) -> bool:
    """Whether `pid` (a thread of the caller) has a signal pending that it does not block. A
    caller that is gone counts as interrupted (nothing waits for the answer); an unknown one
    (pid 0) never."""
    try:
        with open(f"/proc/{pid}/status", "rb") as status:
            fields = dict(line.split(b":", 1) for line in status.read().splitlines() if b":" in line)
        pending = int(fields[b"SigPnd"], 16) | int(fields[b"ShdPnd"], 16)
        return bool(pending & ~int(fields[b"SigBlk"], 16))
    except (OSError, KeyError, ValueError):
        return pid > 0 and not os.path.exists(f"/proc/{pid}")


def _groups(pid: int) -> frozenset[int]:
    """The supplementary groups of the caller `pid` (none when it is gone)."""
    try:
        return frozenset(pyfuse3.get_sup_groups(pid))
    except OSError:
        return frozenset()


def errno_for(error: BaseException) -> int:
    """The one table from engine errors (and OS errors) to errno values."""
    for kind, number in _ERRNO:
        if isinstance(error, kind):
            return number
    if isinstance(error, OSError) and error.errno:
        return error.errno
    return errno.EIO


@contextmanager
def _errors(what: str) -> Iterator[None]:
    """Errors of the work inside become FUSEError, logged with what and where."""
    try:
        yield
    except pyfuse3.FUSEError:
        raise
    except Refused as refused:
        raise _refused(refused) from None
    except (EngineError, OSError) as error:
        number = errno_for(error)
        if isinstance(error, OSError) and not isinstance(error, EngineError) and number not in _CALLERS_ERRNOS:
            number = errno.EIO  # the storage failed (a segment gone, a directory where a file was)
        logger.warning("%s: %s (%s)", what, error, errno.errorcode.get(number, number))
        raise pyfuse3.FUSEError(number) from None
    except Exception:
        logger.exception("%s: unexpected error (EIO)", what)
        raise pyfuse3.FUSEError(errno.EIO) from None


def _refused(refused: Refused) -> pyfuse3.FUSEError:
    number = refused.errno or errno.EIO
    level = logging.DEBUG if isinstance(refused, NoEntry) else logging.WARNING
    logger.log(level, "%s (%s)", refused, errno.errorcode.get(number, number))
    return pyfuse3.FUSEError(number)


class Operations(pyfuse3.Operations):
    """The FUSE operations of one mounted tree."""

    enable_writeback_cache = False

    def __init__(self, tree: Tree) -> None:
        super().__init__()
        self.tree = tree
        self._handles: dict[int, Handle] = {}
        self._openers: dict[int, int] = {}  # the pid that opened each handle (reads carry none)
        self._next_fh = 1
        self.requests: Counter[str] = Counter()  # per handler, logged on SIGUSR1 and at unmount
        self._open_inodes: Counter[int] = Counter()  # open handles per inode
        self._queued: set[int] = set()  # inodes to invalidate soon (no handle open)
        self._queued_entries: list[tuple[int, str]] = []  # entries to invalidate soon (after a rename)
        # Per open inode that grows: a size the kernel holds at least, if it holds one (see `read`).
        self._size_floor: dict[int, int] = {}
        self._wake = trio.Event()
        self._dirs: dict[int, Node] = {}  # open directory handles
        self._dir_holders: dict[int, tuple[int, str]] = {}  # of a topic's directories: (thread, path)
        self._held_dirs: Counter[tuple[int, str]] = Counter()  # open handles per (thread, path)

    async def _run(self, work: Callable[[], T], what: str) -> T:
        """Run the tree's work in a worker thread, its errors mapped."""
        with _errors(what):
            return await trio.to_thread.run_sync(work)

    async def _run_interruptible(self, work: Callable[[], T], what: str, pid: int) -> T:
        """`_run` for work that may take long (the first measure of a view): when the calling
        process gets a signal meanwhile (Ctrl-C on `stat`, `ls -l`, `head`), the request
        answers EINTR at once and the work goes on in its thread, its result kept for the next
        request. (pyfuse3 does not pass the kernel's FUSE_INTERRUPT on, and the kernel waits
        for an answer even for SIGKILL: the caller's pending signals are watched instead.)"""
        result: list[T] = []
        failure: list[Exception] = []
        async with trio.open_nursery() as nursery:

            async def watch_caller() -> None:
                while True:  # (a quick request never reads /proc: it is answered before the first look)
                    await trio.sleep(_SIGNAL_POLL_S)
                    if _signal_pending(pid):
                        break
                nursery.cancel_scope.cancel()

            async def work_in_thread() -> None:
                try:
                    result.append(await trio.to_thread.run_sync(work, abandon_on_cancel=True))
                except Exception as error:  # raised below as itself, not in an exception group
                    failure.append(error)
                nursery.cancel_scope.cancel()

            nursery.start_soon(watch_caller)
            nursery.start_soon(work_in_thread)
        with _errors(what):
            if failure:
                raise failure[0]
        if not result:
            logger.info("%s: the caller (pid %d) got a signal: EINTR; the work goes on in the background", what, pid)
            raise pyfuse3.FUSEError(errno.EINTR)
        return result[0]

    def _node(self, inode: int) -> Node:
        node = self.tree.get(inode)
        if node is None:
            raise pyfuse3.FUSEError(errno.ENOENT)
        return node

    def _handle(self, fh: int) -> Handle:
        handle = self._handles.get(fh)
        if handle is None:
            raise pyfuse3.FUSEError(errno.EBADF)
        return handle

    def _entry(self, node: Node) -> pyfuse3.EntryAttributes:
        """The node's attributes as FUSE wants them (in a worker thread: a view's size may need
        rendering)."""
        return self._fuse_attributes(node.inode, node.attributes())

    def _listed_entry(self, node: Node) -> pyfuse3.EntryAttributes:
        """The node's attributes for a lookup or a listing, which never measure a view."""
        return self._fuse_attributes(node.inode, node.listed_attributes())

    def _fuse_attributes(self, inode: int, attributes: Attributes) -> pyfuse3.EntryAttributes:
        entry = pyfuse3.EntryAttributes()
        entry.st_ino = inode
        entry.generation = 0
        entry.entry_timeout = _VALID_S
        entry.attr_timeout = _VALID_S if attributes.valid_s is None else attributes.valid_s
        entry.st_mode = attributes.mode
        entry.st_nlink = attributes.nlink
        entry.st_uid, entry.st_gid = attributes.uid, attributes.gid
        entry.st_size = attributes.size
        entry.st_blocks = attributes.blocks
        entry.st_blksize = attributes.block_bytes
        entry.st_atime_ns = entry.st_mtime_ns = entry.st_ctime_ns = attributes.mtime_ns
        return entry

    async def _tell_kernel(self, changes: Changes) -> None:
        """Drop what the kernel caches of what changed (off the loop: the calls may block): at
        once for open files and entries, soon for the rest (see the module docstring)."""
        if not changes:
            return
        now = Changes(entries=changes.entries)
        for inode in changes.inodes:
            self._size_floor.pop(inode, None)  # (a cut-back shrinks a file: no floor holds)
            if self._open_inodes[inode]:
                now.inodes.append(inode)
            else:
                self._queued.add(inode)
        if self._queued:
            self._wake.set()
        if now:
            await trio.to_thread.run_sync(_invalidate, now)

    async def notify_in_background(self) -> None:
        """Invalidate the queued inodes, all that queued up meanwhile at a time (a nursery
        task of the mount)."""
        while True:
            await self._wake.wait()
            self._wake = trio.Event()
            batch = Changes(inodes=sorted(self._queued), entries=self._queued_entries)
            self._queued, self._queued_entries = set(), []
            await trio.to_thread.run_sync(_invalidate, batch)

    # -- lookups and directories -----------------------------------------------------------------------
    async def lookup(self, parent_inode: int, name: bytes, ctx: Any = None) -> pyfuse3.EntryAttributes:
        self.requests["lookup"] += 1
        parent = self._node(parent_inode)
        text = os.fsdecode(name)
        if text == "..":  # (the kernel counts this lookup too)
            return await self._run(
                lambda: self._listed_entry(self.tree.note_lookup(parent)), f"lookup {parent.path}/.."
            )
        return await self._run(
            lambda: self._listed_entry(self.tree.lookup(parent, text)), f"lookup {join(parent.path, text)}"
        )

    async def getattr(self, inode: int, ctx: Any = None) -> pyfuse3.EntryAttributes:
        self.requests["getattr"] += 1
        node = self._node(inode)
        what = f"getattr {node.path}"
        if ctx is None:
            return await self._run(lambda: self._entry(node), what)
        entry = await self._run_interruptible(lambda: self._entry(node), what, ctx.pid)
        if _GETATTR_DELAY_S:
            await trio.sleep(_GETATTR_DELAY_S)
        return entry

    async def readlink(self, inode: int, ctx: Any) -> bytes:
        node = self._node(inode)
        return os.fsencode(await self._run(node.readlink, f"readlink {node.path}"))

    async def setattr(self, inode: int, attr: Any, fields: Any, fh: Any, ctx: Any) -> pyfuse3.EntryAttributes:
        """A truncation (`>`, O_TRUNC, ftruncate) goes to the node; the times that come with it
        are the node's own. A node's owner, mode and times come from the data dir: chmod, chown
        and utimens of anything are EPERM (they would change nothing)."""
        node = self._node(inode)
        if isinstance(node, TemporaryFile) and not node.renamed:
            return await self._change_temporary(node, attr, fields, fh, ctx)
        if fields.update_mode or fields.update_uid or fields.update_gid:
            what = "chmod" if fields.update_mode else "chown"
            raise _refused(Refused(errno.EPERM, f"{what} {node.path}: owner and mode come from the data dir"))
        if not fields.update_size and (fields.update_atime or fields.update_mtime):
            raise _refused(Refused(errno.EPERM, f"utimens {node.path}: times come from the data dir"))
        if fields.update_size:
            handle = self._handles.get(fh) if fh is not None else None
            with _errors(f"truncate {node.path}"):
                (handle or node).truncate(attr.st_size)
        return await self.getattr(inode, ctx)

    async def _change_temporary(
        self, node: TemporaryFile, attr: Any, fields: Any, fh: Any, ctx: Any
    ) -> pyfuse3.EntryAttributes:
        """chmod, chown (to the caller's own ids, unless root), truncation and times of a file
        made beside `config`: an editor keeps the file's mode and owner on its copy."""
        uid = attr.st_uid if fields.update_uid else node.uid
        gid = attr.st_gid if fields.update_gid else node.gid
        if ctx.uid != 0 and (uid, gid) != (node.uid, node.gid) and (uid != ctx.uid or gid != ctx.gid):
            raise _refused(Refused(errno.EPERM, f"chown {node.path}"))
        with _errors(f"setattr {node.path}"):
            node.change(attr.st_mode if fields.update_mode else None, (uid, gid))
            if fields.update_size:
                node.truncate(attr.st_size)
        return await self.getattr(node.inode, ctx)

    async def opendir(self, inode: int, ctx: Any) -> int:
        """A directory handle; one of a topic's directories counts as held by the caller's
        thread until released (see "Removing" in the module docstring)."""
        node = self._node(inode)
        if not node.is_dir:
            raise pyfuse3.FUSEError(errno.ENOTDIR)
        fh = self._next_fh
        self._next_fh += 1
        self._dirs[fh] = node
        if getattr(node, "topic", None) is not None:
            holder = (ctx.pid, node.path)
            self._dir_holders[fh] = holder
            self._held_dirs[holder] += 1
        return fh

    async def releasedir(self, fh: int) -> None:
        self._dirs.pop(fh, None)
        holder = self._dir_holders.pop(fh, None)
        if holder is not None:
            self._held_dirs[holder] -= 1
            if not self._held_dirs[holder]:
                del self._held_dirs[holder]

    def _removing_below(self, pid: int, path: str) -> bool:
        """Whether thread `pid` holds open a topic's directory at `path` or above it."""
        return any(who == pid and (path == held or path.startswith(f"{held}/")) for who, held in self._held_dirs)

    async def readdir(self, fh: int, start_id: int, token: Any) -> None:
        self.requests["readdir"] += 1
        node = self._dirs.get(fh)
        if node is None:
            raise pyfuse3.FUSEError(errno.EBADF)

        def list_entries() -> list[tuple[str, pyfuse3.EntryAttributes]]:
            entries = []
            for name, child in node.children():
                self.tree.note_lookup(child)  # readdirplus hands the kernel the entry without a lookup
                entries.append((name, self._listed_entry(child)))
            return entries

        entries = await self._run(list_entries, f"readdir {node.path}")
        for index, (name, attr) in enumerate(entries[start_id:], start=start_id):
            if not pyfuse3.readdir_reply(token, os.fsencode(name), attr, index + 1):
                return

    async def mkdir(self, parent_inode: int, name: bytes, mode: int, ctx: Any) -> pyfuse3.EntryAttributes:
        parent = self._node(parent_inode)
        text = os.fsdecode(name)

        def make() -> pyfuse3.EntryAttributes:  # (the kernel checked the caller may write the parent)
            child = self.tree.note_lookup(parent.mkdir(text, (ctx.uid, ctx.gid)))
            return self._entry(child)

        return await self._run(make, f"mkdir {join(parent.path, text)}")

    async def statfs(self, ctx: Any) -> pyfuse3.StatvfsData:
        with _errors("statfs"):
            result = self.tree.statfs()
        data = pyfuse3.StatvfsData()
        for name in ("f_bsize", "f_frsize", "f_blocks", "f_bfree", "f_bavail", "f_files", "f_ffree", "f_favail"):
            setattr(data, name, getattr(result, name))
        data.f_namemax = _NAME_MAX
        return data

    async def forget(self, inode_list: Sequence[tuple[int, int]]) -> None:
        for inode, lookups in inode_list:
            self.tree.forget(inode, lookups)

    # -- files -------------------------------------------------------------------------------------------
    async def open(self, inode: int, flags: int, ctx: Any) -> pyfuse3.FileInfo:
        self.requests["open"] += 1
        node = self._node(inode)
        with _errors(f"open {node.path}"):
            handle = node.open_now(flags)
        if handle is None:
            handle = await self._run(lambda: node.open(flags), f"open {node.path}")
        return self._file_info(handle, ctx.pid)

    def _file_info(self, handle: Handle, pid: int) -> pyfuse3.FileInfo:
        """A new file handle for an open (or create) by `pid`. It counts as an open of its
        node's inode, as its release does (a file renamed onto `config` opens `config`)."""
        fh = self._next_fh
        self._next_fh += 1
        self._handles[fh] = handle
        self._openers[fh] = pid
        self._open_inodes[handle.node.inode] += 1
        # No page cache: a read racing an append could leave a cached page that ends in zeros
        # where the new records now are (the kernel zero-fills a short read).
        return pyfuse3.FileInfo(fh=fh, direct_io=True, nonseekable=not handle.seekable)

    # pyfuse3 replies with any contiguous buffer: a mirror read returns the buffer it read into.
    async def read(self, fh: int, off: int, size: int) -> bytes | bytearray | memoryview:  # type: ignore[override]
        self.requests["read"] += 1
        handle = self._handle(fh)
        # A read that needs neither the disk nor much rendering is served on the loop: handing
        # it to a worker thread costs more than the read (sequential readers ran at half speed).
        with _errors(f"read {handle.node.path}"):
            data = await self._read_now(handle, off, size)
        if data is None:
            data = await self._run_interruptible(
                lambda: handle.read(off, size), f"read {handle.node.path}", self._openers.get(fh, 0)
            )
        else:
            self.requests["read_now"] += 1
        if data:  # (an empty read, at or past the end, returns nothing the kernel might not hold)
            self._cover_read(handle, off + len(data))
        return data

    async def _read_now(self, handle: Handle, off: int, size: int) -> bytes | bytearray | memoryview | None:
        """`handle.read_now`; when the pages it needs are being rendered ahead at that moment,
        tried again once they are, waiting on the loop: neither rendered twice nor handed to a
        worker thread (each cost more than the wait, and a sequential reader catches up with
        the render-ahead thread a thousand times a GiB). None to hand the read to a worker."""
        while True:
            try:
                return handle.read_now(off, size)
            except RenderingAhead as rendering:
                rendered, token = trio.Event(), trio.lowlevel.current_trio_token()

                def wake(rendered: trio.Event = rendered, token: trio.lowlevel.TrioToken = token) -> None:
                    with contextlib.suppress(trio.RunFinishedError):  # (the mount is ending)
                        token.run_sync_soon(rendered.set)

                if rendering.when_rendered(wake):
                    self.requests["read_waited"] += 1
                    with trio.move_on_after(_RENDERING_WAIT_S) as waited:
                        await rendered.wait()
                    if waited.cancelled_caught:
                        return None

    def _cover_read(self, handle: Handle, end: int) -> None:
        """Make sure the kernel holds no size below `end`, where a read is about to end.

        With direct I/O a read returns what the file holds now. That can be more than the size
        the kernel holds: an append's invalidation may still be on its way, and meanwhile
        another process's getattr, answered before the append, may land after the read (the
        read makes the kernel ask again for the access time only, which that answer satisfies).
        `tail -f` reads to the end and then fstat's; a size below what it read is "file
        truncated" to it, and it prints the file again from the start.

        An invalidation bumps the inode's attribute version (Linux does, in
        fuse_reverse_inval_inode), and the kernel drops a reply asked for before that. So it
        holds a size only from a reply asked for after the inode's last invalidation, and sizes
        only grow: after an invalidation, it holds at least the size the file had just before,
        `_size_floor`. (A cut-back, the one shrink, goes through `_tell_kernel`, which drops the
        floor.) Invalidating attributes only, with no writeback cache, waits on nothing, so it
        is done here on the loop, before the reply. A read within the floor (`cat` of a view
        that does not grow meanwhile) costs a comparison; a follower's first read after each
        append, one invalidation."""
        inode = handle.node.inode
        if end <= self._size_floor.get(inode, 0):
            return
        size = handle.grown_size()
        if size is None:
            return
        try:
            pyfuse3.invalidate_inode(inode, True)
        except OSError as error:  # (ENOENT: the kernel holds nothing of the inode)
            if error.errno != errno.ENOENT:
                logger.warning("invalidating inode %d: %s (a follower may see the file shrink)", inode, error)
        self._size_floor[inode] = max(size, end)  # (said once per growth, not once per read)

    async def write(self, fh: int, off: int, buf: bytes) -> int:
        self.requests["write"] += 1
        handle = self._handle(fh)
        with _errors(f"write {handle.node.path}"):
            changes = handle.write_now(off, buf)
        if changes is None:
            changes = await self._run(lambda: handle.write(off, buf), f"write {handle.node.path}")
        else:
            self.requests["write_now"] += 1
        await self._tell_kernel(changes)
        return len(buf)

    async def flush(self, fh: int) -> None:
        handle = self._handle(fh)
        if handle.writable:
            with _errors(f"write {handle.node.path}"):
                changes = handle.flush_now()
            if changes is None:
                changes = await self._run(handle.flush, f"write {handle.node.path}")
            await self._tell_kernel(changes)

    async def fsync(self, fh: int, datasync: bool) -> None:
        handle = self._handle(fh)
        if handle.writable:
            await self._tell_kernel(await self._run(handle.fsync, f"fsync {handle.node.path}"))

    async def release(self, fh: int) -> None:
        handle = self._handles.pop(fh, None)
        self._openers.pop(fh, None)
        if handle is None:
            return
        inode = handle.node.inode
        self._open_inodes[inode] -= 1
        if not self._open_inodes[inode]:
            del self._open_inodes[inode]
            self._size_floor.pop(inode, None)
        if handle.writable:
            with _errors(f"close {handle.node.path}"):
                changes = handle.release_now()
            if changes is None:
                changes = await self._run(handle.release, f"close {handle.node.path}")
            await self._tell_kernel(changes)
        else:  # a read-only handle lets go of what it holds: nothing that waits
            with _errors(f"close {handle.node.path}"):
                handle.release()

    # -- refused -------------------------------------------------------------------------------------------
    def _refuse(self, operation: str, parent_inode: int, name: bytes = b"") -> pyfuse3.FUSEError:
        node = self._node(parent_inode)
        return _refused(Refused(errno.EPERM, f"{operation} {join(node.path, os.fsdecode(name))}"))

    async def unlink(self, parent_inode: int, name: bytes, ctx: Any) -> None:
        parent = self._node(parent_inode)
        text = os.fsdecode(name)
        if self._removing_below(ctx.pid, parent.path):  # rm -r of a topic or partition dir above
            await self._run(lambda: parent.remove_below(text), f"unlink {join(parent.path, text)}")
        else:
            await self._run(lambda: parent.unlink(text), f"unlink {join(parent.path, text)}")

    async def rmdir(self, parent_inode: int, name: bytes, ctx: Any) -> None:
        parent = self._node(parent_inode)
        text = os.fsdecode(name)
        what = f"rmdir {join(parent.path, text)}"
        if self._removing_below(ctx.pid, parent.path):
            await self._run(lambda: parent.remove_below(text), what)
        else:
            caller = Caller(ctx.uid, ctx.gid, _groups(ctx.pid))
            await self._run(lambda: parent.rmdir(text, caller), what)

    async def rename(  # noqa: PLR0917 (pyfuse3's signature)
        self, parent_inode_old: int, name_old: bytes, parent_inode_new: int, name_new: bytes, flags: int, ctx: Any
    ) -> None:
        """Only a file made beside a topic's `config` renamed onto it (an editor's save). The
        kernel moves its entries when this returns: nothing here may wait on the directory."""
        parent, new_parent = self._node(parent_inode_old), self._node(parent_inode_new)
        text, new_text = os.fsdecode(name_old), os.fsdecode(name_new)
        what = f"rename {join(parent.path, text)} to {join(new_parent.path, new_text)}"
        if flags:  # (RENAME_NOREPLACE, RENAME_EXCHANGE: config is there, and is replaced)
            # mv tries RENAME_NOREPLACE first and a plain rename after EINVAL: that one's
            # answer is the one worth a line in the log.
            logger.debug("%s: with flags %#x: not supported (EINVAL)", what, flags)
            raise pyfuse3.FUSEError(errno.EINVAL)
        try:
            changes = await self._run(lambda: parent.rename(text, new_parent, new_text), what)
        finally:
            # A file made beside config is gone after its rename, refused or not, and `config`
            # names the config again: the kernel is told soon after the reply (now, it would
            # wait for the rename, which holds the directory).
            self._queued_entries += [(parent.inode, text), (new_parent.inode, new_text)]
            self._wake.set()
        await self._tell_kernel(changes)

    async def create(self, parent_inode: int, name: bytes, mode: int, flags: int, ctx: Any) -> Any:
        self.requests["create"] += 1
        parent = self._node(parent_inode)
        text = os.fsdecode(name)

        def make() -> tuple[Handle, pyfuse3.EntryAttributes]:
            node = self.tree.note_lookup(parent.create(text, mode, (ctx.uid, ctx.gid)))
            return node.open(flags), self._entry(node)

        handle, entry = await self._run(make, f"create {join(parent.path, text)}")
        return self._file_info(handle, ctx.pid), entry

    async def mknod(self, parent_inode: int, name: bytes, mode: int, rdev: int, ctx: Any) -> Any:
        raise self._refuse("mknod", parent_inode, name)

    async def symlink(self, parent_inode: int, name: bytes, target: bytes, ctx: Any) -> Any:
        raise self._refuse("symlink", parent_inode, name)

    async def link(self, inode: int, new_parent_inode: int, new_name: bytes, ctx: Any) -> Any:
        raise self._refuse("link", inode)

    # -- background work -------------------------------------------------------------------------------------
    async def follow_writers(self, period_s: float = FOLLOW_PERIOD_S) -> None:
        """A read-only mount's nursery task: every `period_s`, what other processes wrote
        becomes visible (Tree.follow) and the kernel forgets the sizes it changed, so `tail -f`
        (which polls every second) sees new records within two."""
        while True:
            await trio.sleep(period_s)
            try:
                changes = await trio.to_thread.run_sync(self.tree.follow)
                await self._tell_kernel(changes)
            except Exception:  # Tree.follow guards each partition: this is a bug, and the mount stays up
                logger.exception("following other writers failed; retried in a minute")
                await trio.sleep(60)

    async def after_background_work(self) -> None:
        """After retention or compaction changed what views show (see Tree.after_background_work)."""
        changes = await self._run(self.tree.after_background_work, "after background work")
        await self._tell_kernel(changes)


def _invalidate(changes: Changes) -> None:
    """Tell the kernel (in a worker thread: the calls may block). ENOENT: it has forgotten the
    inode or entry, nothing to tell."""
    if _INVALIDATE_DELAY_S:
        time.sleep(_INVALIDATE_DELAY_S)
    for inode in changes.inodes:
        try:
            pyfuse3.invalidate_inode(inode, True)
        except OSError as error:
            if error.errno != errno.ENOENT:
                logger.warning("invalidating inode %d: %s", inode, error)
    for parent, name in changes.entries:
        try:
            pyfuse3.invalidate_entry(parent, os.fsencode(name))
        except OSError as error:
            if error.errno != errno.ENOENT:
                logger.warning("invalidating entry %s of inode %d: %s", name, parent, error)
