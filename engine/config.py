"""Kafka's configuration: broker properties, per-topic overrides, names, defaults, precedence.

A broker setting (`log.segment.bytes`, `log.retention.hours`, …) gives every topic its default;
a topic override uses the topic-level name (`segment.bytes`, `retention.ms`, …) and wins. Where
Kafka has several broker names for one setting the most precise wins:
`log.roll.ms` > `log.roll.hours`, `log.retention.ms` > `log.retention.minutes` >
`log.retention.hours`, `log.roll.jitter.ms` > `log.roll.jitter.hours`. Values come from a
`server.properties` file and repeatable `--override key=value`, the latter winning.

A topic's effective config is built in layers, each winning over the ones before it:

1. the broker's topic defaults: `server.properties`, then the dynamic broker configs of a KRaft
   metadata log (cluster-wide default, then this broker's; Kafka's dynamic configs beat static
   ones), then `--override` (the operator's explicit setting for this seglogfs run);
2. for Kafka's internal topics, the configs the broker creates them with
   (`internal_topic_overrides`: `__consumer_offsets` and `__transaction_state` are compacted);
3. the topic's overrides in the broker's metadata log (Kafka's ConfigRecord);
4. the topic's seglogfs overrides (`.seglogfs-topic-configs.json`, the mount's `config` file).

engine.datadir assembles the layers; it also turns cleanup off (`LogConfig.without_cleanup`) for
`__cluster_metadata` and for topics whose broker configs cannot be known.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

from seglogfs.engine.errors import ConfigError, EngineError, UnsafeFileError
from seglogfs.engine.files import decode_text, read_regular
from seglogfs.engine.record.compression import CompressionType
from seglogfs.engine.record.records import TimestampType

LONG_MAX = 2**63 - 1
INT_MAX = 2**31 - 1  # Kafka types these sizes as int: index positions are 32-bit
_HOUR_MS = 3_600_000
_PROPERTIES_MAX_BYTES = 1 << 20  # meta.properties holds a few lines


DEFAULT_FLUSH_MS = 1000  # see "flush.ms" below and the README's durability promise


def _parse_int(text: str) -> int:
    """A decimal integer, as Java's Long.parseLong reads one (no `1_000`, no `1e3`)."""
    if re.fullmatch(r"[+-]?[0-9]+", text.strip()) is None:
        raise ValueError("expected an integer")
    value = int(text.strip())
    if not -(2**63) <= value <= LONG_MAX:
        raise ValueError("expected an integer within the range of a 64-bit integer")
    return value


def _parse_bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered not in ("true", "false"):
        raise ValueError("expected true or false")
    return lowered == "true"


def _parse_policy(text: str) -> tuple[str, ...]:
    policies = tuple(sorted({part.strip().lower() for part in text.split(",") if part.strip()}))
    if not policies or any(p not in ("delete", "compact") for p in policies):
        raise ValueError("expected delete, compact or both (comma-separated)")
    return policies


