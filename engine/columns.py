"""The records of a batch, column-wise: where each record's fields lie in the batch's uncompressed
records section, as numpy arrays, without a Python object per record.

A record (Kafka's DefaultRecord) is a sequence of varints and bytes:

    length (varint: the bytes after it) · attributes (1 byte, unused) · timestamp delta (varlong)
    · offset delta (varint) · key length (varint, -1 = null) · key · value length (varint, -1 =
    null) · value · header count (varint) · headers

Walking that per record in Python costs microseconds a record; the cleaner, the views and
`consume` read millions. `record_columns` walks the records in the engine's compiled core
(`_core.record_fields`, engine/_core.c: every field of every record in one call, the GIL
released) and hands them over as numpy columns. Headers are located (their count) but not
decoded: callers that need them decode the batch with `decode_records`.

`record_runs` serves bulk readers of batches whose records come in long runs of one *layout*
(the same size, key and value sizes and header count; timestamp and offset deltas varints of
the same byte count): each run is a two-dimensional `(records, stride)` view of the section, so
a field of every record is a strided column — no gather, no per-record position arithmetic.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from seglogfs.engine import _core, varint
from seglogfs.engine.records import BatchHeader, TimestampType, records_section

_FIRST_RUN_GUESS = 64  # records checked at once for a run of one layout, before one is proven
_MIN_LAYOUT_RUN = 16  # runs of one layout shorter than this on average: `record_runs` gives up


# (section, offsets, timestamps, key starts, key lengths, value starts, value lengths)
CoreColumns = tuple[bytes, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]


@dataclass(slots=True)
class RecordColumns:
    """A batch's records column-wise. Record `i` is `section[bounds[i]:bounds[i + 1]]`, length
    prefix included; its key is `section[key_starts[i]:key_starts[i] + key_lengths[i]]` (length
    -1: null), its value likewise. `timestamps` are as stored (base timestamp + delta); consumers
    see `consumer_timestamps()`."""

    section: bytes
    bounds: np.ndarray
    offsets: np.ndarray
    timestamps: np.ndarray
    key_starts: np.ndarray
    key_lengths: np.ndarray
    value_starts: np.ndarray
    value_lengths: np.ndarray
    header_counts: np.ndarray
    log_append_time: int | None  # a LogAppendTime batch's time, which consumers see for every record

    def __len__(self) -> int:
        return len(self.offsets)

    def consumer_timestamps(self) -> np.ndarray:
        """Each record's timestamp as Kafka's consumers report it: for LogAppendTime batches the
        batch's max timestamp."""
        if self.log_append_time is None:
            return self.timestamps
        return np.full(len(self.timestamps), self.log_append_time, np.int64)

    def keys(self, null: bytes | None = None) -> list[bytes | None]:
        """Each record's key (`null` for a null key)."""
        return _slices(self.section, self.key_starts, self.key_lengths, null)

    def values(self, null: bytes | None = None) -> list[bytes | None]:
        """Each record's value (`null` for a null value)."""
        return _slices(self.section, self.value_starts, self.value_lengths, null)

    def from_record(self, first: int) -> CoreColumns:
        """(section, offsets, consumer timestamps, key starts, key lengths, value starts, value
        lengths) of records `first`…: what the compiled core's renderers take."""
        return (
            self.section,
            self.offsets[first:],
            self.consumer_timestamps()[first:],
            self.key_starts[first:],
            self.key_lengths[first:],
            self.value_starts[first:],
            self.value_lengths[first:],
        )

    def first_at_or_after(self, offset: int) -> int:
        """Index of the first record with offset ≥ `offset` (offsets rise within a batch)."""
        return int(np.searchsorted(self.offsets, offset))


def _slices(section: bytes, starts: np.ndarray, lengths: np.ndarray, null: bytes | None) -> list[bytes | None]:
    ends = (starts + lengths).tolist()
    pieces: list[bytes | None] = [section[s:e] for s, e in zip(starts.tolist(), ends, strict=True)]
    if len(lengths) and int(lengths.min()) < 0:
        for i in np.flatnonzero(lengths < 0).tolist():
            pieces[i] = null
    return pieces


def record_columns(
    header: BatchHeader, batch: bytes | bytearray | memoryview, section: bytes | None = None
) -> RecordColumns:
    """Lay out a valid batch's records column-wise (the CRC checked by the caller); `section`:
    its records section when the caller has it uncompressed already. Raises ValueError (or a
    codec error) when the records section is malformed."""
    if section is None:
        section = records_section(header, batch)
    count = header.records_count
    fields = np.empty((count, 8), np.int64)
    _core.record_fields(section, count, fields)  # ValueError naming the record when malformed
    bounds = np.empty(count + 1, np.int64)
    bounds[:-1] = fields[:, 0]
    bounds[-1] = len(section)
    by_field = np.ascontiguousarray(fields.T)  # each column contiguous (the core takes them as buffers)
    timestamp_deltas, offset_deltas = by_field[1], by_field[2]
    key_starts, key_lengths, value_starts, value_lengths, header_counts = by_field[3:8]
    return RecordColumns(
        section=section,
        bounds=bounds,
        offsets=header.base_offset + offset_deltas,
        timestamps=header.base_timestamp + timestamp_deltas,
        key_starts=key_starts,
        key_lengths=key_lengths,
        value_starts=value_starts,
        value_lengths=value_lengths,
        header_counts=header_counts,
        log_append_time=header.max_timestamp if header.timestamp_type is TimestampType.LOG_APPEND_TIME else None,
    )


