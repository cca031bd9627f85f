"""Views against a straight rendering of the partition: size and every byte range."""

from __future__ import annotations

import errno
import os
import random
import sys
import threading
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from seglogfs.engine import PartitionLog
from seglogfs.engine.errors import CorruptRecordError
from seglogfs.engine.log import file_records as file_records_module
from seglogfs.engine.log.file_records import read_cached
from seglogfs.engine.log.segment import LogSegment
from seglogfs.engine.text.console_formats import TextFormat
from seglogfs.engine.text.json_records import record_to_json
from seglogfs.engine.text.renderers import JsonLinesRenderer, TextRenderer
from seglogfs.fs import layout_pages, page_cache, views
from seglogfs.fs.layout_store import LayoutStore
from seglogfs.fs.views import Layout, View
from tests.conftest import NOW_MS, drop_from_page_cache, make_log


def views_log(directory: Path, **overrides: str) -> PartitionLog:
    """A partition whose segments roll at 2,000 bytes (overrides by Kafka's names)."""
    return make_log(directory, **{"segment.bytes": "2000", **overrides})


def expected_text(log: PartitionLog, start: int, text_format: TextFormat) -> bytes:
    return b"".join(text_format.render(r, 0) for r in log.records(start))


def expected_jsonl(log: PartitionLog, start: int) -> bytes:
    return b"".join(record_to_json(r, "t", 0).encode() + b"\n" for r in log.records(start))


@settings(max_examples=25, deadline=None)
@given(
    st.lists(st.lists(st.binary(max_size=120), min_size=1, max_size=20), min_size=0, max_size=25),
    st.integers(0, 200),
    st.integers(1, 4096),
    st.randoms(use_true_random=False),
)
def test_view_bytes_equal_a_full_rendering(tmp_path_factory, batches, start, mark_bytes, rng: random.Random) -> None:
    root = tmp_path_factory.mktemp("logs")
    log = views_log(root / "t-0")
    text_format = TextFormat(print_offset=True, print_key=True)
    # Views from different offsets share one layout per format, as the mount's do.
    text_layout = Layout(log, TextRenderer(text_format, 0), mark_bytes=mark_bytes)
    jsonl_layout = Layout(log, JsonLinesRenderer("t", 0), mark_bytes=mark_bytes)
    if rng.random() < 0.5:  # measured in one pass, as the mount links them
        text_layout.sibling, jsonl_layout.sibling = jsonl_layout, text_layout
    text, jsonl = View(text_layout, start), View(jsonl_layout, start)
    whole = View(text_layout, 0)
    for values in batches:
        log.append_records(values, keys=[b"k"] * len(values), now_ms=NOW_MS)
        if rng.random() < 0.5:  # look in between appends too: views grow incrementally
            for view, expected in ((text, expected_text(log, start, text_format)), (jsonl, expected_jsonl(log, start))):
                assert view.size() == len(expected)
    checks = [
        (text, expected_text(log, start, text_format)),
        (jsonl, expected_jsonl(log, start)),
        (whole, expected_text(log, 0, text_format)),
    ]
    for view, expected in checks:
        assert view.size() == len(expected)
        assert view.read(0, len(expected) + 10) == expected
        for _ in range(20):
            position = rng.randrange(len(expected) + 5)
            length = rng.randrange(1, 3000)
            assert view.read(position, length) == expected[position : position + length]
    log.close()


class CountingRenderer:
    """A renderer that counts the batches it measures, and on which threads (a measure's
    threads share it)."""

    def __init__(self, renderer) -> None:
        self.renderer = renderer
        self.measured = 0
        self.threads: set[int] = set()
        self._lock = threading.Lock()

    def render_indexed(self, header, batch):
        return self.renderer.render_indexed(header, batch)

    def render_range(self, fd, start, end, size, *, nowait=False):
        return self.renderer.render_range(fd, start, end, size, nowait=nowait)

    def measure(self, header, batch, columns=None):
        with self._lock:
            self.measured += 1
            self.threads.add(threading.get_ident())
        return self.renderer.measure(header, batch, columns)


def fill(log: PartitionLog, batches: int, tag: bytes = b"v") -> None:
    for i in range(batches):
        log.append_records([tag + b"-%d-%d" % (i, j) for j in range(5)], keys=[b"k"] * 5, now_ms=NOW_MS)


def test_layouts_kept_in_the_store_are_not_measured_again(tmp_path: Path) -> None:
    log = views_log(tmp_path / "t-0")
    fill(log, 40)
    assert len(log.segments) >= 3
    store = LayoutStore(tmp_path / "cache")
    text_format = TextFormat(print_offset=True)
    first = CountingRenderer(TextRenderer(text_format, 0))
    layout = Layout(log, first, mark_bytes=64, store=store, format_key="text")
    assert View(layout, 0).size() == len(expected_text(log, 0, text_format))
    assert first.measured == 40
    layout.keep()  # the active segment too, as at unmount

    again = CountingRenderer(TextRenderer(text_format, 0))
    view = View(Layout(log, again, mark_bytes=64, store=store, format_key="text"), 0)
    expected = expected_text(log, 0, text_format)
    assert view.size() == len(expected)
    assert view.read(0, len(expected)) == expected
    assert again.measured == 0

    fill(log, 3, b"more")  # the active segment grew: only the new batches are measured
    later = CountingRenderer(TextRenderer(text_format, 0))
    view = View(Layout(log, later, mark_bytes=64, store=store, format_key="text"), 17)
    expected = expected_text(log, 17, text_format)
    assert view.read(0, len(expected) + 5) == expected
    assert later.measured == 3
    # Another format has layouts of its own.
    other = CountingRenderer(JsonLinesRenderer("t", 0))
    assert View(Layout(log, other, store=store, format_key="jsonl"), 0).size() == len(expected_jsonl(log, 0))
    assert other.measured == 43
    log.close()


def test_a_first_measure_measures_both_formats_in_one_pass(tmp_path: Path, monkeypatch) -> None:
    """`ls -l` stats `records` and then `records.jsonl`: the first measure reads each batch once
    for both (and keeps the other format's sealed segments in the store); the second measures
    nothing, and both views read as full renderings, also after appends."""
    log = views_log(tmp_path / "t-0")
    fill(log, 40)
    assert len(log.segments) >= 3
    store = LayoutStore(tmp_path / "cache")
    text_format = TextFormat(print_offset=True)
    text = CountingRenderer(TextRenderer(text_format, 0))
    jsonl = CountingRenderer(JsonLinesRenderer("t", 0))
    text_layout = Layout(log, text, mark_bytes=64, store=store, format_key="text")
    jsonl_layout = Layout(log, jsonl, mark_bytes=64, store=store, format_key="jsonl")
    text_layout.sibling, jsonl_layout.sibling = jsonl_layout, text_layout
    scans = []
    checked_batches = LogSegment.checked_batches

    def counted(segment, *args, **kwargs):
        if kwargs.get("once"):  # a measure's pass (a page rendered to find an offset is not one)
            scans.append(segment.base_offset)
        return checked_batches(segment, *args, **kwargs)

    monkeypatch.setattr(LogSegment, "checked_batches", counted)
    assert View(text_layout, 0).size() == len(expected_text(log, 0, text_format))
    assert sorted(scans) == [segment.base_offset for segment in log.segments]  # each segment read once
    assert text.measured == jsonl.measured == 40
    scans.clear()
    jsonl_view = View(jsonl_layout, 0)
    assert jsonl_view.size() == len(expected_jsonl(log, 0))
    assert scans == [] and jsonl.measured == 40  # handed over: nothing read or measured again
    expected = expected_jsonl(log, 0)
    assert jsonl_view.read(0, len(expected)) == expected
    fill(log, 3, b"more")
    grown = ((jsonl_view, expected_jsonl(log, 0)), (View(text_layout, 0), expected_text(log, 0, text_format)))
    for view, want in grown:
        assert view.size() == len(want)
        assert view.read(0, len(want) + 5) == want
    # The JSON Lines layouts of sealed segments were stored by the text layout's pass.
    again = CountingRenderer(JsonLinesRenderer("t", 0))
    layout = Layout(log, again, mark_bytes=64, store=store, format_key="jsonl")
    assert View(layout, 0).size() == len(expected_jsonl(log, 0))
    assert again.measured == len(list(log.segments[-1].iter_batches()))  # the active segment only
    log.close()


