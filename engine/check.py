"""Checking a data dir without changing it: every batch, every index entry, every checkpoint.

What is checked, per partition: each batch's length, magic, CRC-32C and records (a legacy message,
magic 0 or 1: its size, CRC-32 and records); offsets
increasing within and across segments; nothing after the last whole batch (a torn tail); every
offset-index entry is (a batch's last offset, that batch's position); time-index entries have
increasing timestamps, non-decreasing offsets inside the segment, and timestamps that the batches
up to them reach; index files have a whole number of entries; each `.txnindex` holds what the log
gives (engine.log.transaction_index.reconcile: an entry for every aborted transaction whose marker
the segment holds, entries the log no longer shows only where retention or compaction can
explain them); a segment without one must be one the log gives no entry for.
Per log dir: checkpoints parse and
agree with the logs; no leftovers of interrupted work (`.cleaned`, `.swap`, `.deleted`). What
recovery or a repair set aside beside it (engine.log.set_aside) is reported apart from the problems:
the log dir is valid, but records were taken out of it, until an operator removes the place.

`plan_repair` says, without changing anything, what `check --repair` would cut and set aside: the
same scan recovery makes (LogSegment.recovery_cut), every segment from the first.

A log dir in use by another process (its `.lock` held) is checked as a reader sees it: the last
segment of each partition may end in a batch being written and may have preallocated indexes,
so neither is reported there.
"""

from __future__ import annotations

import fcntl
import itertools
import os
import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from seglogfs.engine.config import read_properties
from seglogfs.engine.errors import ConfigError, CorruptIndexError, UnsafeFileError
from seglogfs.engine.files import describe_mode, open_regular
from seglogfs.engine.log.checkpoint import (
    CLEAN_SHUTDOWN_FILE,
    CLEANER_OFFSET_CHECKPOINT,
    LEADER_EPOCH_CHECKPOINT,
    LOG_START_OFFSET_CHECKPOINT,
    PARTITION_METADATA,
    RECOVERY_POINT_CHECKPOINT,
    REPLICATION_OFFSET_CHECKPOINT,
    CheckpointError,
    read_offset_checkpoint,
    read_partition_metadata,
)
from seglogfs.engine.log.index import entries_in_use, max_index_file_bytes, read_index_prefix
from seglogfs.engine.log.naming import (
    DELETED_SUFFIX,
    INDEX_SUFFIX,
    LOG_SUFFIX,
    TIME_INDEX_SUFFIX,
    linked_partition_dirs,
    parse_segment_file_name,
    partition_dirs,
)
from seglogfs.engine.log.offset_index import OFFSET_INDEX_DTYPE
from seglogfs.engine.log.segment import LogSegment
from seglogfs.engine.log.set_aside import SetAsidePiece, SetAsideRun, count_batches, find_set_aside, place_for
from seglogfs.engine.log.time_index import TIME_INDEX_DTYPE
from seglogfs.engine.log.transaction_index import AbortMarker, TransactionIndexBuilder, reconcile
from seglogfs.engine.record.records import BatchHeader, check_batch, decode_records
from seglogfs.engine.topic_configs import META_PROPERTIES

# The partition's own small files besides its segments (a link or a FIFO there is refused too).
_PARTITION_FILES = frozenset({PARTITION_METADATA, LEADER_EPOCH_CHECKPOINT})


def _refused(what: str, belongs: str = "a regular file") -> str:
    """A Problem's message for what stands where something else belongs (as UnsafeFileError says it)."""
    return f"{what} where {belongs} belongs: refused"


@dataclass(frozen=True)
class Problem:
    path: Path
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}"


@dataclass
class CheckReport:
    problems: list[Problem] = field(default_factory=list)
    partitions: int = 0
    segments: int = 0
    batches: int = 0
    records: int = 0
    bytes: int = 0
    in_use_by: dict[Path, int | None] = field(default_factory=dict)
    missing_indexes: list[Path] = field(default_factory=list)
    set_aside: list[SetAsideRun] = field(default_factory=list)

    @property
    def clean(self) -> bool:
        """No problems: the log dirs are as Kafka would leave them (something may still be set
        aside beside them: `set_aside`)."""
        return not self.problems


