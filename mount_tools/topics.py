"""`seglogfs topics`: kafka-topics.sh for a data dir.

    seglogfs topics DATADIR create --topic T [--partitions N] [--replication-factor 1]
                                   [--config k=v ...] [--if-not-exists]
    seglogfs topics DATADIR list [--topic REGEX] [--exclude-internal]
    seglogfs topics DATADIR describe [--topic REGEX] [--exclude-internal] [--if-exists] [--json]
    seglogfs topics DATADIR alter --topic REGEX [--partitions N] [--config k=v ...]
                                  [--delete-config k ...] [--if-exists]
    seglogfs topics DATADIR delete --topic REGEX [--if-exists]

(`seglogfs topics ACTION DATADIR …` works too.) As in kafka-topics, `--topic` is a regular
expression, matched against whole names, for every action but `create`; a name is one too.
`__cluster_metadata` (a KRaft broker's metadata log) is not a topic here either. The properties
file is `-c` only: `--config` is a topic config, as in kafka-topics.

`list` and `describe` open the data dir read-only (beside a mount or a broker, like `consume`);
`create`, `alter` and `delete` take its lock, and a data dir another process holds is refused
(exit 3). `describe` prints kafka-topics' lines,

    Topic: T  TopicId: ID  PartitionCount: N  ReplicationFactor: 1  Configs: k=v,...
        Topic: T  Partition: P  Leader: B  Replicas: B  Isr: B  LogStartOffset: S  LogEndOffset: E  Size: BYTES

(fields separated by tabs, partition lines starting with one). `Configs` are the topic's own
settings (its seglogfs overrides, its configs in a broker's metadata log, those Kafka gives its
internal topics); B is the broker's node id from a broker's `meta.properties`, else 0; the last
three columns are seglogfs's, after Kafka's. `--json` prints the same as one document (keys in
`describe_document`).
"""

from __future__ import annotations

import argparse
import re
import sys
from typing import Any

from seglogfs.engine import DataDir, PartitionLog, UnknownTopicOrPartitionError
from seglogfs.engine.config import (
    CONSUMER_OFFSETS_TOPIC,
    METADATA_TOPIC,
    TRANSACTION_STATE_TOPIC,
    validate_topic_overrides,
)
from seglogfs.engine.errors import ConfigError, InvalidTopicError, TopicExistsError
from seglogfs.engine.log.naming import refuse_internal_topic, validate_topic
from seglogfs.engine.stored.local_copy import EVERY_PARTITION, Partitions
from seglogfs.engine.topic_configs import TOPIC_LEVEL_SOURCES
from seglogfs.mount_tools.common import (
    EPILOG,
    EXIT_OK,
    UsageError,
    add_common,
    broker_config,
    key_values,
    now_ms,
    print_json,
    require_data_dirs,
)

ACTIONS = ("create", "list", "describe", "alter", "delete")
INTERNAL_TOPICS = frozenset({CONSUMER_OFFSETS_TOPIC, TRANSACTION_STATE_TOPIC})  # Kafka's Topic.isInternal
ZERO_TOPIC_ID = "AAAAAAAAAAAAAAAAAAAAAA"  # Kafka's Uuid.ZERO_UUID as it prints: data older than topic ids


def add_parser(commands: Any) -> None:
    """`topics` and its actions, on the CLI's subcommands."""
    topics = commands.add_parser(
        "topics", help="create, list, describe, alter and delete topics (kafka-topics)", epilog=EPILOG
    )
    actions = topics.add_subparsers(dest="action", required=True, metavar="ACTION")

    create = actions.add_parser("create", help="create a topic", epilog=EPILOG)
    add_common(create, long_config=False)
    create.add_argument("--topic", required=True, help="the topic's name")
    create.add_argument("--partitions", type=int, metavar="N", help="partition count (default: num.partitions)")
    create.add_argument("--replication-factor", type=int, metavar="1", help="1: a data dir is one broker")
    create.add_argument(
        "--config", dest="topic_config", action="append", metavar="KEY=VALUE", help="a topic config (repeatable)"
    )
    create.add_argument("--if-not-exists", action="store_true", help="do nothing if the topic exists")
    create.set_defaults(handler=cmd_create)

    listing = actions.add_parser("list", help="print topic names, one a line", epilog=EPILOG)
    add_common(listing, long_config=False)
    listing.add_argument("--topic", metavar="REGEX", help="only the topics this matches")
    listing.add_argument("--exclude-internal", action="store_true", help="leave out Kafka's internal topics")
    listing.set_defaults(handler=cmd_list)

    describe = actions.add_parser(
        "describe", help="print topics and their partitions (kafka-topics --describe)", epilog=EPILOG
    )
    add_common(describe, long_config=False)
    describe.add_argument("--topic", metavar="REGEX", help="only the topics this matches (default: all)")
    describe.add_argument("--exclude-internal", action="store_true", help="leave out Kafka's internal topics")
    describe.add_argument("--if-exists", action="store_true", help="no error when no topic matches")
    describe.add_argument("--json", action="store_true", help="one JSON document")
    describe.set_defaults(handler=cmd_describe)

    alter = actions.add_parser("alter", help="add partitions, set or delete topic configs", epilog=EPILOG)
    add_common(alter, long_config=False)
    alter.add_argument("--topic", required=True, metavar="REGEX", help="the topics to alter")
    alter.add_argument("--partitions", type=int, metavar="N", help="the new partition count (only up)")
    alter.add_argument(
        "--config", dest="topic_config", action="append", metavar="KEY=VALUE", help="set a topic config (repeatable)"
    )
    alter.add_argument(
        "--delete-config", action="append", metavar="KEY", help="remove a topic config override (repeatable)"
    )
    alter.add_argument("--if-exists", action="store_true", help="no error when no topic matches")
    alter.set_defaults(handler=cmd_alter)

    delete = actions.add_parser("delete", help="delete topics and their data", epilog=EPILOG)
    add_common(delete, long_config=False)
    delete.add_argument("--topic", required=True, metavar="REGEX", help="the topics to delete")
    delete.add_argument("--if-exists", action="store_true", help="no error when no topic matches")
    delete.set_defaults(handler=cmd_delete)