def _parse_ratio(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = float("nan")  # (not a number: refused below)
    if not 0.0 <= value <= 1.0:
        raise ValueError("expected a number between 0 and 1")
    return value


def _parse_timestamp_type(text: str) -> str:
    TimestampType.from_config(text.strip())
    return text.strip()


def _parse_compression(text: str) -> str:
    name = text.strip().lower()
    if name != "producer":
        CompressionType.from_name(name)
    return name


@dataclass(frozen=True)
class _Setting:
    """One topic-level setting: its parser, lower bound, default and broker names (most
    precise first, each with the factor that turns its unit into the topic's)."""

    parse: Callable[[str], Any]
    default: Any
    broker_names: tuple[tuple[str, int], ...] = ()
    minimum: int | None = None
    maximum: int | None = None


# Topic-level name → how to read it. Defaults are Kafka's.
TOPIC_SETTINGS: dict[str, _Setting] = {
    "segment.bytes": _Setting(_parse_int, 1024**3, (("log.segment.bytes", 1),), minimum=14, maximum=INT_MAX),
    "segment.ms": _Setting(_parse_int, 168 * _HOUR_MS, (("log.roll.ms", 1), ("log.roll.hours", _HOUR_MS)), minimum=1),
    "segment.jitter.ms": _Setting(
        _parse_int, 0, (("log.roll.jitter.ms", 1), ("log.roll.jitter.hours", _HOUR_MS)), minimum=0
    ),
    "segment.index.bytes": _Setting(
        _parse_int, 10 * 1024 * 1024, (("log.index.size.max.bytes", 1),), minimum=4, maximum=INT_MAX
    ),
    "index.interval.bytes": _Setting(_parse_int, 4096, (("log.index.interval.bytes", 1),), minimum=0),
    "flush.messages": _Setting(_parse_int, LONG_MAX, (("log.flush.interval.messages", 1),), minimum=1),
    # Kafka's default is never (replicas on other brokers keep a record a power cut lost here);
    # a single node has no other copy, so seglogfs flushes a second after a record arrives.
    "flush.ms": _Setting(
        _parse_int, DEFAULT_FLUSH_MS, (("log.flush.interval.ms", 1), ("log.flush.scheduler.interval.ms", 1)), minimum=0
    ),
    "retention.ms": _Setting(
        _parse_int,
        168 * _HOUR_MS,
        (("log.retention.ms", 1), ("log.retention.minutes", 60_000), ("log.retention.hours", _HOUR_MS)),
        minimum=-1,
    ),
    "retention.bytes": _Setting(_parse_int, -1, (("log.retention.bytes", 1),)),
    "cleanup.policy": _Setting(_parse_policy, ("delete",), (("log.cleanup.policy", 1),)),
    "max.message.bytes": _Setting(_parse_int, 1048588, (("message.max.bytes", 1),), minimum=0, maximum=INT_MAX),
    "file.delete.delay.ms": _Setting(_parse_int, 60_000, (("log.segment.delete.delay.ms", 1),), minimum=0),
    "delete.retention.ms": _Setting(_parse_int, 86_400_000, (("log.cleaner.delete.retention.ms", 1),), minimum=0),
    "min.compaction.lag.ms": _Setting(_parse_int, 0, (("log.cleaner.min.compaction.lag.ms", 1),), minimum=0),
    "max.compaction.lag.ms": _Setting(_parse_int, LONG_MAX, (("log.cleaner.max.compaction.lag.ms", 1),), minimum=1),
    "min.cleanable.dirty.ratio": _Setting(_parse_ratio, 0.5, (("log.cleaner.min.cleanable.ratio", 1),)),
    "message.timestamp.type": _Setting(_parse_timestamp_type, "CreateTime", (("log.message.timestamp.type", 1),)),
    "compression.type": _Setting(_parse_compression, "producer", (("compression.type", 1),)),
    "preallocate": _Setting(_parse_bool, False, (("log.preallocate", 1),)),
}

# Broker-only settings this engine uses, with Kafka's defaults.
BROKER_SETTINGS: dict[str, _Setting] = {
    "num.partitions": _Setting(_parse_int, 1, minimum=1),
    "auto.create.topics.enable": _Setting(_parse_bool, True),
    "log.retention.check.interval.ms": _Setting(_parse_int, 300_000, minimum=1),
    "log.cleaner.enable": _Setting(_parse_bool, True),
    "log.cleaner.dedupe.buffer.size": _Setting(_parse_int, 128 * 1024 * 1024, minimum=1),
    "log.cleaner.backoff.ms": _Setting(_parse_int, 15_000, minimum=0),
    "log.cleaner.io.buffer.load.factor": _Setting(_parse_ratio, 0.9),
    "log.flush.offset.checkpoint.interval.ms": _Setting(_parse_int, 60_000, minimum=0),
    "log.flush.start.offset.checkpoint.interval.ms": _Setting(_parse_int, 60_000, minimum=0),
    "log.flush.scheduler.interval.ms": _Setting(_parse_int, LONG_MAX, minimum=0),
    "offsets.topic.segment.bytes": _Setting(_parse_int, 100 * 1024 * 1024, minimum=1),
    "transaction.state.log.segment.bytes": _Setting(_parse_int, 100 * 1024 * 1024, minimum=1),
}

# Broker names that set a topic default: what a dynamic broker config may change here.
TOPIC_DEFAULT_NAMES = frozenset(name for setting in TOPIC_SETTINGS.values() for name, _ in setting.broker_names)
OVERRIDE_SOURCE = "--override"  # how `BrokerConfig.source` names a value from --override

# Kafka's own topics (engine.internal_topics reads them)
CONSUMER_OFFSETS_TOPIC = "__consumer_offsets"
TRANSACTION_STATE_TOPIC = "__transaction_state"
METADATA_TOPIC = "__cluster_metadata"  # KRaft's metadata log, one partition


@dataclass(frozen=True)
class LogConfig:
    """A topic's effective settings (Kafka's LogConfig), snake_case of the topic-level names.

    `cleanup_policy` is a sorted tuple of `delete` and `compact`; the empty tuple (shown as an
    empty `cleanup.policy`) is a log neither deleted nor compacted. No setting gives it: seglogfs
    uses it for `__cluster_metadata` and for topics whose broker configs are unknown."""

    segment_bytes: int
    segment_ms: int
    segment_jitter_ms: int
    segment_index_bytes: int
    index_interval_bytes: int
    flush_messages: int
    flush_ms: int
    retention_ms: int
    retention_bytes: int
    cleanup_policy: tuple[str, ...]
    max_message_bytes: int
    file_delete_delay_ms: int
    delete_retention_ms: int
    min_compaction_lag_ms: int
    max_compaction_lag_ms: int
    min_cleanable_dirty_ratio: float
    message_timestamp_type: str
    compression_type: str
    preallocate: bool

    @property
    def compact(self) -> bool:
        return "compact" in self.cleanup_policy

    @property
    def delete(self) -> bool:
        return "delete" in self.cleanup_policy

    @functools.cached_property  # (read for every append)
    def timestamp_type(self) -> TimestampType:
        return TimestampType.from_config(self.message_timestamp_type)

    @functools.cached_property  # (read for every append)
    def max_segment_ms(self) -> int:
        """The time after which the active segment rolls: `segment.ms`, or `max.compaction.lag.ms`
        when that is shorter on a compacted topic, so no record waits in the uncleanable active
        segment longer than its topic allows (Kafka's LogConfig.maxSegmentMs)."""
        if self.compact:
            return min(self.segment_ms, self.max_compaction_lag_ms)
        return self.segment_ms

    def without_cleanup(self) -> LogConfig:
        """This config with neither retention nor compaction: only the log start offset (raised
        by delete-records) still removes segments."""
        return dataclasses.replace(self, cleanup_policy=())

    def as_properties(self) -> dict[str, str]:
        """The settings under their Kafka topic-level names, as strings."""
        out = {}
        for name in TOPIC_SETTINGS:
            value = getattr(self, _field(name))
            if isinstance(value, tuple):
                value = ",".join(value)
            elif isinstance(value, bool):
                value = str(value).lower()
            out[name] = str(value)
        return out


def broker_name_for(name: str) -> str:
    """The broker-level name that sets a topic-level setting's default (`message.timestamp.type`
    → `log.message.timestamp.type`); other names are returned as they are."""
    setting = TOPIC_SETTINGS.get(name)
    if setting is None or not setting.broker_names:
        return name
    for broker_name, factor in setting.broker_names:
        if factor == 1:
            return broker_name
    return name


def _field(name: str) -> str:
    return name.replace(".", "_")


def _convert(setting: _Setting, key: str, text: str, source: str) -> Any:
    """`text` read as `key`'s value; ConfigError in one line naming where the value comes from
    (`server.properties:LINE`, `--override KEY`, a topic's config), the key, the value and what
    is expected, as Kafka's ConfigException says `Invalid value abc for configuration
    segment.bytes: Not a number of type INT`."""
    try:
        value = setting.parse(text)
    except (ValueError, EngineError) as error:  # (each parser says what it expects)
        expected = str(error)
        if setting.parse is _parse_int and setting.minimum is not None and expected == "expected an integer":
            limit = f" from {setting.minimum} to {setting.maximum}" if setting.maximum is not None else ""
            expected += limit or f" of at least {setting.minimum}"
        raise ConfigError(f"{source}: invalid value {text!r} for {key}: {expected}") from None
    if setting.minimum is not None and isinstance(value, int) and value < setting.minimum:
        raise ConfigError(f"{source}: {key}={text} is below the minimum of {setting.minimum}")
    if setting.maximum is not None and isinstance(value, int) and value > setting.maximum:
        raise ConfigError(f"{source}: {key}={text} is above the maximum of {setting.maximum}")
    return value


def read_properties(path: Path, *, in_data_dir: bool = False) -> dict[str, tuple[str, str]]:
    """Parse a Java properties file: key → (value, "path:line"). Handles `=`, `:` or blank
    separators, `#`/`!` comments and backslash line continuations. `in_data_dir` (meta.properties):
    opened as every data dir file is (engine.files: never through a link, never a FIFO), and at
    most `_PROPERTIES_MAX_BYTES`; a file the user names (`-c server.properties`, which may be
    `<(…)`) is opened as given. Bytes that are not UTF-8: ConfigError naming file and line."""
    try:
        data = read_regular(path, _PROPERTIES_MAX_BYTES) if in_data_dir else path.read_bytes()
    except FileNotFoundError:
        raise ConfigError(f"cannot read {path}: no such file") from None
    except OSError as error:
        raise ConfigError(f"cannot read {path}: {error.strerror}") from None
    except UnsafeFileError as error:
        raise ConfigError(str(error)) from None
    text = decode_text(path, data, ConfigError)
    out: dict[str, tuple[str, str]] = {}
    logical = ""
    start_line = 0
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip() if not logical else raw.lstrip()
        if not logical:
            start_line = number
            if not line or line[0] in "#!":
                continue
        if re.search(r"(?<!\\)(\\\\)*\\$", line):
            logical += line[:-1]
            continue
        logical += line
        match = re.match(r"((?:\\.|[^=:\s])+)\s*[=:\s]\s*(.*)$", logical)
        if match is None:
            key, value = logical, ""
        else:
            key, value = match.group(1), match.group(2)
        out[key.replace("\\", "")] = (value, f"{path}:{start_line}")
        logical = ""
    return out


def parse_override(text: str, source: str = "--override") -> tuple[str, str]:
    """`key=value` → (key, value); ConfigError naming the argument otherwise."""
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"{source} {text!r}: expected key=value")
    return key.strip(), value.strip()


