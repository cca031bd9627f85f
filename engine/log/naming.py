"""File and directory names of a Kafka log dir.

    <log.dir>/<topic>-<partition>/<base offset, 20 digits>.log|.index|.timeindex|.txnindex|.snapshot

Files being replaced carry one more suffix: `.cleaned` (the cleaner's output, not yet trusted),
`.swap` (output ready to replace the originals), `.deleted` (waiting for
`file.delete.delay.ms`). A partition dir being deleted is `<topic>-<partition>.<uuid>-delete`.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from pathlib import Path

from seglogfs.engine.errors import InvalidTopicError

LOG_SUFFIX = ".log"
INDEX_SUFFIX = ".index"
TIME_INDEX_SUFFIX = ".timeindex"
TXN_INDEX_SUFFIX = ".txnindex"
SNAPSHOT_SUFFIX = ".snapshot"
DELETED_SUFFIX = ".deleted"
CLEANED_SUFFIX = ".cleaned"
SWAP_SUFFIX = ".swap"
INDEX_SUFFIXES = (INDEX_SUFFIX, TIME_INDEX_SUFFIX, TXN_INDEX_SUFFIX)

MAX_TOPIC_NAME_LENGTH = 249
_LEGAL_TOPIC = re.compile(r"[a-zA-Z0-9._-]+")
_SEGMENT_NAME = re.compile(r"(\d{20})(\.[a-z]+)((?:\.[a-z]+)?)")
_DELETED_PARTITION_DIR = re.compile(r".*\.[0-9a-f]{32}-(delete|future|stray)$")
# Kafka's Topic.isInternal: the group coordinator's and the transaction coordinator's topics, and
# a KRaft cluster's metadata log. Kafka makes them itself, with configs of its own, when it needs
# them; no one creates them as a topic (`mkdir` and `topics create` refuse them).
INTERNAL_TOPICS = frozenset({"__consumer_offsets", "__transaction_state", "__cluster_metadata"})


def filename_prefix_from_offset(offset: int) -> str:
    """Kafka's segment file stem: the base offset zero-padded to 20 digits."""
    return f"{offset:020d}"


def log_file(directory: Path, base_offset: int, suffix: str = "") -> Path:
    return directory / f"{filename_prefix_from_offset(base_offset)}{LOG_SUFFIX}{suffix}"


def offset_index_file(directory: Path, base_offset: int, suffix: str = "") -> Path:
    return directory / f"{filename_prefix_from_offset(base_offset)}{INDEX_SUFFIX}{suffix}"


def time_index_file(directory: Path, base_offset: int, suffix: str = "") -> Path:
    return directory / f"{filename_prefix_from_offset(base_offset)}{TIME_INDEX_SUFFIX}{suffix}"


def parse_segment_file_name(name: str) -> tuple[int, str, str] | None:
    """`00000000000000000042.log.swap` → (42, ".log", ".swap"); None for anything else."""
    match = _SEGMENT_NAME.fullmatch(name)
    if match is None:
        return None
    return int(match.group(1)), match.group(2), match.group(3)


def segment_log_files(partition_dir: Path) -> list[tuple[int, Path]]:
    """A partition directory's `.log` files, (base offset, path) by base offset; not the
    `.cleaned`, `.swap` or `.deleted` ones. For readers of a directory without a log open."""
    found = []
    with os.scandir(partition_dir) as entries:
        for entry in entries:
            parsed = parse_segment_file_name(entry.name)
            if parsed is not None and parsed[1] == LOG_SUFFIX and not parsed[2]:
                found.append((parsed[0], Path(entry.path)))
    return sorted(found)


def validate_topic(topic: str) -> None:
    """Raise InvalidTopicError for a name Kafka refuses."""
    if not topic:
        raise InvalidTopicError("topic name is empty")
    if topic in (".", ".."):
        raise InvalidTopicError(f"topic name {topic!r} is not allowed")
    if len(topic) > MAX_TOPIC_NAME_LENGTH:
        raise InvalidTopicError(f"topic name is {len(topic)} characters long (at most {MAX_TOPIC_NAME_LENGTH})")
    if not _LEGAL_TOPIC.fullmatch(topic):
        raise InvalidTopicError(
            f"topic name {topic!r} has characters other than ASCII letters, digits, '.', '_' and '-'"
        )


def refuse_internal_topic(topic: str) -> None:
    """Raise InvalidTopicError for one of Kafka's internal topics, which only Kafka creates."""
    if topic in INTERNAL_TOPICS:
        raise InvalidTopicError(
            f"topic {topic!r} is internal to Kafka: its brokers create it when they need it, "
            "with configs of their own, so it is not created as a topic"
        )


def colliding_topic(topic: str, existing: Iterable[str]) -> str | None:
    """The first existing topic (by name) whose name differs from `topic` only by '.' against
    '_' at the same places (Kafka's Topic.hasCollision: both become the same metric name);
    None when there is none."""
    unified = topic.replace(".", "_")
    return min((other for other in existing if other != topic and other.replace(".", "_") == unified), default=None)


def refuse_colliding_topic(topic: str, existing: Iterable[str]) -> None:
    """Raise InvalidTopicError, with the message Kafka's controller gives, when a new `topic`
    collides with an existing one."""
    other = colliding_topic(topic, existing)
    if other is not None:
        raise InvalidTopicError(f"Topic '{topic}' collides with existing topic: {other}")


def partition_dir_name(topic: str, partition: int) -> str:
    return f"{topic}-{partition}"


def parse_partition_dir(name: str) -> tuple[str, int] | None:
    """`orders-3` → ("orders", 3); None for dirs that are not live partitions (deleted, future,
    stray, or not of the topic-partition form)."""
    if _DELETED_PARTITION_DIR.match(name):
        return None
    topic, dash, partition = name.rpartition("-")
    if not dash or not topic or not (partition.isascii() and partition.isdigit()):  # "²" is a digit to isdigit
        return None
    if not _LEGAL_TOPIC.fullmatch(topic):
        return None
    return topic, int(partition)


def partition_dirs(log_dir: Path) -> list[tuple[str, str, int]]:
    """The live partition dirs of a log dir, sorted: (dir name, topic, partition). Directories
    only, not links to one: a link named like a partition is never followed (it could lead
    anywhere the data dir's writers chose); `linked_partition_dirs` lists those."""
    with os.scandir(log_dir) as entries:
        names = sorted(entry.name for entry in entries if entry.is_dir(follow_symlinks=False))
    return [(name, *parsed) for name in names if (parsed := parse_partition_dir(name)) is not None]


def linked_partition_dirs(log_dir: Path) -> list[tuple[str, str, int]]:
    """The symbolic links of a log dir named like a partition dir (`orders-3 -> /elsewhere`),
    as `partition_dirs` lists dirs: refused as partitions, reported by name."""
    with os.scandir(log_dir) as entries:
        names = sorted(entry.name for entry in entries if entry.is_symlink())
    return [(name, *parsed) for name in names if (parsed := parse_partition_dir(name)) is not None]