def test_stale_or_damaged_layouts_are_measured_afresh(tmp_path: Path) -> None:
    log = views_log(tmp_path / "t-0")
    fill(log, 40)
    assert len(log.segments) >= 3
    store = LayoutStore(tmp_path / "cache")
    text_format = TextFormat()
    layout = Layout(log, TextRenderer(text_format, 0), mark_bytes=64, store=store, format_key="text")
    View(layout, 0).size()
    layout.keep()
    # The active segment loses its tail (as recovery truncates) and gets other records of the
    # same size in its place: its stored layout no longer fits.
    before = log.segments[-1].size
    cut = log.log_end_offset - 5  # the last batch
    log.truncate_to(cut, NOW_MS)
    log.append_records([b"X-%d-%d" % (cut // 5, j) for j in range(5)], keys=[b"k"] * 5, now_ms=NOW_MS)
    # A sealed segment's layout file is damaged.
    directory = store.directory(log, "text")
    damaged = directory / f"{log.segments[0].base_offset:020d}.layout"
    data = bytearray(damaged.read_bytes())
    data[40] ^= 0xFF
    damaged.write_bytes(bytes(data))
    assert log.segments[-1].size == before  # the same size: only the last batch's CRC tells
    counting = CountingRenderer(TextRenderer(text_format, 0))
    view = View(Layout(log, counting, mark_bytes=64, store=store, format_key="text"), 0)
    expected = expected_text(log, 0, text_format)
    assert view.size() == len(expected)
    assert view.read(0, len(expected)) == expected
    last_batches = sum(1 for _ in log.segments[-1].checked_batches())
    assert counting.measured == sum(1 for _ in log.segments[0].checked_batches()) + last_batches
    log.close()


def test_an_open_view_keeps_its_bytes_when_retention_removes_older_segments(tmp_path: Path) -> None:
    log = views_log(tmp_path / "t-0", **{"retention.ms": "1000"})
    for i in range(30):  # old records first, then recent ones
        stamp = NOW_MS - 10_000 if i < 20 else NOW_MS
        log.append_records([b"r-%d-%d" % (i, j) for j in range(5)], timestamps=stamp, now_ms=NOW_MS)
    text_format = TextFormat(print_offset=True)
    layout = Layout(log, TextRenderer(text_format, 0), mark_bytes=64)
    held = View(layout, 0)  # as `records` opened before retention runs
    before = expected_text(log, 0, text_format)
    assert held.read(0, len(before)) == before
    assert log.delete_old_segments(NOW_MS).segments
    start = log.log_start_offset
    assert start > 0
    kept = expected_text(log, start, text_format)
    gone = len(before) - len(kept)
    # The holder's positions still hold the same bytes; the removed part reads as nothing.
    assert held.size() == len(before)
    assert held.read(gone, len(kept)) == kept
    assert held.read(gone + 7, 50) == before[gone + 7 : gone + 57]
    assert held.read(0, 10) == b""
    # Appends show up at the end for the holder and for a view opened now.
    log.append_records([b"new"], now_ms=NOW_MS)
    fresh = View(layout, log.log_start_offset)
    expected = expected_text(log, start, text_format)
    assert fresh.size() == len(expected)
    assert fresh.read(0, len(expected)) == expected
    assert held.read(gone, len(expected)) == expected
    log.close()


def test_a_first_measure_goes_on_when_retention_removes_segments_under_it(tmp_path: Path, monkeypatch) -> None:
    """Retention deletes (and closes) old segments while the first measure walks them: the
    measure looks again at the log's segments, not failing on a closed one."""
    log = views_log(tmp_path / "t-0", **{"retention.ms": "1000", "segment.bytes": "300"})
    for i in range(30):
        stamp = NOW_MS - 10_000 if i < 20 else NOW_MS
        log.append_records([b"r-%d-%d" % (i, j) for j in range(5)], timestamps=stamp, now_ms=NOW_MS)
    assert len(log.segments) > 4
    layout = Layout(log, TextRenderer(TextFormat(), 0), mark_bytes=64)
    extend, deleted = Layout._extend, []

    def extend_after_retention(self: Layout, segment_layout, *, last: bool) -> None:
        if not deleted:  # retention on another thread, between the measure's list and its reads
            deleted.append(log.delete_old_segments(NOW_MS).segments)
            log.delete_pending(NOW_MS, all_of_them=True)  # (file.delete.delay.ms over: closed)
        extend(self, segment_layout, last=last)

    monkeypatch.setattr(Layout, "_extend", extend_after_retention)
    monkeypatch.setattr(views, "MEASURE_THREADS", 1)
    view = View(layout, 0)
    size = view.size()
    assert deleted[0] and log.log_start_offset > 0
    expected = expected_text(log, log.log_start_offset, TextFormat())
    assert size == len(expected)
    assert view.read(0, len(expected)) == expected
    assert layout.progress().error is None
    log.close()


def test_a_held_view_keeps_a_new_segment_open_from_its_measure_on(tmp_path: Path, monkeypatch) -> None:
    """A read-only mount's held view takes in the segments the other writer rolled since its
    last look. Each is kept open from before it is measured: the descriptor budget closing it
    and the writer's retention removing its file before `keep_open` cannot leave it laid out
    with bytes no read can give (a live follower's read of `by-offset/0` was EIO naming the
    removed `.log`)."""
    writer = views_log(tmp_path / "t-0", **{"segment.bytes": "300"})
    writer.append_records([b"first-%d" % j for j in range(5)], now_ms=NOW_MS)
    writer.flush()
    reader = PartitionLog.open(
        tmp_path / "t-0", "t", 0, writer.config, writable=False, clean_shutdown=True, now_ms=NOW_MS
    )
    layout = Layout(reader, TextRenderer(TextFormat(), 0), mark_bytes=64)
    view = View(layout, 0)
    layout.hold()
    try:
        assert view.read(0, view.size()) == expected_text(reader, 0, TextFormat())
        for i in range(6):
            writer.append_records([b"later-%d-%d" % (i, j) for j in range(5)], now_ms=NOW_MS)
        writer.flush()
        assert reader.refresh(NOW_MS)
        expected = expected_text(reader, 0, TextFormat())
        keep_open, removed = Layout.keep_open, []

        def closed_and_removed_first(self: Layout) -> None:
            if not removed:  # (the budget takes the descriptor back, then retention removes the file)
                segment = reader.segments[-2]
                segment.try_release_handles()
                os.unlink(segment.log_path)
                removed.append(segment)
            keep_open(self)

        monkeypatch.setattr(Layout, "keep_open", closed_and_removed_first)
        assert view.size() == len(expected)
        monkeypatch.setattr(page_cache, "PAGES", page_cache.PageCache(32 << 20))  # (no page the measure rendered)
        assert removed and view.read(0, len(expected)) == expected
    finally:
        layout.let_go()
        writer.close()
        reader.close()


def drop_log_from_page_cache(log: PartitionLog) -> None:
    """Have the OS forget the log's bytes."""
    log.flush()
    for segment in log.segments:
        fd = os.open(segment.log_path, os.O_RDONLY)
        try:
            drop_from_page_cache(fd)
        finally:
            os.close(fd)


def nowait_reads_work(directory: Path) -> bool:
    """Whether the file system holding `directory` reads with RWF_NOWAIT (ext4, xfs, btrfs,
    tmpfs do); without it, nothing is ever read on the event loop."""
    probe = directory / "nowait-probe"
    probe.write_bytes(b"x")
    fd = os.open(probe, os.O_RDONLY)
    try:
        return read_cached(fd, 0, 1) == b"x"
    except BlockingIOError:
        return False
    finally:
        os.close(fd)
        probe.unlink()


def test_reads_on_the_event_loop_need_neither_the_disk_nor_long_rendering(tmp_path: Path, monkeypatch) -> None:
    log = views_log(tmp_path / "t-0")
    fill(log, 40)
    text_format = TextFormat(print_offset=True)
    expected = expected_text(log, 0, text_format)
    nowait = nowait_reads_work(tmp_path)

    def fresh_view() -> View:
        view = View(Layout(log, TextRenderer(text_format, 0), mark_bytes=64), 0)
        assert view.size() == len(expected)  # measured: bytes read, pages not rendered
        return view

    # Bytes in the OS page cache, pages cheap: rendered on the spot (where the file system can
    # tell what is cached).
    view = fresh_view()
    assert view.read_now(0, len(expected)) == (expected if nowait else None)
    assert view.read(0, len(expected)) == expected
    assert view.read_now(5, 300) == expected[5:305]  # rendered pages: always served

    # Bytes only on disk: not on the loop, until a worker thread has read and rendered them. (A
    # read that would not wait starts the OS's read-ahead, which may land before it looks again:
    # then it serves the bytes. One of a few tries at least is refused.)
    for _ in range(20):
        view = fresh_view()
        drop_log_from_page_cache(log)
        served = view.read_now(0, len(expected))
        if served is None:
            break
        assert served == expected
    else:
        raise AssertionError("reads on the loop of bytes only on disk were never refused")
    assert view.read(0, len(expected)) == expected
    assert view.read_now(0, len(expected)) == expected

    # A read rendering more than its budget on the loop: likewise; rendered pages cost nothing.
    if nowait:
        monkeypatch.setattr("seglogfs.fs.layout_pages.INLINE_RENDER_BYTES", 300)  # a few pages of ~64 bytes
        view = fresh_view()
        assert view.read_now(0, len(expected)) is None
        assert view.read_now(0, 50) == expected[:50]
        assert view.read_now(0, 250) == expected[:250]
        assert view.read(0, len(expected)) == expected
        assert view.read_now(0, len(expected)) == expected

    # Pages too big to render on the loop: likewise.
    monkeypatch.setattr("seglogfs.fs.layout_pages.INLINE_RENDER_BYTES", 10)
    view = fresh_view()
    assert view.read_now(100, 200) is None
    assert view.read(100, 200) == expected[100:300]
    assert view.read_now(100, 200) == expected[100:300]
    assert view.read_now(len(expected) - 5, 10) is None  # past the end: a look at the log first
    log.close()


def test_the_loop_s_budget_counts_segment_bytes_not_rendered_ones(tmp_path: Path, monkeypatch) -> None:
    """A view that shows little of each record (offsets only, values of 20 KB) has pages that span
    much of the segment: a small read of one is not rendered on the event loop, which would read
    all of that page's segment bytes first."""
    if not nowait_reads_work(tmp_path):
        pytest.skip("this file system cannot tell what is in the page cache: nothing is read on the loop")
    log = views_log(tmp_path / "t-0", **{"segment.bytes": str(1 << 30)})
    for _ in range(100):
        log.append_records([b"x" * 20_000], now_ms=NOW_MS)
    log.roll(NOW_MS)  # (sealed: its measure keeps no page rendered)
    text_format = TextFormat(print_offset=True, print_value=False)
    expected = expected_text(log, 0, text_format)
    monkeypatch.setattr("seglogfs.fs.layout_pages.INLINE_RENDER_BYTES", 500_000)  # half a page (MARK_SEGMENT_BYTES)
    view = View(Layout(log, TextRenderer(text_format, 0)), 0)
    assert view.size() == len(expected)  # ~1 KB of text in two pages of 1 MB of the segment
    monkeypatch.setattr(page_cache, "PAGES", page_cache.PageCache(32 << 20))  # (finding offset 0 rendered it)
    read_on_the_loop: list[int] = []

    def counted(fd: int, at: int, length: int) -> bytes:
        read_on_the_loop.append(length)
        return read_cached(fd, at, length)

    monkeypatch.setattr(file_records_module, "read_cached", counted)
    assert view.read_now(0, 10) is None
    assert read_on_the_loop == []
    assert view.read(0, len(expected)) == expected  # (a worker thread's read)
    assert view.read_now(0, len(expected)) == expected  # rendered: served from the page cache
    log.close()


def test_a_read_on_the_loop_during_a_measure_is_whole_or_refused(tmp_path: Path) -> None:
    """The event loop reads a published layout as it stands while the measuring thread adds a
    batch to it: stopped at each step of that (a line of `Layout._note`, where the GIL may pass
    to the loop), a read of every byte below the size it knows gets all of them, or None (a
    worker thread's read then waits for the measure); never fewer bytes than asked for."""
    log = views_log(tmp_path / "t-0")
    view = View(Layout(log, TextRenderer(TextFormat(), 0), mark_bytes=16), 0)
    for i in range(6):
        log.append_records([b"record-%d" % i], now_ms=NOW_MS)
    assert view.size() == len(expected_text(log, 0, TextFormat()))
    log.append_records([b"record-6"], now_ms=NOW_MS)
    expected = expected_text(log, 0, TextFormat())
    at_a_line, go_on, done = threading.Semaphore(0), threading.Semaphore(0), threading.Event()
    steps: list[int] = []

    def stop_at_each_line(frame, event, arg):  # (sys.settrace's signature)
        if frame.f_code is not Layout._note.__code__:
            return None

        def line(frame, event, arg):
            if event == "line" and not done.is_set():
                steps.append(frame.f_lineno)
                at_a_line.release()
                go_on.acquire()
            return line

        return line

    def measure() -> None:
        sys.settrace(stop_at_each_line)
        try:
            view.size()
        finally:
            sys.settrace(None)
            at_a_line.release()  # (the end: no more lines)

    measuring = threading.Thread(target=measure)
    measuring.start()
    try:
        while at_a_line.acquire(timeout=10) and measuring.is_alive():
            known = view.layout.known_size()
            got = read_on_the_loop(view, 0, known)
            assert got is None or got == expected[:known], f"after line {steps[-1]}: {got!r}"
            go_on.release()
    finally:
        done.set()  # (a failed check lets the measure run to its end)
        go_on.release()
        measuring.join()
    assert len(steps) >= 4  # (every line of _note was a stop)
    assert view.read_now(0, len(expected)) == expected
    log.close()


def test_damaged_bytes_are_reported_by_the_worker_thread_read(tmp_path: Path) -> None:
    """A batch damaged after the measure: a read gives the bytes before its page (short), and
    the read that starts there fails naming it; none of it on the event loop."""
    log = views_log(tmp_path / "t-0")
    fill(log, 10)
    log.flush()
    expected = expected_text(log, 0, TextFormat())
    view = View(Layout(log, TextRenderer(TextFormat(), 0), mark_bytes=64), 0)
    size = view.size()
    segment = log.segments[0]
    with open(segment.log_path, "r+b") as damaged:  # a record's byte, after the measure
        damaged.seek(segment.size - 3)
        damaged.write(b"\xff")
    assert view.read_now(0, size) is None
    before = bytes(view.read(0, size))
    assert 0 < len(before) < size and expected.startswith(before)
    with pytest.raises(CorruptRecordError, match=segment.log_path.name):
        view.read(len(before), size)
    log.close()


def test_sealed_segments_are_measured_on_two_threads(tmp_path: Path, monkeypatch) -> None:
    """A first measure shares the sealed segments out between this thread and a helper (the core
    releases the GIL): every batch is measured once and the view reads as a full rendering."""
    monkeypatch.setattr(views, "_MEASURE_DELAY_S", 0.002)  # (each segment long enough to share out)
    monkeypatch.setattr(views, "MEASURE_THREADS", 2)  # (whatever this machine's cores)
    log = views_log(tmp_path / "t-0")
    fill(log, 60)
    assert len(log.segments) >= 4
    text_format = TextFormat(print_offset=True)
    counting = CountingRenderer(TextRenderer(text_format, 0))
    view = View(Layout(log, counting, mark_bytes=64), 0)
    expected = expected_text(log, 0, text_format)
    assert view.size() == len(expected)
    assert view.read(0, len(expected)) == expected
    assert counting.measured == 60
    assert len(counting.threads) == 2
    log.close()


@pytest.mark.expect_warnings("its views answer EIO there")
def test_a_damaged_batch_in_a_sealed_segment_reads_as_eio_between_the_records_around_it(tmp_path: Path) -> None:
    """A sealed segment's batch that fails its CRC (found by whichever thread measured it): the
    view serves every record before it and after it, and its page's one byte reads as the
    damage (EIO naming file and position, as Kafka's consumer stops at it); a view from an
    offset after it reads on from there, one from an offset in it begins at the damage. The
    sealed segments around it are kept in the store, the damaged one is not: a measure after
    the repair reads it (and the last) again, and the whole partition."""
    log = views_log(tmp_path / "t-0")
    fill(log, 60)
    log.flush()
    segments = log.segments
    assert len(segments) >= 4
    damaged = segments[2]
    bad = list(damaged.iter_headers())[-1]  # (the batch holding the byte damaged below)
    full = expected_text(log, 0, TextFormat())
    before = full[: len(full) - len(expected_text(log, bad.base_offset, TextFormat()))]
    after = expected_text(log, bad.last_offset + 1, TextFormat())
    with open(damaged.log_path, "r+b") as file:
        file.seek(damaged.size - 3)
        original = file.read(1)
        file.seek(damaged.size - 3)
        file.write(bytes([original[0] ^ 0xFF]))
    store = LayoutStore(tmp_path / "cache")
    layout = Layout(log, TextRenderer(TextFormat(), 0), mark_bytes=64, store=store, format_key="text")
    view = View(layout, 0)
    assert view.size() == len(before) + 1 + len(after)
    assert bytes(view.read(0, view.size())) == before  # (short: up to the damage)
    with pytest.raises(
        CorruptRecordError, match=rf"{damaged.log_path.name}: corrupt record batch at position {bad.position}"
    ):
        view.read(len(before), 100)
    assert read_as_the_mount_does(View(layout, bad.last_offset + 1), 1000) == after
    assert bytes(view.read(len(before) + 1, len(after) + 10)) == after
    into = View(layout, bad.base_offset)
    assert into.size() == 1 + len(after)
    with pytest.raises(CorruptRecordError):
        into.read(0, 10)
    assert "CRC-32C mismatch" in str(layout.progress().error)
    kept = {segment.base_offset for segment in segments[:-1] if segment is not damaged}
    stored = {int(path.name.split(".")[0]) for path in store.directory(log, "text").glob("*.layout")}
    assert stored == kept
    with open(damaged.log_path, "r+b") as file:
        file.seek(damaged.size - 3)
        file.write(original)
    again = CountingRenderer(TextRenderer(TextFormat(), 0))
    view = View(Layout(log, again, mark_bytes=64, store=store, format_key="text"), 0)
    assert view.read(0, len(full) + 1) == full
    batches_of = {segment.base_offset: len(list(segment.iter_batches())) for segment in segments}
    assert again.measured <= batches_of[damaged.base_offset] + batches_of[segments[-1].base_offset]
    log.close()


def test_layouts_unused_for_a_month_are_pruned(tmp_path: Path) -> None:
    log = views_log(tmp_path / "t-0")
    fill(log, 30)
    store = LayoutStore(tmp_path / "cache")
    View(Layout(log, TextRenderer(TextFormat(), 0), store=store, format_key="text"), 0).size()
    (used,) = list(store.root.iterdir())
    gone = store.root / "t-1.0123456789abcdef01234567"  # a data dir no longer mounted
    gone.mkdir()
    (gone / f"{0:020d}.layout").write_bytes(b"old")
    now = time.time()  # what a mount's touch writes
    month_ago = now - 31 * 86400
    for directory in (used, gone):
        os.utime(directory, (month_ago, month_ago))
    # A mount using a partition's layouts keeps them alive.
    Layout(log, TextRenderer(TextFormat(), 0), store=store, format_key="text")
    assert store.prune(now) == 1
    assert list(store.root.iterdir()) == [used]
    assert store.prune(now + 29 * 86400) == 0
    assert store.prune(now + 31 * 86400) == 1
    assert not used.exists()
    log.close()


@pytest.mark.expect_warnings("holds files it did not make")
def test_pruning_leaves_what_the_view_cache_did_not_make(tmp_path: Path) -> None:
    # `-o view.cache=$HOME` pruned every old directory there (a home directory lost Documents).
    home = tmp_path / "home"
    documents, lookalike = home / "Documents", home / "t-1.0123456789abcdef01234567"
    for directory in (documents, lookalike):
        directory.mkdir(parents=True)
    (documents / "letter.txt").write_text("keep me")
    (lookalike / "notes.txt").write_text("keep me too")  # named like layouts, holding other things
    month_ago = time.time() - 31 * 86400
    for directory in (documents, lookalike, home):
        os.utime(directory, (month_ago, month_ago))
    assert LayoutStore(home).prune(time.time()) == 0
    assert (documents / "letter.txt").read_text() == "keep me"
    assert (lookalike / "notes.txt").read_text() == "keep me too"


class _HeldRenderer(TextRenderer):
    """Measures only once `release` is set: a measure that takes as long as the test wants."""

    def __init__(self) -> None:
        super().__init__(TextFormat(), 0)
        self.measuring = threading.Event()
        self.release = threading.Event()

    def measure(self, header, batch) -> int:  # type: ignore[no-untyped-def]
        self.measuring.set()
        assert self.release.wait(30)
        return super().measure(header, batch)


def test_readers_on_the_loop_never_wait_for_a_measure(tmp_path: Path) -> None:
    """A measure holds the layout for as long as it renders (seconds per GiB): what the event
    loop asks of a layout (its known size, reads of rendered pages) must not wait for it (a
    follower's read stalled 255 ms behind a burst of appends, seconds behind a compaction)."""
    log = views_log(tmp_path / "t-0")
    log.append_records([b"one", b"two"], now_ms=NOW_MS)
    renderer = _HeldRenderer()
    renderer.release.set()
    layout = Layout(log, renderer)
    view = View(layout, 0)
    assert view.size() == 8 and view.read(0, 8) == b"one\ntwo\n"
    renderer.release.clear()
    log.append_records([b"three"], now_ms=NOW_MS)
    measurer = threading.Thread(target=view.size)  # a stat from a worker thread: measures "three"
    measurer.start()
    assert renderer.measuring.wait(10)
    answers: list[object] = []
    loop = threading.Thread(target=lambda: answers.extend([layout.known_size(), view.read_now(0, 8)]))
    loop.start()
    loop.join(10)
    blocked = loop.is_alive()
    renderer.release.set()
    measurer.join(10)
    loop.join(10)
    assert not blocked, "a reader on the loop waited for the measure"
    assert answers == [8, b"one\ntwo\n"]
    assert view.size() == 14
    log.close()


def failed_write_seen_by(view: View, log: PartitionLog) -> None:
    """A write split into several batches (max.message.bytes 300) that fails (ENOSPC) at its
    second batch, the first appended and measured by `view` meanwhile; the log cuts it back."""
    segment = log.active_segment
    real_append = segment.append
    calls: list[int] = []

    def append_then_fail(data, headers):  # type: ignore[no-untyped-def]
        calls.append(len(data))
        if len(calls) > 1:
            raise OSError(errno.ENOSPC, "No space left on device")
        real_append(data, headers)
        assert view.size() > len(b"kept\n")  # a reader measured the first batch of the write

    segment.append = append_then_fail  # type: ignore[method-assign]
    try:
        with pytest.raises(OSError):
            log.append_records([b"x" * 100] * 6, now_ms=NOW_MS)
    finally:
        segment.append = real_append  # type: ignore[method-assign]
    assert len(calls) == 2


def test_a_view_measured_during_a_failed_write_forgets_what_was_cut(tmp_path: Path) -> None:
    """The log cuts back a failed write whose first batches a view measured meanwhile: the view
    must too (a view reported 1808 bytes of a log holding 13)."""
    log = views_log(tmp_path / "t-0", **{"max.message.bytes": "300"})
    log.append_records([b"kept"], now_ms=NOW_MS)
    view = View(Layout(log, TextRenderer(TextFormat(), 0)), 0)
    assert view.size() == len(b"kept\n")
    failed_write_seen_by(view, log)
    assert view.size() == len(b"kept\n") and view.read(0, 100) == b"kept\n"
    log.append_records([b"after"], now_ms=NOW_MS)  # the same positions, other bytes
    assert view.read(0, 100) == expected_text(log, 0, TextFormat()) == b"kept\nafter\n"
    log.close()


def test_a_view_not_looking_during_the_cut_back_still_sees_it(tmp_path: Path) -> None:
    """As above, but the log grows past what the view measured before the view looks again:
    the view must still drop the cut batches (it stayed at 207 bytes of a log holding 279)."""
    log = views_log(tmp_path / "t-0", **{"max.message.bytes": "300"})
    log.append_records([b"kept"], now_ms=NOW_MS)
    view = View(Layout(log, TextRenderer(TextFormat(), 0)), 0)
    failed_write_seen_by(view, log)
    log.append_records([b"y" * 150, b"z" * 150], now_ms=NOW_MS)  # past the old measure before a look
    expected = expected_text(log, 0, TextFormat())
    assert view.size() == len(expected) and view.read(0, 1000) == expected
    log.close()


def test_a_page_rendered_before_a_cut_back_is_never_grown_after_it(tmp_path: Path) -> None:
    """A render of the growing segment's last page that finishes after the log cut a failed
    write back (on another thread: the loop's, a worker's) leaves that page as the one a
    follower's next read grows: it must not, as its bytes hold the records that were cut."""
    log = views_log(tmp_path / "t-0", **{"max.message.bytes": "300"})
    log.append_records([b"kept"], now_ms=NOW_MS)
    layout = Layout(log, TextRenderer(TextFormat(), 0))
    view = View(layout, 0)
    stale: list[object] = []

    def render_during_the_write() -> None:
        assert view.read(0, 1000).startswith(b"kept\nxxxx")  # the first batch of the failing write
        stale.append(layout.pages._tail)  # what that render leaves, late

    seen = View.size

    def size_and_render(self: View) -> int:
        size = seen(self)
        if not stale:
            render_during_the_write()
        return size

    View.size = size_and_render  # type: ignore[method-assign]
    try:
        failed_write_seen_by(view, log)
    finally:
        View.size = seen  # type: ignore[method-assign]
    assert view.size() == len(b"kept\n")  # the cut seen: the layout measured afresh
    layout.pages._tail = stale[0]  # type: ignore[assignment]  # the late render finishes now
    log.append_records([b"y" * 150, b"z" * 150], now_ms=NOW_MS)  # past where the cut write ended
    expected = expected_text(log, 0, TextFormat())
    assert view.size() == len(expected)
    assert view.read(0, 1000) == expected
    log.close()


@pytest.mark.parametrize("text_format", [TextFormat(print_offset=True, print_value=False), TextFormat()])
def test_pages_span_a_bounded_stretch_of_the_segment(tmp_path: Path, monkeypatch, text_format: TextFormat) -> None:
    """A view showing little of each record gets a mark every MARK_SEGMENT_BYTES of the segment
    as well as every MARK_BYTES of its own: a small read renders a bounded page. Every range
    still reads as the full rendering, and by offset too."""
    monkeypatch.setattr(views, "MARK_SEGMENT_BYTES", 10_000)
    log = views_log(tmp_path / "t-0", **{"segment.bytes": str(1 << 30)})
    for n in range(60):
        log.append_records([b"%d-" % n + b"x" * 2000] * (1 + n % 3), now_ms=NOW_MS)
    expected = expected_text(log, 0, text_format)
    layout = Layout(log, TextRenderer(text_format, 0))
    view = View(layout, 0)
    assert view.size() == len(expected)
    (segment_layout,) = layout._published[0]
    bounds = [segment_layout.page_bounds(mark) for mark in range(len(segment_layout.marks_file))]
    assert len(bounds) > 10 and all(end - start <= 10_000 + 6_200 for start, end in bounds)  # (+ a batch)
    rng = random.Random(7)
    for _ in range(200):
        at, length = rng.randrange(len(expected)), rng.randrange(1, 300)
        assert view.read(at, length) == expected[at : at + length]
    assert view.read(0, len(expected)) == expected
    for offset in (0, 1, 57, log.log_end_offset - 1):
        assert View(layout, offset).read(0, len(expected)) == expected_text(log, offset, text_format)
    log.close()


class RangeCountingRenderer:
    """A renderer that counts the batches it renders one by one and the ranges the core renders
    whole (`render_range`) or leaves to it: those of the render-ahead thread (`spans`) and those
    a reader on the loop renders (`reader_spans`, nowait)."""

    def __init__(self, renderer) -> None:
        self.renderer = renderer
        self.batches = 0
        self.ranges: list[bool] = []  # per range asked: rendered whole
        self.spans: list[tuple[int, int]] = []
        self.reader_spans: list[tuple[int, int]] = []

    def render_indexed(self, header, batch):
        self.batches += 1
        return self.renderer.render_indexed(header, batch)

    def measure(self, header, batch, columns=None):
        return self.renderer.measure(header, batch, columns)

    def render_range(self, fd, start, end, size, *, nowait=False):
        rendered = self.renderer.render_range(fd, start, end, size, nowait=nowait)
        self.ranges.append(rendered is not None)
        (self.reader_spans if nowait else self.spans).append((start, end))
        return rendered


def read_on_the_loop(view: View, position: int, length: int) -> bytes | memoryview | None:
    """`view.read_now` as the mount's loop calls it: a read that meets pages being rendered
    ahead waits for them and is tried again."""
    while True:
        try:
            return view.read_now(position, length)
        except page_cache.RenderingAhead as rendering:
            rendered = threading.Event()
            if rendering.when_rendered(rendered.set):
                assert rendered.wait(10), "the run being rendered ahead did not end"


def read_as_the_mount_does(view: View, chunk: int) -> bytes:
    """The whole view in `chunk`-byte reads one after the other, each served as the mount serves
    it: on the loop when it can be (`read_now`), else by a worker thread (`read`). Between two
    reads, the pages asked for are rendered ahead (as they are while a slow reader thinks)."""
    out, size = bytearray(), view.size()
    while len(out) < size:
        data = read_on_the_loop(view, len(out), min(chunk, size - len(out)))
        out += data if data is not None else view.read(len(out), chunk)
        assert page_cache.AHEAD.settle(10), "rendering ahead did not end"
    return bytes(out)


@pytest.fixture
def small_ahead(monkeypatch) -> None:
    """Render-ahead sized for small logs: calls of 4 KiB, 16 KiB ahead of a reader that read 2 KB."""
    monkeypatch.setattr(page_cache, "AHEAD_CALL_BYTES", 4096)
    monkeypatch.setattr(layout_pages, "AHEAD_BYTES", 16384)
    monkeypatch.setattr(layout_pages, "AHEAD_AFTER_BYTES", 2000)


def many_batches(log: PartitionLog) -> None:
    for n in range(300):
        log.append_records([b"%d-%d-" % (n, i) + b"x" * 40 for i in range(1 + n % 4)], now_ms=NOW_MS)


def measured_text_view(tmp_path: Path, renderer) -> tuple[PartitionLog, bytes, View]:
    """A log of `many_batches` in segments of 20,000 bytes, its text, and a measured view of it
    through `renderer`."""
    log = views_log(tmp_path / "t-0", **{"segment.bytes": "20000"})
    many_batches(log)
    view = View(Layout(log, renderer, mark_bytes=512), 0)
    view.size()
    return log, expected_text(log, 0, TextFormat()), view


@pytest.mark.usefixtures("small_ahead")
@pytest.mark.parametrize("jsonl", [False, True])
def test_a_sequential_reader_s_pages_are_rendered_ahead_by_the_core(tmp_path: Path, jsonl: bool) -> None:
    """Reads that go on from the last one have the pages after them rendered ahead, a run of
    pages a core call; the reader gets the same bytes, most of them from those calls."""
    log = views_log(tmp_path / "t-0", **{"segment.bytes": "20000"})
    many_batches(log)
    expected = expected_jsonl(log, 0) if jsonl else expected_text(log, 0, TextFormat())
    renderer = RangeCountingRenderer(JsonLinesRenderer("t", 0) if jsonl else TextRenderer(TextFormat(), 0))
    view = View(Layout(log, renderer, mark_bytes=512), 0)
    assert view.size() == len(expected)
    batches = renderer.batches  # (none: a first measure measures, it does not render)
    assert read_as_the_mount_does(view, 1000) == expected
    assert renderer.ranges and all(renderer.ranges), renderer.ranges
    assert renderer.batches - batches < 300 // 3, "most pages were rendered batch by batch"
    assert read_as_the_mount_does(View(view.layout, 77), 700) == (
        expected_jsonl(log, 77) if jsonl else expected_text(log, 77, TextFormat())
    )
    log.close()


@pytest.mark.usefixtures("small_ahead")
def test_a_reader_is_rendered_ahead_of_once_it_has_read_on_for_a_while(tmp_path: Path) -> None:
    """Nothing is rendered ahead of a read, nor of one that goes on from it (a buffered file's
    read of `by-offset/N`, split in two by the kernel), until the reads that went on from one
    another make `AHEAD_AFTER_BYTES`: pages asked ahead of a reader that stops were rendered
    for nothing."""
    renderer = RangeCountingRenderer(TextRenderer(TextFormat(), 0))
    log, expected, view = measured_text_view(tmp_path, renderer)
    position = 0
    for length in (1500, 400):  # (1,900 bytes)
        assert read_on_the_loop(view, position, length) == expected[position : position + length]
        position += length
        assert page_cache.AHEAD.settle(10) and renderer.spans == [], "rendered ahead of a reader that read 1,900 bytes"
    again = View(view.layout, 0)  # (another reader, from the start)
    again.size()
    assert read_on_the_loop(again, 0, 1900) == expected[:1900]
    assert page_cache.AHEAD.settle(10) and renderer.spans == []
    assert read_on_the_loop(view, position, 200) == expected[position : position + 200]  # (2,100 bytes on)
    assert page_cache.AHEAD.settle(10) and renderer.spans, "not rendered ahead of a reader that read 2,100 bytes on"
    log.close()


@pytest.mark.usefixtures("small_ahead")  # (the same for every example)
@settings(max_examples=30, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 9000), st.booleans(), st.integers(0, 12)), min_size=1, max_size=60))
def test_reads_through_runs_rendered_ahead_get_the_view_s_bytes(tmp_path_factory, reads) -> None:
    """Reads of any length from where the last ended (now and then from further back), on the
    loop or a worker thread, with the render-ahead thread let run or not in between: a read
    that takes a run rendered ahead takes its pages as one span and ends anywhere in it. The
    bytes are the view's, always."""
    log = views_log(tmp_path_factory.mktemp("logs") / "t-0", **{"segment.bytes": "30000"})
    many_batches(log)
    expected = expected_text(log, 0, TextFormat())
    view = View(Layout(log, TextRenderer(TextFormat(), 0), mark_bytes=300), 0)
    assert view.size() == len(expected)
    position = 0
    for length, on_the_loop, back in reads:
        if back > 9:  # (a reader that goes back: not sequential, nothing asked ahead)
            position = max(position - back * 1000, 0)
        data = read_on_the_loop(view, position, length) if on_the_loop else None
        if data is None:
            data = view.read(position, length)
        assert bytes(data) == expected[position : position + length], (position, length)
        position = min(position + len(data), len(expected))
        if back % 2:
            assert page_cache.AHEAD.settle(10), "rendering ahead did not end"
    assert page_cache.AHEAD.settle(10), "rendering ahead did not end"
    log.close()


