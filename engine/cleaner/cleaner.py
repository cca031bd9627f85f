"""Key compaction: one cleaning pass over one log (Kafka's Cleaner, with its CleanerStats).

A compacted log keeps, for every key, at least its latest record; offsets never change. Which log
to clean, and its dirty section (from the first dirty offset to the first uncleanable one), is
engine.cleaner.cleaner_manager's choice; engine.datadir runs the passes one after another (Kafka's
LogCleaner, with one cleaner thread). A pass

1. builds an offset map (engine.cleaner.offset_map, key → latest offset) over the dirty section, from the
   first dirty offset until the map is full or the section ends; the offset after the last record
   mapped is where the next pass starts (the new checkpoint);
2. rewrites every segment below that offset, in groups that fit one segment
   (`segment.bytes`, `segment.index.bytes`), dropping each record the map holds a later offset
   for, records without a key, and tombstones whose delete horizon has passed;
3. swaps each group's output in: `.cleaned` files, renamed `.swap`, the old segments renamed
   `.deleted`, the `.swap` renamed live. A crash at any step leaves files the loader finishes or
   undoes, as Kafka's does (see engine.log.loader).

Tombstones (null values) live through two passes: the first pass that keeps one stamps its batch
with a delete horizon (now + `delete.retention.ms`, in the batch's first-timestamp field); a pass
after the horizon drops it. A consumer that reads the log from the start within
`delete.retention.ms` of the tombstone becoming clean therefore sees it.

Transactions: control batches are kept; transactional records never enter the offset map (this
engine does not track which transactions aborted, so an aborted value must not hide a committed
one) and are dropped only when a later non-transactional record of their key exists. A cleaned
segment carries the `.txnindex` entries of the segments it replaces (every marker stays), written
and fsynced with its other `.cleaned` files and renamed with them.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from seglogfs.engine.cleaner.cleaner_manager import LogToClean, segments_between
from seglogfs.engine.cleaner.offset_map import OffsetMap, key_hashes
from seglogfs.engine.errors import CorruptRecordError, EngineError
from seglogfs.engine.log.index import INT32_MAX
from seglogfs.engine.log.loader import segment_for
from seglogfs.engine.log.naming import (
    CLEANED_SUFFIX,
    TXN_INDEX_SUFFIX,
    filename_prefix_from_offset,
    log_file,
    offset_index_file,
    time_index_file,
)
from seglogfs.engine.record.builder import ProducerState, build_batch, empty_batch, rebuild_batch
from seglogfs.engine.record.columns import RecordColumns, record_columns
from seglogfs.engine.record.records import BatchHeader, TimestampType, decode_records

if TYPE_CHECKING:
    from seglogfs.engine.log.log import PartitionLog
    from seglogfs.engine.log.segment import LogSegment

_WRITE_CHUNK_BYTES = 1 << 20


# -- the records of a batch, column-wise ----------------------------------------------------------


@dataclass(slots=True)
class BatchRecords:
    """A batch's records column-wise (engine.record.columns) with the fields the cleaner decides on."""

    columns: RecordColumns
    has_key: np.ndarray
    first_hash: np.ndarray
    second_hash: np.ndarray
    null_value: np.ndarray

    def __len__(self) -> int:
        return len(self.columns)

    @property
    def section(self) -> bytes:
        return self.columns.section

    @property
    def bounds(self) -> np.ndarray:
        return self.columns.bounds

    @property
    def offsets(self) -> np.ndarray:
        return self.columns.offsets

    @property
    def timestamps(self) -> np.ndarray:
        return self.columns.timestamps


def batch_records(header: BatchHeader, batch: bytes | memoryview) -> BatchRecords:
    """Lay out a valid batch's records column-wise and hash their keys (raises ValueError when
    malformed)."""
    columns = record_columns(header, batch)
    count = len(columns)
    has_key = columns.key_lengths >= 0
    first = np.zeros(count, np.uint64)
    second = np.zeros(count, np.uint32)
    if bool(has_key.any()):
        keyed = np.flatnonzero(has_key)
        starts = columns.key_starts[keyed]
        ends = (starts + columns.key_lengths[keyed]).tolist()
        section = columns.section
        first[keyed], second[keyed] = key_hashes([section[s:e] for s, e in zip(starts.tolist(), ends, strict=True)])
    return BatchRecords(
        columns=columns,
        has_key=has_key,
        first_hash=first,
        second_hash=second,
        null_value=columns.value_lengths < 0,
    )


# -- grouping segments ----------------------------------------------------------------------------


