"""Kafka's default partitioner over Arrow key columns: murmur2 of every key in one call of the
engine's core (`engine.partitioner.murmur2_many`, straight from the Arrow buffers), so that a
keyed write lands in the partitions a Kafka producer would choose without a Python call per
record."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from seglogfs.engine.partitioner import murmur2_many


def binary_parts(array: pa.Array) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(data bytes, starts, lengths, valid) of an Arrow `binary` array, without copying data."""
    n = len(array)
    _validity, offsets_buffer, data_buffer = array.buffers()
    offsets = np.frombuffer(offsets_buffer, np.int32)[array.offset : array.offset + n + 1].astype(np.int64)
    data = np.frombuffer(data_buffer, np.uint8) if data_buffer is not None else np.zeros(0, np.uint8)
    valid = np.ones(n, bool) if array.null_count == 0 else array.is_valid().to_numpy(zero_copy_only=False)
    return data, offsets[:-1], np.diff(offsets), valid


def partitions_for_keys(keys: pa.Array, partitions: int) -> np.ndarray:
    """`toPositive(murmur2(key)) % partitions` for every key (nulls get -1)."""
    data, starts, lengths, valid = binary_parts(keys)
    out = np.full(len(keys), -1, np.int64)
    if valid.any():
        hashes = murmur2_many(data, starts[valid], lengths[valid])
        out[valid] = (hashes & 0x7FFFFFFF) % partitions
    return out