class HeldRenderer(RangeCountingRenderer):
    """Holds the render-ahead thread in its first run until `go_on` is set (`started`: it is
    held)."""

    def __init__(self, renderer) -> None:
        super().__init__(renderer)
        self.started, self.go_on = threading.Event(), threading.Event()

    def render_range(self, fd, start, end, size, *, nowait=False):
        if not self.spans and not nowait:
            self.started.set()
            self.go_on.wait(10)
        return super().render_range(fd, start, end, size, nowait=nowait)


def end_of_the_run_being_rendered(layout: Layout) -> int:
    """The layout position where the run the render-ahead thread is rendering ends."""
    (_, segment, serial), _, last = page_cache.AHEAD._current
    order, starts = layout._published
    slot = next(i for i, s in enumerate(order) if s.segment is segment and s.serial == serial)
    return starts[slot] + order[slot].view_bounds(last)[1]


@pytest.mark.usefixtures("small_ahead")
def test_pages_a_reader_rendered_itself_are_not_rendered_ahead_after_it(tmp_path: Path) -> None:
    """A reader faster than the render-ahead thread catches up with pages still queued and
    renders them on the loop; a run that has not started then leaves out the pages the reader
    passed: the thread, held on its first run while the reader reads on past it, renders
    nothing more once let go. (The reader reads on from the end of the held run: the pages of
    a run being rendered are waited for, not rendered again.)"""
    log = views_log(tmp_path / "t-0", **{"segment.bytes": "20000"})
    many_batches(log)
    expected = expected_text(log, 0, TextFormat())
    renderer = HeldRenderer(TextRenderer(TextFormat(), 0))
    view = View(Layout(log, renderer, mark_bytes=512), 0)
    out, size = bytearray(), view.size()
    try:
        while len(out) < size:
            try:
                data = view.read_now(len(out), min(1000, size - len(out)))  # (a pending page is rendered here)
            except page_cache.RenderingAhead:
                assert renderer.started.is_set()
                skipped = end_of_the_run_being_rendered(view.layout)
                out += expected[len(out) : skipped]  # (the held run's pages, not read)
                view.read_now(len(out), 1)  # (what follows is read as a sequential reader's again)
                continue
            assert data is not None, len(out)
            out += data
            if page_cache.AHEAD.pending_count() and not renderer.started.is_set():
                assert renderer.started.wait(10), "the render-ahead thread did not start the run asked for"
    finally:
        renderer.go_on.set()
    assert page_cache.AHEAD.settle(10), "rendering ahead did not end"
    assert bytes(out) == expected
    # (each page by a call of the core: the loop's rendering of a complete page)
    rendered_by_reader = sum(end - start for start, end in renderer.reader_spans)
    assert rendered_by_reader > 0.7 * sum(s.size for s in log.segments), "the reader did not render the pages itself"
    assert len(renderer.spans) == 1, renderer.spans  # (the run it was held on)
    log.close()


