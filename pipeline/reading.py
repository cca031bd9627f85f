"""A task's read: one segment slice → Arrow record batches in Spark's Kafka source schema.

The slice's bytes are read as whole batches (`FileRecords.checked_batches`: CRC-checked) from its
start position to its end position, and nothing else. Records are gathered into Arrow columns
without a Python object per record: the engine's core walks each batch's records
(`engine.record.columns.record_columns`: offsets, timestamps and key/value bounds as numpy columns, over
the records section in place when uncompressed), numpy filters them (offset range, pushed
filters), and the core copies the kept keys and values into Arrow `binary` buffers
(`_core.gather`). About `_ROWS_PER_ARROW_BATCH` rows go into each Arrow batch. Only
`includeHeaders` decodes records one by one, for batches that carry headers. Control batches
hold no user records and are skipped.

When the segment file is no longer the one planning saw (compaction swapped it, retention
deleted it), the slice's offsets are read through the partition's log instead, with Spark's
data-loss rule for offsets gone meanwhile.

Counting: with `SEGLOGFS_READ_METRICS_DIR` set in the executors' environment, each slice appends
one JSON line (topic, partition, base offset, bytes of batches read, batches, rows) to
`reads.jsonl` there — what the tests use to check that pushed filters read less.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa

from seglogfs.engine import DataDir, UnknownTopicOrPartitionError, _core
from seglogfs.engine.errors import CorruptRecordError, UnsafeFileError
from seglogfs.engine.fetched_files import BUDGET as FETCH_BUDGET
from seglogfs.engine.fetched_files import fetched_file
from seglogfs.engine.log.file_records import FileRecords
from seglogfs.engine.log.naming import log_file
from seglogfs.engine.log.transactions import AbortedIndex
from seglogfs.engine.record.columns import record_columns
from seglogfs.engine.record.records import (
    BatchHeader,
    Header,
    decode_records,
)
from seglogfs.engine.stored.local_copy import Partitions, stored_segment
from seglogfs.pipeline.options import EngineSettings, Location, SourceOptions
from seglogfs.pipeline.planning import DataLossError, RowFilter, SegmentSlice, open_read_only

METRICS_ENV = "SEGLOGFS_READ_METRICS_DIR"
METRICS_FILE = "reads.jsonl"
FETCHES_FILE = "fetches.jsonl"  # (what was fetched from object storage, by planning and by tasks)

HEADER_TYPE = pa.struct([pa.field("key", pa.string()), pa.field("value", pa.binary())])
HEADERS_TYPE = pa.list_(pa.field("element", HEADER_TYPE))
BASE_FIELDS = [
    pa.field("key", pa.binary()),
    pa.field("value", pa.binary()),
    pa.field("topic", pa.string()),
    pa.field("partition", pa.int32()),
    pa.field("offset", pa.int64()),
    pa.field("timestamp", pa.timestamp("us", tz="UTC")),
    pa.field("timestampType", pa.int32()),
]
ARROW_SCHEMA = pa.schema(BASE_FIELDS)
ARROW_SCHEMA_WITH_HEADERS = pa.schema([*BASE_FIELDS, pa.field("headers", HEADERS_TYPE)])

_ROWS_PER_ARROW_BATCH = 1 << 15  # measured (10 M rows, local[2]): 2^13 4.4, 2^15 4.9-5.1, 2^17 4.7, 2^19 4.1 M rows/s
_BYTES_PER_ARROW_BATCH = 32 << 20  # records sections gathered into one Arrow batch


def _pool() -> pa.MemoryPool:
    """jemalloc for the gathered key and value bytes where pyarrow has it: with the default
    mimalloc pool, every large output buffer is faulted in afresh (measured: reads about 1.6×
    slower)."""
    try:
        return pa.jemalloc_memory_pool()
    except NotImplementedError:
        return pa.default_memory_pool()


_POOL = _pool()


@dataclass(frozen=True)
class ReadSpec:
    """What every task of a query needs besides its slice."""

    location: Location
    engine: EngineSettings
    include_headers: bool = False
    fail_on_data_loss: bool = True
    row_filter: RowFilter = field(default_factory=RowFilter)

    @property
    def arrow_schema(self) -> pa.Schema:
        return ARROW_SCHEMA_WITH_HEADERS if self.include_headers else ARROW_SCHEMA

    @classmethod
    def of(cls, options: SourceOptions) -> ReadSpec:
        """What the tasks of a batch read or of a stream's micro-batches need of its options."""
        return cls(
            options.location,
            options.engine,
            include_headers=options.include_headers,
            fail_on_data_loss=options.fail_on_data_loss,
        )