def log_dir_in_use(log_dir: Path) -> tuple[bool, int | None]:
    """Whether another process holds the log dir's `.lock`, and its PID when known."""
    path = log_dir / ".lock"
    try:
        fd = open_regular(path)  # (a FIFO there would block an open without O_NONBLOCK)
    except (OSError, UnsafeFileError):
        return False, None
    try:
        request = struct.pack("@hhqqi", fcntl.F_WRLCK, os.SEEK_SET, 0, 0, 0) + bytes(4)
        answer = fcntl.fcntl(fd, fcntl.F_GETLK, request)
        lock_type, _w, _s, _l, pid = struct.unpack_from("@hhqqi", answer)
        return lock_type != fcntl.F_UNLCK, (pid or None)
    except OSError:
        return False, None
    finally:
        os.close(fd)


def check_log_dirs(log_dirs: list[Path], progress: Callable[[int], None] | None = None) -> CheckReport:
    """Check every log dir; `progress` is told the bytes of each segment as it is done."""
    report = CheckReport()
    for log_dir in log_dirs:
        if not log_dir.is_dir():
            report.problems.append(Problem(log_dir, "no such directory"))
            continue
        in_use, pid = log_dir_in_use(log_dir)
        if in_use:
            report.in_use_by[log_dir] = pid
        _check_log_dir(log_dir, in_use, report, progress)
        report.set_aside.extend(find_set_aside(log_dir))
    return report


@dataclass(frozen=True)
class PlannedRepair:
    """What a repair would cut from one partition: the pieces it would set aside (their `place`
    the log dir's set-aside place; the run's directory is named when the repair runs)."""

    partition_dir: Path
    pieces: list[SetAsidePiece]

    @property
    def records(self) -> int:
        return sum(piece.records for piece in self.pieces)


def plan_repair(log_dirs: list[Path]) -> list[PlannedRepair]:
    """What `check --repair` would cut and set aside, read without changing anything: the scans
    recovery makes (engine.log.loader with the recovery point at 0). First each segment missing an
    index file loses its invalid tail (the loader's step 3, which removes nothing after it, as
    Kafka's LogLoader recovers such a segment on its own); then, in order, the first segment with
    an invalid batch loses its tail and the segments after it go whole."""
    plans = []
    for log_dir in log_dirs:
        if not log_dir.is_dir():
            continue
        for name, _topic, _partition in partition_dirs(log_dir):
            directory = log_dir / name
            kinds: dict[int, set[str]] = {}
            for entry in os.listdir(directory):
                parsed = parse_segment_file_name(entry)
                if parsed is not None and not parsed[2]:
                    kinds.setdefault(parsed[0], set()).add(parsed[1])
            bases = sorted(base for base, found in kinds.items() if LOG_SUFFIX in found)
            indexed = {base for base in bases if {INDEX_SUFFIX, TIME_INDEX_SUFFIX} <= kinds[base]}
            pieces = _planned_pieces(directory, bases, indexed, place_for(log_dir) / name)
            if pieces:
                plans.append(PlannedRepair(directory, pieces))
    return plans


