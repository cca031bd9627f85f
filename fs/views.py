"""Views: a partition rendered as text or JSON Lines from an offset, as a file with an exact size
and random access.

A view's bytes are the rendering of every record from its start offset on, segment after
segment. The mapping between view bytes and the log is sparse, in the spirit of the offset
index: per segment, the rendered size and a mark every `mark_bytes` of output (the view position
and the file position of the batch that starts there). `size()` sums the segments; `read(pos, n)`
finds the segment by bisection, then the mark at or below the position, and renders from that
batch: a look-up plus a small read, whatever the partition's size.

The marks are derived data: built by rendering a segment once (the active segment only for what
was appended since the last look) and rebuilt whenever a segment is replaced (compaction) or
leaves (retention). A view over a sealed segment never changes; the active segment's part only
grows.
"""

from __future__ import annotations

import bisect
import threading
from array import array
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from engine.console import TextFormat, record_to_json
from engine.errors import CorruptRecordError
from engine.log import PartitionLog
from engine.records import BatchHeader, check_batch, decode_records
from engine.segment import LogSegment

Render = Callable[[BatchHeader, memoryview, int], bytes]
MARK_BYTES = 32 * 1024


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
    """Where a segment's rendering lies: marks (view position → file position), rendered size,
    and how far into the file it has been rendered."""

    segment: LogSegment
    scanned_to: int = 0
    size: int = 0
    marks_view: array = field(default_factory=lambda: array("q", [0]))
    marks_file: array = field(default_factory=lambda: array("q", [0]))
    since_mark: int = 0


class View:
    """One partition from `start_offset`, rendered by `render`. Thread-safe."""

    def __init__(self, log: PartitionLog, start_offset: int, render: Render, mark_bytes: int = MARK_BYTES) -> None:
        self.log = log
        self.start_offset = start_offset
        self._render = render
        self._mark_bytes = mark_bytes
        self._lock = threading.Lock()
        self._layouts: dict[int, _SegmentLayout] = {}  # id(segment) → layout
        self._order: list[_SegmentLayout] = []
        self._starts: list[int] = []  # view position where each segment's rendering begins

    def size(self) -> int:
        """The view's exact size now."""
        with self._lock:
            self._refresh()
            return self._starts[-1] + self._order[-1].size if self._order else 0

    def read(self, position: int, length: int) -> bytes:
        """Up to `length` bytes from view position `position` (fewer only at the end)."""
        with self._lock:
            self._refresh()
            order, starts = list(self._order), list(self._starts)
        out = bytearray()
        slot = bisect.bisect_right(starts, position) - 1
        while slot < len(order) and len(out) < length:
            layout = order[slot]
            local = position + len(out) - starts[slot]
            if slot >= 0 and local < layout.size:
                for at, chunk in self._render_from(layout, local):
                    begin = max(local - at, 0)
                    out += chunk[begin : begin + length - len(out)]
                    if len(out) >= length:
                        break
            slot += 1
        return bytes(out)

    # -- the layout ------------------------------------------------------------------------------
    def _refresh(self) -> None:
        segments = [s for s in self.log.segments if s.base_offset >= self._floor_base()]
        layouts = []
        for segment in segments:
            layout = self._layouts.get(id(segment))
            if layout is None or layout.segment is not segment:
                layout = _SegmentLayout(segment)
            self._extend(layout)
            layouts.append(layout)
        self._layouts = {id(layout.segment): layout for layout in layouts}
        self._order = layouts
        starts, total = [], 0
        for layout in layouts:
            starts.append(total)
            total += layout.size
        self._starts = starts

    def _floor_base(self) -> int:
        bases = [s.base_offset for s in self.log.segments]
        slot = bisect.bisect_right(bases, self.start_offset) - 1
        return bases[max(slot, 0)] if bases else 0

    def _batches(self, segment: LogSegment, position: int, end: int) -> Iterator[tuple[BatchHeader, memoryview]]:
        for header, batch in segment.iter_batches(position, end):
            problem = check_batch(header, batch)
            if problem is not None:
                raise CorruptRecordError(segment.log_path, header.position, problem)
            yield header, batch

    def _extend(self, layout: _SegmentLayout) -> None:
        """Render what the segment gained since the last look (all of it, the first time)."""
        segment = layout.segment
        end = segment.refresh_size() if not segment.writable else segment.size
        if end <= layout.scanned_to:
            return
        for header, batch in self._batches(segment, layout.scanned_to, end):
            if header.last_offset >= self.start_offset:
                if layout.since_mark >= self._mark_bytes:
                    layout.marks_view.append(layout.size)
                    layout.marks_file.append(header.position)
                    layout.since_mark = 0
                rendered = len(self._render(header, batch, self.start_offset))
                layout.size += rendered
                layout.since_mark += rendered
            layout.scanned_to = header.next_position
            if layout.size == 0:  # nothing rendered yet: the first mark moves past skipped batches
                layout.marks_file[0] = layout.scanned_to

    def _render_from(self, layout: _SegmentLayout, local: int) -> Iterator[tuple[int, bytes]]:
        """(view position within the segment, bytes) of each batch from the mark at or below
        `local`, up to what the layout has measured."""
        mark = bisect.bisect_right(layout.marks_view, local) - 1
        at = layout.marks_view[mark]
        for header, batch in self._batches(layout.segment, layout.marks_file[mark], layout.scanned_to):
            if header.last_offset < self.start_offset:
                continue
            chunk = self._render(header, batch, self.start_offset)
            if at + len(chunk) > local:
                yield at, chunk
            at += len(chunk)
