"""The options of `format("seglog")`, parsed and checked as Spark's Kafka source checks them.

Names, values, defaults and precedence are those of the "Structured Streaming + Kafka Integration
Guide" (Spark 4): exactly one of `assign` (JSON `{"t":[0,1]}`), `subscribe` (comma-separated
topics) or `subscribePattern` (a regular expression found anywhere in a topic name, as Spark's
source finds it through Kafka's admin client: `orders` matches `orders-eu`); a start chosen by
`startingTimestamp` > `startingOffsetsByTimestamp` > `startingOffsets` (default `earliest`) and
an end by `endingTimestamp` > `endingOffsetsByTimestamp` > `endingOffsets`
(default `latest`); in offset JSON -2 is earliest and -1 latest; `startingOffsetsByTimestampStrategy`
(`error`, `latest`) for a start time no record reaches; `failOnDataLoss` (default true);
`minPartitions`; `includeHeaders`; `kafka.isolation.level` (`read_uncommitted`, the default, or
`read_committed`: a Kafka consumer config, which Spark passes with the `kafka.` prefix). A batch
query refuses a `latest` start and an `earliest` end, as Spark's
KafkaSourceProvider.validateBatchOptions does.

seglogfs's own: `path` (a data dir, several comma-separated like `log.dirs`, a seglogfs mount
point, whose `.logdir/` mirror is read, or, for reads, a backup in object storage by URI:
`s3://bucket/prefix`, see engine.stored), `config` (a server.properties file, as `-c`) and
`override.<setting>` (as `--override setting=value`).

Nothing here imports pyspark: the planner and a streaming reader use these values as they are.
"""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from seglogfs.engine import BrokerConfig
from seglogfs.engine.log.transactions import READ_COMMITTED, READ_UNCOMMITTED
from seglogfs.engine.object_store import is_object_store_uri
from seglogfs.engine.object_store import parse_location as object_location

TopicPartition = tuple[str, int]

EARLIEST = -2  # Kafka's ListOffsets EARLIEST_TIMESTAMP, Spark's KafkaOffsetRangeLimit.EARLIEST
LATEST = -1  # Kafka's ListOffsets LATEST_TIMESTAMP, Spark's KafkaOffsetRangeLimit.LATEST

# Topics Kafka's admin client hides from `subscribe`/`subscribePattern` (Spark drops internal
# topics; `__cluster_metadata` is never visible to clients at all). `assign` reads them.
INTERNAL_TOPICS = frozenset({"__consumer_offsets", "__transaction_state", "__share_group_state", "__cluster_metadata"})

MOUNT_MIRROR = ".logdir"  # a seglogfs mount's read-only copy of its data dir in Kafka's layout


class OptionError(ValueError):
    """An option is missing, unknown in its value or contradicts another (Spark's
    IllegalArgumentException for the same cases)."""


# -- where offsets start and end (Spark's KafkaOffsetRangeLimit) ------------------------------------
@dataclass(frozen=True)
class Earliest:
    """The log start offset of every partition."""


@dataclass(frozen=True)
class Latest:
    """The log end offset of every partition (as it is when the query is planned)."""


@dataclass(frozen=True)
class SpecificOffsets:
    """An offset per partition; `EARLIEST` (-2) and `LATEST` (-1) stand for the log's ends. Every
    partition read must be named."""

    offsets: Mapping[TopicPartition, int]


@dataclass(frozen=True)
class SpecificTimestamps:
    """A timestamp (epoch ms) per partition: the first offset whose record timestamp is ≥ it.
    Every partition read must be named."""

    timestamps: Mapping[TopicPartition, int]


@dataclass(frozen=True)
class GlobalTimestamp:
    """One timestamp (epoch ms) for every partition."""

    timestamp: int


OffsetLimit = Earliest | Latest | SpecificOffsets | SpecificTimestamps | GlobalTimestamp


