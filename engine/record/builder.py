"""Writing v2 record batches (Kafka's MemoryRecordsBuilder and the broker's batch rewrites): a batch
built from records (`build_batch`; keys, values, headers, timestamps, a producer's id, epoch and
sequence, a codec), many records split into batches of at most `max.message.bytes`
(`encode_batches`, the column-wise path through the core), a batch framed from an encoded
records section (`frame_batch`), one rebuilt by the cleaner from the records it keeps
(`rebuild_batch`, `empty_batch`), and a batch stamped with the broker's LogAppendTime
(`set_log_append_time`). What a batch is, and reading one, is engine.record.records."""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from seglogfs.engine import _core
from seglogfs.engine.errors import RecordTooLargeError
from seglogfs.engine.record import varint
from seglogfs.engine.record.compression import CompressionType, compress
from seglogfs.engine.record.records import (
    BATCH_HEADER,
    BATCH_OVERHEAD_BYTES,
    COMPRESSION_CODEC_MASK,
    CONTROL_FLAG_MASK,
    CRC_START,
    CURRENT_MAGIC,
    DELETE_HORIZON_FLAG_MASK,
    LOG_OVERHEAD_BYTES,
    NO_PARTITION_LEADER_EPOCH,
    NO_PRODUCER_EPOCH,
    NO_PRODUCER_ID,
    NO_SEQUENCE,
    NO_TIMESTAMP,
    TIMESTAMP_TYPE_MASK,
    TRANSACTIONAL_FLAG_MASK,
    BatchHeader,
    Header,
    TimestampType,
    compute_crc,
)

# What a batch split weighs a record at beyond its key's and value's bytes: its varints, exact
# for the common small deltas (one constant, the compiled core's, which splits batches too).
ESTIMATED_RECORD_VARINTS: int = _core.ESTIMATED_RECORD_VARINTS
_HEADER_SLOT = bytes(BATCH_OVERHEAD_BYTES)


@dataclass(frozen=True, slots=True)
class ProducerState:
    """Producer fields a batch carries for idempotence and transactions."""

    producer_id: int = NO_PRODUCER_ID
    producer_epoch: int = NO_PRODUCER_EPOCH
    base_sequence: int = NO_SEQUENCE
    is_transactional: bool = False


NO_PRODUCER = ProducerState()


def _encode_header_blob(headers: Sequence[Header]) -> bytes:
    parts = [varint.encode(len(headers))]
    for key, value in headers:
        key_bytes = key.encode("utf-8", "surrogateescape")
        parts.append(varint.encode(len(key_bytes)))
        parts.append(key_bytes)
        if value is None:
            parts.append(varint.encode(-1))
        else:
            parts.append(varint.encode(len(value)))
            parts.append(bytes(value))
    return b"".join(parts)


def build_batch(
    values: Sequence[bytes | None],
    *,
    keys: Sequence[bytes | None] | None = None,
    headers: Sequence[Sequence[Header]] | None = None,
    timestamps: Sequence[int] | np.ndarray | int,
    base_offset: int = 0,
    compression: CompressionType = CompressionType.NONE,
    timestamp_type: TimestampType = TimestampType.CREATE_TIME,
    producer: ProducerState = NO_PRODUCER,
    is_control: bool = False,
    partition_leader_epoch: int = NO_PARTITION_LEADER_EPOCH,
    offset_deltas: Sequence[int] | np.ndarray | None = None,
    last_offset_delta: int | None = None,
    delete_horizon_ms: int | None = None,
) -> bytearray:
    """Encode records into one v2 batch, CRC included.

    `timestamps` is one int for all records or one per record. `offset_deltas` defaults to
    0..n-1; a restore or a compacted copy passes the original gaps, and `last_offset_delta` keeps
    a batch's original last offset when its last records are gone. `delete_horizon_ms` stamps the
    batch's delete horizon (the first-timestamp field, attribute bit 6), as the cleaner does.
    The records are encoded by the engine's compiled core (`_core.encode_records`). Raises
    ValueError for an empty batch."""
    n = len(values)
    if n == 0:
        raise ValueError("a record batch holds at least one record")
    if isinstance(timestamps, int):  # one time for every record: no column to make
        base_timestamp = timestamps if delete_horizon_ms is None else delete_horizon_ms
        max_timestamp = timestamps
        ts_deltas: int | list[int] = timestamps - base_timestamp
    else:
        ts = np.asarray(timestamps, dtype=np.int64)
        if ts.shape != (n,):
            raise ValueError(f"{len(ts)} timestamps for {n} records")
        base_timestamp = int(ts[0]) if delete_horizon_ms is None else delete_horizon_ms
        max_timestamp = int(ts.max())
        ts_deltas = (ts - base_timestamp).tolist()
    deltas = None if offset_deltas is None else np.asarray(offset_deltas, dtype=np.int64).tolist()
    if last_offset_delta is None:
        last_offset_delta = n - 1 if deltas is None else deltas[-1]
    header_blobs = None if headers is None or not any(headers) else [_encode_header_blob(h) for h in headers]
    in_place = compression is CompressionType.NONE  # the records encoded after room for the header
    section = _core.encode_records(
        values if isinstance(values, list) else list(values),
        None if keys is None else keys if isinstance(keys, list) else list(keys),
        header_blobs,
        ts_deltas,
        deltas,
        BATCH_OVERHEAD_BYTES if in_place else 0,
    )
    attributes = int(compression)
    if timestamp_type is TimestampType.LOG_APPEND_TIME:
        attributes |= TIMESTAMP_TYPE_MASK
    if producer.is_transactional:
        attributes |= TRANSACTIONAL_FLAG_MASK
    if is_control:
        attributes |= CONTROL_FLAG_MASK
    if delete_horizon_ms is not None:
        attributes |= DELETE_HORIZON_FLAG_MASK
    return _framed(
        section,
        compression,
        in_place=in_place,
        attributes=attributes,
        count=n,
        base_offset=base_offset,
        partition_leader_epoch=partition_leader_epoch,
        last_offset_delta=last_offset_delta,
        base_timestamp=base_timestamp,
        max_timestamp=max_timestamp,
        producer=producer,
    )


