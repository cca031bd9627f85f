"""The FUSE filesystem: topics and partitions as directories (DESIGN.md §2), on pyfuse3 + trio.

    MNT/<topic>/                  mkdir creates a topic with num.partitions partitions
    MNT/<topic>/config            the topic's overrides, `key=value` lines; writing it replaces
                                  them (kafka-configs --alter), checked line by line
    MNT/<topic>/<p>/append        write-only: lines → records (kafka-console-producer)
    MNT/<topic>/<p>/append.jsonl  write-only: one JSON record per line
    MNT/<topic>/<p>/records       read-only text view from the log start offset
    MNT/<topic>/<p>/records.jsonl read-only JSON Lines view
    MNT/<topic>/<p>/by-offset/N[.jsonl]  records from the first offset ≥ N (ls: segment bases)
    MNT/<topic>/<p>/by-time/T[.jsonl]    records from the first timestamp ≥ T (ms or ISO-8601)
    MNT/<topic>/<p>/status        JSON: offsets, segments, effective config
    MNT/<topic>/append[.jsonl]    write-only: records go where Kafka's default partitioner sends
                                  them (murmur2 of the key; null keys round-robin per write)
    MNT/.logdir/                  read-only mirror of the log dir for backups (fs.mirror)

Handlers run on the trio loop and send every engine call to a worker thread, except reads that
need neither the disk nor much rendering (bytes in the OS page cache, pages already rendered or
small): those are served on the loop. A partition's appends are serialised by the engine's
partition lock. Views are `fs.views.View`s; after an append the kernel is told that the
partition's views changed size (an attribute invalidation, off the loop), so `tail -f` and
`less +F` follow without polling the filesystem. Errors reach the caller as errno values
through one table (`errno_for`), with a log line naming what and where; no handler lets an
exception take the mount down.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import stat
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import pyfuse3
import trio

from seglogfs.engine import DataDir, PartitionLog
from seglogfs.engine.config import validate_topic_overrides
from seglogfs.engine.console import (
    JsonLinesRenderer,
    LineFormat,
    TextFormat,
    TextRenderer,
    parse_timestamp,
    record_from_json,
)
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
from seglogfs.engine.naming import validate_topic
from seglogfs.engine.partitioner import RoundRobin, partition_for_key
from seglogfs.fs.mirror import Mirror, MirrorEntry, MirrorFile
from seglogfs.fs.views import UNUSED_LAYOUT_DAYS, Layout, LayoutStore, Renderer, View

logger = logging.getLogger(__name__)

T = TypeVar("T")

# Attributes and entries stay valid until the filesystem says otherwise (invalidation).
_TIMEOUT_S = 3600.0
_IO_BLOCK_BYTES = 1 << 20  # st_blksize of append and mirror files
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


def refuse(number: int, what: str) -> pyfuse3.FUSEError:
    """The error for a request the filesystem turns down, logged with what and where."""
    logger.warning("%s: %s (%s)", what, os.strerror(number), errno.errorcode.get(number, number))
    return pyfuse3.FUSEError(number)


def errno_for(error: BaseException) -> int:
    """The one table from engine errors (and OS errors) to errno values."""
    if isinstance(error, pyfuse3.FUSEError):
        return error.errno
    for kind, number in _ERRNO:
        if isinstance(error, kind):
            return number
    if isinstance(error, OSError) and error.errno:
        return error.errno
    return errno.EIO


@dataclass(frozen=True)
class MountOptions:
    """What `-o` sets besides FUSE's own options (DESIGN.md §2)."""

    text_format: TextFormat = field(default_factory=TextFormat)
    line_format: LineFormat = field(default_factory=LineFormat)
    read_only: bool = False
    view_cache: Path | None = None  # where sealed segments' view layouts are kept (LayoutStore)


@dataclass
class _Node:
    inode: int
    kind: str  # root | topic | partition | config | append | append.jsonl | records | records.jsonl | status
    topic: str | None = None
    partition: int | None = None
    start: int | None = None  # first offset of a by-offset / by-time view
    key: tuple[Any, ...] = ()  # its key in the inode table
    looked_up: bool = False

    path: tuple[str, ...] = ()  # below .logdir, for mirror nodes
    entry: MirrorEntry | None = None  # a mirror node as last resolved
    view: View | None = None  # a view node's view, once used: one for its stat and all its readers

    @property
    def is_dir(self) -> bool:
        if self.kind == "mirror":
            return self.entry is None or self.entry.is_dir
        return self.kind in ("root", "topic", "partition", "by-offset", "by-time")


