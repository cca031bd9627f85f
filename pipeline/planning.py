"""From options to work: which offsets each partition is read from and to, and the slices of
segment files the tasks read.

Three steps, each usable alone (a streaming reader calls the last two with the offsets of a
micro-batch):

1. `resolve_ranges`: the start and end limits of the options become offsets per partition, as
   Spark's KafkaOffsetReaderAdmin resolves them (`earliest`/-2 → log start offset, `latest`/-1 →
   log end offset, timestamps → the first offset whose record timestamp is ≥ it, Kafka's
   ListOffsets by time), on the snapshot of the data dir that is open: a writer appending
   meanwhile changes nothing. A batch query resolves them at planning (to check them and place
   `minPartitions` cuts) and again in each task (`ReadPiece`, `piece_range`). The checks Spark makes when a range is
   read happen here: a start after the end fails; a range reaching below the log start offset or
   past the log end offset is data loss (an error with `failOnDataLoss`, else the range is cut
   to what exists, as Spark's consumer skips to what it can fetch).
2. `narrow_ranges`: pushed-down filters (`Constraints`) shrink the ranges: topics, partitions,
   offset bounds, and a lower timestamp bound through the time and offset indexes.
3. `plan_slices`: each range becomes one slice per segment it touches, with the byte positions of
   the whole batches to read (from the offset-index entry at or before the range's start); a
   streaming reader's `minPartitions` cuts larger slices at offset-index entries. A batch
   query's tasks (`plan_pieces`) are cut by offsets, exactly, as Spark's
   KafkaOffsetRangeCalculator cuts them.

With `kafka.isolation.level=read_committed` (`StableOffsets`), "the log end" is the last
stable offset (the first offset of a transaction still open), as for Kafka's read_committed
consumers, and each slice carries the aborted transactions its offsets overlap, whose batches
the task leaves out.

Nothing here imports pyspark.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TypeVar

from seglogfs.engine import DataDir, PartitionLog
from seglogfs.engine.fetched_files import fetched_file
from seglogfs.engine.log.segment import LogSegment
from seglogfs.engine.log.transactions import AbortedTransaction, TransactionTracker
from seglogfs.engine.stored.local_copy import EVERY_PARTITION, Partitions, shared_copy
from seglogfs.pipeline.options import (
    EARLIEST,
    LATEST,
    Earliest,
    EngineSettings,
    Latest,
    Location,
    OffsetLimit,
    OptionError,
    SpecificOffsets,
    SpecificTimestamps,
    Subscription,
    TopicPartition,
)

T = TypeVar("T")


class DataLossError(RuntimeError):
    """Offsets asked for are not in the log (deleted by retention or never written), and
    `failOnDataLoss` is true."""


_DATA_LOSS_HINT = (
    "Some data may have been lost because they are not available any more (deleted by retention) or "
    "were never written. If you want your query to go on regardless, set the option failOnDataLoss to false."
)


@dataclass(frozen=True, slots=True)
class OffsetRange:
    """Offsets [from_offset, until_offset) of one partition."""

    topic: str
    partition: int
    from_offset: int
    until_offset: int

    @property
    def topic_partition(self) -> TopicPartition:
        return (self.topic, self.partition)

    @property
    def size(self) -> int:
        return max(self.until_offset - self.from_offset, 0)


@dataclass(frozen=True, slots=True)
class RowFilter:
    """What a task checks per record, beyond its offset range: the pushed filters the planner
    could not turn into ranges. Timestamps in epoch ms."""

    offsets_in: frozenset[int] | None = None
    min_timestamp_ms: int | None = None  # inclusive
    end_timestamp_ms: int | None = None  # exclusive

    @property
    def empty(self) -> bool:
        return self.offsets_in is None and self.min_timestamp_ms is None and self.end_timestamp_ms is None


@dataclass(frozen=True, slots=True)
class Constraints:
    """Pushed-down filters, ANDed: each field narrows (None: no constraint). Offsets and
    timestamps are half-open [lo, hi); timestamps in epoch ms."""

    topics: frozenset[str] | None = None
    partitions: frozenset[int] | None = None
    partition_lo: int | None = None
    partition_hi: int | None = None
    offset_lo: int | None = None
    offset_hi: int | None = None
    offsets_in: frozenset[int] | None = None
    timestamp_lo_ms: int | None = None
    timestamp_hi_ms: int | None = None

    def row_filter(self) -> RowFilter:
        return RowFilter(self.offsets_in, self.timestamp_lo_ms, self.timestamp_hi_ms)

    def also(self, other: Constraints) -> Constraints:
        """Both constraints at once (the AND of two filters)."""

        def higher(a: int | None, b: int | None) -> int | None:
            return b if a is None else a if b is None else max(a, b)

        def lower(a: int | None, b: int | None) -> int | None:
            return b if a is None else a if b is None else min(a, b)

        return Constraints(
            topics=_both(self.topics, other.topics),
            partitions=_both(self.partitions, other.partitions),
            partition_lo=higher(self.partition_lo, other.partition_lo),
            partition_hi=lower(self.partition_hi, other.partition_hi),
            offset_lo=higher(self.offset_lo, other.offset_lo),
            offset_hi=lower(self.offset_hi, other.offset_hi),
            offsets_in=_both(self.offsets_in, other.offsets_in),
            timestamp_lo_ms=higher(self.timestamp_lo_ms, other.timestamp_lo_ms),
            timestamp_hi_ms=lower(self.timestamp_hi_ms, other.timestamp_hi_ms),
        )


def _both(a: frozenset[T] | None, b: frozenset[T] | None) -> frozenset[T] | None:
    return b if a is None else a if b is None else a & b


@dataclass(frozen=True, slots=True)
class SegmentSlice:
    """Whole batches of one segment file, bytes [start_position, end_position), holding the
    records of offsets [from_offset, until_offset) that a task reads. `file_id` (device, inode)
    is the file planning saw: a task finding another file there (compaction swapped it,
    retention deleted it) reads the offsets through the log instead."""

    topic: str
    partition: int
    directory: str
    base_offset: int
    file_id: tuple[int, int]
    start_position: int
    end_position: int
    from_offset: int
    until_offset: int
    aborted: tuple[AbortedTransaction, ...] = ()  # read_committed: aborted transactions in the offsets
    # The segment was not the log's last when planned: its bytes are whole batches to its end (a
    # read that stops short of `end_position` met damage; in the last, a batch being written).
    sealed: bool = False
    # A segment of a backup in object storage: the objects that hold its `.log` (key, size), which
    # a task reads where planning's local copy is not (another host, another process).
    stored: tuple[tuple[str, int], ...] = ()

    @property
    def size_bytes(self) -> int:
        return self.end_position - self.start_position


# -- 1. offsets from options ------------------------------------------------------------------------
def open_read_only(
    location: Location, settings: EngineSettings, now_ms: int, partitions: Partitions = EVERY_PARTITION
) -> DataDir:
    """`DataDir.open(read_only=True)` over the option's log dirs: no lock, nothing written. A
    log dir that is not a directory is refused by name (a read-only open would see no topics).
    A backup in object storage is opened as this process's local copy of its newest run, with
    `partitions` laid out (`subscribed`: a query's; nothing of the others is fetched)."""
    if location.store_uri is not None:
        copy = shared_copy(location.store_uri, partitions)
        return DataDir.open(settings.broker_config(tuple(copy.log_dirs)), read_only=True, now_ms=now_ms)
    for log_dir in location.log_dirs:
        if not log_dir.is_dir():
            raise OptionError(
                f"path {log_dir}: no such directory (expected a data dir, comma-separated log dirs or a seglogfs mount)"
            )
    return DataDir.open(settings.broker_config(location.log_dirs), read_only=True, now_ms=now_ms)


def subscribed(subscription: Subscription) -> Partitions:
    """The partitions of a backup's copy a query over `subscription` reads (those it may gain
    too: a topic's new partitions, a new topic a pattern finds)."""
    if subscription.kind == "assign":
        return Partitions(partitions=frozenset(subscription.assigned))
    if subscription.kind == "subscribe":
        return Partitions(topics=frozenset(subscription.topics))
    return Partitions(patterns=frozenset([subscription.pattern]))


class StableOffsets:
    """What read_committed reads may see of each partition: its transactions, read from the log
    start the first time (every batch: there are no producer snapshots to start from) and from
    where the last look ended after that; a streaming reader keeps one for its whole run."""

    def __init__(self) -> None:
        self._trackers: dict[TopicPartition, TransactionTracker] = {}

    def last_stable_offset(self, log: PartitionLog) -> int:
        """The partition's last stable offset now (of what was read: not past a batch appended
        after the look)."""
        return self._trackers.setdefault((log.topic, log.partition), TransactionTracker()).catch_up(log)

    def with_aborted(self, slices: Iterable[SegmentSlice]) -> list[SegmentSlice]:
        """`slices`, each with the aborted transactions that overlap its offsets."""
        out = []
        for piece in slices:
            tracker = self._trackers.get((piece.topic, piece.partition))
            aborted = tuple(
                transaction
                for transaction in (tracker.aborted if tracker is not None else ())
                if transaction.first_offset < piece.until_offset and transaction.last_offset >= piece.from_offset
            )
            out.append(replace(piece, aborted=aborted) if aborted else piece)
        return out


def _offset_for_timestamp(log: PartitionLog, timestamp: int, log_end: int, *, exact: bool = True) -> int | None:
    """Kafka's ListOffsets by time over a snapshot ending at `log_end`: -2 → log start, -1 →
    log end, else the first offset with a record timestamp ≥ it (None when there is none); not
    `exact`, a lower bound of that offset from the indexes alone (`PartitionLog.offset_for_timestamp_bound`)."""
    if timestamp == EARLIEST:
        return log.log_start_offset
    if timestamp == LATEST:
        return log_end
    if timestamp < 0:
        raise OptionError(f"timestamp {timestamp} for {log.topic}-{log.partition} is negative")
    if not exact:
        bound = log.offset_for_timestamp_bound(timestamp)
        return bound if bound is not None and bound < log_end else None
    found = log.offset_for_timestamp(timestamp)
    if found is None or found.offset >= log_end:  # past the snapshot: appended after planning
        return None
    return found.offset


def _check_named(what: str, named: Iterable[TopicPartition], assigned: Sequence[TopicPartition]) -> None:
    """Spark requires JSON offsets and timestamps to name exactly the partitions read."""
    named_set, assigned_set = set(named), set(assigned)
    if named_set != assigned_set:
        raise OptionError(
            f"{what} must name every partition read and no other. Use -1 for latest, -2 for earliest. "
            f"Named: {_names(named_set)}; read: {_names(assigned_set)}"
        )


def _names(partitions: Iterable[TopicPartition]) -> str:
    return "[" + ", ".join(f"{t}-{p}" for t, p in sorted(partitions)) + "]"


def resolve_limit(
    log: PartitionLog,
    limit: OffsetLimit,
    *,
    starting: bool,
    strategy: str,
    log_end: int | None = None,
    exact: bool = True,
) -> int:
    """One partition's offset for a start or end limit, as Spark's offset reader resolves it;
    `log_end` is the snapshot's log end offset (default: the log's now). A start time no record
    reaches fails with strategy `error` and is the log end with `latest`; an end time no record
    reaches is the log end. Not `exact`: a time is resolved to a lower bound of its offset, from
    the indexes (see `resolve_ranges`)."""
    end = log.log_end_offset if log_end is None else log_end
    tp = (log.topic, log.partition)
    if isinstance(limit, Earliest):
        return log.log_start_offset
    if isinstance(limit, Latest):
        return end
    if isinstance(limit, SpecificOffsets):
        offset = limit.offsets[tp]
        return log.log_start_offset if offset == EARLIEST else end if offset == LATEST else offset
    timestamp = limit.timestamps[tp] if isinstance(limit, SpecificTimestamps) else limit.timestamp
    found = _offset_for_timestamp(log, timestamp, end, exact=exact)
    if found is not None:
        return found
    if starting and strategy == "error":
        raise OptionError(
            f"No offset matched from request of topic-partition {log.topic}-{log.partition} and timestamp "
            f"{timestamp}. Set startingOffsetsByTimestampStrategy to latest to start at the latest offset instead."
        )
    return end


def resolve_ranges(
    data_dir: DataDir,
    partitions: Sequence[TopicPartition],
    starting: OffsetLimit,
    ending: OffsetLimit,
    *,
    strategy: str = "error",
    fail_on_data_loss: bool = True,
    stable: StableOffsets | None = None,
    exact: bool = True,
) -> list[OffsetRange]:
    """The offset range of each partition (see the module docstring). Raises OptionError for
    limits that do not fit the partitions, DataLossError for missing offsets when
    `fail_on_data_loss`. With `stable` (read_committed), the last stable offset stands for the
    log end.

    Not `exact` (a batch query planned over a backup in object storage, whose tasks resolve the
    limits again): nothing but index files and the backup's summaries is read — no segment
    bytes are fetched. A time resolves to a lower bound of its offset, and read_committed's log
    end is the log end (the last stable offset needs the transactions' batches); a check these
    cannot make (a start time only records below the log start reach; an end past the last
    stable offset) fails the query in its task instead."""
    for limit, what in ((starting, "starting"), (ending, "ending")):
        if isinstance(limit, SpecificOffsets):
            _check_named(f"{what}Offsets", limit.offsets, partitions)
        elif isinstance(limit, SpecificTimestamps):
            _check_named(f"{what}OffsetsByTimestamp", limit.timestamps, partitions)
    return [
        resolve_range(
            data_dir,
            tp,
            starting,
            ending,
            strategy=strategy,
            fail_on_data_loss=fail_on_data_loss,
            stable=stable if exact else None,
            exact=exact,
        )
        for tp in partitions
    ]


def resolve_range(
    data_dir: DataDir,
    tp: TopicPartition,
    starting: OffsetLimit,
    ending: OffsetLimit,
    *,
    strategy: str = "error",
    fail_on_data_loss: bool = True,
    stable: StableOffsets | None = None,
    exact: bool = True,
) -> OffsetRange:
    """One partition's offset range (`resolve_ranges` without the check that JSON limits name
    every partition read: a task resolving its own partition's limits calls this)."""
    topic, partition = tp
    log = data_dir.partition(topic, partition)
    log_start = log.log_start_offset
    log_end = log.log_end_offset if stable is None else stable.last_stable_offset(log)
    start = resolve_limit(log, starting, starting=True, strategy=strategy, log_end=log_end, exact=exact)
    until = resolve_limit(log, ending, starting=False, strategy=strategy, log_end=log_end, exact=exact)
    if start > until:
        raise OptionError(
            f"Beginning offset {start} is after the ending offset {until} for topic {topic} partition "
            f"{partition}. You either provided an invalid fromOffset, or the topic has been damaged"
        )
    if start < until and (start < log_start or until > log_end):
        if fail_on_data_loss:
            raise DataLossError(
                f"{topic}-{partition}: offsets [{start}, {until}) were asked for, but the log holds "
                f"[{log_start}, {log_end}){'' if stable is None else ' below its last stable offset'}. "
                f"{_DATA_LOSS_HINT}"
            )
        start, until = max(start, log_start), min(until, log_end)
        until = max(until, start)
    return OffsetRange(topic, partition, start, until)


# -- 2. pushed filters -------------------------------------------------------------------------------
def narrow_ranges(data_dir: DataDir, ranges: Iterable[OffsetRange], constraints: Constraints) -> list[OffsetRange]:
    """`ranges` less what the pushed filters exclude; empty ranges are dropped. A lower
    timestamp bound starts each range at the partition's first offset whose record reaches it
    (the time index, then the offset index, then a scan of one batch: Kafka's look-up)."""
    out: list[OffsetRange] = []
    for offsets in ranges:
        if constraints.topics is not None and offsets.topic not in constraints.topics:
            continue
        if constraints.partitions is not None and offsets.partition not in constraints.partitions:
            continue
        if constraints.partition_lo is not None and offsets.partition < constraints.partition_lo:
            continue
        if constraints.partition_hi is not None and offsets.partition >= constraints.partition_hi:
            continue
        lo, hi = offsets.from_offset, offsets.until_offset
        if constraints.offset_lo is not None:
            lo = max(lo, constraints.offset_lo)
        if constraints.offset_hi is not None:
            hi = min(hi, constraints.offset_hi)
        if lo < hi and constraints.timestamp_lo_ms is not None and constraints.timestamp_lo_ms >= 0:
            # (a bound below 0 keeps records stamped -1, "no timestamp": the tasks check those)
            log = data_dir.partition(offsets.topic, offsets.partition)
            first = _offset_for_timestamp(log, constraints.timestamp_lo_ms, hi)
            if first is None:
                continue
            lo = max(lo, first)
        if constraints.offsets_in is not None:
            out.extend(
                replace(offsets, from_offset=a, until_offset=b) for a, b in _around(constraints.offsets_in, lo, hi)
            )
        elif lo < hi:
            out.append(replace(offsets, from_offset=lo, until_offset=hi))
    return out


_IN_GAP = 256  # IN offsets closer than this share a range
_IN_RANGES = 64  # at most this many ranges per partition for an IN list; else one from min to max


def _around(members: frozenset[int], lo: int, hi: int) -> list[tuple[int, int]]:
    """Ranges within [lo, hi) covering the offsets of an IN list, close ones merged."""
    wanted = sorted(m for m in members if lo <= m < hi)
    if not wanted:
        return []
    ranges = [[wanted[0], wanted[0] + 1]]
    for offset in wanted[1:]:
        if offset - ranges[-1][1] < _IN_GAP:
            ranges[-1][1] = offset + 1
        else:
            ranges.append([offset, offset + 1])
    if len(ranges) > _IN_RANGES:
        return [(wanted[0], wanted[-1] + 1)]
    return [(a, b) for a, b in ranges]


# -- 3. slices of segment files ----------------------------------------------------------------------
def _base_offset_at(segment: LogSegment, position: int, end_position: int) -> int | None:
    """The base offset of the batch starting at `position` (one 61-byte header read)."""
    for header in segment.iter_headers(position, end_position):
        return header.base_offset
    return None


def _end_position(segment: LogSegment, until: int, size: int) -> int:
    """A position at or after the end of the last batch holding an offset below `until`: the end
    of the batch of the first index entry at or above it (that batch may still hold lower
    offsets; every later batch starts above it), else the segment's size."""
    entry = segment.offset_index.first_at_or_after(until)
    if entry is None:
        return size
    for header in segment.iter_headers(entry.position, size):
        return min(header.next_position, size)
    return size


def _segment_slices(log: PartitionLog, offsets: OffsetRange, min_timestamp_ms: int | None) -> list[SegmentSlice]:
    segments = log.segments
    slices = []
    for i, segment in enumerate(segments):
        next_base = segments[i + 1].base_offset if i + 1 < len(segments) else None
        lo = max(offsets.from_offset, segment.base_offset)
        hi = offsets.until_offset if next_base is None else min(offsets.until_offset, next_base)
        if lo >= hi:
            continue
        if min_timestamp_ms is not None and segment.max_timestamp_so_far.timestamp < min_timestamp_ms:
            continue  # every record of the segment is older (a closed segment's index says so)
        size = segment.refresh_size(sealed=next_base is not None)
        start = 0 if lo == segment.base_offset else segment.offset_index.lookup(lo).position
        end = size if next_base is not None and hi == next_base else _end_position(segment, hi, size)
        if start >= end:
            continue
        stat = os.lstat(segment.log_path)  # (the file the segment holds: a link there is another)
        stored = fetched_file((stat.st_dev, stat.st_ino))  # (a backup's segment in object storage)
        slices.append(
            SegmentSlice(
                topic=log.topic,
                partition=log.partition,
                directory=str(log.directory),
                base_offset=segment.base_offset,
                file_id=(stat.st_dev, stat.st_ino),
                start_position=start,
                end_position=end,
                from_offset=lo,
                until_offset=hi,
                sealed=next_base is not None,
                stored=stored.pieces if stored is not None else (),
            )
        )
    return slices


def _split(data_dir: DataDir, piece: SegmentSlice, parts: int) -> list[SegmentSlice]:
    """`piece` cut into about `parts` slices of equal bytes, at offset-index entries (each entry
    is a batch's start position; the header there gives the offset the cut falls on)."""
    if parts <= 1:
        return [piece]
    log = data_dir.partition(piece.topic, piece.partition)
    segment = next((s for s in log.segments if s.base_offset == piece.base_offset), None)
    if segment is None:
        return [piece]
    index = segment.offset_index
    cuts: list[tuple[int, int]] = []  # (position, offset)
    for k in range(1, parts):
        target = piece.start_position + piece.size_bytes * k // parts
        entry = index.first_at_or_past_position(target)
        if entry is None:
            break
        position = entry.position
        if position <= piece.start_position or position >= piece.end_position:
            continue
        if cuts and position <= cuts[-1][0]:
            continue
        offset = _base_offset_at(segment, position, piece.end_position)
        if offset is None or not piece.from_offset < offset < piece.until_offset:
            continue
        if cuts and offset <= cuts[-1][1]:
            continue
        cuts.append((position, offset))
    out = []
    start_position, from_offset = piece.start_position, piece.from_offset
    for position, offset in cuts:
        out.append(
            replace(
                piece,
                start_position=start_position,
                end_position=position,
                from_offset=from_offset,
                until_offset=offset,
            )
        )
        start_position, from_offset = position, offset
    out.append(replace(piece, start_position=start_position, from_offset=from_offset))
    return out


def _part_count(size: int, total: int, min_partitions: int) -> int:
    return math.ceil(size / total * min_partitions) if total else 1


def plan_slices(
    data_dir: DataDir,
    ranges: Iterable[OffsetRange],
    *,
    min_timestamp_ms: int | None = None,
    min_partitions: int | None = None,
) -> list[SegmentSlice]:
    """The slices that read `ranges`: one per segment a range touches, skipping segments whose
    largest timestamp is below `min_timestamp_ms`. With fewer slices than `min_partitions`, the
    larger ones are cut as Spark's KafkaOffsetRangeCalculator divides ranges (slices small enough
    to stay whole keep out of the share the others divide), in bytes."""
    slices = [
        piece
        for offsets in ranges
        if offsets.size > 0
        for piece in _segment_slices(data_dir.partition(offsets.topic, offsets.partition), offsets, min_timestamp_ms)
    ]
    if min_partitions is None or len(slices) >= min_partitions:
        return slices
    total = sum(piece.size_bytes for piece in slices)
    whole = [piece for piece in slices if _part_count(piece.size_bytes, total, min_partitions) == 1]
    whole_ids = {id(piece) for piece in whole}
    split_total = total - sum(piece.size_bytes for piece in whole)
    split_min = max(min_partitions - len(whole), 1)
    out = []
    for piece in slices:
        parts = 1 if id(piece) in whole_ids else max(_part_count(piece.size_bytes, split_total, split_min), 1)
        out.extend(_split(data_dir, piece, parts))
    return out


TASK_BYTES = 1 << 30  # consecutive slices of one partition read by one task, up to this many bytes


def group_slices(
    slices: Sequence[SegmentSlice], min_partitions: int | None, task_bytes: int = TASK_BYTES
) -> list[tuple[SegmentSlice, ...]]:
    """The tasks that read `slices`: each the consecutive slices of one partition, up to
    `task_bytes` (Spark's Kafka source reads a topic-partition's range in one task; a task per
    segment costs Spark tens of milliseconds each). With `min_partitions`, a slice per task, as
    `plan_slices` cut them."""
    if min_partitions is not None:
        return [(piece,) for piece in slices]
    tasks: list[tuple[SegmentSlice, ...]] = []
    group: list[SegmentSlice] = []
    size = 0
    for piece in slices:
        other_partition = group and (piece.topic, piece.partition) != (group[0].topic, group[0].partition)
        if group and (other_partition or size + piece.size_bytes > task_bytes):
            tasks.append(tuple(group))
            group, size = [], 0
        group.append(piece)
        size += piece.size_bytes
    if group:
        tasks.append(tuple(group))
    return tasks


def latest_offsets(
    data_dir: DataDir, partitions: Iterable[TopicPartition], stable: StableOffsets | None = None
) -> Mapping[TopicPartition, int]:
    """Each partition's log end offset now (what a streaming reader's `latestOffset` reports);
    with `stable` (read_committed) its last stable offset."""
    if stable is None:
        return {(t, p): data_dir.partition(t, p).log_end_offset for t, p in partitions}
    return {(t, p): stable.last_stable_offset(data_dir.partition(t, p)) for t, p in partitions}


# -- 4. a batch query's tasks, resolved when they run ----------------------------------------------
@dataclass(frozen=True, slots=True)
class ReadPiece:
    """A batch task's share of one partition: offsets [from_offset, until_offset), where None
    stands for the query's start (or end) limit, resolved by the task when it runs (`piece_range`).

    Why the task resolves: Spark (4.3) keeps the partitions a Python source planned for a loaded
    DataFrame and hands them again to every later query of that DataFrame (or of a temp view over
    it) that pushes no filter, without asking the source. A plan holding offsets would pin every
    such query to the records there were at the first one; Spark's Kafka source resolves
    `latest` (and timestamps) again at every action. So the plan fixes only the points where a
    partition is cut between tasks (`minPartitions`), and each partition's start and end limits
    are resolved by the task that reads them, once per query: a query's view of a partition is
    fixed while it runs, and the next query sees what was appended meanwhile."""

    topic: str
    partition: int
    from_offset: int | None = None
    until_offset: int | None = None
    new_partitions: NewPartitions | None = None  # (the last task) reads these too

    @property
    def topic_partition(self) -> TopicPartition:
        return (self.topic, self.partition)


@dataclass(frozen=True, slots=True)
class NewPartitions:
    """A batch task reading the partitions of a `subscribe` or `subscribePattern` that the plan
    did not know (created since, Spark reusing the plan: see `ReadPiece`), whole between the
    query's limits, as Spark's Kafka source finds them at each action."""

    planned: frozenset[TopicPartition]


def _part_offsets(size: int, total: int, min_partitions: int) -> int:
    """Spark's KafkaOffsetRangeCalculator.getPartCount: the share rounded half up (Scala's
    math.round), not up (4 partitions of 150, 150, 150 and 100 offsets with minPartitions=7 are
    7 tasks there, not 8)."""
    return max(math.floor(size / total * min_partitions + 0.5), 1) if total else 1


def plan_pieces(ranges: Sequence[OffsetRange], min_partitions: int | None = None) -> list[ReadPiece]:
    """The tasks of a batch query: one per partition read, or with `minPartitions` more than
    there are partitions, ranges cut into parts of equal offset counts exactly as Spark's
    KafkaOffsetRangeCalculator cuts them (ranges whose share is one part stay whole and keep
    out of the share the others divide). `ranges` are resolved at planning, to place the cuts;
    the first piece of each partition starts, and its last ends, at the limits its task
    resolves."""
    pieces: list[ReadPiece] = []
    nonempty = [offsets for offsets in ranges if offsets.size > 0]
    total = sum(offsets.size for offsets in nonempty)
    split = min_partitions is not None and len(nonempty) < min_partitions
    whole = {o.topic_partition for o in nonempty if not split or _part_offsets(o.size, total, min_partitions or 1) == 1}
    whole_total = sum(o.size for o in nonempty if o.topic_partition in whole)
    for offsets in ranges:
        topic, partition = offsets.topic_partition
        parts = 1
        if split and offsets.size > 0 and offsets.topic_partition not in whole:
            parts = _part_offsets(offsets.size, total - whole_total, max((min_partitions or 1) - len(whole), 1))
        cuts = [offsets.from_offset + offsets.size * i // parts for i in range(1, parts)]
        bounds: list[int | None] = [None, *cuts, None]
        pieces.extend(ReadPiece(topic, partition, bounds[i], bounds[i + 1]) for i in range(parts))
    return pieces


def piece_range(
    data_dir: DataDir,
    piece: ReadPiece,
    starting: OffsetLimit,
    ending: OffsetLimit,
    *,
    strategy: str = "error",
    fail_on_data_loss: bool = True,
    stable: StableOffsets | None = None,
) -> OffsetRange:
    """The offsets `piece` reads now: its partition's limits resolved on `data_dir`, narrowed to
    its cuts (an empty range when the limits fall outside them)."""
    resolved = resolve_range(
        data_dir,
        piece.topic_partition,
        starting,
        ending,
        strategy=strategy,
        fail_on_data_loss=fail_on_data_loss,
        stable=stable,
    )
    lo = resolved.from_offset if piece.from_offset is None else max(piece.from_offset, resolved.from_offset)
    hi = resolved.until_offset if piece.until_offset is None else min(piece.until_offset, resolved.until_offset)
    return replace(resolved, from_offset=lo, until_offset=max(lo, hi))
