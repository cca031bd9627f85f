"""Batch writes (`df.write.format("seglog").mode("append")`): the options and the plan.

A write job has three parts, as Spark's DataSourceWriter has:

1. planning (`plan_write`, here, on the driver): the data dir's topics are read (read-only) for
   their partition counts and configs (`max.message.bytes`, `compression.type`,
   `cleanup.policy`, `segment.bytes`), a job id is drawn, and the job's staging dir is made
   (`pipeline.staging`, which also sweeps killed jobs' leftovers). A data dir held by a mount or
   a broker (its `.lock`) is refused here, before any work. Through a mount (`path` a seglogfs
   mount point), planning reads the topics the mount shows.
2. tasks (`pipeline.task_writer`, in the executors, in parallel): rows → partitions → v2
   batches → staging files; each task's commit message lists what it staged.
3. commit (`pipeline.commit`, on the driver, after every task succeeded): each partition's staged
   batches appended to the data dir (or through the mount), all or nothing per partition.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from seglogfs.engine import (
    CompressionType,
    DataDir,
    InvalidRecordError,
    LogDirLockedError,
    UnknownTopicOrPartitionError,
)
from seglogfs.engine.check import log_dir_in_use
from seglogfs.engine.config import METADATA_TOPIC
from seglogfs.engine.datadir import describe_process
from seglogfs.engine.log.naming import validate_topic
from seglogfs.engine.object_store import parse_location as object_location
from seglogfs.pipeline.options import (
    EngineSettings,
    Location,
    OptionError,
    lowered,
    parse_engine_settings,
    parse_location,
    parse_positive,
)
from seglogfs.pipeline.staging import STAGING_SUFFIX, committing_pids, sweep_dead_jobs, write_owner

DEFAULT_BATCH_BYTES = 1 << 20  # a batch per partition per this many bytes (capped by max.message.bytes)


@dataclass(frozen=True)
class WriteOptions:
    """A batch write's options."""

    location: Location
    engine: EngineSettings
    topic: str | None = None
    compression: CompressionType | None = None  # kafka.compression.type; else the topic's
    batch_bytes: int = DEFAULT_BATCH_BYTES  # kafka.batch.size
    staging_dir: Path | None = None
    commit_lock_timeout_ms: int = 10_000


def parse_write_options(raw: Mapping[str, str]) -> WriteOptions:
    options = lowered(raw)
    location = parse_location(options)
    if location.store_uri is not None:
        raise OptionError(
            f"path {object_location(location.store_uri).display}: object storage is read, not written: write to a "
            "data dir or a seglogfs mount, and copy it to the bucket with `seglogfs backup DATADIR URI`"
        )
    compression = None
    if "kafka.compression.type" in options:
        compression = CompressionType.from_name(options["kafka.compression.type"])
    batch_bytes = parse_positive(options, "kafka.batch.size") or DEFAULT_BATCH_BYTES
    timeout = options.get("commitlocktimeoutms", "10000").strip()
    if not timeout.isdigit():
        raise OptionError(f"commitLockTimeoutMs must be a non-negative integer, not {timeout!r}")
    topic = options.get("topic")
    if topic is not None:
        validate_topic(topic)
    staging = options.get("stagingdir")
    return WriteOptions(
        location=location,
        engine=parse_engine_settings(options),
        topic=topic,
        compression=compression,
        batch_bytes=batch_bytes,
        staging_dir=Path(staging) if staging else None,
        commit_lock_timeout_ms=int(timeout),
    )


@dataclass(frozen=True)
class TopicTarget:
    """What a task needs to know of a topic: partitions and the limits of its config."""

    partitions: int
    max_message_bytes: int
    compression: CompressionType
    compact: bool
    exists: bool
    segment_bytes: int = 1 << 30  # a staging file holds at most this much (it may become a segment)

    @property
    def batch_limit(self) -> int:
        """The largest batch the log takes: `max.message.bytes`, and `segment.bytes` where smaller."""
        return min(self.max_message_bytes, self.segment_bytes)


@dataclass(frozen=True)
class Columns:
    """Which optional columns the DataFrame has (`value` always)."""

    key: bool = False
    topic: bool = False
    partition: bool = False
    headers: bool = False


@dataclass(frozen=True)
class WritePlan:
    """Everything the tasks and the commit share (pickled with the writer)."""

    options: WriteOptions
    columns: Columns
    job_dir: str
    targets: Mapping[str, TopicTarget]
    new_topic: TopicTarget | None  # for topics the data dir does not have; None: no auto-creation

    def target(self, topic: str) -> TopicTarget:
        found = self.targets.get(topic)
        if found is not None:
            return found
        if topic == METADATA_TOPIC:
            raise InvalidRecordError(f"{topic} is the broker's metadata log: it takes no appends")
        if self.new_topic is None:
            raise UnknownTopicOrPartitionError(f"unknown topic {topic!r} (auto.create.topics.enable=false)")
        validate_topic(topic)
        return self.new_topic