@dataclass(frozen=True)
class Subscription:
    """Which partitions are read: `assign`, `subscribe` or `subscribePattern`."""

    kind: Literal["assign", "subscribe", "subscribePattern"]
    topics: tuple[str, ...] = ()
    pattern: str = ""
    assigned: tuple[TopicPartition, ...] = ()

    def partitions(self, available: Mapping[str, list[int]]) -> list[TopicPartition]:
        """The partitions this subscription reads among `available` (topic → partitions), sorted.
        Raises OptionError for an assigned partition or a subscribed topic that does not exist
        (Kafka's admin client fails the same way: UnknownTopicOrPartition)."""
        if self.kind == "assign":
            missing = [f"{t}-{p}" for t, p in self.assigned if p not in available.get(t, ())]
            if missing:
                raise OptionError(f"assign: no such partition: {', '.join(missing)}")
            return sorted(set(self.assigned))
        if self.kind == "subscribe":
            missing = [t for t in self.topics if t not in available]
            if missing:
                raise OptionError(f"subscribe: no such topic: {', '.join(missing)}")
            topics = [t for t in self.topics if t not in INTERNAL_TOPICS]
        else:
            regex = re.compile(self.pattern)
            topics = [t for t in available if t not in INTERNAL_TOPICS and regex.search(t)]
        return sorted((t, p) for t in set(topics) for p in available[t])


@dataclass(frozen=True)
class Location:
    """Where the data is: the log dirs to open, and whether they are a mount's mirror."""

    log_dirs: tuple[Path, ...]
    mount_point: Path | None = None  # set when `path` named a seglogfs mount
    store_uri: str | None = None  # set when `path` named a backup in object storage (no log dirs then)

    @property
    def mounted(self) -> bool:
        return self.mount_point is not None


@dataclass(frozen=True)
class EngineSettings:
    """The `-c server.properties` and `--override` of the CLI, as options."""

    properties_file: Path | None = None
    overrides: tuple[str, ...] = ()

    def broker_config(self, log_dirs: tuple[Path, ...]) -> BrokerConfig:
        return BrokerConfig.load(self.properties_file, self.overrides, log_dirs)


@dataclass(frozen=True, kw_only=True)
class SourceOptions:
    """What a batch read and a stream both take, checked (`parse_source_options`)."""

    location: Location
    engine: EngineSettings
    subscription: Subscription
    starting: OffsetLimit
    starting_strategy: Literal["error", "latest"] = "error"
    fail_on_data_loss: bool = True
    min_partitions: int | None = None
    include_headers: bool = False
    read_committed: bool = False  # kafka.isolation.level=read_committed


@dataclass(frozen=True, kw_only=True)
class ReadOptions(SourceOptions):
    """A batch read's options, checked (see the module docstring)."""

    ending: OffsetLimit
    ignored: tuple[str, ...] = field(default=())  # given, but meaningless for a batch query


# -- parsing ------------------------------------------------------------------------------------
# The options a read takes, as Spark's Kafka source spells them (Spark compares them
# case-insensitively), and seglogfs's own. A batch read leaves the stream-only ones aside, as
# Spark's does.
READ_OPTIONS = (
    "assign",
    "subscribe",
    "subscribePattern",
    "startingOffsets",
    "endingOffsets",
    "startingTimestamp",
    "endingTimestamp",
    "startingOffsetsByTimestamp",
    "endingOffsetsByTimestamp",
    "startingOffsetsByTimestampStrategy",
    "failOnDataLoss",
    "minPartitions",
    "includeHeaders",
    "maxOffsetsPerTrigger",
    "minOffsetsPerTrigger",
    "maxTriggerDelay",
    "kafka.isolation.level",
    "path",
    "config",
    "pushFilters",
)
OVERRIDE_PREFIX = "override."  # override.<setting>: as the CLI's --override setting=value

# Options of Spark's Kafka source (or of a Kafka consumer) that mean nothing for a data dir or
# that Spark's source refuses, and what to do instead.
_REFUSED = {
    "kafka.bootstrap.servers": "seglog reads the data dir named by the option path, not a broker",
    "kafka.auto.offset.reset": "set startingOffsets to earliest or latest instead",
    "kafka.group.id": "seglog joins no consumer group: a stream's checkpoint holds its offsets",
    "groupidprefix": "seglog joins no consumer group: a stream's checkpoint holds its offsets",
    "kafka.enable.auto.commit": "seglog commits no offsets: a stream's checkpoint holds them",
    "kafka.key.deserializer": "keys are always byte arrays: deserialize them with DataFrame operations",
    "kafka.value.deserializer": "values are always byte arrays: deserialize them with DataFrame operations",
    "kafka.interceptor.classes": "seglog runs no Kafka consumer, so no interceptors",
    "maxrecordsperpartition": "use minPartitions to cut partitions into more tasks",
    "kafkaconsumer.polltimeoutms": "seglog reads files, not a broker: there is nothing to wait for",
    "fetchoffset.numretries": "seglog reads files, not a broker: there is nothing to retry",
    "fetchoffset.retryintervalms": "seglog reads files, not a broker: there is nothing to retry",
}

