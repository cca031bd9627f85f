"""Key compaction: Kafka's LogCleanerTest cases (numbered in comments) and the output's format."""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kafka.record.memory_records import MemoryRecords

from seglogfs.engine import BrokerConfig, CorruptRecordError, DataDir, PartitionLog
from seglogfs.engine.cleaner.cleaner import Cleaner, CleanerStats, batch_records, group_segments_by_size
from seglogfs.engine.cleaner.cleaner_manager import LogToClean, filthiest, first_uncleanable_offset, log_to_clean
from seglogfs.engine.cleaner.offset_map import OffsetMap, key_hashes
from seglogfs.engine.config import apply_topic_overrides
from seglogfs.engine.log.checkpoint import read_offset_checkpoint, write_offset_checkpoint
from seglogfs.engine.log.loader import segment_for
from seglogfs.engine.record.builder import build_batch
from seglogfs.engine.record.compression import CompressionType
from seglogfs.engine.record.records import BatchHeader, decode_records
from tests.conftest import NOW_MS, assert_log_dir_valid, broker_config, make_log
from tests.engine.test_retention import run_cli

HOUR_MS = 3_600_000
DAY_MS = 24 * HOUR_MS


def compacted_log(directory: Path, **topic_overrides: object) -> PartitionLog:
    """A compacted topic's partition: segments of 1 KiB, every batch indexed."""
    return make_log(
        directory, **{"cleanup_policy": "compact", "segment_bytes": 1024, "index_interval_bytes": 1, **topic_overrides}
    )


@pytest.fixture
def log(log_dir: Path) -> PartitionLog:
    return compacted_log(log_dir / "t-0")


def put(log: PartitionLog, key: int | None, value: int | None, timestamp: int = NOW_MS) -> int:
    """One record in its own batch; returns its offset."""
    key_bytes = None if key is None else str(key).encode()
    value_bytes = None if value is None else str(value).encode()
    if key_bytes is None:
        batch = build_batch([value_bytes], timestamps=timestamp, base_offset=log.log_end_offset)
        return log.append_batches(bytes(batch), assign_offsets=True, now_ms=NOW_MS).first_offset
    return log.append_records([value_bytes], keys=[key_bytes], timestamps=[timestamp], now_ms=NOW_MS).first_offset


def keyed(log: PartitionLog) -> list[tuple[int, int, int | None]]:
    """(offset, key, value) of every record, null values as None."""
    return [
        (r.offset, int(r.key), None if r.value is None else int(r.value)) for r in log.records(0) if r.key is not None
    ]


def keys_with_values(log: PartitionLog) -> list[int]:
    return [key for _, key, value in keyed(log) if value is not None]


def clean(log: PartitionLog, first_dirty: int | None = None, *, now_ms: int = NOW_MS, buffer: int = 1 << 20):
    cleaner = Cleaner(buffer)
    return cleaner.clean(log_to_clean(log, first_dirty, now_ms), now_ms)


def hashes(keys: list[int]) -> tuple[np.ndarray, np.ndarray]:
    return key_hashes([str(key).encode() for key in keys])


# -- the offset map -------------------------------------------------------------------------------
@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 300), min_size=1, max_size=400), st.integers(2, 2000))
def test_offset_map_matches_a_dict_until_full(keys: list[int], slots: int) -> None:
    offset_map = OffsetMap(slots * 16)
    offset_map.clear(1000)
    offsets = np.arange(1000, 1000 + len(keys), dtype=np.int64)
    first, second = hashes(keys)
    mapped = offset_map.put(first, second, offsets)
    # Kafka's rule: a record that finds the map full stops the pass, even if its key is mapped.
    model: dict[int, int] = {}
    expected_mapped = 0
    for key, offset in zip(keys, offsets, strict=True):
        if len(model) >= offset_map.capacity:
            break
        model[key] = int(offset)
        expected_mapped += 1
    assert mapped == expected_mapped
    assert len(offset_map) == len(model) <= offset_map.capacity
    probe = sorted(set(keys) | {1_000_000})
    found = offset_map.get(*hashes(probe))
    assert found.tolist() == [model.get(key, -1) for key in probe]
    assert offset_map.latest_offset == (int(offsets[mapped - 1]) if mapped else 999)


def test_offset_map_costs_16_bytes_a_slot_and_holds_0_9_of_them() -> None:
    offset_map = OffsetMap(16 * 1_000_003)
    assert offset_map.slots <= 1_000_003
    assert offset_map.capacity == int(offset_map.slots * 0.9)
    table_bytes = sum(a.nbytes for a in (offset_map._first, offset_map._second, offset_map._offsets))
    assert table_bytes / offset_map.capacity < 24  # Kafka's bar: 24 bytes per entry


