"""The cleaner's offset map: key → latest offset for one cleaning pass (Kafka's SkimpyOffsetMap).

An open-addressing table in numpy arrays: per slot a 64-bit key hash (Python's keyed SipHash), a
32-bit second hash (CRC-32) and a 32-bit offset relative to the pass's first dirty offset: 16
bytes a slot, about 17.8 bytes per entry at the default 0.9 load factor (Kafka spends 24: a
16-byte MD5 and an 8-byte offset). The number of slots is the largest prime that fits the memory
given (`log.cleaner.dedupe.buffer.size`), so a double-hashing probe visits every slot.

A key is found by its 64-bit hash; the second hash confirms it. When two keys share the first
hash, the later one takes the slot and the earlier key's records no longer match it: they are
kept, never wrongly dropped. Only a full 96-bit collision could drop a record, which at the map's
size is far less likely than a disk error.

The map lives in memory only, for one pass: nothing of it reaches the disk, so a crash loses
nothing but the pass. Not thread-safe: one cleaner uses it.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Sequence

import numpy as np

ENTRY_BYTES = 16  # bytes per slot: see the module docstring
_MAX_RELATIVE_OFFSET = 0xFFFF_FFFF


def _largest_prime_at_most(n: int) -> int:
    """Slots are a prime number, so every probe step (1 .. slots-1) visits every slot."""
    if n < 2:
        raise ValueError("an offset map needs room for at least two slots")
    candidate = n if n % 2 or n == 2 else n - 1
    while candidate > 2:
        if all(candidate % d for d in range(3, math.isqrt(candidate) + 1, 2)):
            return candidate
        candidate -= 2
    return 2


def key_hashes(keys: Sequence[bytes]) -> tuple[np.ndarray, np.ndarray]:
    """The two hashes of each key: 64-bit (never 0, which marks an empty slot) and 32-bit."""
    n = len(keys)
    first = np.fromiter(map(hash, keys), np.int64, n).view(np.uint64)
    first[first == 0] = 1
    second = np.fromiter(map(zlib.crc32, keys), np.uint32, n)
    return first, second


class OffsetMap:
    """Key → latest offset for one cleaning pass, bounded by `memory_bytes`. See the module
    docstring for the layout. Keys are given as their `key_hashes`."""

    def __init__(self, memory_bytes: int, load_factor: float = 0.9) -> None:
        self.slots = _largest_prime_at_most(memory_bytes // ENTRY_BYTES)
        self.capacity = max(int(self.slots * load_factor), 1)
        # Zeroed pages are mapped lazily: a map only costs the memory its keys touch.
        self._first = np.zeros(self.slots, np.uint64)
        self._second = np.zeros(self.slots, np.uint32)
        self._offsets = np.zeros(self.slots, np.uint32)
        self.size = 0
        self.base_offset = 0
        self.latest_offset = -1

    def __len__(self) -> int:
        return self.size

    @property
    def full(self) -> bool:
        return self.size >= self.capacity

    def clear(self, base_offset: int) -> None:
        """Empty the map for a pass whose offsets start at `base_offset`."""
        if self.size:
            self._first.fill(0)
        self.size = 0
        self.base_offset = base_offset
        self.latest_offset = base_offset - 1

    def put(self, first: np.ndarray, second: np.ndarray, offsets: np.ndarray) -> int:
        """Map records in offset order (later ones win); stops at the first record that finds
        the map full, as Kafka's cleaner does, and returns how many were mapped."""
        n = len(offsets)
        if n == 0:
            return 0
        if self.size + n <= self.capacity and int(offsets[-1]) - self.base_offset < _MAX_RELATIVE_OFFSET:
            self._put_many(first, second, offsets)
            self.latest_offset = int(offsets[-1])
            return n
        for i in range(n):
            offset = int(offsets[i])
            if self.full or offset - self.base_offset >= _MAX_RELATIVE_OFFSET:
                return i
            self._put_many(first[i : i + 1], second[i : i + 1], offsets[i : i + 1])
            self.latest_offset = offset
        return n

    def _probe_start(self, first: np.ndarray, second: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        slots = np.uint64(self.slots)
        start = (first % slots).astype(np.int64)
        step = (np.uint64(1) + second.astype(np.uint64) % (slots - np.uint64(1))).astype(np.int64)
        return start, step

    def _put_many(self, first: np.ndarray, second: np.ndarray, offsets: np.ndarray) -> None:
        # The last record of each key wins: keep one entry per 64-bit hash, the last given.
        order = np.argsort(first, kind="stable")
        ordered = first[order]
        last = np.ones(len(order), bool)
        last[:-1] = ordered[1:] != ordered[:-1]
        chosen = order[last]
        first, second = first[chosen], second[chosen]
        relative = (offsets[chosen] - self.base_offset).astype(np.uint32)
        slot, step = self._probe_start(first, second)
        pending = np.arange(len(chosen))
        while pending.size:
            where = slot[pending]
            found = self._first[where]
            same = found == first[pending]
            empty = found == 0
            # Of the keys that found the same empty slot, the first takes it; the others look
            # again next round and move on.
            claimants = pending[empty]
            _, winners_at = np.unique(slot[claimants], return_index=True)
            winners = claimants[winners_at]
            self.size += len(winners)
            done = np.concatenate([pending[same], winners])
            self._first[slot[done]] = first[done]
            self._second[slot[done]] = second[done]
            self._offsets[slot[done]] = relative[done]
            moving = pending[~(same | empty)]
            slot[moving] = (slot[moving] + step[moving]) % self.slots
            keep = np.ones(len(pending), bool)
            keep[same] = False
            keep[np.flatnonzero(empty)[winners_at]] = False
            pending = pending[keep]

    def get(self, first: np.ndarray, second: np.ndarray) -> np.ndarray:
        """The latest offset mapped for each key, -1 for keys not in the map."""
        result = np.full(len(first), -1, np.int64)
        if self.size == 0 or len(first) == 0:
            return result
        slot, step = self._probe_start(first, second)
        pending = np.arange(len(first))
        while pending.size:
            where = slot[pending]
            found = self._first[where]
            same = found == first[pending]
            hit = pending[same]
            matches = self._second[slot[hit]] == second[hit]
            hit = hit[matches]
            result[hit] = self._offsets[slot[hit]].astype(np.int64) + self.base_offset
            moving = ~(same | (found == 0))
            pending = pending[moving]
            slot[pending] = (slot[pending] + step[pending]) % self.slots
        return result