def _framed(
    records: bytes | bytearray | memoryview,
    compression: CompressionType,
    *,
    in_place: bool = False,
    attributes: int,
    count: int,
    base_offset: int,
    partition_leader_epoch: int,
    last_offset_delta: int,
    base_timestamp: int,
    max_timestamp: int,
    producer: ProducerState,
) -> bytearray:
    """A batch's bytes: the header, filled in, and the records section (compressed with
    `compression`), CRC included. `in_place`: `records` is a bytearray of uncompressed records
    after room for the header (`_core.encode_records` with room), filled in where it is."""
    if in_place:
        if not isinstance(records, bytearray) or compression is not CompressionType.NONE:
            raise ValueError("a batch is built in place only in a bytearray of uncompressed records")
        batch = records
    else:
        batch = bytearray(_HEADER_SLOT)
        batch += records if compression is CompressionType.NONE else compress(compression, records)
    BATCH_HEADER.pack_into(
        batch,
        0,
        base_offset,
        len(batch) - LOG_OVERHEAD_BYTES,
        partition_leader_epoch,
        CURRENT_MAGIC,
        0,
        attributes,
        last_offset_delta,
        base_timestamp,
        max_timestamp,
        producer.producer_id,
        producer.producer_epoch,
        producer.base_sequence,
        count,
    )
    struct.pack_into(">I", batch, 17, _core.crc32c(memoryview(batch)[CRC_START:]))
    return batch


def rebuild_batch(header: BatchHeader, records: bytes, count: int, max_timestamp: int) -> bytearray:
    """A batch like `header`'s holding `count` records whose encoded bytes (uncompressed, each
    with its length prefix) are `records`: same base offset, last offset delta, first timestamp,
    producer fields and attributes, compressed with the same codec, new max timestamp and CRC.
    Records keep their bytes: their offset and timestamp deltas stay relative to the same base."""
    batch = bytearray(_HEADER_SLOT)
    batch += compress(header.compression, records)
    _pack_header(batch, header, count=count, max_timestamp=max_timestamp, attributes=header.attributes)
    return batch


def empty_batch(header: BatchHeader, *, keep_max_timestamp: bool = True) -> bytearray:
    """`header`'s batch with no records left: header only, uncompressed, no first timestamp,
    the same last offset and max timestamp (Kafka's `writeEmptyHeader`), or none without
    `keep_max_timestamp`. What the cleaner keeps when every record of a batch it must not drop
    is gone, so the offsets it covered stay accounted for."""
    batch = bytearray(_HEADER_SLOT)
    attributes = header.attributes & ~(COMPRESSION_CODEC_MASK | DELETE_HORIZON_FLAG_MASK)
    max_timestamp = header.max_timestamp if keep_max_timestamp else NO_TIMESTAMP
    _pack_header(
        batch, header, count=0, max_timestamp=max_timestamp, attributes=attributes, base_timestamp=NO_TIMESTAMP
    )
    return batch