@dataclass(frozen=True)
class BrokerConfig:
    """Broker-level settings: log dirs, broker-only settings and the topic defaults."""

    log_dirs: tuple[Path, ...]
    num_partitions: int
    auto_create_topics_enable: bool
    log_retention_check_interval_ms: int
    log_cleaner_enable: bool
    log_cleaner_dedupe_buffer_size: int
    log_cleaner_backoff_ms: int
    log_cleaner_io_buffer_load_factor: float
    log_flush_offset_checkpoint_interval_ms: int
    log_flush_start_offset_checkpoint_interval_ms: int
    log_flush_scheduler_interval_ms: int
    offsets_topic_segment_bytes: int
    transaction_state_log_segment_bytes: int
    topic_defaults: LogConfig
    source: Mapping[str, str] = dataclasses.field(default_factory=dict)
    raw: Mapping[str, tuple[str, str]] = dataclasses.field(default_factory=dict)

    @classmethod
    def load(
        cls,
        properties_file: Path | None = None,
        overrides: Iterable[str] = (),
        log_dirs: Iterable[Path] | None = None,
    ) -> BrokerConfig:
        """Settings from an optional `server.properties`, then `--override key=value` items,
        then explicit `log_dirs` (a command's DATADIR argument), each winning over the last."""
        raw: dict[str, tuple[str, str]] = {}
        if properties_file is not None:
            raw.update(read_properties(properties_file))
        for item in overrides:
            key, value = parse_override(item)
            if key in TOPIC_SETTINGS and key not in BROKER_SETTINGS and key not in TOPIC_DEFAULT_NAMES:
                # (a broker ignores names it does not know, so this would change nothing)
                raise ConfigError(
                    f"{OVERRIDE_SOURCE} {key}: a topic config, not a broker's; "
                    f"the broker's default for it is {broker_name_for(key)}"
                )
            raw[key] = (value, f"{OVERRIDE_SOURCE} {key}")
        return cls.from_raw(raw, log_dirs)

    @classmethod
    def from_raw(cls, raw: Mapping[str, tuple[str, str]], log_dirs: Iterable[Path] | None = None) -> BrokerConfig:
        values: dict[str, Any] = {}
        for key, setting in BROKER_SETTINGS.items():
            if key in raw:
                text, source = raw[key]
                values[_field(key)] = _convert(setting, key, text, source)
            else:
                values[_field(key)] = setting.default
        if log_dirs is not None:
            dirs = tuple(Path(d) for d in log_dirs)
        else:
            text, _ = raw.get("log.dirs", raw.get("log.dir", ("/tmp/kafka-logs", "default")))
            dirs = tuple(Path(part.strip()) for part in text.split(",") if part.strip())
        if not dirs:
            raise ConfigError("log.dirs names no directory")
        return cls(
            log_dirs=dirs,
            topic_defaults=_topic_defaults(raw),
            source={key: source for key, (_, source) in raw.items()},
            raw=MappingProxyType(dict(raw)),
            **values,
        )

    @property
    def cleanup_policy_overridden(self) -> bool:
        """Whether the operator gave `log.cleanup.policy` with --override (or a mount's -o): the
        policy seglogfs then applies to topics whose own configs are unknown (engine.datadir).
        A server.properties value does not count: it is the broker's file, written beside
        per-topic configs kept elsewhere (ZooKeeper, the metadata log)."""
        entry = self.raw.get("log.cleanup.policy")
        return entry is not None and entry[1].startswith(OVERRIDE_SOURCE)

    def topic_defaults_with(self, dynamic: Mapping[str, str], source: str) -> LogConfig:
        """The topic defaults with Kafka's dynamic broker configs (broker names, as a metadata
        log's broker ConfigRecords hold them, cluster default and this broker's merged by the
        caller) over server.properties and under --override. Names that set no topic default are
        ignored; ConfigError naming `source` for a bad value."""
        relevant = {key: (value, f"{source} {key}") for key, value in dynamic.items() if key in TOPIC_DEFAULT_NAMES}
        if not relevant:
            return self.topic_defaults
        static = {key: entry for key, entry in self.raw.items() if not entry[1].startswith(OVERRIDE_SOURCE)}
        overridden = {key: entry for key, entry in self.raw.items() if entry[1].startswith(OVERRIDE_SOURCE)}
        return _topic_defaults({**static, **_without_shadowed(relevant, overridden), **overridden})


