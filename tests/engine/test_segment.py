"""One log segment: Kafka's LogSegmentTest (and the segment-level cases of LogLoaderTest and
UnifiedLogTest) ported case by case, numbered in comments.

Kafka's `records(offset, "hello")` is a batch with one record per value at `offset`, timestamp
offset × 10; `batch()` below builds the same in v2. Where the engine differs from Kafka on purpose
(v2 batches only, timestamps taken from the batch rather than passed beside it), the test says so.
"""

from __future__ import annotations

import errno
import os
import random
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from seglogfs.engine.errors import CorruptIndexError, OffsetOverflowError, UnsafeFileError
from seglogfs.engine.log.file_records import FileRecords, _ReadAheadAdvice, read_cached
from seglogfs.engine.log.offset_index import OFFSET_INDEX_DTYPE, OffsetPosition
from seglogfs.engine.log.segment import FetchSlice, LogSegment
from seglogfs.engine.log.time_index import TIME_INDEX_DTYPE, TimestampOffset
from seglogfs.engine.record.builder import build_batch
from seglogfs.engine.record.records import NO_TIMESTAMP, BatchHeader, decode_records, iter_batch_headers
from tests.conftest import NOW_MS, refused_when_uncached

INT32_MAX = 2**31 - 1
LONG_MAX = 2**63 - 1
# Kafka's LogSegmentTest helper sizes the offset index 1000 and the time index 1500 bytes; the engine
# has one size for both, and 100 indexed batches need the larger.
MAX_INDEX_BYTES = 1500

MakeSegment = Callable[..., LogSegment]


@pytest.fixture
def make_segment(tmp_path: Path) -> Iterator[MakeSegment]:
    """Open (or create) a writable segment in tmp_path, made active as the log makes a new one;
    every segment opened is closed at teardown (closing twice is safe)."""
    opened: list[LogSegment] = []

    def make(
        base_offset: int,
        *,
        index_interval_bytes: int = 10,
        max_index_bytes: int = MAX_INDEX_BYTES,
        created_ms: int = NOW_MS,
        active: bool = True,
    ) -> LogSegment:
        segment = LogSegment(
            tmp_path,
            base_offset,
            index_interval_bytes=index_interval_bytes,
            max_index_bytes=max_index_bytes,
            writable=True,
            created_ms=created_ms,
        )
        opened.append(segment)
        if active:
            segment.make_active()
        return segment

    yield make
    for segment in opened:
        segment.close()


def batch(base_offset: int, *values: str, timestamp: int | None = None) -> bytes:
    """One v2 batch of `values` (default one "hello") from `base_offset`, timestamp offset × 10."""
    encoded = [v.encode() for v in values or ("hello",)]
    ts = base_offset * 10 if timestamp is None else timestamp
    return build_batch(encoded, timestamps=ts, base_offset=base_offset)


def append(segment: LogSegment, data: bytes) -> None:
    segment.append(data, list(iter_batch_headers(data)))


def headers_of(fetch: FetchSlice | None) -> list[BatchHeader]:
    assert fetch is not None
    return list(iter_batch_headers(fetch.data))


def values_of(fetch: FetchSlice | None) -> list[tuple[int, bytes | None]]:
    """(offset, value) of every record in the whole batches read."""
    assert fetch is not None
    out = []
    for header in iter_batch_headers(fetch.data):
        raw = fetch.data[header.position : header.next_position]
        out += [(r.offset, r.value) for r in decode_records(header, raw)]
    return out


def write_nonsense(path: Path, position: int, length: int, rng: random.Random) -> None:
    """Kafka's writeNonsenseToFile: random bytes over `length` bytes from `position`."""
    with path.open("r+b") as file:
        file.seek(position)
        file.write(rng.randbytes(length))


def roll_params(
    *, max_offset: int, now_ms: int, max_segment_ms: int = 300_000, timestamp: int = NO_TIMESTAMP
) -> dict[str, int]:
    """LogSegment.should_roll's arguments (Kafka's RollParams in its tests)."""
    return {
        "max_bytes": INT32_MAX,
        "max_ms": max_segment_ms,
        "messages_bytes": 1024,
        "max_timestamp": timestamp,
        "max_offset": max_offset,
        "now_ms": now_ms,
    }


