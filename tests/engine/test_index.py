"""`.index` and `.timeindex`: Kafka's OffsetIndexTest and TimeIndexTest ported as cases
(Kafka's OffsetIndexTest and TimeIndexTest cases, case numbers in comments), then property tests of the look-ups
and of truncation against `bisect` models over random entries."""

from __future__ import annotations

import bisect
import random
from collections.abc import Callable, Iterator
from itertools import accumulate
from pathlib import Path

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from seglogfs.engine.errors import CorruptIndexError, IndexFullError, InvalidOffsetError, OffsetOverflowError
from seglogfs.engine.log.offset_index import OFFSET_INDEX_DTYPE, OffsetIndex, OffsetPosition
from seglogfs.engine.log.time_index import TIME_INDEX_DTYPE, TimeIndex, TimestampOffset
from seglogfs.engine.record.records import NO_TIMESTAMP

BASE = 45  # the base offset Kafka's index tests use
MAX_ENTRIES = 30
INT32_MAX = 2**31 - 1

MakeIndex = Callable[..., OffsetIndex | TimeIndex]


@pytest.fixture
def make_index(tmp_path: Path) -> Iterator[MakeIndex]:
    """Open a file-backed index of the given class; every index opened is closed at teardown."""
    opened: list[OffsetIndex | TimeIndex] = []

    def make(
        cls: type[OffsetIndex] | type[TimeIndex],
        *,
        base_offset: int = BASE,
        max_entries: int = MAX_ENTRIES,
        path: Path | None = None,
        writable: bool = True,
    ) -> OffsetIndex | TimeIndex:
        suffix = ".index" if cls is OffsetIndex else ".timeindex"
        path = path or tmp_path / f"{len(opened):020d}{suffix}"
        index = cls(path, base_offset, max_entries * cls.DTYPE.itemsize, writable=writable)
        opened.append(index)
        return index

    yield make
    for index in opened:
        index.close()


@pytest.fixture
def offset_index(make_index: MakeIndex) -> OffsetIndex:
    index = make_index(OffsetIndex)
    assert isinstance(index, OffsetIndex)
    return index


@pytest.fixture
def time_index(make_index: MakeIndex) -> TimeIndex:
    index = make_index(TimeIndex)
    assert isinstance(index, TimeIndex)
    return index


def monotonic_sequence(rng: random.Random, start: int, length: int) -> list[int]:
    """`length` strictly increasing values above `start`, with random gaps of 1..15."""
    return list(accumulate((rng.randint(1, 15) for _ in range(length)), initial=start))[1:]


def fill_time_index(index: TimeIndex, count: int) -> None:
    """Kafka's TimeIndexTest.appendEntries: (10·i, base + 10·i) for i = 1..count."""
    for i in range(1, count + 1):
        index.maybe_append(i * 10, index.base_offset + i * 10)


# -- B. offset index -------------------------------------------------------------------------------


# Case 21
def test_lookup_finds_largest_entry_at_or_below_target(offset_index: OffsetIndex) -> None:
    rng = random.Random(21)
    offsets = monotonic_sequence(rng, BASE, MAX_ENTRIES)
    positions = monotonic_sequence(rng, 0, MAX_ENTRIES)
    for offset, position in zip(offsets, positions, strict=True):
        offset_index.append(offset, position)

    for offset, position in zip(offsets, positions, strict=True):
        assert offset_index.lookup(offset) == OffsetPosition(offset, position)
    for target in rng.sample(range(BASE - 5, offsets[-1] + 20), 30):
        slot = bisect.bisect_right(offsets, target) - 1
        expected = OffsetPosition(offsets[slot], positions[slot]) if slot >= 0 else OffsetPosition(BASE, 0)
        assert offset_index.lookup(target) == expected, f"lookup({target})"
    assert offset_index.lookup(offsets[0] - 1) == OffsetPosition(BASE, 0)


# Case 22
def test_lookup_on_empty_and_full_index(offset_index: OffsetIndex) -> None:
    assert offset_index.lookup(BASE) == OffsetPosition(BASE, 0)

    for i in range(offset_index.max_entries):
        offset_index.append(BASE + i + 1, i)

    assert offset_index.is_full
    assert offset_index.lookup(BASE) == OffsetPosition(BASE, 0)
    last = OffsetPosition(BASE + offset_index.max_entries, offset_index.max_entries - 1)
    assert offset_index.lookup(BASE + offset_index.max_entries) == last


