"""Batch writes: executors encode, the driver's commit appends.

A write job (`df.write.format("seglog").mode("append")`) has three parts, as Spark's
DataSourceWriter has:

1. planning (`plan_write`, on the driver): the data dir's topics are read (read-only) for their
   partition counts and configs (`max.message.bytes`, `compression.type`, `cleanup.policy`), a
   job id is drawn, and the job's staging dir is made. A data dir held by a mount or a broker
   (its `.lock`) is refused here, before any work.
2. tasks (`TaskWriter`, in the executors, in parallel): each task places its rows in partitions
   as Kafka's producer does (the `partition` column; else murmur2 of the key, vectorised; a null
   key goes round-robin), encodes them into v2 batches (the compiled core, at most
   `max.message.bytes` each — and `segment.bytes`, which a log's batch cannot pass either —
   CreateTime now, the topic's codec) and appends them to its staging files, one per partition
   written and another each time one would pass the topic's `segment.bytes`
   (`<staging>/<job>/<task>.<n>.batches`); its commit message lists which files hold which
   partition's batches.
3. commit (`commit_staged`, on the driver, after every task succeeded): the data dir is opened
   writable (taking its lock), and each partition's staged files, in task order, are appended
   with offsets from the log end and Kafka's checks (CRC, size, keys on compacted topics),
   partitions in parallel (a thread each, up to the CPUs). A staging file of at least an eighth
   of `segment.bytes` (or 64 MiB) becomes a segment as it is: checked, its offsets written in
   place, renamed into the partition's directory (`PartitionLog.adopt_batches`) — the bulk of a
   large job is never copied. Smaller ones, and all of them when the staging dir is on another
   filesystem, are copied (`PartitionLog.append_batches`). A partition is all or nothing: a
   failure cuts it back to where it was (`truncate_to`). The data dir is closed (flushed,
   checkpointed) and the staging removed. `abort_staged` removes the staging of a failed job:
   nothing of it is visible.

Staging lives *beside* the log dir (`<parent>/.<logdir>.seglogfs-staging/`, or the option
`stagingDir`), not inside it: a Kafka broker refuses to load a log dir holding a directory whose
name is not `<topic>-<partition>`, and a crashed job's leftovers must not do that.

Through a mount (`path` a seglogfs mount point), planning reads the topics the mount shows, and
the commit writes each partition's staged batches to the mount's `<topic>/<p>/append.batches`,
which appends what one open wrote at its close, whole or not at all: a partition's part of a job
up to 64 MiB is all or nothing, a larger one is appended in such pieces. The mount holds the data
dir's lock and serialises the appends with everything else written through it.

A job killed outright (kill -9 of the application, a lost driver host) never aborts: its staging
dir stays, and nothing of it is visible. Each job dir names its owner (`owner.json`: the Spark
application's JVM — host, boot, pid and the pid's start time), and every job's planning removes
the job dirs whose owner is gone. While a job commits, its dir holds `committing` (the committing
process's pid): another job's planning that finds the data dir's lock held by that process waits
for it (`commitLockTimeoutMs`), where a lock held by anything else (a mount, a broker) is refused.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import json
import os
import random
import shutil
import socket
import time
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa

from seglogfs.engine import (
    CompressionType,
    DataDir,
    InvalidRecordError,
    LogDirLockedError,
    PartitionLog,
    UnknownTopicOrPartitionError,
)
from seglogfs.engine.check import log_dir_in_use
from seglogfs.engine.config import METADATA_TOPIC
from seglogfs.engine.datadir import describe_process
from seglogfs.engine.log.naming import validate_topic
from seglogfs.engine.producer import BATCHES_PER_APPEND_BYTES
from seglogfs.engine.record.records import (
    BATCH_OVERHEAD_BYTES,
    ESTIMATED_RECORD_VARINTS,
    Header,
    encode_batches,
    iter_batch_headers,
)
from seglogfs.pipeline.encoding import encode_columns
from seglogfs.pipeline.options import (
    EngineSettings,
    Location,
    OptionError,
    lowered,
    parse_engine_settings,
    parse_location,
    parse_positive,
)
from seglogfs.pipeline.partitioning import binary_parts, partitions_for_keys

STAGING_SUFFIX = ".seglogfs-staging"
DEFAULT_BATCH_BYTES = 1 << 20  # a batch per partition per this many bytes (capped by max.message.bytes)
_APPEND_CHUNK_BYTES = 64 << 20  # staged batches handed to one append_batches call
_ADOPT_MIN_BYTES = 64 << 20  # a staging file this large (or an eighth of segment.bytes) becomes a segment


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


# -- planning ------------------------------------------------------------------------------------------
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


# -- jobs: owners and leftovers ---------------------------------------------------------------------------
OWNER_FILE = "owner.json"
COMMITTING_FILE = "committing"
_UNOWNED_GRACE_S = 600  # a job dir without its owner file yet (made a moment ago) is left this long


def _boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def _start_time(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (/proc/<pid>/stat field 22): with the
    pid, it names one process (a pid is reused, not with the same start time)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat[stat.rindex(")") + 2 :].split()[19]


def _parent(pid: int) -> int:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0
    return int(stat[stat.rindex(")") + 2 :].split()[1])


def _application_pid() -> int:
    """The Spark application's JVM: the nearest ancestor named `java` (the driver's Python workers
    are its children, or its daemon's); this process when there is none (called outside Spark)."""
    pid = os.getpid()
    while pid > 1:
        try:
            if Path(f"/proc/{pid}/comm").read_text().strip() == "java":
                return pid
        except OSError:
            break
        pid = _parent(pid)
    return os.getpid()


