"""A data dir's topic configs: where each topic's settings come from, and what they are.

A KRaft broker's configs are in its metadata log, `__cluster_metadata-0` in one of
the log dirs (engine.internal_topics.metadata_log); a topic's config is Kafka's layers (engine.config) with the
seglogfs overrides on top: server.properties < the metadata log's dynamic broker configs <
--override, then Kafka's internal-topic configs < the metadata log's topic ConfigRecords < the
seglogfs overrides. The operator's explicit seglogfs setting wins, as `kafka-configs --alter`
would on the broker. `__cluster_metadata` is never deleted or compacted (Kafka trims it with
snapshots), whatever is set.

Configs that cannot be known. Unless the operator has set a policy for it (`cleanup.policy` in
its seglogfs overrides), a topic's broker configs are unknown when

* the dir is a Kafka broker's (`meta.properties` in a log dir), the topic is not
  `__consumer_offsets`/`__transaction_state`, no `--override log.cleanup.policy` is given (a
  server.properties value does not count: it is the broker's own file, written beside per-topic
  configs kept elsewhere), and no readable metadata log has a TopicRecord for it: there is no
  metadata log (a ZooKeeper-mode broker's dir, whose configs live in ZooKeeper), or it cannot be
  read, or it does not name the topic; or
* one of its overrides in the metadata log has a value seglogfs cannot read.

Such a topic is neither deleted by time or size nor compacted (`LogConfig.without_cleanup`) until
a policy is set; a writable open logs one WARNING naming them. Topics seglogfs creates in a broker's dir get their
policy written into their overrides, so they stay managed. A dir seglogfs made (no
`meta.properties`) has no unknown configs: the broker defaults apply, as always.

The seglogfs overrides are the one file seglogfs adds to a log dir, `.seglogfs-topic-configs.json`
in the first one (Kafka keeps topic overrides in its metadata, not in log dirs; a broker reading
the dir ignores a dot file). The data dir (engine.datadir) holds a `TopicConfigs`, replaces its
`overrides` whole under its own lock (copy-on-write: readers use whatever table they read), and
gives each partition the config `resolve` works out.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from seglogfs.engine.config import (
    BROKER_SETTINGS,
    METADATA_TOPIC,
    OVERRIDE_SOURCE,
    TOPIC_DEFAULT_NAMES,
    TOPIC_SETTINGS,
    BrokerConfig,
    LogConfig,
    _without_shadowed,
    apply_topic_overrides,
    broker_name_for,
    internal_topic_overrides,
    read_properties,
    validate_topic_overrides,
)
from seglogfs.engine.errors import ConfigError, EngineError
from seglogfs.engine.files import decode_text, is_directory, read_regular
from seglogfs.engine.internal_topics.metadata_log import METADATA_PARTITION_DIR, MetadataImage, read_metadata_image
from seglogfs.engine.log.checkpoint import try_writing, write_atomically

TOPIC_CONFIGS_FILE = ".seglogfs-topic-configs.json"
META_PROPERTIES = "meta.properties"
_TOPIC_CONFIGS_MAX_BYTES = 64 << 20  # far more than any number of topics' overrides takes


def node_id(log_dirs: tuple[Path, ...]) -> str | None:
    """The broker's `node.id` (KRaft) or `broker.id` (ZooKeeper mode) from its meta.properties."""
    for log_dir in log_dirs:
        path = log_dir / META_PROPERTIES
        if not os.path.lexists(path):
            continue
        # A broker refuses to start on a meta.properties it cannot read; here the error (bad
        # bytes, a link, a FIFO: naming the file) reaches the command that needs the node id.
        properties = read_properties(path, in_data_dir=True)
        for key in ("node.id", "broker.id"):
            if key in properties:
                return properties[key][0].strip()
    return None


# Where a setting's value comes from (`ConfigEntry.source`), lowest layer first.
SOURCE_DEFAULT = "default"  # Kafka's default (seglogfs's, for flush.ms)


SOURCE_SERVER_PROPERTIES = "server.properties"  # the -c file


SOURCE_OVERRIDE = "--override"  # the command line (a mount's -o)