# Case 23
def test_entry_returns_nth_pair_in_absolute_offsets(offset_index: OffsetIndex) -> None:
    for i in range(4):
        offset_index.append(BASE + 3 * i + 1, 100 * i)

    assert [offset_index.entry(n) for n in range(4)] == [
        OffsetPosition(46, 0),
        OffsetPosition(49, 100),
        OffsetPosition(52, 200),
        OffsetPosition(55, 300),
    ]


# Case 23
def test_entry_outside_the_entries_in_use_raises(offset_index: OffsetIndex) -> None:
    with pytest.raises(IndexError):
        offset_index.entry(0)
    offset_index.append(BASE + 1, 0)
    with pytest.raises(IndexError):
        offset_index.entry(1)
    with pytest.raises(IndexError):
        offset_index.entry(-1)


# Case 24
def test_append_to_full_offset_index_raises(offset_index: OffsetIndex) -> None:
    for i in range(offset_index.max_entries):
        offset_index.append(BASE + i + 1, i)

    with pytest.raises(IndexFullError):
        offset_index.append(BASE + offset_index.max_entries + 1, offset_index.max_entries)
    assert offset_index.entries == MAX_ENTRIES


# Case 25
@pytest.mark.parametrize("second_offset", [50, 51], ids=["lower", "equal"])
def test_append_must_increase_the_offset(offset_index: OffsetIndex, second_offset: int) -> None:
    offset_index.append(51, 0)

    with pytest.raises(InvalidOffsetError):
        offset_index.append(second_offset, 1)
    assert offset_index.entries == 1
    assert offset_index.last_entry() == OffsetPosition(51, 0)


# Case 27
def test_reopened_read_only_index_keeps_entries_and_refuses_appends(tmp_path: Path, make_index: MakeIndex) -> None:
    path = tmp_path / f"{BASE:020d}.index"
    writer = make_index(OffsetIndex, path=path)
    assert isinstance(writer, OffsetIndex)
    writer.append(51, 0)
    writer.append(52, 1)
    writer.close()
    assert path.stat().st_size == 2 * OFFSET_INDEX_DTYPE.itemsize  # closing trims the preallocated tail

    reader = make_index(OffsetIndex, path=path, writable=False)
    assert isinstance(reader, OffsetIndex)
    assert reader.lookup(51) == OffsetPosition(51, 0)
    assert reader.lookup(52) == OffsetPosition(52, 1)
    assert reader.last_offset == 52
    assert reader.entries == 2
    with pytest.raises(InvalidOffsetError, match="read-only"):
        reader.append(53, 2)
    assert reader.entries == 2


# Case 28
def test_truncate_to_removes_entries_at_or_above_offset(make_index: MakeIndex) -> None:
    index = make_index(OffsetIndex, base_offset=0, max_entries=10)
    assert isinstance(index, OffsetIndex)
    index.truncate()
    for i in range(1, 10):
        index.append(i, i)

    index.truncate_to(12)
    assert index.lookup(10) == OffsetPosition(9, 9)
    assert index.last_offset == 9

    index.append(10, 10)
    index.truncate_to(10)
    assert index.lookup(10) == OffsetPosition(9, 9)
    assert index.last_offset == 9

    index.append(10, 10)
    index.truncate_to(9)
    assert index.lookup(10) == OffsetPosition(8, 8)
    assert index.last_offset == 8

    index.append(9, 9)
    index.truncate_to(5)
    assert index.lookup(10) == OffsetPosition(4, 4)
    assert index.last_offset == 4

    index.append(5, 5)
    index.truncate()
    assert index.entries == 0
    index.append(0, 0)
    assert index.entries == 1


# Case 29
def test_sanity_check_accepts_entry_at_the_base_offset(tmp_path: Path, make_index: MakeIndex) -> None:
    path = tmp_path / f"{20:020d}.index"
    index = make_index(OffsetIndex, base_offset=20, max_entries=10, path=path)
    assert isinstance(index, OffsetIndex)
    index.append(20, 0)
    index.sanity_check()
    assert index.last_offset == 20
    index.close()

    reopened = make_index(OffsetIndex, base_offset=20, max_entries=10, path=path)
    assert isinstance(reopened, OffsetIndex)
    reopened.sanity_check(log_size_bytes=100)
    assert reopened.entries == 1