def test_a_worker_thread_s_read_renders_a_complete_page_by_a_call_of_the_core(tmp_path: Path) -> None:
    """A page a worker thread's read needs that was not rendered ahead (a read that is not
    sequential, a page whose bytes were not in the OS page cache for the loop) is rendered by
    one call of the core, not batch by batch, and kept: a read inside it renders nothing."""
    renderer = RangeCountingRenderer(TextRenderer(TextFormat(), 0))
    log, expected, view = measured_text_view(tmp_path, renderer)
    batches = renderer.batches
    assert bytes(view.read(600, 10)) == expected[600:610]
    assert len(renderer.spans) == 1 and renderer.reader_spans == [] and renderer.batches == batches
    assert bytes(view.read(620, 10)) == expected[620:630]
    assert len(renderer.spans) == 1 and renderer.batches == batches
    log.close()


@pytest.mark.usefixtures("small_ahead")
def test_a_read_on_the_loop_waits_for_pages_being_rendered_ahead(tmp_path: Path) -> None:
    """A read on the loop that meets a page in the run the render-ahead thread is rendering
    raises RenderingAhead rather than render it a second time; `when_rendered` calls back once
    the run is done (and says False once it is), and the read then takes the run's pages."""
    renderer = HeldRenderer(TextRenderer(TextFormat(), 0))
    log, expected, view = measured_text_view(tmp_path, renderer)
    position = 0
    try:
        while True:
            data = view.read_now(position, 1000)  # (raises when it meets the held run)
            assert data is not None
            position += len(data)
            if page_cache.AHEAD.pending_count():
                assert renderer.started.wait(10), "the render-ahead thread did not start the run asked for"
    except page_cache.RenderingAhead as rendering:
        called = threading.Event()
        assert rendering.when_rendered(called.set)
        assert not called.wait(0.1), "called back before the run was done"
        renderer.go_on.set()
        assert called.wait(10), "not called back once the run was done"
        assert not rendering.when_rendered(called.set)  # (done: nothing to wait for)
    finally:
        renderer.go_on.set()
    reader_spans = len(renderer.reader_spans)
    data = view.read_now(position, 1000)
    assert data is not None and bytes(data) == expected[position : position + 1000]
    assert len(renderer.reader_spans) == reader_spans, "the run's pages were rendered again"
    assert page_cache.AHEAD.settle(10), "rendering ahead did not end"
    log.close()


