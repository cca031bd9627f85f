"""The directories of the tree: the root (topics and `.logdir`), a topic (its append and
config files, its partitions), a partition (its files), and a partition's `by-offset/` and
`by-time/`, whose entries are looked up by name."""

from __future__ import annotations

import errno
from typing import TYPE_CHECKING

from seglogfs.engine.errors import TimestampParseError
from seglogfs.engine.naming import validate_topic
from seglogfs.engine.timestamps import parse_timestamp
from seglogfs.fs.append_file import AppendFile, BatchesFile
from seglogfs.fs.config_file import ConfigFile
from seglogfs.fs.node import Attributes, Node, NoEntry, PartitionNode, Refused, join
from seglogfs.fs.status_file import StatusFile
from seglogfs.fs.view_file import ViewFile

if TYPE_CHECKING:
    from seglogfs.fs.tree import Tree

LOGDIR = ".logdir"
_JSONL = ".jsonl"


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

    def mkdir(self, name: str) -> Node:
        """A topic with `num.partitions` partitions (`mkdir` at the top)."""
        if self.tree.read_only:
            raise Refused(errno.EROFS, f"mkdir {name}")
        validate_topic(name)
        self.tree.create_topic(name)
        return self._topic(name)


class TopicDir(Directory):
    def __init__(self, tree: Tree, inode: int, key: tuple[object, ...], path: str, *, topic: str) -> None:
        super().__init__(tree, inode, key, path)
        self.topic = topic

    def children(self) -> list[tuple[str, Node]]:
        tree, topic = self.tree, self.topic
        partitions = tree.data_dir.topics().get(topic, [])
        entries: list[tuple[str, Node]] = [(name, self._file(name)) for name in ("append", "append.jsonl", "config")]
        return entries + [(str(p), self._partition(p)) for p in partitions]

    def child(self, name: str) -> Node:
        if name in ("append", "append.jsonl", "config"):
            return self._file(name)
        if name.isascii() and name.isdigit() and int(name) in self.tree.data_dir.topics().get(self.topic, []):
            return self._partition(int(name))
        raise NoEntry(f"lookup {join(self.path, name)}")

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


class PartitionDir(PartitionNode, Directory):
    ENTRIES = ("append", "append.jsonl", "append.batches", "records", "records.jsonl", "by-offset", "by-time", "status")

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
        if name in ("records", "records.jsonl"):
            return self._records(name)
        kinds: dict[str, type[PartitionNode]] = {"by-offset": ByOffsetDir, "by-time": ByTimeDir, "status": StatusFile}
        kind = kinds.get(name)
        if kind is None:
            raise NoEntry(f"lookup {path}")
        return tree.intern(
            (name, topic, partition), lambda inode, key: kind(tree, inode, key, path, topic=topic, partition=partition)
        )

    def _records(self, name: str) -> ViewFile:
        """`records` whose start was removed by retention is a new file (inode) from the new
        log start; the old one stays with whoever holds it, its bytes and size unchanged (a
        follower sees no truncation), and goes when the kernel forgets it."""
        tree, topic, partition = self.tree, self.topic, self.partition
        key = ("records", topic, partition, name.endswith(_JSONL))

        def make(inode: int, key: tuple[object, ...]) -> ViewFile:
            path = join(self.path, name)
            jsonl = name.endswith(_JSONL)
            return ViewFile(tree, inode, key, path, topic=topic, partition=partition, jsonl=jsonl, start_offset=None)

        node = tree.intern(key, make)
        if node.view is not None and node.view.start_offset < self.log.log_start_offset:
            tree.supersede(node)
            node = tree.intern(key, make)
        return node

    def superseded_records(self) -> list[str]:
        """The names of its `records` files that name another inode on the next lookup."""
        names = []
        for name in ("records", "records.jsonl"):
            node = self.tree.find(("records", self.topic, self.partition, name.endswith(_JSONL)))
            view = node.view if isinstance(node, ViewFile) and node.looked_up else None
            if view is not None and view.start_offset < self.log.log_start_offset:
                names.append(name)
        return names


class ByOffsetDir(PartitionNode, Directory):
    """`by-offset/`: lists the segments' base offsets (from the log start); any offset from the
    log start to the log end can be looked up (`N` or `N.jsonl`)."""

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


class ByTimeDir(PartitionNode, Directory):
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
