"""A task's read: one segment slice → Arrow record batches in Spark's Kafka source schema.

The slice's bytes are read as whole batches (`LogSegment.checked_batches`: CRC-checked) from its
start position to its end position, and nothing else. Records are gathered into Arrow columns
without a Python object per record, in one of two ways:

* runs (the common case: producers send records of one size): `engine.columns.record_runs`
  proves a batch's records to be runs of one layout, each a `(records, stride)` numpy view of
  the records section (in place when uncompressed). Offsets and timestamps come from strided
  columns of it; every key (value) of a run is a fixed-size item at one column, so a run's keys
  are copied into the Arrow `binary` data buffer with one numpy assignment, and its offsets are
  an arithmetic progression.
* other batches: `engine.columns.record_columns` (numpy arrays of offsets, timestamps and
  key/value bounds); keys and values become Arrow binary *views* over the batches' records
  sections, which Arrow's C++ cast copies into plain `binary` (the type Spark requires). An
  Arrow batch mixing both kinds is built this way throughout.

Either way records are filtered with numpy (offset range, pushed filters), and about
`_ROWS_PER_ARROW_BATCH` rows go into each Arrow batch. Only `includeHeaders` decodes records
one by one, for batches that carry headers. Control batches hold no user records and are skipped.

When the segment file is no longer the one planning saw (compaction swapped it, retention
deleted it), the slice's offsets are read through the partition's log instead, with Spark's
data-loss rule for offsets gone meanwhile.

Counting: with `SEGLOGFS_READ_METRICS_DIR` set in the executors' environment, each slice appends
one JSON line (topic, partition, base offset, bytes of batches read, batches, rows) to
`reads.jsonl` there — what the tests use to check that pushed filters read less.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from seglogfs.engine import DataDir, UnknownTopicOrPartitionError
from seglogfs.engine.columns import record_columns, record_runs
from seglogfs.engine.compression import CompressionType
from seglogfs.engine.errors import CorruptRecordError
from seglogfs.engine.naming import log_file
from seglogfs.engine.records import (
    BATCH_OVERHEAD_BYTES,
    BatchHeader,
    Header,
    TimestampType,
    decode_records,
    records_section,
)
from seglogfs.engine.segment import LogSegment
from seglogfs.pipeline.options import EngineSettings, Location
from seglogfs.pipeline.planning import DataLossError, RowFilter, SegmentSlice

METRICS_ENV = "SEGLOGFS_READ_METRICS_DIR"
METRICS_FILE = "reads.jsonl"

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

_ROWS_PER_ARROW_BATCH = 1 << 17
_BYTES_PER_ARROW_BATCH = 32 << 20  # records sections gathered into one Arrow batch
_INLINE = 12  # Arrow binary views keep values of up to 12 bytes inline
_VIEW_PAD = bytes(16)


def _cast_pool() -> pa.MemoryPool:
    """jemalloc for the gathered key and value bytes where pyarrow has it: with the default
    mimalloc pool, every large output buffer is faulted in afresh (measured: reads about 1.6×
    slower)."""
    try:
        return pa.jemalloc_memory_pool()
    except NotImplementedError:
        return pa.default_memory_pool()


_CAST_POOL = _cast_pool()


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


# -- Arrow columns from record bounds -------------------------------------------------------------
def binary_column(buffer: bytes, starts: np.ndarray, lengths: np.ndarray) -> pa.Array:
    """The byte strings `buffer[starts[i]:starts[i] + lengths[i]]` (length -1: null) as an Arrow
    `binary` array: 16-byte views built with numpy (inline for up to 12 bytes, else prefix and
    position), then one C++ cast to contiguous `binary`. `buffer` must stay below 2 GiB and end
    with 16 bytes that no value uses (`padded`): the views' fixed-size reads may reach them."""
    n = len(starts)
    valid = lengths >= 0
    sizes = np.where(valid, lengths, 0).astype(np.int32)
    padded = np.frombuffer(buffer, np.uint8)
    views = np.zeros((n, 16), np.uint8)
    words = views.view(np.int32)
    words[:, 0] = sizes
    short = sizes <= _INLINE
    if short.any():
        at = starts[short]
        inline = padded[at[:, None] + np.arange(_INLINE)]
        inline *= np.arange(_INLINE) < sizes[short, None]  # zero what lies past each value
        views[short, 4:16] = inline
    long = ~short
    if long.any():
        at = starts[long]
        views[long, 4:8] = padded[at[:, None] + np.arange(4)]
        words[long, 3] = at  # buffer index 0 (words[:, 2]) and offset
    null_count = int(n - np.count_nonzero(valid))
    validity = None if null_count == 0 else pa.py_buffer(np.packbits(valid, bitorder="little"))
    array = pa.Array.from_buffers(
        pa.binary_view(), n, [validity, pa.py_buffer(views), pa.py_buffer(buffer)], null_count=null_count
    )
    return pc.cast(array, pa.binary(), memory_pool=_CAST_POOL)


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
    `values`."""
    offsets = np.zeros(len(counts) + 1, np.int32)
    np.cumsum(counts, out=offsets[1:])
    entries = pa.StructArray.from_arrays(
        [pa.array(keys, pa.string()), pa.array(values, pa.binary())], fields=list(HEADER_TYPE)
    )
    return pa.ListArray.from_arrays(pa.array(offsets), entries, type=HEADERS_TYPE)


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


@dataclass(slots=True)
class _Run:
    """Selected records of one `RecordRun` (its rows, or a copy of the kept ones)."""

    rows: np.ndarray
    key_at: int
    key_length: int
    value_at: int
    value_length: int


def _run_binary(runs: list[_Run], key: bool) -> pa.Array:
    """The keys (or values) of `runs` as an Arrow `binary` array: each run's field is a strided
    column of fixed-size items, copied into place with one numpy assignment."""
    sizes = [(run.key_length if key else run.value_length) for run in runs]
    n = sum(len(run.rows) for run in runs)
    data = np.empty(sum(len(run.rows) * max(size, 0) for run, size in zip(runs, sizes, strict=True)), np.uint8)
    data_buffer = pa.py_buffer(data)
    offsets = np.empty(n + 1, np.int32)
    offsets[0] = 0
    valid: np.ndarray | None = None
    row = byte = 0
    for run, size in zip(runs, sizes, strict=True):
        count = len(run.rows)
        if size > 0:
            stride = run.rows.shape[1]
            at = run.key_at if key else run.value_at
            items = np.ndarray((count,), f"V{size}", buffer=run.rows, offset=at, strides=(stride,))
            data[byte : byte + count * size].view(f"V{size}")[...] = items
            offsets[row + 1 : row + count + 1] = np.arange(byte + size, byte + (count + 1) * size, size, dtype=np.int32)
            byte += count * size
        else:
            offsets[row + 1 : row + count + 1] = byte
            if size < 0:
                if valid is None:
                    valid = np.ones(n, np.bool_)
                valid[row : row + count] = False
        row += count
    null_count = 0 if valid is None else int(n - np.count_nonzero(valid))
    validity = None if valid is None else pa.py_buffer(np.packbits(valid, bitorder="little"))
    return pa.Array.from_buffers(pa.binary(), n, [validity, pa.py_buffer(offsets), data_buffer], null_count=null_count)


class _Rows:
    """Selected records accumulated across batches until an Arrow batch is worth emitting.

    Batches whose records come in runs of one layout (`record_runs`) are kept as runs; others
    as `RecordColumns`-like bounds over their records sections. Keys and values are gathered
    from runs by `_run_binary`, or, when an Arrow batch mixes both kinds, all through
    `binary_column`."""

    def __init__(self, topic: str, partition: int, include_headers: bool) -> None:
        self.topic = topic
        self.partition = partition
        self.include_headers = include_headers
        self._reset()

    def _reset(self) -> None:
        self.pieces: list[_Run | tuple[bytes, np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = []
        self.section_bytes = 0
        self.columns: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []  # offsets, timestamps, types
        self.rows = 0
        self.header_counts: list[np.ndarray] = []
        self.header_keys: list[str] = []
        self.header_values: list[bytes | None] = []

    def add(self, header: BatchHeader, batch: memoryview, row_filter: RowFilter, lo: int, hi: int) -> None:
        """Take the records of one (checked, non-control) batch with offsets in [lo, hi) that
        pass `row_filter`."""
        if header.compression is CompressionType.NONE:  # the records in place, not a copy
            section = None
            records = np.frombuffer(batch, np.uint8, offset=BATCH_OVERHEAD_BYTES)
        else:
            section = records_section(header, batch)
            records = np.frombuffer(section, np.uint8)
        runs = record_runs(records, header.records_count)
        if runs is None or (self.include_headers and any(run.header_count for run in runs)):
            self._add_columns(header, batch, section, row_filter=row_filter, lo=lo, hi=hi)
            return
        log_append_time = header.max_timestamp if header.timestamp_type is TimestampType.LOG_APPEND_TIME else None
        for run in runs:
            offsets = header.base_offset + run.offset_deltas
            if log_append_time is None:
                timestamps = header.base_timestamp + run.timestamp_deltas
            else:
                timestamps = np.full(len(run), log_append_time, np.int64)
            rows = run.rows
            keep = _keep(header, offsets, timestamps, row_filter=row_filter, lo=lo, hi=hi)
            if keep is not None:
                if not keep.any():
                    continue
                rows, offsets, timestamps = rows[keep], offsets[keep], timestamps[keep]
            self.pieces.append(_Run(rows, run.key_at, run.key_length, run.value_at, run.value_length))
            self._add_rows(offsets, timestamps, int(header.timestamp_type), rows.size)
            if self.include_headers:
                self.header_counts.append(np.zeros(len(offsets), np.int64))

    def _add_columns(
        self, header: BatchHeader, batch: memoryview, section: bytes | None, *, row_filter: RowFilter, lo: int, hi: int
    ) -> None:
        """`add` for a batch not made of runs: its records laid out by `record_columns`."""
        columns = record_columns(header, batch, section)
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
        if all(isinstance(piece, _Run) for piece in self.pieces):
            runs = [piece for piece in self.pieces if isinstance(piece, _Run)]
            return _run_binary(runs, key=True), _run_binary(runs, key=False)
        sections: list[bytes] = []
        bounds: list[tuple[np.ndarray, ...]] = []
        base = 0
        for piece in self.pieces:
            if isinstance(piece, _Run):
                count, stride = piece.rows.shape
                starts = base + np.arange(count, dtype=np.int64) * stride
                section = piece.rows.tobytes()
                key_lengths = np.full(count, piece.key_length, np.int64)
                value_lengths = np.full(count, piece.value_length, np.int64)
                bounds.append((starts + piece.key_at, key_lengths, starts + piece.value_at, value_lengths))
                size = len(section)
            else:
                section, key_starts, key_lengths, value_starts, value_lengths = piece
                bounds.append((key_starts + base, key_lengths, value_starts + base, value_lengths))
                size = len(section)
            sections.append(section)
            base += size
        key_starts, key_lengths, value_starts, value_lengths = (
            np.concatenate(parts) for parts in zip(*bounds, strict=True)
        )
        buffer = b"".join([*sections, _VIEW_PAD])
        return binary_column(buffer, key_starts, key_lengths), binary_column(buffer, value_starts, value_lengths)

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


def _same_file(path: Path, file_id: tuple[int, int]) -> bool:
    try:
        stat = os.stat(path)
    except FileNotFoundError:
        return False
    return (stat.st_dev, stat.st_ino) == file_id


def _batches_in_slice(piece: SegmentSlice, stats: ReadStats) -> Iterator[tuple[BatchHeader, memoryview]]:
    """The slice's batches straight from its segment file, whose identity the caller checked."""
    segment = LogSegment(
        Path(piece.directory),
        piece.base_offset,
        index_interval_bytes=4096,  # (indexes are not used: positions come from planning)
        max_index_bytes=1 << 20,
        writable=False,
        created_ms=0,
    )
    try:
        for header, batch in segment.checked_batches(piece.start_position, piece.end_position):
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
    broker = spec.engine.broker_config(spec.location.log_dirs)
    with DataDir.open(broker, read_only=True, now_ms=0) as data_dir:
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
    if _same_file(log_file(Path(piece.directory), piece.base_offset), piece.file_id):
        batches = _batches_in_slice(piece, stats)
    else:
        batches = _batches_through_log(piece, spec, stats)
    try:
        for header, batch in batches:
            if header.is_control or header.last_offset < lo:
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
    fd = os.open(os.path.join(directory, METRICS_FILE), os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)
