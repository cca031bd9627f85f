"""The pages of a layout (fs.views.Layout) and the reads of its bytes: how what a layout measured
is rendered and served.

A page is the batches between two marks of a segment's layout. A read is the pages it covers, as
spans of the renderings that hold them (views, not copies). A page is kept, however it was
rendered, in one cache (`page_cache.PAGES`), and rendered in one of two ways:

* whole, by a call of the engine's core (a `RenderedSpan`): a complete page, in a run of the
  pages after a sequential reader's last read rendered ahead of it by the render-ahead thread
  (`page_cache.AHEAD`), or alone when a reader catches up with that thread or reads where it was
  not asked (`_render_whole`);
* batch by batch (a `Page`: `page`): what a look-up of an offset reads (it needs each batch's
  rendering and offsets), the growing segment's last page (grown by what was appended,
  `_tail`), and the pages the core does not render whole.

A read finds a page in the cache or renders it; on the event loop (`_page_now`) only while its
bytes are in the OS page cache and the read's budget allows, else the read goes to a worker
thread.

Thread-safe as a layout is: the cache and the render-ahead thread have their own locks, and
`_tail` and `_read_ends` are replaced whole or appended to (a late write of either costs a
render, never wrong bytes).
"""

from __future__ import annotations

import bisect
import itertools
from collections import deque
from collections.abc import Callable, Iterator
from typing import Protocol

from seglogfs.engine.errors import EngineError
from seglogfs.engine.record.columns import RecordColumns
from seglogfs.engine.record.records import BatchHeader
from seglogfs.engine.text.renderers import RenderedBatch
from seglogfs.fs import page_cache
from seglogfs.fs.layout_store import SegmentLayout
from seglogfs.fs.page_cache import Page, RenderedSpan, RenderingAhead


class Renderer(Protocol):
    """How a batch's records look in a view (engine.console's TextRenderer, JsonLinesRenderer)."""

    def render_indexed(self, header: BatchHeader, batch: memoryview) -> RenderedBatch: ...

    def measure(self, header: BatchHeader, batch: memoryview, columns: RecordColumns | None = None) -> int: ...

    def render_range(self, fd: int, start: int, end: int, size: int, *, nowait: bool = False) -> bytes | None: ...


# A read may render pages on the event loop, this many segment bytes of them at most, when their
# bytes are in the OS page cache: a request's worth (views advertise 1 MiB as their I/O size) and
# the pages it starts and ends in. That is 0.4-0.5 ms as text and about 1.3 ms as JSON Lines here;
# handing it to a worker thread costs more than rendering it, and a sequential reader (`cat`,
# `grep`) ran at two thirds of the speed that way.
INLINE_RENDER_BYTES = 1280 * 1024
# A sequential reader's next pages are rendered ahead of it (`fs.page_cache.RenderAhead`): this
# many bytes of segment, and of rendering, past its last read, at most `AHEAD_PAGES` pages, a core
# call per `page_cache.AHEAD_CALL_BYTES` at most. A call takes the GIL once, so the loop serving
# the reads is barely held up, and the rendering runs on the other core. (Half as far ahead, `cat`
# of a 1 GiB view ran at 0.72-0.91 of the speed of `cat` of its segments through `.logdir`,
# against 0.84-1.0.)
AHEAD_BYTES = 16 << 20
AHEAD_PAGES = 512
# A reader is rendered ahead of once it has read this much in reads that each went on from the
# last: a single 1 MiB read (`head`, or `by-offset/N` read through a buffered file, which the
# kernel splits in two requests where the buffer crosses a page) had 16 MiB rendered that were
# never read.
AHEAD_AFTER_BYTES = 2 << 20
_AHEAD_WAIT_S = 5.0  # a worker thread's read waits this long for a page rendered ahead, then renders it


def joined(pieces: list[memoryview]) -> bytes | memoryview:
    """Pieces as one buffer: the piece itself when there is one (no copy)."""
    return pieces[0] if len(pieces) == 1 else b"".join(pieces)