def staging_root_of(options: WriteOptions) -> Path:
    if options.staging_dir is not None:
        return options.staging_dir
    location = options.location
    first = (location.mount_point if location.mount_point is not None else location.log_dirs[0]).resolve()
    return first.parent / f".{first.name}{STAGING_SUFFIX}"


def _codec(name: str) -> CompressionType:
    return CompressionType.NONE if name == "producer" else CompressionType.from_name(name)


def _wait_for_other_commits(options: WriteOptions, staging_root: Path) -> None:
    """Refuse a data dir held by a mount or a broker; wait while another job's commit holds it."""
    deadline = time.monotonic() + options.commit_lock_timeout_ms / 1000
    for log_dir in options.location.log_dirs:
        while True:
            in_use, pid = log_dir_in_use(log_dir)
            if not in_use:
                break
            if pid in committing_pids(staging_root) and time.monotonic() < deadline:
                time.sleep(0.1)
                continue
            raise LogDirLockedError(
                f"{log_dir}: data dir is in use by {describe_process(pid)}; a Spark write needs it free at commit "
                "(a mount or a broker holds it: write through the mount's directory instead)"
            )


def plan_write(options: WriteOptions, columns: Columns, now_ms: int) -> WritePlan:
    """Check the destination, read its topics, make the job's staging dir (removing killed
    jobs' leftovers)."""
    staging_root = staging_root_of(options)
    sweep_dead_jobs(staging_root)
    if not options.location.mounted:  # (a mount holds its data dir's lock: the commit goes through it)
        _wait_for_other_commits(options, staging_root)
    plan = plan_targets(options, columns, staging_root / f"job-{uuid.uuid4().hex}", now_ms)
    Path(plan.job_dir).mkdir(parents=True)
    write_owner(Path(plan.job_dir))
    return plan


def plan_targets(options: WriteOptions, columns: Columns, job_dir: Path, now_ms: int) -> WritePlan:
    """The plan of a write staging in `job_dir`: the data dir's topics (read-only) and what a
    new topic would be."""
    if options.location.mount_point is not None:
        return _plan_through_mount(options, columns, job_dir, options.location.mount_point)
    broker = options.engine.broker_config(options.location.log_dirs)
    targets: dict[str, TopicTarget] = {}
    if all(log_dir.is_dir() for log_dir in options.location.log_dirs):
        with DataDir.open(broker, read_only=True, now_ms=now_ms) as data_dir:
            for topic, partitions in data_dir.topics().items():
                config = data_dir.topic_config(topic)
                targets[topic] = TopicTarget(
                    len(partitions),
                    config.max_message_bytes,
                    _codec(config.compression_type),
                    config.compact,
                    True,
                    config.segment_bytes,
                )
    defaults = broker.topic_defaults
    new_topic = None
    if broker.auto_create_topics_enable:
        new_topic = TopicTarget(
            broker.num_partitions,
            defaults.max_message_bytes,
            _codec(defaults.compression_type),
            defaults.compact,
            False,
            defaults.segment_bytes,
        )
    if not columns.topic and options.topic is None:
        raise OptionError("topic option required when no 'topic' attribute is present")
    plan = WritePlan(options, columns, str(job_dir), targets, new_topic)
    if options.topic is not None:
        plan.target(options.topic)  # an unknown topic without auto-creation fails now
    return plan


def _plan_through_mount(options: WriteOptions, columns: Columns, job_dir: Path, mount: Path) -> WritePlan:
    """Targets as the mount shows them: its topic directories, their partitions, and each topic's
    effective config from its partition 0's `status`. Topics are not created through a mount's
    writes (`mkdir <mount>/<topic>` creates one)."""
    targets: dict[str, TopicTarget] = {}
    for topic_dir in sorted(mount.iterdir()):
        if topic_dir.name.startswith(".") or not topic_dir.is_dir():
            continue
        partitions = sorted((child for child in topic_dir.iterdir() if child.name.isdigit()), key=lambda p: int(p.name))
        if not partitions:
            continue
        # (a broker's data dir may hold only some of a topic's partitions: the first one there)
        config = json.loads((partitions[0] / "status").read_text())["config"]
        targets[topic_dir.name] = TopicTarget(
            len(partitions),
            int(config["max.message.bytes"]),
            _codec(config["compression.type"]),
            "compact" in config["cleanup.policy"].split(","),
            True,
            int(config.get("segment.bytes", 1 << 30)),
        )
    if not columns.topic and options.topic is None:
        raise OptionError("topic option required when no 'topic' attribute is present")
    plan = WritePlan(options, columns, str(job_dir), targets, None)
    if options.topic is not None and options.topic not in targets:
        raise UnknownTopicOrPartitionError(
            f"unknown topic {options.topic!r} on the mount {mount}: create it first (mkdir {mount / options.topic})"
        )
    return plan