def _matching(data_dir: DataDir, pattern: str | None, exclude_internal: bool = False) -> list[str]:
    """The topics whose whole name `pattern` matches (all without one), sorted."""
    names = [
        topic
        for topic in data_dir.topics()
        if topic != METADATA_TOPIC and not (exclude_internal and topic in INTERNAL_TOPICS)
    ]
    if pattern is None:
        return names
    try:
        regex = re.compile(pattern)
    except re.error as error:
        raise UsageError(f"--topic {pattern!r} is not a regular expression: {error}") from None
    return [topic for topic in names if regex.fullmatch(topic)]


def _read_partitions(pattern: str | None) -> Partitions:
    """What a reader of a backup in object storage lays out of it for `--topic`: the partitions
    of the topics it may match (every one without it)."""
    if pattern is None:
        return EVERY_PARTITION
    try:
        re.compile(pattern)
    except re.error as error:
        raise UsageError(f"--topic {pattern!r} is not a regular expression: {error}") from None
    return Partitions(patterns=frozenset([f"^(?:{pattern})$"]))


def _existing(data_dir: DataDir, args: argparse.Namespace) -> list[str]:
    """The topics `--topic` names; an error when there are none, unless `--if-exists`."""
    topics = _matching(data_dir, args.topic, getattr(args, "exclude_internal", False))
    if not topics and args.topic is not None and not args.if_exists:
        try:
            validate_topic(args.topic)
        except InvalidTopicError:
            raise UnknownTopicOrPartitionError(f"no topic matches {args.topic!r}") from None
        raise UnknownTopicOrPartitionError(f"unknown topic {args.topic!r}")
    return topics


def _note_broker_keeps(data_dir: DataDir, topic: str, what: str) -> None:
    if data_dir.metadata_log_has_topic(topic):
        print(
            f"seglogfs: note: the broker's metadata log still lists topic {topic}: a broker started on this "
            f"data dir {what}",
            file=sys.stderr,
        )


# -- create, alter, delete (writers: they take the data dir's lock) ----------------------------------
def cmd_create(args: argparse.Namespace) -> int:
    config = broker_config(args)
    validate_topic(args.topic)  # before anything is opened or made
    refuse_internal_topic(args.topic)
    if args.replication_factor not in (None, 1, -1):
        raise ConfigError(
            f"replication factor {args.replication_factor}: a data dir is one broker, so it can only be 1"
        )
    overrides = validate_topic_overrides(key_values(args.topic_config, "--config"), "--config")
    with DataDir.open(config, now_ms=now_ms()) as data_dir:
        try:
            data_dir.create_topic(args.topic, args.partitions, overrides, now_ms=now_ms())
        except TopicExistsError:
            if args.if_not_exists:
                return EXIT_OK
            raise
    print(f"Created topic {args.topic}.")
    return EXIT_OK


def cmd_alter(args: argparse.Namespace) -> int:
    config = broker_config(args)
    require_data_dirs(config)
    settings = key_values(args.topic_config, "--config")
    removals = list(args.delete_config or ())
    if args.partitions is None and not settings and not removals:
        raise UsageError("alter needs --partitions, --config or --delete-config")
    with DataDir.open(config, now_ms=now_ms()) as data_dir:
        topics = _existing(data_dir, args)
        # Everything is checked before anything changes: a refused alter changes nothing.
        new_overrides = {topic: _altered_overrides(data_dir, topic, settings, removals) for topic in topics}
        if args.partitions is not None:
            for topic in topics:
                current = data_dir.topics()[topic][-1] + 1
                if args.partitions <= current:
                    raise ConfigError(
                        f"topic {topic!r} has {current} partitions: the count can only be increased, "
                        f"not set to {args.partitions} (Kafka cannot take partitions away)"
                    )
            for topic in topics:
                data_dir.add_partitions(topic, args.partitions, now_ms=now_ms())
                _note_broker_keeps(data_dir, topic, "sets aside as stray the partitions added here")
        for topic, overrides in new_overrides.items():
            if overrides is not None:
                data_dir.set_topic_overrides(topic, overrides)
                print(f"Completed updating config for topic {topic}.")
    return EXIT_OK