def test_build_offset_map_over_a_range(log: PartitionLog) -> None:
    # Case 111: the map over [start, end) holds keys start..end-1 at their offsets; latest = end-1.
    for i in range(100):
        put(log, i, i)
    log.roll(NOW_MS)
    cleaner = Cleaner(1 << 20)
    end = cleaner.build_offset_map(log, 20, 70, CleanerStats())
    assert end == 70 and cleaner.offset_map.latest_offset == 69 and len(cleaner.offset_map) == 50
    assert cleaner.offset_map.get(*hashes(list(range(100)))).tolist() == [-1] * 20 + list(range(20, 70)) + [-1] * 30


def test_build_offset_map_with_sparse_offsets(log: PartitionLog) -> None:
    # Case 111 (FakeLarge): offsets far apart, up to 7,206,178.
    offsets = [0, 1000, 7_206_178]
    for key, offset in enumerate(offsets):
        batch = build_batch([b"v"], keys=[str(key).encode()], timestamps=NOW_MS, base_offset=offset)
        log.append_batches(bytes(batch), assign_offsets=False, now_ms=NOW_MS)
    log.roll(NOW_MS)
    cleaner = Cleaner(1 << 20)
    end = cleaner.build_offset_map(log, 0, log.active_segment.base_offset, CleanerStats())
    assert end == 7_206_179
    assert cleaner.offset_map.get(*hashes([0, 1, 2])).tolist() == offsets


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.one_of(st.none(), st.binary(max_size=20)),
            st.one_of(st.none(), st.binary(max_size=300)),
            st.lists(st.tuples(st.text(max_size=4), st.one_of(st.none(), st.binary(max_size=5))), max_size=2),
            st.integers(-(2**40), 2**40),
        ),
        min_size=1,
        max_size=120,
    ),
    st.sampled_from(["none", "gzip", "lz4"]),
    st.integers(0, 3),
)
def test_batch_records_agrees_with_the_decoder(records, codec: str, gap: int) -> None:
    # The column-wise layout the cleaner works from against the record decoder, for mixed and
    # uniform record sizes, offset gaps and long varints.

    keys = [key for key, _, _, _ in records]
    values = [value for _, value, _, _ in records]
    headers = [tuple(h) for _, _, h, _ in records]
    timestamps = [NOW_MS + delta for _, _, _, delta in records]
    deltas = [i * (gap + 1) for i in range(len(records))]
    batch = bytes(
        build_batch(
            values,
            keys=keys,
            headers=headers,
            timestamps=timestamps,
            base_offset=1000,
            compression=CompressionType[codec.upper()],
            offset_deltas=deltas,
        )
    )
    header = BatchHeader.parse(batch)
    layout = batch_records(header, batch)
    decoded = decode_records(header, batch)
    assert layout.offsets.tolist() == [r.offset for r in decoded]
    assert layout.timestamps.tolist() == [r.timestamp for r in decoded]
    assert layout.has_key.tolist() == [r.key is not None for r in decoded]
    assert layout.null_value.tolist() == [r.value is None for r in decoded]
    with_keys = [r.key for r in decoded if r.key is not None]
    first, second = key_hashes(with_keys)
    assert layout.first_hash[layout.has_key].tolist() == first.tolist()
    assert layout.second_hash[layout.has_key].tolist() == second.tolist()
    section = layout.section
    pieces = [section[layout.bounds[i] : layout.bounds[i + 1]] for i in range(len(decoded))]
    assert b"".join(pieces) == section


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 2000), st.integers(0, 200), st.integers(1, 300))
def test_batch_records_of_uniform_runs(count: int, value_bytes: int, key_every: int) -> None:

    keys = [b"k%05d" % i if i % key_every == 0 else None for i in range(count)]
    batch = bytes(build_batch([b"v" * value_bytes] * count, keys=keys, timestamps=NOW_MS))
    header = BatchHeader.parse(batch)
    layout = batch_records(header, batch)
    decoded = decode_records(header, batch)
    assert layout.offsets.tolist() == [r.offset for r in decoded]
    assert layout.has_key.tolist() == [r.key is not None for r in decoded]
    assert layout.bounds[-1] == len(layout.section)


