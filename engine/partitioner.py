"""Kafka's default partitioner: murmur2 of the key, as the Java client computes it, so that a
keyed record lands in the same partition here as from a Kafka producer."""

from __future__ import annotations

import itertools

_SEED = 0x9747B28C
_M = 0x5BD1E995
_MASK = 0xFFFFFFFF


def murmur2(data: bytes) -> int:
    """Kafka's `Utils.murmur2`: a signed 32-bit hash."""
    length = len(data)
    h = (_SEED ^ length) & _MASK
    whole = length & ~3
    for i in range(0, whole, 4):
        k = data[i] | data[i + 1] << 8 | data[i + 2] << 16 | data[i + 3] << 24
        k = (k * _M) & _MASK
        k ^= k >> 24
        k = (k * _M) & _MASK
        h = ((h * _M) & _MASK) ^ k
    tail = length & 3
    if tail == 3:
        h ^= data[whole + 2] << 16
    if tail >= 2:
        h ^= data[whole + 1] << 8
    if tail >= 1:
        h ^= data[whole]
        h = (h * _M) & _MASK
    h ^= h >> 13
    h = (h * _M) & _MASK
    h ^= h >> 15
    return h - (1 << 32) if h & 0x80000000 else h


def partition_for_key(key: bytes, partitions: int) -> int:
    """`toPositive(murmur2(key)) % partitions`, Kafka's choice for a keyed record."""
    return (murmur2(key) & 0x7FFFFFFF) % partitions


class RoundRobin:
    """Null-keyed records: the next partition on each call (one call per write)."""

    def __init__(self) -> None:
        self._counter = itertools.count()

    def next(self, partitions: int) -> int:
        return next(self._counter) % partitions