def _pack_header(
    batch: bytearray,
    header: BatchHeader,
    *,
    count: int,
    max_timestamp: int,
    attributes: int,
    base_timestamp: int | None = None,
) -> None:
    BATCH_HEADER.pack_into(
        batch,
        0,
        header.base_offset,
        len(batch) - LOG_OVERHEAD_BYTES,
        header.partition_leader_epoch,
        CURRENT_MAGIC,
        0,
        attributes,
        header.last_offset_delta,
        header.base_timestamp if base_timestamp is None else base_timestamp,
        max_timestamp,
        header.producer_id,
        header.producer_epoch,
        header.base_sequence,
        count,
    )
    struct.pack_into(">I", batch, 17, _core.crc32c(memoryview(batch)[CRC_START:]))


def set_log_append_time(batch: bytearray, timestamp_ms: int) -> None:
    """Stamp a batch as LogAppendTime with max timestamp `timestamp_ms` and refresh its CRC, as
    the broker does for topics with `message.timestamp.type=LogAppendTime`."""
    (attributes,) = struct.unpack_from(">h", batch, 21)
    struct.pack_into(">h", batch, 21, attributes | TIMESTAMP_TYPE_MASK)
    struct.pack_into(">q", batch, 35, timestamp_ms)
    struct.pack_into(">I", batch, 17, compute_crc(batch))


def batch_ranges(sizes: np.ndarray, batch_bytes: int) -> list[tuple[int, int]]:
    """Records of estimated `sizes` grouped in order into [lo, hi) ranges whose batches come to
    about `batch_bytes` each (header included), at least one record each."""
    limit = batch_bytes - BATCH_OVERHEAD_BYTES
    ends = np.cumsum(sizes)
    ranges = []
    lo, n = 0, len(sizes)
    while lo < n:  # the longest run from `lo` within the limit, at least one record
        base = int(ends[lo - 1]) if lo else 0
        hi = max(int(np.searchsorted(ends, base + limit, side="right")), lo + 1)
        ranges.append((lo, hi))
        lo = hi
    return ranges


def frame_batch(
    records: bytes | bytearray | memoryview,
    *,
    count: int,
    base_offset: int,
    base_timestamp: int,
    max_timestamp: int,
    compression: CompressionType = CompressionType.NONE,
    partition_leader_epoch: int = NO_PARTITION_LEADER_EPOCH,
    producer: ProducerState = NO_PRODUCER,
    in_place: bool = False,
) -> bytearray:
    """A v2 batch (CreateTime) around `count` encoded records — each with its length prefix,
    offset deltas 0..count-1, timestamp deltas from `base_timestamp` — compressed with
    `compression`, CRC included: what `build_batch` makes of the same records, for callers that
    encode the records section themselves (column-wise, or by runs of values). `in_place`: as
    `_framed` takes it."""
    return _framed(
        records,
        compression,
        in_place=in_place,
        attributes=int(compression) | (TRANSACTIONAL_FLAG_MASK if producer.is_transactional else 0),
        count=count,
        base_offset=base_offset,
        partition_leader_epoch=partition_leader_epoch,
        last_offset_delta=count - 1,
        base_timestamp=base_timestamp,
        max_timestamp=max_timestamp,
        producer=producer,
    )