# A table property (TableCatalog.PROP_PROVIDER) among the options Spark passes when
# `CREATE TABLE … USING seglog` asks for the schema (with `owner`, `location`, `option.<name>`).
_TABLE_PROPERTY = "provider"

TABLE_REFUSED = (
    "CREATE TABLE … USING seglog makes a table Spark cannot read: Spark (4.3) gives a catalog table's "
    "options to no read of a Python data source. Use CREATE TEMPORARY VIEW name USING seglog "
    "OPTIONS (path '…', subscribe '…'), or spark.read.format('seglog')"
)


def _suggestion(word: str, choices: Iterable[str]) -> str:
    """`: did you mean X?` for the closest of `choices` (compared case-insensitively), or ''."""
    by_lower = {choice.lower(): choice for choice in choices}
    close = difflib.get_close_matches(word.lower(), list(by_lower), n=1, cutoff=0.75)
    return f": did you mean {by_lower[close[0]]}?" if close else ""


def check_read_option_names(raw: Mapping[str, str]) -> None:
    """Refuse, in one line naming it, an option a read does not take: a typo (with the name
    meant), a Kafka client setting or a Spark Kafka source option that means nothing here (with
    what to use instead), or the table properties of `CREATE TABLE … USING seglog`."""
    names = {key.lower(): key for key in raw}
    if _TABLE_PROPERTY in names:
        raise OptionError(TABLE_REFUSED)
    known = {name.lower() for name in READ_OPTIONS}
    for lower, given in sorted(names.items()):
        if lower in known or (lower.startswith(OVERRIDE_PREFIX) and len(lower) > len(OVERRIDE_PREFIX)):
            continue
        if lower in _REFUSED:
            raise OptionError(f"option {given} is not supported by seglog: {_REFUSED[lower]}")
        if lower.startswith("kafka."):
            raise OptionError(
                f"option {given} is a Kafka client setting, which means nothing to seglog (it reads the data dir "
                "named by the option path); of them only kafka.isolation.level is taken"
            )
        raise OptionError(f"unknown option {given} for seglog{_suggestion(given, READ_OPTIONS)}")


def lowered(options: Mapping[str, str]) -> dict[str, str]:
    """Options with lower-case names (Spark's option maps are case-insensitive)."""
    return {key.lower(): value for key, value in options.items()}


def parse_bool(options: Mapping[str, str], name: str, default: bool) -> bool:
    text = options.get(name.lower())
    if text is None:
        return default
    value = text.strip().lower()
    if value not in ("true", "false"):
        raise OptionError(f"{name} must be true or false, not {text!r}{_suggestion(value, ('true', 'false'))}")
    return value == "true"


def parse_read_committed(options: Mapping[str, str]) -> bool:
    """`kafka.isolation.level`: whether reads are read_committed (default read_uncommitted)."""
    text = options.get("kafka.isolation.level")
    if text is None:
        return False
    value = text.strip().lower()
    if value not in (READ_UNCOMMITTED, READ_COMMITTED):
        raise OptionError(
            f"kafka.isolation.level must be {READ_UNCOMMITTED} or {READ_COMMITTED}, not {text!r}"
            f"{_suggestion(value, (READ_UNCOMMITTED, READ_COMMITTED))}"
        )
    return value == READ_COMMITTED


def parse_positive(options: Mapping[str, str], name: str) -> int | None:
    """A positive integer option (None when absent); OptionError naming it otherwise."""
    text = options.get(name.lower())
    if text is None:
        return None
    text = text.strip()
    if not text.isdigit() or int(text) <= 0:
        raise OptionError(f"{name} must be a positive integer, not {text!r}")
    return int(text)


