"""The records of a batch, column-wise: where each record's fields lie in the batch's uncompressed
records section, as numpy arrays, without a Python object per record.

A record (Kafka's DefaultRecord) is a sequence of varints and bytes:

    length (varint: the bytes after it) · attributes (1 byte, unused) · timestamp delta (varlong)
    · offset delta (varint) · key length (varint, -1 = null) · key · value length (varint, -1 =
    null) · value · header count (varint) · headers

Walking that per record in Python costs microseconds a record; the cleaner, the views and
`consume` read millions. `record_columns` walks the records in the engine's compiled core
(`_core.record_fields`, engine/core/decode.c: every field of every record in one call, the GIL
released) and hands them over as numpy columns. Headers are located (their count) but not
decoded: callers that need them decode the batch with `decode_records`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from seglogfs.engine import _core
from seglogfs.engine.record.records import BatchHeader, TimestampType, check_record_count, records_section


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
    codec error) when the records section is malformed, as decode_records refuses it: a record
    count the section cannot hold (before anything is sized by it), a malformed record, an offset
    or a timestamp (base + delta) past int64."""
    if section is None:
        section = records_section(header, batch)
    count = header.records_count
    check_record_count(count, len(section))
    fields = np.empty((8, count), np.int64)  # a field a row: each a contiguous column
    _core.record_fields(section, count, fields)  # ValueError naming the record when malformed
    log_append_time = header.max_timestamp if header.timestamp_type is TimestampType.LOG_APPEND_TIME else None
    _check_sums(header.base_offset, fields[2], "offset")
    if log_append_time is None:  # (a LogAppendTime batch's records all show its time: deltas unused)
        _check_sums(header.base_timestamp, fields[1], "timestamp")
    bounds = np.empty(count + 1, np.int64)
    bounds[:-1] = fields[0]
    bounds[-1] = len(section)
    timestamp_deltas, offset_deltas = fields[1], fields[2]
    key_starts, key_lengths, value_starts, value_lengths, header_counts = fields[3:8]
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
        log_append_time=log_append_time,
    )


_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1


def _check_sums(base: int, deltas: np.ndarray, what: str) -> None:
    """ValueError when a record's `what` (base + delta) is past int64, where numpy would wrap it."""
    if len(deltas) and (int(deltas.min()) < _INT64_MIN - base or int(deltas.max()) > _INT64_MAX - base):
        raise ValueError(f"a record's {what} is past int64")
