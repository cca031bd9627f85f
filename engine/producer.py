"""Records from lines, as kafka-console-producer makes them: one record per line of text
(`LineFormat`: `parse.key`, `key.separator`, `null.marker`) or per JSON line (the JSON Lines
record format), placed in a topic's partitions as Kafka's producer places them and appended a
batch per partition. `seglogfs produce` and the mount's append files both go through here.

A `LineSplitter` cuts a stream that arrives in arbitrary pieces (stdin chunks, `write()` calls)
into complete lines; a `Producer` turns lines into appends.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from seglogfs.engine.errors import EngineError, InvalidRecordError, RecordTooLargeError
from seglogfs.engine.log.log import PartitionLog
from seglogfs.engine.partitioner import RoundRobin, partition_for_key
from seglogfs.engine.record.records import BATCH_OVERHEAD_BYTES, Header
from seglogfs.engine.text.console_formats import LineFormat
from seglogfs.engine.text.json_records import record_from_json

T = TypeVar("T")
logger = logging.getLogger(__name__)

# The most a record adds to its line's bytes: attributes, and varints of its length, timestamp
# delta, offset delta, key length, value length and header count.
MOST_RECORD_OVERHEAD_BYTES = 1 + 5 + 10 + 5 + 5 + 5 + 5

# Encoded batches appended as one unit, all or nothing, take at most this: one open of a mount's
# `append.batches` (held in memory until its close), one piece of a Spark commit through a mount.
BATCHES_PER_APPEND_BYTES = 64 << 20


class LineSplitter:
    """Complete lines of a byte stream fed in pieces. What follows the last newline waits for
    the next piece, or for `finish` (a last line without a newline is a line too), up to
    `max_line_bytes`: a piece that would make the waiting line longer is refused
    (RecordTooLargeError naming `where`), as no record could hold it. Not thread-safe: one per
    stream.

    A line refused as too large is dropped whole, never stored in part: what was fed of it
    before goes, and what follows of it up to its newline is refused too (a piece with no
    newline) or dropped (the part of a piece up to its first newline). A piece whose lines
    `consume` refuses as too large takes the waiting line it would have ended with it."""

    def __init__(self, max_line_bytes: int, where: str) -> None:
        self.max_line_bytes = max_line_bytes
        self.where = where
        self._pending = bytearray()
        self._dropping = False  # within a line refused as too large, until its newline

    @property
    def pending_bytes(self) -> int:
        """The length of the partial line waiting for its newline."""
        return len(self._pending)

    def feed(self, data: bytes, consume: Callable[[list[bytes]], T]) -> T:
        """`consume` the lines (without their newlines) that `data` completes. If `consume`
        raises, the splitter is as it was before (the piece was not taken), but for a line
        refused as too large (see the class)."""
        if self._dropping:
            end = data.find(b"\n")
            if end < 0:
                raise RecordTooLargeError(
                    f"{self.where}: the rest of a line of more than {self.max_line_bytes} bytes, refused "
                    "before: dropped up to its newline"
                )
            self._dropping = False  # (the refused line ends here: what follows is new lines)
            data = data[end + 1 :]
        cut = data.rfind(b"\n") + 1
        rest = len(data) - cut
        if rest + (0 if cut else len(self._pending)) > self.max_line_bytes:
            self._pending.clear()
            self._dropping = True
            raise RecordTooLargeError(
                f"{self.where}: a line of more than {self.max_line_bytes} bytes without a newline "
                f"(max.message.bytes={self.max_line_bytes}): refused, and nothing of it is stored"
            )
        if not cut:
            result = consume([])
            self._pending += data
            return result
        lines = (bytes(self._pending) + data[:cut] if self._pending else data[:cut]).split(b"\n")
        lines.pop()
        try:
            result = consume(lines)
        except RecordTooLargeError:
            self._pending.clear()
            raise
        self._pending[:] = data[cut:]
        return result

    def finish(self) -> list[bytes]:
        """The partial line, if any, as the last line; the splitter is empty after."""
        last = bytes(self._pending)
        self._pending.clear()
        self._dropping = False
        return [last] if last else []


@dataclass
class _Columns:
    """The records bound for one partition, column-wise, as `append_records` takes them."""

    values: list[bytes | None] = field(default_factory=list)
    keys: list[bytes | None] = field(default_factory=list)
    headers: list[Sequence[Header]] = field(default_factory=list)
    timestamps: list[int] = field(default_factory=list)

    def append_to(self, log: PartitionLog, now_ms: int) -> None:
        log.append_records(
            self.values, keys=self._keys, headers=self._headers, timestamps=self.timestamps, now_ms=now_ms
        )

    def encode_for(self, log: PartitionLog) -> bytes:
        """`PartitionLog.encode_records` of these records: refused as `append_to` would be."""
        return log.encode_records(self.values, keys=self._keys, headers=self._headers, timestamps=self.timestamps)

    @property
    def _keys(self) -> list[bytes | None] | None:
        return self.keys if any(key is not None for key in self.keys) else None

    @property
    def _headers(self) -> list[Sequence[Header]] | None:
        return self.headers if any(self.headers) else None


def _append_all_or_none(bound: list[tuple[PartitionLog, _Columns]], now_ms: int) -> None:
    """Append records to several partitions, all of them or none: each partition's are encoded
    first (a record too large, a compacted topic's missing key: refused before anything is
    stored); when an append then fails (a full disk), the partitions appended to before it are
    cut back to where they were."""
    encoded = [(log, columns.encode_for(log)) for log, columns in bound]
    appended: list[tuple[PartitionLog, int]] = []
    try:
        for log, data in encoded:
            appended.append((log, log.append_encoded(data, now_ms).first_offset))
    except BaseException:
        for log, first_offset in appended:
            try:
                log.truncate_to(first_offset, now_ms)
            except (EngineError, OSError) as error:  # (the append's own error is the one raised)
                logger.error(
                    "%s-%d: records %d.. of a failed append to several partitions could not be cut back: %s",
                    log.topic,
                    log.partition,
                    first_offset,
                    error,
                )
        raise


@dataclass(frozen=True)
class Produced:
    """What one `Producer.send` stored: the partitions appended to and how many records."""

    logs: tuple[PartitionLog, ...]
    records: int


class Producer:
    """Appends lines to one partition, or to a topic's partitions by Kafka's default
    partitioner: murmur2 of the key; records without a key go to one partition per call, the
    next in turn (as Kafka's producer sends a batch of unkeyed records to one partition).

    `line_format` reads text lines; None reads JSON Lines (blank lines skipped; a record's own
    `timestamp` is kept, others get `now_ms`). `round_robin` may be shared by producers that
    take turns over the same partitions (the opens of one append file). Not thread-safe: callers
    serialise `send` (the partitions' own locks serialise the appends)."""

    def __init__(
        self, logs: Sequence[PartitionLog], line_format: LineFormat | None, round_robin: RoundRobin | None = None
    ) -> None:
        if not logs:
            raise ValueError("a producer needs at least one partition")
        self.logs = tuple(logs)
        self.line_format = line_format
        self._round_robin = round_robin or RoundRobin()

    def send(
        self, lines: Sequence[bytes], now_ms: int, where: str, *, first_line: int = 1, atomic: bool = True
    ) -> Produced:
        """Append `lines` (without their newlines) as records, one batch per partition (split
        at `max.message.bytes` by the log). A bad line raises InvalidRecordError naming `where`
        and its line number (`first_line` is the number of `lines[0]`): with `atomic` nothing
        of the call is stored, as a write to an append file appears whole or fails whole;
        without, the lines before it are stored first, as kafka-console-producer has sent the
        lines it read before one it could not parse."""
        if self.line_format == LineFormat() and len(self.logs) == 1:
            # Plain lines into one partition: every line is a value, nothing to parse.
            if lines:
                self.logs[0].append_records(list(lines), timestamps=now_ms, now_ms=now_ms)
            return Produced(self.logs if lines else (), len(lines))
        per_partition: dict[int, _Columns] = {}
        null_slot = self._round_robin.next(len(self.logs))
        error: InvalidRecordError | None = None
        for number, line in enumerate(lines, start=first_line):
            try:
                record = self._parse(line, f"{where} line {number}", now_ms)
            except InvalidRecordError as bad:
                if atomic:
                    raise
                error = bad
                break
            if record is None:
                continue
            key, value, headers, timestamp = record
            slot = 0 if len(self.logs) == 1 else null_slot if key is None else partition_for_key(key, len(self.logs))
            columns = per_partition.setdefault(slot, _Columns())
            columns.values.append(value)
            columns.keys.append(key)
            columns.headers.append(headers)
            columns.timestamps.append(timestamp)
        bound = [(self.logs[slot], columns) for slot, columns in sorted(per_partition.items())]
        if atomic and len(bound) > 1:
            _append_all_or_none(bound, now_ms)
        else:
            for log, columns in bound:
                columns.append_to(log, now_ms)
        if error is not None:
            raise error
        return Produced(
            tuple(self.logs[slot] for slot in sorted(per_partition)),
            sum(len(columns.values) for columns in per_partition.values()),
        )

    def try_send_now(self, lines: LineSplitter, data: bytes, now_ms: int, send: Callable[[list[bytes]], T]) -> T | None:
        """For an event loop, which must wait neither on another thread's append nor on the
        disk (a one-line `echo >> append`): `data` fed to `lines`, the lines it completes given
        to `send` (which sends them here), when every partition they may go to takes them as a
        write to the page cache now, timestamped `now_ms` (PartitionLog.quick_append);
        None, nothing fed, otherwise. The partitions are held until `send` returns."""
        records = data.count(b"\n")  # (the lines this write ends; a batch each at most)
        # A line's bytes take at most three times as many in its record (parsed headers: two
        # length varints for as little as `k:,`), plus the record's and its batch's own.
        most_bytes = 3 * (lines.pending_bytes + len(data)) + records * (
            BATCH_OVERHEAD_BYTES + MOST_RECORD_OVERHEAD_BYTES
        )
        with contextlib.ExitStack() as held:
            if not all(held.enter_context(log.quick_append(most_bytes, records, now_ms)) for log in self.logs):
                return None
            return lines.feed(data, send)

    def _parse(
        self, line: bytes, where: str, now_ms: int
    ) -> tuple[bytes | None, bytes | None, Sequence[Header], int] | None:
        """(key, value, headers, timestamp) of one line; None for a blank JSON line."""
        if self.line_format is not None:
            key, value = self.line_format.parse(line, where)
            return key, value, (), now_ms
        if not line.strip():
            return None
        parsed = record_from_json(line, where)
        timestamp = now_ms if parsed.timestamp is None else parsed.timestamp
        return parsed.key, parsed.value, parsed.headers, timestamp
