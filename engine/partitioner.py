"""Kafka's default partitioner: murmur2 of the key, as the Java client computes it, so that a
keyed record lands in the same partition here as from a Kafka producer. The hash is the compiled
core's (`_core.murmur2`), for one key or a column of them."""

from __future__ import annotations

import itertools

import numpy as np

from seglogfs.engine import _core

_FROM_ZERO = np.zeros(1, np.int64)


def murmur2_many(data: np.ndarray | bytes, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Kafka's `Utils.murmur2` of each `data[starts[i]:starts[i] + lengths[i]]`: signed 32-bit
    hashes, as int64."""
    out = np.empty(len(starts), np.int64)
    _core.murmur2(data, np.ascontiguousarray(starts, np.int64), np.ascontiguousarray(lengths, np.int64), out)
    return out


def murmur2(data: bytes) -> int:
    """Kafka's `Utils.murmur2`: a signed 32-bit hash."""
    out = np.empty(1, np.int64)
    _core.murmur2(data, _FROM_ZERO, np.array([len(data)], np.int64), out)
    return int(out[0])


def partition_for_key(key: bytes, partitions: int) -> int:
    """`toPositive(murmur2(key)) % partitions`, Kafka's choice for a keyed record."""
    return (murmur2(key) & 0x7FFFFFFF) % partitions


class RoundRobin:
    """Null-keyed records: the next partition on each call (one call per write)."""

    def __init__(self) -> None:
        self._counter = itertools.count()

    def next(self, partitions: int) -> int:
        return next(self._counter) % partitions