def encode_batches(
    values: Sequence[bytes | None],
    *,
    keys: Sequence[bytes | None] | None,
    headers: Sequence[Sequence[Header]] | None,
    timestamps: Sequence[int] | np.ndarray | int,
    max_batch_bytes: int,
    where: str,
    base_offset: int = 0,
    compression: CompressionType = CompressionType.NONE,
    producer: ProducerState = NO_PRODUCER,
    partition_leader_epoch: int = NO_PARTITION_LEADER_EPOCH,
    sizes: np.ndarray | None = None,
    target_batch_bytes: int | None = None,
) -> list[bytearray]:
    """Records as consecutive v2 batches of at most `max_batch_bytes` each (`max.message.bytes`),
    offsets from `base_offset`.

    Records are grouped by their estimated size (`sizes`, or their bytes plus 12 bytes of
    varints: exact for the common small deltas) into batches of about `target_batch_bytes` (a
    producer's `batch.size`; default the maximum); a batch that still comes out over the maximum
    is halved. RecordTooLargeError naming `where` for a record that alone makes a batch too
    large."""
    n = len(values)
    batch_bytes = min(target_batch_bytes or max_batch_bytes, max_batch_bytes)
    if (
        sizes is None
        and keys is None
        and headers is None
        and isinstance(timestamps, int)
        and compression is CompressionType.NONE
        and isinstance(values, list)
    ):
        return _value_batches(
            values,
            timestamp=timestamps,
            batch_bytes=batch_bytes,
            max_batch_bytes=max_batch_bytes,
            where=where,
            base_offset=base_offset,
            producer=producer,
            partition_leader_epoch=partition_leader_epoch,
        )
    if sizes is None and n == 1 and keys is None and headers is None:
        pending = [(0, 1)]  # one record (an `echo >> append`): one batch, no column to make
    else:
        if sizes is None:
            sizes = _byte_lengths(values) + ESTIMATED_RECORD_VARINTS
            if keys is not None:
                sizes += _byte_lengths(keys)
            if headers is not None:
                sizes += np.fromiter((sum(len(k) + len(v or b"") + 8 for k, v in h) for h in headers), np.int64, n)
        pending = list(reversed(batch_ranges(sizes, batch_bytes)))
    batches: list[bytearray] = []
    offset = base_offset
    while pending:
        lo, hi = pending.pop()
        whole = lo == 0 and hi == n  # (the records as they came: nothing to slice)
        batch = build_batch(
            values if whole else values[lo:hi],
            keys=keys if keys is None or whole else keys[lo:hi],
            headers=headers if headers is None or whole else headers[lo:hi],
            timestamps=timestamps if isinstance(timestamps, int) or whole else timestamps[lo:hi],
            base_offset=offset,
            compression=compression,
            producer=producer,
            partition_leader_epoch=partition_leader_epoch,
        )
        if halves := _halves(len(batch), lo, hi, max_batch_bytes, where):
            pending += halves
            continue
        batches.append(batch)
        offset += hi - lo
    return batches


def _halves(size: int, lo: int, hi: int, max_batch_bytes: int, where: str) -> list[tuple[int, int]]:
    """Nothing when a batch of records [lo, hi) and `size` bytes fits `max.message.bytes`; else
    its two halves, the first last (for a stack of ranges to encode). RecordTooLargeError
    naming `where` when it is one record."""
    if size <= max_batch_bytes:
        return []
    if hi - lo == 1:
        raise RecordTooLargeError(
            f"{where}: record {lo} makes a batch of {size} bytes, over max.message.bytes={max_batch_bytes}"
        )
    middle = (lo + hi) // 2
    return [(middle, hi), (lo, middle)]


def _value_batches(
    values: list[bytes | None],
    *,
    timestamp: int,
    batch_bytes: int,
    max_batch_bytes: int,
    where: str,
    base_offset: int,
    producer: ProducerState,
    partition_leader_epoch: int,
) -> list[bytearray]:
    """encode_batches of a list of values alone, one timestamp, uncompressed (what producers,
    the mount's append files and `produce` send), grouped and halved as encode_batches does,
    the sizes weighed by the core as it encodes each run (no list sliced, no column made)."""
    batches: list[bytearray] = []
    pending: list[tuple[int, int]] = []  # halves of a batch that came out too large, the next last
    start, n, room = 0, len(values), BATCH_OVERHEAD_BYTES
    while pending or start < n:
        if pending:
            lo, hi = pending.pop()
            batch, _ = _core.encode_value_run(values, lo, hi, room, -1)
        else:
            lo = start
            batch, hi = _core.encode_value_run(values, lo, -1, room, max(batch_bytes - room, 0))
            start = hi
        if halves := _halves(len(batch), lo, hi, max_batch_bytes, where):
            pending += halves
            continue
        batches.append(
            frame_batch(
                batch,
                count=hi - lo,
                base_offset=base_offset + lo,
                base_timestamp=timestamp,
                max_timestamp=timestamp,
                partition_leader_epoch=partition_leader_epoch,
                producer=producer,
                in_place=True,
            )
        )
    return batches


def _byte_lengths(blobs: Sequence[bytes | None]) -> np.ndarray:
    """Lengths of byte strings (0 for None) as an int64 array."""
    if isinstance(blobs, list):  # (what appends pass: measured by the core, a few ns a record)
        lengths = np.empty(len(blobs), np.int64)
        _core.blob_lengths(blobs, lengths)
        return lengths
    try:  # no nulls, the common case
        return np.fromiter(map(len, blobs), np.int64, len(blobs))  # type: ignore[arg-type]
    except TypeError:  # len(None)
        return np.fromiter((0 if blob is None else len(blob) for blob in blobs), np.int64, len(blobs))
