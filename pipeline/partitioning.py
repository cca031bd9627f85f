"""Kafka's default partitioner over Arrow key columns, vectorised: murmur2 of every key at once
with numpy (keys grouped by length, four bytes a step), so that a keyed write lands in the
partitions a Kafka producer would choose without a Python call per record. The engine's
`partitioner.partition_for_key` is the reference it is tested against."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

_SEED = np.uint32(0x9747B28C)
_M = np.uint32(0x5BD1E995)


def murmur2_many(data: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Kafka's `Utils.murmur2` of each `data[starts[i]:starts[i] + lengths[i]]`, as uint32."""
    out = np.empty(len(starts), np.uint32)
    padded = np.concatenate([data, np.zeros(4, np.uint8)])
    with np.errstate(over="ignore"):
        for length in np.unique(lengths).tolist():
            rows = np.flatnonzero(lengths == length)
            at = starts[rows]
            h = np.full(len(rows), _SEED ^ np.uint32(length), np.uint32)
            whole = length & ~3
            for i in range(0, whole, 4):
                word = padded[at + i].astype(np.uint32)
                word |= padded[at + i + 1].astype(np.uint32) << np.uint32(8)
                word |= padded[at + i + 2].astype(np.uint32) << np.uint32(16)
                word |= padded[at + i + 3].astype(np.uint32) << np.uint32(24)
                word *= _M
                word ^= word >> np.uint32(24)
                word *= _M
                h *= _M
                h ^= word
            tail = length & 3
            if tail == 3:
                h ^= padded[at + whole + 2].astype(np.uint32) << np.uint32(16)
            if tail >= 2:
                h ^= padded[at + whole + 1].astype(np.uint32) << np.uint32(8)
            if tail >= 1:
                h ^= padded[at + whole].astype(np.uint32)
                h *= _M
            h ^= h >> np.uint32(13)
            h *= _M
            h ^= h >> np.uint32(15)
            out[rows] = h
    return out


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
        out[valid] = (hashes & np.uint32(0x7FFFFFFF)).astype(np.int64) % partitions
    return out