@dataclass(frozen=True)
class Owner:
    """The process a job belongs to, as `owner.json` records it."""

    host: str
    boot_id: str
    pid: int
    started: str

    @classmethod
    def current(cls) -> Owner:
        pid = _application_pid()
        return cls(socket.gethostname(), _boot_id(), pid, _start_time(pid) or "")

    def gone(self) -> bool:
        """Whether the owner has certainly ended: this host, and a reboot since or its pid no
        longer that process. (Jobs of other hosts are never judged.)"""
        if self.host != socket.gethostname():
            return False
        if self.boot_id != _boot_id():
            return True
        return _start_time(self.pid) != self.started


def _write_owner(job_dir: Path) -> None:
    owner = Owner.current()
    temporary = job_dir / f".{OWNER_FILE}.tmp"
    temporary.write_text(json.dumps(owner.__dict__))
    temporary.rename(job_dir / OWNER_FILE)


def _read_owner(job_dir: Path) -> Owner | None:
    try:
        return Owner(**json.loads((job_dir / OWNER_FILE).read_text()))
    except (OSError, ValueError, TypeError):
        return None


def sweep_dead_jobs(staging_root: Path) -> list[Path]:
    """Remove the job dirs of `staging_root` whose owner is gone (killed jobs' leftovers);
    returns them."""
    removed: list[Path] = []
    try:
        jobs = [path for path in staging_root.iterdir() if path.name.startswith("job-")]
    except OSError:
        return removed
    for job_dir in jobs:
        owner = _read_owner(job_dir)
        if owner is None:
            try:
                dead = time.time() - job_dir.stat().st_mtime > _UNOWNED_GRACE_S
            except OSError:
                continue
        else:
            dead = owner.gone()
        if dead:
            shutil.rmtree(job_dir, ignore_errors=True)
            removed.append(job_dir)
    return removed


def _committing_pids(staging_root: Path) -> set[int]:
    pids = set()
    for marker in staging_root.glob(f"job-*/{COMMITTING_FILE}"):
        with contextlib.suppress(OSError, ValueError):
            pids.add(int(marker.read_text()))
    return pids


def _wait_for_other_commits(options: WriteOptions, staging_root: Path) -> None:
    """Refuse a data dir held by a mount or a broker; wait while another job's commit holds it."""
    deadline = time.monotonic() + options.commit_lock_timeout_ms / 1000
    for log_dir in options.location.log_dirs:
        while True:
            in_use, pid = log_dir_in_use(log_dir)
            if not in_use:
                break
            if pid in _committing_pids(staging_root) and time.monotonic() < deadline:
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
    _write_owner(Path(plan.job_dir))
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