# Case 31 (index level): a relative offset must fit a signed 32-bit int
@pytest.mark.parametrize("cls", [OffsetIndex, TimeIndex])
@pytest.mark.parametrize("offset", [2**31 + 1, -1], ids=["above-int32", "below-base"])
def test_append_of_offset_not_relative_to_base_overflows(
    make_index: MakeIndex, cls: type[OffsetIndex] | type[TimeIndex], offset: int
) -> None:
    index = make_index(cls, base_offset=0)
    with pytest.raises(OffsetOverflowError):
        if isinstance(index, OffsetIndex):
            index.append(offset, 0)
        else:
            index.maybe_append(100, offset)
    assert index.entries == 0


# Case 31 (index level)
def test_entry_at_largest_relative_offset_round_trips(tmp_path: Path, make_index: MakeIndex) -> None:
    base = 2**31 + 1
    path = tmp_path / f"{base:020d}.index"
    index = make_index(OffsetIndex, base_offset=base, path=path)
    assert isinstance(index, OffsetIndex)
    index.append(base + INT32_MAX, 73)
    index.close()

    reopened = make_index(OffsetIndex, base_offset=base, path=path, writable=False)
    assert isinstance(reopened, OffsetIndex)
    assert reopened.last_entry() == OffsetPosition(base + INT32_MAX, 73)
    assert reopened.lookup(base + INT32_MAX + 10) == OffsetPosition(base + INT32_MAX, 73)


# -- C. time index --------------------------------------------------------------------------------


# Case 34
def test_time_lookup_on_empty_index_is_base_offset(time_index: TimeIndex) -> None:
    assert time_index.lookup(100) == TimestampOffset(NO_TIMESTAMP, BASE)


# Case 34
@pytest.mark.parametrize(
    ("target", "expected"),
    [
        (9, TimestampOffset(NO_TIMESTAMP, BASE)),
        (10, TimestampOffset(10, 55)),
        (25, TimestampOffset(20, 65)),
        (30, TimestampOffset(30, 75)),
        (10_000, TimestampOffset(290, 335)),
    ],
    ids=["before-first", "first", "between", "exact", "after-last"],
)
def test_time_lookup_finds_largest_timestamp_at_or_below_target(
    time_index: TimeIndex, target: int, expected: TimestampOffset
) -> None:
    fill_time_index(time_index, MAX_ENTRIES - 1)

    assert time_index.lookup(target) == expected


# Case 35
def test_time_entry_returns_nth_pair(time_index: TimeIndex) -> None:
    fill_time_index(time_index, MAX_ENTRIES - 1)

    assert [time_index.entry(n) for n in range(4)] == [
        TimestampOffset(10, 55),
        TimestampOffset(20, 65),
        TimestampOffset(30, 75),
        TimestampOffset(40, 85),
    ]


# Case 35
def test_time_entry_outside_the_entries_in_use_raises(time_index: TimeIndex) -> None:
    with pytest.raises(IndexError):
        time_index.entry(0)
    fill_time_index(time_index, 2)
    with pytest.raises(IndexError):
        time_index.entry(2)


# Case 36
def test_time_truncate_and_truncate_to(time_index: TimeIndex) -> None:
    fill_time_index(time_index, MAX_ENTRIES - 1)
    time_index.truncate()
    assert time_index.entries == 0

    fill_time_index(time_index, MAX_ENTRIES - 1)
    time_index.truncate_to(BASE + 10)  # the first entry's offset
    assert time_index.entries == 0
    assert time_index.last_entry() == TimestampOffset(NO_TIMESTAMP, BASE)


# Case 36 (beyond Kafka's test: a cut between entries keeps the ones below it)
def test_time_truncate_to_between_entries_keeps_lower_entries(time_index: TimeIndex) -> None:
    fill_time_index(time_index, 5)

    time_index.truncate_to(BASE + 31)

    assert time_index.entries == 3
    assert time_index.last_entry() == TimestampOffset(30, BASE + 30)
    time_index.maybe_append(35, BASE + 31)
    assert time_index.last_entry() == TimestampOffset(35, BASE + 31)