def _topic_defaults(raw: Mapping[str, tuple[str, str]]) -> LogConfig:
    """Topic defaults from broker settings: for each topic setting, its most precise broker name
    that is set, else Kafka's default."""
    topic_values: dict[str, Any] = {}
    for name, setting in TOPIC_SETTINGS.items():
        topic_values[_field(name)] = setting.default
        for broker_name, factor in setting.broker_names:
            if broker_name in raw:
                text, source = raw[broker_name]
                value = _convert(setting, broker_name, text, source)
                topic_values[_field(name)] = value * factor if factor != 1 and value >= 0 else value
                break
    return LogConfig(**topic_values)


def _without_shadowed(
    layer: Mapping[str, tuple[str, str]], winners: Mapping[str, tuple[str, str]]
) -> dict[str, tuple[str, str]]:
    """`layer` less every broker name of a topic setting that `winners` sets under any of its
    names: `--override log.retention.hours=1` must beat a dynamic `log.retention.ms`, although
    `.ms` is the more precise name. (Between static and dynamic configs Kafka merges key by key
    and then resolves precision, so that merge is a plain dict update.)"""
    shadowed: set[str] = set()
    for setting in TOPIC_SETTINGS.values():
        names = {broker_name for broker_name, _ in setting.broker_names}
        if names & winners.keys():
            shadowed |= names
    return {key: entry for key, entry in layer.items() if key not in shadowed}