# -- tasks ---------------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Region:
    """Bytes [position, position + length) of the staging file `file`: whole batches of one
    partition."""

    topic: str
    partition: int
    position: int
    length: int
    records: int
    file: str


@dataclass
class Staged:
    """What one task staged (its commit message's content): its regions, in the order written,
    in staging files named after the task."""

    task: str
    regions: list[Region] = field(default_factory=list)
    records: int = 0

    @property
    def files(self) -> set[str]:
        return {region.file for region in self.regions}


def _as_binary(column: pa.Array) -> pa.Array:
    """A key or value column as Arrow `binary` (strings are their UTF-8 bytes, as Spark's Kafka
    sink writes them)."""
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    return column if column.type == pa.binary() else column.cast(pa.binary())


def _header_pairs(row: Sequence[Mapping[str, object]] | None) -> list[Header]:
    if not row:
        return []
    pairs: list[Header] = []
    for entry in row:
        key, value = entry.get("key"), entry.get("value")
        if not isinstance(key, str):
            raise InvalidRecordError("a record header has a null key")
        pairs.append((key, bytes(value) if isinstance(value, bytes | bytearray) else None))
    return pairs


class TaskWriter:
    """One task's rows → its staging files: one per partition written (and another each time one
    reaches the topic's `segment.bytes`), so that the commit can make a large one a segment as
    it is. Not thread-safe (one per task)."""

    def __init__(self, plan: WritePlan, name: str) -> None:
        self.plan = plan
        self.name = name
        self.staged = Staged(name)
        self._regions: dict[tuple[str, int], list[Region]] = {}  # each partition's, one per staging file
        self._files = 0
        self._round_robin: dict[str, int] = {}
        self._now_ms = int(time.time() * 1000)

    def add(self, batch: pa.RecordBatch) -> None:
        """Encode and stage one Arrow batch of the DataFrame."""
        if batch.num_rows == 0:
            return
        if self.plan.options.topic is not None:
            self._add_topic(self.plan.options.topic, batch)
            return
        topics = batch.column("topic")
        if topics.null_count:
            raise InvalidRecordError(
                "Null topic present in the data. Use the topic option for setting a default topic."
            )
        encoded = topics.dictionary_encode()
        indices = encoded.indices.to_numpy()
        names = encoded.dictionary.to_pylist()
        if len(names) == 1:
            self._add_topic(names[0], batch)
            return
        for slot, name in enumerate(names):
            self._add_topic(name, batch.take(pa.array(np.flatnonzero(indices == slot))))

    def _partitions(self, topic: str, target: TopicTarget, batch: pa.RecordBatch, keys: pa.Array | None) -> np.ndarray:
        n = batch.num_rows
        chosen = np.full(n, -1, np.int64)
        if self.plan.columns.partition:
            given = batch.column("partition")
            explicit = given.fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int64)
            bad = (explicit >= target.partitions) | ((explicit < 0) & given.is_valid().to_numpy(zero_copy_only=False))
            if bad.any():
                wrong = int(explicit[np.flatnonzero(bad)[0]])
                raise UnknownTopicOrPartitionError(
                    f"topic {topic!r} has {target.partitions} partitions: there is no partition {wrong}"
                )
            chosen = explicit
        if keys is not None and (chosen < 0).any():
            by_key = partitions_for_keys(keys, target.partitions)
            chosen = np.where(chosen < 0, by_key, chosen)
        rest = np.flatnonzero(chosen < 0)
        if len(rest):  # null keys: round-robin from a random partition, per topic, per task
            start = self._round_robin.get(topic, random.randrange(target.partitions))
            chosen[rest] = (start + np.arange(len(rest))) % target.partitions
            self._round_robin[topic] = (start + len(rest)) % target.partitions
        return chosen

    def _add_topic(self, topic: str, batch: pa.RecordBatch) -> None:
        target = self.plan.target(topic)
        values = _as_binary(batch.column("value"))
        keys = _as_binary(batch.column("key")) if self.plan.columns.key else None
        if target.compact and (keys is None or keys.null_count):
            raise InvalidRecordError(f"topic {topic!r} is compacted (cleanup.policy=compact): every record needs a key")
        chosen = self._partitions(topic, target, batch, keys)
        headers = batch.column("headers") if self.plan.columns.headers else None
        for partition in np.unique(chosen).tolist():
            rows = (
                None if len(chosen) and (chosen == partition).all() else pa.array(np.flatnonzero(chosen == partition))
            )
            self._encode(
                topic,
                partition,
                target,
                values if rows is None else values.take(rows),
                keys=None if keys is None else keys if rows is None else keys.take(rows),
                headers=None if headers is None else headers if rows is None else headers.take(rows),
            )

    def _encode(
        self,
        topic: str,
        partition: int,
        target: TopicTarget,
        values: pa.Array,
        *,
        keys: pa.Array | None,
        headers: pa.Array | None,
    ) -> None:
        n = len(values)
        codec = self.plan.options.compression or target.compression
        header_list = None
        if headers is not None and headers.null_count < n:
            header_list = [_header_pairs(row) for row in headers.to_pylist()]
            if not any(header_list):
                header_list = None
        if header_list is None:  # column-wise, no Python object per record
            batches = encode_columns(
                values,
                keys,
                timestamp=self._now_ms,
                max_batch_bytes=target.batch_limit,
                target_batch_bytes=self.plan.options.batch_bytes,
                compression=codec,
                where=f"{topic}-{partition}",
            )
        else:
            sizes = np.maximum(binary_parts(values)[2], 0) * values.is_valid().to_numpy(zero_copy_only=False)
            sizes = sizes + ESTIMATED_RECORD_VARINTS
            key_list = None
            if keys is not None and keys.null_count < n:
                key_list = keys.to_pylist()
                sizes = sizes + np.maximum(binary_parts(keys)[2], 0)
            sizes = sizes + np.fromiter(
                (sum(len(k) + len(v or b"") + 8 for k, v in h) for h in header_list), np.int64, n
            )
            batches = encode_batches(
                values.to_pylist(),
                keys=key_list,
                headers=header_list,
                timestamps=self._now_ms,
                max_batch_bytes=target.batch_limit,
                target_batch_bytes=self.plan.options.batch_bytes,
                where=f"{topic}-{partition}",
                compression=codec,
                sizes=sizes,
            )
        self._stage(topic, partition, target.segment_bytes, batches)

    def _stage(self, topic: str, partition: int, segment_bytes: int, batches: Sequence[bytes | bytearray]) -> None:
        """Append `batches` to the partition's staging file, starting another file where one
        would pass `segment_bytes`; the partition's last region grows, or a new one starts."""
        regions = self._regions.setdefault((topic, partition), [])
        fd = -1
        try:
            for batch in batches:
                last = regions[-1] if regions else None
                if last is None or (last.length and last.length + len(batch) > segment_bytes):
                    last = Region(topic, partition, 0, 0, 0, f"{self.name}.{self._files}.batches")
                    self._files += 1
                    regions.append(last)
                    if fd >= 0:
                        os.close(fd)
                        fd = -1
                if fd < 0:
                    path = Path(self.plan.job_dir) / last.file
                    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644)
                view = memoryview(batch)
                while view:
                    view = view[os.write(fd, view) :]
                records = int.from_bytes(batch[BATCH_OVERHEAD_BYTES - 4 : BATCH_OVERHEAD_BYTES], "big")
                regions[-1] = dataclasses.replace(last, length=last.length + len(batch), records=last.records + records)
                self.staged.records += records
        finally:
            if fd >= 0:
                os.close(fd)

    def finish(self) -> Staged:
        self.staged.regions = [region for regions in self._regions.values() for region in regions]
        return self.staged

    def abandon(self) -> None:
        for regions in self._regions.values():
            for region in regions:
                with contextlib.suppress(OSError):
                    (Path(self.plan.job_dir) / region.file).unlink()