@pytest.mark.expect_warnings("its views answer EIO there")
def test_a_view_from_an_offset_in_damaged_batches_one_after_the_other_begins_at_the_first(tmp_path: Path) -> None:
    """Two damaged batches in a row (their offsets unknown): a view from an offset of the first
    begins at the first's byte, which names the first."""
    log = views_log(tmp_path / "t-0")
    for n in range(40):
        log.append_records([b"v-%d" % n], now_ms=NOW_MS)
    segment = log.segments[0]
    first, second = list(segment.iter_headers())[3:5]
    before = len(expected_text(log, 0, TextFormat())) - len(expected_text(log, first.base_offset, TextFormat()))
    with open(segment.log_path, "r+b") as file:
        for header in (first, second):  # the last byte of each: their CRCs no longer hold
            file.seek(header.next_position - 1)
            byte = file.read(1)
            file.seek(header.next_position - 1)
            file.write(bytes([byte[0] ^ 0x01]))
    layout = Layout(log, TextRenderer(TextFormat(), 0), mark_bytes=64)
    assert len(View(layout, 0).read(0, 1 << 20)) == before
    view = View(layout, first.base_offset)
    assert view.size() == View(layout, 0).size() - before
    with pytest.raises(CorruptRecordError, match=rf"at position {first.position}: CRC-32C mismatch"):
        view.read(0, 10)
    log.close()


