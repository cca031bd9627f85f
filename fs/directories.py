"""The directories of the tree: the root (topics and `.logdir`), a topic (its append and
config files, its partitions), a partition (its files), a partition's `read_committed/` and
`read_uncommitted/` (its views at that isolation level), and the `by-offset/` and `by-time/` of
either, whose entries are looked up by name.

A partition's own views are at the mount's isolation level (`-o isolation.level`, Kafka's
consumer setting; read_uncommitted by default); `read_committed/` and `read_uncommitted/` hold
the same view names at that level, whatever the mount's: `t/0/read_committed/records`,
`t/0/read_committed/by-offset/42.jsonl`. Both name Kafka's `isolation.level` values, as
`consume --isolation-level` does."""

from __future__ import annotations

import errno
import itertools
import stat
import threading
import time
from typing import TYPE_CHECKING

from seglogfs.engine.errors import TimestampParseError
from seglogfs.engine.log.naming import refuse_internal_topic, validate_topic
from seglogfs.engine.log.transactions import READ_COMMITTED, READ_UNCOMMITTED
from seglogfs.engine.text.timestamps import parse_timestamp
from seglogfs.fs.append_file import AppendFile, BatchesFile
from seglogfs.fs.config_file import ConfigFile, TemporaryFile
from seglogfs.fs.node import Attributes, Changes, Node, NoEntry, PartitionNode, Refused, join
from seglogfs.fs.permissions import DIRECTORY_VALID_S, Caller
from seglogfs.fs.status_file import StatusFile
from seglogfs.fs.view_file import ViewFile

if TYPE_CHECKING:
    from seglogfs.fs.tree import Tree

LOGDIR = ".logdir"
_JSONL = ".jsonl"
_TOPIC_FILES = ("append", "append.jsonl", "config")
_WHAT_A_TOPIC_DIR_TAKES = (
    "a topic dir holds append, append.jsonl, config and the partitions; config is written in place, "
    "or as editors save it: a file made beside it and renamed onto it"
)
_PARTITIONS_STAY = (
    "Kafka numbers a topic's partitions from 0 and cannot take one away (rmdir the topic to delete it whole)"
)
_TEMPORARY_SERIALS = itertools.count()


class Directory(Node):
    is_dir = True

    def attributes(self) -> Attributes:
        return self.directory_attributes()


class RootDir(Directory):
    def children(self) -> list[tuple[str, Node]]:
        tree = self.tree
        topics = sorted(tree.data_dir.topics())
        return [(LOGDIR, tree.mirror_node(())), *((topic, self._topic(topic)) for topic in topics)]

    def child(self, name: str) -> Node:
        if name == LOGDIR:
            return self.tree.mirror_node(())
        if name not in self.tree.data_dir.topics():
            raise NoEntry(f"lookup {name}")
        return self._topic(name)

    def _topic(self, topic: str) -> TopicDir:
        return self.tree.intern(
            ("topic", topic), lambda inode, key: TopicDir(self.tree, inode, key, topic, topic=topic)
        )

    def mkdir(self, name: str, owner: tuple[int, int] | None = None) -> Node:
        """A topic with `num.partitions` partitions (`mkdir` at the top), its files the
        caller's (`owner`), as what a user makes in a directory on disk is that user's. Kafka's
        internal topics are not made here, and a name colliding with a topic's is refused."""
        if self.tree.read_only:
            raise Refused(errno.EROFS, f"mkdir {name}")
        validate_topic(name)
        refuse_internal_topic(name)
        self.tree.create_topic(name, owner)
        return self._topic(name)

    def rmdir(self, name: str, caller: Caller) -> None:
        """Delete topic `name` and its data as `topics delete` does (Tree.delete_topic)."""
        if name == LOGDIR:
            raise Refused(errno.EPERM, f"rmdir {name}: the data dir's mirror, for backups")
        self.tree.delete_topic(name, caller)

    def rename(self, name: str, new_parent: Node, new_name: str) -> Changes:
        what = f"rename {name} to {join(new_parent.path, new_name)}"
        if name == LOGDIR:
            raise Refused(errno.EPERM, f"{what}: the data dir's mirror, for backups")
        self.child(name)  # (ENOENT for a name that is not there)
        raise Refused(errno.EPERM, f"{what}: Kafka cannot rename a topic (make a new one and copy the records)")


