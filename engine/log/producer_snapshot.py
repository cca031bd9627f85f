"""Producer state snapshots (`<offset>.snapshot`): the idempotent and transactional producers'
state a broker saves at each roll and at shutdown, so that it need not scan the log again
(Kafka's ProducerStateManager.writeSnapshot / readSnapshot).

Byte layout, big-endian:

    offset  size  field
     0       2    version                  1
     2       4    crc                      CRC-32C of every byte from offset 6 to the end
     6       4    producer entry count
    10      46×n  entries: producer_id int64, epoch int16, last_sequence int32,
                  last_offset int64, offset_delta int32, timestamp int64,
                  coordinator_epoch int32, current_txn_first_offset int64 (-1: none)

The file name's offset is the log end offset the state is as of. A bad version or CRC makes the
whole file unusable (Kafka deletes it and rebuilds the state from the log).

The file is not trusted: its length is held against the entry count of its header before the
rest is read; a file with a hole (a snapshot is written whole: a hole is no part of one) or
longer than Kafka can read (it reads a snapshot into one array: under 2 GiB) is corrupt; the CRC
is computed a MiB at a time and the entries are read as they are used, so a reader holds a
chunk of the file, whatever its size.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from seglogfs.engine import _core
from seglogfs.engine.errors import EngineError
from seglogfs.engine.files import open_regular

PRODUCER_SNAPSHOT_VERSION = 1
_HEADER = struct.Struct(">hIi")
_ENTRY = struct.Struct(">qhiqiqiq")
assert _ENTRY.size == 46
# Kafka reads a snapshot whole into one array (Files.readAllBytes): no larger than this.
_MAX_SNAPSHOT_BYTES = 2**31 - 9
_CHUNK_BYTES = 1 << 20


class CorruptSnapshotError(EngineError):
    """A producer snapshot whose version, CRC or size is wrong (Kafka's
    CorruptSnapshotException); the message names the file."""


@dataclass(frozen=True)
class ProducerSnapshotEntry:
    """One producer's state. `last_offset` < 0 means no batch is remembered."""

    producer_id: int
    producer_epoch: int
    last_sequence: int
    last_offset: int
    offset_delta: int
    timestamp: int
    coordinator_epoch: int
    current_txn_first_offset: int

    @property
    def first_sequence(self) -> int:
        """The remembered batch's first sequence (sequences wrap at 2^31, as Kafka's do)."""
        first = self.last_sequence - self.offset_delta
        return first + 0x80000000 if first < 0 else first


def read_producer_snapshot(path: Path) -> Iterator[ProducerSnapshotEntry]:
    """The entries of a producer snapshot file, read as they are iterated once the whole file
    has passed its checks (version, length, CRC); CorruptSnapshotError for a bad version, CRC
    or length, OSError (UnsafeFileError: not a regular file) from the file."""
    fd = open_regular(path)
    try:
        count = _checked(fd, path)
    except BaseException:
        os.close(fd)
        raise
    return _entries(fd, count)


def _checked(fd: int, path: Path) -> int:
    size = os.fstat(fd).st_size
    if size < _HEADER.size:
        raise CorruptSnapshotError(f"{path}: snapshot of {size} bytes is too short")
    if size > _MAX_SNAPSHOT_BYTES:
        raise CorruptSnapshotError(f"{path}: snapshot of {size} bytes is larger than Kafka can read")
    version, stored_crc, count = _HEADER.unpack(os.pread(fd, _HEADER.size, 0))
    if version != PRODUCER_SNAPSHOT_VERSION:
        raise CorruptSnapshotError(f"Snapshot contained an unknown file version {version}")
    if count < 0 or size != _HEADER.size + count * _ENTRY.size:
        raise CorruptSnapshotError(f"{path}: {count} producer entries do not fill {size} bytes")
    hole = os.lseek(fd, 0, os.SEEK_HOLE)
    if hole < size:
        raise CorruptSnapshotError(f"{path}: a hole at position {hole}: a snapshot is written whole")
    computed = _crc32c_of_file(fd, 6, size)
    if computed != stored_crc:
        raise CorruptSnapshotError(
            f"Snapshot is corrupt (CRC is no longer valid). Stored crc: {stored_crc}. Computed crc: {computed}"
        )
    return count


def _entries(fd: int, count: int) -> Iterator[ProducerSnapshotEntry]:
    try:
        per_chunk = _CHUNK_BYTES // _ENTRY.size
        for first in range(0, count, per_chunk):
            n = min(per_chunk, count - first)
            data = os.pread(fd, n * _ENTRY.size, _HEADER.size + first * _ENTRY.size)
            for fields in _ENTRY.iter_unpack(data[: len(data) - len(data) % _ENTRY.size]):
                yield ProducerSnapshotEntry(*fields)
    finally:
        os.close(fd)


def _crc32c_of_file(fd: int, start: int, end: int) -> int:
    """CRC-32C of bytes start..end-1 of the file, a chunk at a time: each chunk's CRC is folded
    into the running one by the operator that appends a chunk's length of zeros (zlib's
    crc32_combine, in GF(2)), computed once per length."""
    crc = 0
    position = start
    while position < end:
        data = os.pread(fd, min(_CHUNK_BYTES, end - position), position)
        if not data:
            raise CorruptSnapshotError(f"snapshot ended at position {position} while its CRC was read")
        chunk_crc = _core.crc32c(data)
        crc = chunk_crc if position == start else _gf2_times(_zeros_operator(len(data)), crc) ^ chunk_crc
        position += len(data)
    return crc


_CASTAGNOLI_REFLECTED = 0x82F63B78
_operators: dict[int, list[int]] = {}


def _gf2_times(matrix: list[int], vector: int) -> int:
    total, row = 0, 0
    while vector:
        if vector & 1:
            total ^= matrix[row]
        vector >>= 1
        row += 1
    return total


def _gf2_square(matrix: list[int]) -> list[int]:
    return [_gf2_times(matrix, matrix[row]) for row in range(32)]


def _zeros_operator(length: int) -> list[int]:
    """The 32×32 GF(2) matrix that turns the CRC-32C register of some bytes into that of the
    same bytes followed by `length` zero bytes (pre- and post-conditioning cancel out in the
    combination, as in zlib's crc32_combine)."""
    found = _operators.get(length)
    if found is not None:
        return found
    one_bit = [_CASTAGNOLI_REFLECTED] + [1 << row for row in range(31)]
    step = _gf2_square(_gf2_square(_gf2_square(one_bit)))  # one zero byte
    columns = [1 << row for row in range(32)]  # the identity, as columns
    remaining = length
    while remaining:
        if remaining & 1:
            columns = [_gf2_times(step, column) for column in columns]
        remaining >>= 1
        if remaining:
            step = _gf2_square(step)
    _operators[length] = columns
    return columns
