"""Views: a partition rendered as text or JSON Lines from an offset, as a file with an exact size
and random access.

All views of one partition in one format share a `Layout`: the rendering of the whole partition,
segment after segment, described sparsely, in the spirit of the offset index. Per segment it
keeps the rendered size and a mark every `mark_bytes` of output: the view position, the file
position and the base offset of the batch that starts there. A view from offset N is the layout
from the position of the first record with offset ≥ N:

    size      = total - position(N)
    read(p,n) = the layout's bytes from position(N) + p

`position(N)` is a bisection to the segment, then to the mark at or below N, then the rendering of
the batches from that mark to N: a look-up plus a small read, whatever the partition's size; and
so is `read`. A view over sealed segments never changes; the active segment's part only grows.

A layout is derived data: a segment is measured by rendering it once (the active segment only for
what was appended since the last look); a segment replaced by compaction or removed by retention
leaves the layout, and its replacement is measured afresh.
"""

from __future__ import annotations

import bisect
import threading
from array import array
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

from engine.console import TextFormat, record_to_json
from engine.log import PartitionLog
from engine.records import BatchHeader, decode_records
from engine.segment import LogSegment

Render = Callable[[BatchHeader, memoryview, int], bytes]
MARK_BYTES = 32 * 1024
_RENDERED_CACHE = 16  # recently rendered batches: an open, a stat and a read of one place share them


def text_renderer(text_format: TextFormat, partition: int) -> Render:
    """Render a batch's records (offsets ≥ the given minimum) as console-consumer lines."""

    def render(header: BatchHeader, batch: memoryview, min_offset: int) -> bytes:
        records = decode_records(header, batch)
        return b"".join(text_format.render(r, partition) for r in records if r.offset >= min_offset)

    return render


def jsonl_renderer(topic: str, partition: int) -> Render:
    """Render a batch's records (offsets ≥ the given minimum) as JSON Lines."""

    def render(header: BatchHeader, batch: memoryview, min_offset: int) -> bytes:
        records = decode_records(header, batch)
        lines = [record_to_json(r, topic, partition) for r in records if r.offset >= min_offset]
        return ("\n".join(lines) + "\n").encode() if lines else b""

    return render


@dataclass
class _SegmentLayout:
    """Where a segment's rendering lies: marks (view position, file position and base offset of
    the batch there), rendered size, and how far into the file it has been rendered."""

    segment: LogSegment
    scanned_to: int = 0
    size: int = 0
    marks_view: array = field(default_factory=lambda: array("q", [0]))
    marks_file: array = field(default_factory=lambda: array("q", [0]))
    marks_offset: array = field(default_factory=lambda: array("q", [-1]))
    since_mark: int = 0


class Layout:
    """The rendering of one partition in one format. Thread-safe."""

    def __init__(self, log: PartitionLog, render: Render, mark_bytes: int = MARK_BYTES) -> None:
        self.log = log
        self.render = render
        self._mark_bytes = mark_bytes
        self._lock = threading.Lock()
        self._layouts: dict[int, _SegmentLayout] = {}  # id(segment) → layout
        self._order: list[_SegmentLayout] = []
        self._starts: list[int] = []  # layout position where each segment's rendering begins
        self._bases: list[int] = []
        self._rendered: OrderedDict[tuple[int, int, int], bytes] = OrderedDict()
        self._rendered_lock = threading.Lock()

    def _render(self, segment: LogSegment, header: BatchHeader, batch: memoryview, min_offset: int) -> bytes:
        """`render`, remembering the last few batches rendered."""
        key = (id(segment), header.position, min_offset if min_offset > header.base_offset else 0)
        with self._rendered_lock:
            cached = self._rendered.get(key)
            if cached is not None:
                self._rendered.move_to_end(key)
                return cached
        rendered = self.render(header, batch, key[2])
        with self._rendered_lock:
            self._rendered[key] = rendered
            while len(self._rendered) > _RENDERED_CACHE:
                self._rendered.popitem(last=False)
        return rendered

    def snapshot(self) -> tuple[list[_SegmentLayout], list[int], list[int]]:
        """Bring the layout up to date with the log; (segments, their start positions, bases)."""
        with self._lock:
            layouts = []
            for segment in self.log.segments:
                layout = self._layouts.get(id(segment))
                if layout is None or layout.segment is not segment:
                    layout = _SegmentLayout(segment)
                self._extend(layout)
                layouts.append(layout)
            self._layouts = {id(layout.segment): layout for layout in layouts}
            starts, total = [], 0
            for layout in layouts:
                starts.append(total)
                total += layout.size
            self._order, self._starts = layouts, starts
            self._bases = [layout.segment.base_offset for layout in layouts]
            return self._order, self._starts, self._bases

    def _extend(self, layout: _SegmentLayout) -> None:
        """Render what the segment gained since the last look (all of it, the first time)."""
        segment = layout.segment
        end = segment.size if segment.writable else segment.refresh_size()
        if end <= layout.scanned_to:
            return
        for header, batch in segment.checked_batches(layout.scanned_to, end):
            if layout.since_mark >= self._mark_bytes:
                layout.marks_view.append(layout.size)
                layout.marks_file.append(header.position)
                layout.marks_offset.append(header.base_offset)
                layout.since_mark = 0
            rendered = len(self.render(header, batch, 0))
            layout.size += rendered
            layout.since_mark += rendered
            layout.scanned_to = header.next_position

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
        segment = layout.segment
        for header, batch in segment.checked_batches(layout.marks_file[mark], layout.scanned_to):
            if header.last_offset < offset:
                at += len(self._render(segment, header, batch, 0))
                continue
            if header.base_offset < offset:
                whole = len(self._render(segment, header, batch, 0))
                at += whole - len(self._render(segment, header, batch, offset))
            return at, total
        return starts[slot] + layout.size, total

    def read(self, position: int, length: int) -> bytes:
        """Up to `length` layout bytes from `position`."""
        with self._lock:
            order, starts = list(self._order), list(self._starts)
        out = bytearray()
        slot = max(bisect.bisect_right(starts, position) - 1, 0)
        while slot < len(order) and len(out) < length:
            layout = order[slot]
            local = position + len(out) - starts[slot]
            if 0 <= local < layout.size:
                mark = bisect.bisect_right(layout.marks_view, local) - 1
                at = layout.marks_view[mark]
                for header, batch in layout.segment.checked_batches(layout.marks_file[mark], layout.scanned_to):
                    chunk = self._render(layout.segment, header, batch, 0)
                    if at + len(chunk) > local:
                        begin = max(local - at, 0)
                        out += chunk[begin : begin + length - len(out)]
                        if len(out) >= length:
                            break
                    at += len(chunk)
            slot += 1
        return bytes(out)


class View:
    """A partition from `start_offset` on, as a file: `size()` and `read()`."""

    def __init__(self, layout: Layout, start_offset: int) -> None:
        self.layout = layout
        self.start_offset = start_offset

    def size(self) -> int:
        begin, total = self.layout.position(self.start_offset)
        return total - begin

    def read(self, position: int, length: int) -> bytes:
        begin, total = self.layout.position(self.start_offset)
        if position >= total - begin:
            return b""
        return self.layout.read(begin + position, min(length, total - begin - position))


def make_view(log: PartitionLog, start_offset: int, render: Render, mark_bytes: int = MARK_BYTES) -> View:
    """A view with a layout of its own (tests, one-off use)."""
    return View(Layout(log, render, mark_bytes), start_offset)
