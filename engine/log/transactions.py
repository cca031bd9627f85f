"""A partition's transactions as a read_committed reader needs them (Kafka's producer state and
transaction index, rebuilt from the log): which transactional batches belong to aborted
transactions, and the last stable offset, below which every transaction has ended.

What the log holds (Kafka's transactional producer):

- A transactional data batch (attribute bit 4) of producer P. The first one after P's last
  marker opens P's transaction at its base offset; later ones join it.
- A control batch (attributes bits 4 and 5) of P ends P's transaction. Its one record's key is
  int16 version, int16 type: 0 ABORT, 1 COMMIT (the value, an EndTxnMarker, is not needed here).
- A transaction is aborted when its marker is ABORT: every batch of P from its first offset to
  the marker's offset is hidden from read_committed readers. An ABORT with no open transaction
  (its data was removed by retention or compaction) hides nothing.
- The last stable offset (LSO) is the first offset of the earliest transaction still open, or
  the log end offset when none is. read_committed readers read only below it, as Kafka's
  fetches do: a non-transactional record after an open transaction waits for it too.

Kafka keeps this state across restarts in producer snapshots and `.txnindex` files; here it is
built by one pass over the batch headers (and the few control records) from the log start, and
brought up to date from where that pass ended.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from seglogfs.engine.record.records import BatchHeader, ControlType, control_type, decode_records

if TYPE_CHECKING:
    from seglogfs.engine.log.log import PartitionLog
    from seglogfs.engine.log.segment import LogSegment

READ_UNCOMMITTED, READ_COMMITTED = "read_uncommitted", "read_committed"  # Kafka's isolation.level values


@dataclass(frozen=True)
class AbortedTransaction:
    """An aborted transaction: producer `producer_id`'s batches at offsets first..last (the
    ABORT marker's offset) are not shown to read_committed readers."""

    producer_id: int
    first_offset: int
    last_offset: int


class AbortedIndex:
    """Aborted transactions by producer: whether a data batch belongs to one. Transactions are
    added in the order their markers came (a producer's one after another, so each producer's
    ranges are sorted)."""

    def __init__(self, aborted: Iterable[AbortedTransaction] = ()) -> None:
        self._ranges: dict[int, tuple[list[int], list[int]]] = {}  # producer id → (firsts, lasts)
        for transaction in aborted:
            self.add(transaction)

    def add(self, transaction: AbortedTransaction) -> None:
        firsts, lasts = self._ranges.setdefault(transaction.producer_id, ([], []))
        firsts.append(transaction.first_offset)
        lasts.append(transaction.last_offset)

    def covers(self, header: BatchHeader) -> bool:
        """Whether a data batch belongs to an aborted transaction (never a control batch, nor a
        batch outside transactions)."""
        if not header.is_transactional or header.is_control:
            return False
        ranges = self._ranges.get(header.producer_id)
        if ranges is None:
            return False
        firsts, lasts = ranges
        slot = bisect.bisect_right(firsts, header.base_offset) - 1
        return slot >= 0 and header.base_offset <= lasts[slot]


class TransactionTracker:
    """The transactions of one partition read so far (`add`, in offset order); what a
    read_committed reader may see (`is_aborted`, `last_stable_offset`). Not thread-safe: one
    reader's; except that `is_aborted` may be asked from other threads while `add` runs, of a
    batch below a last stable offset returned before: every transaction below it has ended, so
    its answer is final, and `add` only appends ranges that start at or above it."""

    def __init__(self) -> None:
        self._open: dict[int, int] = {}  # producer id → first offset of its open transaction
        self._aborted_index = AbortedIndex()
        self.aborted: list[AbortedTransaction] = []  # in the order their markers came
        self.next_offset = 0  # batches below this offset have been added

    def add(self, header: BatchHeader, batch: bytes | bytearray | memoryview) -> None:
        """Take in the next batch of the log (CRC checked by the caller). Only a transaction
        marker's bytes are used: of any other batch, the header is enough (`b""` will do)."""
        if header.last_offset < self.next_offset:
            return  # seen already
        self.next_offset = header.last_offset + 1
        if not header.is_transactional:
            return
        producer_id = header.producer_id
        if not header.is_control:
            self._open.setdefault(producer_id, header.base_offset)
            return
        records = decode_records(header, batch, include_control=True)
        kind = control_type(records[0]) if records else None
        first = self._open.pop(producer_id, None)
        if kind is ControlType.ABORT and first is not None:
            aborted = AbortedTransaction(producer_id, first, header.base_offset)
            self.aborted.append(aborted)
            self._aborted_index.add(aborted)

    def catch_up(self, log: PartitionLog, before_each: Callable[[], None] | None = None) -> int:
        """Take in the batches `log` gained since the last look (from its log start the first
        time) and return the last stable offset of what was read: not of the log end now, which
        a writer may have moved meanwhile. `before_each` is called before each batch (a long
        first read that may be stopped raises there).

        Only batch headers are read, except for the batches the tracking rests on, which are
        read whole and checked: those of transactions and markers (a marker's record says commit
        or abort), and the two batches where offsets go back (one's header is damaged). So a
        partition without transactions costs a read per large batch, not a read of the
        partition, and a damaged header cannot hold a transaction open unseen. (Any other
        batch's records are checked where a reader reads them.)"""
        start = max(self.next_offset, log.log_start_offset)
        previous: tuple[LogSegment, BatchHeader] | None = None
        try:
            for segment, header in log.batch_headers(start, skip=self._holds_none):
                if before_each is not None:
                    before_each()
                whole = header.is_transactional or header.is_control
                if previous is not None and header.base_offset <= previous[1].last_offset:
                    previous[0].checked_batch(previous[1])
                    whole = True
                self.add(header, segment.checked_batch(header) if whole else b"")
                previous = segment, header
        except FileNotFoundError:
            # Read-only, beside a writer (a broker): a segment of the last look was removed
            # before this read opened it (the cleaner swapped it out, retention deleted it).
            # What was read stands; the rest is read after the log's next look
            # (`PartitionLog.refresh`), from where this ended, in the segments that hold it then.
            if log.writable:
                raise
        return self.last_stable_offset(max(self.next_offset, log.log_start_offset))

    def _holds_none(self, segment: LogSegment) -> bool:
        """Whether `segment` is known to hold no transactional batch without reading it (a
        stored segment whose backup's summary says so, of all it holds): then its batches are
        taken as read."""
        summary = segment.stored_summary()
        if summary is None or summary.transactional:
            return False
        self.next_offset = max(self.next_offset, summary.next_offset)
        return True

    def is_aborted(self, header: BatchHeader) -> bool:
        """Whether a data batch belongs to an aborted transaction (control batches are never
        user records, whatever this says)."""
        return self._aborted_index.covers(header)

    def last_stable_offset(self, log_end_offset: int) -> int:
        """The first offset of the earliest open transaction, else `log_end_offset`."""
        return min(self._open.values(), default=log_end_offset)

    @property
    def open_transactions(self) -> dict[int, int]:
        """Producer id → first offset, of the transactions not ended yet."""
        return dict(self._open)