# Case 37
def test_time_append_to_full_index(time_index: TimeIndex) -> None:
    fill_time_index(time_index, MAX_ENTRIES - 1)
    assert time_index.is_full

    with pytest.raises(IndexFullError):
        time_index.maybe_append(10_000, BASE + 1000)
    with pytest.raises(InvalidOffsetError):
        time_index.maybe_append(10_000, (MAX_ENTRIES - 2) * 10, skip_full_check=True)
    assert time_index.entries == MAX_ENTRIES - 1

    time_index.maybe_append(10_000, BASE + 1000, skip_full_check=True)
    assert time_index.entries == MAX_ENTRIES
    assert time_index.last_entry() == TimestampOffset(10_000, BASE + 1000)


# Case 37 (the engine's rule, as Kafka's: an entry is only added when its timestamp is higher)
def test_time_append_skips_timestamp_not_above_last(time_index: TimeIndex) -> None:
    time_index.maybe_append(100, BASE + 1)
    time_index.maybe_append(100, BASE + 2)

    assert time_index.entries == 1
    assert time_index.last_entry() == TimestampOffset(100, BASE + 1)
    with pytest.raises(InvalidOffsetError):
        time_index.maybe_append(99, BASE + 3)


def _write_time_index(path: Path, entries: list[tuple[int, int]], extra: bytes = b"") -> None:
    path.write_bytes(np.array(entries, dtype=TIME_INDEX_DTYPE).tobytes() + extra)


# Case 38
def test_time_sanity_check_accepts_valid_file(tmp_path: Path, make_index: MakeIndex) -> None:
    path = tmp_path / f"{BASE:020d}.timeindex"
    _write_time_index(path, [(10 * i, 10 * i) for i in range(1, 6)])

    index = make_index(TimeIndex, path=path, writable=False)
    index.sanity_check()
    assert index.entries == 5


# Case 38
@pytest.mark.parametrize(
    ("entries", "extra"),
    [
        ([(10, 10), (20, 20), (30, 30), (40, 40), (50, -1)], b""),
        ([(-5, -1)], b""),
        ([(10, 10), (20, 20), (30, 30), (40, 40), (9, 50)], b""),
        ([(10, 10), (20, 20), (30, 30), (40, 40), (50, 50)], b"\x00"),
    ],
    ids=["last-offset-below-base", "single-entry-below-base", "last-timestamp-below-first", "length-not-12n"],
)
def test_time_sanity_check_rejects_damaged_file(
    tmp_path: Path, make_index: MakeIndex, entries: list[tuple[int, int]], extra: bytes
) -> None:
    path = tmp_path / f"{BASE:020d}.timeindex"
    _write_time_index(path, entries, extra)

    index = make_index(TimeIndex, path=path, writable=False)
    with pytest.raises(CorruptIndexError):
        index.sanity_check()


# Case 39
def test_time_last_entry(time_index: TimeIndex) -> None:
    assert time_index.last_entry() == TimestampOffset(NO_TIMESTAMP, BASE)

    time_index.maybe_append(1, BASE + 1)

    assert time_index.last_entry() == TimestampOffset(1, BASE + 1)


# Case 40
def test_time_index_keeps_one_slot_free_for_the_closing_entry(time_index: TimeIndex) -> None:
    assert TIME_INDEX_DTYPE.itemsize == 12
    assert time_index.max_entries == MAX_ENTRIES

    fill_time_index(time_index, MAX_ENTRIES - 2)
    assert not time_index.is_full
    time_index.maybe_append(10_000, BASE + 10_000)
    assert time_index.entries == MAX_ENTRIES - 1
    assert time_index.is_full


