"""Views: a partition rendered as text or JSON Lines from an offset, as a file with an exact size
and random access.

All views of one partition in one format share a `Layout`: the rendering of the whole partition,
segment after segment, described sparsely, in the spirit of the offset index. Per segment it
keeps the rendered size and a mark every `mark_bytes` of output: the view position, the file
position and the base offset of the batch that starts there. A view from offset N is the layout
from the position of the first record with offset ≥ N:

    size      = total - position(N)
    read(p,n) = the layout's bytes from position(N) + p

The batches between two marks are a page: read with one small read of the segment, rendered, and
kept in a small cache, so `position(N)` is a bisection to the segment, then to the mark at or
below N, then one page; `read` is the pages it covers. Whatever the partition's size, that is a
look-up plus a small read (the pages and the reads of them are `fs.layout_pages.LayoutPages`'). A
view over sealed segments never changes; the active segment's part only grows. A reader that
reads on from where its last read ended (`cat`, `grep`) has the pages after it rendered ahead, on
a thread of their own, many pages a call of the engine's core, which reads, checks and renders
them with the GIL released (`fs.page_cache.RenderAhead`): the rendering runs on another core while
the event loop serves the reads.

A layout is derived data. A segment is measured by rendering it once (the active segment only
for what was appended since the last look); a segment replaced by compaction or removed by
retention leaves the layout, and its replacement is measured afresh. Sealed segments' layouts
are kept in a `LayoutStore` outside the data dir, so the next mount does not measure them again.
The first measure of a partition measures its text and JSON Lines layouts in one pass when both
are wanted (`ls -l` stats both views): each batch is read, checked and laid out in columns once,
and the other format's segment layouts are handed over to it as if loaded from the store.

A read_committed layout (Kafka's `isolation.level=read_committed`) is the same rendering of the
batches a read_committed consumer sees: it tracks the partition's transactions
(engine.log.transactions) ahead of its measure, renders the batches of aborted transactions as
nothing (control batches render as nothing in every layout) and ends at the last stable offset
(LSO) of what it tracked. Below the LSO every transaction has ended, so what the layout shows
there is final: it only grows, as the LSO moves when transactions end, and an open view's bytes
stay as they were. Only these layouts track transactions; the others render every data batch.

Readers holding a view. An open descriptor of a view is a stable file that only grows, as a
rotated log file is to a process holding it: the bytes it served, or could have served at its
last size, stay where they are with the same content, and records past the last offset it laid
out are added at its end, whatever retention, compaction or delete-records do meanwhile. An open
view holds its layout (`Layout.hold`, until `let_go`: `fs.view_file.ViewHandle`). While a layout
is held:

* its segments are kept open (`keep_open`: their `.log` descriptors leased, `LogSegment.hold_open`),
  the newest `held_segments()` of them (half the process's open-segment budget), so that a
  segment the log removes stays readable to it. A read-only mount keeps them open before each
  look at the other writer's changes (`Tree.follow`), which is what closes a removed segment;
* a change of the log that would move bytes it laid out (a segment of it removed or replaced,
  or cut back) detaches it (`detached`): from then on it is its readers' alone and only grows
  (`_append_only`): the segments it laid out stay, and what the log holds past its last offset
  is added after them. Offsets that came and went between two looks are named in the mount's
  log (a follower that fell behind retention gets the records still there), as are those of a
  segment the log still lists whose file another process removed before it could be kept open
  (`_gone`: a read-only mount learns of the removal at its next look);
* the tree then drops the layout and the names of the views on it (`Tree.follow_held`, after a
  read-only mount's look or a writable mount's retention or compaction): the next lookup of
  `records` or `by-offset/N` is a new inode on a new layout of the log as it is now (`tail -F`
  moves to it, as to a rotated file), while the old inode, and the size the kernel has for it,
  keeps growing for the descriptors that hold it. The kernel's size is per inode: an inode's
  layout never changes, so its size never goes down while any descriptor holds it.

A layout no view holds is brought up to date in place, as is a layout whose first holder has not
been served yet (`fresh`: opened after the change, before the next look; its first read goes to
a worker thread, which looks first). A first holder of a layout the log has not moved since its
last look is served at once, on the event loop (`_hold_as_laid_out`). The segments kept open are
let close once the last holder is gone, on a thread of their own (`_LET_CLOSE`). A writer's
cut-back of the segment a held layout grows in (recovery, a failed append) ends that segment for
the layout where it was laid out: its size stays, the bytes laid out past the cut (gone from the
file) are not served, and what is appended to the segment after the cut is laid out anew after
it from the first batch past the last offset laid out (`_cut`: the offsets the cut freed are used
again, for records its readers are not given). Not covered: a segment past the newest
`held_segments()` of a held layout (those laid out after it count too: a follower far behind
loses its oldest as the log grows) that the log removes reads as an error, EIO, each read named
in the mount's log; the layout's other segments read as they were.
"""

from __future__ import annotations

import bisect
import logging
import os
import queue
import threading
import time
from array import array
from dataclasses import dataclass

import numpy as np