SOURCE_METADATA_LOG = "metadata-log"  # a KRaft metadata log's ConfigRecord: dynamic broker or topic config


SOURCE_INTERNAL_TOPIC = "internal-topic"  # the configs Kafka creates its internal topics with


SOURCE_TOPIC_OVERRIDE = "topic-override"  # the seglogfs overrides (.seglogfs-topic-configs.json)


SOURCE_CLEANUP_OFF = "cleanup-off"  # seglogfs turned retention and compaction off (module docstring)


UNKNOWN_CONFIGS_REMEDY = (
    "set cleanup.policy in the topic's config, or --override log.cleanup.policy=delete|compact for all such topics"
)


SOURCE_DATADIR = "DATADIR"  # log.dirs: the command's DATADIR argument


TOPIC_LEVEL_SOURCES = frozenset({SOURCE_METADATA_LOG, SOURCE_INTERNAL_TOPIC, SOURCE_TOPIC_OVERRIDE})


@dataclass(frozen=True)
class ConfigEntry:
    """One effective setting and where its value comes from (`TopicConfigs.entries`, `DataDir.config_entries`,
    `seglogfs config show`): `value` as Kafka writes it (`delete,compact`, `true`), `source` one
    of the SOURCE_* names above, `detail` which file, line, record or name set it (empty for a
    default)."""

    name: str
    value: str
    source: str
    detail: str = ""


def _topic_overrides_text(table: Mapping[str, Mapping[str, str]]) -> str:
    """The overrides file's text (seglogfs's own file: a data dir without a metadata log)."""
    document = {"version": 1, "topics": {t: dict(sorted(o.items())) for t, o in sorted(table.items()) if o}}
    return json.dumps(document, indent=2) + "\n"


def _config_text(value: object) -> str:
    """A setting's value as Kafka writes it (LogConfig.as_properties's rendering)."""
    if isinstance(value, tuple):
        return ",".join(value)
    if isinstance(value, bool):
        return str(value).lower()
    return str(value)


def _raw_source(key: str, entry: tuple[str, str]) -> tuple[str, str]:
    """(source, detail) of a BrokerConfig.raw entry (value, where): the -c file's `path:line`,
    or --override."""
    value, where = entry
    if where.startswith(OVERRIDE_SOURCE):
        return SOURCE_OVERRIDE, f"{key}={value}"
    return SOURCE_SERVER_PROPERTIES, f"{where} {key}={value}"


def _valid_override(name: str, value: str) -> bool:
    """Whether a metadata log's topic config is one `TopicConfigs.resolve` applies."""
    try:
        validate_topic_overrides({name: value})
    except ConfigError:
        return False
    return True


