"""Kafka record batches, magic 2 (v2): the unit of every `.log` file.

Byte layout of a batch (all integers big-endian), as `BATCH_HEADER_DTYPE` spells it:

    offset  size  field
     0       8    base_offset            first offset of the batch
     8       4    batch_length           bytes after this field (whole batch = 12 + batch_length)
    12       4    partition_leader_epoch
    16       1    magic                  2 (0 and 1 are the legacy message formats)
    17       4    crc                    CRC-32C of every byte from `attributes` to the end
    21       2    attributes             bits 0-2 codec, 3 timestamp type (1 = LogAppendTime),
                                         4 transactional, 5 control, 6 delete horizon set
    23       4    last_offset_delta      last offset = base_offset + last_offset_delta
    27       8    base_timestamp         first timestamp (or the delete horizon, bit 6)
    35       8    max_timestamp
    43       8    producer_id            -1 when none
    51       2    producer_epoch
    53       4    base_sequence
    57       4    records_count
    61       ...  records, compressed as a whole when the codec is not none

A record inside the records section (varints are zig-zag, see `engine.record.varint`):

    length varint | attributes int8 (unused, 0) | timestamp_delta varlong | offset_delta varint |
    key_length varint (-1 = null) | key | value_length varint (-1 = null) | value |
    header_count varint | (header_key_length varint | header_key utf-8 |
                           header_value_length varint (-1 = null) | header_value)*

Batch-level work (offsets, lengths, CRC) reads only the 61-byte header; record-level work decodes
the records section. Control batches carry transaction markers, never user records: readers of
user records skip them.

Legacy messages (magic 0 and 1, `engine.record.legacy`) are read, never written. Their magic byte sits
where a batch's does, so `BatchHeader.parse` tells them apart and gives each top-level message a
`LegacyBatchHeader`: the message seen as a batch (a plain message holds one record, a compressed
wrapper its inner messages), its records decoded once, when it is parsed. Readers then use it as
any batch: `check_batch` checks its CRC-32, `decode_records` returns its records, and
`records_section` re-encodes them as a v2 records section, so that the column-wise readers
(`engine.record.columns`) and the compiled core take them unchanged. Segments that mix legacy messages
and v2 batches (a broker upgraded in place) read in order.
"""

from __future__ import annotations

import enum
import itertools
import struct
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from seglogfs.engine import _core
from seglogfs.engine.record import legacy, varint
from seglogfs.engine.record.compression import CompressionType, decompress

BATCH_HEADER_DTYPE = np.dtype(
    [
        ("base_offset", ">i8"),
        ("batch_length", ">i4"),
        ("partition_leader_epoch", ">i4"),
        ("magic", "i1"),
        ("crc", ">u4"),
        ("attributes", ">i2"),
        ("last_offset_delta", ">i4"),
        ("base_timestamp", ">i8"),
        ("max_timestamp", ">i8"),
        ("producer_id", ">i8"),
        ("producer_epoch", ">i2"),
        ("base_sequence", ">i4"),
        ("records_count", ">i4"),
    ]
)
BATCH_HEADER = struct.Struct(">qiibIhiqqqhii")
assert BATCH_HEADER.size == BATCH_HEADER_DTYPE.itemsize == 61

BATCH_OVERHEAD_BYTES = BATCH_HEADER.size
# Bytes before the length field counts: base_offset (8) + batch_length (4). Kafka calls this
# LOG_OVERHEAD; it is the same for legacy messages, whose magic byte also sits at offset 16.
LOG_OVERHEAD_BYTES = 12
MAGIC_OFFSET = 16
CRC_START = 21  # the CRC covers attributes .. end
CURRENT_MAGIC = 2
NO_TIMESTAMP = -1
NO_PRODUCER_ID = -1
NO_PRODUCER_EPOCH = -1
NO_SEQUENCE = -1
NO_PARTITION_LEADER_EPOCH = -1