# -- Arrow columns from record bounds -------------------------------------------------------------
def binary_column(pieces: Sequence[tuple[bytes, np.ndarray, np.ndarray]]) -> pa.Array:
    """The byte strings `section[starts[i]:starts[i] + lengths[i]]` (length -1: null) of each
    `(section, starts, lengths)` piece, in order, as one Arrow `binary` array: sized with numpy,
    copied into Arrow's data buffer by the engine's core (`_core.gather`)."""
    n = sum(len(starts) for _, starts, _ in pieces)
    lengths = np.concatenate([piece[2] for piece in pieces]) if pieces else np.zeros(0, np.int64)
    valid = lengths >= 0
    data = pa.allocate_buffer(int(lengths[valid].sum()), memory_pool=_POOL)
    offsets = np.empty(n + 1, np.int32)
    offsets[0] = 0
    row = 0
    for section, starts, piece_lengths in pieces:
        count = len(starts)
        _core.gather(
            section,
            np.ascontiguousarray(starts, np.int64),
            np.ascontiguousarray(piece_lengths, np.int64),
            data,
            offsets[row : row + count + 1],
        )
        row += count
    null_count = int(n - np.count_nonzero(valid))
    validity = None if null_count == 0 else pa.py_buffer(np.packbits(valid, bitorder="little"))
    return pa.Array.from_buffers(pa.binary(), n, [validity, pa.py_buffer(offsets), data], null_count=null_count)


def _header_key(key: str) -> str:
    # The engine keeps undecodable bytes as surrogates; Arrow strings must be valid UTF-8 (Java's
    # decoding, which Spark's Kafka source uses, puts U+FFFD in their place).
    try:
        key.encode("utf-8")
    except UnicodeEncodeError:
        return key.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
    return key


def headers_column(counts: np.ndarray, keys: list[str], values: list[bytes | None]) -> pa.Array:
    """Per row a list of (key, value) structs: `counts[i]` headers each, flattened in `keys` and
    `values`; null for a record without headers, as Spark's Kafka source gives it
    (KafkaRecordToRowConverter), not an empty list."""
    offsets = np.zeros(len(counts) + 1, np.int32)
    np.cumsum(counts, out=offsets[1:])
    entries = pa.StructArray.from_arrays(
        [pa.array(keys, pa.string()), pa.array(values, pa.binary())], fields=list(HEADER_TYPE)
    )
    return pa.ListArray.from_arrays(
        pa.array(offsets), entries, type=HEADERS_TYPE, mask=pa.array(np.asarray(counts) == 0)
    )


def _keep(
    header: BatchHeader, offsets: np.ndarray, timestamps: np.ndarray, *, row_filter: RowFilter, lo: int, hi: int
) -> np.ndarray | None:
    """Which of a batch's records (or of a run of them) have offsets in [lo, hi) and pass
    `row_filter`; None for all of them."""
    keep: np.ndarray | None = None
    if header.base_offset < lo or header.last_offset >= hi:
        keep = (offsets >= lo) & (offsets < hi)
    if row_filter.offsets_in is not None:
        wanted = np.isin(offsets, np.fromiter(row_filter.offsets_in, np.int64, len(row_filter.offsets_in)))
        keep = wanted if keep is None else keep & wanted
    if row_filter.min_timestamp_ms is not None:
        late = timestamps >= row_filter.min_timestamp_ms
        keep = late if keep is None else keep & late
    if row_filter.end_timestamp_ms is not None:
        early = timestamps < row_filter.end_timestamp_ms
        keep = early if keep is None else keep & early
    return keep