def parse_location(options: Mapping[str, str]) -> Location:
    """`path`: log dirs (comma-separated), a mount point, or a backup in object storage by URI
    (`s3://bucket/prefix`, read only). A mount point is recognised by its `.logdir/` mirror; with
    several log dirs the mirror holds them as `.logdir/0/`, `.logdir/1/`…"""
    text = options.get("path", "")
    if is_object_store_uri(text.strip()):
        try:
            object_location(text.strip())
        except ValueError as error:
            raise OptionError(f"path {error}") from None
        return Location((), store_uri=text.strip())
    parts = [Path(part.strip()) for part in text.split(",") if part.strip()]
    if not parts:
        raise OptionError("option path is required: a data dir (or comma-separated log dirs) or a seglogfs mount")
    if len(parts) == 1 and (parts[0] / MOUNT_MIRROR).is_dir():
        mirror = parts[0] / MOUNT_MIRROR
        numbered = sorted(
            (child for child in mirror.iterdir() if child.is_dir() and child.name.isdigit()),
            key=lambda child: int(child.name),
        )
        return Location(tuple(numbered) if numbered else (mirror,), mount_point=parts[0])
    return Location(tuple(parts))


def parse_engine_settings(options: Mapping[str, str]) -> EngineSettings:
    """`config` (a server.properties file) and `override.<setting>` options."""
    properties = options.get("config")
    overrides = tuple(
        f"{key[len('override.') :]}={value}" for key, value in sorted(options.items()) if key.startswith("override.")
    )
    return EngineSettings(Path(properties) if properties else None, overrides)


def _json_object(name: str, text: str, example: str) -> dict[str, object]:
    try:
        document = json.loads(text)
    except ValueError:
        document = None
    if not isinstance(document, dict):
        raise OptionError(f"{name}: expected a JSON object, e.g. {example}, got {text!r}")
    return document


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def parse_partition_map(name: str, text: str) -> dict[TopicPartition, int]:
    """`{"topicA":{"0":23,"1":-1},"topicB":{"0":-2}}` → {(topic, partition): value}
    (Spark's JsonUtils.partitionOffsets and partitionTimestamps)."""
    example = '{"topicA":{"0":23,"1":-1},"topicB":{"0":-2}}'
    out: dict[TopicPartition, int] = {}
    for topic, partitions in _json_object(name, text, example).items():
        if not isinstance(partitions, dict):
            raise OptionError(f"{name}: expected e.g. {example}, got {text!r}")
        for partition, value in partitions.items():
            number = _int(value)
            if number is None or not (partition.isascii() and partition.isdigit()):
                raise OptionError(f"{name}: expected e.g. {example}, got {text!r}")
            out[(topic, int(partition))] = number
    return out


def parse_assign(text: str) -> tuple[TopicPartition, ...]:
    """`{"topicA":[0,1],"topicB":[2,4]}` (Spark's JsonUtils.partitions)."""
    example = '{"topicA":[0,1],"topicB":[2,4]}'
    out: list[TopicPartition] = []
    for topic, partitions in _json_object("assign", text, example).items():
        numbers = [_int(p) for p in partitions] if isinstance(partitions, list) else [None]
        if any(n is None for n in numbers):
            raise OptionError(f"assign: expected e.g. {example}, got {text!r}")
        out.extend((topic, n) for n in numbers if n is not None)
    return tuple(out)


def parse_subscription(options: Mapping[str, str]) -> Subscription:
    """Exactly one of assign, subscribe, subscribePattern (Spark's validateGeneralOptions)."""
    given = [name for name in ("assign", "subscribe", "subscribepattern") if name in options]
    if not given:
        raise OptionError("one of the options assign, subscribe or subscribePattern must be given")
    if len(given) > 1:
        names = {"assign": "assign", "subscribe": "subscribe", "subscribepattern": "subscribePattern"}
        raise OptionError(
            f"only one of assign, subscribe or subscribePattern may be given, not {', '.join(names[g] for g in given)}"
        )
    name = given[0]
    text = options[name].strip()
    if name == "assign":
        assigned = parse_assign(text)
        if not assigned:
            raise OptionError(f"assign: no topic partitions in {text!r}")
        return Subscription("assign", assigned=assigned)
    if name == "subscribe":
        topics = tuple(dict.fromkeys(t.strip() for t in text.split(",") if t.strip()))
        if not topics:
            raise OptionError(f"subscribe: no topics in {options[name]!r}")
        return Subscription("subscribe", topics=topics)
    if not text:
        raise OptionError("subscribePattern: the pattern is empty")
    try:
        re.compile(text)
    except re.error as error:
        raise OptionError(f"subscribePattern: {text!r} is not a regular expression: {error}") from None
    return Subscription("subscribePattern", pattern=text)


