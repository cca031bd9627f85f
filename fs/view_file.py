"""Views: `records`, `records.jsonl`, `by-offset/N[.jsonl]` and `by-time/T[.jsonl]` — a
partition from an offset on, rendered as text or JSON Lines (fs.views), as read-only files with
exact sizes that grow as records arrive; read_uncommitted or read_committed (Kafka's isolation
levels: see fs.views.Layout)."""

from __future__ import annotations

import errno
import stat
import threading
from typing import TYPE_CHECKING

from seglogfs.fs.node import IO_BLOCK_BYTES, Attributes, Changes, Handle, PartitionNode, Refused, log_access
from seglogfs.fs.views import View

if TYPE_CHECKING:
    from seglogfs.engine import PartitionLog
    from seglogfs.fs.tree import Tree


UNWATCHED_VIEW_VALID_S = 1.0


class ViewFile(PartitionNode):
    """A view from `start_offset` (None: the log start offset when first used), read_committed
    or not. The node keeps one `View` for its stat and all its readers."""

    def __init__(
        self,
        tree: Tree,
        inode: int,
        key: tuple[object, ...],
        path: str,
        *,
        topic: str,
        partition: int,
        jsonl: bool,
        start_offset: int | None,
        read_committed: bool = False,
        parent_inode: int = 0,
    ) -> None:
        super().__init__(tree, inode, key, path, topic=topic, partition=partition)
        self.parent_inode = parent_inode  # (its name is dropped from the kernel when superseded)
        self.jsonl = jsonl
        self.read_committed = read_committed
        self.start_offset = start_offset
        self.view: View | None = None
        self._view_lock = threading.Lock()
        self.open_handles = 0  # ViewHandles not released (the tree counts them under its lock)

    def ensure_view(self) -> View:
        """The node's view, made on first use (one, however many first uses race)."""
        view = self.view
        if view is None:
            with self._view_lock:
                view = self.view
                if view is None:
                    log = self.log
                    layout = self.tree.layout(
                        log, "jsonl" if self.jsonl else "text", read_committed=self.read_committed
                    )
                    start = log.log_start_offset if self.start_offset is None else self.start_offset
                    view = self.view = View(layout, start)
        return view

    def viewed_log(self) -> PartitionLog:
        """The partition this node's view shows: the one it was made on, which stays its own
        after its topic is deleted (held open, the view keeps what it holds: Tree.delete_topic),
        else the data dir's partition of the name."""
        view = self.view
        return self.log if view is None else view.layout.log

    def attributes(self) -> Attributes:
        log = self.viewed_log()
        if log.offline_reason is not None:  # (an offline partition has no segments to measure)
            raise Refused(errno.EIO, f"stat {self.path}: the partition is offline ({log.offline_reason})")
        mtime_ns = max(self.tree.mounted_ns, log.active_segment.max_timestamp_so_far.timestamp * 1_000_000)
        # By-offset and by-time views are told of growth only while open (there can be any
        # number of them): looked up but closed, their size may be a second old.
        valid_s = UNWATCHED_VIEW_VALID_S if self.forgettable() else None
        size = self.ensure_view().size()
        return self.shown(
            stat.S_IFREG,
            log_access(log).reading(),
            size=size,
            mtime_ns=mtime_ns,
            block_bytes=IO_BLOCK_BYTES,
            valid_s=valid_s,
        )

    def listed_attributes(self) -> Attributes:
        """Not measured yet: size 0 for now, valid for no time, so that the kernel asks again
        (`stat`; a read past the size it knows): listing a directory never measures."""
        if self.ensure_view().layout.measured:
            return self.attributes()
        return self.shown(
            stat.S_IFREG,
            self.partition_access().reading(),
            mtime_ns=self.tree.mounted_ns,
            block_bytes=IO_BLOCK_BYTES,
            valid_s=0,
        )

    def open_now(self, flags: int) -> Handle | None:
        # Looked up already (the usual case): its view is there, nothing to do off the loop.
        self.refuse_writes(flags)
        self.check_online("open")
        return None if self.view is None else ViewHandle(self, self.view)

    def open(self, flags: int) -> Handle:
        self.refuse_writes(flags)
        self.check_online("open")
        handle = ViewHandle(self, self.ensure_view())
        handle.view.layout.keep_open()
        return handle

    def truncate(self, size: int) -> None:
        raise Refused(errno.EPERM, f"truncate {self.path}")

    def forgettable(self) -> bool:
        return self.start_offset is not None  # by-offset and by-time views: any number of them


class ViewHandle(Handle):
    """An open view: watched for growth until released (Tree.view_opened), and holding its
    layout (`Layout.hold`): a stable file that only grows, whatever retention, compaction or
    another writer do meanwhile (see fs.views, "Readers holding a view")."""

    def __init__(self, node: ViewFile, view: View) -> None:
        super().__init__(node)
        self.view_file = node
        self.view = view
        view.layout.hold()
        node.tree.view_opened(node)

    def release(self) -> Changes:
        self.view_file.tree.view_closed(self.view_file)
        self.view.layout.let_go()
        return Changes()

    def read_now(self, position: int, length: int) -> bytes | memoryview | None:
        if self.view.layout.log.offline_reason is not None:
            return None  # the worker thread's read says why
        return self.view.read_now(position, length)

    def read(self, position: int, length: int) -> bytes | memoryview:
        reason = self.view.layout.log.offline_reason  # (its own partition's, though its topic be deleted)
        if reason is not None:
            raise Refused(errno.EIO, f"read {self.node.path}: the partition is offline ({reason})")
        return self.view.read(position, length)

    def grown_size(self) -> int:
        return self.view.known_size()
