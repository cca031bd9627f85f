"""The process-wide cache of open segment files (engine.log.handles) and the segment's leases: the
budget holds however many segments are read, leased and pinned segments keep their files, a
release under a reader waits for it (without blocking the writer), and reads racing evictions
and releases read the right bytes."""

from __future__ import annotations

import errno
import os
import random
import resource
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from seglogfs.engine import DataDir, PartitionLog
from seglogfs.engine.errors import ConfigError
from seglogfs.engine.log import handles as handles_module
from seglogfs.engine.log.handles import (
    FDS_PER_SEGMENT,
    MAX_OPEN_SEGMENTS_ENV,
    OPEN_SEGMENTS,
    default_max_open_segments,
    max_open_segments,
    set_max_open_segments,
)
from seglogfs.engine.log.segment import LogSegment
from seglogfs.engine.record.builder import build_batch
from seglogfs.engine.record.records import BatchHeader
from tests.conftest import NOW_MS, REPO, assert_log_dir_valid, broker_config

SEGMENTS = 120


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def value(offset: int) -> bytes:
    return b"value-%06d-" % offset + bytes([65 + offset % 26]) * (offset % 40)


def build(log_dir: Path, segments: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """A topic `t` of one partition holding one record per segment (fsync is skipped: the data
    is the test's own)."""
    with monkeypatch.context() as patched:
        patched.setattr(os, "fsync", lambda fd: None)
        with DataDir.open(broker_config(log_dir, log_segment_bytes=100), now_ms=NOW_MS) as data_dir:
            data_dir.create_topic("t", 1, now_ms=NOW_MS)
            log = data_dir.partition("t", 0)
            for offset in range(segments):
                log.append_records([value(offset)], timestamps=[NOW_MS + offset], now_ms=NOW_MS)
            assert len(log.segments) == segments


def standalone(directory: Path, base_offset: int, count: int, **options: object) -> LogSegment:
    """A segment of `count` one-record batches written and sealed here, then opened anew."""
    directory.mkdir(exist_ok=True)
    settings: dict = {"index_interval_bytes": 0, "max_index_bytes": 4096, "created_ms": NOW_MS, **options}
    writer = LogSegment(directory, base_offset, writable=True, **settings)
    for offset in range(base_offset, base_offset + count):
        batch = build_batch([value(offset)], timestamps=[NOW_MS + offset], base_offset=offset)
        writer.append(batch, [BatchHeader.parse(batch)])
    writer.close()
    return LogSegment(directory, base_offset, writable=False, **settings)


@pytest.fixture
def budget() -> Iterator[Callable[[int | None], None]]:
    """Set the open-segment budget for the test (counting what other tests left open and
    pinned); the derived one comes back after it."""
    OPEN_SEGMENTS.shed(0)
    elsewhere = len(OPEN_SEGMENTS)  # pinned by segments other tests never closed

    def set_budget(segments: int | None) -> None:
        set_max_open_segments(None if segments is None else segments + elsewhere)

    yield set_budget
    set_max_open_segments(None)


@pytest.fixture
def many(log_dir: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    build(log_dir, SEGMENTS, monkeypatch)
    return log_dir


@pytest.fixture
def read_only(many: Path) -> Iterator[PartitionLog]:
    with DataDir.open(broker_config(many), read_only=True, now_ms=NOW_MS) as data_dir:
        yield data_dir.partition("t", 0)


@pytest.fixture
def writable(many: Path) -> Iterator[PartitionLog]:
    with DataDir.open(broker_config(many, log_segment_bytes=100), now_ms=NOW_MS) as data_dir:
        yield data_dir.partition("t", 0)
    assert_log_dir_valid(many)


def holding(log: PartitionLog) -> list[LogSegment]:
    return [segment for segment in log.segments if segment.handles_open]


def read_everything(log: PartitionLog) -> None:
    """What `status` and `records` do: every segment's max timestamp, then every record."""
    for segment in log.segments:
        assert segment.max_timestamp_so_far.timestamp == NOW_MS + segment.base_offset
    assert [record.value for record in log.records(0)] == [value(offset) for offset in range(SEGMENTS)]


# -- the budget -------------------------------------------------------------------------------------
def test_the_budget_bounds_open_descriptors(read_only: PartitionLog, budget) -> None:
    budget(10)
    before = open_fds()
    read_everything(read_only)
    for offset in range(0, SEGMENTS, 7):  # look-ups through both indexes, all over the log
        assert read_only.offset_for_timestamp(NOW_MS + offset).offset == offset
        assert read_only.segments[offset].read(offset, 1000) is not None
    after = open_fds()
    assert len(holding(read_only)) <= 10
    assert after - before <= 10 * FDS_PER_SEGMENT, (before, after)
    # Without the cache the same reads held every segment's files (4 descriptors each here).
    assert after - before < SEGMENTS


def test_lowering_the_budget_closes_what_is_over_it(read_only: PartitionLog, budget) -> None:
    budget(1000)
    read_everything(read_only)
    assert len(holding(read_only)) == SEGMENTS
    before = open_fds()
    budget(5)
    assert len(holding(read_only)) <= 5
    assert open_fds() < before - (SEGMENTS - 5)
    read_everything(read_only)  # they reopen on use
    assert len(holding(read_only)) <= 5


def test_the_most_recently_used_stay_open(read_only: PartitionLog, budget) -> None:
    budget(4)
    segments = read_only.segments
    for segment in segments[:20]:
        segment.read(segment.base_offset, 100)
    assert holding(read_only) == segments[16:20]


def test_budget_from_the_environment_and_the_rlimit(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(MAX_OPEN_SEGMENTS_ENV, raising=False)
    monkeypatch.setattr(handles_module.resource, "getrlimit", lambda which: (256, 4096))
    assert default_max_open_segments() == (256 - 64) // 5 == 38
    monkeypatch.setattr(handles_module.resource, "getrlimit", lambda which: (64, 4096))
    assert default_max_open_segments() == 16  # never fewer
    monkeypatch.setattr(handles_module.resource, "getrlimit", lambda which: (resource.RLIM_INFINITY,) * 2)
    assert default_max_open_segments() > 100_000
    monkeypatch.setenv(MAX_OPEN_SEGMENTS_ENV, "7")
    assert default_max_open_segments() == 7
    try:
        set_max_open_segments(None)
        assert max_open_segments() == 7
    finally:
        monkeypatch.delenv(MAX_OPEN_SEGMENTS_ENV)
        set_max_open_segments(None)
    monkeypatch.setenv(MAX_OPEN_SEGMENTS_ENV, "many")
    with pytest.raises(ConfigError, match=MAX_OPEN_SEGMENTS_ENV):
        default_max_open_segments()
    with pytest.raises(ValueError):
        set_max_open_segments(0)


OUT_OF_DESCRIPTORS = """
import gc, resource, sys
from pathlib import Path
from seglogfs.engine import DataDir
from seglogfs.engine.log.handles import set_max_open_segments
from tests.conftest import NOW_MS, broker_config
from tests.engine.test_handles import SEGMENTS, holding, open_fds, read_everything
with DataDir.open(broker_config(Path(sys.argv[1])), read_only=True, now_ms=NOW_MS) as data_dir:
    log = data_dir.partition("t", 0)
    set_max_open_segments(100_000)
    gc.collect()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (open_fds() + 40, hard))
    try:
        read_everything(log)
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    print(len(holding(log)))
"""


def test_out_of_descriptors_sheds_open_segments(many: Path) -> None:
    """A budget the rlimit cannot hold (descriptors taken by others): EMFILE makes half the open
    segments give theirs back, and the open is tried again. (Without the shedding the reads fail
    with EMFILE after about 40 segments.) Run in a process of its own: in the test's, threads of
    other tests (a Spark session's) give descriptors back while it runs, and more than 40 stay
    open."""
    done = subprocess.run(
        [sys.executable, "-c", OUT_OF_DESCRIPTORS, str(many)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert int(done.stdout) < SEGMENTS // 2


# -- leases and pins ------------------------------------------------------------------------------
def test_a_leased_segment_is_not_evicted(read_only: PartitionLog, budget) -> None:
    budget(3)
    first = read_only.segments[0]
    batches = first.iter_batches(0)
    next(batches)  # leased until the iterator ends
    for segment in read_only.segments[1:50]:
        assert segment.read(segment.base_offset, 1000) is not None
    assert first.leased and first.handles_open
    assert len(holding(read_only)) <= 3 + 1
    assert next(batches, None) is None  # the iteration ends: the lease with it
    assert not first.leased
    for segment in read_only.segments[50:60]:
        segment.read(segment.base_offset, 1000)
    assert not first.handles_open


def test_the_active_segment_is_pinned(writable: PartitionLog, budget) -> None:
    budget(2)
    writable.append_records([b"appended"], now_ms=NOW_MS)
    active = writable.active_segment
    assert active.handles_open
    for segment in writable.segments[:-1]:
        segment.read(segment.base_offset, 1000)
        assert active.handles_open
    assert len(holding(writable)) <= 2 + 1
    writable.append_records([b"again"], now_ms=NOW_MS)  # its preallocated indexes are intact
    assert [r.value for r in writable.records(SEGMENTS)] == [b"appended", b"again"]


def test_a_segment_being_written_is_pinned_until_sealed(tmp_path: Path, read_only: PartitionLog, budget) -> None:
    """A new segment (the cleaner's `.cleaned` one) keeps its preallocated indexes between
    appends, whatever else is read; once sealed it may go."""
    budget(2)
    fresh = LogSegment(tmp_path, 10_000, index_interval_bytes=0, max_index_bytes=4096, writable=True, created_ms=NOW_MS)
    try:
        for offset in range(10_000, 10_005):
            batch = build_batch([value(offset)], timestamps=[NOW_MS], base_offset=offset)
            fresh.append(batch, [BatchHeader.parse(batch)])
            for segment in read_only.segments[offset % 100 * 10 : offset % 100 * 10 + 10]:
                segment.read(segment.base_offset, 1000)
            assert fresh.handles_open
        assert fresh.offset_index.entries == 4  # every append but the first indexed: nothing trimmed
        fresh.on_become_inactive()
        for segment in read_only.segments[60:70]:
            segment.read(segment.base_offset, 1000)
        assert not fresh.handles_open
        assert fresh.read_next_offset() == 10_005
    finally:
        fresh.delete_files()


# -- releases under readers --------------------------------------------------------------------------
def test_release_under_a_reader_waits_for_it(tmp_path: Path) -> None:
    segment = standalone(tmp_path, 0, 10)
    expected = [b.tobytes() for _, b in segment.iter_batches(0)]
    iterator = segment.iter_batches(0)
    first = next(iterator)[1].tobytes()
    descriptor = segment._handle
    assert descriptor is not None
    releaser = threading.Thread(target=segment.release_handles)
    releaser.start()
    releaser.join(timeout=10)
    assert not releaser.is_alive()  # the writer is never held up by a reader
    os.fstat(descriptor)  # still open: the reader's lease keeps it
    assert segment.handles_open
    fetched = segment.read(3, 1000)  # more readers meanwhile are fine
    assert fetched is not None and value(3) in fetched.data
    assert [first] + [b.tobytes() for _, b in iterator] == expected
    assert not segment.handles_open  # the last lease closed the files
    with pytest.raises(OSError):
        os.fstat(descriptor)
    assert segment.read(3, 1000) == fetched  # reopens on use
    segment.close_handlers()


def test_delete_under_a_reader_keeps_its_bytes(tmp_path: Path) -> None:
    segment = standalone(tmp_path, 0, 10)
    expected = [b.tobytes() for _, b in segment.iter_batches(0)]
    assert segment.try_release_handles() and segment._handle is None
    batches = segment.iter_batches(0)
    batch = next(batches)[1]
    descriptor = segment._handle
    segment.mark_deleted()
    assert segment.log_path.name.endswith(".log.deleted")
    segment.delete_files()
    assert not segment.log_path.exists()
    os.fstat(descriptor)  # unlinked, still open for the reader
    assert [batch.tobytes()] + [b.tobytes() for _, b in batches] == expected
    assert segment._handle is None and not segment.handles_open
    with pytest.raises(OSError, match="segment is closed"):
        segment.read(5, 100)


def test_a_deleted_segment_evicted_reopens_under_its_new_name(tmp_path: Path) -> None:
    segment = standalone(tmp_path, 0, 10)
    expected = segment.read(4, 1000)
    segment.mark_deleted()
    assert segment.try_release_handles() and not segment.handles_open
    assert segment.read(4, 1000) == expected
    assert segment.offset_index.path == segment.offset_index_path
    assert segment.offset_index_path.name.endswith(".index.deleted")
    segment.delete_files()
    assert sorted(os.listdir(tmp_path)) == []


def test_closing_index_under_a_holder_reopens_it(read_only: PartitionLog, budget) -> None:
    """An index object a reader holds across an eviction reopens itself read-only."""
    budget(1000)
    segment = read_only.segments[SEGMENTS - 1]
    time_index = segment.time_index
    expected = time_index.last_entry()
    assert segment.try_release_handles()
    assert not segment.handles_open
    assert time_index.last_entry() == expected
    assert time_index.lookup(expected.timestamp) == expected
    del time_index  # its reopened file goes with it


def test_a_replaced_deleted_file_is_not_read_as_the_segment(tmp_path: Path) -> None:
    """Evicted after `.deleted`, then its `.deleted` name taken by the file of a later segment of
    the same base (deleted in turn): a reopen finds another inode and refuses (ESTALE) instead
    of reading the other segment's bytes."""
    segment = standalone(tmp_path, 0, 10)
    segment.read(7, 100)
    segment.mark_deleted()
    assert segment.try_release_handles()
    later = standalone(tmp_path, 0, 3)
    later.mark_deleted()  # replaces `00…0.log.deleted`
    with pytest.raises(OSError) as raised:
        segment.read(7, 100)
    assert raised.value.errno == errno.ESTALE
    later.delete_files()
    segment.delete_files()


# -- races -------------------------------------------------------------------------------------------
def test_reads_racing_evictions_and_releases_read_the_right_bytes(read_only: PartitionLog, budget) -> None:
    """Readers (iterations, slices, look-ups) on every segment while another thread evicts and
    releases them and a third opens and closes unrelated files, so that a descriptor closed under
    a reader would be reused by another file: every byte read is right, and nothing fails."""
    budget(3)
    segments = read_only.segments
    expected = [value(offset) for offset in range(SEGMENTS)]
    stop = threading.Event()
    errors: list[BaseException] = []
    reads = [0]

    def guarded(work: Callable[[random.Random], None]) -> Callable[[], None]:
        def run() -> None:
            rng = random.Random(threading.get_ident())
            try:
                while not stop.is_set():
                    work(rng)
            except BaseException as error:  # reported below
                errors.append(error)
                stop.set()

        return run

    def read_records(rng: random.Random) -> None:
        start = rng.randrange(SEGMENTS)
        got = [record.value for record in read_only.records(start, min(start + 8, SEGMENTS))]
        assert got == expected[start : start + 8]
        reads[0] += 1

    def read_slices(rng: random.Random) -> None:
        offset = rng.randrange(SEGMENTS)
        segment = segments[offset]
        fetched = segment.read(offset, 10_000)
        assert fetched is not None and value(offset) in fetched.data
        assert segment.max_timestamp_so_far.timestamp == NOW_MS + offset
        assert read_only.offset_for_timestamp(NOW_MS + offset).offset == offset

    def evict(rng: random.Random) -> None:
        OPEN_SEGMENTS.shed(rng.randrange(3))
        segments[rng.randrange(SEGMENTS)].release_handles()

    def churn(rng: random.Random) -> None:
        descriptors = [os.open(os.devnull, os.O_RDONLY) for _ in range(8)]
        for descriptor in descriptors:
            os.close(descriptor)

    workers = (read_records, read_records, read_slices, evict, churn)
    threads = [threading.Thread(target=guarded(work)) for work in workers]
    for thread in threads:
        thread.start()
    timer = threading.Timer(3.0, stop.set)
    timer.start()
    for thread in threads:
        thread.join(timeout=60)
    timer.cancel()
    assert not errors, errors
    assert reads[0] > 50
    assert not any(segment.leased for segment in segments)