from seglogfs.engine.errors import CorruptRecordError, EngineError
from seglogfs.engine.log.handles import MIN_OPEN_SEGMENTS, OPEN_SEGMENTS
from seglogfs.engine.log.log import PartitionLog
from seglogfs.engine.log.segment import LogSegment
from seglogfs.engine.log.transactions import TransactionTracker
from seglogfs.engine.record.columns import record_columns
from seglogfs.engine.record.records import BatchHeader
from seglogfs.engine.text.renderers import RenderedBatch
from seglogfs.fs.layout_pages import LayoutPages, Renderer, joined
from seglogfs.fs.layout_store import LayoutStore, SegmentLayout

logger = logging.getLogger(__name__)


MARK_BYTES = 32 * 1024
# ...and a mark at least every this many segment bytes: a view that shows little of each record
# (`print.value=false`, aborted transactions read_committed) would otherwise have pages spanning
# much of a segment, each rendered whole for the smallest read.
MARK_SEGMENT_BYTES = 1 << 20

# A test hook: milliseconds of sleep per batch measured, to make a measure slow enough to watch.
MEASURE_DELAY_ENV = "SEGLOGFS_TEST_MEASURE_DELAY_MS"
_MEASURE_DELAY_S = float(os.environ.get(MEASURE_DELAY_ENV, "0") or 0) / 1000
_SLOW_MEASURE_S = 1.0  # a first measure longer than this is logged
_SNAPSHOT_ATTEMPTS = 3  # looks at a log whose segments leave it while they are measured, before one fails
# Threads measuring a partition's sealed segments at once: the cores this process may run on (at
# most 4), as consume's JSON Lines renderers are counted.
MEASURE_THREADS = max(1, min(len(os.sched_getaffinity(0)), 4))


class MeasureStopped(InterruptedError):
    """A measure was asked to stop (the mount is ending): what it measured so far is kept."""


@dataclass(frozen=True)
class MeasureProgress:
    """How far a layout's measure is: bytes of segments rendered of the bytes to render."""

    done_bytes: int
    total_bytes: int
    measured: bool  # the first measure is complete: sizes are known without rendering
    error: str | None = None  # why the last look at the log failed (damage, the OS), if it did


_NO_RECORDS = RenderedBatch(b"", np.zeros(0, np.int64), np.zeros(0, np.int64))  # an aborted batch, read_committed


class _LetClose:
    """The thread that lets close the segments a layout's last holder kept open
    (`Layout.let_go`)."""

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[list[LogSegment]] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def put(self, segments: list[LogSegment]) -> None:
        self._queue.put(segments)
        self.start()

    def start(self) -> None:
        """Start the thread, once. A mount starts it with its tree (`Tree`): started at the
        first close of a held view, on the event loop, it would hold up that close's reply
        (a thread's start waits for the thread to run)."""
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="let close", daemon=True)
                self._thread.start()

    def _run(self) -> None:
        while True:
            for segment in self._queue.get():
                try:
                    segment.let_close()
                except Exception:  # (the others are let close all the same)
                    logger.exception("letting %s close", segment.log_path)


_LET_CLOSE = _LetClose()


def start_letting_close() -> None:
    """Start the thread that lets close the segments held views kept open (see `_LetClose.start`)."""
    _LET_CLOSE.start()


