"""The mounted tree (the layout README shows), free of any FUSE binding: what exists, under which inode.

    <topic>/                  directories.TopicDir: mkdir at the top creates a topic, rmdir deletes it
    <topic>/config            config_file.ConfigFile: the topic's overrides, `key=value` lines
    <topic>/append[.jsonl]    append_file.AppendFile: records placed by Kafka's partitioner
    <topic>/<p>/              directories.PartitionDir
    <topic>/<p>/append[.jsonl]            append_file.AppendFile
    <topic>/<p>/records[.jsonl]           view_file.ViewFile, from the log start offset
    <topic>/<p>/by-offset/N[.jsonl]       view_file.ViewFile, from the first offset ≥ N
    <topic>/<p>/by-time/T[.jsonl]         view_file.ViewFile, from the first timestamp ≥ T
    <topic>/<p>/read_committed/, read_uncommitted/    directories.IsolationDir: the same views
                              at that isolation level (the ones above are at the mount's)
    <topic>/<p>/status        status_file.StatusFile
    .logdir/                  mirror_node.MirrorNode: the data dir in Kafka's layout, for backups

A node is made when it is first looked up and keeps its inode for good, except by-offset and
by-time views and `.logdir` entries (there can be any number of them: dropped when the kernel
forgets them), a `records` file whose start retention removed, and a view whose open readers'
layout the log's changes detached (fs.views): each superseded by a new inode.

Thread-safety: lookups, stats and listings run in worker threads at once; the inode table and
the per-partition view index are guarded by one lock (`_lock`), held only for dictionary work.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from seglogfs.engine import DataDir, EngineError, PartitionLog
from seglogfs.engine.log.naming import INTERNAL_TOPICS
from seglogfs.engine.log.transactions import READ_COMMITTED
from seglogfs.engine.mirror import Mirror
from seglogfs.engine.text.console_formats import LineFormat, TextFormat
from seglogfs.engine.text.renderers import JsonLinesRenderer, TextRenderer
from seglogfs.fs.directories import LOGDIR, ByOffsetDir, ByTimeDir, PartitionDir, RootDir
from seglogfs.fs.layout_store import UNUSED_LAYOUT_DAYS, LayoutStore
from seglogfs.fs.mirror_node import MirrorNode
from seglogfs.fs.node import Changes, Node, NoEntry, Refused, join, log_access
from seglogfs.fs.permissions import PERMISSION_BITS, ROOT_ONLY, Access, Caller, chown_created
from seglogfs.fs.view_file import ViewFile
from seglogfs.fs.views import Layout, MeasureStopped, Renderer, start_letting_close

logger = logging.getLogger(__name__)

ROOT_INODE = 1  # FUSE's root inode
N = TypeVar("N", bound=Node)


@dataclass(frozen=True)
class MountOptions:
    """What `-o` sets besides FUSE's own options (README: mount options)."""

    text_format: TextFormat = field(default_factory=TextFormat)
    line_format: LineFormat = field(default_factory=LineFormat)
    read_only: bool = False
    view_cache: Path | None = None  # where sealed segments' view layouts are kept (LayoutStore)
    measure: bool = True  # measure unmeasured partitions' views in the background (-o measure=lazy: no)
    # -o isolation.level=read_committed: the views directly in a partition's directory are
    # read_committed (its read_committed/ and read_uncommitted/ are so whatever the option).
    read_committed: bool = False