def internal_topic_overrides(topic: str, broker: BrokerConfig) -> dict[str, str]:
    """The topic configs a Kafka broker creates its internal topics with (GroupCoordinator's
    offsetsTopicConfigs, TransactionStateManager's transactionTopicConfigs), topic-level names;
    {} for other topics. A KRaft metadata log also holds them as ConfigRecords; a ZooKeeper-mode
    dir does not, which is why they are known here."""
    if topic == CONSUMER_OFFSETS_TOPIC:
        return {
            "cleanup.policy": "compact",
            "segment.bytes": str(broker.offsets_topic_segment_bytes),
            "compression.type": "producer",
        }
    if topic == TRANSACTION_STATE_TOPIC:
        return {
            "cleanup.policy": "compact",
            "segment.bytes": str(broker.transaction_state_log_segment_bytes),
            "compression.type": "uncompressed",
        }
    return {}


def apply_topic_overrides(base: LogConfig, overrides: Mapping[str, str], source: str = "topic config") -> LogConfig:
    """`base` with topic-level `overrides`; ConfigError for unknown names or bad values."""
    changes: dict[str, Any] = {}
    for key, text in overrides.items():
        setting = TOPIC_SETTINGS.get(key)
        if setting is None:
            raise ConfigError(f"{source}: unknown topic config {key!r}")
        changes[_field(key)] = _convert(setting, key, str(text), source)
    return dataclasses.replace(base, **changes)