# -- A. append and read ----------------------------------------------------------------------------


# Case 1
@pytest.mark.parametrize(
    ("base_offset", "largest_offset"),
    [(0, -(2**31)), (0, 2**31), (1, 0), (100, 10), (2**31, 0), (-(2**31), 0), (2**31, 2**32)],
)
def test_append_of_offset_not_relative_to_base_overflows(
    make_segment: MakeSegment, base_offset: int, largest_offset: int
) -> None:
    segment = make_segment(base_offset)

    with pytest.raises(OffsetOverflowError):
        append(segment, batch(largest_offset))

    assert segment.size == 0
    assert segment.log_path.stat().st_size == 0
    assert segment.offset_index.entries == 0


# Case 1 (the boundary itself is allowed)
def test_append_at_largest_relative_offset_is_accepted(make_segment: MakeSegment) -> None:
    segment = make_segment(0)
    append(segment, batch(0))
    append(segment, batch(INT32_MAX))

    assert segment.read_next_offset() == INT32_MAX + 1


# Case 2 (Kafka returns null, the engine None: nothing, not an empty slice)
def test_read_on_empty_segment_is_none(make_segment: MakeSegment) -> None:
    assert make_segment(40).read(40, 300) is None


# Case 3 (and case 14: a read from inside a batch returns the whole batch)
@pytest.mark.parametrize("start_offset", [41, 50, 52, 53], ids=["before-first", "first", "inside", "last"])
def test_read_returns_first_batch_whose_last_offset_reaches_start(make_segment: MakeSegment, start_offset: int) -> None:
    segment = make_segment(40)
    data = batch(50, "hello", "there", "little", "bee")
    append(segment, data)

    read = segment.read(start_offset, 300)

    assert read == FetchSlice(segment_base_offset=40, position=0, data=data)


# Case 4
def test_read_after_last_offset_is_none(make_segment: MakeSegment) -> None:
    segment = make_segment(40)
    append(segment, batch(50, "hello", "there"))

    assert segment.read(52, 200) is None


# Case 5
def test_read_from_gap_returns_the_next_batch(make_segment: MakeSegment) -> None:
    segment = make_segment(40)
    first, second = batch(50, "hello", "there"), batch(60, "alpha", "beta")
    append(segment, first)
    append(segment, second)

    read = segment.read(55, 200)

    assert read == FetchSlice(segment_base_offset=40, position=len(first), data=second)
    assert values_of(read) == [(60, b"alpha"), (61, b"beta")]


# Case 6. Kafka's test uses v1 messages 50 and 51 (position 39 is the second message); in v2 each
# offset gets its own batch for the same shape. Kafka returns position metadata without records
# when no max position is known; the engine's max_position=None means "the segment's size", so a
# 1-byte read returns the first byte of the batch (an incomplete entry, as case 11), and with
# min_one_message the whole batch.
@pytest.mark.parametrize("min_one_message", [False, True])
def test_read_with_one_byte_max_reports_position_of_the_batch(make_segment: MakeSegment, min_one_message: bool) -> None:
    segment = make_segment(40)
    first, second = batch(50), batch(51)
    append(segment, first)
    append(segment, second)

    for offset, expected_position, expected_batch in [(48, 0, first), (50, 0, first), (51, len(first), second)]:
        read = segment.read(offset, 1, min_one_message=min_one_message)
        assert read is not None, f"read({offset})"
        assert (read.segment_base_offset, read.position) == (40, expected_position), f"read({offset})"
        assert read.data == (expected_batch if min_one_message else expected_batch[:1]), f"read({offset})"
    assert segment.read(52, 1, min_one_message=min_one_message) is None
    assert segment.read(53, 1, min_one_message=min_one_message) is None


# Case 6 (the max position bounds the read)
def test_read_stops_at_max_position(make_segment: MakeSegment) -> None:
    segment = make_segment(40)
    first, second = batch(50), batch(51)
    append(segment, first)
    append(segment, second)

    read = segment.read(50, 10_000, max_position=len(first))

    assert read is not None
    assert read.data == first
    assert segment.read(51, 10_000, max_position=len(first)) is None