def write_task(plan: WritePlan, batches: Iterable[pa.RecordBatch]) -> Staged:
    """A task's whole part of a write: every Arrow batch staged, its file closed."""
    writer = TaskWriter(plan, f"task-{uuid.uuid4().hex}")
    try:
        for batch in batches:
            writer.add(batch)
    except BaseException:
        writer.abandon()
        raise
    return writer.finish()


# -- commit and abort ------------------------------------------------------------------------------------
def open_writable(plan: WritePlan) -> DataDir:
    """The data dir opened for writing; its lock is retried for `commitLockTimeoutMs` (another
    job's commit holds it for a moment)."""
    broker = plan.options.engine.broker_config(plan.options.location.log_dirs)
    deadline = time.monotonic() + plan.options.commit_lock_timeout_ms / 1000
    while True:
        try:
            return DataDir.open(broker, now_ms=int(time.time() * 1000))
        except LogDirLockedError:
            if time.monotonic() >= deadline:
                raise
            time.sleep(0.2)


def staged_chunks(job_dir: Path, regions: Sequence[tuple[str, Region]]) -> Iterator[bytes]:
    """The staged bytes of `regions` (file, region), in order, in chunks of whole batches (of
    about `_APPEND_CHUNK_BYTES`; a region larger than that alone)."""
    parts: list[bytes] = []
    size = 0
    for name, region in regions:
        with open(job_dir / name, "rb") as staged:
            data = os.pread(staged.fileno(), region.length, region.position)
        if len(data) != region.length:
            raise OSError(f"{job_dir / name}: staged batches cut short ({len(data)} of {region.length} bytes)")
        if parts and size + len(data) > _APPEND_CHUNK_BYTES:
            yield parts[0] if len(parts) == 1 else b"".join(parts)
            parts, size = [], 0
        parts.append(data)
        size += len(data)
    if parts:
        yield parts[0] if len(parts) == 1 else b"".join(parts)