COMPRESSION_CODEC_MASK = 0x07
TIMESTAMP_TYPE_MASK = 0x08
TRANSACTIONAL_FLAG_MASK = 0x10
CONTROL_FLAG_MASK = 0x20
DELETE_HORIZON_FLAG_MASK = 0x40


class TimestampType(enum.IntEnum):
    """Kafka's timestamp types; the names are what consumers print."""

    NO_TIMESTAMP_TYPE = -1
    CREATE_TIME = 0
    LOG_APPEND_TIME = 1

    @property
    def display_name(self) -> str:
        return _TIMESTAMP_TYPE_NAMES[self]

    @classmethod
    def from_config(cls, name: str) -> TimestampType:
        """`message.timestamp.type` value → type (`CreateTime` or `LogAppendTime`)."""
        member = _CONFIGURABLE_TIMESTAMP_TYPES.get(name)
        if member is None:
            raise ValueError(f"expected CreateTime or LogAppendTime, got {name!r}")
        return member


_TIMESTAMP_TYPE_NAMES = {
    TimestampType.NO_TIMESTAMP_TYPE: "NoTimestampType",
    TimestampType.CREATE_TIME: "CreateTime",
    TimestampType.LOG_APPEND_TIME: "LogAppendTime",
}
_CONFIGURABLE_TIMESTAMP_TYPES = {
    "CreateTime": TimestampType.CREATE_TIME,
    "LogAppendTime": TimestampType.LOG_APPEND_TIME,
}


class ControlType(enum.IntEnum):
    """Transaction marker types held in the key of a control record."""

    ABORT = 0
    COMMIT = 1


Header = tuple[str, bytes | None]


class Record(NamedTuple):
    """One user record as read back. A NamedTuple rather than a dataclass: readers create
    millions of these, and a tuple is several times cheaper to build. Immutable all the same."""

    offset: int
    timestamp: int
    timestamp_type: TimestampType
    key: bytes | None
    value: bytes | None
    headers: tuple[Header, ...]


@dataclass(slots=True)
class BatchHeader:
    """The 61 fixed bytes of a v2 batch, parsed; `position` is where the batch starts in its
    file (or buffer). Reading it never touches the records section.

    A value: nothing assigns to a header once parsed. Not a frozen dataclass all the same, as
    every batch read or appended makes one, and a frozen one's construction (a guarded setattr
    per field) cost 1 µs of a one-record append's 10 µs, against 0.1 µs."""

    position: int
    base_offset: int
    batch_length: int
    partition_leader_epoch: int
    magic: int
    crc: int
    attributes: int
    last_offset_delta: int
    base_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    records_count: int

    @classmethod
    def parse(cls, buf: bytes | bytearray | memoryview, offset: int = 0, position: int | None = None) -> BatchHeader:
        """Parse the header at `offset` of `buf`, which must hold at least 61 bytes there (26
        for a legacy message). `position` is the batch's place in its file (default: `offset`).
        A legacy message (magic 0 or 1) gives a `LegacyBatchHeader`, decoded when `buf` holds
        all of it."""
        if buf[offset + MAGIC_OFFSET] < CURRENT_MAGIC:
            return LegacyBatchHeader.parse_message(buf, offset, offset if position is None else position)
        return cls(offset if position is None else position, *BATCH_HEADER.unpack_from(buf, offset))

    @property
    def size_in_bytes(self) -> int:
        return LOG_OVERHEAD_BYTES + self.batch_length

    @property
    def next_position(self) -> int:
        return self.position + self.size_in_bytes

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.last_offset_delta

    @property
    def next_offset(self) -> int:
        return self.last_offset + 1

    @property
    def compression(self) -> CompressionType:
        return CompressionType(self.attributes & COMPRESSION_CODEC_MASK)

    @property
    def stored_uncompressed(self) -> bool:
        """Whether the codec bits are 0 (`compression` raises for a codec id no codec has)."""
        return not self.attributes & COMPRESSION_CODEC_MASK

    @property
    def timestamp_type(self) -> TimestampType:
        if self.magic == 0:  # a legacy message without timestamps
            return TimestampType.NO_TIMESTAMP_TYPE
        if self.attributes & TIMESTAMP_TYPE_MASK:
            return TimestampType.LOG_APPEND_TIME
        return TimestampType.CREATE_TIME

    @property
    def is_transactional(self) -> bool:
        return bool(self.attributes & TRANSACTIONAL_FLAG_MASK)

    @property
    def is_control(self) -> bool:
        return bool(self.attributes & CONTROL_FLAG_MASK)

    @property
    def has_delete_horizon(self) -> bool:
        return bool(self.attributes & DELETE_HORIZON_FLAG_MASK)

    @property
    def delete_horizon_ms(self) -> int | None:
        return self.base_timestamp if self.has_delete_horizon else None

    @property
    def last_sequence(self) -> int:
        if self.base_sequence == NO_SEQUENCE:
            return NO_SEQUENCE
        return (self.base_sequence + self.last_offset_delta) & 0x7FFF_FFFF


