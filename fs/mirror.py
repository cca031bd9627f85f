"""`.logdir`: a read-only mirror of the data dir in Kafka's layout, consistent for backups.

    .logdir/                          (with several log dirs: .logdir/0/, .logdir/1/, …)
        recovery-point-offset-checkpoint, replication-offset-checkpoint,
        log-start-offset-checkpoint, cleaner-offset-checkpoint     generated from the logs now
        .seglogfs-topic-configs.json                               as on disk
        <topic>-<partition>/
            <base>.log        sealed segments as on disk; the active one up to its last whole batch
            <base>.index      sealed: as on disk (trimmed); active: its valid entries only
            <base>.timeindex
            leader-epoch-checkpoint, partition.metadata

Files being deleted, cleaned or swapped are not shown, and neither are `.lock` and
`.kafka_cleanshutdown`: a copy opens as after an unclean stop and checks what lies past its
recovery points. Files keep the mtime of the file they mirror, so `rsync` finds unchanged sealed
segments unchanged and copies only what grew or is new.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from seglogfs.engine import DataDir, PartitionLog
from seglogfs.engine.checkpoint import (
    CLEANER_OFFSET_CHECKPOINT,
    LEADER_EPOCH_CHECKPOINT,
    LOG_START_OFFSET_CHECKPOINT,
    PARTITION_METADATA,
    RECOVERY_POINT_CHECKPOINT,
    REPLICATION_OFFSET_CHECKPOINT,
    format_offset_checkpoint,
)
from seglogfs.engine.datadir import TOPIC_CONFIGS_FILE
from seglogfs.engine.naming import partition_dir_name
from seglogfs.engine.segment import LogSegment, read_cached

_PARTITION_FILES = (LEADER_EPOCH_CHECKPOINT, PARTITION_METADATA)
_GENERATED = (
    RECOVERY_POINT_CHECKPOINT,
    REPLICATION_OFFSET_CHECKPOINT,
    LOG_START_OFFSET_CHECKPOINT,
    CLEANER_OFFSET_CHECKPOINT,
)


@dataclass(frozen=True)
class MirrorEntry:
    """One file or directory of the mirror, resolved now."""

    is_dir: bool
    size: int = 0
    mtime_ns: int = 0
    path: Path | None = None  # the file whose first `size` bytes are shown
    content: bytes | None = None  # or generated content


class Mirror:
    """Resolves mirror paths (tuples of names below `.logdir`) against a DataDir."""

    def __init__(self, data_dir: DataDir) -> None:
        self.data_dir = data_dir
        self.log_dirs = list(data_dir.config.log_dirs)

    def _log_dir(self, parts: tuple[str, ...]) -> tuple[Path, tuple[str, ...]] | None:
        if len(self.log_dirs) == 1:
            return self.log_dirs[0], parts
        if not parts:
            return None
        if not (parts[0].isascii() and parts[0].isdigit()) or int(parts[0]) >= len(self.log_dirs):
            raise FileNotFoundError(parts[0])
        return self.log_dirs[int(parts[0])], parts[1:]

    def _logs_in(self, log_dir: Path) -> dict[str, PartitionLog]:
        logs = {}
        for topic, partitions in self.data_dir.topics().items():
            for partition in partitions:
                log = self.data_dir.partition(topic, partition)
                if log.directory.parent == log_dir:
                    logs[partition_dir_name(topic, partition)] = log
        return logs

    def names(self, parts: tuple[str, ...]) -> list[str]:
        """Names in the mirror directory `parts`."""
        resolved = self._log_dir(parts)
        if resolved is None:
            return [str(i) for i in range(len(self.log_dirs))]
        log_dir, rest = resolved
        logs = self._logs_in(log_dir)
        if not rest:
            names = list(_GENERATED) + sorted(logs)
            if (log_dir / TOPIC_CONFIGS_FILE).exists():
                names.append(TOPIC_CONFIGS_FILE)
            return names
        if len(rest) == 1 and rest[0] in logs:
            log = logs[rest[0]]
            names = [name for name in _PARTITION_FILES if (log.directory / name).exists()]
            for segment in log.segments:
                names += [segment.log_path.name, segment.offset_index_path.name, segment.time_index_path.name]
            return names
        raise FileNotFoundError("/".join(parts))

    def entry(self, parts: tuple[str, ...]) -> MirrorEntry:
        """What `parts` names now; FileNotFoundError when nothing."""
        resolved = self._log_dir(parts)
        if resolved is None:
            return MirrorEntry(is_dir=True)
        log_dir, rest = resolved
        if not rest:
            return MirrorEntry(is_dir=True, mtime_ns=os.stat(log_dir).st_mtime_ns)
        logs = self._logs_in(log_dir)
        if len(rest) == 1:
            name = rest[0]
            if name in logs:
                return MirrorEntry(is_dir=True, mtime_ns=os.stat(logs[name].directory).st_mtime_ns)
            if name in _GENERATED:
                return self._generated(name, list(logs.values()), log_dir)
            if name == TOPIC_CONFIGS_FILE:
                return self._file(log_dir / name)
            raise FileNotFoundError(name)
        if len(rest) == 2 and rest[0] in logs:
            return self._partition_file(logs[rest[0]], rest[1])
        raise FileNotFoundError("/".join(parts))

    @staticmethod
    def _file(path: Path, size: int | None = None) -> MirrorEntry:
        status = os.stat(path)
        shown = status.st_size if size is None else min(size, status.st_size)
        return MirrorEntry(is_dir=False, size=shown, mtime_ns=status.st_mtime_ns, path=path)

    def _generated(self, name: str, logs: list[PartitionLog], log_dir: Path) -> MirrorEntry:
        if name == RECOVERY_POINT_CHECKPOINT:
            offsets = {(log.topic, log.partition): min(log.recovery_point, log.log_end_offset) for log in logs}
        elif name == REPLICATION_OFFSET_CHECKPOINT:
            offsets = {(log.topic, log.partition): log.high_watermark for log in logs}
        elif name == LOG_START_OFFSET_CHECKPOINT:
            offsets = {
                (log.topic, log.partition): log.log_start_offset
                for log in logs
                if log.log_start_offset > log.segments[0].base_offset
            }
        else:
            path = log_dir / CLEANER_OFFSET_CHECKPOINT
            if path.exists():
                return self._file(path)
            offsets = {}
        content = format_offset_checkpoint(offsets).encode()
        return MirrorEntry(is_dir=False, size=len(content), mtime_ns=os.stat(log_dir).st_mtime_ns, content=content)

    def _partition_file(self, log: PartitionLog, name: str) -> MirrorEntry:
        if name in _PARTITION_FILES:
            return self._file(log.directory / name)
        segments = log.segments
        active = segments[-1] if segments else None
        for segment in segments:
            if name == segment.log_path.name:
                return self._file(segment.log_path, segment.size if segment is active else None)
            if name in (segment.offset_index_path.name, segment.time_index_path.name):
                return self._index(segment, name, active=segment is active)
        raise FileNotFoundError(name)

    @staticmethod
    def _index(segment: LogSegment, name: str, *, active: bool) -> MirrorEntry:
        path = segment.offset_index_path if name == segment.offset_index_path.name else segment.time_index_path
        if not active:
            return Mirror._file(path)
        index = segment.offset_index if path == segment.offset_index_path else segment.time_index
        return Mirror._file(path, index.size_in_bytes)


class MirrorFile:
    """An open mirror file: the entry as resolved at open, and its file held open (a segment
    renamed `.deleted` meanwhile stays readable). A read past the size seen at open looks again:
    the active segment may have grown since, and a reader (rsync) may expect the size a later
    stat reported."""

    def __init__(self, mirror: Mirror, parts: tuple[str, ...]) -> None:
        self._mirror = mirror
        self._parts = parts
        self.entry = entry = mirror.entry(parts)
        self._fd = os.open(entry.path, os.O_RDONLY | os.O_CLOEXEC) if entry.path is not None else None

    def read_now(self, offset: int, length: int) -> bytes | bytearray | None:
        """`read`, when it needs no look at the log and its bytes are in the OS page cache (for
        the event loop), else None."""
        end = offset + length
        if end > self.entry.size:
            return None
        if self._fd is None:
            assert self.entry.content is not None
            return self.entry.content[offset:end]
        try:
            return read_cached(self._fd, offset, length)
        except OSError:  # not cached; or an I/O error, which the worker thread's read reports
            return None

    def read(self, offset: int, length: int) -> bytes:
        if offset + length > self.entry.size and self.entry.path is not None:
            try:
                again = self._mirror.entry(self._parts)
            except FileNotFoundError:  # deleted since it was opened: what was there stays
                again = self.entry
            if again.path == self.entry.path and again.size > self.entry.size:
                self.entry = again
        end = min(offset + length, self.entry.size)
        if offset >= end:
            return b""
        if self._fd is None:
            assert self.entry.content is not None
            return self.entry.content[offset:end]
        return os.pread(self._fd, end - offset, offset)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
