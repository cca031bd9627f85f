"""Rendered pages of views: the one cache every layout's pages are kept in (`PAGES`), however
they were rendered, and the thread that renders the pages after a sequential reader's last read
ahead of it (`AHEAD`), many pages a call of the engine's core, which reads, checks and renders
them with the GIL released: the rendering runs on another core while the event loop serves the
reads. See fs.views for what a page is, and fs.layout_pages for who renders one when.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from seglogfs.engine.errors import EngineError
from seglogfs.engine.record.records import BatchHeader
from seglogfs.engine.text.renderers import RenderedBatch
from seglogfs.fs.layout_store import SegmentLayout

logger = logging.getLogger(__name__)

# Rendered pages kept, for all layouts together: two sequential readers' pages asked ahead and
# the runs they are reading (64 MiB), and the pages rendered batch by batch (32 MiB).
PAGE_CACHE_BYTES = 96 << 20


# A page rendered batch by batch: each batch's rendering, with where each record's text starts
# (what finding an offset in a view needs).
Page = list[tuple[BatchHeader, RenderedBatch]]


@dataclass(frozen=True, slots=True)
class RenderedSpan:
    """A complete page rendered whole by one call of the core, alone or in a run of pages: the
    page is `data[start:end]`; the run goes on to `run_end`, where its last page, `last_mark`,
    ends (a reader takes the pages it reads of a run as one piece)."""

    data: bytes
    start: int
    end: int
    run_end: int
    last_mark: int


Rendering = Page | RenderedSpan


class PageCache:
    """Recently rendered pages of every layout, bounded in bytes, by `page_key`: a page rendered
    batch by batch (`Page`) or whole by the core (`RenderedSpan`), with the bounds it was
    rendered for (a growing segment's last page grows: a rendering of other bounds is not the
    page). One entry a page: a page rendered batch by batch serves every reader, so a rendering
    whole never replaces it. An open, a stat and the reads of one place share them. Keys hold
    the layout and segment objects themselves (not their ids, which a later object may reuse).
    Thread-safe."""

    def __init__(self, capacity_bytes: int) -> None:
        self.capacity_bytes = capacity_bytes
        self._pages: OrderedDict[tuple[object, ...], tuple[tuple[int, int], Rendering, int]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self._rendering: dict[tuple[object, ...], threading.Event] = {}

    def get(self, key: tuple[object, ...], bounds: tuple[int, int]) -> Rendering | None:
        """The page under `key` rendered for `bounds`, however it was rendered."""
        with self._lock:
            entry = self._pages.get(key)
            if entry is None or entry[0] != bounds:
                return None
            self._pages.move_to_end(key)
            return entry[1]

    def holds(self, key: tuple[object, ...]) -> bool:
        """Whether the page under `key` is rendered (a complete page: its bounds never change)."""
        with self._lock:
            return key in self._pages

    def batches(self, key: tuple[object, ...], bounds: tuple[int, int]) -> Page | None:
        """The page under `key` for `bounds` if it was rendered batch by batch."""
        rendering = self.get(key, bounds)
        return rendering if isinstance(rendering, list) else None

    def render_once(self, key: tuple[object, ...], bounds: tuple[int, int], render: Callable[[], Page]) -> Page:
        """The page under `key`, rendered batch by batch by `render` unless it is cached so or
        another thread is rendering it already (then that thread's result: two readers of one
        place render it once)."""
        page = self.batches(key, bounds)
        if page is not None:
            return page
        with self._lock:
            waiting = self._rendering.get(key)
            if waiting is None:
                self._rendering[key] = done = threading.Event()
        if waiting is not None:
            waiting.wait()
            page = self.batches(key, bounds)
            return page if page is not None else render()  # its rendering failed (or other bounds): ourselves
        return self._render_claimed(key, bounds, done, render)

    def render_unless_busy(
        self, key: tuple[object, ...], bounds: tuple[int, int], render: Callable[[], Page]
    ) -> Page | None:
        """`render_once` for the event loop, which must not wait: None when another thread is
        rendering the page."""
        page = self.batches(key, bounds)
        if page is not None:
            return page
        with self._lock:
            if key in self._rendering:
                return None
            self._rendering[key] = done = threading.Event()
        return self._render_claimed(key, bounds, done, render)

    def _render_claimed(
        self, key: tuple[object, ...], bounds: tuple[int, int], done: threading.Event, render: Callable[[], Page]
    ) -> Page:
        """Render a page this thread has claimed, keep it, and let whoever waits for it go."""
        try:
            page = render()
            self.put(key, bounds, page)
            return page
        finally:
            with self._lock:
                del self._rendering[key]
            done.set()

    def put(self, key: tuple[object, ...], bounds: tuple[int, int], rendering: Rendering) -> None:
        """Keep a page's rendering: over one of other bounds, or one rendered whole (by a run, or
        alone), never over one rendered batch by batch for these bounds."""
        if isinstance(rendering, RenderedSpan):
            weight = rendering.end - rendering.start
        else:
            weight = sum(len(rendered.data) + 16 * len(rendered.offsets) for _, rendered in rendering) + 200 * len(
                rendering
            )
        with self._lock:
            kept = self._pages.get(key)
            if kept is not None:
                if kept[0] == bounds and isinstance(kept[1], list):
                    return  # (rendered batch by batch: it stays)
                del self._pages[key]
                self._bytes -= kept[2]
            self._pages[key] = (bounds, rendering, weight)
            self._bytes += weight
            while self._bytes > self.capacity_bytes and len(self._pages) > 1:
                _, (_, _, dropped) = self._pages.popitem(last=False)
                self._bytes -= dropped


PAGES = PageCache(PAGE_CACHE_BYTES)


# A test hook: each run rendered ahead takes this much longer (readers catch up with the thread).
AHEAD_DELAY_ENV = "SEGLOGFS_TEST_AHEAD_DELAY_MS"
_AHEAD_DELAY_S = float(os.environ.get(AHEAD_DELAY_ENV, "0") or 0) / 1000
# A run rendered ahead is a call of the core of at most this many bytes of segment or of rendering
# (fs.views says how far ahead of a reader).
AHEAD_CALL_BYTES = 4 << 20
_AHEAD_SEGMENTS_KEPT = 1024  # segment layouts whose asks are remembered (the latest)
_DECLINED = -1


class Layout(Protocol):
    """What the render-ahead thread asks of a partition's layout, through its pages
    (fs.layout_pages.LayoutPages): a run of its complete pages, rendered by one call of the core."""

    def render_run(
        self, layout: SegmentLayout, marks: list[int], *, nowait: bool = False
    ) -> list[tuple[bytes, int, int]]: ...


class RenderingAhead(Exception):
    """A read on the event loop (`read_now`) met a page that the render-ahead thread is
    rendering at this moment. Rendering it again on the loop would throw one of the two away
    and hold up the loop, which serves the reader; the read waits for the run instead
    (`when_rendered`) and is tried again."""

    def __init__(self, key: tuple[object, ...]) -> None:
        super().__init__("a page is being rendered ahead")
        self._key = key

    def when_rendered(self, callback: Callable[[], None]) -> bool:
        """Have `callback` called, from the render-ahead thread, once the page is rendered or
        given up; False (and no call) when that happened already."""
        return AHEAD.when_rendered(self._key, callback)


class RenderAhead:
    """Pages rendered ahead of sequential readers on a thread of their own, a run of pages a call
    of the core (`Renderer.render_range`), each kept in `PAGES` as its span of the run's
    rendering (a reader takes the pages it reads of a run as one piece, not one look-up a page).
    A run the core does not render (compressed or damaged batches, a file cut short) is left to
    the readers, who render it page by page and say what is wrong. Thread-safe."""

    def __init__(self) -> None:
        self._pending: set[tuple[object, ...]] = set()  # asked for, not rendered yet
        # Pending pages a reader caught up with and rendered itself (`take`): a run not started
        # yet drops them and the pages before them, which its reader has passed. (Without this,
        # a reader faster than the thread had it render pages already read: 4,332 of 14,051
        # pages of three `cat`s of a 1 GiB view on a busy machine.)
        self._taken: set[tuple[object, ...]] = set()
        self._runs: deque[tuple[Layout, SegmentLayout, list[int]]] = deque()
        # Per segment layout (the latest few): how far its pages were asked for, so a sequential
        # reader's next ask looks only past that; _DECLINED once the core did not render a run of
        # it whole (compressed batches, most often): not asked again, its readers render it page
        # by page.
        self._asked: OrderedDict[tuple[object, ...], int] = OrderedDict()
        self._lock = threading.Lock()
        self._work = threading.Condition(self._lock)  # a run queued; a run done (pages rendered or given up)
        self._thread: threading.Thread | None = None
        self._current: tuple[tuple[object, ...], int, int] | None = None  # the run being rendered: segment key, marks
        self._when_done: list[Callable[[], None]] = []  # called once the run being rendered is done

    def wait(self, key: tuple[object, ...], timeout: float) -> None:
        """Until the page under `key` is rendered ahead or given up, if it was asked for and is
        not yet; `timeout` seconds at most."""
        with self._lock:
            self._work.wait_for(lambda: key not in self._pending, timeout)

    def rendering(self, key: tuple[object, ...]) -> bool:
        """Whether the page under `key` is in the run being rendered at this moment."""
        with self._lock:
            return self._rendering_locked(key)

    def when_rendered(self, key: tuple[object, ...], callback: Callable[[], None]) -> bool:
        """Have `callback` called (on the render-ahead thread) once the run being rendered is
        done, if the page under `key` is in it; False (and no call) when it is not."""
        with self._lock:
            if not self._rendering_locked(key):
                return False
            self._when_done.append(callback)
            return True

    def _rendering_locked(self, key: tuple[object, ...]) -> bool:
        current = self._current
        return current is not None and key[:3] == current[0] and current[1] <= key[3] <= current[2]  # type: ignore[operator]

    def pending_count(self) -> int:
        """How many pages are asked for and not rendered yet (for tests)."""
        with self._lock:
            return len(self._pending)

    def take(self, key: tuple[object, ...]) -> None:
        """A reader renders the page under `key` itself (it was asked for and is not rendered
        yet): a run that has not started leaves it out, with the pages before it."""
        with self._lock:
            if key in self._pending:
                self._taken.add(key)

    def declined(self, layout: Layout, segment_layout: SegmentLayout) -> bool:
        """Whether the core did not render a run of the segment layout whole (then it is not
        asked to again)."""
        with self._lock:
            return self._asked.get((layout, segment_layout.segment, segment_layout.serial)) == _DECLINED

    def decline(self, layout: Layout, segment_layout: SegmentLayout) -> None:
        """The core did not render a page of the segment layout whole: no run of it is asked for
        any more (its readers render it page by page)."""
        with self._lock:
            self._asked[(layout, segment_layout.segment, segment_layout.serial)] = _DECLINED

    def ask(self, layout: Layout, segment_layout: SegmentLayout, marks: range, *, whole: bool) -> None:
        """Render the pages `marks` of a segment layout ahead, but those kept or asked for already
        (every mark a complete page: its bounds never change), in runs of at most
        `AHEAD_CALL_BYTES` of segment or of rendering; the last run only when it makes three
        quarters of that, unless `whole` (the marks reach the last complete page)."""
        segment_key = (layout, segment_layout.segment, segment_layout.serial)
        with self._lock:
            asked_to = self._asked.get(segment_key, marks.start)
            if asked_to == _DECLINED:
                return
            first = asked_to if marks.start < asked_to <= marks.stop else marks.start  # (else: a reader went back)
            if not whole and first < marks.stop:
                # Too little to make a run yet (what a sequential reader's asks are, most of the
                # time): told from the marks, not page by page (a short run waits for up to
                # three quarters of a call's bytes, a hundred pages and more).
                last = marks.stop - 1
                segment_bytes = segment_layout.page_bounds(last)[1] - segment_layout.marks_file[first]
                view_bytes = segment_layout.view_bounds(last)[1] - segment_layout.marks_view[first]
                if max(segment_bytes, view_bytes) < AHEAD_CALL_BYTES * 3 // 4:
                    self._note_asked(segment_key, first)
                    return
            run: list[int] = []
            run_bytes = 0
            for mark in range(first, marks.stop):
                key = page_key(layout, segment_layout, mark)
                if key in self._pending or mark in segment_layout.damage or PAGES.holds(key):
                    continue  # (a damaged batch's page is never rendered: it reads as the damage)
                cost = max(span(segment_layout.page_bounds(mark)), span(segment_layout.view_bounds(mark)))
                if run and (run[-1] != mark - 1 or run_bytes + cost > AHEAD_CALL_BYTES):
                    self._queue(layout, segment_layout, run)
                    run, run_bytes = [], 0
                run.append(mark)
                run_bytes += cost
            if run and (run_bytes >= AHEAD_CALL_BYTES * 3 // 4 or whole):
                self._queue(layout, segment_layout, run)
            elif run:  # (a short run waits until the reader is closer: fewer, longer calls)
                self._note_asked(segment_key, run[0])
            if not self._runs:
                return
            if self._thread is None:
                self._thread = threading.Thread(target=self._render_runs, name="render ahead", daemon=True)
                self._thread.start()
            self._work.notify()

    def _queue(self, layout: Layout, segment_layout: SegmentLayout, run: list[int]) -> None:
        self._pending.update(page_key(layout, segment_layout, mark) for mark in run)
        self._runs.append((layout, segment_layout, run))
        self._note_asked((layout, segment_layout.segment, segment_layout.serial), run[-1] + 1)

    def _note_asked(self, segment_key: tuple[object, ...], asked_to: int) -> None:
        if self._asked.get(segment_key) == _DECLINED:
            return
        self._asked[segment_key] = asked_to
        self._asked.move_to_end(segment_key)
        while len(self._asked) > _AHEAD_SEGMENTS_KEPT:
            self._asked.popitem(last=False)

    def settle(self, timeout: float) -> bool:
        """Wait until every page asked for is rendered or given up (for tests); False on timeout."""
        with self._lock:
            return self._work.wait_for(lambda: not self._pending, timeout)

    def _render_runs(self) -> None:
        while True:
            with self._lock:
                while not self._runs:
                    self._work.wait()
                layout, segment_layout, run = self._runs.popleft()
                segment_key = (layout, segment_layout.segment, segment_layout.serial)
                declined = self._asked.get(segment_key) == _DECLINED
                run = self._untaken_locked(layout, segment_layout, run)
                if not run:
                    continue
                self._current = (segment_key, run[0], run[-1])
            try:
                self._render_run(layout, segment_layout, run, declined=declined)
            finally:  # (however it ended, the run is over for the readers waiting for it)
                with self._lock:
                    self._current = None
                    done, self._when_done = self._when_done, []
                    self._work.notify_all()
                for callback in done:
                    try:
                        callback()
                    except Exception:  # (the thread renders on for the other readers)
                        logger.exception("rendering ahead: telling a reader a run is done")

    def _render_run(self, layout: Layout, segment_layout: SegmentLayout, run: list[int], *, declined: bool) -> None:
        """Render a run of pages and keep them, or decline the segment layout when the core
        does not render them."""
        segment_key = (layout, segment_layout.segment, segment_layout.serial)
        pages: list[tuple[bytes, int, int]] = []
        if _AHEAD_DELAY_S:
            time.sleep(_AHEAD_DELAY_S)
        try:
            if not declined:  # (asked before an earlier run of the same segment was declined)
                pages = layout.render_run(segment_layout, run)
        except (EngineError, ValueError, OSError) as error:  # damaged data, a failed read: left to the readers
            logger.debug("rendering ahead in %s: %s", segment_layout.segment.log_path, error)
        except Exception:  # a fault of ours: said whole, and the thread renders on (the readers render it)
            logger.exception("rendering ahead in %s", segment_layout.segment.log_path)
        with self._lock:
            if not pages:
                self._asked[segment_key] = _DECLINED
            if pages:
                data, run_end, last = pages[0][0], pages[-1][2], run[-1]
                for mark, (_, start, end) in zip(run, pages, strict=True):
                    PAGES.put(
                        page_key(layout, segment_layout, mark),
                        segment_layout.page_bounds(mark),
                        RenderedSpan(data, start, end, run_end, last),
                    )
            for mark in run:
                key = page_key(layout, segment_layout, mark)
                self._pending.discard(key)
                self._taken.discard(key)

    def _untaken_locked(self, layout: Layout, segment_layout: SegmentLayout, run: list[int]) -> list[int]:
        """The marks of a run about to start, but those up to the last page a reader took: those
        are given up (their waiters render them)."""
        keys = [page_key(layout, segment_layout, mark) for mark in run]
        passed = max((i + 1 for i, key in enumerate(keys) if key in self._taken), default=0)
        for key in keys[:passed]:
            self._pending.discard(key)
            self._taken.discard(key)
        if passed:
            self._work.notify_all()
        return run[passed:]


def span(bounds: tuple[int, int]) -> int:
    return bounds[1] - bounds[0]


def page_key(layout: Layout, segment_layout: SegmentLayout, mark: int) -> tuple[object, ...]:
    return (layout, segment_layout.segment, segment_layout.serial, mark)


AHEAD = RenderAhead()