@dataclass(slots=True)
class LegacyBatchHeader(BatchHeader):
    """A legacy message (magic 0 or 1) seen as a batch, as Kafka's AbstractLegacyRecordBatch
    sees it: `base_offset` is its first record's offset and `last_offset` the message's own
    (a wrapper's last inner offset); `batch_length` is the message size; `crc` its CRC-32;
    `attributes` its codec and timestamp-type bits; `base_timestamp` the first record's
    timestamp and `max_timestamp` the largest (magic 0: -1); no producer, no leader epoch.
    `records` are its records as consumers see them. `problem` says why it cannot be read (a
    CRC-32 mismatch, a malformed or undecodable wrapper), None when it can; `records_count` is
    -1 when the message was parsed from its first bytes only (`whole` false)."""

    records: tuple[Record, ...] = ()
    problem: str | None = None
    whole: bool = True

    @classmethod
    def parse_message(cls, buf: bytes | bytearray | memoryview, offset: int, position: int) -> LegacyBatchHeader:
        """The header of the legacy message at `offset` of `buf` (at least 26 bytes there).
        Never raises for bad bytes: they make `problem`."""
        view = memoryview(buf)[offset:]
        message_offset, size, crc = struct.unpack_from(">qiI", view)
        magic = view[MAGIC_OFFSET]
        mask = COMPRESSION_CODEC_MASK | (legacy.TIMESTAMP_TYPE_BIT if magic == 1 else 0)
        attributes = view[MAGIC_OFFSET + 1] & mask
        timestamp = struct.unpack_from(">q", view, 18)[0] if magic == 1 else NO_TIMESTAMP
        shallow = (message_offset, size, NO_PARTITION_LEADER_EPOCH, magic, crc, attributes, 0, timestamp, timestamp)
        no_producer = (NO_PRODUCER_ID, NO_PRODUCER_EPOCH, NO_SEQUENCE)
        if not 0 <= size <= len(view) - LOG_OVERHEAD_BYTES:
            return cls(position, *shallow, *no_producer, -1, problem="message cut short", whole=False)
        entry = view[: LOG_OVERHEAD_BYTES + size]
        try:
            problem = legacy.crc_problem(entry)
            if problem is not None:
                return cls(position, *shallow, *no_producer, 0, problem=problem)
            message = legacy.parse_message(entry)
            messages = legacy.inner_messages(message) if message.codec else [message]
        except Exception as error:  # a codec's or a parser's error: the message cannot be read
            return cls(position, *shallow, *no_producer, 0, problem=f"undecodable legacy message: {error}")
        kind = TimestampType.NO_TIMESTAMP_TYPE if magic == 0 else TimestampType(attributes >> 3)
        records = tuple(Record(m.offset, m.timestamp, kind, m.key, m.value, ()) for m in messages)
        base_offset = records[0].offset
        problem = None
        if message_offset < records[-1].offset or any(a.offset >= b.offset for a, b in itertools.pairwise(records)):
            problem = f"inner offsets {base_offset}..{records[-1].offset} do not rise to the wrapper's {message_offset}"
        return cls(
            position,
            base_offset,
            size,
            NO_PARTITION_LEADER_EPOCH,
            magic,
            crc,
            attributes,
            message_offset - base_offset,
            records[0].timestamp,
            max(timestamp, *(record.timestamp for record in records)),
            *no_producer,
            len(records),
            records=records,
            problem=problem,
        )


