"""Arrow key and value columns → v2 record batches, column-wise (the Spark writer's tasks).

A batch's records section is its records' bytes back to back, each: length varint, attributes
(0), timestamp delta (0: a task stamps every record with one CreateTime), offset delta varint,
key length varint (-1: null), key, value length varint, value, header count (0). The varints of
all rows are encoded at once with numpy (`engine.varint.encode_many`) and laid out as two Arrow
binary columns — what precedes the key, what precedes the value — which Arrow's
`binary_join_element_wise` interleaves with the keys and values in C++: no Python object per
record. The section is then cut into batches and each framed by `engine.records.frame_batch`,
byte for byte what `engine.records.encode_batches` makes of the same records (tested). Records
with headers go through `encode_batches`.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from seglogfs.engine import varint
from seglogfs.engine.compression import CompressionType
from seglogfs.engine.errors import RecordTooLargeError
from seglogfs.engine.records import BATCH_OVERHEAD_BYTES, batch_ranges, frame_batch
from seglogfs.pipeline.partitioning import binary_parts

_GROUP_BYTES = 64 << 20  # records joined by one Arrow call (its int32 offsets hold 2 GiB)


def _ragged(columns: list[tuple[np.ndarray, np.ndarray]], n: int) -> pa.Array:
    """Per row i, the first `sizes[i]` bytes of row i of each (table, sizes) column, as an Arrow
    binary array."""
    table = np.hstack([np.ascontiguousarray(t) for t, _ in columns])
    keep = np.hstack([np.arange(t.shape[1])[None, :] < s[:, None] for t, s in columns])
    flat = table[keep]
    offsets = np.zeros(n + 1, np.int32)
    np.cumsum(keep.sum(axis=1), out=offsets[1:])
    return pa.Array.from_buffers(pa.binary(), n, [None, pa.py_buffer(offsets), pa.py_buffer(flat)])


def _filled(column: pa.Array) -> pa.Array:
    return column.fill_null(b"") if column.null_count else column


def _records(
    values: pa.Array, keys: pa.Array | None, value_lengths: np.ndarray, key_lengths: np.ndarray, deltas: np.ndarray
) -> tuple[memoryview, np.ndarray]:
    """The encoded records of all rows, back to back, and each row's start (n + 1 bounds)."""
    n = len(values)
    od_table, od_sizes = varint.encode_many(deltas)
    kl_table, kl_sizes = varint.encode_many(key_lengths)
    vl_table, vl_sizes = varint.encode_many(value_lengths)
    body = 3 + od_sizes + kl_sizes + np.maximum(key_lengths, 0) + vl_sizes + np.maximum(value_lengths, 0)
    len_table, len_sizes = varint.encode_many(body)
    two_zeros = (np.zeros((n, 2), np.uint8), np.full(n, 2, np.int64))  # attributes, timestamp delta
    before_key = _ragged([(len_table, len_sizes), two_zeros, (od_table, od_sizes), (kl_table, kl_sizes)], n)
    before_value = _ragged([(vl_table, vl_sizes)], n)
    header_counts = pa.Array.from_buffers(
        pa.binary(), n, [None, pa.py_buffer(np.arange(n + 1, dtype=np.int32)), pa.py_buffer(bytes(n))]
    )
    parts = (
        [before_key] + ([_filled(keys)] if keys is not None else []) + [before_value, _filled(values), header_counts]
    )
    joined = pc.binary_join_element_wise(*parts, b"")
    _validity, offsets_buffer, data_buffer = joined.buffers()
    bounds = np.frombuffer(offsets_buffer, np.int32)[joined.offset : joined.offset + n + 1].astype(np.int64)
    return memoryview(data_buffer), bounds


def encode_columns(
    values: pa.Array,
    keys: pa.Array | None,
    *,
    timestamp: int,
    max_batch_bytes: int,
    target_batch_bytes: int,
    compression: CompressionType,
    where: str,
) -> list[bytearray]:
    """Binary `values` (and `keys`) as v2 batches of about `target_batch_bytes`, at most
    `max_batch_bytes` each, offsets from 0, every record at `timestamp` (see the module
    docstring). RecordTooLargeError naming `where` for a record too large for any batch."""
    n = len(values)
    _data, _starts, value_lengths, value_valid = binary_parts(values)
    value_lengths = np.where(value_valid, value_lengths, -1)
    if keys is None:
        key_lengths = np.full(n, -1, np.int64)
    else:
        _data, _starts, key_lengths, key_valid = binary_parts(keys)
        key_lengths = np.where(key_valid, key_lengths, -1)
    sizes = np.maximum(value_lengths, 0) + np.maximum(key_lengths, 0) + 12
    batches: list[bytearray] = []
    pending = list(reversed(batch_ranges(sizes, min(target_batch_bytes, max_batch_bytes))))
    while pending:
        group = [pending.pop()]  # consecutive ranges joined by one Arrow call
        total = int(sizes[group[0][0] : group[0][1]].sum())
        while pending and total + int(sizes[pending[-1][0] : pending[-1][1]].sum()) <= _GROUP_BYTES:
            group.append(pending.pop())
            total += int(sizes[group[-1][0] : group[-1][1]].sum())
        lo, hi = group[0][0], group[-1][1]
        starts = np.repeat(np.array([a for a, _ in group], np.int64), [b - a for a, b in group])
        deltas = np.arange(lo, hi, dtype=np.int64) - starts
        records, bounds = _records(
            values.slice(lo, hi - lo),
            None if keys is None else keys.slice(lo, hi - lo),
            value_lengths[lo:hi],
            key_lengths[lo:hi],
            deltas,
        )
        for index, (a, b) in enumerate(group):
            batch = frame_batch(
                records[bounds[a - lo] : bounds[b - lo]],
                count=b - a,
                base_offset=0,
                base_timestamp=timestamp,
                max_timestamp=timestamp,
                compression=compression,
            )
            if len(batch) <= max_batch_bytes:
                batches.append(batch)
                continue
            if b - a == 1:
                raise RecordTooLargeError(
                    f"{where}: record {a} makes a batch of {len(batch)} bytes, over max.message.bytes={max_batch_bytes}"
                )
            middle = (a + b) // 2  # halved, and everything after it encoded again
            pending += [*reversed(group[index + 1 :]), (middle, b), (a, middle)]
            break
    _renumber(batches)
    return batches


def _renumber(batches: list[bytearray]) -> None:
    """Base offsets 0, 1, … across the batches, as `encode_batches` numbers them (the CRC does
    not cover them)."""
    offset = 0
    for batch in batches:
        batch[0:8] = offset.to_bytes(8, "big")
        offset += int.from_bytes(batch[BATCH_OVERHEAD_BYTES - 4 : BATCH_OVERHEAD_BYTES], "big")