@pytest.mark.expect_warnings("its views answer EIO there")
@pytest.mark.parametrize("length", [10, 1 << 30], ids=["impossible", "past-the-end"])
def test_a_damaged_batch_length_in_a_sealed_segment_reads_as_eio_where_it_is(tmp_path: Path, length: int) -> None:
    """A sealed segment whose batch has a length field no batch can have (or one past the
    segment's end): the view does not end the segment there, as if the records after it were
    not there; its records before it are served, then one byte that reads as the damage (EIO
    naming file and position), then the next segments' records (the rest of its own cannot be
    found). In the last segment the same is a batch being written: the view ends before it."""
    from tests.engine.test_log import damage_batch_length

    log = views_log(tmp_path / "t-0", **{"segment.bytes": "3000"})
    for n in range(60):
        log.append_records([b"record-%d-" % n + b"x" * 100], now_ms=NOW_MS)
    first, second, last = log.segments[0], log.segments[1], log.segments[-1]
    whole = expected_text(log, 0, TextFormat())
    before = whole[: len(whole) - len(expected_text(log, 3, TextFormat()))]  # (one record a batch)
    after = expected_text(log, second.base_offset, TextFormat())
    damage_batch_length(last.log_path, 0, length)  # (its first and only batch)
    view = View(Layout(log, TextRenderer(TextFormat(), 0)), 0)
    assert view.size() == len(expected_text(log, 0, TextFormat())) < len(whole)
    after = after[: len(after) - (len(whole) - view.size())]  # (less the last segment's)
    position = damage_batch_length(first.log_path, 3, length)
    view = View(Layout(log, TextRenderer(TextFormat(), 0)), 0)
    assert view.size() == len(before) + 1 + len(after)
    assert bytes(view.read(0, view.size())) == before
    with pytest.raises(
        CorruptRecordError, match=rf"{first.log_path.name}: .* at position {position}: a batch is cut short"
    ):
        view.read(len(before), 10)
    assert bytes(view.read(len(before) + 1, view.size())) == after
    log.close()