def held_segments() -> int:
    """How many segments a held layout keeps open at most (`Layout.keep_open`): half the
    process's budget of open segments (engine.log.handles), so that they never crowd out the rest."""
    return max(MIN_OPEN_SEGMENTS, OPEN_SEGMENTS.max_open // 2)


class Layout:
    """The rendering of one partition in one format, read_uncommitted or (`read_committed`)
    read_committed. Thread-safe: one thread at a time brings it up to date (`snapshot`, under
    `_lock`, which may render for seconds); what it measured is published as one immutable
    tuple (`_published`), which readers on the event loop take without a lock (`known_size`,
    `read_now`), so they never wait for a measure."""

    def __init__(
        self,
        log: PartitionLog,
        renderer: Renderer,
        mark_bytes: int = MARK_BYTES,
        *,
        store: LayoutStore | None = None,
        format_key: str = "",
        format_name: str = "",
        read_committed: bool = False,
    ) -> None:
        self.log = log
        self.format_name = format_name  # "text" or "jsonl", for log lines
        self.renderer = renderer
        # read_committed: the partition's transactions as far as tracked (replaced whole after a
        # cut-back), and the last stable offset the measure ends at; None for read_uncommitted,
        # whose batches are measured and rendered by the renderer itself (nothing in its way).
        self.transactions = TransactionTracker() if read_committed else None
        self.stable_offset: int | None = None
        self._measure_batch = self._measure_committed if read_committed else renderer.measure
        # The other format's layout of the partition at the same level (Tree.layout links them),
        # and the segment layouts a first measure of that other layout made for this one.
        self.sibling: Layout | None = None
        self._handed_over: dict[LogSegment, SegmentLayout] = {}
        self._handed_over_lock = threading.Lock()
        self.pages = LayoutPages(
            renderer,
            self._render_committed if read_committed else renderer.render_indexed,
            renders_ahead=not read_committed,
        )
        self._mark_bytes = mark_bytes
        self._store = store
        self._store_directory = store.directory(log, format_key) if store is not None else None
        if store is not None and self._store_directory is not None:
            store.touch(self._store_directory)
        self._lock = threading.Lock()
        self._order: list[SegmentLayout] = []
        self._starts: list[int] = []  # layout position where each segment's rendering begins
        # Positions are kept across retention: the first segment left starts where it started,
        # so an open view's bytes do not move under its reader when older segments go.
        self._front = 0
        self._bases: list[int] = []
        self._published: tuple[list[SegmentLayout], list[int]] = ([], [])  # (order, starts), swapped whole
        self.generation = 0  # changes when a segment joins or leaves: positions may move
        self._truncations = log.truncations  # the log's cut-backs this layout has seen
        self.measured = False  # set once a snapshot has measured every segment (the first look)
        self.stop = threading.Event()  # set: a measure under way raises MeasureStopped
        self._progress = (0, 0)  # (segment bytes measured, segment bytes to measure), while measuring
        self._progress_lock = threading.Lock()  # (the threads of one measure add to it)
        self._failure: str | None = None  # why the last snapshot failed, if it did
        # Readers holding it (open handles of its views: `hold`), the segments kept open for them
        # (`keep_open`), and whether it has left the log's changes behind for them (`detached`:
        # see `_append_only`). Guarded by `_hold_lock`, which is never held while measuring.
        self._holders = 0
        # Held since the last look at the log: its first holder has been served nothing yet, and
        # the next snapshot brings it up to date in place (the changes it missed are no reader's).
        self.fresh = False
        self._kept: set[LogSegment] = set()
        self._kept_for: list[SegmentLayout] | None = None  # the published order they were kept for
        self._hold_lock = threading.Lock()
        self.detached = False
        # Segments of the log cut back under a detached layout's last (a writer's truncation):
        # what they hold past its last offset is laid out anew once they hold some (`_append_only`).
        self._cut: set[LogSegment] = set()

    def snapshot(self) -> tuple[list[SegmentLayout], list[int], list[int]]:
        """Bring the layout up to date with the log; (segments, their start positions, bases).
        Sealed segments cost nothing: only the last segment is looked at again (read_committed:
        and those not measured to their end yet, held back by a transaction still open). What
        made it fail (damage, the OS) is kept for `progress` until one succeeds."""
        for attempt in range(_SNAPSHOT_ATTEMPTS):
            segments = self.log.segments
            try:
                snapshot = self._snapshot(segments)
                break
            except MeasureStopped:
                raise
            except OSError as error:
                # A segment left the log while it was measured (retention, a compaction's swap):
                # its file is gone with it, and the log's segments now are measured instead.
                if attempt + 1 < _SNAPSHOT_ATTEMPTS and any(segment.closed for segment in segments):
                    continue
                self._failure = str(error)
                raise
            except EngineError as error:
                self._failure = str(error)
                raise
        self._failure = None
        return snapshot

    def _snapshot(self, segments: list[LogSegment]) -> tuple[list[SegmentLayout], list[int], list[int]]:
        self._keep_ahead(segments)
        with self._lock:
            fresh = self.fresh
            try:
                snapshot = self._snapshot_locked(segments)
            except OSError:
                self.fresh = self.fresh or fresh  # (looked at again: its first holder still served nothing)
                raise
        self.keep_open()
        return snapshot

    def _snapshot_locked(self, segments: list[LogSegment]) -> tuple[list[SegmentLayout], list[int], list[int]]:
        started = time.monotonic()
        # The log's cut-backs since the last look, read once: the transactions tracked, the
        # holders' check and the measure all go by the same reading.
        truncations = self.log.truncations
        cut_back = truncations != self._truncations
        if self.transactions is not None:
            self._track(cut_back)
        fresh, self.fresh = self.fresh, False
        if self.detached or (self._holders and not fresh and self._moves_under_holders(segments, cut_back)):
            if not self.detached:
                self.detached = True
                logger.debug("%s-%d (%s): held by readers, laid out on alone", *self._name())
            self._truncations = truncations
            self._append_only(segments, cut_back)
            return self._order, self._starts, self._bases
        if not self.measured:
            self._progress = (0, sum(segment.size for segment in segments))
        order = self._order
        unchanged = len(segments) == len(order) and all(a is b.segment for a, b in zip(segments, order, strict=True))
        if not unchanged:
            order = self._relayout(segments)
        changed = not unchanged
        self._truncations = truncations
        first = max(len(order) - 2, 0)
        if self.transactions is not None:  # segments held back by an open transaction
            first = min(first, next((slot for slot, layout in enumerate(order) if not layout.sealed), first))
        for slot in range(first, len(order)):
            # The last segment grows; the one before may have just been sealed.
            layout = order[slot]
            if layout.sealed and not cut_back:  # (a cut can make a sealed segment active again)
                continue
            if cut_back or layout.segment.size < layout.scanned_to:
                # Cut back under the measure (an append that failed after some of its
                # batches were visible, a recovery): measure the segment again.
                order = list(order)
                order[slot] = layout = SegmentLayout(layout.segment)
                self.pages.forget_tail()
                self.generation += 1
                changed = True
            before = layout.size
            self._extend(layout, last=slot == len(order) - 1)
            changed = changed or layout.size != before
        if changed:
            self._publish(order, self._front)
        if not self.measured:
            self.measured = True
            with self._handed_over_lock:
                self._handed_over.clear()  # (made for a measure that raced this one: not needed)
            elapsed = time.monotonic() - started
            if elapsed > _SLOW_MEASURE_S:
                logger.info(
                    "measured %s-%d (%s): %d segments, %.1f MB in %.1f s",
                    self.log.topic,
                    self.log.partition,
                    self.format_name,
                    len(order),
                    self._progress[1] / 1e6,
                    elapsed,
                )
        return self._order, self._starts, self._bases

    # -- readers holding the layout ---------------------------------------------------------------
    def hold(self) -> None:
        """A view of this layout is opened: from now on (until `let_go`) what it laid out stays
        where it is (see `_append_only`) and its segments are kept open (`keep_open`). An open
        on the event loop calls it: it waits for nothing (see `_hold_as_laid_out`)."""
        with self._hold_lock:
            first = not self._holders
            if first:
                self.fresh = True
            self._holders += 1
        if first:
            self._hold_as_laid_out()

    def _hold_as_laid_out(self) -> None:
        """A first holder of a layout the log has not moved since its last look (the usual
        open: nothing removed or cut back meanwhile) is served from it at once, its reads on the
        event loop as before it was held: its segments are kept open now and it is not `fresh`.
        When a look is under way (its lock is taken: only tried, never waited for), the log moved
        under the layout, or a segment of it could not be kept open (closed, its file gone), it
        stays fresh: its first read, on a worker thread, brings the layout up to date first. No
        syscall unless a segment laid out has no descriptor open (then one `open`)."""
        if not self._lock.acquire(blocking=False):
            return
        try:
            cut_back = self.log.truncations != self._truncations
            if not self.measured or self.detached or self._moves_under_holders(self.log.segments, cut_back):
                return
            self.keep_open()
            wanted = [layout.segment for layout in self._published[0][-held_segments() :]]
            with self._hold_lock:
                if self._holders and self._kept.issuperset(wanted):
                    self.fresh = False
        finally:
            self._lock.release()

    def let_go(self) -> None:
        """A view opened with `hold` is closed; at the last, its segments are let close, on a
        thread of their own (a close of a view, on the event loop, waits for nothing; closing a
        segment may wait for its locks)."""
        with self._hold_lock:
            self._holders -= 1
            if self._holders:
                return
            kept, self._kept, self._kept_for = self._kept, set(), None
        if kept:
            _LET_CLOSE.put(list(kept))

    @property
    def held(self) -> bool:
        """Whether a view of this layout is open."""
        return self._holders > 0

    def keep_open(self) -> None:
        """While held: keep the segments laid out open (their descriptors leased: see
        `LogSegment.hold_open`), the newest `held_segments()` of them, so that retention or
        compaction removing one, or another process deleting its file, leaves its bytes
        readable. A segment closed already (removed before this look) is left out: its bytes
        read as an error, which the log names."""
        order = self._published[0]
        if not self._holders or order is self._kept_for:  # (no lock: a hint; looked at again under it)
            return
        wanted = [layout.segment for layout in order[-held_segments() :]]
        with self._hold_lock:
            if not self._holders:
                return
            self._kept_for = order
            self._hold_open_locked(wanted)
            dropped = self._kept.difference(wanted)
            self._kept.difference_update(dropped)
        for segment in dropped:
            segment.let_close()

    def _keep_ahead(self, segments: list[LogSegment]) -> None:
        """While held: the log's newest `held_segments()` segments are kept open before they
        are measured, not only after (`keep_open`): a segment measured, then closed by the
        descriptor budget and removed by another process before it was kept, would stay laid out
        with bytes no read can give (a live follower's read was EIO naming the removed `.log`).
        One whose file is gone already is not measured either (see `_gone`)."""
        if not self._holders:
            return
        with self._hold_lock:
            if self._holders:
                self._hold_open_locked(segments[-held_segments() :])

    def _hold_open_locked(self, segments: list[LogSegment]) -> None:
        """Keep each of `segments` open that is not kept yet; one that cannot be (closed, its
        file gone) is left out. Holds: `_hold_lock`."""
        for segment in segments:
            if segment in self._kept:
                continue
            try:
                segment.hold_open()
            except OSError as error:
                logger.debug("%s-%d (%s): keeping %s open: %s", *self._name(), segment.log_path, error)
                continue
            self._kept.add(segment)

    def _name(self) -> tuple[str, int, str]:
        return self.log.topic, self.log.partition, self.format_name or "view"

    def _moves_under_holders(self, segments: list[LogSegment], cut_back: bool) -> bool:
        """Whether bringing the layout up to date with `segments` would change bytes a reader
        holding it may have read: a segment it laid out left the log (retention, compaction,
        delete-records) or was cut back (a writer's truncation). Segments added after those it
        laid out, and its last one growing, change nothing it holds. `cut_back`: the log was cut
        back since the last look."""
        order = self._order
        if cut_back:
            return True
        if len(segments) < len(order):
            return True
        return any(a is not b.segment for a, b in zip(segments, order, strict=False)) or any(
            layout.segment.size < layout.scanned_to for layout in order[-2:]
        )

    def _append_only(self, segments: list[LogSegment], cut_back: bool) -> None:
        """Bring a detached layout up to date: one its readers hold, which the log's changes
        left behind (`_moves_under_holders`). Nothing it laid out moves or goes: the segments
        that left the log stay, kept open (`keep_open`); what the log holds past the last offset
        laid out is added at the end — the rest of its last segment while that is still the
        log's, then the segments after it, the first from its first batch past that offset (a
        compacted segment replacing those laid out holds older batches too). Offsets that are
        in neither (appended and removed between two looks) are said in the log: the readers
        holding the layout could not be given them."""
        order = list(self._order)
        if cut_back:
            self.pages.forget_tail()
        present = {segment: i for i, segment in enumerate(segments)}
        laid_out = {layout.segment for layout in order}
        changed = False
        cut = self._cut
        cut.intersection_update(segments)
        # The segments still growing for it: its last, and (read_committed) those held back by a
        # transaction still open, whose growth is at the end of its rendering too (what is past
        # the last stable offset is not laid out yet, in any segment).
        for index, layout in enumerate(order):
            if layout.sealed:
                continue
            slot = present.get(layout.segment)
            if slot is not None and not cut_back and layout.segment.size >= layout.scanned_to:
                before = layout.size
                try:
                    self._extend(layout, last=slot == len(segments) - 1)
                except FileNotFoundError as error:  # (see `_gone`)
                    self._gone(layout.segment, error)
                    layout.sealed = True
                    continue
                changed = changed or layout.size != before
                continue
            if slot is None and not cut_back and index == len(order) - 1:
                self._finish_removed(layout)
            elif slot is not None:
                cut.add(layout.segment)
            layout.sealed = True  # (left the log, or cut back under it: laid out as it was)
        last = order[-1] if order else None
        slot = present.get(last.segment) if last is not None else None
        if slot is not None and last is not None and last.segment in cut:
            slot -= 1  # (what is appended to it after the cut is laid out anew, after what was)
        following = segments[slot + 1 :] if slot is not None else segments
        next_offset = self._end_offset_of(last) if last is not None else self.log.log_start_offset
        for i, segment in enumerate(following):
            if segment in laid_out and segment not in cut:
                continue
            if i + 1 < len(following) and following[i + 1].base_offset <= next_offset:
                continue  # (wholly below what it laid out: a compacted segment, not read)
            # (a segment cut back is laid out anew only from a batch past what was laid out:
            # the offsets the cut freed are used again, for records its readers are not given)
            try:
                added = self._layout_from(segment, next_offset, grows_from_end=segment not in cut)
                if added is not None:
                    self._extend(added, last=segment is segments[-1])
            except FileNotFoundError as error:
                self._gone(segment, error)
                continue
            if added is None:
                continue
            cut.discard(segment)
            if added.first_offset > next_offset:
                logger.warning(
                    "%s-%d (%s): offsets %d to %d were removed before the readers holding its views were given them",
                    *self._name(),
                    next_offset,
                    added.first_offset - 1,
                )
            order.append(added)
            next_offset = max(next_offset, self._end_offset_of(added))
            changed = True
        if changed:
            self._publish(order, self._starts[0] if self._starts else self._front)

    def _gone(self, segment: LogSegment, error: OSError) -> None:
        """A segment the log still lists whose file another process removed before this look
        could keep it open (a read-only mount learns of it at its next look): nothing more of it
        can be laid out; the offsets it held past those laid out are named in the log when the
        next segment is laid out, as removed before the readers were given them."""
        logger.debug("%s-%d (%s): %s is gone: %s", *self._name(), segment.log_path, error)

    def _finish_removed(self, layout: SegmentLayout) -> None:
        """Lay out what the last segment laid out gained before it left the log (another
        process appended to it, then removed it, between two looks), when it is kept open: read
        through its descriptor, its file as it was when removed."""
        segment = layout.segment
        with self._hold_lock:
            kept = segment in self._kept
        if not kept:
            return
        try:
            segment.refresh_size(sealed=True)  # (read-only; a writable segment's size is exact)
            self._extend(layout, last=False)
        except (EngineError, OSError) as error:  # (its readers get what was laid out before)
            logger.debug("%s-%d (%s): the end of %s: %s", *self._name(), segment.log_path, error)

    def _end_offset_of(self, layout: SegmentLayout) -> int:
        """The offset after the last batch laid out in a segment layout."""
        if layout.end_offset >= 0:
            return layout.end_offset
        if layout.last_batch[0] < 0:
            return layout.first_offset
        try:
            return self._next_offset(layout)
        except OSError:  # (closed, not kept open: its size says nothing more)
            return layout.first_offset

    def _layout_from(self, segment: LogSegment, offset: int, *, grows_from_end: bool = True) -> SegmentLayout | None:
        """A new layout of `segment` from its first batch holding `offset` or above (the whole
        segment when that is its first); None when it holds none yet and is not the log's last
        (or `grows_from_end` is false: a layout from its end would take in whatever is appended)."""
        first = True
        for header in segment.iter_headers(0, segment.size):
            if header.last_offset < offset:
                first = False
                continue
            if first:
                return SegmentLayout(segment, from_offset=max(header.base_offset, segment.base_offset))
            position = header.position
            return SegmentLayout(
                segment,
                scanned_to=position,
                marks_file=array("q", [position]),
                from_offset=header.base_offset,
            )
        if grows_from_end and segment is self.log.segments[-1]:
            # (nothing at or past `offset` yet: laid out from its end, it grows from there)
            return SegmentLayout(
                segment,
                scanned_to=segment.size,
                marks_file=array("q", [segment.size]),
                from_offset=max(offset, segment.base_offset),
            )
        return None

    def _publish(self, order: list[SegmentLayout], front: int) -> None:
        """Make `order` the layout, its first segment at position `front`: the start positions,
        bases and the (order, starts) pair readers take whole. Holds: the layout's lock."""
        starts, total = [], front
        for layout in order:
            starts.append(total)
            total += layout.size
        self._order, self._starts = order, starts
        self._bases = [layout.first_offset for layout in order]
        self._published = (order, starts)

    def _track(self, cut_back: bool) -> None:
        """read_committed: take in the transactions of the batches appended since the last look,
        and end the measure at the last stable offset of what was read (not of the log end now:
        a writer may be appending). A cut-back may have taken batches the tracker has seen: then
        the partition's transactions are read again from the log start, and the new tracker
        replaces the old one once it is complete (pages render with one or the other, whole)."""
        transactions = self.transactions
        if transactions is None or cut_back:
            transactions = TransactionTracker()
        stable_offset = transactions.catch_up(self.log, self._check_stop)
        self.transactions = transactions
        self.stable_offset = stable_offset

    def _check_stop(self) -> None:
        if self.stop.is_set():
            raise MeasureStopped(f"{self.log.topic}-{self.log.partition}: measure stopped")

    def _measure_committed(self, header: BatchHeader, batch: memoryview) -> int:
        transactions = self.transactions
        if transactions is not None and transactions.is_aborted(header):
            return 0
        return self.renderer.measure(header, batch)

    def _render_committed(self, header: BatchHeader, batch: memoryview) -> RenderedBatch:
        transactions = self.transactions
        if transactions is not None and transactions.is_aborted(header):
            return _NO_RECORDS
        return self.renderer.render_indexed(header, batch)

    def end_offset(self) -> int:
        """The offset the rendering reaches as of the last `snapshot`: the log end offset, or
        (read_committed) the last stable offset."""
        return self.log.log_end_offset if self.stable_offset is None else self.stable_offset

    def progress(self) -> MeasureProgress:
        """How far the first measure is, and why the last look failed if it did (no lock: for
        `status` while it runs)."""
        done, total = self._progress
        error = self._failure
        if error is None:  # (a damaged batch, read as EIO with the records around it served)
            error = next((str(e) for layout in self._published[0] for e in layout.damage.values()), None)
        return MeasureProgress(total if self.measured else done, total, self.measured, error)

    def _relayout(self, segments: list[LogSegment]) -> list[SegmentLayout]:
        """Layouts for a changed segment list: kept, loaded from the store, or measured."""
        # Segment objects hash by identity: a compacted replacement is a new object.
        known = {layout.segment: (layout, start) for layout, start in zip(self._order, self._starts, strict=True)}
        if segments and segments[0] in known:
            self._front = known[segments[0]][1]  # retention: the first segment left keeps its place
        order, unmeasured = [], []
        for i, segment in enumerate(segments):
            kept = known.pop(segment, None)
            if kept is not None:
                layout = kept[0]
            else:
                with self._handed_over_lock:
                    loaded = self._handed_over.pop(segment, None)
                if loaded is None and self._store is not None and self._store_directory is not None:
                    loaded = self._store.load(self._store_directory, segment, self._mark_bytes)
                layout = loaded or SegmentLayout(segment)
                if i == len(segments) - 1:
                    layout.sealed = False  # the last segment may grow
            if not layout.sealed and i < len(segments) - 1:
                unmeasured.append(layout)
            order.append(layout)
        self._measure_sealed(unmeasured)
        if self._store is not None and self._store_directory is not None:
            bases = {segment.base_offset for segment in segments}
            for gone in known:
                if gone.base_offset not in bases:  # a replacement under the same base was stored anew
                    self._store.discard(self._store_directory, gone)
        self.generation += 1
        return order

    def _measure_sealed(self, layouts: list[SegmentLayout]) -> None:
        """Measure segments that no longer grow, `MEASURE_THREADS` at once: this thread and
        helpers it starts (which inherit its CPU priority: a background measure's stay low) each
        take the next segment; the core releases the GIL while it walks and checks, so the
        measure runs on both cores. The first error is raised here once every thread is done
        (the others finish the segment they are on)."""
        pending = iter(layouts)
        taking = threading.Lock()
        errors: list[BaseException] = []

        def measure() -> None:
            while not errors:
                with taking:
                    layout = next(pending, None)
                if layout is None:
                    return
                try:
                    self._extend(layout, last=False)
                except BaseException as error:  # raised by the thread that started the measure
                    errors.append(error)

        helpers = [
            threading.Thread(target=measure, name=f"measure {self.log.topic}-{self.log.partition}", daemon=True)
            for _ in range(min(MEASURE_THREADS, len(layouts)) - 1)
        ]
        for helper in helpers:
            helper.start()
        measure()
        for helper in helpers:
            helper.join()
        if errors:
            raise errors[0]

    def _extend(self, layout: SegmentLayout, *, last: bool) -> None:
        """Render what the segment gained since the last look (all of it, the first time); a
        segment that is not the last one is then sealed and kept in the store. read_committed:
        only up to the last stable offset; the rest waits for its transactions to end."""
        segment = layout.segment
        end = segment.size  # (read-only: as the log's last `refresh` found it; see Tree.follow)
        stable_offset = self.stable_offset
        if end > layout.scanned_to:
            if stable_offset is not None and segment.base_offset >= stable_offset:
                return
            measuring = not self.measured
            sibling = self._sibling_to_measure(layout)
            companion = SegmentLayout(segment) if sibling is not None else None
            while True:
                try:
                    if self._measure_batches(layout, end, measuring, sibling, companion):
                        return  # (not sealed: measured to the last stable offset)
                    if not last:
                        segment.check_whole(layout.scanned_to, end)  # (else the view would end the segment early)
                    break
                except CorruptRecordError as error:
                    if error.position != layout.scanned_to:
                        raise  # (not at the scan's next batch: the view fails whole)
                    after = self._past_damage(segment, error.position, end)
                    self._damaged(layout, error, after)
                    if sibling is not None and companion is not None:
                        sibling._damaged(companion, error, after)
            if sibling is not None and companion is not None:
                sibling._hand_over(companion, sealed=not last and companion.scanned_to == end)
        if not last and layout.scanned_to == end:
            layout.sealed = True
            self._store_layout(layout)

    def _measure_batches(
        self,
        layout: SegmentLayout,
        end: int,
        measuring: bool,
        sibling: Layout | None,
        companion: SegmentLayout | None,
    ) -> bool:
        """Measure the segment's batches from where its layout was measured to up to `end` (and
        the sibling's `companion` layout with them); True when it stopped at the last stable
        offset (read_committed). CorruptRecordError at a damaged batch."""
        stable_offset = self.stable_offset
        for header, batch in layout.segment.checked_batches(layout.scanned_to, end, once=True):
            if stable_offset is not None and header.base_offset >= stable_offset:
                return True
            self._check_stop()
            if _MEASURE_DELAY_S:
                time.sleep(_MEASURE_DELAY_S)
            if measuring:
                with self._progress_lock:
                    done, total = self._progress
                    self._progress = (done + header.next_position - header.position, total)
            try:
                if sibling is None or companion is None:
                    self._note(layout, header, self._measure_batch(header, batch))
                    continue
                columns = None if header.is_control else record_columns(header, batch)
                sizes = self.renderer.measure(header, batch, columns), sibling.renderer.measure(header, batch, columns)
            except ValueError as error:  # a codec or varint error inside a batch whose CRC held
                raise CorruptRecordError(
                    layout.segment.log_path, header.position, f"undecodable records: {error}"
                ) from None
            self._note(layout, header, sizes[0])
            sibling._note(companion, header, sizes[1])
        return False

    @staticmethod
    def _next_offset(layout: SegmentLayout) -> int:
        """The offset after the last batch measured into a segment's layout (its header read)."""
        position = layout.last_batch[0]
        if position >= 0:
            for header in layout.segment.iter_headers(position, layout.scanned_to):
                return header.last_offset + 1
        return layout.segment.base_offset

    @staticmethod
    def _past_damage(segment: LogSegment, position: int, end: int) -> int:
        """Where the batches go on after a damaged one at `position`: after it, when its length
        field is one a batch can have and it ends by `end` (its CRC failed, say); else `end`
        (nothing after it can be found)."""
        try:
            header = next(segment.iter_headers(position, end), None)
        except OSError:
            return end
        return end if header is None else header.next_position

    def _damaged(self, layout: SegmentLayout, error: CorruptRecordError, after: int) -> None:
        """A damaged batch at the measure's next position, its batches going on at `after`: a
        page of its own, one byte long, that reads as the damage, and the measure goes on at
        `after` in a page of its own (the records before and after it are served). Logged."""
        if layout.marks_file[-1] != error.position:  # (else the last page is empty: it is that page)
            layout.marks_view.append(layout.size)
            layout.marks_file.append(error.position)
            layout.marks_offset.append(self._next_offset(layout))
        layout.damage[len(layout.marks_file) - 1] = error
        layout.size += 1
        layout.scanned_to = after
        layout.since_mark = self._mark_bytes  # (the next batch starts a page)
        logger.warning(
            "%s-%d (%s): %s; its views answer EIO there, and serve the records before and after it",
            self.log.topic,
            self.log.partition,
            self.format_name or "view",
            error,
        )

    def _note(self, layout: SegmentLayout, header: BatchHeader, rendered: int) -> None:
        """One more batch measured into a segment's layout: a mark where a page is full. The size
        grows last: a reader on the event loop (which takes a published layout as it stands)
        finds every byte below the size in the pages."""
        if layout.since_mark >= self._mark_bytes or header.position - layout.marks_file[-1] >= MARK_SEGMENT_BYTES:
            # (a page may render to nothing: a read lands on the last of the marks at its place)
            layout.marks_view.append(layout.size)
            layout.marks_file.append(header.position)
            layout.marks_offset.append(header.base_offset)
            layout.since_mark = 0
        layout.since_mark += rendered
        layout.scanned_to = header.next_position
        layout.last_batch = (header.position, header.crc)
        layout.end_offset = header.next_offset
        layout.size += rendered

    def _sibling_to_measure(self, layout: SegmentLayout) -> Layout | None:
        """The other format's layout, when this first measure of a segment should measure it
        too: it has not measured the partition yet, nor been handed this segment, and neither
        tracks transactions (read_committed layouts end at their own last stable offsets)."""
        sibling = self.sibling
        if sibling is None or self.measured or sibling.measured or layout.scanned_to != 0:
            return None
        if self.transactions is not None or sibling.transactions is not None:
            return None
        with sibling._handed_over_lock:
            return None if layout.segment in sibling._handed_over else sibling

    def _hand_over(self, layout: SegmentLayout, *, sealed: bool) -> None:
        """A segment layout another layout's measure made for this one: taken as if loaded from
        the store by this layout's own first measure (kept there too when sealed)."""
        if sealed:
            layout.sealed = True
            self._store_layout(layout)
        with self._handed_over_lock:
            if not self.measured:
                self._handed_over[layout.segment] = layout

    def keep(self) -> None:
        """Store the layout of the last segment as measured so far (at unmount): the next mount
        measures only what was appended after. Sealed segments were stored when sealed."""
        with self._lock:
            if self._order and not self._order[-1].sealed:
                self._store_layout(self._order[-1])

    def _store_layout(self, layout: SegmentLayout) -> None:
        """Keep a segment's layout in the view cache, when there is one; never one with damage
        (measured afresh at each mount, which says where the damage is)."""
        whole = layout.marks_file[0] == 0  # (not a held layout's segment laid out from a batch inside it)
        if self._store is not None and self._store_directory is not None and not layout.damage and whole:
            self._store.save(self._store_directory, layout, self._mark_bytes)

    def position(self, offset: int) -> tuple[int, int]:
        """(layout position of the first record with offset ≥ `offset`, total size)."""
        order, starts, bases = self.snapshot()
        if not order:
            return 0, 0
        total = starts[-1] + order[-1].size
        slot = max(bisect.bisect_right(bases, offset) - 1, 0)
        layout = order[slot]
        mark = max(bisect.bisect_right(layout.marks_offset, offset) - 1, 0)
        at = starts[slot] + layout.marks_view[mark]
        if mark in layout.damage:  # (an offset of a damaged batch: its page, which reads as the damage)
            while mark - 1 in layout.damage and layout.marks_offset[mark - 1] == layout.marks_offset[mark]:
                mark -= 1  # (damaged batches one after the other: their offsets are not known, the first's)
            return starts[slot] + layout.marks_view[mark], total
        # The first batch reaching `offset` is in this page, or it is the next page's first.
        for header, rendered in self.pages.page(layout, mark):
            if header.last_offset < offset:
                at += len(rendered.data)
                continue
            if header.base_offset < offset:
                at += len(rendered.data) - rendered.bytes_from(offset)
            return at, total
        return at, total

    def read(self, position: int, length: int) -> bytes | memoryview:
        """Up to `length` layout bytes from `position`; none from positions of segments that are
        gone (removed by retention while a reader held a view); short, up to a page that fails
        (a damaged batch). A view of a rendering, not a copy, when one holds them all."""
        pieces = self.pages.pieces(self._published, position, length, now=False)
        return joined([piece for piece in pieces if piece is not None])

    def read_now(self, position: int, length: int) -> bytes | memoryview | None:
        """`length` layout bytes from `position` when they are measured and their pages rendered
        or cheap to render from the OS page cache (cheap enough for the event loop), else None
        (also when something fails after the first byte: a worker thread's read gives the bytes
        before it). What fails at the first byte raises; RenderingAhead when a page is being
        rendered ahead at this moment."""
        if position + length > self.known_size():
            return None
        pieces = list(self.pages.pieces(self._published, position, length, now=True))
        if None in pieces:
            return None
        data = joined(pieces)  # type: ignore[arg-type]
        # (short: a measure changed the layout under the read; a worker thread's read waits for it)
        return data if len(data) == length else None

    def known_size(self) -> int:
        """The total size as last measured (no look at the log, no lock: for the event loop)."""
        order, starts = self._published
        return starts[-1] + order[-1].size if order else 0


class View:
    """A partition from `start_offset` on, as a file: `size()` and `read()`. Thread-safe."""

    def __init__(self, layout: Layout, start_offset: int) -> None:
        self.layout = layout
        self.start_offset = start_offset
        self._begin: tuple[int, int] = (-1, 0)  # (layout generation, position of start_offset)

    def _extent(self) -> tuple[int, int]:
        """(where the view begins in the layout, the layout's total size). Where the view begins
        moves only when segments join or leave the layout, so it is found once per generation;
        except while the start offset is beyond the log end (records below it may still come).
        A view whose first records were removed by retention keeps its place: its reader's
        positions still hold the same bytes."""
        generation, begin = self._begin
        order, starts, bases = self.layout.snapshot()
        total = starts[-1] + order[-1].size if order else 0
        if generation != self.layout.generation or begin > total:
            if generation >= 0 and bases and self.start_offset < bases[0] and begin <= total:
                self._begin = (self.layout.generation, begin)
                return begin, total
            generation = self.layout.generation
            end_offset = self.layout.end_offset()
            begin, total = self.layout.position(self.start_offset)
            self._begin = (generation if self.start_offset <= end_offset else -1, begin)
        return begin, total

    def size(self) -> int:
        begin, total = self._extent()
        return total - begin

    def read(self, position: int, length: int) -> bytes | memoryview:
        begin, total = self._extent()
        if position >= total - begin:
            return b""
        return self.layout.read(begin + position, min(length, total - begin - position))

    def known_size(self) -> int:
        """The size as last measured (no look at the log, no lock: for the event loop)."""
        return max(self.layout.known_size() - self._begin[1], 0)

    def read_now(self, position: int, length: int) -> bytes | memoryview | None:
        """`read`, when it can be served on the event loop (see `Layout.read_now`), else None."""
        generation, begin = self._begin
        if generation != self.layout.generation or self.layout.fresh:  # (a worker's read looks at the log first)
            return None
        return self.layout.read_now(begin + position, length)