def parse_limit(
    options: Mapping[str, str], global_name: str, by_timestamp_name: str, offsets_name: str, default: OffsetLimit
) -> OffsetLimit:
    """Spark's getKafkaOffsetRangeLimit: the global timestamp option wins over the per-partition
    timestamp JSON, which wins over the offsets option, which defaults to `default`."""
    if global_name.lower() in options:
        text = options[global_name.lower()].strip()
        try:
            return GlobalTimestamp(int(text))
        except ValueError:
            raise OptionError(f"{global_name}: expected a single long value, got {text!r}") from None
    if by_timestamp_name.lower() in options:
        return SpecificTimestamps(parse_partition_map(by_timestamp_name, options[by_timestamp_name.lower()].strip()))
    given = options.get(offsets_name.lower())
    if given is None:
        return default
    text = given.strip()
    if text.lower() == "latest":
        return Latest()
    if text.lower() == "earliest":
        return Earliest()
    if not text.startswith("{"):
        raise OptionError(
            f"{offsets_name} must be earliest, latest or a JSON object of offsets, not {text!r}"
            f"{_suggestion(text, ('earliest', 'latest'))}"
        )
    return SpecificOffsets(parse_partition_map(offsets_name, text))


def parse_read_options(raw: Mapping[str, str]) -> ReadOptions:
    """Check a batch read's options; OptionError names the first problem."""
    options = lowered(raw)
    starting = parse_limit(options, "startingTimestamp", "startingOffsetsByTimestamp", "startingOffsets", Earliest())
    ending = parse_limit(options, "endingTimestamp", "endingOffsetsByTimestamp", "endingOffsets", Latest())
    if isinstance(starting, Latest):
        raise OptionError("startingOffsets can't be latest for batch queries")
    if isinstance(starting, SpecificOffsets):
        for (topic, partition), offset in sorted(starting.offsets.items()):
            if offset == LATEST:
                raise OptionError(f"startingOffsets for {topic}-{partition} can't be latest (-1) for batch queries")
    if isinstance(ending, Earliest):
        raise OptionError("endingOffsets can't be earliest for batch queries")
    if isinstance(ending, SpecificOffsets):
        for (topic, partition), offset in sorted(ending.offsets.items()):
            if offset == EARLIEST:
                raise OptionError(f"endingOffsets for {topic}-{partition} can't be earliest (-2) for batch queries")
    ignored = tuple(name for name in ("maxoffsetspertrigger", "minoffsetspertrigger") if name in options)
    return ReadOptions(**parse_source_options(options, starting), ending=ending, ignored=ignored)


def parse_source_options(options: Mapping[str, str], starting: OffsetLimit) -> dict[str, Any]:
    """The options of `SourceOptions` from `options` (lowered), checked, as keyword arguments;
    `starting` is the read's own (a batch and a stream differ in what they allow there)."""
    strategy = options.get("startingoffsetsbytimestampstrategy", "error").strip().lower()
    if strategy not in ("error", "latest"):
        raise OptionError(
            f"startingOffsetsByTimestampStrategy must be error or latest, not {strategy!r}"
            f"{_suggestion(strategy, ('error', 'latest'))}"
        )
    return {
        "location": parse_location(options),
        "engine": parse_engine_settings(options),
        "subscription": parse_subscription(options),
        "starting": starting,
        "starting_strategy": "latest" if strategy == "latest" else "error",
        "fail_on_data_loss": parse_bool(options, "failOnDataLoss", True),
        "min_partitions": parse_positive(options, "minPartitions"),
        "include_headers": parse_bool(options, "includeHeaders", False),
        "read_committed": parse_read_committed(options),
    }
