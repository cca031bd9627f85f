"""A data dir: one or more Kafka log dirs (`log.dirs`) and the partitions in them (Kafka's
LogManager, for one broker).

Each log dir holds `<topic>-<partition>/` dirs and, at its root, Kafka's files:

    .lock                               held (POSIX record lock) by the process that writes
    .kafka_cleanshutdown                present only after a clean close (a broker's epoch kept in it)
    recovery-point-offset-checkpoint    offset checkpoints, see engine.log.checkpoint
    log-start-offset-checkpoint         (only partitions whose start is above their first segment)
    replication-offset-checkpoint       high watermarks
    cleaner-offset-checkpoint
    .seglogfs-topic-configs.json        per-topic config overrides (first log dir only)
    meta.properties                     a Kafka broker's (read only: it marks a broker's dir)

Each topic's config is worked out by engine.topic_configs (Kafka's layers, the broker's metadata
log, the seglogfs overrides, and the topics whose configs cannot be known, whose retention and
compaction stay off).

Thread safety. The partition table (`_logs`) and the overrides table are copy-on-write: a writer
builds a new dict and publishes it in one assignment, under `_lock` (`create_topic`,
`set_topic_overrides`), and readers (`topics`, `partitions`, `partition`, the log cleaner,
`checkpoint`, …) iterate whatever table they read, which never changes. A topic appears only once
all its partitions exist. Cleanup and checkpoints are one caller's at a time (the scheduler).

Topic administration (kafka-topics, kafka-configs: `create_topic`, `add_partitions`,
`delete_topic`, `topic_id`, `config_entries`) is engine.topic_admin's `TopicAdministration`, a base
class of `DataDir`; `set_topic_overrides` is here, as it swaps the configs of open partitions.

Opening for writing takes every `.lock` (a second writer gets LogDirLockedError naming the
holder), then loads partitions, recovering them after an unclean stop. Opening read-only takes no
lock and writes nothing: it reads what a writer has made durable so far, whole batches only.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import struct
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path

from seglogfs.engine.cleaner.log_cleaner import CleanupPlan, CleanupReport, LogCleaner
from seglogfs.engine.config import (
    METADATA_TOPIC,
    BrokerConfig,
    LogConfig,
    validate_topic_overrides,
)
from seglogfs.engine.errors import (
    ConfigError,
    CorruptIndexError,
    CorruptRecordError,
    EngineError,
    LogDirLockedError,
    TopicExistsError,
    UnknownTopicOrPartitionError,
    UnsafeFileError,
    UnsupportedFormatError,
)
from seglogfs.engine.files import open_regular
from seglogfs.engine.log.checkpoint import (
    CLEAN_SHUTDOWN_FILE,
    CLEANER_OFFSET_CHECKPOINT,
    LOG_START_OFFSET_CHECKPOINT,
    RECOVERY_POINT_CHECKPOINT,
    REPLICATION_OFFSET_CHECKPOINT,
    CheckpointError,
    format_clean_shutdown,
    fsync_dir,
    read_broker_epoch,
    read_offset_checkpoint,
    write_atomically,
    write_offset_checkpoint,
)
from seglogfs.engine.log.log import PartitionLog
from seglogfs.engine.log.naming import (
    linked_partition_dirs,
    partition_dirs,
)
from seglogfs.engine.log.retention import RetentionDecision
from seglogfs.engine.log.set_aside import SetAsideError
from seglogfs.engine.topic_admin import TopicAdministration, TopicPartition
from seglogfs.engine.topic_configs import TopicConfigs

logger = logging.getLogger(__name__)

LOCK_FILE = ".lock"
_TOPIC_CONFIGS_MAX_BYTES = 64 << 20  # far more than any number of topics' overrides takes
_WARN_TOPICS_NAMED = 20  # the unknown-configs warning names this many topics, then counts the rest
_LOCKED_HERE: set[str] = set()


def _lock_holder(fd: int) -> int | None:
    """PID holding a conflicting POSIX lock on `fd`, if the kernel will tell."""
    request = struct.pack("@hhqqi", fcntl.F_WRLCK, os.SEEK_SET, 0, 0, 0) + bytes(4)
    try:
        answer = fcntl.fcntl(fd, fcntl.F_GETLK, request)
    except OSError:
        return None
    _type, _whence, _start, _len, pid = struct.unpack_from("@hhqqi", answer)
    return pid or None


def describe_process(pid: int | None) -> str:
    """`process N (its whole command line)` for lock errors: who holds a data dir. The command
    line is another process's, perhaps another user's (untrusted bytes): its arguments are
    joined by spaces, and control characters (a newline, an escape sequence) and bytes that
    are not UTF-8 are escaped (`\\n`, `\\x1b`), so that the message stays one line that
    shows what is there and cannot move a terminal's cursor. Whole: an operator needs all of it
    to tell one broker's java from another's."""
    if not pid:
        return "another process"
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return f"process {pid}"
    text = raw.rstrip(b"\0").replace(b"\0", b" ").decode(errors="backslashreplace").strip()
    return f"process {pid} ({''.join(_escaped(char) for char in text)})"


def _escaped(char: str) -> str:
    """A character of an untrusted command line as shown: control characters (C0, DEL, C1 and
    the line and paragraph separators) escaped as Python writes them."""
    if char.isprintable() or char == " ":
        return char
    return char.encode("unicode_escape").decode("ascii")


def _error_text(error: BaseException) -> str:
    """An error in a message as the CLI shows one: an OSError as `path: reason` (without
    Python's `[Errno N]`), anything else as its text."""
    if isinstance(error, OSError) and error.strerror:
        return f"{error.filename}: {error.strerror}" if error.filename else error.strerror
    return str(error)


class DataDir(TopicAdministration):
    """The partitions of one broker's log dirs. Thread-safe: topic creation and config changes
    serialise on the data dir's lock, and readers see a partition table that never changes
    under them (see the module docstring); each partition's own operations follow
    PartitionLog's rules. Cleanup passes and checkpoints are for one caller at a time."""

    def __init__(
        self, config: BrokerConfig, *, writable: bool, recover_all: bool = False, serve_the_rest: bool = False
    ) -> None:
        """Use `DataDir.open`."""
        self.config = config
        self.writable = writable
        self._serve_the_rest = serve_the_rest
        self._lock_fds: list[tuple[str, int]] = []
        # Guards the writers of the two tables below; both are replaced whole, never changed.
        self._lock = threading.RLock()
        self._logs: Mapping[TopicPartition, PartitionLog] = {}
        # The topics' configs; its overrides table, like `_logs`, is replaced whole under `_lock`.
        self.topic_configs = TopicConfigs(config)
        self._recover_all = recover_all
        self._closed = False
        self.log_cleaner = LogCleaner(config, lambda: self._logs)
        # The entries of each root checkpoint file as read at open or last written: a file whose
        # entries would not change is not written again (absent: not known, written).
        self._checkpoints_on_disk: dict[Path, dict[TopicPartition, int]] = {}
        # Each log dir's broker epoch from the clean-shutdown file found at a writable open
        # (None: no file, or none in it), written back into the file at close.
        self._broker_epochs: dict[Path, int | None] = {}
        # Held by a background pass (Scheduler.run_due) and by `delete_topic`: a mount deletes a
        # topic while its scheduler runs, and a pass must not flush, clean or checkpoint a
        # partition that is being closed and renamed under it.
        self.maintenance_lock = threading.Lock()

    @classmethod
    def open(
        cls,
        config: BrokerConfig,
        *,
        read_only: bool = False,
        recover_all: bool = False,
        serve_the_rest: bool = False,
        now_ms: int,
    ) -> DataDir:
        """Open every log dir (creating missing ones when writable) and load its partitions.
        `recover_all` checks and repairs every segment, whatever the last stop was (repair).
        With `serve_the_rest` (a mount), a partition that cannot be opened (legacy data, damage,
        the OS refusing it) is kept offline, untouched, with an ERROR line, instead of failing
        the whole open (`PartitionLog.unreadable`).
        A writable open logs one WARNING when some topics' configs are unknown (see the module
        docstring); a read-only open, which never cleans, does not."""
        data_dir = cls(
            config, writable=not read_only, recover_all=recover_all and not read_only, serve_the_rest=serve_the_rest
        )
        try:
            data_dir._open(now_ms)
        except BaseException:
            for log in data_dir._logs.values():  # the partitions loaded before the failure
                with contextlib.suppress(Exception):
                    log.close()
            data_dir._release_locks()
            raise
        return data_dir

    def _open(self, now_ms: int) -> None:
        for log_dir in self.config.log_dirs:
            if self.writable:
                if not log_dir.is_dir():
                    log_dir.mkdir(parents=True, exist_ok=True)
                    # The new name is durable only with its parent (Kafka's createAndValidateLogDirs).
                    fsync_dir(log_dir.absolute().parent)
                self._take_lock(log_dir)
            elif not log_dir.is_dir():
                raise UnknownTopicOrPartitionError(f"{log_dir}: no such data dir")
        self.topic_configs.load()
        for log_dir in self.config.log_dirs:
            self._load_log_dir(log_dir, now_ms)
        if self.writable:
            self._warn_unknown_configs()

    def _take_lock(self, log_dir: Path) -> None:
        # POSIX record locks, as Kafka's FileChannel.tryLock takes, so that seglogfs and a broker
        # exclude each other. They are per process, hence the table for this process's own opens.
        path = log_dir / LOCK_FILE
        key = os.path.realpath(path)
        if key in _LOCKED_HERE:
            raise LogDirLockedError(f"{log_dir}: data dir is already open in this process (lock file {path})")
        fd = open_regular(path, os.O_RDWR | os.O_CREAT, 0o644)  # (a link or a FIFO there: UnsafeFileError)
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            holder = _lock_holder(fd)
            os.close(fd)
            who = describe_process(holder)
            raise LogDirLockedError(f"{log_dir}: data dir is in use by {who} (lock file {path})") from None
        _LOCKED_HERE.add(key)
        self._lock_fds.append((key, fd))

    def _release_locks(self) -> None:
        for key, fd in self._lock_fds:
            os.close(fd)  # closing the descriptor drops the POSIX lock
            _LOCKED_HERE.discard(key)
        self._lock_fds = []

    def _offline(
        self,
        directory: Path,
        topic: str,
        partition: int,
        reason: str,
        *,
        log_start_offset: int,
        recovery_point: int,
        now_ms: int,
    ) -> PartitionLog:
        """A partition that cannot be opened, offline with `reason` (logged): its files are left as
        they are, and the other partitions are served."""
        logger.error("%s; %s-%d is offline, the others are served", reason, topic, partition)
        return PartitionLog.unreadable(
            directory,
            topic,
            partition,
            self.topic_config(topic),
            reason,
            log_start_offset=log_start_offset,
            recovery_point=recovery_point,
            now_ms=now_ms,
        )

    def _load_log_dir(self, log_dir: Path, now_ms: int) -> None:
        marker = log_dir / CLEAN_SHUTDOWN_FILE
        clean = os.path.lexists(marker)
        try:
            recovery_points = self._read_checkpoint(log_dir / RECOVERY_POINT_CHECKPOINT)
            start_offsets = self._read_checkpoint(log_dir / LOG_START_OFFSET_CHECKPOINT)
        except CheckpointError as error:
            # Kafka's LogManager.loadLogs warns and goes on as without the file ("resetting the
            # recovery checkpoint to 0"): a writable open recovers everything and writes the file
            # anew at close (a rename over whatever was there, a link or a FIFO included: never
            # through it). Bad bytes, a link or a FIFO there is no reason to refuse the data dir.
            logger.warning("%s; %s", error, "every segment is recovered" if self.writable else "read as absent")
            if self.writable:
                recovery_points, start_offsets, clean = {}, {}, False
            else:
                recovery_points, start_offsets = {}, {}
        if self._recover_all:
            recovery_points, clean = {}, False
        try:
            self.log_cleaner.load_checkpoints(self._read_checkpoint(log_dir / CLEANER_OFFSET_CHECKPOINT))
        except CheckpointError as error:
            logger.warning("%s; compaction starts again from each log's start", error)
        if self.writable:
            with contextlib.suppress(CheckpointError):  # (never read otherwise: only so as not to write it for nothing)
                self._read_checkpoint(log_dir / REPLICATION_OFFSET_CHECKPOINT)
        logs = dict(self._logs)
        for name, topic, partition in linked_partition_dirs(log_dir):
            # Never followed: its partition is offline, whatever it points at.
            logs[(topic, partition)] = self._offline(
                log_dir / name,
                topic,
                partition,
                str(UnsafeFileError(log_dir / name, "a symbolic link", "a partition directory")),
                log_start_offset=start_offsets.get((topic, partition), 0),
                recovery_point=recovery_points.get((topic, partition), 0),
                now_ms=now_ms,
            )
        for name, topic, partition in partition_dirs(log_dir):
            if (topic, partition) in logs:
                raise EngineError(f"{log_dir / name}: partition {topic}-{partition} is in two log dirs")
            recovery_point = recovery_points.get((topic, partition), 0)
            log_start_offset = start_offsets.get((topic, partition), 0)
            try:
                logs[(topic, partition)] = PartitionLog.open(
                    log_dir / name,
                    topic,
                    partition,
                    self.topic_config(topic),
                    writable=self.writable,
                    clean_shutdown=clean,
                    recovery_point=recovery_point,
                    log_start_offset=log_start_offset,
                    now_ms=now_ms,
                )
            except (
                UnsupportedFormatError,
                CorruptIndexError,
                CorruptRecordError,
                SetAsideError,
                OSError,
                UnsafeFileError,
            ) as error:
                # A link, a FIFO or a directory where a file belongs is no damage recovery could
                # mend, and says nothing of the other partitions: offline for every opener, the
                # CLI's too (its reads and appends name it), the rest served.
                if not self._serve_the_rest and not isinstance(error, UnsafeFileError):
                    raise
                logs[(topic, partition)] = self._offline(
                    log_dir / name,
                    topic,
                    partition,
                    str(error),
                    log_start_offset=log_start_offset,
                    recovery_point=recovery_point,
                    now_ms=now_ms,
                )
        self._logs = logs
        if self.writable and os.path.lexists(marker):
            # The broker epoch goes back into the file at close (see close); read before the file
            # goes, as Kafka reads it at start before loading the logs deletes it. Not when this
            # open's recovery (a repair) cut records: the epoch would tell the broker's controller
            # that the broker's log is as it stopped with it.
            cut = any(log.set_aside for log in logs.values() if log.directory.parent == log_dir)
            self._broker_epochs[log_dir] = None if cut else read_broker_epoch(marker)
            # From now on the dir is in use: a crash must not look like a clean stop.
            marker.unlink()
            fsync_dir(log_dir)

    # -- topic configs ---------------------------------------------------------------------------

    def _warn_unknown_configs(self) -> None:
        unknown = self.unknown_config_topics()
        if not unknown:
            return
        names = sorted(unknown)
        listed = ", ".join(names[:_WARN_TOPICS_NAMED]) + (
            f" and {len(names) - _WARN_TOPICS_NAMED} more" if len(names) > _WARN_TOPICS_NAMED else ""
        )
        reasons = "; ".join(sorted(set(unknown.values())))
        logger.warning(
            "%s: retention and compaction are off for %d topics whose broker configs are unknown (%s): %s. "
            "They stay off until a policy is set: cleanup.policy in a topic's config file "
            "(.seglogfs-topic-configs.json), or --override log.cleanup.policy=delete|compact (-o on a mount) "
            "for all of them",
            ",".join(str(d) for d in self.config.log_dirs),
            len(names),
            reasons,
            listed,
        )

    def unknown_config_topics(self) -> dict[str, str]:
        """Topic → why its broker configs are unknown, for the topics here whose retention and
        compaction are therefore off (see the module docstring). Thread-safe."""
        return self.topic_configs.unknown(self.topics())

    def topic_overrides(self, topic: str) -> dict[str, str]:
        """The topic's seglogfs overrides (what its `config` file shows); not the broker's."""
        return dict(self.topic_configs.overrides.get(topic, {}))

    def topic_config(self, topic: str) -> LogConfig:
        """The topic's effective config: Kafka's layers and the seglogfs overrides (see the module
        docstring), with cleanup off for `__cluster_metadata` and unknown configs."""
        return self.topic_configs.resolve(topic)[0]

    def set_topic_overrides(self, topic: str, overrides: Mapping[str, str]) -> LogConfig:
        """Replace a topic's config overrides (kafka-configs --alter, the whole set at once):
        checked first, stored, then in effect for every partition of the topic. Raises
        ConfigError for an unknown name or a bad value, and for `cleanup.policy` on
        `__cluster_metadata`, changing nothing. Thread-safe: writers take the data dir's lock,
        and the file is replaced atomically through a temporary name of this call's own."""
        self._check_writable()
        source = f"config of topic {topic}"
        with self._lock:
            logs = [log for (t, _), log in sorted(self._logs.items()) if t == topic]
            if not logs:
                raise UnknownTopicOrPartitionError(f"unknown topic {topic!r}")
            checked = validate_topic_overrides(overrides, source)
            if topic == METADATA_TOPIC and "cleanup.policy" in checked:
                raise ConfigError(
                    f"{source}: cleanup.policy cannot be set: {METADATA_TOPIC} is Kafka's metadata log, which "
                    f"Kafka trims with snapshots; seglogfs never deletes or compacts it"
                )
            table = {**self.topic_configs.overrides, topic: checked}
            config, why = self.topic_configs.resolve(topic, table)
            self.topic_configs.store(table)
            for log in logs:
                with log.lock:
                    log.config = config
        if why is not None:
            logger.info("topic %s: retention and compaction stay off until cleanup.policy is set (%s)", topic, why)
        return config

    def try_storing_topic_overrides(self, topic: str, overrides: Mapping[str, str]) -> None:
        """Write what `set_topic_overrides(topic, overrides)` would store to a temporary file,
        durably, and remove it: an OSError (ENOSPC on a full disk) raised now is what storing
        them would meet, said while the caller can still tell its own caller (a write to the
        mount's `config`, which is stored only when closed). Changes nothing; `overrides` are
        not checked."""
        self._check_writable()
        with self._lock:
            table = {**self.topic_configs.overrides, topic: dict(overrides)}
        self.topic_configs.try_storing(table)

    # -- topics and partitions ------------------------------------------------------------------
    def refresh_partitions(self, now_ms: int) -> bool:
        """Read-only: take in the partitions another process created or deleted since the data
        dir was opened (a broker, `seglogfs produce`, `topics create|delete`): new partition dirs
        are opened, those gone are closed; the table changes all at once. Returns whether it
        changed. (Each partition's own growth is `PartitionLog.refresh`.)"""
        if self.writable:
            return False
        with self._lock:
            on_disk = {
                (topic, partition): log_dir / name
                for log_dir in self.config.log_dirs
                if log_dir.is_dir()
                for listing in (partition_dirs, linked_partition_dirs)
                for name, topic, partition in listing(log_dir)
            }
            logs = dict(self._logs)
            gone = [key for key in logs if key not in on_disk]
            new = [key for key in on_disk if key not in logs]
            if not gone and not new:
                return False
            for key in gone:
                with contextlib.suppress(Exception):
                    logs.pop(key).close()
            for topic, partition in new:
                try:
                    if os.path.islink(on_disk[(topic, partition)]):
                        raise UnsafeFileError(on_disk[(topic, partition)], "a symbolic link", "a partition directory")
                    logs[(topic, partition)] = PartitionLog.open(
                        on_disk[(topic, partition)],
                        topic,
                        partition,
                        self.topic_config(topic),
                        writable=False,
                        clean_shutdown=True,
                        now_ms=now_ms,
                    )
                except UnsafeFileError as error:  # (no partition being made holds one: offline)
                    logger.error("%s; %s-%d is offline, the others are served", error, topic, partition)
                    logs[(topic, partition)] = PartitionLog.unreadable(
                        on_disk[(topic, partition)],
                        topic,
                        partition,
                        self.topic_config(topic),
                        str(error),
                        log_start_offset=0,
                        recovery_point=0,
                        now_ms=now_ms,
                    )
                except (OSError, EngineError) as error:  # being made or removed right now: next time
                    logger.debug("%s-%d not opened yet: %s", topic, partition, error)
            self._logs = logs
            return True

    def topics(self) -> dict[str, list[int]]:
        """Topic → its partitions, sorted. Thread-safe."""
        out: dict[str, list[int]] = {}
        for topic, partition in sorted(self._logs):
            out.setdefault(topic, []).append(partition)
        return out

    def partitions(self) -> Iterator[PartitionLog]:
        """Every partition, sorted by topic and partition, as the table was when called."""
        logs = self._logs
        for key in sorted(logs):
            yield logs[key]

    def partition(self, topic: str, partition: int) -> PartitionLog:
        logs = self._logs
        log = logs.get((topic, partition))
        if log is None:
            if any(t == topic for t, _ in logs):
                raise UnknownTopicOrPartitionError(f"topic {topic!r} has no partition {partition}")
            raise UnknownTopicOrPartitionError(f"unknown topic {topic!r}")
        return log

    def partition_for_append(self, topic: str, partition: int | None, *, now_ms: int) -> list[PartitionLog]:
        """The partitions of `topic` to produce to, creating the topic with `num.partitions` when
        it is unknown and `auto.create.topics.enable` holds (as a broker does on produce)."""
        if not any(t == topic for t, _ in self._logs):
            if not self.config.auto_create_topics_enable:
                raise UnknownTopicOrPartitionError(f"unknown topic {topic!r} (auto.create.topics.enable=false)")
            with contextlib.suppress(TopicExistsError):  # another thread created it meanwhile
                self.create_topic(topic, now_ms=now_ms)
        if partition is not None:
            return [self.partition(topic, partition)]
        logs = self._logs
        return [logs[key] for key in sorted(logs) if key[0] == topic]

    # -- cleanup ------------------------------------------------------------------------------------
    def clean(self, now_ms: int) -> CleanupReport:
        """One full cleanup pass: retention over every partition, removal of deleted segments
        whose `file.delete.delay.ms` has passed, then compaction of every compacted log that is
        cleanable (`seglogfs clean`). Topics with cleanup off (`__cluster_metadata`, unknown
        configs) lose nothing but segments below their log start offset."""
        report = CleanupReport(retention=self.delete_old_segments(now_ms))
        compacted = self.compact(now_ms)
        report.compaction, report.failed = compacted.compaction, compacted.failed
        return report

    def plan_cleanup(self, now_ms: int) -> CleanupPlan:
        """What `clean(now_ms)` would delete and compact, changing nothing on disk or in memory
        (`seglogfs clean --dry-run`; works on a read-only open). Compaction is judged on each log
        as retention would leave it; what a pass would keep of it is only known by running it."""
        plan = CleanupPlan()
        candidates = []
        for _, log in sorted(self._logs.items()):
            if log.offline_reason is not None:
                continue  # (nothing of it is read: its files stay as the operator finds them)
            decision = log.retention_due(now_ms)
            if decision:
                plan.retention.append((log, decision))
            candidate = self.log_cleaner.plan(log, decision, now_ms)
            if candidate is not None:
                candidates.append(candidate)
        plan.compaction = sorted(candidates, key=lambda c: -c.cleanable_ratio)
        return plan

    def delete_old_segments(self, now_ms: int) -> list[tuple[PartitionLog, RetentionDecision]]:
        """One retention pass over every partition, then removal of deleted segments whose
        `file.delete.delay.ms` has passed; returns what each partition deleted."""
        self._check_writable()
        done = []
        for log_ in self.partitions():
            if log_.offline_reason is not None:
                continue  # (nothing of it is read: its files stay as the operator finds them)
            decision = log_.delete_old_segments(now_ms)
            log_.delete_pending(now_ms)
            if decision:
                done.append((log_, decision))
        if done:
            self.checkpoint()
        return done

    def compact(self, now_ms: int) -> CleanupReport:
        """Clean every cleanable compacted log once, filthiest first (engine.cleaner.log_cleaner),
        writing `cleaner-offset-checkpoint` as it goes."""
        self._check_writable()
        return self.log_cleaner.clean(now_ms, self._write_cleaner_checkpoints)

    def _read_checkpoint(self, path: Path) -> dict[TopicPartition, int]:
        """An offset checkpoint's entries (CheckpointError when it cannot be read), noted as
        what the file holds when there is one."""
        present = os.path.lexists(path)
        offsets = read_offset_checkpoint(path)
        if present:
            self._checkpoints_on_disk[path] = dict(offsets)
        return offsets

    def _write_checkpoint(self, path: Path, offsets: dict[TopicPartition, int]) -> None:
        """Write an offset checkpoint, unless it holds these entries already: a broker's files
        stay as the broker wrote them where nothing changed, and a scheduled checkpoint of an
        idle dir costs no fsync. A missing one is made, with no entries too, as Kafka makes
        every root checkpoint."""
        if self._checkpoints_on_disk.get(path) == offsets:
            return
        self._checkpoints_on_disk.pop(path, None)  # (unknown while it is written: a failure leaves either)
        write_offset_checkpoint(path, offsets)
        self._checkpoints_on_disk[path] = dict(offsets)

    def _write_cleaner_checkpoints(self) -> None:
        """Write `cleaner-offset-checkpoint` of every log dir, when it changed (the scheduler
        asks every log.cleaner.backoff.ms)."""
        for log_dir in self.config.log_dirs:
            self._write_checkpoint(log_dir / CLEANER_OFFSET_CHECKPOINT, self.log_cleaner.checkpoints_in(log_dir))

    # -- checkpoints and closing -------------------------------------------------------------------
    def checkpoint(self) -> None:
        """Write the root checkpoints of every log dir from the partitions' offsets now (those
        whose entries changed). A KRaft broker's metadata log has no entries in them: Kafka's
        LogManager does not load it (the broker's raft layer keeps it), and never lists it."""
        self._check_writable()
        self._write_cleaner_checkpoints()
        every = self._logs
        for log_dir in self.config.log_dirs:
            logs = [log for log in every.values() if log.directory.parent == log_dir and log.topic != METADATA_TOPIC]
            self._write_checkpoint(
                log_dir / RECOVERY_POINT_CHECKPOINT, {(log.topic, log.partition): log.recovery_point for log in logs}
            )
            self._write_checkpoint(
                log_dir / REPLICATION_OFFSET_CHECKPOINT,
                {(log.topic, log.partition): log.high_watermark for log in logs},
            )
            self._write_checkpoint(
                log_dir / LOG_START_OFFSET_CHECKPOINT,
                {
                    (log.topic, log.partition): log.log_start_offset
                    for log in logs
                    if not log.segments or log.log_start_offset > log.segments[0].base_offset
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
        release the locks: the state Kafka leaves after a clean shutdown. Safe to call twice.

        The clean-shutdown file keeps what a broker left in it: the broker epoch of a Kafka 3.7+
        file, in Kafka's JSON, so that the broker's next registration still counts its last stop
        as clean (KIP-966); an empty file where there was none, or none with an epoch in it
        (Kafka before 3.7, a broker that did not stop cleanly, a dir seglogfs made: the broker
        then has no epoch to offer, as before the mount), or where a repair cut records.

        A partition or checkpoint that fails to close (a full disk, EIO) does not stop the
        others: no clean-shutdown marker is written (the next open recovers, as after a crash),
        one EngineError names the first failure at the end, and the others are logged.
        Offline partitions likewise leave no marker."""
        if self._closed:
            return
        self._closed = True
        failures: list[str] = []
        try:
            for log in self._logs.values():
                try:
                    log.close()
                except (EngineError, OSError) as error:
                    failures.append(f"closing {log.topic}-{log.partition}: {_error_text(error)}")
            if self.writable:
                try:
                    self.checkpoint()
                except OSError as error:
                    failures.append(f"writing checkpoints: {_error_text(error)}")
                offline = any(log.offline_reason is not None for log in self._logs.values())
                if not failures and not offline:
                    try:
                        for log_dir in self.config.log_dirs:
                            marker = format_clean_shutdown(self._broker_epochs.get(log_dir))
                            write_atomically(log_dir / CLEAN_SHUTDOWN_FILE, marker)
                    except OSError as error:
                        failures.append(f"writing {CLEAN_SHUTDOWN_FILE}: {error}")
        finally:
            self._release_locks()
        for failure in failures[1:]:
            logger.error("%s", failure)
        if failures:
            more = f" (and {len(failures) - 1} more)" if len(failures) > 1 else ""
            raise EngineError(f"{failures[0]}{more}; the next open recovers as after a crash")

    def __enter__(self) -> DataDir:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *exc: object) -> None:
        """Close; when the block raised, a failure to close (the same full disk, most often) is
        logged and the block's error goes on: it names what failed first (the append, not the
        checkpoint after it). The log record carries that error as `after_error`, so that a
        caller printing the error (the CLI) can say both in one line."""
        if exc_type is None:
            self.close()
            return
        try:
            self.close()
        except EngineError as error:
            logger.error("%s", error, extra={"after_error": exc[0] if exc else None})