def _planned_pieces(directory: Path, bases: list[int], indexed: set[int], place: Path) -> list[SetAsidePiece]:
    segments = [
        LogSegment(
            directory, base, index_interval_bytes=4096, max_index_bytes=10 * 1024 * 1024, writable=False, created_ms=0
        )
        for base in bases
    ]
    for segment, later in itertools.pairwise(segments):
        segment.next_base_offset = later.base_offset  # as the loader sets it
    try:
        pieces: list[SetAsidePiece] = []
        sizes = {segment.base_offset: segment.size for segment in segments}

        def tail(segment: LogSegment) -> bool:
            position, start = segment.recovery_cut()
            if position >= sizes[segment.base_offset]:
                return False
            name = f"{start:020d}{LOG_SUFFIX}"
            if start != segment.base_offset and start in sizes:
                name = f"tail/{name}"  # (a later segment of that name goes whole)
            pieces.append(_planned(place, segment, position, start, name, sizes[segment.base_offset], whole=False))
            sizes[segment.base_offset] = position
            return True

        for segment in segments:
            if segment.base_offset not in indexed:
                tail(segment)
        for slot, segment in enumerate(segments):
            if tail(segment):
                for later in segments[slot + 1 :]:
                    name = later.log_path.name
                    size = sizes[later.base_offset]
                    pieces.append(_planned(place, later, 0, later.base_offset, name, size, whole=True))
                break
        return pieces
    finally:
        for segment in segments:
            segment.close_handlers()


def _planned(  # noqa: PLR0917 (a piece's fields)
    place: Path, segment: LogSegment, position: int, start: int, name: str, end: int, *, whole: bool
) -> SetAsidePiece:
    count = count_batches(segment, position, end)
    size = end - position
    return SetAsidePiece(
        place,
        segment.log_path.name,
        position,
        start,
        name,
        size,
        count.records,
        count.first_offset,
        count.last_offset,
        size - count.valid_bytes,
        whole_segment=whole,
    )


def _check_log_dir(log_dir: Path, in_use: bool, report: CheckReport, progress: Callable[[int], None] | None) -> None:
    checkpoints = {}
    for name in (
        RECOVERY_POINT_CHECKPOINT,
        LOG_START_OFFSET_CHECKPOINT,
        REPLICATION_OFFSET_CHECKPOINT,
        CLEANER_OFFSET_CHECKPOINT,
    ):
        try:
            checkpoints[name] = read_offset_checkpoint(log_dir / name)
        except CheckpointError as error:
            report.problems.append(Problem(log_dir / name, str(error).split(": ", 1)[-1]))
            checkpoints[name] = {}
    clean = os.path.lexists(log_dir / CLEAN_SHUTDOWN_FILE)
    if os.path.lexists(log_dir / META_PROPERTIES):
        try:
            read_properties(log_dir / META_PROPERTIES, in_data_dir=True)
        except ConfigError as error:
            report.problems.append(Problem(log_dir / META_PROPERTIES, str(error).split(": ", 1)[-1]))
    for name, _topic, _partition in linked_partition_dirs(log_dir):
        report.problems.append(
            Problem(log_dir / name, _refused("a symbolic link", "a partition directory") + " (never followed)")
        )
    for name, topic, partition in partition_dirs(log_dir):
        parsed = (topic, partition)
        report.partitions += 1
        end = _check_partition(log_dir / name, in_use or not clean, in_use, report, progress)
        recovery_point = checkpoints[RECOVERY_POINT_CHECKPOINT].get(parsed)
        if recovery_point is not None and end is not None and recovery_point > end:
            report.problems.append(
                Problem(
                    log_dir / RECOVERY_POINT_CHECKPOINT,
                    f"recovery point {recovery_point} of {name} is past its log end offset {end}",
                )
            )


