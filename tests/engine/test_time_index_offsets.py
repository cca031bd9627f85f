"""What a `.timeindex` entry names: the last offset of the first batch that reached its timestamp
(Kafka's `shallowOffsetOfMaxTimestamp`), from every writer — appends, the closing entry of a roll,
recovery's rebuild, a truncation's reload, the cleaner's segments — and look-ups by time that still
find the first record at or past a time. Kafka's `kafka-dump-log --verify-index-only` reports an
entry naming any other offset (tests/interop/test_kafka_reads_seglogfs.py runs it)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from seglogfs.engine import PartitionLog
from seglogfs.engine.log.segment import LogSegment
from seglogfs.engine.log.time_index import TIME_INDEX_DTYPE
from seglogfs.engine.record.builder import ProducerState, build_batch
from seglogfs.engine.record.compression import CompressionType
from seglogfs.engine.record.records import NO_TIMESTAMP, BatchHeader, iter_batch_headers
from tests.conftest import NOW_MS
from tests.engine.test_cleaner import clean, compacted_log

# Per batch of five records: the greatest timestamp on the second record, the next greatest on
# the fourth (the greatest once compaction took the second), never on the last.
SHAPE = [5, 9, 2, 8, 1]


def fill(log: PartitionLog, batches: int, *, keys: bool = False) -> list[tuple[int, int]]:
    """`batches` batches of five records, alternately uncompressed and lz4, each batch later
    than the one before (every third one earlier, so not every batch raises the max); returns
    (offset, timestamp) of every record. With `keys`, each record's key is its own but the
    second's, which the batch eight on takes again."""
    records = []
    for n in range(batches):
        start = NOW_MS + (n - 2 if n % 3 == 2 else n) * 100
        stamps = [start + delta for delta in SHAPE]
        base = log.log_end_offset
        batch = build_batch(
            [b"value-%d" % i for i in range(len(SHAPE))],
            keys=[b"key-%d" % (n % 8) if i == 1 else b"key-%d-%d" % (n, i) for i in range(len(SHAPE))]
            if keys
            else None,
            timestamps=stamps,
            base_offset=base,
            compression=CompressionType.LZ4 if n % 2 else CompressionType.NONE,
        )
        log.append_batches(bytes(batch), assign_offsets=False, now_ms=NOW_MS)
        records += [(base + i, stamp) for i, stamp in enumerate(stamps)]
    return records


def headers_of(segment: LogSegment) -> list[BatchHeader]:
    return list(iter_batch_headers(segment.log_path.read_bytes()))


def time_entries(segment: LogSegment) -> list[tuple[int, int]]:
    """(timestamp, offset) of each entry in the segment's `.timeindex` file as written."""
    entries = np.frombuffer(segment.time_index_path.read_bytes(), dtype=TIME_INDEX_DTYPE)
    return [(int(t), segment.base_offset + int(r)) for t, r in entries.tolist() if (t, r) != (0, 0)]


def assert_kafka_entries(segment: LogSegment) -> None:
    """Each entry is (max timestamp so far, last offset of the first batch that reached it)."""
    headers = headers_of(segment)
    first_reaching: dict[int, int] = {}
    best = NO_TIMESTAMP
    for header in headers:
        if header.max_timestamp > best:
            best = header.max_timestamp
            first_reaching[best] = header.last_offset
    entries = time_entries(segment)
    assert entries, f"{segment.time_index_path} has no entry to check"
    for timestamp, offset in entries:
        assert first_reaching.get(timestamp) == offset, (
            f"{segment.time_index_path}: entry ({timestamp}, {offset}); the first batch reaching "
            f"{timestamp} ends at {first_reaching.get(timestamp)}"
        )


