"""A stored `.log`'s summary (what a backup records of its batches as it sends them): walked from
chunks of any size, it says what a scan of the segment says — the offset after the last batch,
the largest timestamp and its offset, whether any batch is transactional; continued from the
summary of a first part, it equals the whole's; for bytes that do not end with a whole batch, or
hold a legacy message set, it is None (readers scan). The catalogue keeps it, and a catalogue
without it reads as before."""

from __future__ import annotations

import random
from dataclasses import replace
from pathlib import Path

import pytest

from seglogfs.engine import BrokerConfig, DataDir, build_batch
from seglogfs.engine.fetched_files import SegmentSummary
from seglogfs.engine.log.segment import LogSegment
from seglogfs.engine.record.builder import ProducerState
from seglogfs.engine.stored.catalogue import FileAttributes, SegmentSummarizer, StoredFile

T0 = 1_700_000_000_000
ABORT_KEY = b"\x00\x00\x00\x00"


def transactional_log(path: Path) -> Path:
    """A partition of several segments: plain batches (timestamps that do not rise with offsets),
    then a transaction aborted by its marker in the middle segments, then plain batches."""
    rng = random.Random(11)
    config = BrokerConfig.load(overrides=["log.segment.bytes=4000"], log_dirs=[path])
    with DataDir.open(config, now_ms=T0) as data_dir:
        data_dir.create_topic("t", 1, now_ms=T0)
        log = data_dir.partition("t", 0)
        producer = ProducerState(producer_id=7, producer_epoch=0, is_transactional=True)
        for n in range(90):
            if n == 40:
                for sequence in range(3):
                    batch = build_batch(
                        [b"in-a-transaction"], timestamps=T0 + n, producer=replace(producer, base_sequence=sequence)
                    )
                    log.append_batches(bytes(batch), assign_offsets=True, now_ms=T0)
                marker = build_batch(
                    [b"\x00\x00\x00\x00\x00\x00"],
                    keys=[ABORT_KEY],
                    timestamps=T0 + n,
                    is_control=True,
                    producer=producer,
                )
                log.append_batches(bytes(marker), assign_offsets=True, now_ms=T0)
            count = rng.randint(1, 6)
            log.append_records(
                [rng.randbytes(rng.randint(10, 200)) for _ in range(count)],
                timestamps=[T0 + n * 100 + rng.randint(-900, 900) for _ in range(count)],
                now_ms=T0,
            )
    return path / "t-0"


def read_only(path: Path) -> LogSegment:
    return LogSegment(
        path.parent, int(path.stem), index_interval_bytes=4096, max_index_bytes=1 << 20, writable=False, created_ms=T0
    )


def scanned(path: Path) -> SegmentSummary:
    """What the engine's own scan of the segment at `path` finds."""
    segment = read_only(path)
    try:
        headers = list(segment.iter_headers(0))
        best = (-1, segment.base_offset)
        for header in headers:
            if header.max_timestamp > best[0]:
                best = (header.max_timestamp, header.last_offset)
        return SegmentSummary(
            path.stat().st_size,
            segment.read_next_offset(),
            best[0],
            best[1],
            any(header.is_transactional or header.is_control for header in headers),
        )
    finally:
        segment.close()


def summarized(
    path: Path, data: bytes, chunk_sizes: random.Random, before: SegmentSummary | None = None
) -> SegmentSummary | None:
    summarizer = SegmentSummarizer(int(path.stem), before)
    at = 0
    while at < len(data):
        step = chunk_sizes.choice([1, 7, 60, 61, 62, 500, 4096])
        summarizer.feed(data[at : at + step])
        at += step
    return summarizer.summary()


def test_a_summary_from_chunks_of_any_size_is_what_a_scan_finds(tmp_path: Path) -> None:
    partition = transactional_log(tmp_path / "data")
    logs = sorted(partition.glob("*.log"))
    assert len(logs) >= 4
    kinds = set()
    for path in logs:
        expected = scanned(path)
        kinds.add(expected.transactional)
        for seed in range(4):
            assert summarized(path, path.read_bytes(), random.Random(seed)) == expected, path.name
    assert kinds == {True, False}  # (segments with and without a transaction)


def test_a_summary_continued_from_a_first_parts_is_the_wholes(tmp_path: Path) -> None:
    partition = transactional_log(tmp_path / "data")
    path = sorted(partition.glob("*.log"))[-1]
    data = path.read_bytes()
    segment = read_only(path)
    try:
        cuts = [header.next_position for header in segment.iter_headers(0)]
    finally:
        segment.close()
    for cut in cuts[:-1]:
        first = summarized(path, data[:cut], random.Random(cut))
        assert first is not None and first.size == cut
        assert summarized(path, data[cut:], random.Random(cut), before=first) == scanned(path)


def test_bytes_that_are_not_whole_v2_batches_have_no_summary(tmp_path: Path) -> None:
    partition = transactional_log(tmp_path / "data")
    path = sorted(partition.glob("*.log"))[0]
    data = path.read_bytes()
    assert summarized(path, data[:-1], random.Random(1)) is None  # (a torn tail)
    assert summarized(path, data[:30], random.Random(1)) is None  # (a header cut short)
    legacy = bytearray(data)
    legacy[16] = 1  # (the first batch's magic: a legacy message set's)
    assert summarized(path, bytes(legacy), random.Random(1)) is None
    assert summarized(path, b"", random.Random(1)) == SegmentSummary(0, int(path.stem), -1, int(path.stem), False)


@pytest.mark.parametrize(
    "summary", [None, SegmentSummary(4096, 120, T0 + 5, 117, False), SegmentSummary(4096, 120, -1, 100, True)]
)
def test_the_catalogue_keeps_a_summary_and_reads_one_without(summary: SegmentSummary | None) -> None:
    stored = StoredFile([("t-0/00000000000000000100.log", 4096)], 4096, 1234, FileAttributes(0o644, 1, None), summary)
    document = stored.as_json()
    assert StoredFile.of_json(document) == stored
    document.pop("segment", None)  # (written before summaries: readers scan)
    assert StoredFile.of_json(document).summary is None