def _check_partition(
    directory: Path, maybe_active: bool, in_use: bool, report: CheckReport, progress: Callable[[int], None] | None
) -> int | None:
    bases = []
    unsafe = False
    with os.scandir(directory) as listing:
        entries = sorted(listing, key=lambda entry: entry.name)
    for entry in entries:
        name = entry.name
        parsed = parse_segment_file_name(name)
        if (parsed is not None or name in _PARTITION_FILES) and not entry.is_file(follow_symlinks=False):
            # Not opened, not followed: the partition is offline for every opener (engine.files).
            what = describe_mode(entry.stat(follow_symlinks=False).st_mode)
            report.problems.append(Problem(directory / name, _refused(what)))
            unsafe = True
            continue
        if parsed is None:
            continue
        base, kind, extra = parsed
        if extra == DELETED_SUFFIX:
            continue  # a deletion waiting for file.delete.delay.ms: normal, not damage
        if extra:
            report.problems.append(Problem(directory / name, f"leftover {extra} file of interrupted work"))
        elif kind == LOG_SUFFIX:
            bases.append(base)
    if unsafe:
        return None  # (its segments are not read: the partition is offline until the operator acts)
    try:
        read_partition_metadata(directory / PARTITION_METADATA)
    except CheckpointError as error:
        report.problems.append(Problem(directory / PARTITION_METADATA, str(error).split(": ", 1)[-1]))
    previous_end = None
    transactions = TransactionIndexBuilder()
    for slot, base in enumerate(bases):
        last = slot == len(bases) - 1
        segment = LogSegment(
            directory, base, index_interval_bytes=4096, max_index_bytes=10 * 1024 * 1024, writable=False, created_ms=0
        )
        try:
            end = _check_segment(
                segment,
                previous_end,
                tolerate_tail=last and in_use,
                preallocated_ok=last and maybe_active,
                report=report,
                transactions=transactions,
            )
        finally:
            segment.close_handlers()
        if progress is not None:
            progress(segment.size)
        previous_end = end if end is not None else previous_end
    return previous_end


def _check_segment(
    segment: LogSegment,
    previous_end: int | None,
    *,
    tolerate_tail: bool,
    preallocated_ok: bool,
    report: CheckReport,
    transactions: TransactionIndexBuilder,
) -> int | None:
    path = segment.log_path
    report.segments += 1
    report.bytes += segment.size
    if previous_end is not None and segment.base_offset < previous_end:
        report.problems.append(
            Problem(
                path, f"base offset {segment.base_offset} is below the previous segment's end offset {previous_end}"
            )
        )
    batches: list[BatchHeader] = []
    markers: list[AbortMarker] = []
    valid_bytes = 0
    next_offset = segment.base_offset if previous_end is None else max(segment.base_offset, previous_end)
    for header, batch in segment.iter_batches(0):
        reason = check_batch(header, batch)
        if reason is None and header.base_offset < next_offset and batches:
            reason = f"offset {header.base_offset} is not above the previous batch's last offset {next_offset - 1}"
        if reason is None and not segment.can_convert_to_relative_offset(header.last_offset):
            reason = f"last offset {header.last_offset} does not fit relative to base offset {segment.base_offset}"
        if reason is None:
            try:
                records = decode_records(header, batch, include_control=True)
                if len(records) != header.records_count:
                    reason = f"holds {len(records)} records, header says {header.records_count}"
                report.records += 0 if header.is_control else len(records)
            except Exception as error:
                reason = f"undecodable records: {error}"
        if reason is not None:
            if segment.legacy_message_at(header.position) and header.magic != 2:
                reason = f"legacy message (magic 0 or 1) that cannot be read: {reason}"
            report.problems.append(Problem(path, f"invalid batch at position {header.position}: {reason}"))
            break
        if header.is_transactional:
            marker = transactions.add(header, batch)
            if marker is not None:
                markers.append(marker)
        batches.append(header)
        report.batches += 1
        valid_bytes = header.next_position
        next_offset = header.next_offset
    tail = segment.size - valid_bytes
    if tail > 0 and not tolerate_tail and not any(p.path == path for p in report.problems):
        report.problems.append(Problem(path, f"{tail} bytes after the last whole batch (position {valid_bytes})"))
    _check_offset_index(segment, batches, preallocated_ok, report)
    _check_time_index(segment, batches, preallocated_ok, report)
    if not tolerate_tail:  # (a writer adds a marker's entry just after the marker)
        _check_transaction_index(segment, markers, report)
    return next_offset if batches else previous_end