# -- cleaning -------------------------------------------------------------------------------------
def test_clean_segments_with_a_given_map(log: PartitionLog) -> None:
    # Case 85: keys = offsets over 4 segments; the map says keys 1,3,5,7,9 have later versions.
    while len(log.segments) < 5:
        put(log, log.log_end_offset, log.log_end_offset)
    log.roll(NOW_MS)
    cleaner = Cleaner(1 << 20)
    offset_map = cleaner.offset_map
    offset_map.clear(0)
    newer = [1, 3, 5, 7, 9]
    offset_map.put(*hashes(newer), np.arange(10_000, 10_005, dtype=np.int64))
    group = log.segments[:3]
    covered = {o for o, _, _ in keyed(log) if o < log.segments[3].base_offset}
    stats = CleanerStats()
    cleaner.clean_segments(log, group, offset_map, NOW_MS, stats)
    remaining = keyed(log)
    assert not any(key in newer for _, key, _ in remaining if key in covered)
    assert [o for o, _, _ in remaining] == sorted(o for o in range(log.log_end_offset) if o not in newer)
    assert stats.bytes_read == sum(s.size for s in group)


def test_partial_segment_clean_with_a_one_key_map(log: PartitionLog) -> None:
    # Case 86: keys 0,1,0,1,0; room for one key; first dirty offset 2.
    for i, key in enumerate([0, 1, 0, 1, 0]):
        put(log, key, i)
    log.roll(NOW_MS)
    tiny = 32  # two slots, room for one key
    first = clean(log, 2, buffer=tiny)
    assert first.next_dirty_offset == 3
    assert [(o, k) for o, k, _ in keyed(log)] == [(1, 1), (2, 0), (3, 1), (4, 0)]
    second = clean(log, 3, buffer=tiny)
    assert second.next_dirty_offset == 4
    assert [(o, k) for o, k, _ in keyed(log)] == [(2, 0), (3, 1), (4, 0)]
    third = clean(log, 4, buffer=tiny)
    assert third.next_dirty_offset == 5
    assert [(o, k) for o, k, _ in keyed(log)] == [(3, 1), (4, 0)]


def test_cleaner_stats_of_a_full_clean(log_dir: Path) -> None:
    # Case 86 (LogCleanerStats): 5 read, 2 written, bytes written = the cleaned log's size.
    log = compacted_log(log_dir / "t-0")
    for i, key in enumerate([0, 1, 0, 1, 0]):
        put(log, key, i)
    log.roll(NOW_MS)
    result = clean(log)
    assert result.next_dirty_offset == 5
    assert result.stats.records_read == 5 and result.stats.records_written == 2
    assert result.stats.bytes_written == sum(s.size for s in log.segments[:-1])


def test_cleaning_with_deletes(log: PartitionLog) -> None:
    # Case 87: tombstones for every even key, then more data: no even key keeps a value.
    for i in range(40):
        put(log, i % 10, i)
    for key in range(0, 10, 2):
        put(log, key, None)
    for i in range(40, 80):
        put(log, 1 + 2 * (i % 5), i)
    log.roll(NOW_MS)
    clean(log)
    assert not any(key % 2 == 0 for key in keys_with_values(log))
    assert sorted({k for _, k, v in keyed(log) if v is None}) == [0, 2, 4, 6, 8]  # within delete.retention.ms


def test_tombstone_is_not_removed_by_its_own_old_timestamp(log_dir: Path) -> None:
    # Case 88: a tombstone whose timestamp is older than delete.retention.ms still lives through
    # the pass that stamps its horizon, and the next pass before the horizon.
    log = compacted_log(log_dir / "t-0", delete_retention_ms=10_000)
    put(log, 0, 0, timestamp=NOW_MS + 100 * DAY_MS)
    put(log, 0, None, timestamp=NOW_MS - DAY_MS)
    log.roll(NOW_MS)
    clean(log)
    assert keyed(log) == [(1, 0, None)]
    first_batch = next(log.segments[0].iter_headers())
    assert first_batch.last_offset == 1 and first_batch.delete_horizon_ms == NOW_MS + 10_000
    put(log, 1, 1)
    log.roll(NOW_MS)
    clean(log, now_ms=NOW_MS + 5_000)
    assert (1, 0, None) in keyed(log)
    clean(log, now_ms=NOW_MS + 10_000)  # past the horizon: gone
    assert keyed(log) == [(2, 1, 1)]


