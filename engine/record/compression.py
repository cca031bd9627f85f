"""Record-batch compression codecs, as Kafka's Java producer and broker write them.

The codec id sits in the low three bits of a batch's attributes:

    0 none   1 gzip   2 snappy   3 lz4   4 zstd

What each codec's bytes look like (the compressed part is the whole record section of a batch):

* gzip: one RFC 1952 member, as `java.util.zip.GZIPOutputStream` writes.
* snappy: xerial snappy-java's stream framing, which Kafka's `SnappyOutputStream` writes:
  an 8-byte magic `82 'SNAPPY' 00`, int32 version 1, int32 min-compatible version 1, then blocks
  of (int32 big-endian compressed length, raw snappy block) of up to 32 KiB input each. Readers
  also accept a bare raw snappy block, as xerial's reader does.
* lz4: the standard LZ4 frame format (magic 04 22 4D 18), 64 KiB independent blocks, no content
  size and no content checksum, which is what Kafka's `Lz4BlockOutputStream` writes.
* zstd: one standard zstd frame.
"""

from __future__ import annotations

import enum
import struct
import threading
import zlib
from typing import TYPE_CHECKING

import lz4.frame

from seglogfs.engine.errors import UnsupportedCompressionError

if TYPE_CHECKING:
    import zstandard

# snappy's and zstd's libraries are imported when a batch of theirs is first met: most commands
# meet none, and the two cost about a tenth of every `seglogfs` start (zstandard imports
# `platform`). lz4's frame module comes with the legacy codec's (engine.record.legacy) anyway.


class CompressionType(enum.IntEnum):
    """Kafka's codec ids and their `compression.type` names."""

    NONE = 0
    GZIP = 1
    SNAPPY = 2
    LZ4 = 3
    ZSTD = 4

    @property
    def config_name(self) -> str:
        return self.name.lower()

    @classmethod
    def from_name(cls, name: str) -> CompressionType:
        """`compression.type` value → codec; `uncompressed` is Kafka's topic-level synonym of
        none. Raises UnsupportedCompressionError for anything else."""
        normalised = name.strip().lower()
        if normalised == "uncompressed":
            return cls.NONE
        try:
            return cls[normalised.upper()]
        except KeyError:
            raise UnsupportedCompressionError(
                f"unknown compression type {name!r} (expected none, gzip, snappy, lz4 or zstd)"
            ) from None


_XERIAL_MAGIC = b"\x82SNAPPY\x00"
_XERIAL_HEADER = _XERIAL_MAGIC + struct.pack(">ii", 1, 1)
_XERIAL_BLOCK_BYTES = 32 * 1024
_LZ4_BLOCK_SIZE = lz4.frame.BLOCKSIZE_MAX64KB

# zstd's compressor and decompressor objects hold a context each that two threads must never use
# at once (shared, they mixed frames up and crashed the process): one of each per thread.
_zstd = threading.local()


def _zstd_compressor() -> zstandard.ZstdCompressor:
    compressor = getattr(_zstd, "compressor", None)
    if compressor is None:
        import zstandard  # noqa: PLC0415 (imported when first needed)

        compressor = _zstd.compressor = zstandard.ZstdCompressor(level=3)
    return compressor


def _zstd_decompressor() -> zstandard.ZstdDecompressor:
    decompressor = getattr(_zstd, "decompressor", None)
    if decompressor is None:
        import zstandard  # noqa: PLC0415 (imported when first needed)

        decompressor = _zstd.decompressor = zstandard.ZstdDecompressor()
    return decompressor


def compress(codec: CompressionType, data: bytes | bytearray | memoryview) -> bytes:
    """Compress the record section of a batch with `codec`. Thread-safe."""
    if codec is CompressionType.NONE:
        return bytes(data)
    if codec is CompressionType.GZIP:
        # wbits 31 = gzip container; level 6 is java.util.zip's default.
        compressor = zlib.compressobj(6, zlib.DEFLATED, 31)
        return compressor.compress(data) + compressor.flush()
    if codec is CompressionType.SNAPPY:
        return _xerial_snappy_compress(data)
    if codec is CompressionType.LZ4:
        return lz4.frame.compress(
            data,
            block_size=_LZ4_BLOCK_SIZE,
            block_linked=False,
            content_checksum=False,
            store_size=False,
        )
    if codec is CompressionType.ZSTD:
        return _zstd_compressor().compress(data)
    raise UnsupportedCompressionError(f"unknown compression codec id {int(codec)}")


def decompress(codec: CompressionType, data: bytes | memoryview) -> bytes:
    """Inverse of compress(); ValueError on damaged input, whatever the codec library raises
    (zlib.error, lz4's RuntimeError, ZstdError, cramjam's errors): callers turn it into
    CorruptRecordError with the position they know. Thread-safe."""
    try:
        return _decompress(codec, data)
    except (ValueError, MemoryError, UnsupportedCompressionError):
        raise
    except Exception as error:  # the codec libraries' own error types
        raise ValueError(f"{codec.name.lower()} data does not decompress: {error}") from None


def _decompress(codec: CompressionType, data: bytes | memoryview) -> bytes:
    if codec is CompressionType.NONE:
        return bytes(data)
    if codec is CompressionType.GZIP:
        return _gunzip(data)
    if codec is CompressionType.SNAPPY:
        return _xerial_snappy_decompress(data)
    if codec is CompressionType.LZ4:
        return lz4.frame.decompress(data)
    if codec is CompressionType.ZSTD:
        # Frames written without a content size (Java's streaming writer) need the streaming API.
        return _zstd_decompressor().decompressobj().decompress(bytes(data))
    raise UnsupportedCompressionError(f"unknown compression codec id {int(codec)}")


def _gunzip(data: bytes | memoryview) -> bytes:
    # Several concatenated gzip members are legal; read them all as Java's GZIPInputStream does.
    out = []
    rest = bytes(data)
    while rest:
        inflater = zlib.decompressobj(31)
        out.append(inflater.decompress(rest))
        if not inflater.eof:
            raise zlib.error("truncated gzip stream")
        rest = inflater.unused_data
    return b"".join(out)


def _xerial_snappy_compress(data: bytes | bytearray | memoryview) -> bytes:
    import cramjam  # noqa: PLC0415 (imported when first needed)

    view = memoryview(data)
    parts = [_XERIAL_HEADER]
    for start in range(0, len(view), _XERIAL_BLOCK_BYTES):
        block = bytes(cramjam.snappy.compress_raw(view[start : start + _XERIAL_BLOCK_BYTES]))
        parts.append(struct.pack(">i", len(block)))
        parts.append(block)
    return b"".join(parts)


def _xerial_snappy_decompress(data: bytes | memoryview) -> bytes:
    import cramjam  # noqa: PLC0415 (imported when first needed)

    view = memoryview(data)
    if bytes(view[:8]) != _XERIAL_MAGIC:
        return bytes(cramjam.snappy.decompress_raw(view))
    position = len(_XERIAL_HEADER)
    out = []
    while position < len(view):
        if position + 4 > len(view):
            raise ValueError("truncated xerial snappy block header")
        (length,) = struct.unpack_from(">i", view, position)
        position += 4
        if length < 0 or position + length > len(view):
            raise ValueError("xerial snappy block runs past the end of the batch")
        out.append(bytes(cramjam.snappy.decompress_raw(view[position : position + length])))
        position += length
    return b"".join(out)