# Case 7
def test_next_offset_is_last_offset_plus_one(make_segment: MakeSegment) -> None:
    segment = make_segment(40)
    assert segment.read_next_offset() == 40

    append(segment, batch(50, "hello", "there", "you"))

    assert segment.read_next_offset() == 53


# Case 8
def test_first_batch_timestamp(make_segment: MakeSegment) -> None:
    segment = make_segment(0)
    assert segment.first_batch_timestamp() == LONG_MAX

    append(segment, batch(0, timestamp=1000))
    append(segment, batch(1, timestamp=2000))

    assert segment.first_batch_timestamp() == 1000


# -- B. offset index, segment level --------------------------------------------------------------


# Case 30
def test_recovery_fixes_corrupt_offset_index(make_segment: MakeSegment) -> None:
    segment = make_segment(0)
    for offset in range(100):
        append(segment, batch(offset))
    index_path = segment.offset_index_path
    write_nonsense(index_path, 5, index_path.stat().st_size - 5, random.Random(30))
    with pytest.raises(CorruptIndexError):
        segment.offset_index.sanity_check(segment.size)

    assert segment.recover() == 0

    segment.offset_index.sanity_check(segment.size)
    assert segment.offset_index.entries == 99  # every batch but the first (interval 10 bytes)
    for offset in range(100):
        read = segment.read(offset, 1, max_position=segment.size, min_one_message=True)
        assert [h.base_offset for h in headers_of(read)] == [offset], f"read({offset})"


# Case 31. Kafka's log rolls a new segment at the incoming batch's first offset when its offsets
# cannot be relative to the active segment's base; the segment's part is refusing and asking to roll.
def test_offsets_past_int32_need_a_new_segment_at_the_batch_base(make_segment: MakeSegment) -> None:
    first = make_segment(0)
    append(first, batch(0))
    high = 2**31 + 1

    assert first.should_roll(**roll_params(max_offset=high + 2, now_ms=NOW_MS))
    with pytest.raises(OffsetOverflowError):
        append(first, batch(high))

    first.on_become_inactive()
    second = make_segment(high)
    for offset in (high, high + 1, high + 2):
        append(second, batch(offset))
    first.close()
    second.close()

    for base, next_offset in [(0, 1), (high, high + 3)]:
        reopened = make_segment(base, active=False)
        reopened.offset_index.sanity_check(reopened.size)
        assert reopened.offset_index.last_offset >= base
        assert reopened.read_next_offset() == next_offset


# Case 32. Ten appends with an interval just below the batch size index every batch but the first.
def test_index_trimmed_on_roll_and_resized_on_truncation(make_segment: MakeSegment) -> None:
    size = len(batch(0))
    segment = make_segment(0, index_interval_bytes=size - 1)
    for offset in range(10):
        append(segment, batch(offset))
    assert segment.offset_index.max_entries == MAX_INDEX_BYTES // OFFSET_INDEX_DTYPE.itemsize

    segment.on_become_inactive()
    assert segment.offset_index.entries == 9
    assert segment.offset_index.max_entries == 9
    assert segment.offset_index_path.stat().st_size == 9 * OFFSET_INDEX_DTYPE.itemsize

    segment.truncate_to(0, NOW_MS)
    assert segment.offset_index.entries == 0
    assert segment.offset_index.max_entries == MAX_INDEX_BYTES // OFFSET_INDEX_DTYPE.itemsize
    assert segment.time_index.max_entries == MAX_INDEX_BYTES // TIME_INDEX_DTYPE.itemsize


# Case 32 (the rule behind it: an entry once *more than* index.interval.bytes were appended since
# the last, so with an interval of exactly one batch every second batch is indexed)
def test_index_entry_needs_more_than_the_interval_since_the_last(make_segment: MakeSegment) -> None:
    size = len(batch(0))
    segment = make_segment(0, index_interval_bytes=size)
    for offset in range(7):
        append(segment, batch(offset))

    entries = [segment.offset_index.entry(n) for n in range(segment.offset_index.entries)]
    assert entries == [OffsetPosition(2, 2 * size), OffsetPosition(4, 4 * size), OffsetPosition(6, 6 * size)]