def test_tombstones_go_after_the_horizon_through_the_data_dir(log_dir: Path) -> None:
    # The horizon makes a log cleanable again although nothing in it is dirty.
    config = broker_config(log_dir, log_segment_bytes=300)
    with DataDir.open(config, now_ms=NOW_MS) as data_dir:
        data_dir.create_topic("c", 1, {"cleanup.policy": "compact", "delete.retention.ms": "1000"}, now_ms=NOW_MS)
        log = data_dir.partition("c", 0)
        for i in range(20):
            put(log, i % 4, i)
        put(log, 3, None)
        log.roll(NOW_MS)
        assert len(data_dir.compact(NOW_MS).compaction) == 1
        assert 3 in {k for _, k, v in keyed(log) if v is None}
        assert data_dir.compact(NOW_MS + 999).compaction == []
    # A new process finds the stamped horizon by itself.
    with DataDir.open(config, now_ms=NOW_MS) as data_dir:
        log = data_dir.partition("c", 0)
        assert len(data_dir.compact(NOW_MS + 1000).compaction) == 1
        assert 3 not in {k for _, k, _ in keyed(log)}
    assert_log_dir_valid(log_dir)


def test_unkeyed_records_are_dropped_and_counted(log_dir: Path) -> None:
    # Case 89: records without a key, written while the topic was `delete`, are invalid.
    log = compacted_log(log_dir / "t-0", cleanup_policy="delete")
    for i in range(5):
        put(log, None, i)
    log.config = apply_topic_overrides(log.config, {"cleanup.policy": "compact"})
    for i in range(5):
        put(log, i, i)
    log.roll(NOW_MS)
    unkeyed_bytes = sum(h.size_in_bytes for h in log.segments[0].iter_headers() if h.last_offset < 5)
    before = log.size_in_bytes()
    result = clean(log)
    assert result.stats.invalid_records == 5
    assert keys_with_values(log) == [0, 1, 2, 3, 4]
    assert log.size_in_bytes() == before - unkeyed_bytes


def test_uncleanable_section_is_left_byte_identical(log_dir: Path) -> None:
    # Case 90 and 96: with min.compaction.lag.ms, segments holding young records are not touched.
    log = compacted_log(log_dir / "t-0", min_compaction_lag_ms=HOUR_MS)
    while len(log.segments) < 3:
        put(log, log.log_end_offset % 5, log.log_end_offset, timestamp=NOW_MS - 2 * HOUR_MS)
    young_base = log.log_end_offset
    log.roll(NOW_MS)
    while len(log.segments) < 6:
        put(log, log.log_end_offset % 5, log.log_end_offset, timestamp=NOW_MS)
    log.roll(NOW_MS)
    young = {s.base_offset: s.log_path.read_bytes() for s in log.segments if s.base_offset >= young_base}
    assert first_uncleanable_offset(log, 0, NOW_MS) == young_base
    clean(log)
    for segment in log.segments:
        if segment.base_offset >= young_base:
            assert segment.log_path.read_bytes() == young[segment.base_offset]
    old = [(o, k) for o, k, _ in keyed(log) if o < young_base]
    assert sorted(k for _, k in old) == [0, 1, 2, 3, 4]  # one version each below the lag
    # Once the lag has passed the rest is compacted too, and each key's latest value is the same.
    latest = {k: v for _, k, v in keyed(log)}
    clean(log, young_base, now_ms=NOW_MS + 2 * HOUR_MS)
    assert {k: v for _, k, v in keyed(log)} == latest
    assert len(keyed(log)) == 5 + sum(1 for _ in log.active_segment.iter_headers())


def test_log_to_clean_byte_counts(log: PartitionLog) -> None:
    # Case 91: total, clean and cleanable bytes and the ratio.
    while len(log.segments) < 7:
        put(log, log.log_end_offset % 3, 0)
    segments = log.segments
    first_dirty = segments[2].base_offset
    candidate = log_to_clean(log, first_dirty, NOW_MS)
    assert candidate.clean_bytes == segments[0].size + segments[1].size
    assert candidate.cleanable_bytes == sum(s.size for s in segments[2:-1])
    assert candidate.total_bytes == sum(s.size for s in segments[:-1])
    assert candidate.cleanable_ratio == pytest.approx(candidate.cleanable_bytes / candidate.total_bytes)


def _candidate(log: PartitionLog, ratio: float) -> LogToClean:
    return LogToClean(log, 0, 0, int(100 * (1 - ratio)), int(100 * ratio), needs_compaction_now=False)