def _entries(
    segment: LogSegment, path: Path, dtype: np.dtype, preallocated_ok: bool, report: CheckReport
) -> np.ndarray | None:
    """The index file's entries as far as a check needs them: up to the first zero slot
    (`read_index_prefix`), never more than an index of the segment can hold, so that neither
    a file's length nor its holes cost memory or time."""
    try:
        fd = open_regular(path)
    except FileNotFoundError:
        # Not damage: Kafka and seglogfs rebuild a missing index from the log on open.
        report.missing_indexes.append(path)
        return None
    except UnsafeFileError as error:
        report.problems.append(Problem(path, error.what + " where an index belongs: refused"))
        return None
    try:
        length = os.fstat(fd).st_size
        if length % dtype.itemsize and not preallocated_ok:
            whole = f"{length} bytes is not a whole number of {dtype.itemsize}-byte entries"
            report.problems.append(Problem(path, whole))
            return None
        bound = max_index_file_bytes(segment.max_index_bytes, segment.size, dtype.itemsize)
        if length > bound and not preallocated_ok:
            report.problems.append(
                Problem(path, f"{length} bytes is more than an index of its segment can hold ({bound} bytes)")
            )
            return None
        entries = read_index_prefix(fd, dtype, length)
    finally:
        os.close(fd)
    # A live or crashed active segment's index is preallocated: zero slots follow the entries.
    return entries_in_use(entries) if preallocated_ok else entries


def _check_offset_index(
    segment: LogSegment, batches: list[BatchHeader], preallocated_ok: bool, report: CheckReport
) -> None:
    path = segment.offset_index_path
    entries = _entries(segment, path, OFFSET_INDEX_DTYPE, preallocated_ok, report)
    if entries is None or len(entries) == 0:
        return
    by_position = {header.position: header for header in batches}
    previous = -1
    for relative, position in entries.tolist():
        offset = segment.base_offset + relative
        header = by_position.get(position)
        if relative <= previous:
            report.problems.append(Problem(path, f"entry ({offset}, {position}) is not above the previous entry"))
            return
        if header is None:
            report.problems.append(Problem(path, f"entry ({offset}, {position}) does not point at a batch"))
            return
        if header.last_offset != offset:
            report.problems.append(
                Problem(
                    path, f"entry ({offset}, {position}) points at a batch whose last offset is {header.last_offset}"
                )
            )
            return
        previous = relative


def _check_time_index(
    segment: LogSegment, batches: list[BatchHeader], preallocated_ok: bool, report: CheckReport
) -> None:
    path = segment.time_index_path
    entries = _entries(segment, path, TIME_INDEX_DTYPE, preallocated_ok, report)
    if entries is None or len(entries) == 0:
        return
    last_offsets = np.array([h.last_offset for h in batches], dtype=np.int64)
    running_max = (
        np.maximum.accumulate(np.array([h.max_timestamp for h in batches], dtype=np.int64))
        if batches
        else np.empty(0, np.int64)
    )
    previous_ts, previous_offset = None, segment.base_offset
    for timestamp, relative in entries.tolist():
        offset = segment.base_offset + relative
        if previous_ts is not None and timestamp <= previous_ts:
            report.problems.append(Problem(path, f"timestamp {timestamp} at offset {offset} does not increase"))
            return
        if offset < previous_offset:
            report.problems.append(Problem(path, f"offset {offset} goes backwards"))
            return
        slot = int(np.searchsorted(last_offsets, offset, side="left"))
        if slot >= len(last_offsets):
            report.problems.append(Problem(path, f"entry ({timestamp}, {offset}) lies past the segment's last batch"))
            return
        if timestamp > running_max[slot]:
            report.problems.append(Problem(path, f"entry ({timestamp}, {offset}) is later than any record up to it"))
            return
        previous_ts, previous_offset = timestamp, offset


def _check_transaction_index(segment: LogSegment, markers: list[AbortMarker], report: CheckReport) -> None:
    path = segment.transaction_index_path
    try:
        written = segment.transaction_index.entries(max_entries=len(markers))
    except CorruptIndexError as error:
        report.problems.append(Problem(path, error.reason))
        return
    for problem in reconcile(written, markers)[1]:
        report.problems.append(Problem(path, problem))
