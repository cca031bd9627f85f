"""Kafka's legacy message formats, magic 0 (Kafka 0.8-0.9) and magic 1 (0.10): read, never written.

A legacy `.log` holds a message set: entries one after the other, each one message. Byte layout
of an entry (all integers big-endian), as Kafka's LegacyRecord spells it:

    offset  size  field
     0       8    offset          the message's offset; a wrapper's is the offset of its last inner message
     8       4    message_size    bytes after this field: at least 14 (magic 0) or 22 (magic 1)
    12       4    crc             CRC-32 (zlib's, not the CRC-32C of v2) of every byte from `magic` on
    16       1    magic           0 or 1 (2 is a v2 batch, see `engine.record.records`: same place)
    17       1    attributes      bits 0-2 codec (0 none, 1 gzip, 2 snappy, 3 lz4),
                                  bit 3 timestamp type (magic 1 only: 1 = LogAppendTime)
    18       8    timestamp       magic 1 only; magic 0 has none (consumers see -1, NO_TIMESTAMP)
    18|26    4    key_length      -1 = null
    ...           key
    ...      4    value_length    -1 = null
    ...           value

A compressed message is a *wrapper*: its value is a whole message set compressed with its codec,
and its inner messages are plain messages (never compressed themselves). Their offsets, as
Kafka's AbstractLegacyRecordBatch reads them:

* magic 0: the inner offsets are absolute;
* magic 1: the inner offsets are relative (0..n-1 as producers write them): absolute = wrapper
  offset - last inner offset + inner offset. A wrapper offset of 0 (produce requests of some
  clients, never a broker's log) takes the inner offsets as they are.

Inner timestamps: a LogAppendTime wrapper's timestamp replaces every inner one; a CreateTime
wrapper's inner messages keep their own, and all take the wrapper's timestamp type.

Codecs are as `engine.record.compression` reads them (gzip; snappy with xerial framing or a raw block),
except lz4: a magic 0 wrapper written by Kafka 0.8-0.10 has its LZ4 frame descriptor checksum
(HC) computed over the frame's magic bytes too, which no standard reader accepts. Kafka's
KafkaLZ4BlockInputStream ignores that byte for magic 0, and so does `_lz4_frame_ignoring_hc`.

Everything here is pure: bytes in, messages out, ValueError (or a codec's error) for bytes that
do not parse. Checking the CRC is the caller's (`crc_problem`).
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass

import lz4.block
import lz4.frame

from seglogfs.engine.record.compression import CompressionType, decompress

LOG_OVERHEAD_BYTES = 12  # offset (8) + message_size (4)
MAGIC_OFFSET = 16
# Kafka's RECORD_OVERHEAD_V0/V1: crc, magic, attributes, (timestamp), key and value lengths.
MESSAGE_OVERHEAD_V0 = 14
MESSAGE_OVERHEAD_V1 = 22
# The smallest whole entry: a magic 0 message with null key and value.
MIN_ENTRY_BYTES = LOG_OVERHEAD_BYTES + MESSAGE_OVERHEAD_V0
NO_TIMESTAMP = -1

_CODEC_MASK = 0x07
TIMESTAMP_TYPE_BIT = 0x08
_ENTRY_HEAD = struct.Struct(">qiIbb")  # offset, message_size, crc, magic, attributes
_TIMESTAMP = struct.Struct(">q")
_LENGTH = struct.Struct(">i")


@dataclass(frozen=True, slots=True)
class LegacyMessage:
    """One message of a message set, as stored; `timestamp` is -1 for magic 0."""

    offset: int
    magic: int
    attributes: int
    timestamp: int
    key: bytes | None
    value: bytes | None

    @property
    def codec(self) -> int:
        return self.attributes & _CODEC_MASK

    @property
    def log_append_time(self) -> bool:
        return self.magic == 1 and bool(self.attributes & TIMESTAMP_TYPE_BIT)


def message_overhead(magic: int) -> int:
    """The fixed bytes of a message after its size field (14 for magic 0, 22 for magic 1)."""
    return MESSAGE_OVERHEAD_V0 if magic == 0 else MESSAGE_OVERHEAD_V1


def crc_problem(entry: bytes | bytearray | memoryview) -> str | None:
    """None when the stored CRC-32 of a whole entry matches its bytes, else the reason."""
    (stored,) = struct.unpack_from(">I", entry, 12)
    actual = zlib.crc32(memoryview(entry)[MAGIC_OFFSET:])
    if actual != stored:
        return f"CRC-32 mismatch (stored {stored}, computed {actual})"
    return None


def parse_message(entry: bytes | bytearray | memoryview) -> LegacyMessage:
    """The message of one whole entry (its CRC not checked). ValueError when its fields do not
    fill exactly the size it declares."""
    view = memoryview(entry)
    if len(view) < MIN_ENTRY_BYTES:
        raise ValueError(f"a message of {len(view)} bytes is shorter than any legacy message")
    offset, size, _crc, magic, attributes = _ENTRY_HEAD.unpack_from(view)
    if magic not in (0, 1):
        raise ValueError(f"magic {magic} is not a legacy message format")
    end = LOG_OVERHEAD_BYTES + size
    if size < message_overhead(magic) or end != len(view):
        raise ValueError(f"message size {size} does not match its {len(view) - LOG_OVERHEAD_BYTES} bytes")
    position = 18
    timestamp = NO_TIMESTAMP
    if magic == 1:
        (timestamp,) = _TIMESTAMP.unpack_from(view, position)
        position += 8
    key, position = _bytes_field(view, position, end, "key")
    value, position = _bytes_field(view, position, end, "value")
    if position != end:
        raise ValueError(f"{end - position} bytes follow the message's value")
    return LegacyMessage(offset, magic, attributes & 0xFF, timestamp, key, value)


def _bytes_field(view: memoryview, position: int, end: int, name: str) -> tuple[bytes | None, int]:
    if position + 4 > end:
        raise ValueError(f"the {name} length runs past the message")
    (length,) = _LENGTH.unpack_from(view, position)
    position += 4
    if length < 0:
        return None, position
    if position + length > end:
        raise ValueError(f"{name} of {length} bytes runs past the message")
    return bytes(view[position : position + length]), position + length


def message_set(data: bytes | bytearray | memoryview) -> list[LegacyMessage]:
    """Every message of an uncompressed message set (a wrapper's decompressed value), each
    checked against its CRC. ValueError for a message cut short or damaged."""
    view = memoryview(data)
    messages = []
    position = 0
    while position < len(view):
        if position + LOG_OVERHEAD_BYTES > len(view):
            raise ValueError(f"an inner message is cut short at byte {position}")
        (size,) = _LENGTH.unpack_from(view, position + 8)
        end = position + LOG_OVERHEAD_BYTES + size
        if size < MESSAGE_OVERHEAD_V0 or end > len(view):
            raise ValueError(f"inner message at byte {position} has an impossible size {size}")
        entry = view[position:end]
        problem = crc_problem(entry)
        if problem is not None:
            raise ValueError(f"inner message at byte {position}: {problem}")
        messages.append(parse_message(entry))
        position = end
    return messages


def inner_messages(wrapper: LegacyMessage) -> list[LegacyMessage]:
    """A wrapper's inner messages with absolute offsets and the timestamps consumers see (see
    the module docstring). ValueError for a wrapper without value or inner messages, an inner
    message that is itself compressed, or a magic 1 wrapper offset below its last inner offset."""
    if wrapper.value is None:
        raise ValueError("a compressed message set with a null value")
    inner = message_set(_decompress(wrapper.codec, wrapper.magic, wrapper.value))
    if not inner:
        raise ValueError("a compressed message set with no inner messages")
    if any(message.codec for message in inner):
        raise ValueError("an inner message is compressed")
    base = 0
    if wrapper.magic == 1 and wrapper.offset != 0:
        last = inner[-1].offset
        if wrapper.offset < last:
            raise ValueError(f"wrapper offset {wrapper.offset} is below its last inner offset {last}")
        base = wrapper.offset - last
    type_bit = wrapper.attributes & TIMESTAMP_TYPE_BIT if wrapper.magic == 1 else 0
    return [
        LegacyMessage(
            base + message.offset if wrapper.magic == 1 else message.offset,
            message.magic,
            (message.attributes & ~TIMESTAMP_TYPE_BIT) | type_bit,
            wrapper.timestamp
            if wrapper.log_append_time and message.magic == 1
            else (message.timestamp if message.magic == 1 else NO_TIMESTAMP),
            message.key,
            message.value,
        )
        for message in inner
    ]


def _decompress(codec: int, magic: int, value: bytes) -> bytes:
    if codec == CompressionType.LZ4:
        # Kafka checks the frame descriptor checksum of magic 1 wrappers only.
        return _lz4_frame_ignoring_hc(value) if magic == 0 else lz4.frame.decompress(value)
    if codec in (CompressionType.GZIP, CompressionType.SNAPPY):
        return decompress(CompressionType(codec), value)
    raise ValueError(f"compression codec id {codec} in a legacy message (0-3 only)")


# LZ4 frame format (lz4_Frame_format.md), as Kafka's LZ4 streams write it:
#   magic 04 22 4D 18 · FLG (bits 7-6 version 01, 5 block independence, 4 block checksum,
#   3 content size, 2 content checksum) · BD (bits 6-4 block maximum size: 4 = 64 KiB .. 7 = 4 MiB)
#   · [content size, 8 bytes] · HC (1 byte) · blocks: (uint32 little-endian size, bit 31 set =
#   stored uncompressed; 0 = end mark) · data · [block checksum, 4 bytes] · after the end mark
#   [content checksum, 4 bytes].
_LZ4_MAGIC = b"\x04\x22\x4d\x18"
_LZ4_BLOCK_SIZES = {4: 64 << 10, 5: 256 << 10, 6: 1 << 20, 7: 4 << 20}


def _lz4_frame_ignoring_hc(data: bytes) -> bytes:
    """An LZ4 frame's content, its descriptor checksum not checked (see the module docstring)."""
    view = memoryview(data)
    if len(view) < 7 or bytes(view[:4]) != _LZ4_MAGIC:
        raise ValueError("not an LZ4 frame")
    flags, descriptor = view[4], view[5]
    if flags >> 6 != 1:
        raise ValueError(f"LZ4 frame version {flags >> 6}")
    max_block = _LZ4_BLOCK_SIZES.get((descriptor >> 4) & 0x07)
    if max_block is None:
        raise ValueError(f"LZ4 block maximum size code {(descriptor >> 4) & 0x07}")
    position = 6 + (8 if flags & 0x08 else 0) + 1  # descriptor, content size, HC
    block_checksum = 4 if flags & 0x10 else 0
    out: list[bytes] = []
    while True:
        if position + 4 > len(view):
            raise ValueError("LZ4 frame cut short")
        (size,) = struct.unpack_from("<I", view, position)
        position += 4
        if size == 0:
            return b"".join(out)
        stored, size = bool(size & 0x8000_0000), size & 0x7FFF_FFFF
        if size > max_block or position + size + block_checksum > len(view):
            raise ValueError(f"LZ4 block of {size} bytes runs past the frame")
        block = view[position : position + size]
        out.append(bytes(block) if stored else lz4.block.decompress(block, uncompressed_size=max_block))
        position += size + block_checksum