@dataclass(frozen=True, slots=True)
class RecordRun:
    """Consecutive records of one layout: record `i` of the run is `rows[i]` (a `(count, stride)`
    uint8 view of the records section, length prefix included), its key `rows[i, key_at:key_at +
    key_length]` (length -1: every key of the run null), its value likewise, followed by
    `header_count` headers. Deltas are as stored (add the batch's base offset and timestamp)."""

    rows: np.ndarray
    key_at: int
    key_length: int
    value_at: int
    value_length: int
    header_count: int
    timestamp_deltas: np.ndarray
    offset_deltas: np.ndarray

    def __len__(self) -> int:
        return len(self.rows)


def _column_varints(rows: np.ndarray, at: int, size: int) -> np.ndarray:
    """The zig-zag varints of `size` bytes at column `at` of every row, whose continuation bits
    are known to be set on every byte but the last: those bits are subtracted once instead of
    masked off each byte."""
    if size == 1:
        small = rows[:, at].astype(np.int64)
        return (small >> 1) ^ -(small & 1)
    if size < 10:  # up to 63 bits: int64 holds the sum
        zigzag = rows[:, at].astype(np.int64)
        for j in range(1, size):
            zigzag += rows[:, at + j].astype(np.int64) << (7 * j)
        zigzag -= sum(0x80 << (7 * j) for j in range(size - 1))
        return (zigzag >> 1) ^ -(zigzag & 1)
    unsigned = rows[:, at].astype(np.uint64) & np.uint64(0x7F)
    for j in range(1, size):
        unsigned |= (rows[:, at + j].astype(np.uint64) & np.uint64(0x7F)) << np.uint64(7 * j)
    return (unsigned >> np.uint64(1)).astype(np.int64) ^ -(unsigned & np.uint64(1)).astype(np.int64)


def _record_layout(data: memoryview, position: int, end: int) -> tuple[int, ...] | None:
    """The layout of the record at `position`: (stride, length prefix size, timestamp delta at,
    offset delta at, key length at, key at, key length, value length at, value at, value length,
    header count at, header count, after the header count), positions relative to the record.
    None when the record is not well formed."""
    try:
        length, at = varint.decode(data, position)
        stride = at - position + length
        if length < 0 or position + stride > end:
            return None
        timestamp_at = at + 1  # (the attributes byte)
        _, offset_at = varint.decode(data, timestamp_at)
        _, key_length_at = varint.decode(data, offset_at)
        key_length, key_at = varint.decode(data, key_length_at)
        value_length_at = key_at + max(key_length, 0)
        value_length, value_at = varint.decode(data, value_length_at)
        count_at = value_at + max(value_length, 0)
        header_count, after = varint.decode(data, count_at)
    except (ValueError, IndexError):
        return None
    if key_length < -1 or value_length < -1 or header_count < 0 or after > position + stride:
        return None
    return (
        stride,
        at - position,
        timestamp_at - position,
        offset_at - position,
        key_length_at - position,
        key_at - position,
        key_length,
        value_length_at - position,
        value_at - position,
        value_length,
        count_at - position,
        header_count,
        after - position,
    )


def record_runs(section: np.ndarray, count: int) -> list[RecordRun] | None:
    """A records section (uint8) of `count` records as runs of one layout, or None when its runs
    are shorter than `_MIN_LAYOUT_RUN` records on average (a few short ones, such as the first
    record's timestamp delta of 0, are taken) or it is malformed: the caller then uses
    `record_columns`, which says what is wrong.

    A run's layout is read from its first record and guessed to hold for `_FIRST_RUN_GUESS`
    records (the first run) or up to the end of the section (the others), then proven
    column-wise up to the first record where it fails: each record's length prefix, key length,
    value length and header count are the first record's bytes (so each record ends where the
    next guessed one starts), and its timestamp and offset delta
    varints have the first record's byte count (continuation bits)."""
    end = len(section)
    data = section.data  # (a memoryview of the array)
    runs: list[RecordRun] = []
    position = done = 0
    window = _FIRST_RUN_GUESS  # then the rest of the batch
    while done < count:
        layout = _record_layout(data, position, end)
        if layout is None:
            return None
        (stride, prefix, timestamp_at, offset_at, key_length_at, key_at, key_length) = layout[:7]
        (value_length_at, value_at, value_length, count_at, header_count, after) = layout[7:]
        if stride == 0:
            return None
        guess = min(count - done, (end - position) // stride, window)
        window = count
        rows = section[position : position + guess * stride].reshape(guess, stride)
        fixed = [
            *range(prefix),
            *range(key_length_at, key_at),
            *range(value_length_at, value_at),
            *range(count_at, after),
        ]
        shaped = [*range(timestamp_at, key_length_at)]
        columns = np.array(fixed + shaped, np.intp)
        masks = np.array([0xFF] * len(fixed) + [0x80] * len(shaped), np.uint8)
        expected = rows[0, columns] & masks
        if guess > 1:
            proven = ((rows[:, columns] & masks) == expected).all(axis=1)
            run = guess if bool(proven.all()) else int(np.argmin(proven))
        else:
            run = guess
        if len(runs) >= 2 + count // _MIN_LAYOUT_RUN:  # short runs on average: record_columns is faster
            return None
        rows = rows[:run]
        runs.append(
            RecordRun(
                rows=rows,
                key_at=key_at,
                key_length=key_length,
                value_at=value_at,
                value_length=value_length,
                header_count=header_count,
                timestamp_deltas=_column_varints(rows, timestamp_at, offset_at - timestamp_at),
                offset_deltas=_column_varints(rows, offset_at, key_length_at - offset_at),
            )
        )
        done += run
        position += run * stride
    if position != end:
        return None
    return runs