def _altered_overrides(
    data_dir: DataDir, topic: str, settings: dict[str, str], removals: list[str]
) -> dict[str, str] | None:
    """The topic's seglogfs overrides with `settings` set and `removals` removed, checked; None
    when neither is asked for. A removal must name an override the topic has (kafka-configs
    refuses others too); a value from elsewhere (the broker) is overridden with `--config`."""
    if not settings and not removals:
        return None
    current = data_dir.topic_overrides(topic)
    for name in removals:
        if name not in current:
            entry = next((e for e in data_dir.config_entries(topic) if e.name == name), None)
            if entry is None:
                raise ConfigError(f"--delete-config: unknown topic config {name!r}")
            where = f"{entry.source}: {entry.detail}" if entry.detail else entry.source
            raise ConfigError(
                f"--delete-config {name}: topic {topic!r} has no override of it to delete (its value, "
                f"{entry.value}, comes from {where}); set it with --config instead"
            )
    altered = {key: value for key, value in current.items() if key not in removals}
    altered.update(settings)
    return validate_topic_overrides(altered, f"config of topic {topic}")


def cmd_delete(args: argparse.Namespace) -> int:
    config = broker_config(args)
    require_data_dirs(config)
    with DataDir.open(config, now_ms=now_ms()) as data_dir:
        for topic in _existing(data_dir, args):
            data_dir.delete_topic(topic)
            _note_broker_keeps(data_dir, topic, "recreates its partitions, empty")
    return EXIT_OK


# -- list, describe (readers: no lock) ---------------------------------------------------------------
def cmd_list(args: argparse.Namespace) -> int:
    config = broker_config(args, stored=True, partitions=_read_partitions(args.topic))
    with DataDir.open(config, read_only=True, now_ms=now_ms()) as data_dir:
        topics = _matching(data_dir, args.topic, args.exclude_internal)
    sys.stdout.write("".join(f"{topic}\n" for topic in topics))
    return EXIT_OK


def describe_document(data_dir: DataDir, topics: list[str]) -> dict[str, Any]:
    """`describe --json`: `{"topics": [{"topic", "topicId" (null when none), "partitionCount",
    "replicationFactor", "configs": {name: value}, "partitions": [{"partition", "leader",
    "replicas", "isr", "logStartOffset", "logEndOffset", "highWatermark", "sizeInBytes",
    "segments", "offline" (why, or null)}]}]}`."""
    node = data_dir.broker_node_id() or 0
    described = []
    for topic in topics:
        logs = [data_dir.partition(topic, p) for p in data_dir.topics()[topic]]
        configs = {e.name: e.value for e in data_dir.config_entries(topic) if e.source in TOPIC_LEVEL_SOURCES}
        described.append(
            {
                "topic": topic,
                "topicId": data_dir.topic_id(topic),
                "partitionCount": len(logs),
                "replicationFactor": 1,
                "configs": dict(sorted(configs.items())),
                "partitions": [_partition_document(log, node) for log in logs],
            }
        )
    return {"topics": described}


def _partition_document(log: PartitionLog, node: int) -> dict[str, Any]:
    return {
        "partition": log.partition,
        "leader": node,
        "replicas": [node],
        "isr": [node],
        "logStartOffset": log.log_start_offset,
        "logEndOffset": log.log_end_offset,
        "highWatermark": log.high_watermark,
        "sizeInBytes": log.size_in_bytes(),
        "segments": len(log.segments),
        "offline": log.offline_reason,
    }


def cmd_describe(args: argparse.Namespace) -> int:
    config = broker_config(args, stored=True, partitions=_read_partitions(args.topic))
    with DataDir.open(config, read_only=True, now_ms=now_ms()) as data_dir:
        document = describe_document(data_dir, _existing(data_dir, args))
    if args.json:
        print_json(document)
        return EXIT_OK
    lines = []
    for topic in document["topics"]:
        configs = ",".join(f"{name}={value}" for name, value in topic["configs"].items())
        lines.append(
            f"Topic: {topic['topic']}\tTopicId: {topic['topicId'] or ZERO_TOPIC_ID}\t"
            f"PartitionCount: {topic['partitionCount']}\tReplicationFactor: 1\tConfigs: {configs}"
        )
        for p in topic["partitions"]:
            lines.append(
                f"\tTopic: {topic['topic']}\tPartition: {p['partition']}\tLeader: {p['leader']}\t"
                f"Replicas: {p['leader']}\tIsr: {p['leader']}\tLogStartOffset: {p['logStartOffset']}\t"
                f"LogEndOffset: {p['logEndOffset']}\tSize: {p['sizeInBytes']}"
            )
    sys.stdout.write("".join(f"{line}\n" for line in lines))
    return EXIT_OK
