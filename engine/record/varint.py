"""Zig-zag varints (protobuf style), the integer encoding inside v2 records.

A value v is zig-zag mapped to an unsigned integer, `(v << 1) ^ (v >> 63)`, so small negative
numbers stay short, then written seven bits a byte, least significant group first, the high bit
of each byte set when another byte follows. Kafka uses 32-bit varints for lengths, counts and
offset deltas and 64-bit varlongs for timestamp deltas; both share this encoding. Read as Kafka's
`ByteUtils` reads them: a varint in at most five bytes, a varlong in at most ten, the bits past 32
(64) of the last byte dropped (`decode_int`, `decode`).

Scalar functions serve the rare paths (headers, control records); `encode_many` encodes whole
columns with numpy for the batch encoder.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import numpy.typing as npt

MAX_VARLONG_BYTES = 10
MAX_VARINT_BYTES = 5
_LONG_BITS = (1 << 64) - 1
_INT_BITS = (1 << 32) - 1


def encode(value: int) -> bytes:
    """Zig-zag varint bytes of a signed 64-bit value."""
    zigzag = ((value << 1) ^ (value >> 63)) & 0xFFFF_FFFF_FFFF_FFFF
    out = bytearray()
    while zigzag >= 0x80:
        out.append((zigzag & 0x7F) | 0x80)
        zigzag >>= 7
    out.append(zigzag)
    return bytes(out)


def decode(buf: bytes | bytearray | memoryview, position: int) -> tuple[int, int]:
    """Read one varlong (a signed 64-bit value) at `position`: returns (value, position after it).

    Raises ValueError when the varint runs past the buffer or over ten bytes."""
    return _decode(buf, position, MAX_VARLONG_BYTES, _LONG_BITS)


def decode_int(buf: bytes | bytearray | memoryview, position: int) -> tuple[int, int]:
    """Read one 32-bit varint (a length, a count, an offset delta) at `position`: returns (value,
    position after it). Raises ValueError when it runs past the buffer or over five bytes."""
    return _decode(buf, position, MAX_VARINT_BYTES, _INT_BITS)


_IN_WORDS = {MAX_VARINT_BYTES: "five", MAX_VARLONG_BYTES: "ten"}


def _decode(buf: bytes | bytearray | memoryview, position: int, max_bytes: int, bits: int) -> tuple[int, int]:
    """A zig-zag varint of at most `max_bytes` at `position`, its value cut to `bits` before the
    zig-zag is undone (Kafka's ByteUtils drops what the last byte holds past them)."""
    result = 0
    end = len(buf)
    for shift in range(0, 7 * max_bytes, 7):
        if position >= end:
            raise ValueError("varint runs past the end of the buffer")
        byte = buf[position]
        position += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            result &= bits
            return (result >> 1) ^ -(result & 1), position
    raise ValueError(f"varint longer than {_IN_WORDS[max_bytes]} bytes")


def _short_first(longer: Callable[[bytes, int], tuple[int, int]]) -> Callable[[bytes, int], tuple[int, int]]:
    """`longer` with the one- and two-byte cases (nearly every varint of a record) done without
    a loop."""

    def decode_short_first(buf: bytes, position: int) -> tuple[int, int]:
        first = buf[position]
        if first < 0x80:
            return (first >> 1) ^ -(first & 1), position + 1
        second = buf[position + 1]
        if second < 0x80:
            zigzag = (first & 0x7F) | (second << 7)
            return (zigzag >> 1) ^ -(zigzag & 1), position + 2
        return longer(buf, position)

    return decode_short_first


decode_int_at = _short_first(decode_int)  # (an int's varint: 5 bytes at most)
decode_at = _short_first(decode)  # (a long's: 10)


def encode_many(
    values: npt.NDArray[np.int64],
) -> tuple[npt.NDArray[np.uint8], npt.NDArray[np.int64]]:
    """Encode a column of signed values at once.

    Returns (table, sizes): `table` is n×w bytes (w the longest varint's size), row i holding
    value i's varint in its first `sizes[i]` bytes (the rest is to be masked out by the caller)."""
    signed = values.astype(np.int64, copy=False)
    zigzag = ((signed << 1) ^ (signed >> 63)).view(np.uint64)
    if len(zigzag) == 0:
        return np.zeros((0, 1), np.uint8), np.zeros(0, np.int64)
    if zigzag[0] == zigzag.min() == zigzag.max():
        # One value for every row (attributes, null keys, a shared timestamp): encode it once.
        one = np.frombuffer(encode(int(signed[0])), dtype=np.uint8)
        return np.broadcast_to(one, (len(zigzag), len(one))), np.full(len(zigzag), len(one), dtype=np.int64)
    # Only as many columns as the largest value needs: usually one or two.
    width = 1
    largest = int(zigzag.max())
    while width < MAX_VARLONG_BYTES and largest >= 1 << (7 * width):
        width += 1
    sizes = np.ones(len(zigzag), dtype=np.int64)
    for group in range(1, width):
        sizes += zigzag >= np.uint64(1 << (7 * group))
    if width == 1:
        return zigzag.astype(np.uint8)[:, None], sizes
    shifts = np.arange(0, 7 * width, 7, dtype=np.uint64)
    groups = (zigzag[:, None] >> shifts[None, :]) & np.uint64(0x7F)
    continued = np.arange(width)[None, :] < (sizes[:, None] - 1)
    table = (groups | (continued.astype(np.uint64) << np.uint64(7))).astype(np.uint8)
    return table, sizes