def validate_topic_overrides(overrides: Mapping[str, str], source: str = "topic config") -> dict[str, str]:
    """Check overrides without a base; returns them normalised to strings."""
    normalised = {key: str(value).strip() for key, value in overrides.items()}
    for key, text in normalised.items():
        setting = TOPIC_SETTINGS.get(key)
        if setting is None:
            raise ConfigError(f"{source}: unknown topic config {key!r}")
        _convert(setting, key, text, source)
    return normalised


def parse_topic_config(text: bytes, source: str) -> dict[str, str]:
    """A topic's overrides from `key=value` lines, as a topic's `config` file holds them (blank
    lines and `#` comments skipped, a last line without its newline counted). ConfigError naming
    `source` and the line for a line that is not `key=value` or names no topic config."""
    overrides = {}
    for number, line in enumerate(text.decode("utf-8", "replace").splitlines(), start=1):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        key, sep, value = stripped.partition("=")
        if not sep:
            raise ConfigError(f"{source} line {number}: expected key=value, got {stripped!r}")
        overrides[key.strip()] = value.strip()
    return validate_topic_overrides(overrides, source)


def format_topic_config(overrides: Mapping[str, str]) -> bytes:
    """The `key=value` lines of a topic's overrides, sorted: what `parse_topic_config` reads."""
    return "".join(f"{key}={value}\n" for key, value in sorted(overrides.items())).encode()