# Case 33 (with 49): a follower truncates into a segment whose indexes were trimmed to 0 bytes
def test_truncating_reopened_empty_segment_resizes_its_indexes(make_segment: MakeSegment) -> None:
    segment = make_segment(0)
    assert segment.offset_index.entries == 0  # load the indexes so that closing trims them
    segment.close()
    assert segment.offset_index_path.stat().st_size == 0
    assert segment.time_index_path.stat().st_size == 0

    reopened = make_segment(0, active=False)
    reopened.truncate_to(57, NOW_MS + 500)

    assert not reopened.offset_index.is_full
    assert not reopened.time_index.is_full
    assert not reopened.should_roll(**roll_params(max_offset=100, now_ms=NOW_MS + 500))


# -- C. time index, segment level -------------------------------------------------------------------


# Case 41. Kafka passes the largest timestamp beside the records (= offset) while the records say
# offset × 10; the engine takes timestamps from the batch only, so the index holds offset × 10.
def test_truncation_reloads_largest_timestamp_and_next_offset(make_segment: MakeSegment) -> None:
    segment = make_segment(40, index_interval_bytes=2 * len(batch(0)) - 1)
    for offset in range(40, 70):
        append(segment, batch(offset))
    assert segment.read_next_offset() == 70
    assert segment.time_index.entries == 30 // 2 - 1

    segment.truncate_to(41, NOW_MS)

    assert segment.time_index.entries == 0
    assert segment.max_timestamp_so_far == TimestampOffset(400, 40)
    assert segment.read_next_offset() == 41


def _segment_40_to_49(make_segment: MakeSegment) -> LogSegment:
    """Offsets 40..49 with timestamps 400..490, an index entry every second batch."""
    segment = make_segment(40, index_interval_bytes=2 * len(batch(0)) - 1)
    for offset in range(40, 50):
        append(segment, batch(offset))
    return segment


# Case 42
@pytest.mark.parametrize(
    ("timestamp", "expected_offset"),
    [(420, 42), (421, 43), (430, 43), (431, 44), (491, None), (401, 41), (399, 40)],
    ids=["indexed", "after-indexed", "unindexed", "after-unindexed", "beyond-last", "before-first-entry", "first"],
)
def test_find_offset_by_timestamp_is_first_record_at_or_after(
    make_segment: MakeSegment, timestamp: int, expected_offset: int | None
) -> None:
    segment = _segment_40_to_49(make_segment)
    assert segment.largest_timestamp == 490

    found = segment.find_offset_by_timestamp(timestamp, segment.base_offset)

    assert (found.offset if found is not None else None) == expected_offset
    if found is not None and expected_offset is not None:
        assert found.timestamp == expected_offset * 10


# Case 43
def test_recovery_fixes_corrupt_time_index(make_segment: MakeSegment) -> None:
    segment = make_segment(0)
    for offset in range(100):
        append(segment, batch(offset))
    index_path = segment.time_index_path
    write_nonsense(index_path, 0, index_path.stat().st_size, random.Random(43))
    with pytest.raises(CorruptIndexError):
        segment.time_index.sanity_check()

    segment.recover()

    segment.time_index.sanity_check()
    for offset in range(100):
        found = segment.find_offset_by_timestamp(offset * 10, 0)
        assert found is not None and found.offset == offset, f"find({offset * 10})"
        after = segment.find_offset_by_timestamp(offset * 10 + 1, 0)
        assert (after.offset if after is not None else None) == (offset + 1 if offset < 99 else None)


# Case 44. The engine writes v2 only; records without timestamps (-1) stand for the pre-0.10 ones.
def test_rebuilt_time_index_without_timestamps_is_empty(make_segment: MakeSegment) -> None:
    segment = make_segment(0, active=False)
    for offset in range(10):
        append(segment, batch(offset, timestamp=NO_TIMESTAMP))
    segment.close()
    segment.time_index_path.unlink()

    reopened = make_segment(0, active=False)
    reopened.recover()

    assert reopened.time_index.entries == 0
    assert reopened.time_index_path.stat().st_size == 0
    assert reopened.offset_index.entries == 9
    reopened.close()
    assert reopened.time_index_path.stat().st_size == 0