def test_filthiest_log_is_chosen(log_dir: Path) -> None:
    # Case 92: the highest dirty ratio above min.cleanable.dirty.ratio wins; none when all are
    # below it. (Logs being cleaned are not a case here: one cleaner works through them in turn;
    # uncleanable logs are left out by the data dir, see test_corrupt_log_is_marked_uncleanable.)
    logs = [compacted_log(log_dir / f"t-{i}", min_cleanable_dirty_ratio=0.05) for i in range(3)]
    candidates = [_candidate(logs[0], 0.0), _candidate(logs[1], 0.2), _candidate(logs[2], 0.4)]
    chosen = filthiest(candidates)
    assert chosen is not None and chosen.log is logs[2]
    assert filthiest(candidates[:1]) is None
    assert filthiest([]) is None


def test_invalid_cleaner_checkpoint_is_reset_to_the_log_start(log_dir: Path) -> None:
    # Case 93: a checkpoint past the log end or below the log start restarts at the log start,
    # and the file is rewritten even when the log is not cleaned.
    config = broker_config(log_dir)
    with DataDir.open(config, now_ms=NOW_MS) as data_dir:
        data_dir.create_topic("c", 2, {"cleanup.policy": "compact"}, now_ms=NOW_MS)
        for partition in (0, 1):
            for i in range(20):
                put(data_dir.partition("c", partition), i, i)
        data_dir.partition("c", 1).roll(NOW_MS)
        data_dir.partition("c", 1).delete_records(10, NOW_MS)
    write_offset_checkpoint(log_dir / "cleaner-offset-checkpoint", {("c", 0): 500, ("c", 1): 5})
    with DataDir.open(config, now_ms=NOW_MS) as data_dir:
        offsets = {c.log.partition: c.first_dirty_offset for c in data_dir.log_cleaner.cleanable_logs(NOW_MS)}
        assert offsets == {0: 0, 1: 10}
        data_dir.compact(NOW_MS)
    assert read_offset_checkpoint(log_dir / "cleaner-offset-checkpoint")[("c", 0)] == 0


def test_nothing_cleanable_when_all_dirty_data_is_in_the_active_segment(log: PartitionLog) -> None:
    # Case 94 and 95: the first uncleanable offset is the active segment's base (and never above
    # the high watermark); a dirty section inside the active segment has no cleanable bytes.
    for i in range(5):
        put(log, i % 2, i)
    assert first_uncleanable_offset(log, 0, NOW_MS) == 0
    candidate = log_to_clean(log, 2, NOW_MS)
    assert candidate.cleanable_bytes == 0 and filthiest([candidate]) is None
    while len(log.segments) < 3:
        put(log, 1, 1)
    assert first_uncleanable_offset(log, 0, NOW_MS) == log.active_segment.base_offset


def test_max_compaction_lag_forces_a_clean_below_the_dirty_ratio(log_dir: Path) -> None:
    # max.compaction.lag.ms: a dirty record older than the lag makes the log cleanable whatever
    # its ratio, and the active segment of a compacted topic rolls by the lag.
    log = compacted_log(log_dir / "t-0", min_cleanable_dirty_ratio=0.99, max_compaction_lag_ms=HOUR_MS)
    assert log.config.max_segment_ms == HOUR_MS
    for i in range(30):
        put(log, i, i, timestamp=NOW_MS)
    log.roll(NOW_MS)
    dirty = clean(log).next_dirty_offset
    put(log, 0, 0, timestamp=NOW_MS)
    log.roll(NOW_MS)
    assert filthiest([log_to_clean(log, dirty, NOW_MS)]) is None
    assert filthiest([log_to_clean(log, dirty, NOW_MS + HOUR_MS + 1)]) is not None


def test_compacted_topics_also_lose_segments_below_the_log_start(log_dir: Path) -> None:
    # Case 98: delete-records works on compact topics too (retention by time/size does not).
    config = broker_config(log_dir, log_segment_bytes=300, log_retention_ms=1)
    with DataDir.open(config, now_ms=NOW_MS) as data_dir:
        data_dir.create_topic("c", 1, {"cleanup.policy": "compact"}, now_ms=NOW_MS)
        log = data_dir.partition("c", 0)
        for i in range(30):
            put(log, i, i)
        segments = len(log.segments)
        assert data_dir.delete_old_segments(NOW_MS + DAY_MS) == []
        assert len(log.segments) == segments
        log.delete_records(20, NOW_MS)
        assert log.segments[0].base_offset <= 20 < log.segments[1].base_offset