def legacy_header(header: BatchHeader, batch: bytes | bytearray | memoryview) -> LegacyBatchHeader:
    """`header` when it is a whole message's `LegacyBatchHeader`, else the message parsed again
    from `batch` (its whole bytes)."""
    if isinstance(header, LegacyBatchHeader) and header.whole:
        return header
    return LegacyBatchHeader.parse_message(batch, 0, header.position)


def compute_crc(batch: bytes | bytearray | memoryview) -> int:
    """CRC-32C of a whole batch's covered bytes (attributes to end)."""
    return int(_core.crc32c(memoryview(batch)[CRC_START:]))


def is_legacy_message(batch: bytes | bytearray | memoryview) -> bool:
    """Whether `batch` is an intact legacy message (magic 0 or 1): its own CRC-32 (zlib's), over
    the bytes from the magic byte to its end, holds. Tells old data from damage."""
    if len(batch) < 26 or batch[MAGIC_OFFSET] not in (0, 1):
        return False
    size, stored = struct.unpack_from(">iI", batch, 8)
    return 14 <= size == len(batch) - LOG_OVERHEAD_BYTES and zlib.crc32(memoryview(batch)[MAGIC_OFFSET:]) == stored


def check_batch(header: BatchHeader, batch: bytes | bytearray | memoryview) -> str | None:
    """Validate one whole batch (the header already parsed from `batch`'s first bytes).

    Returns None when valid, else the reason, worded for an error message. Checks what Kafka's
    `ensureValid` and the log loader check: magic, length, record count, CRC. A legacy
    message's `LegacyBatchHeader` is checked as Kafka checks one: its size and its CRC-32 (and
    that its records decode); a legacy message parsed as a v2 header (`iter_batch_headers`, the
    input of an append) is refused: seglogfs writes v2 only."""
    if header.magic != CURRENT_MAGIC:
        if header.magic not in (0, 1):
            return f"unsupported magic {header.magic}"
        if not isinstance(header, LegacyBatchHeader):
            return f"legacy message format (magic {header.magic}) is read, never written: v2 batches only"
        if header.batch_length < legacy.message_overhead(header.magic) or len(batch) != header.size_in_bytes:
            return f"legacy message of {header.size_in_bytes} bytes does not fit its {len(batch)} bytes"
        return legacy_header(header, batch).problem
    if header.batch_length < BATCH_OVERHEAD_BYTES - LOG_OVERHEAD_BYTES:
        return f"batch length {header.batch_length} is shorter than a batch header"
    if len(batch) != header.size_in_bytes:
        return f"batch of {header.size_in_bytes} bytes is cut short at {len(batch)} bytes"
    if header.last_offset_delta < 0 or header.records_count < 0:
        return "negative last offset delta or record count"
    if header.attributes & COMPRESSION_CODEC_MASK > CompressionType.ZSTD:
        return f"unknown compression codec id {header.attributes & COMPRESSION_CODEC_MASK}"
    actual = compute_crc(batch)
    if actual != header.crc:
        return f"CRC-32C mismatch (stored {header.crc}, computed {actual})"
    return None


def _decode_headers(buf: bytes, position: int, record_end: int) -> tuple[tuple[Header, ...], int]:
    """The headers of the record ending at `record_end`, from its header count at `position`, and
    the position after them. Kafka's rules: a negative count or key length is invalid, a negative
    value length a null value; ValueError when one runs past the record."""
    count, position = varint.decode_int(buf, position)
    if count < 0:
        raise ValueError(f"negative header count {count}")
    if count > (record_end - position) // 2:  # (a header takes two bytes at least)
        raise ValueError(f"{count} headers run past the record")
    headers = []
    for _ in range(count):
        key_length, position = varint.decode_int(buf, position)
        if key_length < 0:
            raise ValueError(f"negative header key length {key_length}")
        key = buf[position : position + key_length].decode("utf-8", "surrogateescape")
        position += key_length
        value_length, position = varint.decode_int(buf, position)
        value = None
        if value_length >= 0:
            value = buf[position : position + value_length]
            position += value_length
        if position > record_end:
            raise ValueError("a header runs past the record")
        headers.append((key, value))
    return tuple(headers), position