class Tree:
    """The nodes of one mounted data dir, by inode. See the module docstring."""

    def __init__(self, data_dir: DataDir, options: MountOptions, *, clock: Callable[[], int] | None = None) -> None:
        start_letting_close()  # (not at the first close of a held view: that is on the event loop)
        self.data_dir = data_dir
        self.options = options
        self.read_only = options.read_only
        self.clock = clock or (lambda: time.time_ns() // 1_000_000)
        self.mounted_ns = self.clock() * 1_000_000
        self.mirror = Mirror(data_dir)
        self._lock = threading.Lock()
        self._topic_lock = threading.Lock()
        self._nodes: dict[int, Node] = {}
        self._by_key: dict[tuple[object, ...], int] = {}
        self._views_of: dict[tuple[str, int], set[int]] = {}  # a partition's view inodes
        self._next_inode = ROOT_INODE
        self._layouts: dict[tuple[str, int, str, bool], Layout] = {}  # (topic, partition, format, read_committed)
        self._layouts_lock = threading.Lock()  # held to make a layout (cheap: nothing is measured)
        self._stopping = threading.Event()  # set at unmount: measures stop
        self._layout_store = LayoutStore(options.view_cache) if options.view_cache is not None else None
        self.root = self.intern(("root",), lambda inode, key: RootDir(self, inode, key, ""))

    # -- the inode table -----------------------------------------------------------------------------
    def intern(self, key: tuple[object, ...], make: Callable[[int, tuple[object, ...]], N]) -> N:
        """The node called `key`, made (with a new inode) if there is none."""
        with self._lock:
            inode = self._by_key.get(key)
            if inode is None:
                inode = self._next_inode
                self._next_inode += 1
                node = make(inode, key)
                self._by_key[key] = inode
                self._nodes[inode] = node
                if isinstance(node, ViewFile) and not node.forgettable():
                    self._views_of.setdefault((node.topic, node.partition), set()).add(inode)
            return self._nodes[inode]  # type: ignore[return-value]

    def view_opened(self, node: ViewFile) -> None:
        """A by-offset or by-time view is watched for growth while it is open (`records` always
        is); any number of them may be looked up, and a write must not tell the kernel of each."""
        with self._lock:
            node.open_handles += 1
            self._views_of.setdefault((node.topic, node.partition), set()).add(node.inode)

    def view_closed(self, node: ViewFile) -> None:
        with self._lock:
            node.open_handles -= 1
            if node.open_handles == 0 and node.forgettable():
                self._views_of.get((node.topic, node.partition), set()).discard(node.inode)

    def find(self, key: tuple[object, ...]) -> Node | None:
        inode = self._by_key.get(key)
        return None if inode is None else self._nodes.get(inode)

    def get(self, inode: int) -> Node | None:
        """The node of `inode`; None for one the tree does not have (or no longer)."""
        return self._nodes.get(inode)

    def lookup(self, parent: Node, name: str) -> Node:
        """`parent`'s entry `name`, now known to the kernel."""
        return self.note_lookup(parent.child(name))

    def note_lookup(self, node: N) -> N:
        """The kernel is handed `node` (a lookup, a readdirplus entry, a mkdir): one more
        lookup for `forget` to count down. Counting one that never reaches the kernel (a reply
        cut short) only keeps a node longer."""
        with self._lock:
            node.lookups += 1
        return node

    def supersede(self, node: Node) -> None:
        """`node`'s name will name a new node; the old one lives until the kernel forgets it."""
        with self._lock:
            if self._by_key.get(node.key) == node.inode:
                del self._by_key[node.key]

    def forget(self, inode: int, lookups: int) -> None:
        """The kernel forgot `lookups` of its lookups of `inode`; at none left the node may go
        (a lookup replying meanwhile counts up again first, so it never hands out a dropped
        inode)."""
        node = self._nodes.get(inode)
        if node is None:
            return
        with self._lock:
            node.lookups = max(node.lookups - lookups, 0)
            if node.lookups:
                return
            superseded = self._by_key.get(node.key) != inode
            if superseded or node.forgettable():
                del self._nodes[inode]
                if not superseded:
                    del self._by_key[node.key]
                if isinstance(node, ViewFile):
                    self._views_of.get((node.topic, node.partition), set()).discard(inode)

    # -- nodes made by more than one directory ------------------------------------------------------
    def mirror_node(self, parts: tuple[str, ...]) -> MirrorNode:
        path = join(LOGDIR, "/".join(parts)) if parts else LOGDIR
        node = self.intern(("mirror", parts), lambda inode, key: MirrorNode(self, inode, key, path, parts))
        node.resolve()  # ENOENT when it is gone
        return node

    def offset_view(self, parent: ByOffsetDir | ByTimeDir, name: str, offset: int) -> ViewFile:
        return self.intern(
            ("view", parent.topic, parent.partition, join(parent.path, name)),
            lambda inode, key: parent.view_file(inode, key, name, offset),
        )

    def data_dir_access(self) -> Access:
        """Who may list the data dir and change what it holds (topics, their configs): its
        (first) log dir's owner, group and permission bits. The log dir itself may be a link
        (as /var/lib/kafka often is): followed, as mounting it did."""
        try:
            access = Access.of(self.data_dir.config.log_dirs[0], follow=True)
        except OSError:
            return ROOT_ONLY
        return access.with_mode(access.mode & PERMISSION_BITS)

    def create_topic(self, topic: str, owner: tuple[int, int] | None = None) -> None:
        """`topic`, its partition dirs and their files given to `owner` (uid, gid) when one is
        named and the mount may give files away (it runs as root)."""
        with self._topic_lock:
            logs = self.data_dir.create_topic(topic, now_ms=self.clock())
            if owner is not None and os.geteuid() == 0 and owner != (os.geteuid(), os.getegid()):
                chown_created([log.directory for log in logs], *owner)

    def delete_topic(self, topic: str, caller: Caller) -> None:
        """`rmdir` of a topic: deleted as `topics delete` deletes it (DataDir.delete_topic: its
        partition dirs renamed `-delete`, then removed), refused (Refused, one log line saying
        why) for Kafka's internal topics, for a topic the broker's KRaft metadata log names (a
        broker started on the dir would make it again, and its controller still counts it),
        and for a caller who may not write every partition's files (what `rm -r` of the
        partition dirs on disk takes; the kernel checked the data dir's own bits).

        Open views of the topic keep what they hold (fs.views: their layouts keep their
        segments' files open, and their nodes read through them) and grow no more; an open
        append file's next write is ENOENT. Every node of the topic is superseded: a topic made
        again under the name is new files."""
        what = f"rmdir {topic}"
        if self.read_only:
            raise Refused(errno.EROFS, what)
        partitions = self.data_dir.topics().get(topic)
        if partitions is None:
            raise NoEntry(what)
        if topic in INTERNAL_TOPICS:
            raise Refused(errno.EPERM, f"{what}: internal to Kafka (its brokers keep it), not deleted as a topic")
        if self.data_dir.metadata_log_has_topic(topic):
            raise Refused(
                errno.EPERM,
                f"{what}: the broker's KRaft metadata log names the topic, and a broker started on this data dir "
                "would make its partitions again: delete it through the cluster (kafka-topics --delete)",
            )
        for partition in partitions:
            if not caller.may_write(log_access(self.data_dir.partition(topic, partition))):
                raise Refused(errno.EACCES, f"{what}: the caller may not write the files of partition {partition}")
        # What open views hold is laid out and its segments kept open now, while their files are
        # there: a view opened but not read yet has nothing laid out (a measure after the
        # deletion would find the segments closed).
        held = self._layouts_by_partition()
        for partition in partitions:
            for _, layout in held.get((topic, partition), []):
                if layout.held:
                    try:
                        layout.snapshot()
                    except (EngineError, OSError, MeasureStopped) as error:  # (its readers' requests say so too)
                        logger.debug("laying out the views of %s-%d before deleting it: %s", topic, partition, error)
                    layout.keep_open()
        with self._topic_lock:
            deleted = self.data_dir.delete_topic(topic)
        with self._layouts_lock:
            for key in [key for key in self._layouts if key[0] == topic]:
                del self._layouts[key]  # (a held one stays with its views)
        open_views = 0
        with self._lock:
            for node in self._nodes.values():
                if getattr(node, "topic", None) != topic:
                    continue
                if self._by_key.get(node.key) == node.inode:
                    del self._by_key[node.key]
                if isinstance(node, ViewFile):
                    open_views += node.open_handles
            for partition in partitions:
                self._views_of.pop((topic, partition), None)
        logger.info(
            "deleted topic %s: partition dirs %s renamed -delete and removed%s",
            topic,
            ", ".join(path.name for path in deleted),
            f"; {open_views} open views of it keep what they hold and grow no more" if open_views else "",
        )

    # -- views ----------------------------------------------------------------------------------------
    def layout(self, log: PartitionLog, fmt: str, *, read_committed: bool = False) -> Layout:
        """The partition's layout in a format ("text" or "jsonl") at an isolation level, shared
        by all its views at that level: one, however many first looks race for it (each would
        measure the partition)."""
        key = (log.topic, log.partition, fmt, read_committed)
        with self._layouts_lock:
            layout = self._layouts.get(key)
            if layout is None or layout.detached:  # (a detached one is its readers' alone)
                layout = self._new_layout(key, log)
            return layout

    def _new_layout(self, key: tuple[str, int, str, bool], log: PartitionLog) -> Layout:
        _, _, fmt, read_committed = key
        if fmt == "text":
            renderer: Renderer = TextRenderer(self.options.text_format, log.partition)
            format_key = repr(self.options.text_format)
        else:
            renderer = JsonLinesRenderer(log.topic, log.partition)
            format_key = "jsonl"
        if read_committed:  # (measured apart, and stored apart)
            format_key, name = f"{format_key} {READ_COMMITTED}", f"{fmt}, {READ_COMMITTED}"
        else:
            name = fmt
        layout = self._layouts[key] = Layout(
            log,
            renderer,
            store=self._layout_store,
            format_key=format_key,
            format_name=name,
            read_committed=read_committed,
        )
        sibling = self._layouts.get((key[0], key[1], "jsonl" if fmt == "text" else "text", read_committed))
        if sibling is not None:  # a first measure of either measures both (see fs.views)
            layout.sibling, sibling.sibling = sibling, layout
        if self._stopping.is_set():
            layout.stop.set()
        return layout

    def measure_in_background(self) -> None:
        """Measure the views (text, then JSON Lines, at the mount's isolation level) of every
        partition not measured yet, one
        partition at a time, in this thread at the lowest CPU priority; until done or
        `stop_measures`. A view asked for meanwhile is measured by its request (the two take
        turns on the layout's lock: nothing is measured twice)."""
        with contextlib.suppress(OSError):
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
        started, count = time.monotonic(), 0
        for topic, partitions in sorted(self.data_dir.topics().items()):
            for partition in partitions:
                for fmt in ("text", "jsonl"):
                    if self._stopping.is_set():
                        return
                    try:
                        log = self.data_dir.partition(topic, partition)
                        if log.offline_reason is not None:
                            continue
                        layout = self.layout(log, fmt, read_committed=self.options.read_committed)
                        if not layout.measured:
                            layout.snapshot()
                            count += 1
                    except MeasureStopped:
                        return
                    except (EngineError, OSError) as error:  # the partition's own requests will say so too
                        if partition not in self.data_dir.topics().get(topic, ()):
                            break  # (its topic was deleted meanwhile: nothing to say)
                        logger.warning("measuring %s-%d (%s) in the background: %s", topic, partition, fmt, error)
                    except Exception:  # a fault of ours: said whole; the other partitions are measured all the same
                        logger.exception("measuring %s-%d (%s) in the background", topic, partition, fmt)
        if count:
            logger.info("measured the views of every partition in %.1f s", time.monotonic() - started)

    def view_progress(self, log: PartitionLog) -> dict[str, dict[str, object]]:
        """How far the partition's views are measured, per format looked at (for `status`; at
        the mount's isolation level, that of the partition's own views)."""
        level = self.options.read_committed
        with self._layouts_lock:
            layouts = {fmt: self._layouts.get((log.topic, log.partition, fmt, level)) for fmt in ("text", "jsonl")}
        progress: dict[str, dict[str, object]] = {}
        for fmt, layout in layouts.items():
            if layout is not None:
                now = layout.progress()
                progress[fmt] = {
                    "measured": now.measured,
                    "measuredBytes": now.done_bytes,
                    "segmentBytes": now.total_bytes,
                }
                if now.error is not None:  # (what its reads fail with: EIO, named in the log too)
                    progress[fmt]["error"] = now.error
        return progress

    def read_committed_state(self, log: PartitionLog) -> dict[str, object] | None:
        """What the partition's read_committed views go by (for `status`), once one of them has
        looked: the last stable offset, the transactions still open (producer id, first offset)
        and how many were aborted. None when no read_committed view has been used."""
        with self._layouts_lock:
            layouts = [self._layouts.get((log.topic, log.partition, fmt, True)) for fmt in ("text", "jsonl")]
        for layout in layouts:
            if layout is None or layout.stable_offset is None or layout.transactions is None:
                continue
            transactions = layout.transactions
            return {
                "lastStableOffset": layout.stable_offset,
                "openTransactions": [
                    {"producerId": producer_id, "firstOffset": first_offset}
                    for producer_id, first_offset in sorted(transactions.open_transactions.items())
                ],
                "abortedTransactions": len(transactions.aborted),
            }
        return None

    def stop_measures(self) -> None:
        """Stop every measure under way and the background measuring (at unmount)."""
        self._stopping.set()
        with self._layouts_lock:
            layouts = list(self._layouts.values())
        for layout in layouts:
            layout.stop.set()

    def grown(self, logs: Iterable[PartitionLog]) -> Changes:
        """What changed after appends to `logs`: the sizes of their watched views the kernel
        knows (`records` files, and other views while open: see `view_opened`)."""
        changes = Changes()
        with self._lock:
            for log in logs:
                views = self._views_of.get((log.topic, log.partition), ())
                changes.inodes += [inode for inode in views if (node := self._nodes.get(inode)) and node.looked_up]
        return changes

    def after_background_work(self) -> Changes:
        """After retention or compaction: every view may have changed size, and `records` of a
        partition whose log start moved names a new file."""
        changes = Changes()
        layouts = self._layouts_by_partition()
        for log in list(self.data_dir.partitions()):  # (not by name: a topic may be deleted meanwhile)
            topic, partition = log.topic, log.partition
            changes += self.follow_held(log, layouts.get((topic, partition), []))
            changes += self.grown([log])
            directory = self.find(("partition", topic, partition))
            if isinstance(directory, PartitionDir):
                changes.entries += directory.superseded_records()
        return changes

    def follow(self) -> Changes:
        """A read-only mount beside another writer (a broker, `seglogfs produce`): take in what
        it did to every partition (`PartitionLog.refresh`: appends, rolls, retention,
        compaction) and return what the kernel must forget — the sizes of the views of the
        partitions that changed, and `records` files whose start retention removed."""
        changes = Changes()
        now = self.clock()
        before = self.data_dir.topics()
        try:
            refreshed = self.data_dir.refresh_partitions(now)
        except OSError as error:
            logger.debug("following the data dir's partitions: %s", error)
            refreshed = False
        if refreshed:  # the kernel forgets the names of what was deleted (listings are read afresh)
            after = self.data_dir.topics()
            for topic, partitions in before.items():
                if topic not in after:
                    changes.entries.append((ROOT_INODE, topic))
                    continue
                directory = self.find(("topic", topic))
                if directory is not None:
                    gone = set(partitions) - set(after[topic])
                    changes.entries += [(directory.inode, str(partition)) for partition in sorted(gone)]
        layouts = self._layouts_by_partition()
        for log in list(self.data_dir.partitions()):
            held = layouts.get((log.topic, log.partition), [])
            for _, layout in held:
                layout.keep_open()  # (before the look: a segment it finds gone is closed)
            try:
                changed = log.refresh(now)
            except OSError as error:  # the partition's dir is gone, or unreadable: next time again
                logger.debug("following %s-%d: %s", log.topic, log.partition, error)
                continue
            if changed:
                changes += self.follow_held(log, held)
                changes += self.grown([log])
                directory = self.find(("partition", log.topic, log.partition))
                if isinstance(directory, PartitionDir):
                    changes.entries += directory.superseded_records()
        return changes

    def _layouts_by_partition(self) -> dict[tuple[str, int], list[tuple[tuple[str, int, str, bool], Layout]]]:
        """The layouts readers hold (open views), or that are detached, by partition, with
        their keys (one look at the layouts for every partition)."""
        found: dict[tuple[str, int], list[tuple[tuple[str, int, str, bool], Layout]]] = {}
        with self._layouts_lock:
            for key, layout in self._layouts.items():
                if layout.held or layout.detached:
                    found.setdefault(key[:2], []).append((key, layout))
        return found

    def follow_held(self, log: PartitionLog, layouts: list[tuple[tuple[str, int, str, bool], Layout]]) -> Changes:
        """After the partition changed: bring the layouts its open views hold (`layouts`, from
        `_layouts_by_partition`) up to date now, while the segments they laid out are still
        kept open (a follower falls behind only what came and went between two looks). A layout
        the change detached (fs.views, "Readers holding a view") stays its readers'; the names
        of its views name new files, on the partition's current layout, at their next lookup
        (the kernel forgets them now), as a rotated log file's name does."""
        changes = Changes()
        detached = []
        for key, layout in layouts:
            if layout.held:
                try:
                    layout.snapshot()
                except MeasureStopped:
                    return changes
                except (EngineError, OSError) as error:  # (its readers' requests say so too)
                    logger.debug("following the views of %s-%d: %s", log.topic, log.partition, error)
            if layout.detached:
                detached.append(layout)
                with self._layouts_lock:
                    if self._layouts.get(key) is layout:
                        del self._layouts[key]
        if not detached:
            return changes
        with self._lock:
            for node in list(self._nodes.values()):
                if (
                    isinstance(node, ViewFile)
                    and node.view is not None
                    and any(node.view.layout is layout for layout in detached)
                    and self._by_key.get(node.key) == node.inode
                ):
                    del self._by_key[node.key]
                    changes.entries.append((node.parent_inode, node.path.rsplit("/", 1)[-1]))
        return changes

    def prune_view_cache(self) -> None:
        """At mount: remove stored layouts no mount has used for a while (LayoutStore.prune)."""
        if self._layout_store is not None:
            removed = self._layout_store.prune(self.clock() / 1000)
            if removed:
                logger.info(
                    "view cache %s: removed the layouts of %d partitions unused for %d days",
                    self._layout_store.root,
                    removed,
                    UNUSED_LAYOUT_DAYS,
                )

    def keep_layouts(self) -> None:
        """At unmount: store what is measured of every view layout (see fs.layout_store.LayoutStore)."""
        for layout in list(self._layouts.values()):
            layout.keep()

    def statfs(self) -> os.statvfs_result:
        return os.statvfs(self.data_dir.config.log_dirs[0])