class TopicDir(Directory):
    """A topic: its `append`, `append.jsonl` and `config`, its partitions, and the files made
    beside `config` to save it (`TemporaryFile`: in memory, each until renamed onto `config` or
    unlinked). The temporary files change under `_lock`."""

    def __init__(self, tree: Tree, inode: int, key: tuple[object, ...], path: str, *, topic: str) -> None:
        super().__init__(tree, inode, key, path)
        self.topic = topic
        self.temporaries: dict[str, TemporaryFile] = {}
        self._lock = threading.Lock()

    def children(self) -> list[tuple[str, Node]]:
        tree, topic = self.tree, self.topic
        partitions = tree.data_dir.topics().get(topic, [])
        entries: list[tuple[str, Node]] = [(name, self._file(name)) for name in _TOPIC_FILES]
        with self._lock:
            temporaries = sorted(self.temporaries.items())
        return entries + [(str(p), self._partition(p)) for p in partitions] + list(temporaries)

    def child(self, name: str) -> Node:
        if name in _TOPIC_FILES:
            return self._file(name)
        if self._is_partition(name):
            return self._partition(int(name))
        with self._lock:
            temporary = self.temporaries.get(name)
        if temporary is not None:
            return temporary
        raise NoEntry(f"lookup {join(self.path, name)}")

    def _is_partition(self, name: str) -> bool:
        return name.isascii() and name.isdigit() and int(name) in self.tree.data_dir.topics().get(self.topic, [])

    def create(self, name: str, mode: int, owner: tuple[int, int]) -> Node:
        """A file beside `config` to save it by a rename onto it (see TemporaryFile)."""
        what = f"create {join(self.path, name)}"
        if self.tree.read_only:
            raise Refused(errno.EROFS, what)
        if name in _TOPIC_FILES or self._is_partition(name):
            raise Refused(errno.EEXIST, what)
        config = self._file("config")
        assert isinstance(config, ConfigFile)
        with self._lock:
            if name in self.temporaries:
                raise Refused(errno.EEXIST, what)
            path, now_ns = join(self.path, name), time.time_ns()
            temporary = self.tree.intern(
                ("temporary", self.topic, name, next(_TEMPORARY_SERIALS)),
                lambda inode, key: TemporaryFile(
                    self.tree, inode, key, path, config=config, mode=mode, owner=owner, now_ns=now_ns
                ),
            )
            self.temporaries[name] = temporary
        return temporary

    def unlink(self, name: str) -> None:
        """Only a file made beside `config` can be removed (it was in memory only)."""
        with self._lock:
            temporary = self.temporaries.pop(name, None)
        if temporary is not None:
            self._drop(temporary)
        elif name in _TOPIC_FILES or self._is_partition(name):
            raise Refused(errno.EPERM, f"unlink {join(self.path, name)}: {_WHAT_A_TOPIC_DIR_TAKES}")
        else:  # (one gone with its rename, which the kernel had not forgotten yet: sed removes it then)
            raise NoEntry(f"unlink {join(self.path, name)}")

    def rmdir(self, name: str, caller: Caller) -> None:
        if self._is_partition(name):
            raise Refused(errno.EPERM, f"rmdir {join(self.path, name)}: {_PARTITIONS_STAY}")
        super().rmdir(name, caller)

    def remove_below(self, name: str) -> None:
        with self._lock:
            temporary = self.temporaries.pop(name, None)
        if temporary is not None:  # (in memory only: it goes, as an unlink of it does)
            self._drop(temporary)
        else:
            super().remove_below(name)

    def rename(self, name: str, new_parent: Node, new_name: str) -> Changes:
        """A file made beside `config` renamed onto it replaces the overrides with its text,
        checked line by line: a bad line is EINVAL and changes nothing. Either way the file is
        gone. Nothing else is renamed in a topic dir."""
        what = f"rename {join(self.path, name)} to {join(new_parent.path, new_name)}"
        if self._is_partition(name):
            raise Refused(errno.EPERM, f"{what}: Kafka cannot rename a partition: {_PARTITIONS_STAY}")
        with self._lock:
            temporary = self.temporaries.pop(name, None)
        if temporary is None or new_parent is not self or new_name != "config":
            if temporary is not None:
                self._drop(temporary)
            raise Refused(errno.EPERM, f"{what}: {_WHAT_A_TOPIC_DIR_TAKES}")
        try:
            changes = temporary.config.apply(temporary.content(), temporary.path)
        except BaseException:
            self._drop(temporary)
            raise
        temporary.renamed = True
        self._drop(temporary)
        return changes

    def _drop(self, temporary: TemporaryFile) -> None:
        temporary.gone = True
        self.tree.supersede(temporary)

    def _file(self, name: str) -> Node:
        tree, topic = self.tree, self.topic
        path = join(self.path, name)
        if name == "config":
            return tree.intern(("config", topic), lambda inode, key: ConfigFile(tree, inode, key, path, topic=topic))
        jsonl = name.endswith(_JSONL)
        return tree.intern(
            ("append", topic, None, jsonl),
            lambda inode, key: AppendFile(tree, inode, key, path, topic=topic, partition=None, jsonl=jsonl),
        )

    def _partition(self, partition: int) -> PartitionDir:
        tree, topic = self.tree, self.topic
        path = join(self.path, str(partition))
        return tree.intern(
            ("partition", topic, partition),
            lambda inode, key: PartitionDir(tree, inode, key, path, topic=topic, partition=partition),
        )