# A record's fields (Kafka's DefaultRecord): 32-bit varints but for the timestamp delta, a varlong.
_int_at = varint.decode_int_at
_long_at = varint.decode_at
# A record takes seven bytes at least: a length, attributes, timestamp and offset deltas, key and
# value lengths and a header count of one byte each (MIN_RECORD_BYTES of engine/core/core.h).
MIN_RECORD_BYTES = 7
_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1


def check_record_count(count: int, section_bytes: int) -> None:
    """ValueError when `count` records cannot be in a records section of `section_bytes` bytes
    (negative, or more than seven bytes a record allow): checked before anything is sized by a
    batch's record count, which a damaged batch (its CRC recomputed, or written so) can set to
    2^31 - 1."""
    if not 0 <= count <= section_bytes // MIN_RECORD_BYTES:
        raise ValueError(f"a record count of {count} is too large for a records section of {section_bytes} bytes")


def plausible_record_count(header: BatchHeader) -> bool:
    """Whether an uncompressed v2 batch's records section can hold its record count (seven bytes
    a record at least); a compressed section is checked when it is decompressed. Kafka's CRC
    check passes such a batch (a writer computed the CRC over the lie): every reader refuses it,
    and recovery cuts there."""
    if header.magic != CURRENT_MAGIC or header.attributes & COMPRESSION_CODEC_MASK != CompressionType.NONE:
        return True
    return 0 <= header.records_count <= (header.size_in_bytes - BATCH_OVERHEAD_BYTES) // MIN_RECORD_BYTES


def records_section(header: BatchHeader, batch: bytes | bytearray | memoryview) -> bytes:
    """The uncompressed records section of a whole batch. For a legacy message: its records
    encoded as a v2 records section (offset deltas from `base_offset`, timestamp deltas from
    `base_timestamp`), what the column-wise readers walk."""
    if header.magic != CURRENT_MAGIC:
        legacy_batch = legacy_header(header, batch)
        records = legacy_batch.records
        return _core.encode_records(
            [record.value for record in records],
            [record.key for record in records],
            None,
            [record.timestamp - legacy_batch.base_timestamp for record in records],
            [record.offset - legacy_batch.base_offset for record in records],
        )
    return decompress(header.compression, memoryview(batch)[BATCH_OVERHEAD_BYTES:])


def decode_records(
    header: BatchHeader, batch: bytes | bytearray | memoryview, *, include_control: bool = False
) -> list[Record]:
    """Decode every record of a valid batch (the CRC already checked by the caller).

    Control batches yield no records unless `include_control`. For LogAppendTime batches every
    record's timestamp is the batch's max timestamp, as Kafka's consumers report it. Raises
    ValueError (or a codec error) when the records section is malformed."""
    if header.is_control and not include_control:
        return []
    if header.magic != CURRENT_MAGIC:
        legacy_batch = legacy_header(header, batch)
        if legacy_batch.problem is not None:
            raise ValueError(legacy_batch.problem)
        return list(legacy_batch.records)
    buf = records_section(header, batch)
    count = header.records_count
    check_record_count(count, len(buf))
    try:
        return _decode_section(header, buf, count)
    except IndexError:  # a field read past the section's end
        raise ValueError("a record runs past the records section") from None