# Case 45. The closing entry (max timestamp, its offset) is added unless the last entry holds it.
@pytest.mark.parametrize(
    ("interval_batches", "closing_entry_added"), [(2, True), (1, False)], ids=["last-batch-unindexed", "indexed"]
)
def test_closing_adds_final_time_entry_and_reopen_keeps_indexes(
    make_segment: MakeSegment, interval_batches: int, closing_entry_added: bool
) -> None:
    interval = interval_batches * len(batch(0)) - 1
    segment = make_segment(0, index_interval_bytes=interval)
    for offset in range(10):
        append(segment, batch(offset))
    entries_while_active = segment.time_index.entries
    segment.close()

    reopened = make_segment(0, index_interval_bytes=interval, active=False)
    time_entries = reopened.time_index.entries
    assert time_entries == entries_while_active + (1 if closing_entry_added else 0)
    assert reopened.time_index.last_entry() == TimestampOffset(90, 9)
    offset_last, offset_entries = reopened.offset_index.last_entry(), reopened.offset_index.entries

    reopened.recover()  # as after an unclean shutdown with the recovery point at the end

    assert reopened.time_index.entries == time_entries
    assert reopened.time_index.last_entry() == TimestampOffset(90, 9)
    assert reopened.offset_index.entries == offset_entries
    assert reopened.offset_index.last_entry() == offset_last


# -- D. roll conditions ----------------------------------------------------------------------------


# Case 49
def test_empty_segment_rolls_only_when_next_offset_cannot_be_relative(make_segment: MakeSegment) -> None:
    max_segment_ms = 300_000
    segment = make_segment(0, created_ms=NOW_MS)
    later = NOW_MS + max_segment_ms + 1
    assert segment.time_waited_for_roll(later, NO_TIMESTAMP) == max_segment_ms + 1

    assert not segment.should_roll(**roll_params(max_offset=100, now_ms=later, max_segment_ms=max_segment_ms))
    assert segment.should_roll(**roll_params(max_offset=INT32_MAX + 200, now_ms=later, max_segment_ms=max_segment_ms))


# Case 49 (Kafka's truncateTo resets the creation time whenever the segment is empty afterwards,
# also when there was nothing to remove)
def test_truncating_reopened_empty_segment_resets_creation_time(make_segment: MakeSegment) -> None:
    segment = make_segment(0, created_ms=NOW_MS)
    assert segment.offset_index.entries == 0
    segment.close()
    reopened = make_segment(0, created_ms=NOW_MS, active=False)

    reopened.truncate_to(57, NOW_MS + 500)

    assert reopened.time_waited_for_roll(NOW_MS + 500, NO_TIMESTAMP) == 0


# Case 50. Kafka appends with "no timestamp" beside the records, so roll time is wall-clock:
# the batch carries timestamp -1 here for the same effect.
def test_truncating_to_empty_resets_creation_time(make_segment: MakeSegment) -> None:
    segment = make_segment(40, created_ms=NOW_MS)
    data = batch(40, "hello", "there", timestamp=NO_TIMESTAMP)
    append(segment, data)
    assert segment.time_waited_for_roll(NOW_MS + 500, NO_TIMESTAMP) == 500

    segment.truncate_to(0, NOW_MS + 500)

    assert segment.time_waited_for_roll(NOW_MS + 500, NO_TIMESTAMP) == 0
    assert not segment.time_index.is_full
    assert not segment.offset_index.is_full
    assert segment.read(0, 1024) is None
    append(segment, data)
    assert segment.read_next_offset() == 42


# -- E. recovery and truncation --------------------------------------------------------------------


# Case 55
@pytest.mark.parametrize("seed", range(10))
def test_recovery_truncates_at_first_corrupt_batch(make_segment: MakeSegment, seed: int) -> None:
    segment = make_segment(0)
    batches = [batch(offset) for offset in range(20)]
    for data in batches:
        append(segment, data)
    rng = random.Random(seed)
    corrupt_from = rng.randrange(20)
    valid_bytes = sum(map(len, batches[:corrupt_from]))
    position = valid_bytes + rng.randrange(15)
    write_nonsense(segment.log_path, position, segment.size - position, rng)

    truncated = segment.recover()

    assert truncated == sum(map(len, batches)) - valid_bytes
    assert segment.size == valid_bytes == segment.log_path.stat().st_size
    assert [bytes(b) for _, b in segment.iter_batches()] == batches[:corrupt_from]
    assert segment.read_next_offset() == corrupt_from
    segment.offset_index.sanity_check(segment.size)
    segment.time_index.sanity_check()
    assert segment.time_index.last_entry().offset < max(corrupt_from, 1)


