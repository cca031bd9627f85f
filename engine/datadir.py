"""A data dir: one or more Kafka log dirs (`log.dirs`) and the partitions in them (Kafka's
LogManager, for one broker).

Each log dir holds `<topic>-<partition>/` dirs and, at its root, Kafka's files:

    .lock                               held (POSIX record lock) by the process that writes
    .kafka_cleanshutdown                present only after a clean close
    recovery-point-offset-checkpoint    offset checkpoints, see engine.checkpoint
    log-start-offset-checkpoint         (only partitions whose start is above their first segment)
    replication-offset-checkpoint       high watermarks
    cleaner-offset-checkpoint
    .seglogfs-topic-configs.json        per-topic config overrides (first log dir only)

Kafka keeps topic overrides in its metadata, not in log dirs; the JSON file is the one file
seglogfs adds, a dot file that a broker reading the dir ignores.

Opening for writing takes every `.lock` (a second writer gets LogDirLockedError naming the
holder), then loads partitions, recovering them after an unclean stop. Opening read-only takes no
lock and writes nothing: it reads what a writer has made durable so far, whole batches only.
"""

from __future__ import annotations

import base64
import fcntl
import json
import logging
import os
import struct
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from seglogfs.engine.checkpoint import (
    CLEAN_SHUTDOWN_FILE,
    CLEANER_OFFSET_CHECKPOINT,
    LOG_START_OFFSET_CHECKPOINT,
    RECOVERY_POINT_CHECKPOINT,
    REPLICATION_OFFSET_CHECKPOINT,
    CheckpointError,
    fsync_dir,
    read_offset_checkpoint,
    write_atomically,
    write_offset_checkpoint,
)
from seglogfs.engine.cleaner import Cleaner, CleanResult, earliest_delete_horizon
from seglogfs.engine.cleaner_manager import LogToClean, filthiest, log_to_clean
from seglogfs.engine.config import BrokerConfig, LogConfig, validate_topic_overrides
from seglogfs.engine.errors import (
    ConfigError,
    EngineError,
    LogDirLockedError,
    ReadOnlyError,
    TopicExistsError,
    UnknownTopicOrPartitionError,
)
from seglogfs.engine.log import PartitionLog
from seglogfs.engine.naming import partition_dir_name, partition_dirs, validate_topic
from seglogfs.engine.retention import RetentionDecision

logger = logging.getLogger(__name__)

LOCK_FILE = ".lock"
TOPIC_CONFIGS_FILE = ".seglogfs-topic-configs.json"
TopicPartition = tuple[str, int]
_LOCKED_HERE: set[str] = set()


def new_topic_id() -> str:
    """A topic id as Kafka prints one: 16 random bytes, URL-safe base64, no padding."""
    return base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode("ascii")


def _lock_holder(fd: int) -> int | None:
    """PID holding a conflicting POSIX lock on `fd`, if the kernel will tell."""
    request = struct.pack("@hhqqi", fcntl.F_WRLCK, os.SEEK_SET, 0, 0, 0) + bytes(4)
    try:
        answer = fcntl.fcntl(fd, fcntl.F_GETLK, request)
    except OSError:
        return None
    _type, _whence, _start, _len, pid = struct.unpack_from("@hhqqi", answer)
    return pid or None


def _describe_pid(pid: int) -> str:
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return f"process {pid}"
    return f"process {pid} ({cmdline[:120]})"


@dataclass
class CleanupReport:
    """What one cleanup pass did: retention per partition, compaction passes, and the
    partitions the cleaner gave up on (with the reason; they are left as they were)."""

    retention: list[tuple[PartitionLog, RetentionDecision]] = field(default_factory=list)
    compaction: list[CleanResult] = field(default_factory=list)
    failed: list[tuple[TopicPartition, str]] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.retention or self.compaction or self.failed)