class LayoutPages:
    """The pages of one layout, and reads of its bytes (see the module docstring)."""

    def __init__(
        self,
        renderer: Renderer,
        render_batch: Callable[[BatchHeader, memoryview], RenderedBatch],
        *,
        renders_ahead: bool,
    ) -> None:
        self.renderer = renderer
        self._render_batch = render_batch
        # Rendering ahead of sequential readers (`pieces`): read_uncommitted layouts only, whose
        # pages are their batches' renderings whole. Where recent reads ended, and how much their
        # readers had read in reads that each went on from the last: a read that goes on from
        # one continues its reader's run.
        self._renders_ahead = renders_ahead
        self._read_ends: deque[tuple[int, int]] = deque(maxlen=8)
        # The growing segment's last page: its segment layout (a cut-back makes a new one, so a
        # page rendered before it, late, is never grown after it), start, end and batches.
        self._tail: tuple[SegmentLayout, int, int, Page] | None = None

    def forget_tail(self) -> None:
        """The log was cut back: the growing segment's last page is rendered afresh."""
        self._tail = None

    def page(self, layout: SegmentLayout, mark: int) -> Page:
        """The batches between mark `mark` and the next, each with its rendering
        (CorruptRecordError for a damaged batch's page)."""
        layout.check_page(mark)
        bounds = layout.page_bounds(mark)
        key = page_cache.page_key(self, layout, mark)
        return page_cache.PAGES.render_once(key, bounds, lambda: self._render_page(layout, *bounds))

    def _page_now(self, layout: SegmentLayout, mark: int, budget: int) -> tuple[Page | None, int]:
        """`page` for the event loop, and how many segment bytes it rendered: the page if it is
        rendered batch by batch already, or holds at most `budget` segment bytes and they are in
        the OS page cache (then it is rendered here); else None. (By segment bytes, not rendered
        ones: a page of a view that shows little of each record, `print.value=false` or aborted
        transactions read_committed, spans a long stretch of the segment.)"""
        bounds = layout.page_bounds(mark)
        key = page_cache.page_key(self, layout, mark)
        page = page_cache.PAGES.batches(key, bounds)
        cost = bounds[1] - bounds[0]
        if page is not None or cost > budget:
            return page, 0
        try:
            return page_cache.PAGES.render_unless_busy(
                key, bounds, lambda: self._render_page(layout, *bounds, nowait=True)
            ), cost
        except BlockingIOError:
            return None, 0
        except (EngineError, ValueError, OSError):  # damaged data: the worker thread's read reports it
            return None, 0

    def _render_page(self, layout: SegmentLayout, start: int, end: int, *, nowait: bool = False) -> Page:
        """Render a page; the last page of a growing segment is extended by what was appended
        (a follower asks for it after every append). `nowait`: BlockingIOError when its bytes
        are not in the OS page cache."""
        segment = layout.segment
        render = self._render_batch
        tail = self._tail
        grown = tail is not None and tail[0] is layout and tail[1] == start and tail[2] < end
        first = tail[2] if grown and tail is not None else start
        page = [(header, render(header, batch)) for header, batch in segment.checked_batches(first, end, nowait=nowait)]
        if grown and tail is not None:
            page = tail[3] + page
        if not layout.sealed and end == layout.scanned_to:
            self._tail = (layout, start, end, page)
        return page

    def pieces(
        self, published: tuple[list[SegmentLayout], list[int]], position: int, length: int, *, now: bool
    ) -> Iterator[memoryview | None]:
        """The layout bytes [position, position + length) as pieces of renderings (views, not
        copies: pages rendered ahead together make one piece); with `now`, None (and the end)
        at the first page `_page_now` cannot give within the read's rendering budget; None (and
        the end) after the bytes before a page that fails, unless it is the first (then its
        error is raised: the read that starts there fails). A read
        that goes on from where an earlier one ended has the pages after it rendered ahead
        (`fs.page_cache.RenderAhead`)."""
        order, starts = published
        ends = list(self._read_ends)  # (a copy: reads on worker threads note theirs meanwhile)
        run = next((run for end, run in reversed(ends) if end == position), 0) + length
        if (position + length, run) not in ends:  # (once: a read tried again)
            self._read_ends.append((position + length, run))
        sequential = self._renders_ahead and run >= AHEAD_AFTER_BYTES
        wanted = length
        budget = INLINE_RENDER_BYTES
        slot = max(bisect.bisect_right(starts, position) - 1, 0)
        last: tuple[SegmentLayout, int] | None = None  # the page the read ends in
        piece: tuple[bytes, int, int] | None = None  # (rendering, start, end) not yet yielded
        while slot < len(order) and wanted > 0:
            layout = order[slot]
            local = position + length - wanted - starts[slot]
            if 0 <= local < layout.size:
                mark = bisect.bisect_right(layout.marks_view, local) - 1
                at = layout.marks_view[mark]
                while mark < len(layout.marks_view) and wanted > 0:
                    try:
                        spans = self._page_spans(layout, mark, budget if now else None)
                    except (EngineError, OSError):
                        if piece is None and wanted == length:
                            raise  # (the read starts at what failed)
                        # The bytes before what failed (a damaged batch), and the end: the read
                        # that starts there fails (a read on the loop gives them on a worker).
                        if piece is not None:
                            yield memoryview(piece[0])[piece[1] : piece[2]]
                        yield None
                        return
                    if spans is None:
                        yield None
                        return
                    pieces, cost, next_mark = spans
                    budget -= cost
                    for data, low, high in pieces:
                        if at + high - low > local:
                            begin = low + max(local - at, 0)
                            end = min(high, begin + wanted)
                            wanted -= end - begin
                            if piece is not None and piece[0] is data and piece[2] == begin:
                                piece = (data, piece[1], end)
                            else:
                                if piece is not None:
                                    yield memoryview(piece[0])[piece[1] : piece[2]]
                                piece = (data, begin, end)
                            if wanted <= 0:
                                if next_mark > mark + 1:  # (a span of several pages: the one it ends in)
                                    next_mark = bisect.bisect_right(layout.marks_view, at + end - low - 1)
                                break
                        at += high - low
                    last = (layout, next_mark - 1)
                    mark = next_mark
            slot += 1
        if piece is not None:
            yield memoryview(piece[0])[piece[1] : piece[2]]
        if sequential and last is not None:
            self._ask_ahead(*last)

    def _page_spans(
        self, layout: SegmentLayout, mark: int, budget: int | None
    ) -> tuple[list[tuple[bytes, int, int]], int, int] | None:
        """A page's bytes as spans (rendering, start, end) of the renderings they are kept in, the
        segment bytes rendered for them, and the mark after the pages they hold: as the cache
        has the page (rendered whole, in a run: the span of the page and of the pages after it
        in the run; or batch by batch), else rendered now. With a `budget` (a read on the event
        loop, which never blocks), None when `_page_now` cannot give the page; RenderingAhead
        when the page is in the run being rendered ahead (its caller waits for it), and a page
        asked for ahead whose run has not started is rendered here (the run leaves it out).
        Without (a worker thread's read), a page asked for ahead is waited for, `_AHEAD_WAIT_S`
        at most (then rendered here)."""
        layout.check_page(mark)
        key = page_cache.page_key(self, layout, mark)
        bounds = layout.page_bounds(mark)
        if self._renders_ahead and budget is None:
            page_cache.AHEAD.wait(key, _AHEAD_WAIT_S)
        rendered = page_cache.PAGES.get(key, bounds)
        if isinstance(rendered, RenderedSpan):
            return [(rendered.data, rendered.start, rendered.run_end)], 0, rendered.last_mark + 1
        if rendered is None and self._renders_ahead:
            if budget is not None and page_cache.AHEAD.rendering(key):
                raise RenderingAhead(key)
            try:
                whole = self._render_whole(layout, mark, key, budget)
            except BlockingIOError:  # (on the loop, not in the OS page cache: a worker thread's read)
                return None
            if whole is not None:
                return [(whole, 0, len(whole))], page_cache.span(bounds), mark + 1
        page: Page | None
        if rendered is not None:
            page, cost = rendered, 0
        elif budget is None:
            page, cost = self.page(layout, mark), 0
        else:
            page, cost = self._page_now(layout, mark, budget)
        if page is None:
            return None
        if self._renders_ahead and cost:  # (rendered here: a run that has not started leaves it out)
            page_cache.AHEAD.take(key)
        return [(rendered.data, 0, len(rendered.data)) for _, rendered in page], cost, mark + 1

    def _ask_ahead(self, layout: SegmentLayout, mark: int) -> None:
        """Have the complete pages after `mark` rendered ahead: up to `AHEAD_BYTES` of the
        segment and of its rendering past it (JSON Lines of small records render several times
        larger than their batches: what is asked fits the cache), and `AHEAD_PAGES` pages. A
        segment that still grows has one incomplete page, its last."""
        complete = layout.complete_pages
        first = mark + 1
        if first >= complete:
            return
        last = min(
            complete,
            first + AHEAD_PAGES,
            bisect.bisect_left(layout.marks_file, layout.marks_file[first] + AHEAD_BYTES, first),
            bisect.bisect_left(layout.marks_view, layout.marks_view[first] + AHEAD_BYTES, first),
        )
        last = max(last, first + 1)
        page_cache.AHEAD.ask(self, layout, range(first, last), whole=last == complete)

    def _render_whole(
        self, layout: SegmentLayout, mark: int, key: tuple[object, ...], budget: int | None
    ) -> bytes | None:
        """A complete page the cache does not have (the reader caught up with the render-ahead
        thread, a read that is not sequential, a worker thread's read of a page the thread did
        not render) rendered by one call of the core, and kept: batch by batch it cost several
        times more, most of it in Python. None when the page is not complete, costs more than
        `budget` (a read on the event loop), or is one the core does not render (then neither is
        the rest of its segment: the caller renders it batch by batch, which says what is
        wrong). With a `budget`, BlockingIOError when its bytes are not all in the OS page
        cache."""
        complete = layout.complete_pages
        bounds = layout.page_bounds(mark)
        too_dear = budget is not None and page_cache.span(bounds) > budget
        if mark >= complete or too_dear or page_cache.AHEAD.declined(self, layout):
            return None
        try:
            pages = self.render_run(layout, [mark], nowait=budget is not None)
        except BlockingIOError:
            raise
        except (
            EngineError,
            ValueError,
            OSError,
        ):  # (damage, the segment closed, a failed read: the caller's read says so)
            return None
        if not pages:
            page_cache.AHEAD.decline(self, layout)
            return None
        data = pages[0][0]
        page_cache.PAGES.put(key, bounds, RenderedSpan(data, 0, len(data), len(data), mark))
        page_cache.AHEAD.take(key)  # (a run that has not started leaves it out)
        return data

    def render_run(
        self, layout: SegmentLayout, marks: list[int], *, nowait: bool = False
    ) -> list[tuple[bytes, int, int]]:
        """Complete pages `marks` (consecutive) of a segment layout rendered by one call of the
        core: each page's span (rendering, start, end) of it; none when the core does not
        render them. `nowait`: BlockingIOError unless their bytes are in the OS page cache."""
        start, end = layout.marks_file[marks[0]], layout.page_bounds(marks[-1])[1]
        edges = [*layout.marks_view[marks[0] : marks[-1] + 1], layout.view_bounds(marks[-1])[1]]
        data = layout.segment.with_descriptor(
            lambda fd: self.renderer.render_range(fd, start, end, edges[-1] - edges[0], nowait=nowait),
            start,
            end,
            nowait=nowait,
        )
        if data is None:
            return []
        return [(data, a - edges[0], b - edges[0]) for a, b in itertools.pairwise(edges)]
