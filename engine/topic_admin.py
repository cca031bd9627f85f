"""Topic administration of a data dir (what kafka-topics and kafka-configs do to a broker's
topics, for one broker): create a topic (`create_topic`: its name checked against the others as
Kafka checks it, its partitions placed in the least loaded log dirs, its config overrides kept),
add partitions (`add_partitions`, only up), delete a topic (`delete_topic`, Kafka's `-delete`
rename, then removal), a topic's id (`topic_id`, from `partition.metadata` or the broker's
metadata log) and its effective configs (`config_entries`).

`TopicAdministration` is a part of `engine.datadir.DataDir` (its base class), kept apart from
the log dirs' opening, loading, locks and checkpoints: it works on the data dir's partition
table and configs under the data dir's lock, by the table's rules (engine.datadir's docstring:
copy-on-write, a topic appears only once all its partitions exist).
"""

from __future__ import annotations

import base64
import contextlib
import logging
import os
import shutil
import threading
import uuid
from collections.abc import Mapping
from pathlib import Path

from seglogfs.engine.cleaner.log_cleaner import LogCleaner
from seglogfs.engine.config import METADATA_TOPIC, BrokerConfig, LogConfig, validate_topic_overrides
from seglogfs.engine.errors import (
    ConfigError,
    ReadOnlyError,
    TopicExistsError,
    UnknownTopicOrPartitionError,
)
from seglogfs.engine.log.checkpoint import PARTITION_METADATA, CheckpointError, fsync_dir, read_partition_metadata
from seglogfs.engine.log.log import PartitionLog
from seglogfs.engine.log.naming import partition_dir_name, refuse_colliding_topic, validate_topic
from seglogfs.engine.topic_configs import ConfigEntry, TopicConfigs, node_id

logger = logging.getLogger(__name__)

TopicPartition = tuple[str, int]


def new_topic_id() -> str:
    """A topic id as Kafka prints one: 16 random bytes, URL-safe base64, no padding."""
    return base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode("ascii")