class DataDir:
    """The partitions of one broker's log dirs. Not thread-safe for topic creation; each
    partition's own operations follow PartitionLog's rules."""

    def __init__(self, config: BrokerConfig, *, writable: bool, recover_all: bool = False) -> None:
        """Use `DataDir.open`."""
        self.config = config
        self.writable = writable
        self._lock_fds: list[tuple[str, int]] = []
        self._logs: dict[TopicPartition, PartitionLog] = {}
        self._topic_overrides: dict[str, dict[str, str]] = {}
        self._recover_all = recover_all
        self._closed = False
        self._cleaner = Cleaner(config.log_cleaner_dedupe_buffer_size, config.log_cleaner_io_buffer_load_factor)
        self._cleaner_checkpoints: dict[TopicPartition, int] = {}
        self._cleaner_checkpoints_written: dict[TopicPartition, int] | None = None
        self._uncleanable: dict[TopicPartition, str] = {}
        self._delete_horizons: dict[TopicPartition, int | None] = {}

    @classmethod
    def open(cls, config: BrokerConfig, *, read_only: bool = False, recover_all: bool = False, now_ms: int) -> DataDir:
        """Open every log dir (creating missing ones when writable) and load its partitions.
        `recover_all` checks and repairs every segment, whatever the last stop was (repair)."""
        data_dir = cls(config, writable=not read_only, recover_all=recover_all and not read_only)
        try:
            data_dir._open(now_ms)
        except BaseException:
            data_dir._release_locks()
            raise
        return data_dir

    def _open(self, now_ms: int) -> None:
        for log_dir in self.config.log_dirs:
            if self.writable:
                log_dir.mkdir(parents=True, exist_ok=True)
                self._take_lock(log_dir)
            elif not log_dir.is_dir():
                raise UnknownTopicOrPartitionError(f"{log_dir}: no such data dir")
        self._topic_overrides = self._read_topic_overrides()
        for log_dir in self.config.log_dirs:
            self._load_log_dir(log_dir, now_ms)

    def _take_lock(self, log_dir: Path) -> None:
        # POSIX record locks, as Kafka's FileChannel.tryLock takes, so that seglogfs and a broker
        # exclude each other. They are per process, hence the table for this process's own opens.
        path = log_dir / LOCK_FILE
        key = os.path.realpath(path)
        if key in _LOCKED_HERE:
            raise LogDirLockedError(f"{log_dir}: data dir is already open in this process (lock file {path})")
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            holder = _lock_holder(fd)
            os.close(fd)
            who = _describe_pid(holder) if holder else "another process"
            raise LogDirLockedError(f"{log_dir}: data dir is in use by {who} (lock file {path})") from None
        _LOCKED_HERE.add(key)
        self._lock_fds.append((key, fd))

    def _release_locks(self) -> None:
        for key, fd in self._lock_fds:
            os.close(fd)  # closing the descriptor drops the POSIX lock
            _LOCKED_HERE.discard(key)
        self._lock_fds = []

    def _load_log_dir(self, log_dir: Path, now_ms: int) -> None:
        marker = log_dir / CLEAN_SHUTDOWN_FILE
        clean = marker.exists()
        try:
            recovery_points = read_offset_checkpoint(log_dir / RECOVERY_POINT_CHECKPOINT)
            start_offsets = read_offset_checkpoint(log_dir / LOG_START_OFFSET_CHECKPOINT)
        except CheckpointError:
            if self.writable:
                # Kafka treats an unreadable checkpoint as "recover everything".
                recovery_points, start_offsets, clean = {}, {}, False
            else:
                recovery_points, start_offsets = {}, {}
        if self._recover_all:
            recovery_points, clean = {}, False
        try:
            self._cleaner_checkpoints.update(read_offset_checkpoint(log_dir / CLEANER_OFFSET_CHECKPOINT))
        except CheckpointError as error:
            logger.warning("%s; compaction starts again from each log's start", error)
        for name, topic, partition in partition_dirs(log_dir):
            if (topic, partition) in self._logs:
                raise EngineError(f"{log_dir / name}: partition {topic}-{partition} is in two log dirs")
            self._logs[(topic, partition)] = PartitionLog.open(
                log_dir / name,
                topic,
                partition,
                self.topic_config(topic),
                writable=self.writable,
                clean_shutdown=clean,
                recovery_point=recovery_points.get((topic, partition), 0),
                log_start_offset=start_offsets.get((topic, partition), 0),
                now_ms=now_ms,
            )
        if self.writable and marker.exists():
            # From now on the dir is in use: a crash must not look like a clean stop.
            marker.unlink()
            fsync_dir(log_dir)

    # -- topic configs ---------------------------------------------------------------------------
    @property
    def _topic_configs_path(self) -> Path:
        return self.config.log_dirs[0] / TOPIC_CONFIGS_FILE

    def _read_topic_overrides(self) -> dict[str, dict[str, str]]:
        path = self._topic_configs_path
        try:
            document = json.loads(path.read_text(encoding="utf-8"))
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

    def _write_topic_overrides(self) -> None:
        document = {
            "version": 1,
            "topics": {t: dict(sorted(o.items())) for t, o in sorted(self._topic_overrides.items()) if o},
        }
        write_atomically(self._topic_configs_path, json.dumps(document, indent=2) + "\n")

    def topic_overrides(self, topic: str) -> dict[str, str]:
        return dict(self._topic_overrides.get(topic, {}))

    def topic_config(self, topic: str) -> LogConfig:
        overrides = self._topic_overrides.get(topic)
        return self.config.log_config(overrides, f"config of topic {topic}")

    def set_topic_overrides(self, topic: str, overrides: Mapping[str, str]) -> LogConfig:
        """Replace a topic's config overrides (kafka-configs --alter, the whole set at once):
        checked first, stored, then in effect for every partition of the topic. Raises
        ConfigError for an unknown name or a bad value, changing nothing."""
        self._check_writable()
        logs = [log for (t, _), log in sorted(self._logs.items()) if t == topic]
        if not logs:
            raise UnknownTopicOrPartitionError(f"unknown topic {topic!r}")
        source = f"config of topic {topic}"
        checked = validate_topic_overrides(overrides, source)
        config = self.config.log_config(checked, source)
        self._topic_overrides[topic] = checked
        self._write_topic_overrides()
        for log in logs:
            with log.lock:
                log.config = config
        return config

    # -- topics and partitions ------------------------------------------------------------------
    def topics(self) -> dict[str, list[int]]:
        """Topic → its partitions, sorted."""
        out: dict[str, list[int]] = {}
        for topic, partition in sorted(self._logs):
            out.setdefault(topic, []).append(partition)
        return out

    def partitions(self) -> Iterator[PartitionLog]:
        for key in sorted(self._logs):
            yield self._logs[key]

    def partition(self, topic: str, partition: int) -> PartitionLog:
        log = self._logs.get((topic, partition))
        if log is None:
            if any(t == topic for t, _ in self._logs):
                raise UnknownTopicOrPartitionError(f"topic {topic!r} has no partition {partition}")
            raise UnknownTopicOrPartitionError(f"unknown topic {topic!r}")
        return log

    def _check_writable(self) -> None:
        if not self.writable:
            raise ReadOnlyError("the data dir is open read-only")

    def create_topic(
        self, topic: str, partitions: int | None = None, overrides: Mapping[str, str] | None = None, *, now_ms: int
    ) -> list[PartitionLog]:
        """Create `topic` with `partitions` (default `num.partitions`) and config overrides."""
        self._check_writable()
        validate_topic(topic)
        if any(t == topic for t, _ in self._logs):
            raise TopicExistsError(f"topic {topic!r} exists already")
        count = self.config.num_partitions if partitions is None else partitions
        if count < 1:
            raise ConfigError(f"topic {topic!r}: partition count must be at least 1, not {count}")
        checked = validate_topic_overrides(overrides or {}, f"config of topic {topic}")
        if checked:
            self._topic_overrides[topic] = checked
            self._write_topic_overrides()
        config = self.topic_config(topic)
        topic_id = new_topic_id()
        created = []
        for partition in range(count):
            directory = self._least_loaded_log_dir() / partition_dir_name(topic, partition)
            log = PartitionLog.create(directory, topic, partition, config, topic_id=topic_id, now_ms=now_ms)
            self._logs[(topic, partition)] = log
            created.append(log)
        for log_dir in self.config.log_dirs:
            fsync_dir(log_dir)
        return created

    def partition_for_append(self, topic: str, partition: int | None, *, now_ms: int) -> list[PartitionLog]:
        """The partitions of `topic` to produce to, creating the topic with `num.partitions` when
        it is unknown and `auto.create.topics.enable` holds (as a broker does on produce)."""
        if not any(t == topic for t, _ in self._logs):
            if not self.config.auto_create_topics_enable:
                raise UnknownTopicOrPartitionError(f"unknown topic {topic!r} (auto.create.topics.enable=false)")
            self.create_topic(topic, now_ms=now_ms)
        if partition is not None:
            return [self.partition(topic, partition)]
        return [self._logs[(topic, p)] for p in self.topics()[topic]]

    def _least_loaded_log_dir(self) -> Path:
        counts = dict.fromkeys(self.config.log_dirs, 0)
        for log in self._logs.values():
            counts[log.directory.parent] = counts.get(log.directory.parent, 0) + 1
        return min(self.config.log_dirs, key=lambda d: counts[d])

    # -- cleanup ------------------------------------------------------------------------------------
    def clean(self, now_ms: int) -> CleanupReport:
        """One full cleanup pass: retention over every partition, removal of deleted segments
        whose `file.delete.delay.ms` has passed, then compaction of every compacted log that is
        cleanable (`seglogfs clean`)."""
        report = CleanupReport(retention=self.delete_old_segments(now_ms))
        compacted = self.compact(now_ms)
        report.compaction, report.failed = compacted.compaction, compacted.failed
        return report

    def delete_old_segments(self, now_ms: int) -> list[tuple[PartitionLog, RetentionDecision]]:
        """One retention pass over every partition, then removal of deleted segments whose
        `file.delete.delay.ms` has passed; returns what each partition deleted."""
        self._check_writable()
        done = []
        for log_ in self.partitions():
            decision = log_.delete_old_segments(now_ms)
            log_.delete_pending(now_ms)
            if decision:
                done.append((log_, decision))
        if done:
            self.checkpoint()
        return done

    def cleanable_logs(self, now_ms: int) -> list[LogToClean]:
        """Every compacted log's cleaning state now (uncleanable ones left out). A cleaner
        checkpoint outside its log is reset to the log start here, as Kafka does."""
        candidates = []
        for key, log_ in self._logs.items():
            if not log_.config.compact or key in self._uncleanable:
                continue
            candidate = log_to_clean(log_, self._cleaner_checkpoints.get(key), now_ms)
            self._cleaner_checkpoints[key] = candidate.first_dirty_offset
            candidates.append(candidate)
        return candidates

    def _delete_horizon_due(self, candidate: LogToClean, now_ms: int) -> bool:
        """Whether tombstones stamped by an earlier pass may now go (the pass then rewrites the
        clean section even though nothing is dirty)."""
        key = (candidate.log.topic, candidate.log.partition)
        if key not in self._delete_horizons:
            self._delete_horizons[key] = earliest_delete_horizon(candidate.log, candidate.first_dirty_offset)
        horizon = self._delete_horizons[key]
        return horizon is not None and horizon <= now_ms

    def compact(self, now_ms: int) -> CleanupReport:
        """Clean every cleanable compacted log once, filthiest first (one cleaner thread's
        work); a log whose cleaning fails is marked uncleanable and left as it was, and the
        others go on. Updates `cleaner-offset-checkpoint`."""
        self._check_writable()
        report = CleanupReport()
        if not self.config.log_cleaner_enable:
            return report
        done: set[TopicPartition] = set()
        try:
            while True:
                candidates = [c for c in self.cleanable_logs(now_ms) if (c.log.topic, c.log.partition) not in done]
                chosen = filthiest(candidates)
                if chosen is None:
                    chosen = next((c for c in candidates if self._delete_horizon_due(c, now_ms)), None)
                if chosen is None:
                    break
                key = (chosen.log.topic, chosen.log.partition)
                done.add(key)
                try:
                    result = self._cleaner.clean(chosen, now_ms)
                except EngineError as error:
                    self._uncleanable[key] = str(error)
                    report.failed.append((key, str(error)))
                    logger.error("cleaning %s-%d failed, leaving it uncleanable: %s", key[0], key[1], error)
                    continue
                self._cleaner_checkpoints[key] = result.next_dirty_offset
                self._delete_horizons[key] = result.stats.earliest_delete_horizon
                report.compaction.append(result)
                self._write_cleaner_checkpoints()
        finally:
            self._cleaner.release()
            self._write_cleaner_checkpoints()  # reset ones too, even when nothing was cleaned
        return report

    def _write_cleaner_checkpoints(self) -> None:
        """Write `cleaner-offset-checkpoint` of every log dir, when it changed since the last
        write (the scheduler asks every log.cleaner.backoff.ms)."""
        current = {key: offset for key, offset in self._cleaner_checkpoints.items() if key in self._logs}
        if current == self._cleaner_checkpoints_written:
            return
        self._cleaner_checkpoints_written = current
        for log_dir in self.config.log_dirs:
            write_offset_checkpoint(
                log_dir / CLEANER_OFFSET_CHECKPOINT,
                {
                    key: offset
                    for key, offset in self._cleaner_checkpoints.items()
                    if key in self._logs and self._logs[key].directory.parent == log_dir
                },
            )

    # -- checkpoints and closing -------------------------------------------------------------------
    def checkpoint(self) -> None:
        """Write the root checkpoints of every log dir from the partitions' offsets now."""
        self._check_writable()
        self._write_cleaner_checkpoints()
        for log_dir in self.config.log_dirs:
            logs = [log for log in self._logs.values() if log.directory.parent == log_dir]
            write_offset_checkpoint(
                log_dir / RECOVERY_POINT_CHECKPOINT, {(log.topic, log.partition): log.recovery_point for log in logs}
            )
            write_offset_checkpoint(
                log_dir / REPLICATION_OFFSET_CHECKPOINT,
                {(log.topic, log.partition): log.high_watermark for log in logs},
            )
            write_offset_checkpoint(
                log_dir / LOG_START_OFFSET_CHECKPOINT,
                {
                    (log.topic, log.partition): log.log_start_offset
                    for log in logs
                    if log.log_start_offset > log.segments[0].base_offset
                },
            )

    def flush(self) -> None:
        """fsync every partition and write the checkpoints."""
        self._check_writable()
        for log in self._logs.values():
            log.flush()
        self.checkpoint()

    def close(self) -> None:
        """Flush, close every partition, write the checkpoints and `.kafka_cleanshutdown`, and
        release the locks: the state Kafka leaves after a clean shutdown. Safe to call twice."""
        if self._closed:
            return
        self._closed = True
        try:
            for log in self._logs.values():
                log.close()
            if self.writable:
                self.checkpoint()
                for log_dir in self.config.log_dirs:
                    write_atomically(log_dir / CLEAN_SHUTDOWN_FILE, "")
        finally:
            self._release_locks()

    def __enter__(self) -> DataDir:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