class TopicConfigs:
    """The topic configs of one data dir (see the module docstring). `load` reads them once, at
    the data dir's open; `overrides` is the seglogfs overrides table, replaced whole by `store`
    (its writers serialise on the data dir's lock); everything else is read-only after `load`."""

    def __init__(self, config: BrokerConfig) -> None:
        self.config = config
        self.path = config.log_dirs[0] / TOPIC_CONFIGS_FILE
        self.overrides: Mapping[str, Mapping[str, str]] = {}
        self.topic_defaults = config.topic_defaults
        # What the broker's own files say (set once, by `load`).
        self.metadata: MetadataImage | None = None
        self.metadata_dir: Path | None = None
        self._metadata_problem: str | None = None
        self._broker_dir = False
        self._policy_given = config.cleanup_policy_overridden

    def load(self) -> None:
        """Read the overrides file and the broker's metadata log (ConfigError for an overrides
        file that cannot be read; a metadata log that cannot be used makes its topics' configs
        unknown)."""
        self.overrides = self._read_overrides()
        self._read_broker_configs()

    def store(self, table: Mapping[str, Mapping[str, str]]) -> None:
        """Write `table` as the overrides file (atomically, durably), then make it the table in
        use. OSError leaves both as they were."""
        write_atomically(self.path, _topic_overrides_text(table))
        self.overrides = table

    def try_storing(self, table: Mapping[str, Mapping[str, str]]) -> None:
        """Write what `store(table)` would to a temporary file, durably, and remove it: the
        OSError storing it would meet (ENOSPC), raised now. Changes nothing."""
        try_writing(self.path, _topic_overrides_text(table))

    def unknown(self, topics: Iterable[str]) -> dict[str, str]:
        """Topic → why its broker configs are unknown, for those of `topics` whose retention and
        compaction are therefore off."""
        table = self.overrides
        return {topic: why for topic in topics if (why := self.resolve(topic, table)[1]) is not None}

    def entries(self, topic: str) -> list[ConfigEntry]:
        """The topic's effective settings under the topic-level names, each with the last layer
        of the module docstring's order that sets it."""
        defaults = self._default_sources()
        table = self.overrides
        config, why = self.resolve(topic, table)
        properties = config.as_properties()
        internal = internal_topic_overrides(topic, self.config)
        stored = self.metadata.topic_configs.get(topic, {}) if self.metadata is not None else {}
        overrides = table.get(topic, {})
        entries = []
        for name in TOPIC_SETTINGS:
            value = properties[name]
            if name in overrides:
                entry = ConfigEntry(name, value, SOURCE_TOPIC_OVERRIDE, str(self.path))
            elif name in stored and _valid_override(name, stored[name]):
                entry = ConfigEntry(
                    name, value, SOURCE_METADATA_LOG, f"{self.metadata_dir}: topic config {name}={stored[name]}"
                )
            elif name in internal:
                entry = ConfigEntry(
                    name, value, SOURCE_INTERNAL_TOPIC, f"Kafka creates {topic} with {name}={internal[name]}"
                )
            else:
                entry = ConfigEntry(name, value, *defaults[name])
            if name == "cleanup.policy" and topic == METADATA_TOPIC:
                entry = ConfigEntry(name, value, SOURCE_CLEANUP_OFF, "Kafka trims its metadata log with snapshots")
            elif name == "cleanup.policy" and why is not None:
                # (The policy the layers would give is not in force and not known to be the
                # topic's: saying which layer set it only read as if it were.)
                entry = ConfigEntry(name, value, SOURCE_CLEANUP_OFF, f"{why}; {UNKNOWN_CONFIGS_REMEDY}")
            entries.append(entry)
        return entries

    def _read_overrides(self) -> dict[str, Mapping[str, str]]:
        path = self.path
        try:
            document = json.loads(decode_text(path, read_regular(path, _TOPIC_CONFIGS_MAX_BYTES), ConfigError))
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as error:
            raise ConfigError(f"{path}: unreadable topic configs: {error}") from None
        topics = document.get("topics", {}) if isinstance(document, dict) else None
        if not isinstance(topics, dict):
            raise ConfigError(f"{path}: expected an object with a 'topics' object")
        return {
            topic: validate_topic_overrides(overrides, f"{path} topic {topic}") for topic, overrides in topics.items()
        }

    def _read_broker_configs(self) -> None:
        """Whether these are a Kafka broker's log dirs, and what its metadata log says. A metadata
        log that cannot be used is remembered with the reason: its topics' configs are then
        unknown (never guessed)."""
        self._broker_dir = any(os.path.lexists(log_dir / META_PROPERTIES) for log_dir in self.config.log_dirs)
        found = [d / METADATA_PARTITION_DIR for d in self.config.log_dirs if is_directory(d / METADATA_PARTITION_DIR)]
        if not found:
            return
        self.metadata_dir = found[0]
        try:
            image = read_metadata_image(found[0])
            node = node_id(self.config.log_dirs)
            dynamic = {**image.broker_configs.get("", {}), **(image.broker_configs.get(node, {}) if node else {})}
            self.topic_defaults = self.config.topic_defaults_with(dynamic, f"{found[0]} dynamic broker config")
        except (EngineError, OSError) as error:
            self._metadata_problem = f"its metadata log cannot be used: {error}"
            return
        self.metadata = image

    def why_unknown(self, topic: str, table: Mapping[str, Mapping[str, str]]) -> str | None:
        """Why `topic`'s broker configs are unknown with overrides `table`; None when known."""
        if topic == METADATA_TOPIC or "cleanup.policy" in table.get(topic, {}):
            return None
        if internal_topic_overrides(topic, self.config) or self._policy_given:
            return None
        if self._metadata_problem is not None:
            return self._metadata_problem
        if self.metadata is not None:
            return None if topic in self.metadata.topics else f"{self.metadata_dir} has no TopicRecord for it"
        if self._broker_dir:
            return "no metadata log: a ZooKeeper-mode broker's dir, whose topic configs are in ZooKeeper"
        return None

    def resolve(self, topic: str, table: Mapping[str, Mapping[str, str]] | None = None) -> tuple[LogConfig, str | None]:
        """`topic`'s effective config with overrides `table` (default: the stored ones), and why
        its broker configs are unknown (None when known). The layers are in the module
        docstring."""
        table = self.overrides if table is None else table
        source = f"config of topic {topic}"
        layers = internal_topic_overrides(topic, self.config)
        why = self.why_unknown(topic, table)
        stored = self.metadata.topic_configs.get(topic, {}) if self.metadata is not None else {}
        for key, value in stored.items():
            if key not in TOPIC_SETTINGS:
                continue  # min.insync.replicas and the like: nothing a log here uses
            try:
                layers.update(validate_topic_overrides({key: value}, f"{self.metadata_dir} {source}"))
            except ConfigError as error:
                if "cleanup.policy" not in table.get(topic, {}):
                    why = why or str(error)
        layers.update(table.get(topic, {}))
        config = apply_topic_overrides(self.topic_defaults, layers, source) if layers else self.topic_defaults
        if topic == METADATA_TOPIC or why is not None:
            config = config.without_cleanup()
        return config, why

    def broker_entries(self) -> list[ConfigEntry]:
        """The broker's effective settings, each with its source: `log.dirs`, the broker-only
        settings, then each topic default under its broker name."""
        defaults = self._default_sources()
        raw = self.config.raw
        entries = [ConfigEntry("log.dirs", ",".join(str(d) for d in self.config.log_dirs), SOURCE_DATADIR)]
        for key in BROKER_SETTINGS:
            value = _config_text(getattr(self.config, key.replace(".", "_")))
            source = _raw_source(key, raw[key]) if key in raw else (SOURCE_DEFAULT, "")
            entries.append(ConfigEntry(key, value, *source))
        properties = self.topic_defaults.as_properties()
        entries += [ConfigEntry(broker_name_for(name), properties[name], *defaults[name]) for name in TOPIC_SETTINGS]
        return entries

    def _default_sources(self) -> dict[str, tuple[str, str]]:
        """Topic-level name → (source, detail) of its broker default: the broker name Kafka's
        precedence picks among server.properties, the metadata log's dynamic broker configs and
        --override, merged as BrokerConfig.topic_defaults_with merges them."""
        static: dict[str, tuple[str, str]] = {}
        overridden: dict[str, tuple[str, str]] = {}
        for key, (value, where) in self.config.raw.items():
            (overridden if where.startswith(OVERRIDE_SOURCE) else static)[key] = (value, where)
        merged = {key: (value, *_raw_source(key, (value, where))) for key, (value, where) in static.items()}
        if self.metadata is not None:
            node = node_id(self.config.log_dirs)
            dynamic = {
                key: (value, SOURCE_METADATA_LOG, f"{self.metadata_dir}: dynamic {label} config {key}={value}")
                for resource, label in (("", "cluster default"), (node, f"broker {node}"))
                if resource is not None
                for key, value in self.metadata.broker_configs.get(resource, {}).items()
                if key in TOPIC_DEFAULT_NAMES
            }
            kept = _without_shadowed({key: (value, detail) for key, (value, _, detail) in dynamic.items()}, overridden)
            merged.update({key: dynamic[key] for key in kept})
        merged.update({key: (value, *_raw_source(key, (value, where))) for key, (value, where) in overridden.items()})
        sources: dict[str, tuple[str, str]] = {}
        for name, setting in TOPIC_SETTINGS.items():
            # The first broker name set wins, most precise first (config._topic_defaults).
            winner = next((merged[b] for b, _ in setting.broker_names if b in merged), None)
            sources[name] = (winner[1], winner[2]) if winner is not None else (SOURCE_DEFAULT, "")
        return sources