# Case 40
@pytest.mark.parametrize("cls", [OffsetIndex, TimeIndex])
def test_resize_reports_whether_the_length_changed(
    make_index: MakeIndex, cls: type[OffsetIndex] | type[TimeIndex]
) -> None:
    index = make_index(cls)
    full_size = index.max_index_bytes
    assert full_size == MAX_ENTRIES * cls.DTYPE.itemsize

    assert not index.resize(full_size)
    assert index.resize(full_size // 2)
    assert index.max_entries == MAX_ENTRIES // 2
    assert index.resize(full_size)
    assert index.max_entries == MAX_ENTRIES
    assert index.path is not None
    assert index.path.stat().st_size == full_size


# -- properties against bisect models ------------------------------------------------------------


@st.composite
def offset_index_contents(draw: st.DrawFn) -> tuple[int, list[int], list[int]]:
    """(base offset, strictly increasing absolute offsets, non-decreasing positions)."""
    base = draw(st.integers(0, 2**40))
    relative = sorted(draw(st.sets(st.integers(0, INT32_MAX), max_size=40)))
    gaps = draw(st.lists(st.integers(0, 2**20), min_size=len(relative), max_size=len(relative)))
    return base, [base + r for r in relative], list(accumulate(gaps))


def offset_targets(base: int, offsets: list[int]) -> st.SearchStrategy[list[int]]:
    """Targets anywhere (below the base, past the last relative offset) and next to each entry."""
    near = [base - 1, base, base + INT32_MAX, base + INT32_MAX + 1]
    near += [o + d for o in offsets for d in (-1, 0, 1)]
    return st.lists(st.one_of(st.integers(base - 2**33, base + 2**33), st.sampled_from(near)), max_size=60)


def model_offset_lookup(base: int, offsets: list[int], positions: list[int], target: int) -> OffsetPosition:
    slot = bisect.bisect_right(offsets, target) - 1
    return OffsetPosition(offsets[slot], positions[slot]) if slot >= 0 else OffsetPosition(base, 0)


def filled_offset_index(base: int, offsets: list[int], positions: list[int], spare: int = 0) -> OffsetIndex:
    """An in-memory index (anonymous mapping, the same code as a file-backed one) holding the entries."""
    index = OffsetIndex(None, base, (len(offsets) + spare) * OFFSET_INDEX_DTYPE.itemsize, writable=True)
    for offset, position in zip(offsets, positions, strict=True):
        index.append(offset, position)
    return index


@given(contents=offset_index_contents(), data=st.data())
@settings(deadline=None)
def test_offset_lookup_matches_bisect_model(contents: tuple[int, list[int], list[int]], data: st.DataObject) -> None:
    base, offsets, positions = contents
    targets = data.draw(offset_targets(base, offsets), label="targets")
    index = filled_offset_index(base, offsets, positions)
    try:
        expected = [model_offset_lookup(base, offsets, positions, t) for t in targets]
        assert [index.lookup(t) for t in targets] == expected
    finally:
        index.close()


@given(contents=offset_index_contents(), data=st.data())
@settings(deadline=None)
def test_first_entry_at_or_after_an_offset_or_a_position_matches_bisect(
    contents: tuple[int, list[int], list[int]], data: st.DataObject
) -> None:
    """The ceiling look-ups planning cuts a segment by: the first entry at or above an offset,
    or at or past a position (positions never fall along an index)."""
    base, offsets, positions = contents
    targets = data.draw(offset_targets(base, offsets), label="targets")
    index = filled_offset_index(base, offsets, positions)
    try:
        for target in targets:
            slot = bisect.bisect_left(offsets, target)
            expected = OffsetPosition(offsets[slot], positions[slot]) if slot < len(offsets) else None
            assert index.first_at_or_after(target) == expected, target
        for target in [-1, 0, *positions, *(p + 1 for p in positions), 2**31]:
            slot = bisect.bisect_left(positions, target)
            expected = OffsetPosition(offsets[slot], positions[slot]) if slot < len(positions) else None
            assert index.first_at_or_past_position(target) == expected, target
    finally:
        index.close()


@st.composite
def time_index_contents(draw: st.DrawFn) -> tuple[int, list[int], list[int]]:
    """(base offset, strictly increasing timestamps ≥ 0, non-decreasing absolute offsets)."""
    base = draw(st.integers(0, 2**40))
    timestamps = sorted(draw(st.sets(st.integers(0, 2**50), max_size=40)))
    steps = draw(st.lists(st.integers(0, 1000), min_size=len(timestamps), max_size=len(timestamps)))
    return base, timestamps, [base + r for r in accumulate(steps)]


def filled_time_index(base: int, timestamps: list[int], offsets: list[int], spare: int = 1) -> TimeIndex:
    """In memory; one slot more than the entries, since a time index keeps its last slot free."""
    index = TimeIndex(None, base, (len(timestamps) + spare) * TIME_INDEX_DTYPE.itemsize, writable=True)
    for timestamp, offset in zip(timestamps, offsets, strict=True):
        index.maybe_append(timestamp, offset)
    return index


@given(contents=time_index_contents(), data=st.data())
@settings(deadline=None)
def test_time_lookup_matches_bisect_model(contents: tuple[int, list[int], list[int]], data: st.DataObject) -> None:
    base, timestamps, offsets = contents
    near = [NO_TIMESTAMP, 0, *(t + d for t in timestamps for d in (-1, 0, 1))]
    targets = data.draw(st.lists(st.one_of(st.integers(-10, 2**50 + 10), st.sampled_from(near)), max_size=60))
    index = filled_time_index(base, timestamps, offsets)
    try:
        assert index.entries == len(timestamps)
        for target in targets:
            slot = bisect.bisect_right(timestamps, target) - 1
            expected = TimestampOffset(timestamps[slot], offsets[slot]) if slot >= 0 else TimestampOffset(-1, base)
            assert index.lookup(target) == expected, f"lookup({target})"
    finally:
        index.close()


@st.composite
def offset_index_truncations(draw: st.DrawFn) -> tuple[int, list[int], list[int], list[int]]:
    """Offset-index contents and a few truncation points, near entries and the relative-offset edges."""
    base, offsets, positions = draw(offset_index_contents())
    return base, offsets, positions, draw(truncation_points(base, offsets))


@st.composite
def time_index_truncations(draw: st.DrawFn) -> tuple[int, list[int], list[int], list[int]]:
    base, timestamps, offsets = draw(time_index_contents())
    return base, timestamps, offsets, draw(truncation_points(base, offsets))


def truncation_points(base: int, offsets: list[int]) -> st.SearchStrategy[list[int]]:
    near = [base - 1, base, base + INT32_MAX, base + INT32_MAX + 1, *(o + d for o in offsets for d in (0, 1))]
    return st.lists(st.one_of(st.integers(base - 10, base + INT32_MAX + 10), st.sampled_from(near)), max_size=4)


# Pinned: an entry at the largest relative offset (2^31-1) lies below a cut one above it, so
# truncation keeps it (Kafka compares absolute offsets).
@given(case=offset_index_truncations())
@example(case=(0, [INT32_MAX], [0], [INT32_MAX + 1]))
@settings(deadline=None)
def test_offset_truncate_to_matches_model(case: tuple[int, list[int], list[int], list[int]]) -> None:
    base, offsets, positions, cuts = case
    index = filled_offset_index(base, offsets, positions, spare=1)
    try:
        kept = list(zip(offsets, positions, strict=True))
        for cut in cuts:
            index.truncate_to(cut)
            kept = [(o, p) for o, p in kept if o < cut]
            assert index.entries == len(kept), f"after truncate_to({cut})"
            assert [index.entry(n) for n in range(index.entries)] == [OffsetPosition(o, p) for o, p in kept]
            assert index.last_entry() == (OffsetPosition(*kept[-1]) if kept else OffsetPosition(base, 0))
        # The index accepts appends again from just above what it kept.
        next_offset = kept[-1][0] + 1 if kept else base
        if next_offset - base <= INT32_MAX:
            next_position = kept[-1][1] if kept else 0
            index.append(next_offset, next_position)
            assert index.last_entry() == OffsetPosition(next_offset, next_position)
    finally:
        index.close()


@given(case=time_index_truncations())
@example(case=(0, [100], [INT32_MAX], [INT32_MAX + 1]))
@settings(deadline=None)
def test_time_truncate_to_matches_model(case: tuple[int, list[int], list[int], list[int]]) -> None:
    base, timestamps, offsets, cuts = case
    index = filled_time_index(base, timestamps, offsets, spare=2)
    try:
        kept = list(zip(timestamps, offsets, strict=True))
        for cut in cuts:
            index.truncate_to(cut)
            kept = [(t, o) for t, o in kept if o < cut]
            assert index.entries == len(kept), f"after truncate_to({cut})"
            assert [index.entry(n) for n in range(index.entries)] == [TimestampOffset(t, o) for t, o in kept]
            assert index.last_entry() == (TimestampOffset(*kept[-1]) if kept else TimestampOffset(-1, base))
        next_timestamp, next_offset = (kept[-1][0] + 1, kept[-1][1]) if kept else (0, base)
        index.maybe_append(next_timestamp, next_offset)
        assert index.last_entry() == TimestampOffset(next_timestamp, next_offset)
    finally:
        index.close()