class _Rows:
    """Selected records accumulated across batches until an Arrow batch is worth emitting: per
    batch its records section (in place when uncompressed) and the bounds of the kept records'
    keys and values (`record_columns`), gathered into Arrow columns by `take`."""

    def __init__(self, topic: str, partition: int, include_headers: bool) -> None:
        self.topic = topic
        self.partition = partition
        self.include_headers = include_headers
        self._reset()

    def _reset(self) -> None:
        self.pieces: list[tuple[bytes, np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = []
        self.section_bytes = 0
        self.columns: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []  # offsets, timestamps, types
        self.rows = 0
        self.header_counts: list[np.ndarray] = []
        self.header_keys: list[str] = []
        self.header_values: list[bytes | None] = []

    def add(self, header: BatchHeader, batch: memoryview, row_filter: RowFilter, lo: int, hi: int) -> None:
        """Take the records of one (checked, non-control) batch with offsets in [lo, hi) that
        pass `row_filter`."""
        columns = record_columns(header, batch)
        offsets = columns.offsets
        timestamps = columns.consumer_timestamps()
        keep = _keep(header, offsets, timestamps, row_filter=row_filter, lo=lo, hi=hi)
        bounds = (columns.key_starts, columns.key_lengths, columns.value_starts, columns.value_lengths)
        counts = columns.header_counts
        if keep is not None:
            if not keep.any():
                return
            offsets, timestamps, counts = offsets[keep], timestamps[keep], counts[keep]
            bounds = tuple(column[keep] for column in bounds)
        key_starts, key_lengths, value_starts, value_lengths = bounds
        self.pieces.append((columns.section, key_starts, key_lengths, value_starts, value_lengths))
        self._add_rows(offsets, timestamps, int(header.timestamp_type), len(columns.section))
        if self.include_headers:
            self.header_counts.append(counts)
            if counts.any():
                records = decode_records(header, batch)
                chosen = records if keep is None else [r for r, k in zip(records, keep.tolist(), strict=True) if k]
                for record in chosen:
                    self._add_headers(record.headers)

    def _add_rows(self, offsets: np.ndarray, timestamps: np.ndarray, timestamp_type: int, size: int) -> None:
        self.columns.append((offsets, timestamps, np.full(len(offsets), timestamp_type, np.int32)))
        self.rows += len(offsets)
        self.section_bytes += size

    def _add_headers(self, headers: tuple[Header, ...]) -> None:
        for key, value in headers:
            self.header_keys.append(_header_key(key))
            self.header_values.append(value)

    @property
    def full(self) -> bool:
        return self.rows >= _ROWS_PER_ARROW_BATCH or self.section_bytes >= _BYTES_PER_ARROW_BATCH

    def _binary_columns(self) -> tuple[pa.Array, pa.Array]:
        """Keys and values of every piece."""
        keys = binary_column([(section, starts, lengths) for section, starts, lengths, _, _ in self.pieces])
        values = binary_column([(section, starts, lengths) for section, _, _, starts, lengths in self.pieces])
        return keys, values

    def take(self, schema: pa.Schema) -> pa.RecordBatch | None:
        """The accumulated rows as one Arrow batch (None when there are none); starts afresh."""
        if not self.rows:
            self._reset()
            return None
        offsets, timestamps, types = (np.concatenate(parts) for parts in zip(*self.columns, strict=True))
        keys, values = self._binary_columns()
        n = len(offsets)
        arrays = [
            keys,
            values,
            pa.repeat(pa.scalar(self.topic, pa.string()), n),
            pa.array(np.full(n, self.partition, np.int32)),
            pa.array(offsets.astype(np.int64, copy=False)),
            pa.array(timestamps.astype(np.int64) * 1000, pa.timestamp("us", tz="UTC")),
            pa.array(types),
        ]
        if self.include_headers:
            arrays.append(headers_column(np.concatenate(self.header_counts), self.header_keys, self.header_values))
        self._reset()
        return pa.RecordBatch.from_arrays(arrays, schema=schema)


# -- reading a slice ------------------------------------------------------------------------------
@dataclass
class ReadStats:
    bytes: int = 0
    batches: int = 0
    rows: int = 0
    through_log: bool = False


def _planned_segment(piece: SegmentSlice, location: Location) -> FileRecords | None:
    """The slice's segment file, open, when it is still the file planning measured; None when
    retention removed it or compaction swapped another in since (the log is read instead). A
    backup's segment in object storage is read from the objects planning found, wherever the
    task runs (they never change): never through the planning process's placeholder, which on
    the same host has the same path but holes where that process fetched nothing."""
    if piece.stored and location.store_uri is not None and fetched_file(piece.file_id) is None:
        return stored_segment(location.store_uri, piece.stored)
    try:
        return FileRecords.open_for_reading(log_file(Path(piece.directory), piece.base_offset), piece.file_id)
    except FileNotFoundError:
        pass
    except UnsafeFileError:
        return None  # (the log's own read refuses what stands in its place, and says so)
    except OSError as error:
        if error.errno != errno.ESTALE:
            raise
    if piece.stored and location.store_uri is not None:
        return stored_segment(location.store_uri, piece.stored)
    return None


def _batches_in_slice(
    segment: FileRecords, piece: SegmentSlice, stats: ReadStats
) -> Iterator[tuple[BatchHeader, memoryview]]:
    """The slice's batches straight from its segment file (`_planned_segment`), which this closes."""
    try:
        # (a sealed slice is whole batches: else the rest of it would be skipped at damage)
        for header, batch in segment.checked_batches(piece.start_position, piece.end_position, to_end=piece.sealed):
            if header.base_offset >= piece.until_offset:
                return
            stats.bytes += header.size_in_bytes
            stats.batches += 1
            yield header, batch
    finally:
        segment.close()


def _batches_through_log(
    piece: SegmentSlice, spec: ReadSpec, stats: ReadStats
) -> Iterator[tuple[BatchHeader, memoryview]]:
    """The slice's offsets read through the partition's log, opened afresh (its segment file
    changed since planning). Offsets gone below the log start offset meanwhile are data loss."""
    stats.through_log = True
    if spec.location.store_uri is not None:
        opened = open_read_only(
            spec.location,
            spec.engine,
            now_ms=0,
            partitions=Partitions(partitions=frozenset([(piece.topic, piece.partition)])),
        )
    else:  # (a log dir gone since planning: no topics, and data loss below)
        opened = DataDir.open(spec.engine.broker_config(spec.location.log_dirs), read_only=True, now_ms=0)
    with opened as data_dir:
        try:
            log = data_dir.partition(piece.topic, piece.partition)
        except UnknownTopicOrPartitionError:
            if spec.fail_on_data_loss:
                raise DataLossError(f"{piece.topic}-{piece.partition} disappeared while the query ran") from None
            return
        start = piece.from_offset
        if start < log.log_start_offset:
            if spec.fail_on_data_loss:
                raise DataLossError(
                    f"{piece.topic}-{piece.partition}: offsets [{start}, {log.log_start_offset}) were deleted while "
                    "the query ran. Set failOnDataLoss to false to read what remains."
                )
            start = log.log_start_offset
        if start >= piece.until_offset:
            return
        for _segment, header, batch in log.batches(start, piece.until_offset):
            stats.bytes += header.size_in_bytes
            stats.batches += 1
            yield header, batch


def read_slice(piece: SegmentSlice, spec: ReadSpec) -> Iterator[pa.RecordBatch]:
    """The records of `piece` that `spec.row_filter` keeps, as Arrow batches in `spec`'s schema."""
    stats = ReadStats()
    rows = _Rows(piece.topic, piece.partition, spec.include_headers)
    schema = spec.arrow_schema
    lo, hi = piece.from_offset, piece.until_offset
    segment = _planned_segment(piece, spec.location)
    if segment is not None:
        batches = _batches_in_slice(segment, piece, stats)
    else:
        batches = _batches_through_log(piece, spec, stats)
    aborted = AbortedIndex(piece.aborted) if piece.aborted else None  # read_committed
    try:
        for header, batch in batches:
            if header.is_control or header.last_offset < lo:
                continue
            if aborted is not None and aborted.covers(header):
                continue
            minimum = spec.row_filter.min_timestamp_ms
            if minimum is not None and header.max_timestamp < minimum:
                continue  # every record of the batch is older (its max timestamp says so)
            try:
                rows.add(header, batch, spec.row_filter, lo, hi)
            except ValueError as error:  # a malformed records section in a batch whose CRC held
                raise CorruptRecordError(
                    str(log_file(Path(piece.directory), piece.base_offset)), header.position, str(error)
                ) from None
            if rows.full:
                stats.rows += rows.rows
                record_batch = rows.take(schema)
                if record_batch is not None:
                    yield record_batch
        stats.rows += rows.rows
        record_batch = rows.take(schema)
        if record_batch is not None:
            yield record_batch
    finally:
        _report(piece, stats)


@contextlib.contextmanager
def counting_fetches(where: str) -> Iterator[None]:
    """With METRICS_ENV set: what this process fetched from object storage while the block ran
    (bytes and requests; a backup's segments read where they are), as a line of FETCHES_FILE."""
    directory = os.environ.get(METRICS_ENV)
    if not directory:
        yield
        return
    before = (FETCH_BUDGET.fetched_bytes, FETCH_BUDGET.requests)
    try:
        yield
    finally:
        fetched = {
            "where": where,
            "bytes": FETCH_BUDGET.fetched_bytes - before[0],
            "requests": FETCH_BUDGET.requests - before[1],
        }
        _append(os.path.join(directory, FETCHES_FILE), json.dumps(fetched))


def _append(path: str, line: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


def _report(piece: SegmentSlice, stats: ReadStats) -> None:
    directory = os.environ.get(METRICS_ENV)
    if not directory:
        return
    line = json.dumps(
        {
            "topic": piece.topic,
            "partition": piece.partition,
            "base_offset": piece.base_offset,
            "from_offset": piece.from_offset,
            "until_offset": piece.until_offset,
            "bytes": stats.bytes,
            "batches": stats.batches,
            "rows": stats.rows,
            "through_log": stats.through_log,
        }
    )
    _append(os.path.join(directory, METRICS_FILE), line)