def assert_found_by_time(log: PartitionLog, records: list[tuple[int, int]]) -> None:
    """Kafka's ListOffsets by time: the first offset whose record's timestamp is ≥ T."""
    stamps = sorted({stamp + delta for _, stamp in records for delta in (-1, 0, 1)})
    for target in stamps:
        expected = next(((offset, stamp) for offset, stamp in records if stamp >= target), None)
        found = log.offset_for_timestamp(target)
        assert (None if found is None else (found.offset, found.timestamp)) == expected, target


def test_appends_rolls_recovery_and_truncation_index_batch_last_offsets(log_dir: Path) -> None:
    log = compacted_log(log_dir / "t-0", cleanup_policy="delete", segment_bytes=1200)
    records = fill(log, 24)
    segments = log.segments
    assert len(segments) >= 3, "too few rolls to check the closing entries"
    for segment in segments:  # sealed ones with their closing entry, the active one as appended
        assert_kafka_entries(segment)
    assert_found_by_time(log, records)

    sealed = segments[0]
    kept = time_entries(sealed)
    sealed.recover()  # the rebuild a failed sanity check or an unclean shutdown runs
    assert time_entries(sealed) == kept
    assert_kafka_entries(sealed)

    active = log.active_segment
    headers = headers_of(active)
    active.truncate_to(headers[2].base_offset, NOW_MS)  # max timestamp reloaded from what is left
    reached = max(headers[:2], key=lambda h: (h.max_timestamp, -h.last_offset))
    assert (active.max_timestamp_so_far.timestamp, active.max_timestamp_so_far.offset) == (
        reached.max_timestamp,
        reached.last_offset,
    )
    log.close()


def test_cleaned_segments_index_batch_last_offsets_and_find_records_by_time(log_dir: Path) -> None:
    log = compacted_log(log_dir / "t-0", segment_bytes=1200)
    fill(log, 24, keys=True)
    log.roll(NOW_MS)
    clean(log)
    cleaned = log.segments[:-1]
    assert len(cleaned) >= 2
    for segment in cleaned:
        assert_kafka_entries(segment)
    left = [(r.offset, r.timestamp) for r in log.records(0)]
    assert_found_by_time(log, left)
    log.close()


@pytest.mark.parametrize("producer", [False, True], ids=["no-producer", "producer"])
def test_a_group_ending_in_a_batch_compacted_away_keeps_its_header(log_dir: Path, producer: bool) -> None:
    # The group's last batch (later than any record kept) loses every record to a later one of
    # the same key. Kafka's cleaner drops such a batch unless it holds an active producer's
    # state, and then keeps its max timestamp; the engine keeps the header either way (the
    # group still ends where it did), with no timestamp where Kafka would have dropped it, so
    # no time-index entry names a time no record has.
    log = compacted_log(log_dir / "t-0")
    # (Each segment over half of segment.bytes: the two are cleaned apart, not as one group.)
    log.append_records([b"a" * 600], keys=[b"kept"], timestamps=[NOW_MS], now_ms=NOW_MS)
    state = ProducerState(7, 0, 0) if producer else ProducerState()
    gone = build_batch(
        [b"b"], keys=[b"superseded"], timestamps=NOW_MS + 500, base_offset=log.log_end_offset, producer=state
    )
    log.append_batches(bytes(gone), assign_offsets=False, now_ms=NOW_MS)
    log.roll(NOW_MS)
    log.append_records([b"c" * 600], keys=[b"superseded"], timestamps=[NOW_MS + 100], now_ms=NOW_MS)
    log.roll(NOW_MS)
    clean(log)

    cleaned = log.segments[0]
    headers = headers_of(cleaned)
    assert [(h.last_offset, h.records_count) for h in headers] == [(0, 1), (1, 0)]
    assert headers[-1].max_timestamp == (NOW_MS + 500 if producer else NO_TIMESTAMP)
    assert time_entries(cleaned) == ([(NOW_MS + 500, 1)] if producer else [(NOW_MS, 0)])
    assert cleaned.largest_timestamp == (NOW_MS + 500 if producer else NOW_MS)
    log.close()