# Case 69
def test_truncate_to_offset_in_gap_removes_the_batch_after_it(make_segment: MakeSegment) -> None:
    segment = make_segment(40)
    append(segment, batch(40, "first message"))
    append(segment, batch(43, "message after gap"))

    segment.truncate_to(41, NOW_MS)

    read = segment.read(40, 10_000)
    assert [h.base_offset for h in headers_of(read)] == [40]
    assert values_of(read) == [(40, b"first message")]


# Case 70
def test_truncate_off_last_batch_repeatedly(make_segment: MakeSegment) -> None:
    segment = make_segment(40)
    for offset in range(40, 70):
        append(segment, batch(offset, f"m{offset}"))
        append(segment, batch(offset + 1, f"m{offset + 1}"))
        both = [(offset, f"m{offset}".encode()), (offset + 1, f"m{offset + 1}".encode())]
        assert values_of(segment.read(offset, 10_000)) == both

        segment.truncate_to(offset + 1, NOW_MS)

        read = segment.read(offset, 10_000)
        assert len(headers_of(read)) == 1
        assert values_of(read) == both[:1]
    assert segment.read_next_offset() == 70
    segment.offset_index.sanity_check(segment.size)
    segment.time_index.sanity_check()


def test_read_cached_reads_only_what_the_os_holds_in_memory(tmp_path: Path) -> None:
    path = tmp_path / "file"
    path.write_bytes(bytes(range(256)) * 64)
    fd = os.open(path, os.O_RDONLY)
    try:
        refused_when_uncached(fd, lambda: read_cached(fd, 4096, 100), (bytes(range(256)) * 64)[4096:4196])
        os.pread(fd, 16384, 0)  # now they are in memory
        try:
            data = read_cached(fd, 4096, 100)
        except BlockingIOError:
            pytest.skip(f"{tmp_path}: the file system does not read with RWF_NOWAIT")
        assert data == (bytes(range(256)) * 64)[4096:4196]
        assert read_cached(fd, 16380, 100) == bytes(range(252, 256))  # short at the end
        assert read_cached(fd, 20000, 10) == b""
    finally:
        os.close(fd)


def test_read_ahead_advice_has_its_own_descriptor_and_gives_up_quietly(tmp_path: Path, monkeypatch) -> None:
    """A long scan asks a thread of its own to read the file ahead: through a descriptor of its
    own (the scan's may be closed first), closed once the advice is given; with no descriptor
    to be had (EMFILE) there is no advice, and no error."""
    path = tmp_path / "data"
    path.write_bytes(os.urandom(1 << 20))
    open_before = len(os.listdir("/proc/self/fd"))
    advice = _ReadAheadAdvice()
    for _ in range(20):
        fd = os.open(path, os.O_RDONLY)
        advice.read_ahead(fd, 0, 1 << 20)
        os.close(fd)
    deadline = time.monotonic() + 10
    while len(os.listdir("/proc/self/fd")) > open_before:
        assert time.monotonic() < deadline, "the advice thread keeps its descriptors"
        time.sleep(0.01)

    def no_descriptor(fd: int) -> int:
        raise OSError(errno.EMFILE, "Too many open files")

    monkeypatch.setattr(os, "dup", no_descriptor)
    fd = os.open(path, os.O_RDONLY)
    try:
        advice.read_ahead(fd, 0, 1 << 20)
    finally:
        os.close(fd)