def test_a_read_committed_view_never_shows_an_aborted_transaction_behind_damage(tmp_path: Path) -> None:
    """A transaction aborted by a marker that lies past a damaged length field in a sealed
    segment, its producer going on to commit a later one: whatever a read_committed view
    serves, an error where it cannot tell, never records of the aborted transaction."""
    from tests.cli.test_transactions import ABORT, COMMIT, control_batch, data_batch
    from tests.engine.test_log import damage_batch_length

    log = views_log(tmp_path / "t-0", **{"segment.bytes": "3000"})
    for n in range(60):
        if n in (2, 6, 40, 41):  # (7's transaction at 2 aborted at 6, its next one committed at 41)
            kind = {2: data_batch([b"aborted"], 7), 6: control_batch(7, ABORT), 40: data_batch([b"kept"], 7)}
            batch = kind.get(n) or control_batch(7, COMMIT)
            log.append_batches(batch, assign_offsets=True, now_ms=NOW_MS)
        else:
            log.append_records([b"record-%d" % n], now_ms=NOW_MS)
    assert log.segments[0].base_offset == 0 and log.segments[1].base_offset > 6
    damage_batch_length(log.segments[0].log_path, 4, 10)
    committed = View(Layout(log, TextRenderer(TextFormat(), 0), read_committed=True), 0)
    try:
        size = committed.size()
        served = b"".join(bytes(committed.read(at, 1)) for at in range(size) if not _damaged_byte(committed, at))
    except CorruptRecordError:
        served = b""
    assert b"aborted" not in served
    log.close()


def _damaged_byte(view: View, at: int) -> bool:
    try:
        view.read(at, 1)
    except CorruptRecordError:
        return True
    return False


def test_a_complete_page_is_rendered_on_the_loop_by_one_call_of_the_core_and_kept(tmp_path: Path) -> None:
    """A read on the event loop of a page not rendered renders that page whole, by a call of the
    core (not batch by batch), and keeps it: the next read inside the page renders nothing. A
    page rendered batch by batch already (to find an offset) is taken as it is; the growing
    segment's last page, which grows, is rendered batch by batch."""
    if not nowait_reads_work(tmp_path):
        pytest.skip("this file system cannot tell what is in the page cache: nothing is read on the loop")
    log = views_log(tmp_path / "t-0", **{"segment.bytes": "20000"})
    many_batches(log)
    expected = expected_text(log, 0, TextFormat())
    renderer = RangeCountingRenderer(TextRenderer(TextFormat(), 0))
    view = View(Layout(log, renderer, mark_bytes=512), 0)
    assert view.size() == len(expected)
    batches = renderer.batches  # (where offset 0 is: its page, batch by batch)
    assert view.read_now(0, 10) == expected[:10]  # (that page: taken as it is)
    assert renderer.reader_spans == [] and renderer.batches == batches
    assert view.read_now(600, 10) == expected[600:610]
    assert view.read_now(610, 10) == expected[610:620]
    assert len(renderer.reader_spans) == 1 and renderer.batches == batches
    last = len(expected) - 5
    assert view.read_now(last, 5) == expected[last:]
    assert renderer.batches > batches, "the growing segment's last page was not rendered batch by batch"
    log.close()