def group_segments_by_size(
    segments: Sequence[LogSegment], max_size: int, max_index_size: int, first_uncleanable: int
) -> list[list[LogSegment]]:
    """Consecutive segments whose log, offset index and time index together fit the limits and
    whose offsets fit relative to the group's base (Kafka's groupSegmentsBySize): each group
    becomes one cleaned segment."""
    groups: list[list[LogSegment]] = []
    rest = list(segments)
    while rest:
        group = [rest.pop(0)]
        log_size = group[0].size
        index_size = _file_size(group[0].offset_index_path)
        time_index_size = _file_size(group[0].time_index_path)
        while rest:
            nxt = rest[0]
            last_offset = rest[1].base_offset - 1 if len(rest) > 1 else first_uncleanable - 1
            if not (
                log_size + nxt.size <= max_size
                and index_size + _file_size(nxt.offset_index_path) <= max_index_size
                and time_index_size + _file_size(nxt.time_index_path) <= max_index_size
                and (nxt.size == 0 or last_offset - group[0].base_offset <= INT32_MAX)
            ):
                break
            group.append(rest.pop(0))
            log_size += nxt.size
            index_size += _file_size(nxt.offset_index_path)
            time_index_size += _file_size(nxt.time_index_path)
        groups.append(group)
    return groups


def _file_size(path: Path) -> int:
    """An index's bytes (a sealed segment's index files hold just their entries)."""
    try:
        return os.stat(path).st_size
    except FileNotFoundError:
        return 0


# -- cleaning ----------------------------------------------------------------------------------


@dataclass
class CleanerStats:
    """What one pass read and wrote (Kafka's CleanerStats)."""

    bytes_read: int = 0
    bytes_written: int = 0
    records_read: int = 0
    records_written: int = 0
    invalid_records: int = 0
    map_records_read: int = 0
    map_bytes_read: int = 0
    segments_cleaned: int = 0
    earliest_delete_horizon: int | None = None
    started: float = field(default_factory=time.monotonic)
    ended: float = 0.0

    @property
    def elapsed_seconds(self) -> float:
        return (self.ended or time.monotonic()) - self.started


@dataclass(frozen=True, slots=True)
class CleanResult:
    """One pass over one log."""

    topic: str
    partition: int
    first_dirty_offset: int
    next_dirty_offset: int
    groups: int
    stats: CleanerStats


def earliest_delete_horizon(log: PartitionLog, end_offset: int) -> int | None:
    """The earliest delete horizon stamped on a batch below `end_offset` (a header scan), None
    when no batch carries one."""
    horizons = [
        header.delete_horizon_ms
        for segment in log.segments[:-1]
        if segment.base_offset < end_offset
        for header in segment.iter_headers()
        if header.delete_horizon_ms is not None
    ]
    return min(horizons, default=None)


class CleaningAbortedError(EngineError):
    """The log changed under the cleaner (segments deleted or truncated): the pass is dropped."""


def _batches(segment: LogSegment, start_offset: int = 0) -> Iterator[tuple[BatchHeader, memoryview]]:
    """A sealed segment's batches from the one holding `start_offset`, each checked whole: the
    cleaner never copies damage into a fresh CRC."""
    position = 0
    if start_offset > segment.base_offset:
        position = segment.offset_index.lookup(start_offset).position
    yield from segment.checked_batches(position, segment.size, to_end=True)


def _batch_records_at(segment: LogSegment, header: BatchHeader, batch: memoryview) -> BatchRecords:
    try:
        return batch_records(header, batch)
    except ValueError as exc:
        raise CorruptRecordError(segment.log_path, header.position, str(exc)) from exc


