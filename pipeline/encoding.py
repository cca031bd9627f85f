"""Arrow key and value columns → v2 record batches (the Spark writer's tasks).

The records of consecutive batches are encoded in one call of the engine's compiled core
(`engine._core.encode_columns`) straight from the Arrow arrays' buffers: no Python object per
record, the GIL released while it copies. Every record carries the task's one CreateTime
(timestamp delta 0) and no headers; offset deltas restart at each batch. The batches are the
encoded records cut at the batch ranges, each framed by `engine.record.builder.frame_batch`: byte for
byte what `engine.record.builder.encode_batches` makes of the same records (tested). Records with
headers go through `encode_batches`.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from seglogfs.engine import _core
from seglogfs.engine.errors import RecordTooLargeError
from seglogfs.engine.record.builder import ESTIMATED_RECORD_VARINTS, batch_ranges, frame_batch
from seglogfs.engine.record.compression import CompressionType
from seglogfs.engine.record.records import BATCH_OVERHEAD_BYTES
from seglogfs.pipeline.partitioning import binary_parts

_GROUP_BYTES = 64 << 20  # records encoded by one call of the core


def _column(array: pa.Array) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(data, starts, lengths with -1 for nulls) of an Arrow binary array, as the core takes them."""
    data, starts, lengths, valid = binary_parts(array)
    return data, np.ascontiguousarray(starts, np.int64), np.where(valid, lengths, -1).astype(np.int64)


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
    value_data, value_starts, value_lengths = _column(values)
    key_data: np.ndarray | None = None
    key_starts = key_lengths = None
    if keys is not None:
        key_data, key_starts, key_lengths = _column(keys)
    sizes = (
        np.maximum(value_lengths, 0)
        + (0 if key_lengths is None else np.maximum(key_lengths, 0))
        + ESTIMATED_RECORD_VARINTS
    )
    batches: list[bytearray] = []
    pending = list(reversed(batch_ranges(sizes, min(target_batch_bytes, max_batch_bytes))))
    while pending:
        group = [pending.pop()]  # consecutive ranges encoded by one call
        total = int(sizes[group[0][0] : group[0][1]].sum())
        while pending and total + int(sizes[pending[-1][0] : pending[-1][1]].sum()) <= _GROUP_BYTES:
            group.append(pending.pop())
            total += int(sizes[group[-1][0] : group[-1][1]].sum())
        lo, hi = group[0][0], group[-1][1]
        ends = np.empty(hi - lo, np.int64)
        records = _core.encode_columns(
            hi - lo,
            value_data,
            value_starts[lo:hi],
            value_lengths[lo:hi],
            key_data,
            None if key_starts is None else key_starts[lo:hi],
            None if key_lengths is None else key_lengths[lo:hi],
            0,
            np.array([a - lo for a, _ in group], np.int64),
            ends,
        )
        view = memoryview(records)
        for index, (a, b) in enumerate(group):
            start = int(ends[a - lo - 1]) if a > lo else 0
            batch = frame_batch(
                view[start : int(ends[b - lo - 1])],
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