@pytest.mark.expect_warnings("cleaning t-0 failed")
def test_corrupt_log_is_marked_uncleanable(log_dir: Path) -> None:
    # Case 108: a corrupt batch stops the pass with a clear error instead of looping; the data dir
    # marks the log uncleanable, leaves its files as they were and cleans the others.
    config = broker_config(log_dir, log_segment_bytes=300)
    with DataDir.open(config, now_ms=NOW_MS) as data_dir:
        for topic in ("t", "u"):
            data_dir.create_topic(topic, 1, {"cleanup.policy": "compact"}, now_ms=NOW_MS)
            for i in range(30):
                put(data_dir.partition(topic, 0), i % 3, i)
            data_dir.partition(topic, 0).roll(NOW_MS)
    victim = log_dir / "t-0" / "00000000000000000000.log"
    data = bytearray(victim.read_bytes())
    data[30] ^= 0xFF  # inside the first batch's CRC-covered bytes
    victim.write_bytes(data)
    before = {p.name: p.read_bytes() for p in (log_dir / "t-0").iterdir()}
    with DataDir.open(config, now_ms=NOW_MS) as data_dir:
        report = data_dir.compact(NOW_MS)
        assert [(r.topic, r.partition) for r in report.compaction] == [("u", 0)]
        assert len(report.failed) == 1 and report.failed[0][0] == ("t", 0)
        assert "corrupt record batch at position 0" in report.failed[0][1]
        assert data_dir.compact(NOW_MS).failed == []  # not tried again
    after = {p.name: p.read_bytes() for p in (log_dir / "t-0").iterdir() if not p.name.endswith(".cleaned")}
    assert {n: b for n, b in after.items() if n.endswith(".log")} == {
        n: b for n, b in before.items() if n.endswith(".log")
    }
    assert not any(p.name.endswith(".cleaned") for p in (log_dir / "t-0").iterdir())


def test_corrupt_batch_raises(log: PartitionLog) -> None:
    for i in range(10):
        put(log, i % 2, i)
    log.roll(NOW_MS)
    segment = log.segments[0]
    with open(segment.log_path, "r+b") as handle:  # a size field larger than what is left
        handle.seek(8)
        handle.write((10_000).to_bytes(4, "big"))
    with pytest.raises(CorruptRecordError, match="position 0"):
        clean(log)


def test_cleaning_passes_offset_gaps(log: PartitionLog) -> None:
    # Case 109: segments with holes between them: the next dirty offset is the active base.
    for base, keys in ((0, range(10)), (15, range(3)), (30, range(2))):
        encoded = [str(k).encode() for k in keys]
        batch = build_batch(encoded, keys=encoded, timestamps=NOW_MS, base_offset=base)
        log.append_batches(bytes(batch), assign_offsets=False, now_ms=NOW_MS)
        log.roll(NOW_MS)
    result = clean(log)
    assert result.next_dirty_offset == log.active_segment.base_offset == 32
    assert [o for o, _, _ in keyed(log)] == [3, 4, 5, 6, 7, 8, 9, 17, 30, 31]


def test_segment_grouping(log: PartitionLog) -> None:
    # Case 110: huge limits → one group; limits of one byte → singletons; room for three → threes.
    while len(log.segments) < 11:
        put(log, 1, 1)
    segments = log.segments[:-1]
    end = log.active_segment.base_offset
    assert group_segments_by_size(segments, 2**31, 2**31, end) == [segments]
    assert group_segments_by_size(segments, 1, 2**31, end) == [[s] for s in segments]
    assert group_segments_by_size(segments, 2**31, 1, end) == [[s] for s in segments]
    three = sum(s.size for s in segments[:3])
    groups = group_segments_by_size(segments, three, 2**31, end)
    assert all(len(group) == 3 for group in groups[:-1]) and len(groups[-1]) <= 3
    assert [s for group in groups for s in group] == segments