class Cleaner:
    """Cleans one log at a time with one offset map (Kafka's Cleaner). See the module docstring."""

    def __init__(self, dedupe_buffer_bytes: int, load_factor: float = 0.9) -> None:
        self.dedupe_buffer_bytes = dedupe_buffer_bytes
        self.load_factor = load_factor
        self._map: OffsetMap | None = None

    @property
    def offset_map(self) -> OffsetMap:
        if self._map is None:
            self._map = OffsetMap(self.dedupe_buffer_bytes, self.load_factor)
        return self._map

    def release(self) -> None:
        """Free the offset map's memory until the next pass."""
        self._map = None

    def clean(self, candidate: LogToClean, now_ms: int) -> CleanResult:
        """One pass over `candidate.log`; returns where the next pass starts. The log stays
        readable and appendable throughout; only the swap takes its lock."""
        log = candidate.log
        stats = CleanerStats()
        offset_map = self.offset_map
        end = self.build_offset_map(log, candidate.first_dirty_offset, candidate.first_uncleanable_offset, stats)
        to_clean = [segment for segment in log.segments[:-1] if segment.base_offset < end]
        groups = group_segments_by_size(
            to_clean, log.config.segment_bytes, log.config.segment_index_bytes, candidate.first_uncleanable_offset
        )
        for group in groups:
            self.clean_segments(log, group, offset_map, now_ms, stats)
        stats.ended = time.monotonic()
        return CleanResult(log.topic, log.partition, candidate.first_dirty_offset, end, len(groups), stats)

    def build_offset_map(self, log: PartitionLog, start: int, end: int, stats: CleanerStats) -> int:
        """Map the keys of offsets [start, end) until the map is full; returns the offset after
        the last one mapped (past a segment's end when the segment was mapped whole)."""
        offset_map = self.offset_map
        offset_map.clear(start)
        dirty = segments_between(log.segments[:-1], start, end)
        for i, segment in enumerate(dirty):
            next_base = dirty[i + 1].base_offset if i + 1 < len(dirty) else end
            if self._map_segment(segment, start, offset_map, stats):
                return offset_map.latest_offset + 1
            offset_map.latest_offset = max(offset_map.latest_offset, next_base - 1)
        return max(offset_map.latest_offset + 1, start)

    @staticmethod
    def _map_segment(segment: LogSegment, start: int, offset_map: OffsetMap, stats: CleanerStats) -> bool:
        """Map one segment's keys from `start`; True when the map filled up on the way."""
        for header, batch in _batches(segment, start):
            if header.last_offset < start:
                continue
            stats.map_bytes_read += len(batch)
            if not header.is_control and not header.is_transactional and header.records_count:
                records = _batch_records_at(segment, header, batch)
                stats.map_records_read += len(records)
                wanted = records.has_key & (records.offsets >= start)
                if bool(wanted.any()):
                    offsets = records.offsets[wanted]
                    mapped = offset_map.put(records.first_hash[wanted], records.second_hash[wanted], offsets)
                    if mapped < len(offsets):
                        return True
            offset_map.latest_offset = max(offset_map.latest_offset, header.last_offset)
        return False

    def clean_segments(
        self, log: PartitionLog, group: list[LogSegment], offset_map: OffsetMap, now_ms: int, stats: CleanerStats
    ) -> None:
        """Rewrite one group of segments into one `.cleaned` segment and swap it in."""
        base = group[0].base_offset
        directory = log.directory
        stale = (log_file(directory, base), offset_index_file(directory, base), time_index_file(directory, base))
        for path in (*stale, directory / f"{filename_prefix_from_offset(base)}{TXN_INDEX_SUFFIX}"):
            path.with_name(path.name + CLEANED_SUFFIX).unlink(missing_ok=True)  # a leftover of a failed pass
        cleaned = segment_for(directory, base, log.config, writable=True, now_ms=now_ms, file_suffix=CLEANED_SUFFIX)
        try:
            writer = _SegmentWriter(cleaned)
            last: tuple[BatchHeader, bool] | None = None
            for segment in group:
                for header, batch in _batches(segment):
                    stats.bytes_read += len(batch)
                    stats.records_read += header.records_count
                    try:
                        kept = self._filter_batch(
                            header,
                            batch,
                            offset_map,
                            delete_retention_ms=log.config.delete_retention_ms,
                            now_ms=now_ms,
                            stats=stats,
                        )
                    except ValueError as exc:
                        raise CorruptRecordError(segment.log_path, header.position, str(exc)) from exc
                    if kept is not None:
                        horizon = writer.add(kept).delete_horizon_ms
                        if horizon is not None:
                            earliest = stats.earliest_delete_horizon
                            stats.earliest_delete_horizon = horizon if earliest is None else min(earliest, horizon)
                    last = (header, kept is not None)
            if last is not None and not last[1]:
                # Every record of the group's last batch is gone: keep its header, so the group
                # still ends where it did and an interrupted swap is finished over all of it.
                # Kafka's cleaner keeps an empty batch only for a producer's state (then with
                # its max timestamp, which the time index names as for any batch) and drops
                # any other: without a producer the header keeps no timestamp, so no time-index
                # entry names a time no record has and retention measures what is left.
                writer.add(empty_batch(last[0], keep_max_timestamp=last[0].producer_id >= 0))
            writer.close()
            # The aborted transactions of the group, carried over (Kafka's cleaned segment keeps
            # them): the markers stay, and the log alone may no longer say where each began.
            carried = [entry for segment in group for entry in segment.transaction_index.entries()]
            cleaned.transaction_index.write(carried)
            stats.bytes_written += cleaned.size
            cleaned.on_become_inactive()
            cleaned.flush()
            mtime = os.stat(group[-1].log_path).st_mtime_ns
            os.utime(cleaned.log_path, ns=(mtime, mtime))
            if not log.replace_segments(group, cleaned, now_ms):
                raise CleaningAbortedError(f"{log.directory}: segments changed while cleaning")
            stats.segments_cleaned += len(group)
        except BaseException:
            # Gone with the failure only if it never took the old segments' place: swapped into
            # the map, it holds their records now (the loader finishes a swap a crash cut short).
            if not any(segment is cleaned for segment in log.segments):
                cleaned.delete_files()
            raise

    @staticmethod
    def _filter_batch(
        header: BatchHeader,
        batch: memoryview,
        offset_map: OffsetMap,
        *,
        delete_retention_ms: int,
        now_ms: int,
        stats: CleanerStats,
    ) -> bytes | bytearray | memoryview | None:
        """The batch as it survives cleaning: unchanged, rebuilt with fewer records (or a delete
        horizon), or None when nothing of it is left."""
        if header.is_control:
            return batch  # markers stay: transactions are not tracked
        if header.records_count == 0:
            return None  # an empty batch a pass left: a group's last batch is kept anyway
        records = batch_records(header, batch)
        offsets = records.offsets
        mapped = offsets <= offset_map.latest_offset  # later records are beyond this pass
        keep = ~mapped.copy()
        keyed = mapped & records.has_key
        stats.invalid_records += int((mapped & ~records.has_key).sum())
        if bool(keyed.any()):
            latest = offset_map.get(records.first_hash[keyed], records.second_hash[keyed])
            is_latest = offsets[keyed] >= latest
            horizon = header.delete_horizon_ms
            tombstones_expired = horizon is not None and now_ms >= horizon
            keep[keyed] = is_latest & ~(records.null_value[keyed] & tombstones_expired)
        kept = int(keep.sum())
        stats.records_written += kept
        needs_horizon = header.delete_horizon_ms is None and bool((keep & records.null_value).any())
        if kept == len(records) and not needs_horizon:
            return batch
        if kept == 0:
            return None
        if needs_horizon:
            decoded = decode_records(header, batch)
            chosen = [decoded[i] for i in np.flatnonzero(keep)]
            return build_batch(
                [record.value for record in chosen],
                keys=[record.key for record in chosen],
                headers=[record.headers for record in chosen],
                timestamps=records.timestamps[keep],
                base_offset=header.base_offset,
                compression=header.compression,
                timestamp_type=header.timestamp_type,
                producer=ProducerState(
                    header.producer_id, header.producer_epoch, header.base_sequence, header.is_transactional
                ),
                partition_leader_epoch=header.partition_leader_epoch,
                offset_deltas=offsets[keep] - header.base_offset,
                last_offset_delta=header.last_offset_delta,
                delete_horizon_ms=now_ms + delete_retention_ms,
            )
        bounds = records.bounds
        section = records.section
        # Runs of kept records are copied whole, with their bytes unchanged.
        edges = np.flatnonzero(np.diff(np.concatenate([[False], keep, [False]]).astype(np.int8)))
        pieces = [section[bounds[lo] : bounds[hi]] for lo, hi in zip(edges[0::2], edges[1::2], strict=True)]
        if header.timestamp_type is TimestampType.LOG_APPEND_TIME:
            max_timestamp = header.max_timestamp
        else:
            max_timestamp = int(records.timestamps[keep].max())
        return rebuild_batch(header, b"".join(pieces), kept, max_timestamp)


class _SegmentWriter:
    """Appends batches to the cleaned segment in chunks of about a megabyte."""

    def __init__(self, segment: LogSegment) -> None:
        self.segment = segment
        self._buffer = bytearray()
        self._headers: list[BatchHeader] = []

    def add(self, batch: bytes | bytearray | memoryview) -> BatchHeader:
        header = BatchHeader.parse(batch, 0, len(self._buffer))
        self._headers.append(header)
        self._buffer += batch
        if len(self._buffer) >= _WRITE_CHUNK_BYTES:
            self.close()
        return header

    def close(self) -> None:
        if self._buffer:
            self.segment.append(self._buffer, self._headers)
            self._buffer = bytearray()
            self._headers = []