@pytest.mark.usefixtures("small_ahead")
def test_pages_the_core_does_not_render_whole_are_rendered_batch_by_batch(tmp_path: Path) -> None:
    """Compressed batches: the core's range renderer leaves them (None); the reader still gets
    every byte, rendered page by page."""
    log = views_log(tmp_path / "t-0", **{"segment.bytes": "20000", "compression.type": "gzip"})
    many_batches(log)
    expected = expected_text(log, 0, TextFormat())
    renderer = RangeCountingRenderer(TextRenderer(TextFormat(), 0))
    view = View(Layout(log, renderer, mark_bytes=512), 0)
    assert read_as_the_mount_does(view, 1000) == expected
    assert renderer.ranges and not any(renderer.ranges)
    # Declined once per segment, not asked again at every read.
    assert len(renderer.ranges) <= len(log.segments), renderer.ranges
    log.close()


@pytest.mark.usefixtures("small_ahead")
def test_a_damaged_batch_ahead_of_a_reader_is_reported_by_its_read(tmp_path: Path) -> None:
    """A batch damaged after the measure, ahead of a sequential reader: the run holding it is
    not rendered ahead, and the read that reaches it raises CorruptRecordError (the mount's
    EIO, named in its log) after every byte before it was read right; it never waits."""
    log = views_log(tmp_path / "t-0", **{"segment.bytes": "20000"})
    many_batches(log)
    log.flush()
    expected = expected_text(log, 0, TextFormat())
    renderer = RangeCountingRenderer(TextRenderer(TextFormat(), 0))
    view = View(Layout(log, renderer, mark_bytes=512), 0)
    assert view.size() == len(expected)
    segment = log.segments[2]
    with open(segment.log_path, "r+b") as damaged:  # a record's byte in the third segment
        damaged.seek(segment.size // 2)
        byte = damaged.read(1)
        damaged.seek(-1, os.SEEK_CUR)
        damaged.write(bytes([byte[0] ^ 0x40]))
    out = bytearray()
    with pytest.raises(CorruptRecordError, match=segment.log_path.name):
        while len(out) < len(expected):
            data = view.read_now(len(out), 1000)
            out += data if data is not None else view.read(len(out), 1000)
            assert page_cache.AHEAD.settle(10), "rendering ahead did not end"
    assert len(out) > 0 and bytes(out) == expected[: len(out)]
    assert False in renderer.ranges  # (the core left the damaged run)
    log.close()


@pytest.mark.usefixtures("small_ahead")
def test_read_committed_layouts_are_not_rendered_ahead(tmp_path: Path) -> None:
    log = views_log(tmp_path / "t-0", **{"segment.bytes": "20000"})
    many_batches(log)
    renderer = RangeCountingRenderer(TextRenderer(TextFormat(), 0))
    view = View(Layout(log, renderer, mark_bytes=512, read_committed=True), 0)
    assert read_as_the_mount_does(view, 1000) == expected_text(log, 0, TextFormat())
    assert renderer.ranges == []
    log.close()


@pytest.mark.usefixtures("small_ahead")
def test_rendering_ahead_fits_the_cache_and_renders_each_page_once(tmp_path: Path, monkeypatch) -> None:
    """JSON Lines of small records render several times larger than their batches: what is asked
    ahead is bounded by rendered bytes too, so it fits the cache, and no page is rendered ahead
    twice (bounded by segment bytes only, pages were evicted before they were read, and asked
    again and again)."""
    monkeypatch.setattr(page_cache.PAGES, "capacity_bytes", 40_000)
    log = views_log(tmp_path / "t-0", **{"segment.bytes": str(1 << 30)})
    for _ in range(200):
        log.append_records([b"%d" % i for i in range(30)], now_ms=NOW_MS)
    renderer = RangeCountingRenderer(JsonLinesRenderer("t", 0))
    view = View(Layout(log, renderer, mark_bytes=512), 0)
    assert read_as_the_mount_does(view, 1000) == expected_jsonl(log, 0)
    assert renderer.spans and len(set(renderer.spans)) == len(renderer.spans)
    assert renderer.batches < 200 // 3, "most pages were rendered batch by batch"
    log.close()


def test_two_readers_pages_rendered_ahead_are_not_evicted_before_they_are_read(tmp_path: Path, monkeypatch) -> None:
    """Two sequential readers of two partitions, read by turns: what is asked ahead for both,
    and the runs they are in, fit the cache as the mount sizes it, so neither reader renders
    the pages asked for it again (with the cache half as large, each rendered most of them)."""
    scale = 4096 / page_cache.AHEAD_CALL_BYTES  # (small runs; the cache and how far ahead as the mount has them)
    monkeypatch.setattr(page_cache, "AHEAD_CALL_BYTES", 4096)
    monkeypatch.setattr(layout_pages, "AHEAD_BYTES", int(layout_pages.AHEAD_BYTES * scale))
    monkeypatch.setattr(layout_pages, "AHEAD_AFTER_BYTES", int(layout_pages.AHEAD_AFTER_BYTES * scale))
    monkeypatch.setattr(page_cache.PAGES, "capacity_bytes", int(page_cache.PAGE_CACHE_BYTES * scale))
    readers = []
    for n in range(2):
        log = views_log(tmp_path / f"t-{n}", **{"segment.bytes": "40000"})
        many_batches(log)
        renderer = RangeCountingRenderer(TextRenderer(TextFormat(), 0))
        readers.append((log, renderer, View(Layout(log, renderer, mark_bytes=512), 0), bytearray()))
    while any(len(out) < view.size() for _, _, view, out in readers):
        for _, _, view, out in readers:
            if len(out) < view.size():
                data = read_on_the_loop(view, len(out), min(1000, view.size() - len(out)))
                out += data if data is not None else view.read(len(out), 1000)
                assert page_cache.AHEAD.settle(10), "rendering ahead did not end"
    for log, renderer, _, out in readers:
        assert bytes(out) == expected_text(log, 0, TextFormat())
        rendered_by_reader = sum(end - start for start, end in renderer.reader_spans)
        # (all but the first pages, which a reader renders before it is rendered ahead of)
        assert rendered_by_reader < 0.25 * sum(s.size for s in log.segments), "pages asked ahead were evicted unread"
        log.close()


def test_a_worker_read_waits_a_bounded_time_for_a_page_rendered_ahead(tmp_path: Path, monkeypatch) -> None:
    """A page asked for ahead that never comes (its rendering stuck) holds a worker thread's read
    `_AHEAD_WAIT_S` at most: then the read renders it itself."""
    monkeypatch.setattr(layout_pages, "_AHEAD_WAIT_S", 0.2)
    log = views_log(tmp_path / "t-0")
    fill(log, 10)
    layout = Layout(log, TextRenderer(TextFormat(), 0), mark_bytes=64)
    view = View(layout, 0)
    size = view.size()
    (segment_layout,) = [s for s in layout._published[0] if len(s.marks_view) > 1][:1]
    key = page_cache.page_key(layout.pages, segment_layout, 0)
    page_cache.AHEAD._pending.add(key)  # (asked for, and its run never ends)
    try:
        started = time.monotonic()
        assert view.read(0, size) == expected_text(log, 0, TextFormat())
        assert 0.2 <= time.monotonic() - started < 5
    finally:
        page_cache.AHEAD._pending.discard(key)
    log.close()
