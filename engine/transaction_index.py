"""The transaction index (`<base offset>.txnindex`): the aborted transactions whose data lies in
a segment, so that read_committed consumers can skip them (Kafka's TransactionIndex and
AbortedTxn).

Byte layout: 34-byte entries, big-endian, appended in the order the transactions completed:

    offset  size  field
     0       2    version             0
     2       8    producer_id
    10       8    first_offset        the transaction's first offset
    18       8    last_offset         its ABORT marker's offset
    26       8    last_stable_offset  the partition's last stable offset when it aborted

No header, no preallocation: the file is exactly the entries. A size that is not a multiple of
34, or an entry of a newer version, is a corrupt index.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from seglogfs.engine.errors import CorruptIndexError

ABORTED_TXN_DTYPE = np.dtype(
    [
        ("version", ">i2"),
        ("producer_id", ">i8"),
        ("first_offset", ">i8"),
        ("last_offset", ">i8"),
        ("last_stable_offset", ">i8"),
    ]
)
assert ABORTED_TXN_DTYPE.itemsize == 34
ABORTED_TXN_VERSION = 0


@dataclass(frozen=True)
class AbortedTxn:
    version: int
    producer_id: int
    first_offset: int
    last_offset: int
    last_stable_offset: int


def read_transaction_index(path: Path) -> list[AbortedTxn]:
    """Every entry of a `.txnindex` file; CorruptIndexError for a size that is not a multiple of
    34 or an entry whose version is newer than 0 (naming the position)."""
    raw = path.read_bytes()
    size = ABORTED_TXN_DTYPE.itemsize
    if len(raw) % size:
        raise CorruptIndexError(path, f"{len(raw)} bytes is not a multiple of the {size}-byte entry size")
    entries = np.frombuffer(raw, dtype=ABORTED_TXN_DTYPE)
    out = []
    for index, entry in enumerate(entries.tolist()):
        if entry[0] > ABORTED_TXN_VERSION:
            raise CorruptIndexError(
                path, f"entry at position {index * size}: unexpected aborted transaction version {entry[0]}"
            )
        out.append(AbortedTxn(*entry))
    return out