class _AtLevel(PartitionNode, Directory):
    """A directory of a partition's views at one isolation level (`read_committed` or not).
    `level` names the directory of that level inside the partition's ("" for the partition's
    own views, at the mount's level)."""

    def __init__(
        self,
        tree: Tree,
        inode: int,
        key: tuple[object, ...],
        path: str,
        *,
        topic: str,
        partition: int,
        read_committed: bool,
        level: str = "",
    ) -> None:
        super().__init__(tree, inode, key, path, topic=topic, partition=partition)
        self.read_committed = read_committed
        self.level = level

    def attributes(self) -> Attributes:
        """Traversable by whoever may read or write the partition's files, and writable by
        whoever may write them: it holds only views, but `rm -r` of the topic unlinks them
        (fs.operations, "Removing"), and the kernel lets only who may write a directory do that."""
        access = self.partition_access().directory()
        return self.shown(stat.S_IFDIR, access, mtime_ns=self.tree.mounted_ns, valid_s=DIRECTORY_VALID_S)

    def view_file(self, inode: int, key: tuple[object, ...], name: str, start_offset: int | None) -> ViewFile:
        """The view `name` in this directory (`.jsonl`: JSON Lines) of its partition at its
        level, from `start_offset` (None: the log start offset when first used); for
        `Tree.intern`."""
        return ViewFile(
            self.tree,
            inode,
            key,
            join(self.path, name),
            topic=self.topic,
            partition=self.partition,
            jsonl=name.endswith(_JSONL),
            start_offset=start_offset,
            read_committed=self.read_committed,
            parent_inode=self.inode,
        )


class ViewsDir(_AtLevel):
    """`records`, `records.jsonl`, `by-offset/`, `by-time/`: a partition's views at one level."""

    VIEWS = ("records", "records.jsonl", "by-offset", "by-time")

    def children(self) -> list[tuple[str, Node]]:
        return [(name, self.child(name)) for name in self.VIEWS]

    def child(self, name: str) -> Node:
        return self._view(name)

    def _view(self, name: str) -> Node:
        tree, topic, partition = self.tree, self.topic, self.partition
        path = join(self.path, name)
        if name in ("records", "records.jsonl"):
            return self._records(name)
        kinds: dict[str, type[_LookupDir]] = {"by-offset": ByOffsetDir, "by-time": ByTimeDir}
        kind = kinds.get(name)
        if kind is None:
            raise NoEntry(f"lookup {path}")
        read_committed, level = self.read_committed, self.level
        return tree.intern(
            (name, topic, partition, level),
            lambda inode, key: kind(
                tree, inode, key, path, topic=topic, partition=partition, read_committed=read_committed, level=level
            ),
        )

    def _records(self, name: str) -> ViewFile:
        """`records` whose start was removed by retention is a new file (inode) from the new
        log start; the old one stays with whoever holds it, its bytes and size unchanged (a
        follower sees no truncation), and goes when the kernel forgets it."""
        tree = self.tree
        key = ("records", self.topic, self.partition, name.endswith(_JSONL), self.level)

        def make(inode: int, key: tuple[object, ...]) -> ViewFile:
            return self.view_file(inode, key, name, None)

        node = tree.intern(key, make)
        if node.view is not None and node.view.start_offset < self.log.log_start_offset:
            tree.supersede(node)
            node = tree.intern(key, make)
        return node

    def superseded_records(self) -> list[tuple[int, str]]:
        """(this directory's inode, name) of its `records` files that name another inode on
        the next lookup."""
        entries = []
        for name in ("records", "records.jsonl"):
            node = self.tree.find(("records", self.topic, self.partition, name.endswith(_JSONL), self.level))
            view = node.view if isinstance(node, ViewFile) and node.looked_up else None
            if view is not None and view.start_offset < self.log.log_start_offset:
                entries.append((self.inode, name))
        return entries