# -- crash recovery: Kafka's states (case 106) --------------------------------------------------
def _swap_state(
    log_dir: Path, state: str
) -> tuple[list[tuple[int, int, int | None]], list[tuple[int, int, int | None]]]:
    """Make a log, clean it into a copy, then lay the files out as a crash in `state` would have
    left them; returns (records before cleaning, records after)."""
    log = compacted_log(log_dir / "t-0")
    for i in range(60):
        put(log, i % 6, i)
    log.roll(NOW_MS)
    before = keyed(log)
    old_bases = [s.base_offset for s in log.segments[:-1]]
    log.close()
    scratch = log_dir.parent / "scratch"
    shutil.copytree(log_dir, scratch)
    one_group = apply_topic_overrides(log.config, {"segment.bytes": str(1 << 20)})  # one output segment
    cleaned_log = PartitionLog.open(
        scratch / "t-0", "t", 0, one_group, writable=True, clean_shutdown=True, now_ms=NOW_MS
    )
    Cleaner(1 << 20).clean(log_to_clean(cleaned_log, None, NOW_MS), NOW_MS)
    after = keyed(cleaned_log)
    assert len(cleaned_log.segments) == 2
    cleaned_log.close()
    directory = log_dir / "t-0"
    new_base = 0
    new_files = {
        suffix: (scratch / "t-0" / f"{new_base:020d}{suffix}").read_bytes()
        for suffix in (".log", ".index", ".timeindex")
    }
    suffixes = {
        "cleaned": (".cleaned", ".cleaned", ".cleaned"),
        "log swapped": (".swap", ".cleaned", ".cleaned"),
        "all swapped": (".swap", ".swap", ".swap"),
        "old deleted": (".swap", ".swap", ".swap"),
        "time index still swap": ("", "", ".swap"),
    }[state]
    if state in ("old deleted", "time index still swap"):
        for base in old_bases:
            for suffix in (".log", ".index", ".timeindex"):
                path = directory / f"{base:020d}{suffix}"
                os.replace(path, path.with_name(path.name + ".deleted"))
    for (suffix, data), extra in zip(new_files.items(), suffixes, strict=True):
        (directory / f"{new_base:020d}{suffix}{extra}").write_bytes(data)
    return before, after


@pytest.mark.parametrize(
    ("state", "completed"),
    [
        ("cleaned", False),
        ("log swapped", False),
        ("all swapped", True),
        ("old deleted", True),
        ("time index still swap", True),
    ],
)
def test_recovery_after_a_crash_while_swapping(log_dir: Path, state: str, completed: bool) -> None:
    before, after = _swap_state(log_dir, state)
    config = broker_config(log_dir)
    config_overrides = {"cleanup.policy": "compact", "segment.bytes": "1024", "index.interval.bytes": "1"}
    log = PartitionLog.open(
        log_dir / "t-0",
        "t",
        0,
        apply_topic_overrides(config.topic_defaults, config_overrides),
        writable=True,
        clean_shutdown=False,
        now_ms=NOW_MS,
    )
    assert keyed(log) == (after if completed else before)
    log.close()
    names = os.listdir(log_dir / "t-0")
    assert not any(n.endswith((".cleaned", ".swap", ".deleted")) for n in names)
    assert_log_dir_valid(log_dir)


# -- the output's format ---------------------------------------------------------------------------
@pytest.mark.parametrize("codec", ["none", "gzip", "snappy", "lz4", "zstd"])
def test_cleaned_segments_parse_with_kafka_python_and_follow_the_index_rules(log_dir: Path, codec: str) -> None:
    log = compacted_log(log_dir / "t-0", segment_bytes=4096, index_interval_bytes=200, compression_type=codec)
    rng = np.random.default_rng(7)
    for _ in range(60):
        keys = rng.integers(0, 40, size=5)
        values = [None if k % 13 == 0 else b"value-%d" % k for k in keys]
        headers = [[("h", b"x")] if k % 5 == 0 else [] for k in keys]
        log.append_records(values, keys=[b"key-%d" % k for k in keys], headers=headers, now_ms=NOW_MS)
    log.roll(NOW_MS)
    latest = {r.key: (r.value, r.headers) for r in log.records(0)}
    clean(log)
    assert {r.key: (r.value, r.headers) for r in log.records(0)} == latest
    for segment in log.segments[:-1]:
        data = segment.log_path.read_bytes()
        records = MemoryRecords(data)
        seen = []
        while (batch := records.next_batch()) is not None:
            assert batch.validate_crc()
            seen.extend((record.offset, record.key, record.value) for record in batch)
        ours = [(r.offset, r.key, r.value) for r in log.records(segment.base_offset, log.segments[-1].base_offset)]
        assert [s for s in seen if s[0] < _next_base(log, segment)] == [
            o for o in ours if segment.base_offset <= o[0] < _next_base(log, segment)
        ]
        # The indexes written while cleaning equal what recovery rebuilds from the log alone.
        rebuilt_dir = log_dir.parent / f"rebuilt-{segment.base_offset}"
        rebuilt_dir.mkdir()
        shutil.copyfile(segment.log_path, rebuilt_dir / segment.log_path.name)
        copy = segment_for(rebuilt_dir, segment.base_offset, log.config, writable=True, now_ms=NOW_MS)
        assert copy.recover() == 0
        copy.close()
        for path in (segment.offset_index_path, segment.time_index_path):
            assert (rebuilt_dir / path.name).read_bytes() == path.read_bytes(), path.name
    log.close()
    assert_log_dir_valid(log_dir)


