"""What the log checks and writes in batches it is given before it appends them (Kafka's
LogValidator, for the append paths that take encoded batches: `append_batches`,
`append_encoded`, `adopt_batches`).

`validate_batches` refuses, naming the input and the position: an input that does not end at a
whole batch, a batch that fails `check_batch` (CRC, lengths, a legacy message), one over
`max.message.bytes` or `segment.bytes`, a batch below the offset expected (batches whose offsets
are kept: restore, replication), and a record without a key on a compacted topic.
`stamp_batches` writes what the log decides: the offsets from the log end (a producer's batches),
the leader epoch, and the time for a `LogAppendTime` topic (control batches keep theirs).
"""

from __future__ import annotations

from seglogfs.engine.config import LogConfig
from seglogfs.engine.errors import CorruptRecordError, InvalidRecordError, RecordTooLargeError
from seglogfs.engine.record.builder import set_log_append_time
from seglogfs.engine.record.records import BatchHeader, check_batch, decode_records, iter_batch_headers


def validate_batches(
    data: bytearray | memoryview, config: LogConfig, *, where: str, source: str, expected_offset: int | None
) -> list[BatchHeader]:
    """The headers of `data`'s batches, each checked (see the module docstring). Errors name
    `where` (the partition) or `source` (the input) and the position. `expected_offset`: the
    lowest base offset the first batch may have, each next batch's from the one before it; None
    for batches whose offsets the log assigns."""
    headers = list(iter_batch_headers(data))
    consumed = headers[-1].next_position if headers else 0
    if consumed != len(data) or not headers:
        raise CorruptRecordError(source, consumed, "incomplete record batch")
    expected = expected_offset
    for header in headers:
        batch = memoryview(data)[header.position : header.next_position]
        reason = check_batch(header, batch)
        if reason is not None:
            raise CorruptRecordError(source, header.position, reason)
        if header.size_in_bytes > config.max_message_bytes:
            raise RecordTooLargeError(
                f"{where}: batch of {header.size_in_bytes} bytes is over max.message.bytes={config.max_message_bytes}"
            )
        if header.size_in_bytes > config.segment_bytes:
            raise RecordTooLargeError(
                f"{where}: batch of {header.size_in_bytes} bytes is over segment.bytes={config.segment_bytes}"
            )
        if expected is not None:
            if header.base_offset < expected:
                raise InvalidRecordError(
                    f"{where}: batch at offset {header.base_offset} is below the expected offset {expected}"
                )
            expected = header.next_offset
        if config.compact and not header.is_control:
            for slot, record in enumerate(decode_records(header, batch)):
                if record.key is None:
                    raise InvalidRecordError(f"{where}: compacted topic refuses record {slot}, which has no key")
    return headers


def stamp_batches(
    view: memoryview,
    headers: list[BatchHeader],
    *,
    base_offset: int | None,
    leader_epoch: int,
    log_append_time_ms: int | None,
) -> None:
    """Write into checked batches (in place, `headers` parsed from `view`) what the log decides:
    offsets from `base_offset` (None: the batches keep theirs), the leader epoch, and
    `log_append_time_ms` as LogAppendTime (None: the topic keeps its producers' CreateTime)."""
    offset = base_offset
    epoch = leader_epoch.to_bytes(4, "big", signed=True)
    for header in headers:
        batch = view[header.position : header.next_position]
        if offset is not None:
            batch[0:8] = offset.to_bytes(8, "big", signed=True)
            offset += header.last_offset_delta + 1
        batch[12:16] = epoch
        if log_append_time_ms is not None and not header.is_control:
            set_log_append_time(batch, log_append_time_ms)  # type: ignore[arg-type]