class PartitionDir(ViewsDir):
    """A partition: its append files, its views at the mount's isolation level, the same views
    at each level (`read_committed/`, `read_uncommitted/`), its status."""

    ENTRIES = (
        "append",
        "append.jsonl",
        "append.batches",
        "records",
        "records.jsonl",
        "by-offset",
        "by-time",
        READ_COMMITTED,
        READ_UNCOMMITTED,
        "status",
    )

    def __init__(
        self, tree: Tree, inode: int, key: tuple[object, ...], path: str, *, topic: str, partition: int
    ) -> None:
        read_committed = tree.options.read_committed
        super().__init__(tree, inode, key, path, topic=topic, partition=partition, read_committed=read_committed)

    def children(self) -> list[tuple[str, Node]]:
        return [(name, self.child(name)) for name in self.ENTRIES]

    def child(self, name: str) -> Node:
        tree, topic, partition = self.tree, self.topic, self.partition
        path = join(self.path, name)
        if name in ("append", "append.jsonl"):
            jsonl = name.endswith(_JSONL)
            return tree.intern(
                ("append", topic, partition, jsonl),
                lambda inode, key: AppendFile(tree, inode, key, path, topic=topic, partition=partition, jsonl=jsonl),
            )
        if name == "append.batches":
            return tree.intern(
                ("append.batches", topic, partition),
                lambda inode, key: BatchesFile(tree, inode, key, path, topic=topic, partition=partition),
            )
        if name == "status":
            return tree.intern(
                ("status", topic, partition),
                lambda inode, key: StatusFile(tree, inode, key, path, topic=topic, partition=partition),
            )
        if name in (READ_COMMITTED, READ_UNCOMMITTED):
            return self._isolation(name)
        return self._view(name)

    def _isolation(self, level: str) -> ViewsDir:
        tree, topic, partition = self.tree, self.topic, self.partition
        path = join(self.path, level)
        return tree.intern(
            ("isolation", topic, partition, level),
            lambda inode, key: ViewsDir(
                tree,
                inode,
                key,
                path,
                topic=topic,
                partition=partition,
                read_committed=level == READ_COMMITTED,
                level=level,
            ),
        )

    def superseded_records(self) -> list[tuple[int, str]]:
        """Its `records` files, and those of its `read_committed/` and `read_uncommitted/`, that
        name another inode on the next lookup (as (directory inode, name))."""
        entries = super().superseded_records()
        for level in (READ_COMMITTED, READ_UNCOMMITTED):
            directory = self.tree.find(("isolation", self.topic, self.partition, level))
            if isinstance(directory, ViewsDir):
                entries += directory.superseded_records()
        return entries


class _LookupDir(_AtLevel):
    """`by-offset/` or `by-time/`, of a partition's views at one isolation level."""


class ByOffsetDir(_LookupDir):
    """`by-offset/`: lists the segments' base offsets (from the log start); any offset from the
    log start to the log end can be looked up (`N` or `N.jsonl`). read_committed: the view from
    N holds nothing at or past the last stable offset until the transactions there end."""

    def children(self) -> list[tuple[str, Node]]:
        log = self.log
        bases = [max(segment.base_offset, log.log_start_offset) for segment in log.segments]
        return [(f"{base}{suffix}", self.child(f"{base}{suffix}")) for base in bases for suffix in ("", _JSONL)]

    def child(self, name: str) -> Node:
        stem = name.removesuffix(_JSONL)
        log = self.log
        where = join(self.path, name)
        if not (stem.isascii() and stem.isdigit()):
            raise Refused(errno.ENOENT, f"{where}: not an offset")
        offset = int(stem)
        if not log.log_start_offset <= offset <= log.log_end_offset:
            raise Refused(errno.ENOENT, f"{where}: outside the log ({log.log_start_offset}..{log.log_end_offset})")
        return self.tree.offset_view(self, name, offset)


class ByTimeDir(_LookupDir):
    """`by-time/`: `T` or `T.jsonl`, T in epoch milliseconds or ISO-8601, is the view from the
    first record whose timestamp is ≥ T (the log end when there is none). Lists nothing."""

    def children(self) -> list[tuple[str, Node]]:
        return []

    def child(self, name: str) -> Node:
        log = self.log
        try:
            found = log.offset_for_timestamp(parse_timestamp(name.removesuffix(_JSONL)))
        except TimestampParseError as error:
            raise Refused(errno.ENOENT, f"{join(self.path, name)}: {error}") from None
        offset = log.log_end_offset if found is None else max(found.offset, log.log_start_offset)
        return self.tree.offset_view(self, name, offset)
