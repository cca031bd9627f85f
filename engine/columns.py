"""The records of a batch, column-wise: where each record's fields lie in the batch's uncompressed
records section, as numpy arrays, without a Python object per record.

A record (Kafka's DefaultRecord) is a sequence of varints and bytes:

    length (varint: the bytes after it) · attributes (1 byte, unused) · timestamp delta (varlong)
    · offset delta (varint) · key length (varint, -1 = null) · key · value length (varint, -1 =
    null) · value · header count (varint) · headers

Walking that per record in Python costs microseconds a record; the cleaner, the views and
`consume` read millions. `record_columns` finds the record bounds (runs of records of one size,
the common case, proven column-wise; mixed sizes walked), then reads each field of every record
at once with numpy. Headers are located (their count) but not decoded: callers that need them
decode the batch with `decode_records`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from seglogfs.engine import varint
from seglogfs.engine.records import BatchHeader, TimestampType, records_section

_PADDING = bytes(10)  # varint windows may look ten bytes past the end
_BYTE_SHIFTS = np.arange(10, dtype=np.uint64) * np.uint64(7)
_varint_at = varint.decode_at
_FIRST_RUN_GUESS = 64  # records checked at once for a run of one size, before one is proven


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


def zigzag_varints(buf: np.ndarray, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The zig-zag varints starting at `positions` of `buf` (padded with ten zero bytes), and
    the positions after them: one- and two-byte varints (nearly all of them) column-wise, longer
    ones through a ten-byte window. Raises ValueError for a varint over ten bytes."""
    first = buf[positions]
    long = first >= 0x80
    if not bool(long.any()):  # one byte each: the common case for all but lengths
        small = first.astype(np.int64)
        return (small >> 1) ^ -(small & 1), positions + 1
    first = first.astype(np.uint64)
    second = buf[positions + 1].astype(np.uint64)
    if not bool((long & (second >= 0x80)).any()):
        zigzag = np.where(long, (first & np.uint64(0x7F)) | (second << np.uint64(7)), first)
        sizes = 1 + long.astype(np.int64)
    else:
        window = buf[positions[:, None] + np.arange(10)].astype(np.uint64)
        more = window >= 0x80
        if bool(more.all(axis=1).any()):
            raise ValueError("a varint runs over ten bytes")
        sizes = np.argmin(more, axis=1) + 1
        used = np.arange(10) < sizes[:, None]
        zigzag = (((window & np.uint64(0x7F)) << _BYTE_SHIFTS) * used).sum(axis=1, dtype=np.uint64)
    values = (zigzag >> np.uint64(1)).astype(np.int64) ^ -(zigzag & np.uint64(1)).astype(np.int64)
    return values, positions + sizes


def record_bounds(section: bytes, count: int, buf: np.ndarray) -> np.ndarray:
    """The start of each record (at its length prefix) and the end of the last.

    Records of a batch often come in runs of one size (the same value size, offset deltas of the
    same varint length): a run is guessed from its first record's size and proven column-wise
    (each guessed start holds a length that ends exactly at the next guess), up to the first
    guess that fails. Records of mixed sizes are walked one by one."""
    end = len(section)
    bounds = np.empty(count + 1, np.int64)
    bounds[0] = 0
    i = position = 0
    window = _FIRST_RUN_GUESS
    while i < count:
        length, body = _varint_at(section, position)
        stride = body - position + length
        if length < 0 or position + stride > end:
            raise ValueError(f"record {i} of length {length} runs past the records section")
        fits = min(count - i, window, (end - position) // stride)
        starts = position + np.arange(fits, dtype=np.int64) * stride
        try:
            lengths, bodies = zigzag_varints(buf, starts)
        except ValueError:  # a guessed start inside a record's bytes ran into a long "varint"
            # Prove the guesses before the first such start (random payload bytes can look like
            # one anywhere in a long run: dropping to small windows walked the rest of the batch).
            undecodable = (buf[starts[:, None] + np.arange(10)] >= 0x80).all(axis=1)
            window = int(np.argmax(undecodable))
            if window == 0:
                break  # not a run: walk instead
            continue
        proven = bodies + lengths == starts + stride
        run = fits if bool(proven.all()) else int(np.argmin(proven))
        bounds[i + 1 : i + 1 + run] = starts[:run] + stride
        i += run
        position += run * stride
        if run < 8:
            break  # mixed sizes: walk the rest
        # A run ends where a varint grows a byte (offset delta 64, 8192, ...) or a size changes;
        # guess that what follows is one run to the end: a wrong guess is proven wrong cheaply.
        window = count
    for j in range(i, count):
        length, position = _varint_at(section, position)
        position += length
        if length < 0 or position > end:
            raise ValueError(f"record {j} of length {length} runs past the records section")
        bounds[j + 1] = position
    if position != end:
        raise ValueError(f"{end - position} bytes follow the last record of the batch")
    return bounds


def record_columns(header: BatchHeader, batch: bytes | bytearray | memoryview) -> RecordColumns:
    """Lay out a valid batch's records column-wise (the CRC checked by the caller). Raises
    ValueError (or a codec error) when the records section is malformed."""
    section = records_section(header, batch)
    count = header.records_count
    buf = np.frombuffer(section + _PADDING, np.uint8)
    bounds = record_bounds(section, count, buf)
    _, body = zigzag_varints(buf, bounds[:-1])
    timestamp_deltas, position = zigzag_varints(buf, body + 1)  # + 1: the attributes byte
    offset_deltas, position = zigzag_varints(buf, position)
    key_lengths, key_starts = zigzag_varints(buf, position)
    value_lengths, value_starts = zigzag_varints(buf, key_starts + np.maximum(key_lengths, 0))
    header_counts, after = zigzag_varints(buf, value_starts + np.maximum(value_lengths, 0))
    if count and bool((after > bounds[1:]).any() | (key_lengths < -1).any() | (value_lengths < -1).any()):
        raise ValueError("a record's key or value runs past its end")
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