def _decode_section(header: BatchHeader, buf: bytes, count: int) -> list[Record]:
    """decode_records of a v2 batch's uncompressed records section `buf` (`count` records). A
    record's offset and timestamp (base + delta) past int64 is damage: ValueError, as the core
    refuses it. IndexError when a field runs past the section."""
    base_offset = header.base_offset
    base_timestamp = header.base_timestamp
    timestamp_type = header.timestamp_type
    log_append_time = header.max_timestamp if timestamp_type is TimestampType.LOG_APPEND_TIME else None
    # The deltas that keep a record's offset and timestamp within int64.
    lowest_offset_delta, highest_offset_delta = _INT64_MIN - base_offset, _INT64_MAX - base_offset
    lowest_timestamp_delta, highest_timestamp_delta = _INT64_MIN - base_timestamp, _INT64_MAX - base_timestamp
    if log_append_time is not None:  # (every record shows the batch's time: its delta is unused)
        lowest_timestamp_delta, highest_timestamp_delta = -(1 << 64), 1 << 64
    records: list[Record] = []
    append = records.append
    position = 0
    end = len(buf)
    for _ in range(count):
        # The five varints of a record are read with `_int_at` and `_long_at`; their one-byte
        # cases are inlined here first, since nearly every field is that short and this loop runs
        # once per record read.
        z = buf[position]
        if z < 0x80:
            length, position = (z >> 1) ^ -(z & 1), position + 1
        else:
            length, position = _int_at(buf, position)
        record_end = position + length
        if length < 0 or record_end > end:
            raise ValueError(f"record length {length} runs past the records section")
        timestamp_delta, position = _long_at(buf, position + 1)  # +1: record attributes, unused
        z = buf[position]
        if z < 0x80:
            offset_delta, position = (z >> 1) ^ -(z & 1), position + 1
        else:
            offset_delta, position = _int_at(buf, position)
        key = None
        if buf[position] == 1:  # -1: a null key, the common case
            position += 1
        else:
            key_length, position = _int_at(buf, position)
            if key_length >= 0:  # (any negative length is a null key, as Kafka reads it)
                key = buf[position : position + key_length]
                position += key_length
        value = None
        value_length, position = _int_at(buf, position)
        if value_length >= 0:
            value = buf[position : position + value_length]
            position += value_length
        if position >= record_end:
            raise ValueError(f"record at offset delta {offset_delta} runs past its length {length}")
        if buf[position] == 0:  # no headers: the common case, one byte
            headers: tuple[Header, ...] = ()
            position += 1
        else:
            headers, position = _decode_headers(buf, position, record_end)
        if position != record_end:
            raise ValueError(f"record at offset delta {offset_delta} has {record_end - position} stray bytes")
        if not lowest_offset_delta <= offset_delta <= highest_offset_delta:
            raise ValueError(f"record at offset delta {offset_delta}: its offset is past int64")
        if not lowest_timestamp_delta <= timestamp_delta <= highest_timestamp_delta:
            raise ValueError(f"record at offset delta {offset_delta}: its timestamp is past int64")
        timestamp = log_append_time if log_append_time is not None else base_timestamp + timestamp_delta
        append(Record(base_offset + offset_delta, timestamp, timestamp_type, key, value, headers))
    if position != end:
        raise ValueError(f"{end - position} bytes follow the last record of the batch")
    return records


def control_type(record: Record) -> ControlType | None:
    """The marker type of a control record (key = int16 version, int16 type), or None."""
    if record.key is None or len(record.key) < 4:
        return None
    _version, kind = struct.unpack_from(">hh", record.key)
    try:
        return ControlType(kind)
    except ValueError:
        return None


def iter_batch_headers(buf: bytes | bytearray | memoryview, start: int = 0) -> Iterator[BatchHeader]:
    """Headers of the complete batches in `buf` from `start`, stopping at the first incomplete
    one. Validates nothing but the length fields; callers decide what to check. The input of
    appends: every header is parsed as v2, so a legacy message there fails `check_batch`."""
    end = len(buf)
    position = start
    while position + BATCH_OVERHEAD_BYTES <= end:
        header = BatchHeader(position, *BATCH_HEADER.unpack_from(buf, position))
        if header.batch_length < 0 or header.next_position > end:
            return
        yield header
        position = header.next_position