def test_iter_headers_reads_a_window_after_small_batches_and_a_header_after_large_ones(
    make_segment: MakeSegment, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Headers read alone are the headers of the whole batches, from any batch and up to any
    end: batches of one byte to 200 KB, each side of the 8 KiB turn-over. A scan reads a
    header a large batch, a window of headers where small batches come in a row, and wastes
    little where sizes alternate."""
    rng = random.Random(7)
    segment = make_segment(0, index_interval_bytes=4096)
    offset, sizes = 0, [1, 100, 8000, 8300, 200_000, 50, 9000, 3, 120_000, 120_000, 10, 10, 10]
    for size in sizes + [rng.choice([20, 300, 7000, 9000, 70_000]) for _ in range(200)]:
        count = max(1, size // 1000)
        data = batch(offset, *("x" * (size // count),) * count)
        append(segment, data)
        offset += count
    whole = [header for header, _ in segment.iter_batches()]
    assert list(segment.iter_headers()) == whole
    for first in [0, 1, 4, 5, 11, 100, len(whole) - 1]:
        for last in [first, first + 3, len(whole) - 1]:
            end = whole[min(last, len(whole) - 1)].next_position - (last % 2)  # the last batch cut short, or not
            expected = [h for h in whole[first:] if h.next_position <= end]
            assert list(segment.iter_headers(whole[first].position, end)) == expected, (first, last)

    def filled(base: int, pattern: list[int], times: int) -> LogSegment:
        """A segment of batches of these record counts (2 KB records: 1 → 2 KB, 50 → 100 KB)."""
        segment = make_segment(base, index_interval_bytes=1 << 20)
        for n, count in enumerate(pattern * times):
            append(segment, batch(base + 100 * n, *("y" * 2000,) * count))
        return segment

    large = filled(1_000_000, [50], 40)  # 100 KB batches
    alternating = filled(2_000_000, [1, 50], 100)  # a small batch, a large one
    two_small = filled(3_000_000, [1, 1, 50], 60)  # two small, a large one
    tiny = make_segment(4_000_000, index_interval_bytes=4096)
    for n in range(3000):
        append(tiny, batch(4_000_000 + n, "z" * 60))  # one record each, about 130 bytes
    read = reads = 0
    real_pread = os.pread

    def counted(fd: int, length: int, position: int) -> bytes:
        nonlocal read, reads
        data = real_pread(fd, length, position)
        read, reads = read + len(data), reads + 1
        return data

    def scanned(segment: LogSegment, batches: int) -> tuple[int, int]:
        """(bytes, reads) of a scan of the segment's headers."""
        nonlocal read, reads
        read = reads = 0
        assert len(list(segment.iter_headers())) == batches
        return read, reads

    monkeypatch.setattr(os, "pread", counted)
    assert scanned(large, 40) == (40 * 61, 40)  # a header a batch
    assert scanned(alternating, 200)[0] == 200 * 61  # no window: never two small batches in a row
    assert scanned(two_small, 180)[0] <= 60 * (2 * 61 + 4096)  # a first window's waste at most, each time
    assert scanned(tiny, 3000)[1] <= tiny.size // (64 * 1024) + 8  # a read a window (growing to 64 KiB)


def test_a_segment_opened_for_reading_is_the_file_planned_or_none(make_segment: MakeSegment, tmp_path: Path) -> None:
    """What a Spark task reads by the positions its planning found: the `.log` planning
    measured (its (st_dev, st_ino)), checked as it is opened; a file swapped in under the name is
    ESTALE, a removed one FileNotFoundError, a link in its place UnsafeFileError."""
    segment = make_segment(0)
    batch = build_batch([b"a", b"b"], timestamps=NOW_MS)
    segment.append(batch, list(iter_batch_headers(batch)))
    segment.flush()
    status = os.stat(segment.log_path)
    planned = (status.st_dev, status.st_ino)
    reader = FileRecords.open_for_reading(segment.log_path, planned)
    try:
        assert [r.value for h, b in reader.checked_batches(0, segment.size) for r in decode_records(h, b)] == [
            b"a",
            b"b",
        ]
    finally:
        reader.close()
    copy = tmp_path / "copy"
    copy.write_bytes(segment.log_path.read_bytes())
    os.replace(copy, segment.log_path)  # (the same bytes, another file: what a compaction's swap leaves)
    with pytest.raises(OSError) as stale:
        FileRecords.open_for_reading(segment.log_path, planned)
    assert stale.value.errno == errno.ESTALE
    os.unlink(segment.log_path)
    with pytest.raises(FileNotFoundError):
        FileRecords.open_for_reading(segment.log_path, planned)
    os.symlink(tmp_path / "elsewhere.log", segment.log_path)
    with pytest.raises(UnsafeFileError):
        FileRecords.open_for_reading(segment.log_path, planned)