class TopicAdministration:
    """A data dir's topic administration (see the module docstring); `DataDir` is one."""

    # What it works on, the data dir's (set by DataDir.__init__).
    config: BrokerConfig
    writable: bool
    topic_configs: TopicConfigs
    log_cleaner: LogCleaner
    maintenance_lock: threading.Lock
    _lock: threading.RLock
    _logs: Mapping[TopicPartition, PartitionLog]

    def checkpoint(self) -> None:
        raise NotImplementedError  # (DataDir's)

    def _check_writable(self) -> None:
        if not self.writable:
            raise ReadOnlyError("the data dir is open read-only")

    def create_topic(
        self, topic: str, partitions: int | None = None, overrides: Mapping[str, str] | None = None, *, now_ms: int
    ) -> list[PartitionLog]:
        """Create `topic` with `partitions` (default `num.partitions`) and config overrides.
        Thread-safe: creators serialise on the data dir's lock, and the topic appears to
        readers only once every partition exists. A name that collides with an existing topic's
        ('.' against '_') is refused as Kafka refuses it (InvalidTopicError). In a broker's dir,
        where a topic no broker knows would count as one whose configs are unknown, the policy
        it gets (the given one, else the broker default) is written into its overrides. If a
        partition cannot be made, what it made (partition dirs, overrides) is removed again and
        the error raised; a crash midway leaves a topic with fewer partitions (DEVELOPING.md
        F8)."""
        self._check_writable()
        validate_topic(topic)
        with self._lock:
            if any(t == topic for t, _ in self._logs):
                raise TopicExistsError(f"topic {topic!r} exists already")
            # (a topic the broker's metadata log names is one too, partitions here or not)
            metadata = self.topic_configs.metadata
            known = {t for t, _ in self._logs} | set(metadata.topics if metadata is not None else ())
            refuse_colliding_topic(topic, known)
            count = self.config.num_partitions if partitions is None else partitions
            if count < 1:
                raise ConfigError(f"topic {topic!r}: partition count must be at least 1, not {count}")
            checked = validate_topic_overrides(overrides or {}, f"config of topic {topic}")
            configs = self.topic_configs
            if configs.why_unknown(topic, {topic: checked}) is not None:
                checked = {**checked, "cleanup.policy": ",".join(configs.topic_defaults.cleanup_policy)}
            before = table = configs.overrides
            if checked:
                table = {**table, topic: checked}
                configs.store(table)
            config = configs.resolve(topic, table)[0]
            try:
                created = self._create_partitions(topic, range(count), config, new_topic_id(), now_ms)
            except BaseException:
                if table is not before:  # (a topic never made has no overrides: its name is free again)
                    with contextlib.suppress(OSError):
                        configs.store(before)
                    configs.overrides = before
                raise
            self._logs = {**self._logs, **created}
        return list(created.values())

    def _partition_counts(self) -> dict[Path, int]:
        """Partitions per log dir, for placing new ones in the least loaded (as Kafka does)."""
        counts = dict.fromkeys(self.config.log_dirs, 0)
        for log in self._logs.values():
            counts[log.directory.parent] = counts.get(log.directory.parent, 0) + 1
        return counts

    def _topic_logs(self, topic: str) -> list[PartitionLog]:
        """The topic's partitions, sorted; UnknownTopicOrPartitionError when it has none."""
        logs = [log for (t, _), log in sorted(self._logs.items()) if t == topic]
        if not logs:
            raise UnknownTopicOrPartitionError(f"unknown topic {topic!r}")
        return logs

    def topic_id(self, topic: str) -> str | None:
        """The topic's id as Kafka prints it (URL-safe base64 of 16 bytes): from its partitions'
        `partition.metadata`, else from the broker's metadata log; None when neither has one
        (data written by a Kafka older than 2.8). Thread-safe."""
        for log in self._topic_logs(topic):
            if log.offline_reason is not None:
                continue  # (its files are not read: it may be a link)
            try:
                topic_id = read_partition_metadata(log.directory / PARTITION_METADATA)
            except CheckpointError as error:  # (Kafka takes such a partition offline; its id is not needed to serve it)
                logger.warning("%s; the topic id is taken from the other partitions", error)
                continue
            if topic_id:
                return topic_id
        metadata = self.topic_configs.metadata
        if metadata is not None:
            return metadata.topics.get(topic)
        return None

    def broker_node_id(self) -> int | None:
        """The broker's `node.id` (`broker.id`) from its meta.properties; None in a dir seglogfs
        made (kafka-topics prints it as every partition's leader; seglogfs prints 0 then)."""
        node = node_id(self.config.log_dirs)
        return int(node) if node is not None and node.isdigit() else None

    def metadata_log_has_topic(self, topic: str) -> bool:
        """Whether the broker's metadata log names `topic` (a TopicRecord): a broker started on
        this dir will then recreate whatever partitions of it seglogfs deletes, and set aside as
        stray the ones seglogfs adds."""
        metadata = self.topic_configs.metadata
        return metadata is not None and topic in metadata.topics

    def add_partitions(self, topic: str, count: int, *, now_ms: int) -> list[PartitionLog]:
        """Grow `topic` to `count` partitions (kafka-topics --alter --partitions): a count can only
        go up, as in Kafka (ConfigError otherwise, nothing changed). The new partitions, numbered
        after the highest one here, get the topic's id and config and go to the least loaded log
        dirs. Thread-safe as `create_topic`; the new partitions appear to readers all at once.
        Returns them."""
        self._check_writable()
        with self._lock:
            existing = self._topic_logs(topic)
            if topic == METADATA_TOPIC:
                raise ConfigError(f"{METADATA_TOPIC} is Kafka's metadata log: it has one partition")
            current = existing[-1].partition + 1
            if count <= current:
                raise ConfigError(
                    f"topic {topic!r} has {current} partitions: the count can only be increased, "
                    f"not set to {count} (Kafka cannot take partitions away)"
                )
            topic_id = self.topic_id(topic) or new_topic_id()
            created = self._create_partitions(topic, range(current, count), existing[0].config, topic_id, now_ms)
            self._logs = {**self._logs, **created}
        return list(created.values())

    def _create_partitions(
        self, topic: str, numbers: range, config: LogConfig, topic_id: str, now_ms: int
    ) -> dict[TopicPartition, PartitionLog]:
        """Make partition dirs `numbers` of `topic` in the least loaded log dirs (caller holds
        `_lock` and publishes them). On failure (a full disk) the dirs it made are removed again,
        none of them seen by a reader yet, and the error raised: the name is free for another
        try (a dir left behind made every later `mkdir` of it fail until a reopen loaded it)."""
        counts = self._partition_counts()
        created: dict[TopicPartition, PartitionLog] = {}
        made: list[Path] = []
        try:
            for partition in numbers:
                log_dir = min(self.config.log_dirs, key=lambda d: counts[d])
                counts[log_dir] += 1
                directory = log_dir / partition_dir_name(topic, partition)
                if os.path.lexists(directory):  # (left by a crash, not loaded: not ours to remove)
                    raise TopicExistsError(f"topic {topic!r}: {directory} exists already (the next open loads it)")
                made.append(directory)
                created[(topic, partition)] = PartitionLog.create(
                    directory, topic, partition, config, topic_id=topic_id, now_ms=now_ms
                )
            for log_dir in self.config.log_dirs:
                fsync_dir(log_dir)
        except BaseException:
            for log in created.values():
                with contextlib.suppress(Exception):
                    log.close()
            for directory in made:
                shutil.rmtree(directory, ignore_errors=True)
                with contextlib.suppress(OSError):
                    fsync_dir(directory.parent)
            raise
        return created

    def delete_topic(self, topic: str) -> list[Path]:
        """Delete `topic` and its data (kafka-topics --delete), as Kafka's LogManager does: its
        partitions leave the partition table at once, each partition dir is closed and renamed
        `<topic>-<p>.<uuid>-delete` (a name no open loads), the topic's overrides and cleaner
        state are dropped and the checkpoints rewritten; then the renamed dirs are removed. A
        crash in between leaves `-delete` dirs that nothing reads, never half a topic's
        overrides. Waits for a background pass under way (`maintenance_lock`: a mount's
        scheduler), which then never meets the topic. Returns the partition dirs deleted."""
        self._check_writable()
        with self.maintenance_lock, self._lock:
            doomed = self._topic_logs(topic)
            if topic == METADATA_TOPIC:
                raise ConfigError(f"{METADATA_TOPIC} is Kafka's metadata log, not a topic that can be deleted")
            self._logs = {key: log for key, log in self._logs.items() if key[0] != topic}
            renamed = []
            for log in doomed:
                log.close()
                target = log.directory.with_name(f"{log.directory.name}.{uuid.uuid4().hex}-delete")
                os.rename(log.directory, target)
                renamed.append(target)
            for log_dir in sorted({path.parent for path in renamed}):
                fsync_dir(log_dir)
            if topic in self.topic_configs.overrides:
                self.topic_configs.store({t: o for t, o in self.topic_configs.overrides.items() if t != topic})
            for log in doomed:
                self.log_cleaner.forget((topic, log.partition))
            self.checkpoint()
        for path in renamed:
            if os.path.islink(path):  # (an offline partition that was a link: the link goes, not its target)
                os.unlink(path)
            else:
                shutil.rmtree(path)
        return [log.directory for log in doomed]

    def config_entries(self, topic: str | None = None) -> list[ConfigEntry]:
        """Every effective setting and where its value comes from (`seglogfs config show`):
        without `topic`, the broker's (`log.dirs`, the broker-only settings, then each topic
        default under its broker name, `log.retention.ms`, …); with `topic`, the topic's, under
        the topic-level names. Values are the engine's own (the BrokerConfig, `topic_config`);
        the source is the last layer of the module docstring's order that sets the name, and
        for a broker default the name Kafka's precedence picks (`log.retention.ms` over
        `log.retention.hours`). Thread-safe."""
        if topic is None:
            return self.topic_configs.broker_entries()
        self._topic_logs(topic)  # (an unknown topic: UnknownTopicOrPartitionError)
        return self.topic_configs.entries(topic)