def _next_base(log: PartitionLog, segment) -> int:
    bases = [s.base_offset for s in log.segments]
    return bases[bases.index(segment.base_offset) + 1]


def test_clean_command_prints_what_it_compacted(log_dir: Path) -> None:
    config = broker_config(log_dir, log_segment_bytes=400)
    with DataDir.open(config, now_ms=NOW_MS) as data_dir:
        data_dir.create_topic("c", 1, {"cleanup.policy": "compact"}, now_ms=NOW_MS)
        log = data_dir.partition("c", 0)
        for i in range(30):
            put(log, i % 3, i)
        log.roll(NOW_MS)
    done = run_cli("clean", str(log_dir), "--now", str(NOW_MS), "--override", "log.segment.bytes=400")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("c-0: compacted offsets 0..29 (")
    assert "30 records, " in done.stdout and ", 3 records, " in done.stdout
    again = run_cli("clean", str(log_dir), "--now", str(NOW_MS), "--override", "log.segment.bytes=400")
    assert again.stdout.strip() == "nothing to delete or compact"
    assert read_offset_checkpoint(log_dir / "cleaner-offset-checkpoint") == {("c", 0): 30}
    assert_log_dir_valid(log_dir)


def test_preallocated_compacted_topic_is_trimmed(log_dir: Path) -> None:
    # Case 105: preallocate=true with segment.bytes 1024: the cleaned file holds only its batches.
    # (This engine never preallocates segment files, so no file is ever longer than its batches;
    # the case checks that the cleaner's output keeps that.)
    log = compacted_log(log_dir / "t-0", preallocate="true")
    for i in range(40):
        put(log, i % 2, i)
    log.roll(NOW_MS)
    clean(log)
    cleaned = log.segments[0]
    assert cleaned.log_path.stat().st_size == cleaned.size < 1024


def test_legacy_message_data_opens_for_cleaning_and_is_left_as_it_was(tmp_path: Path) -> None:
    # Case 107 concerns rewriting legacy (magic 0/1) message sets. A writable open (which the
    # cleaner needs) of a compacted topic holding them reads them as any batch (recovery checks
    # each message's CRC-32 and cuts nothing): the segment's bytes stay as they were.
    from tests.conftest import kafka_fixtures

    copy = tmp_path / "legacy"
    copy.mkdir()
    shutil.copytree(kafka_fixtures() / "kafkalite-magic0" / "numbers-0", copy / "numbers-0")
    (copy / ".seglogfs-topic-configs.json").write_text(
        '{"version": 1, "topics": {"numbers": {"cleanup.policy": "compact"}}}'
    )
    segment = copy / "numbers-0" / "00000000000000000000.log"
    before = segment.read_bytes()
    with DataDir.open(BrokerConfig.load(log_dirs=[copy]), now_ms=NOW_MS) as data_dir:
        log = data_dir.partition("numbers", 0)
        assert log.log_end_offset == 11394
        assert [r.value for r in log.records(11390)] == [b"11389", b"11390", b"11391", b"11392"]
    assert segment.read_bytes() == before


def test_a_swap_failing_after_the_map_changed_keeps_the_cleaned_segment(log_dir: Path) -> None:
    """The swap fails after the cleaned segment took the old ones' place (renaming an old
    segment `.deleted` hits EIO): the cleaned segment holds their records now and must stay
    (the cleaner deleted it, leaving the group's records only in `.deleted` files)."""
    log = compacted_log(log_dir / "t-0")
    for i in range(60):
        put(log, i % 6, i)
    log.roll(NOW_MS)
    latest = {key: value for _, key, value in keyed(log)}
    victim = log.segments[1]
    real_mark = victim.mark_deleted

    def failing_mark() -> None:
        raise OSError(errno.EIO, "Input/output error")

    victim.mark_deleted = failing_mark  # type: ignore[method-assign]
    with pytest.raises(OSError):
        clean(log)
    victim.mark_deleted = real_mark  # type: ignore[method-assign]
    assert {key: value for _, key, value in keyed(log)} == latest  # every key readable, latest value
    log.close()
    reopened = PartitionLog.open(
        log_dir / "t-0", "t", 0, log.config, writable=True, clean_shutdown=False, now_ms=NOW_MS
    )  # the loader finishes the swap the failure cut short
    assert {key: value for _, key, value in keyed(reopened)} == latest
    reopened.close()