def regions_by_partition(staged: Iterable[Staged | None]) -> dict[tuple[str, int], list[tuple[str, Region]]]:
    """The tasks' staged regions per partition, (file, region) in task order."""
    by_partition: dict[tuple[str, int], list[tuple[str, Region]]] = {}
    for message in staged:
        if message is None:
            raise RuntimeError("a task of the write job sent no commit message")
        for region in message.regions:
            if region.length:
                by_partition.setdefault((region.topic, region.partition), []).append((region.file, region))
    return by_partition


def _adoptable(job_dir: Path, region: Region, segment_bytes: int) -> bool:
    """Whether a staged region is best made a segment as it is: a whole staging file, at most
    `segment.bytes`, and large enough not to leave a small segment behind (an eighth of
    `segment.bytes`, or 64 MiB)."""
    if region.position or region.length < min(segment_bytes // 8, _ADOPT_MIN_BYTES) or region.length > segment_bytes:
        return False
    try:
        return os.stat(job_dir / region.file).st_size == region.length
    except OSError:
        return False


def _copy_staged(log: PartitionLog, job_dir: Path, regions: Sequence[tuple[str, Region]]) -> None:
    for chunk in staged_chunks(job_dir, regions):
        log.append_batches(chunk, assign_offsets=True, now_ms=int(time.time() * 1000))


def _append_partition(data_dir: DataDir, job_dir: Path, topic: str, partition: int, regions: list) -> int:
    """One partition's staged batches appended, all or nothing (cut back on any failure). A
    large staging file becomes a segment by a rename (`PartitionLog.adopt_batches`); the rest is
    copied (`append_batches`), as is everything when the staging dir is on another filesystem."""
    log = data_dir.partition(topic, partition)
    log_end = log.log_end_offset
    rename = True
    try:
        copied: list[tuple[str, Region]] = []  # regions to copy, in order, before the next adoption
        for name, region in regions:
            if not (rename and _adoptable(job_dir, region, log.config.segment_bytes)):
                copied.append((name, region))
                continue
            _copy_staged(log, job_dir, copied)
            copied = []
            try:
                log.adopt_batches(job_dir / name, now_ms=int(time.time() * 1000))
            except OSError as error:
                if error.errno != errno.EXDEV:
                    raise
                rename = False
                copied.append((name, region))
        _copy_staged(log, job_dir, copied)
    except BaseException:
        if log.log_end_offset > log_end:
            log.truncate_to(log_end, int(time.time() * 1000))
        raise
    return sum(region.records for _, region in regions)


def commit_staged(plan: WritePlan, staged: Iterable[Staged | None]) -> dict[tuple[str, int], int]:
    """Append every partition's staged batches (see the module docstring), partitions in
    parallel (a thread each, up to the CPUs: reads, CRCs and writes release the GIL); returns
    the records appended per partition. Raises the first failure once every partition is done:
    a partition that failed is cut back, the others stay appended."""
    job_dir = Path(plan.job_dir)
    by_partition = regions_by_partition(staged)
    if plan.options.location.mount_point is not None:
        try:
            return _commit_through_mount(plan.options.location.mount_point, job_dir, by_partition)
        finally:
            abort_staged(plan)
    appended: dict[tuple[str, int], int] = {}
    try:
        (job_dir / COMMITTING_FILE).write_text(str(os.getpid()))
        with open_writable(plan) as data_dir:  # (a failure to close never hides the commit's error)
            create_topics(plan, data_dir, {topic for topic, _ in by_partition})
            workers = max(1, min(len(by_partition), os.cpu_count() or 1))
            with ThreadPoolExecutor(workers, thread_name_prefix="seglog-commit") as pool:
                futures = {
                    key: pool.submit(_append_partition, data_dir, job_dir, key[0], key[1], regions)
                    for key, regions in by_partition.items()
                }
            failures = [future.exception() for future in futures.values() if future.exception() is not None]
            if failures:
                raise failures[0]  # type: ignore[misc]
            appended = {key: future.result() for key, future in futures.items()}
    finally:
        abort_staged(plan)
    return appended


def staged_batches_in_pieces(job_dir: Path, regions: Sequence[tuple[str, Region]], limit: int) -> Iterator[bytes]:
    """The staged batches of `regions`, in order, in pieces of whole batches of at most `limit`
    bytes (a batch over it, which max.message.bytes forbids anyway, alone)."""
    piece = bytearray()
    for data in staged_chunks(job_dir, regions):
        for header in iter_batch_headers(data):
            if piece and len(piece) + header.size_in_bytes > limit:
                yield bytes(piece)
                piece = bytearray()
            piece += data[header.position : header.next_position]
    if piece:
        yield bytes(piece)


def _commit_through_mount(
    mount: Path, job_dir: Path, by_partition: Mapping[tuple[str, int], Sequence[tuple[str, Region]]]
) -> dict[tuple[str, int], int]:
    """Each partition's staged batches written to `<mount>/<topic>/<p>/append.batches`, each
    piece of up to 64 MiB in one open appended whole or not at all (a partition under 64 MiB:
    all or nothing); fsync makes them durable and reports the append's error."""
    appended: dict[tuple[str, int], int] = {}
    for (topic, partition), regions in by_partition.items():
        target = mount / topic / str(partition) / "append.batches"
        for piece in staged_batches_in_pieces(job_dir, regions, BATCHES_PER_APPEND_BYTES):
            fd = os.open(target, os.O_WRONLY | os.O_CLOEXEC)
            try:
                view = memoryview(piece)
                while view:
                    view = view[os.write(fd, view) :]
                os.fsync(fd)
            except OSError as error:
                raise OSError(error.errno, f"appending to {target}: {error.strerror}") from None
            finally:
                with contextlib.suppress(OSError):  # (fsync reported the append's error)
                    os.close(fd)
        appended[(topic, partition)] = sum(region.records for _, region in regions)
    return appended


def create_topics(plan: WritePlan, data_dir: DataDir, topics: set[str]) -> None:
    """Create the topics the job wrote that the data dir does not have (auto.create.topics.enable),
    with the partition count the tasks used; a topic made meanwhile must have that count."""
    existing = data_dir.topics()
    for topic in sorted(topics):
        target = plan.target(topic)
        if topic not in existing:
            data_dir.create_topic(topic, target.partitions, now_ms=int(time.time() * 1000))
        elif len(existing[topic]) != target.partitions and not target.exists:
            raise UnknownTopicOrPartitionError(
                f"topic {topic!r} was created with {len(existing[topic])} partitions while the job wrote for "
                f"{target.partitions}; nothing of the job was appended to it"
            )


def abort_staged(plan: WritePlan) -> None:
    """Remove the job's staging dir (and the staging root once empty)."""
    job_dir = Path(plan.job_dir)
    shutil.rmtree(job_dir, ignore_errors=True)
    with contextlib.suppress(OSError):
        os.rmdir(job_dir.parent)