_PARTITION_ENTRIES = ("append", "append.jsonl", "records", "records.jsonl", "by-offset", "by-time", "status")
_TOPIC_FILES = ("append", "append.jsonl", "config")
_VIEW_KINDS = ("records", "records.jsonl", "offset-view", "offset-view.jsonl")
_APPEND_KINDS = ("append", "append.jsonl", "topic-append", "topic-append.jsonl")
_TOPIC_KINDS = {"append": "topic-append", "append.jsonl": "topic-append.jsonl", "config": "config"}


@dataclass
class _ConfigHandle:
    """A topic's `config` open for writing: the new `key=value` lines, applied on close."""

    topic: str
    text: bytearray = field(default_factory=bytearray)


@dataclass
class _AppendHandle:
    node: _Node
    logs: list[PartitionLog]  # one for a partition's append file, every partition for a topic's
    pending: bytearray = field(default_factory=bytearray)


class SeglogFS(pyfuse3.Operations):
    """The operations of one mounted data dir. See the module docstring."""

    enable_writeback_cache = False

    def __init__(self, data_dir: DataDir, options: MountOptions, *, clock: Callable[[], int] | None = None) -> None:
        super().__init__()
        self.data_dir = data_dir
        self.options = options
        self._clock = clock or (lambda: time.time_ns() // 1_000_000)
        self._nodes: dict[int, _Node] = {pyfuse3.ROOT_INODE: _Node(pyfuse3.ROOT_INODE, "root")}
        self._by_key: dict[tuple[Any, ...], int] = {("root",): pyfuse3.ROOT_INODE}
        self._views_of: dict[tuple[str, int], set[int]] = {}  # a partition's view inodes
        self._next_inode = pyfuse3.ROOT_INODE + 1
        self._nodes_lock = threading.Lock()
        self._layouts: dict[tuple[str, int, str], Layout] = {}
        self._layout_store = LayoutStore(options.view_cache) if options.view_cache is not None else None
        self._handles: dict[int, Any] = {}
        self._next_fh = 1
        self._topic_lock = threading.Lock()
        self._round_robin = RoundRobin()
        self.mirror = Mirror(data_dir)
        self._mounted_ms = self._clock()
        self._uid, self._gid = os.getuid(), os.getgid()
        self.requests: Counter[str] = Counter()  # per handler, logged on SIGUSR1 and at unmount

    # -- nodes ---------------------------------------------------------------------------------
    def _node(
        self,
        kind: str,
        topic: str | None = None,
        partition: int | None = None,
        name: str = "",
        start: int | None = None,
    ) -> _Node:
        key = (kind, topic, partition, name)
        with self._nodes_lock:  # lookups run in worker threads: one inode per key
            inode = self._by_key.get(key)
            if inode is None:
                inode = self._next_inode
                self._next_inode += 1
                self._by_key[key] = inode
                self._nodes[inode] = _Node(inode, kind, topic, partition, start, key)
                if kind in _VIEW_KINDS and topic is not None and partition is not None:
                    self._views_of.setdefault((topic, partition), set()).add(inode)
            return self._nodes[inode]

    def _get(self, inode: int) -> _Node:
        node = self._nodes.get(inode)
        if node is None:
            raise pyfuse3.FUSEError(errno.ENOENT)
        return node

    def _children(self, node: _Node) -> list[tuple[str, _Node]]:
        topics = self.data_dir.topics()
        if node.kind == "root":
            mirror = self._mirror_node(())
            return [(".logdir", mirror)] + [(topic, self._node("topic", topic)) for topic in sorted(topics)]
        if node.kind == "mirror":
            return [(name, self._mirror_node((*node.path, name))) for name in self.mirror.names(node.path)]
        if node.kind == "topic":
            assert node.topic is not None
            partitions = topics.get(node.topic, [])
            files = [(name, self._node(_TOPIC_KINDS[name], node.topic)) for name in _TOPIC_FILES]
            return files + [(str(p), self._node("partition", node.topic, p)) for p in partitions]
        if node.kind == "partition":
            return [(name, self._partition_entry(node, name)) for name in _PARTITION_ENTRIES]
        if node.kind == "by-offset":
            log = self._log(node)
            bases = [max(s.base_offset, log.log_start_offset) for s in log.segments]
            return [
                (f"{base}{suffix}", self._offset_view(node, base, suffix))
                for base in bases
                for suffix in ("", ".jsonl")
            ]
        if node.kind == "by-time":
            return []  # any time can be looked up; there is nothing to list
        raise pyfuse3.FUSEError(errno.ENOTDIR)

    def _partition_entry(self, partition: _Node, name: str) -> _Node:
        """A partition's entry. `records` whose start was removed by retention is a new file
        (inode) from the new log start; the old one stays with whoever holds it, its bytes and
        size unchanged (a follower sees no truncation), and goes when the kernel forgets it."""
        node = self._node(name, partition.topic, partition.partition)
        if node.view is not None and node.view.start_offset < self._log(node).log_start_offset:
            with self._nodes_lock:
                if self._by_key.get(node.key) == node.inode:
                    del self._by_key[node.key]
            node = self._node(name, partition.topic, partition.partition)
        return node

    def _mirror_node(self, path: tuple[str, ...]) -> _Node:
        node = self._node("mirror", name="/".join(path))
        node.path = path
        try:
            node.entry = self.mirror.entry(path)
        except FileNotFoundError:
            raise pyfuse3.FUSEError(errno.ENOENT) from None
        return node

    def _child(self, parent: _Node, name: str) -> _Node:
        """The child called `name`: a listed entry, or a by-offset / by-time view."""
        if parent.kind in ("by-offset", "by-time"):
            stem, suffix = (name[:-6], ".jsonl") if name.endswith(".jsonl") else (name, "")
            log = self._log(parent)
            if parent.kind == "by-offset":
                if not stem.isdigit():
                    raise refuse(errno.ENOENT, f"{log.topic}/{log.partition}/by-offset/{name}: not an offset")
                offset = int(stem)
                if not log.log_start_offset <= offset <= log.log_end_offset:
                    raise refuse(
                        errno.ENOENT,
                        f"{log.topic}/{log.partition}/by-offset/{name}: outside the log "
                        f"({log.log_start_offset}..{log.log_end_offset})",
                    )
            else:
                try:
                    found = log.offset_for_timestamp(parse_timestamp(stem))
                except TimestampParseError as error:
                    raise refuse(errno.ENOENT, f"{log.topic}/{log.partition}/by-time/{name}: {error}") from None
                offset = log.log_end_offset if found is None else max(found.offset, log.log_start_offset)
            return self._offset_view(parent, offset, suffix, name)
        if parent.kind == "mirror" or (parent.kind == "root" and name == ".logdir"):
            return self._mirror_node((*parent.path, name) if parent.kind == "mirror" else ())
        for child_name, child in self._children(parent):
            if child_name == name:
                return child
        raise pyfuse3.FUSEError(errno.ENOENT)

    def _offset_view(self, parent: _Node, offset: int, suffix: str, name: str | None = None) -> _Node:
        kind = "offset-view" + suffix
        return self._node(kind, parent.topic, parent.partition, f"{parent.kind}/{name or offset}", start=offset)

    def _log(self, node: _Node) -> PartitionLog:
        assert node.topic is not None and node.partition is not None
        return self.data_dir.partition(node.topic, node.partition)

    def _layout(self, log: PartitionLog, fmt: str) -> Layout:
        """The partition's layout in a format ("text" or "jsonl"), shared by all its views."""
        key = (log.topic, log.partition, fmt)
        layout = self._layouts.get(key)
        if layout is None:
            if fmt == "text":
                renderer: Renderer = TextRenderer(self.options.text_format, log.partition)
                format_key = repr(self.options.text_format)
            else:
                renderer = JsonLinesRenderer(log.topic, log.partition)
                format_key = "jsonl"
            layout = Layout(log, renderer, store=self._layout_store, format_key=format_key)
            self._layouts[key] = layout
        return layout

    def _view(self, node: _Node) -> View:
        """The node's view: from its start offset, `records` from the log start when first used."""
        view = node.view
        if view is None:
            log = self._log(node)
            fmt = "jsonl" if node.kind.endswith(".jsonl") else "text"
            view = node.view = View(self._layout(log, fmt), log.log_start_offset if node.start is None else node.start)
        return view

    # -- attributes ----------------------------------------------------------------------------
    def _attributes(self, node: _Node) -> pyfuse3.EntryAttributes:
        """Runs in a worker thread: sizes of views may need rendering."""
        attr = pyfuse3.EntryAttributes()
        attr.st_ino = node.inode
        attr.generation = 0
        attr.entry_timeout = _TIMEOUT_S
        attr.attr_timeout = _TIMEOUT_S
        attr.st_uid, attr.st_gid = self._uid, self._gid
        # The preferred I/O size tells cat and cp how much to move at once: each write to an append
        # file becomes one record batch and each read of a mirror file one request, so large is
        # cheap there (FUSE passes up to 1 MiB a request). Views stay at a page: stdio and
        # Python size their buffers by it, and a view renders what is asked for (a first record
        # from by-offset/N should not render a megabyte); cat reads 128 KiB of them anyway.
        attr.st_blksize = _IO_BLOCK_BYTES if node.kind in (*_APPEND_KINDS, "mirror") else 4096
        stamp_ns = self._mounted_ms * 1_000_000
        writable = not self.options.read_only
        if node.kind == "mirror":
            entry = node.entry = self.mirror.entry(node.path)
            attr.st_mode = (stat.S_IFDIR | 0o555) if entry.is_dir else (stat.S_IFREG | 0o444)
            attr.st_nlink = 2 if entry.is_dir else 1
            attr.st_size = entry.size
            attr.st_blocks = (entry.size + 511) // 512
            attr.st_atime_ns = attr.st_mtime_ns = attr.st_ctime_ns = entry.mtime_ns or stamp_ns
            attr.attr_timeout = 0  # rsync must see what a mirrored file is now
            return attr
        if node.is_dir:
            attr.st_mode = stat.S_IFDIR | (0o755 if writable else 0o555)
            attr.st_nlink = 2
            attr.st_size = 0
        else:
            attr.st_nlink = 1
            if node.kind in _APPEND_KINDS:
                attr.st_mode = stat.S_IFREG | (0o200 if writable else 0)
                attr.st_size = 0
            else:
                attr.st_mode = stat.S_IFREG | (0o644 if node.kind == "config" and writable else 0o444)
                attr.st_size = len(self._small_file(node)) if node.kind in ("status", "config") else 0
                if node.kind in _VIEW_KINDS:
                    attr.st_size = self._view(node).size()
                    log = self._log(node)
                    stamp_ns = max(stamp_ns, log.active_segment.max_timestamp_so_far.timestamp * 1_000_000)
        attr.st_blocks = (attr.st_size + 511) // 512
        attr.st_atime_ns = attr.st_mtime_ns = attr.st_ctime_ns = stamp_ns
        return attr

    def _small_file(self, node: _Node) -> bytes:
        if node.kind == "config":
            assert node.topic is not None
            overrides = self.data_dir.topic_overrides(node.topic)
            return "".join(f"{key}={value}\n" for key, value in sorted(overrides.items())).encode()
        log = self._log(node)
        status = {
            "topic": log.topic,
            "partition": log.partition,
            "logStartOffset": log.log_start_offset,
            "logEndOffset": log.log_end_offset,
            "highWatermark": log.high_watermark,
            "recoveryPoint": log.recovery_point,
            "sizeInBytes": log.size_in_bytes(),
            "segments": [
                {
                    "baseOffset": segment.base_offset,
                    "bytes": segment.size,
                    "maxTimestamp": segment.max_timestamp_so_far.timestamp,
                }
                for segment in log.segments
            ],
            "config": log.config.as_properties(),
        }
        return (json.dumps(status, indent=2) + "\n").encode()

    async def _run(self, work: Callable[[], T], what: str) -> T:
        """Run engine work off the loop; engine errors become errno values with a log line."""
        try:
            return await trio.to_thread.run_sync(work)
        except pyfuse3.FUSEError:
            raise
        except Exception as error:  # every failure becomes an errno, never a crash
            number = errno_for(error)
            logger.warning("%s: %s (%s)", what, error, errno.errorcode.get(number, number))
            raise pyfuse3.FUSEError(number) from None

    # -- lookups and directories ---------------------------------------------------------------
    async def lookup(self, parent_inode: int, name: bytes, ctx: Any = None) -> pyfuse3.EntryAttributes:
        self.requests["lookup"] += 1
        parent = self._get(parent_inode)
        text = os.fsdecode(name)

        def find() -> pyfuse3.EntryAttributes:
            if text == "..":
                return self._attributes(parent)
            child = self._child(parent, text)
            child.looked_up = True
            return self._attributes(child)

        return await self._run(find, f"lookup {text}")

    async def getattr(self, inode: int, ctx: Any = None) -> pyfuse3.EntryAttributes:
        self.requests["getattr"] += 1
        node = self._get(inode)
        return await self._run(lambda: self._attributes(node), f"getattr {node.kind}")

    async def setattr(self, inode: int, attr: Any, fields: Any, fh: Any, ctx: Any) -> pyfuse3.EntryAttributes:
        node = self._get(inode)
        # `>` on an append file truncates it to 0 first: nothing to do, it is always empty.
        if fields.update_size and not (node.kind in (*_APPEND_KINDS, "config") and attr.st_size == 0):
            raise refuse(errno.EPERM if node.kind in _VIEW_KINDS else errno.EINVAL, f"truncate {self._where(node)}")
        return await self.getattr(inode, ctx)

    async def opendir(self, inode: int, ctx: Any) -> int:
        node = self._get(inode)
        if not node.is_dir:
            raise pyfuse3.FUSEError(errno.ENOTDIR)
        return inode

    async def readdir(self, fh: int, start_id: int, token: Any) -> None:
        self.requests["readdir"] += 1
        node = self._get(fh)

        def list_entries() -> list[tuple[str, pyfuse3.EntryAttributes]]:
            entries = []
            for name, child in self._children(node):
                child.looked_up = True  # readdirplus hands the kernel the entry without a lookup
                entries.append((name, self._attributes(child)))
            return entries

        entries = await self._run(list_entries, "readdir")
        for index, (name, attr) in enumerate(entries[start_id:], start=start_id):
            if not pyfuse3.readdir_reply(token, os.fsencode(name), attr, index + 1):
                return

    async def mkdir(self, parent_inode: int, name: bytes, mode: int, ctx: Any) -> pyfuse3.EntryAttributes:
        parent = self._get(parent_inode)
        topic = os.fsdecode(name)
        if parent.kind != "root":
            raise refuse(errno.EPERM, f"mkdir {self._where(parent)}/{topic}: topics only at the top")
        if self.options.read_only:
            raise refuse(errno.EROFS, f"mkdir {topic}")

        def create() -> pyfuse3.EntryAttributes:
            validate_topic(topic)
            with self._topic_lock:
                self.data_dir.create_topic(topic, now_ms=self._clock())
            node = self._node("topic", topic)
            node.looked_up = True
            return self._attributes(node)

        return await self._run(create, f"mkdir {topic}")

    async def statfs(self, ctx: Any) -> pyfuse3.StatvfsData:
        result = os.statvfs(self.data_dir.config.log_dirs[0])
        data = pyfuse3.StatvfsData()
        for name in ("f_bsize", "f_frsize", "f_blocks", "f_bfree", "f_bavail", "f_files", "f_ffree", "f_favail"):
            setattr(data, name, getattr(result, name))
        data.f_namemax = 249  # Kafka's longest topic name
        return data

    # -- files -----------------------------------------------------------------------------------
    def _new_fh(self, handle: Any) -> int:
        fh = self._next_fh
        self._next_fh += 1
        self._handles[fh] = handle
        return fh

    async def open(self, inode: int, flags: int, ctx: Any) -> pyfuse3.FileInfo:
        self.requests["open"] += 1
        node = self._get(inode)
        access = flags & os.O_ACCMODE
        if node.is_dir:
            raise refuse(errno.EISDIR, f"open {self._where(node)}")
        if node.kind in _APPEND_KINDS:
            if access == os.O_RDONLY:
                raise refuse(errno.EACCES, f"read {self._where(node)}: append files are write-only")
            if self.options.read_only:
                raise refuse(errno.EROFS, f"write {self._where(node)}")
            logs = await self._run(lambda: self._append_logs(node), "open")
            return pyfuse3.FileInfo(fh=self._new_fh(_AppendHandle(node, logs)), direct_io=True, nonseekable=True)
        if node.kind == "config" and access != os.O_RDONLY:
            if self.options.read_only:
                raise refuse(errno.EROFS, f"write {self._where(node)}")
            assert node.topic is not None
            return pyfuse3.FileInfo(fh=self._new_fh(_ConfigHandle(node.topic)), direct_io=True)
        if access != os.O_RDONLY:
            raise refuse(errno.EACCES, f"write {self._where(node)}: read-only file")
        if node.kind in _VIEW_KINDS:
            # Looked up already (the usual case): its view is there, nothing to do off the loop.
            view = node.view or await self._run(lambda: self._view(node), "open")
            # No page cache for views: a read racing an append could leave a cached page that
            # ends in zeros where the new records now are (the kernel zero-fills a short read).
            return pyfuse3.FileInfo(fh=self._new_fh(view), direct_io=True)
        if node.kind == "mirror":
            opened = await self._run(lambda: MirrorFile(self.mirror, node.path), f"open .logdir/{'/'.join(node.path)}")
            return pyfuse3.FileInfo(fh=self._new_fh(opened), direct_io=True)
        content = await self._run(lambda: self._small_file(node), "open")
        return pyfuse3.FileInfo(fh=self._new_fh(content), direct_io=True)

    def _append_logs(self, node: _Node) -> list[PartitionLog]:
        if node.partition is not None:
            return [self._log(node)]
        assert node.topic is not None
        return [self.data_dir.partition(node.topic, p) for p in self.data_dir.topics().get(node.topic, [])]

    # pyfuse3 replies with any contiguous buffer: a mirror read returns the buffer it read into.
    async def read(self, fh: int, off: int, size: int) -> bytes | bytearray:  # type: ignore[override]
        self.requests["read"] += 1
        handle = self._handles.get(fh)
        if isinstance(handle, bytes):
            return handle[off : off + size]
        # A read that needs neither the disk nor much rendering is served on the loop: handing
        # it to a worker thread costs more than the read (sequential readers ran at half speed).
        if not isinstance(handle, (View, MirrorFile)):
            raise pyfuse3.FUSEError(errno.EBADF)
        readable = handle
        data = readable.read_now(off, size)
        if data is None:
            what = "read .logdir" if isinstance(readable, MirrorFile) else "read"
            return await self._run(lambda: readable.read(off, size), what)
        self.requests["read_now"] += 1
        return data

    def prune_view_cache(self) -> None:
        """At mount: remove stored layouts no mount has used for a while (LayoutStore.prune)."""
        if self._layout_store is not None:
            removed = self._layout_store.prune(self._clock() / 1000)
            if removed:
                logger.info(
                    "view cache %s: removed the layouts of %d partitions unused for %d days",
                    self._layout_store.root,
                    removed,
                    UNUSED_LAYOUT_DAYS,
                )

    def keep_layouts(self) -> None:
        """At unmount: store what is measured of every view layout (see fs.views.LayoutStore)."""
        for layout in list(self._layouts.values()):
            layout.keep()

    async def write(self, fh: int, off: int, buf: bytes) -> int:
        self.requests["write"] += 1
        handle = self._handles.get(fh)
        if isinstance(handle, _ConfigHandle):
            handle.text[off : off + len(buf)] = buf
            await self._run(lambda: self._parse_config(handle), f"write {handle.topic}/config")
            return len(buf)
        if not isinstance(handle, _AppendHandle):
            raise pyfuse3.FUSEError(errno.EBADF)
        data = handle.pending + buf
        cut = data.rfind(b"\n") + 1
        lines = bytes(data[:cut])
        if lines:
            await self._append(handle, lines)
        handle.pending = bytearray(data[cut:])
        return len(buf)

    async def _append(self, handle: _AppendHandle, lines: bytes) -> None:
        """Lines of one write → one append per partition (split at max.message.bytes by the
        engine); all or nothing per partition: a bad line fails the whole write before anything
        is stored."""
        node, logs = handle.node, handle.logs
        jsonl = node.kind.endswith(".jsonl")
        where = (
            f"{node.topic}/{'' if node.partition is None else f'{node.partition}/'}{node.kind.removeprefix('topic-')}"
        )

        def append() -> list[PartitionLog]:
            now = self._clock()
            null_slot = self._round_robin.next(len(logs))
            if not jsonl and len(logs) == 1 and self.options.line_format == LineFormat():
                # Plain lines into one partition: every line is a value, nothing to parse.
                logs[0].append_records(lines.split(b"\n")[:-1], timestamps=now, now_ms=now)
                return logs
            columns: dict[int, tuple[list, list, list, list]] = {}
            for number, line in enumerate(lines.split(b"\n")[:-1], start=1):
                if jsonl:
                    parsed = record_from_json(line, f"{where} line {number}")
                    key, value, headers = parsed.key, parsed.value, tuple(parsed.headers)
                    timestamp = now if parsed.timestamp is None else parsed.timestamp
                else:
                    key, value = self.options.line_format.parse(line, f"{where} line {number}")
                    headers, timestamp = (), now
                slot = 0 if len(logs) == 1 else (null_slot if key is None else partition_for_key(key, len(logs)))
                column = columns.setdefault(slot, ([], [], [], []))
                column[0].append(value)
                column[1].append(key)
                column[2].append(headers)
                column[3].append(timestamp)
            for slot, (values, keys, headers_list, timestamps) in sorted(columns.items()):
                logs[slot].append_records(
                    values,
                    keys=keys if any(k is not None for k in keys) else None,
                    headers=headers_list if any(headers_list) else None,
                    timestamps=timestamps,
                    now_ms=now,
                )
            return [logs[slot] for slot in columns]

        for log in await self._run(append, f"write {where}"):
            await self.notify_grown(log)

    async def notify_grown(self, log: PartitionLog) -> None:
        """Tell the kernel that the partition's views changed size (off the loop: the call may
        block). Views the kernel never looked up need no telling."""
        views = self._views_of.get((log.topic, log.partition), set())
        inodes = [inode for inode in views if inode in self._nodes and self._nodes[inode].looked_up]
        await self._invalidate(inodes)

    @staticmethod
    async def _invalidate(inodes: list[int]) -> None:
        """Drop the kernel's cached attributes of `inodes` (sizes changed)."""
        for inode in inodes:
            try:
                await trio.to_thread.run_sync(pyfuse3.invalidate_inode, inode, True)
            except OSError as error:  # ENOENT: the kernel has forgotten the inode
                if error.errno != errno.ENOENT:
                    logger.warning("invalidating inode %d: %s", inode, error)

    async def notify_all(self) -> None:
        """After background work (retention, compaction): every view may have changed, and
        `records` of a partition whose log start moved names a new file."""
        for topic, partitions in self.data_dir.topics().items():
            for partition in partitions:
                log = self.data_dir.partition(topic, partition)
                await self.notify_grown(log)
                parent = self._by_key.get(("partition", topic, partition, ""))
                for name in ("records", "records.jsonl"):
                    inode = self._by_key.get((name, topic, partition, ""))
                    node = self._nodes.get(inode) if inode is not None else None
                    if parent is None or node is None or node.view is None or not node.looked_up:
                        continue
                    if node.view.start_offset < log.log_start_offset:
                        await self._invalidate_entry(parent, name)

    @staticmethod
    async def _invalidate_entry(parent_inode: int, name: str) -> None:
        """Have the kernel look `name` up again (it names another inode now)."""
        try:
            await trio.to_thread.run_sync(pyfuse3.invalidate_entry, parent_inode, os.fsencode(name))
        except OSError as error:  # ENOENT: the kernel has forgotten the entry
            if error.errno != errno.ENOENT:
                logger.warning("invalidating entry %s of inode %d: %s", name, parent_inode, error)

    @staticmethod
    def _parse_config(handle: _ConfigHandle) -> dict[str, str]:
        """`key=value` lines (blank lines and `#` comments skipped); a complete line that is not
        one fails the write that brought it."""
        overrides = {}
        lines = bytes(handle.text).decode("utf-8", "replace").split("\n")
        for number, line in enumerate(lines[:-1] if not handle.text.endswith(b"\n") else lines, start=1):
            text = line.strip()
            if not text or text.startswith("#"):
                continue
            key, sep, value = text.partition("=")
            if not sep:
                raise ConfigError(f"{handle.topic}/config line {number}: expected key=value, got {text!r}")
            overrides[key.strip()] = value.strip()
        validate_topic_overrides(overrides, f"{handle.topic}/config")
        return overrides

    async def flush(self, fh: int) -> None:
        handle = self._handles.get(fh)
        if isinstance(handle, _ConfigHandle):
            topic = handle.topic
            handle.text += b"\n"  # a last line without its newline counts
            overrides = await self._run(lambda: self._parse_config(handle), f"write {topic}/config")
            handle.text = handle.text[:-1]
            await self._run(lambda: self.data_dir.set_topic_overrides(topic, overrides), f"write {topic}/config")
            inode = self._by_key.get(("config", topic, None, ""))
            await self._invalidate([] if inode is None else [inode])
            return
        if isinstance(handle, _AppendHandle) and handle.pending:
            # A trailing partial line is a record once the file is closed.
            pending, handle.pending = bytes(handle.pending) + b"\n", bytearray()
            await self._append(handle, pending)

    async def fsync(self, fh: int, datasync: bool) -> None:
        handle = self._handles.get(fh)
        if isinstance(handle, _AppendHandle):
            await self.flush(fh)
            logs = handle.logs

            def flush_all() -> None:
                for log in logs:
                    log.flush()

            await self._run(flush_all, "fsync")

    async def release(self, fh: int) -> None:
        handle = self._handles.pop(fh, None)
        if isinstance(handle, MirrorFile):
            handle.close()

    async def forget(self, inode_list: Sequence[tuple[int, int]]) -> None:
        # The kernel forgets an inode with all its lookups at once: a by-offset / by-time view,
        # a mirror entry or a `records` superseded after retention is dropped (there can be any
        # number of them); fixed entries keep their inode for good.
        for inode, _ in inode_list:
            node = self._nodes.get(inode)
            if node is None:
                continue
            node.looked_up = False
            with self._nodes_lock:
                superseded = self._by_key.get(node.key) != inode
                if node.kind.startswith("offset-view") or (node.kind == "mirror" and node.path) or superseded:
                    del self._nodes[inode]
                    if not superseded:
                        del self._by_key[node.key]
                    self._views_of.get((node.topic or "", node.partition or 0), set()).discard(inode)

    # -- refused -------------------------------------------------------------------------------
    async def unlink(self, parent_inode: int, name: bytes, ctx: Any) -> None:
        raise refuse(errno.EPERM, f"unlink {self._where(self._get(parent_inode))}/{os.fsdecode(name)}")

    async def rmdir(self, parent_inode: int, name: bytes, ctx: Any) -> None:
        raise refuse(errno.EPERM, f"rmdir {self._where(self._get(parent_inode))}/{os.fsdecode(name)}")

    async def rename(  # noqa: PLR0917 (pyfuse3's signature)
        self, parent_inode_old: int, name_old: bytes, parent_inode_new: int, name_new: bytes, flags: int, ctx: Any
    ) -> None:
        raise refuse(errno.EPERM, f"rename {self._where(self._get(parent_inode_old))}/{os.fsdecode(name_old)}")

    async def create(self, parent_inode: int, name: bytes, mode: int, flags: int, ctx: Any) -> Any:
        raise refuse(errno.EPERM, f"create {self._where(self._get(parent_inode))}/{os.fsdecode(name)}")

    async def mknod(self, parent_inode: int, name: bytes, mode: int, rdev: int, ctx: Any) -> Any:
        raise refuse(errno.EPERM, f"mknod {self._where(self._get(parent_inode))}/{os.fsdecode(name)}")

    async def symlink(self, parent_inode: int, name: bytes, target: bytes, ctx: Any) -> Any:
        raise refuse(errno.EPERM, f"symlink {self._where(self._get(parent_inode))}/{os.fsdecode(name)}")

    async def link(self, inode: int, new_parent_inode: int, new_name: bytes, ctx: Any) -> Any:
        raise refuse(errno.EPERM, f"link {self._where(self._get(inode))}")

    def _where(self, node: _Node) -> str:
        """A node's path in the mount, for log lines."""
        if node.kind == "root":
            return ""
        parts = [node.topic or ""]
        if node.partition is not None:
            parts.append(str(node.partition))
        if not node.is_dir or node.kind in ("by-offset", "by-time"):
            parts.append(node.kind.removeprefix("topic-"))
        return "/".join(parts)
