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
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

from seglogfs.engine import _core
from seglogfs.engine.errors import EngineError

PRODUCER_SNAPSHOT_VERSION = 1
_HEADER = struct.Struct(">hIi")
_ENTRY = struct.Struct(">qhiqiqiq")
assert _ENTRY.size == 46


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


def read_producer_snapshot(path: Path) -> list[ProducerSnapshotEntry]:
    """The entries of a producer snapshot file; CorruptSnapshotError for a bad version, CRC or
    size, OSError from the file."""
    data = path.read_bytes()
    if len(data) < _HEADER.size:
        raise CorruptSnapshotError(f"{path}: snapshot of {len(data)} bytes is too short")
    version, stored_crc, count = _HEADER.unpack_from(data)
    if version != PRODUCER_SNAPSHOT_VERSION:
        raise CorruptSnapshotError(f"Snapshot contained an unknown file version {version}")
    computed = _core.crc32c(data[6:])
    if computed != stored_crc:
        raise CorruptSnapshotError(
            f"Snapshot is corrupt (CRC is no longer valid). Stored crc: {stored_crc}. Computed crc: {computed}"
        )
    if count < 0 or len(data) != _HEADER.size + count * _ENTRY.size:
        raise CorruptSnapshotError(f"{path}: {count} producer entries do not fill {len(data)} bytes")
    return [ProducerSnapshotEntry(*_ENTRY.unpack_from(data, _HEADER.size + i * _ENTRY.size)) for i in range(count)]
