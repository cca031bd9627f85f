"""The transaction index (`<base offset>.txnindex`): the aborted transactions whose ABORT marker
lies in a segment, so that read_committed consumers can skip their batches (Kafka's
TransactionIndex and AbortedTxn); and how its entries are computed from the log.

Byte layout: 34-byte entries, big-endian, appended in the order the transactions completed:

    offset  size  field
     0       2    version             0
     2       8    producer_id
    10       8    first_offset        the transaction's first offset
    18       8    last_offset         its ABORT marker's offset
    26       8    last_stable_offset  the partition's last stable offset right after the marker

No header, no preallocation: the file is exactly the entries, and exists only when there is one.
A size that is not a multiple of 34, or an entry of a newer version, is a corrupt index. So is a
file with a hole (entries are appended whole: a hole is no part of one), found before anything
is read, and a file of more entries than its reader allows (a check or recovery: the segment's
abort markers, each of which names one entry), found before anything is read too. Entries are
read a chunk at a time; a writer's append reads only the last one.

Writers: the partition's appends (engine.log.log: an ABORT marker that ends an open transaction adds
its entry to the marker's segment), the cleaner (a cleaned segment carries its sources' entries),
recovery and `check --repair` (engine.log.loader: the segments recovery re-reads get theirs rebuilt
from the log, `reconcile`). After a crash the file may miss its last entries or end in a torn
one; the marker's segment lies past the recovery point then, so recovery rebuilds it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from seglogfs.engine.errors import CorruptIndexError
from seglogfs.engine.files import open_regular
from seglogfs.engine.log.transactions import TransactionTracker
from seglogfs.engine.record.records import CURRENT_MAGIC, BatchHeader, ControlType, control_type, decode_records

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
_CHUNK_ENTRIES = 4096  # entries read at a time (136 KiB)


@dataclass(frozen=True)
class AbortedTxn:
    version: int
    producer_id: int
    first_offset: int
    last_offset: int
    last_stable_offset: int


def read_transaction_index(path: Path, max_entries: int | None = None) -> list[AbortedTxn]:
    """Every entry of a `.txnindex` file; CorruptIndexError for a size that is not a multiple of
    34, a hole, more than `max_entries` entries, or an entry whose version is newer than 0
    (naming the position). UnsafeFileError for anything but a regular file."""
    fd = open_regular(path)
    try:
        count = _checked_entry_count(fd, path)
        if max_entries is not None and count > max_entries:
            raise CorruptIndexError(
                path, f"{count} entries, more than the {max_entries} abort markers of its segment can name"
            )
        size = ABORTED_TXN_DTYPE.itemsize
        out = []
        for first in range(0, count, _CHUNK_ENTRIES):
            raw = os.pread(fd, min(_CHUNK_ENTRIES, count - first) * size, first * size)
            entries = np.frombuffer(raw[: len(raw) - len(raw) % size], dtype=ABORTED_TXN_DTYPE)
            for index, entry in enumerate(entries.tolist(), first):
                if entry[0] > ABORTED_TXN_VERSION:
                    raise CorruptIndexError(
                        path, f"entry at position {index * size}: unexpected aborted transaction version {entry[0]}"
                    )
                out.append(AbortedTxn(*entry))
        return out
    finally:
        os.close(fd)


def _checked_entry_count(fd: int, path: Path) -> int:
    """The entries of an open `.txnindex` as its length and holes allow (nothing is read)."""
    length = os.fstat(fd).st_size
    size = ABORTED_TXN_DTYPE.itemsize
    if length % size:
        raise CorruptIndexError(path, f"{length} bytes is not a multiple of the {size}-byte entry size")
    hole = os.lseek(fd, 0, os.SEEK_HOLE) if length else 0
    if hole < length:
        raise CorruptIndexError(path, f"a hole at position {hole}: entries are appended whole")
    return length // size


def _last_entry(path: Path) -> AbortedTxn | None:
    """The file's last entry (None: no file, or no entry), its length checked, nothing else read."""
    try:
        fd = open_regular(path)
    except FileNotFoundError:
        return None
    try:
        count = _checked_entry_count(fd, path)
        if not count:
            return None
        size = ABORTED_TXN_DTYPE.itemsize
        entry = np.frombuffer(os.pread(fd, size, (count - 1) * size), dtype=ABORTED_TXN_DTYPE)
        return AbortedTxn(*entry.tolist()[0]) if len(entry) else None
    finally:
        os.close(fd)


def _encode(entries: list[AbortedTxn]) -> bytes:
    array = np.array(
        [(ABORTED_TXN_VERSION, e.producer_id, e.first_offset, e.last_offset, e.last_stable_offset) for e in entries],
        dtype=ABORTED_TXN_DTYPE,
    )
    return array.tobytes()


class TransactionIndex:
    """One segment's `.txnindex` (Kafka's TransactionIndex), written by the partition's writer.

    The file exists only while it has entries: the first `append` creates it, a `truncate_to`
    or `write` that leaves none removes it. It holds no descriptor between calls (aborts are
    rare; a partition's segments must not each keep one more file open). Entries are appended
    in marker order, so their last offsets increase (ValueError otherwise, as Kafka refuses
    one out of order).

    Durability: an append is written at once and fsynced by the next `flush` (the segment's
    flush, at a log flush or a roll), as the other indexes are. After a crash the file may lack
    its last entries or end in a torn one: recovery rebuilds the `.txnindex` of every segment
    it re-reads (engine.log.loader). Not thread-safe: the partition's writer calls it under the
    partition's lock (the cleaner's `.cleaned` segment: the cleaner alone).
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._dirty = False  # written since the last fsync
        self._last_offset: int | None = None  # the last entry's last offset, once known

    def __repr__(self) -> str:
        return f"TransactionIndex({self.path})"

    def entries(self, max_entries: int | None = None) -> list[AbortedTxn]:
        """Every entry; none when the file does not exist. CorruptIndexError as
        `read_transaction_index`."""
        try:
            return read_transaction_index(self.path, max_entries)
        except FileNotFoundError:
            return []

    def append(self, entry: AbortedTxn) -> None:
        """Add the entry of a transaction that aborted after every one already in the file."""
        if self._last_offset is None:
            last = _last_entry(self.path)
            self._last_offset = last.last_offset if last is not None else -1
        if entry.last_offset <= self._last_offset:
            raise ValueError(
                f"{self.path}: aborted transaction ending at {entry.last_offset} does not follow the last entry's "
                f"end {self._last_offset}"
            )
        fd = open_regular(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
        try:
            data = _encode([entry])
            if os.write(fd, data) != len(data):  # (34 bytes to a regular file: one write)
                raise OSError(f"{self.path}: short write")
        finally:
            os.close(fd)
        self._dirty = True
        self._last_offset = entry.last_offset

    def truncate_to(self, offset: int) -> None:
        """Remove the entries of transactions whose marker is at or past `offset` (Kafka's
        truncateTo: the log is cut there); the file goes when nothing is left."""
        if not self.path.exists():
            return
        try:
            entries = self.entries()
        except CorruptIndexError:
            entries = []  # damage: recovery or `check --repair` rebuilds it
        self.write([entry for entry in entries if entry.last_offset < offset], durable=False)

    def write(self, entries: list[AbortedTxn], *, durable: bool = True) -> None:
        """Replace the file's entries (recovery's rebuild, the cleaner's output); with
        `durable`, fsynced before returning. No entries: the file is removed."""
        self._last_offset = entries[-1].last_offset if entries else -1
        if not entries:
            self.path.unlink(missing_ok=True)
            self._dirty = False
            return
        fd = open_regular(self.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        try:
            data = memoryview(_encode(entries))
            while data:
                data = data[os.write(fd, data) :]
            if durable:
                os.fsync(fd)
        finally:
            os.close(fd)
        self._dirty = not durable

    def flush(self) -> None:
        """fsync what was written since the last fsync."""
        if not self._dirty:
            return
        try:
            fd = open_regular(self.path)
        except FileNotFoundError:
            self._dirty = False
            return
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        self._dirty = False

    def moved_to(self, path: Path) -> None:
        """The file was renamed (`.cleaned` → `.swap` → live, live → `.deleted`)."""
        self.path = path

    def delete(self) -> None:
        self.path.unlink(missing_ok=True)
        self._dirty = False


# -- rebuilding from the log ------------------------------------------------------------------


@dataclass(frozen=True)
class AbortMarker:
    """An ABORT marker met while reading the log: where it is, the lowest offset its
    transaction may have begun at (after the producer's previous marker), and the entry the
    log itself gives for it (None when none of the transaction's batches is left: retention or
    compaction removed them, or the transaction was empty)."""

    producer_id: int
    offset: int
    first_offset_floor: int
    rebuilt: AbortedTxn | None


class TransactionIndexBuilder:
    """The `.txnindex` entries of a log, computed batch by batch in offset order, as Kafka's
    ProducerStateManager completes transactions (`ProducerAppendInfo.appendEndTxnMarker`,
    then `lastStableOffset` of the completed transaction):

    * firstOffset: the transaction's first offset, the first transactional data batch of the
      producer after its previous marker;
    * lastOffset: the ABORT marker's offset;
    * lastStableOffset: the first offset of the earliest transaction still open of any other
      producer, else the marker's offset + 1; taken right after the marker, as Kafka's recovery
      (LogSegment.recover) and a leader appending the marker on its own do.

    An ABORT of a producer with no open transaction gives no entry (Kafka emits a completed
    transaction only for a non-empty one). Feed it every transactional batch (others change
    nothing); not thread-safe. The open transactions are those of the batches fed: started
    from a segment after the first, or after retention removed the head of the log, it sees a
    transaction from its first batch still there."""

    def __init__(self) -> None:
        self.tracker = TransactionTracker()
        self._last_marker: dict[int, int] = {}  # producer id → offset of its last marker

    def add(self, header: BatchHeader, batch: bytes | bytearray | memoryview) -> AbortMarker | None:
        """Take in the next transactional batch; the ABORT marker it is, if it is one."""
        if header.magic != CURRENT_MAGIC or not header.is_transactional:
            return None
        completed = len(self.tracker.aborted)
        self.tracker.add(header, batch)
        if not header.is_control:
            return None
        producer_id, offset = header.producer_id, header.base_offset
        floor = self._last_marker.get(producer_id, -1) + 1
        self._last_marker[producer_id] = offset
        rebuilt = None
        if len(self.tracker.aborted) > completed:
            txn = self.tracker.aborted[-1]
            lso = self.tracker.last_stable_offset(offset + 1)
            rebuilt = AbortedTxn(ABORTED_TXN_VERSION, producer_id, txn.first_offset, offset, lso)
        else:
            records = decode_records(header, batch, include_control=True)
            if not records or control_type(records[0]) is not ControlType.ABORT:
                return None
        return AbortMarker(producer_id, offset, floor, rebuilt)


def reconcile(written: list[AbortedTxn], markers: list[AbortMarker]) -> tuple[list[AbortedTxn], list[str]]:
    """A segment's `.txnindex` entries as the log gives them (`markers`, in order), keeping
    what only the file still knows, and what was wrong with `written`.

    The log gives every entry whose transaction still has batches in it; those must be in the
    file as given. Where retention or compaction removed a transaction's first batches, the
    rebuild sees it begin later (or not at all) and sees the partition stable earlier: a
    written entry for the same marker with a first offset and a last stable offset no higher
    than the rebuild's (and a first offset after the producer's previous marker) stands, as
    Kafka keeps the index it wrote. Anything else is a problem, and the rebuild's entry
    replaces it."""
    by_marker = {(entry.producer_id, entry.last_offset): entry for entry in written}
    problems: list[str] = []
    kept: list[AbortedTxn] = []
    for marker in markers:
        entry = by_marker.pop((marker.producer_id, marker.offset), None)
        rebuilt = marker.rebuilt
        if entry is None:
            if rebuilt is not None:
                problems.append(
                    f"no entry for the aborted transaction of producer {rebuilt.producer_id} "
                    f"(offsets {rebuilt.first_offset}..{rebuilt.last_offset})"
                )
                kept.append(rebuilt)
            continue
        ceiling = (
            (marker.offset, marker.offset + 1)
            if rebuilt is None
            else (rebuilt.first_offset, rebuilt.last_stable_offset)
        )
        if entry == rebuilt or (
            marker.first_offset_floor <= entry.first_offset <= ceiling[0] and entry.last_stable_offset <= ceiling[1]
        ):
            kept.append(entry)
            continue
        expected = ""
        if rebuilt is not None:
            expected = f" (first offset {rebuilt.first_offset}, last stable offset {rebuilt.last_stable_offset})"
        problems.append(
            f"entry (producer {entry.producer_id}, first offset {entry.first_offset}, last offset "
            f"{entry.last_offset}, last stable offset {entry.last_stable_offset}) disagrees with the log{expected}"
        )
        if rebuilt is not None:
            kept.append(rebuilt)
    for entry in by_marker.values():
        problems.append(
            f"entry (producer {entry.producer_id}, last offset {entry.last_offset}) names no abort marker of the "
            "segment"
        )
    if not problems and kept != written:
        problems.append("entries are not in the order of their markers")
    return kept, problems
