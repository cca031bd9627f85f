"""Record batches rendered a batch at a time, as `consume` and the mount's views show them: text
(`TextFormat`) and JSON Lines (`record_to_json`).

`consume` and the views render millions of records: a renderer lays a batch out column-wise
(engine.record.columns) and formats its records without a Record object each. Batches with headers
(when they are shown) and small batches are decoded record by record: the result is the same
bytes. `render_indexed` also says where each record's part ends, and `measure` gives the size of
a rendering without producing it where the columns allow.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from seglogfs.engine import _core
from seglogfs.engine.record.columns import RecordColumns, record_columns
from seglogfs.engine.record.compression import CompressionType
from seglogfs.engine.record.records import (
    BATCH_OVERHEAD_BYTES,
    CURRENT_MAGIC,
    BatchHeader,
    TimestampType,
    check_record_count,
    decode_records,
    records_section,
)
from seglogfs.engine.text.console_formats import TextFormat
from seglogfs.engine.text.json_records import bytes_json_text, encode_json_string, record_to_json


@dataclass(frozen=True, slots=True)
class RenderedBatch:
    """A batch's rendering with where each record's part ends in it (`ends[i]`, cumulative), so
    that the part from any offset on is known without rendering again."""

    data: bytes
    offsets: np.ndarray
    ends: np.ndarray

    def bytes_from(self, offset: int) -> int:
        """How many of the bytes belong to records with offsets ≥ `offset`."""
        first = int(np.searchsorted(self.offsets, offset))
        return len(self.data) - (int(self.ends[first - 1]) if first else 0)


# What a record shows of its timestamp type, CreateTime's then LogAppendTime's (a range renderer's).
_TIME_KINDS = tuple(kind.display_name.encode() for kind in (TimestampType.CREATE_TIME, TimestampType.LOG_APPEND_TIME))
_TIME_LABELS = tuple(kind + b":" for kind in _TIME_KINDS)
_SMALL_BATCH_RECORDS = 8  # batches this small are decoded record by record (see TextRenderer)
_ALL_OFFSETS = -(1 << 63)  # a min_offset below every record's
_NO_RECORDS = RenderedBatch(b"", np.zeros(0, np.int64), np.zeros(0, np.int64))


class TextRenderer:
    """Batches as kafka-console-consumer prints them (`TextFormat`) for one partition."""

    def __init__(self, text_format: TextFormat, partition: int) -> None:
        self.text_format = text_format
        self.partition = partition
        fmt = text_format
        # What the core's text renderers take after the timestamp label: the partition field
        # (None: not shown), the fields shown, the separators and the null literal.
        self._fields_shown = (
            b"Partition:%d" % partition if fmt.print_partition else None,
            fmt.print_offset,
            fmt.print_key,
            fmt.print_value,
            fmt.key_separator,
            fmt.line_separator,
            fmt.null_literal,
        )

    def lines(self, header: BatchHeader, batch: bytes | bytearray | memoryview, min_offset: int = 0) -> list[bytes]:
        """The lines (separator included) of the batch's records with offsets ≥ `min_offset`;
        none for a control batch. Raises ValueError when the records section is malformed."""
        if header.is_control:
            return []
        fmt = self.text_format
        if self._record_at_a_time(header):
            return [fmt.render(r, self.partition) for r in decode_records(header, batch) if r.offset >= min_offset]
        data, ends, _ = self._render_section(header, batch, min_offset)
        if not len(ends):
            return []
        starts = [0, *ends[:-1].tolist()]
        return [data[a:b] for a, b in zip(starts, ends.tolist(), strict=True)]

    def render(self, header: BatchHeader, batch: bytes | bytearray | memoryview, min_offset: int = 0) -> bytes:
        """`lines` joined."""
        if header.is_control or self._record_at_a_time(header):
            return b"".join(self.lines(header, batch, min_offset))
        return self._render_section(header, batch, min_offset)[0]

    def render_some(
        self, header: BatchHeader, batch: bytes | bytearray | memoryview, min_offset: int, room: int | None
    ) -> tuple[bytes, int]:
        """The lines of at most `room` records (None: all) from `min_offset`, and how many."""
        if header.is_control or self._record_at_a_time(header):
            lines = self.lines(header, batch, min_offset)[:room]
            return b"".join(lines), len(lines)
        data, ends, _ = self._render_section(header, batch, min_offset)
        return _first_lines(data, ends, room)

    def render_indexed(self, header: BatchHeader, batch: bytes | bytearray | memoryview) -> RenderedBatch:
        """`render` of the whole batch, with where each record's line ends."""
        fmt = self.text_format
        if header.is_control:
            return _NO_RECORDS
        if self._record_at_a_time(header):
            records = decode_records(header, batch)
            lines = [fmt.render(r, self.partition) for r in records]
            return RenderedBatch(b"".join(lines), np.array([r.offset for r in records], np.int64), _ends(lines))
        data, ends, offsets = self._render_section(header, batch, _ALL_OFFSETS)
        return RenderedBatch(data, offsets, ends)

    def render_range(
        self, fd: int, start: int, end: int, size: int | None = None, *, nowait: bool = False
    ) -> bytes | None:
        """The rendering of the batches the file `fd` holds in [start, end), when they render to
        `size` bytes (None: whatever size they take) in one call of the core, which reads them
        itself and holds the GIL once: v2 batches, uncompressed, intact. None otherwise (headers
        shown, or a batch the range cannot take): the caller renders batch by batch, which says
        what is wrong. `nowait` (an event loop): BlockingIOError unless every byte is in the OS
        page cache. Thread-safe."""
        fmt = self.text_format
        if fmt.print_headers:
            return None
        return _core.render_text_range(
            fd,
            start,
            end,
            -1 if size is None else size,
            _TIME_LABELS[0] if fmt.print_timestamp else None,
            _TIME_LABELS[1] if fmt.print_timestamp else None,
            *self._fields_shown,
            _SMALL_BATCH_RECORDS,
            nowait,
        )

    def measure(
        self, header: BatchHeader, batch: bytes | bytearray | memoryview, columns: RecordColumns | None = None
    ) -> int:
        """`len(render(header, batch))`, computed from the record columns without rendering
        (except when headers are shown); `columns`: the batch's, when the caller has them (a
        measure of both formats lays a batch out once)."""
        if header.is_control or self._record_at_a_time(header):
            return len(self.render(header, batch, _ALL_OFFSETS))
        return int(self._sizes(header, columns if columns is not None else record_columns(header, batch)).sum())

    def _record_at_a_time(self, header: BatchHeader) -> bool:
        """Headers are shown, or the batch is small (the column-wise layout costs tens of
        microseconds a batch, whatever its size: a batch of a few records decodes faster)."""
        return self.text_format.print_headers or header.records_count <= _SMALL_BATCH_RECORDS

    def _render_section(
        self, header: BatchHeader, batch: bytes | bytearray | memoryview, min_offset: int
    ) -> tuple[bytes, np.ndarray, np.ndarray]:
        """The lines of the records with offsets ≥ `min_offset`, rendered by the compiled core
        straight from the records section (no columns made: a batch costs one call), where each
        ends, and their offsets. Raises ValueError when the records section is malformed."""
        fmt = self.text_format
        section_args = _section_args(header, batch, min_offset)
        offsets, ends = np.empty((2, header.records_count), np.int64)
        arguments = (
            *section_args,
            header.timestamp_type.display_name.encode() + b":" if fmt.print_timestamp else None,
            *self._fields_shown,
            offsets,
            ends,
        )
        data, rendered = _core.render_text_section(*arguments)
        return data, ends[:rendered], offsets[:rendered]

    def _sizes(self, header: BatchHeader, columns: RecordColumns) -> np.ndarray:
        """The length of each record's line, from the columns alone."""
        fmt = self.text_format
        count = len(columns)
        null = len(fmt.null_literal)
        fields = 0
        sizes = np.full(count, len(fmt.line_separator), np.int64)
        if fmt.print_timestamp:
            fields += 1
            sizes += len(header.timestamp_type.display_name) + 1 + _decimal_widths(columns.consumer_timestamps())
        if fmt.print_partition:
            fields += 1
            sizes += len(b"Partition:%d" % self.partition)
        if fmt.print_offset:
            fields += 1
            sizes += len("Offset:") + _decimal_widths(columns.offsets)
        for shown, lengths in ((fmt.print_key, columns.key_lengths), (fmt.print_value, columns.value_lengths)):
            if shown:
                fields += 1
                sizes += np.where(lengths < 0, null, lengths)
        if fields > 1:
            sizes += (fields - 1) * len(fmt.key_separator)
        return sizes


_LINE_PARTS = ',"timestamp":,"timestampType":"","key":,"value":,"headers":[]}\n'  # a JSON line's fixed text


class JsonLinesRenderer:
    """Batches as JSON Lines (`record_to_json`) for one partition."""

    def __init__(self, topic: str, partition: int) -> None:
        self.topic = topic
        self.partition = partition
        self._prefix = f'{{"topic":{encode_json_string(topic)},"partition":{partition},"offset":'
        # A line's bytes besides its offset, timestamp, timestamp type, key and value.
        self._prefix_bytes = self._prefix.encode()
        self._fixed_bytes = len(self._prefix_bytes) + len(_LINE_PARTS)

    def lines(self, header: BatchHeader, batch: bytes | bytearray | memoryview, min_offset: int = 0) -> list[str]:
        """The JSON object (no newline) of each of the batch's records with offsets ≥
        `min_offset`; none for a control batch. Raises ValueError when malformed."""
        return self._lines(header, batch, min_offset)[0]

    def _lines(
        self, header: BatchHeader, batch: bytes | bytearray | memoryview, min_offset: int
    ) -> tuple[list[str], np.ndarray]:
        """`lines`, and their records' offsets."""
        if header.is_control:
            return [], _NO_RECORDS.offsets
        columns = None if header.records_count <= _SMALL_BATCH_RECORDS else record_columns(header, batch)
        if columns is None or bool(columns.header_counts.any()):
            records = [r for r in decode_records(header, batch) if r.offset >= min_offset]
            offsets = np.array([r.offset for r in records], np.int64)
            return [record_to_json(r, self.topic, self.partition) for r in records], offsets
        prefix = self._prefix
        kind = header.timestamp_type.display_name
        # Each record at or past min_offset, as Kafka's consumer skips each record below its
        # position (offsets need not rise within a batch).
        kept = columns.offsets >= min_offset
        offsets = columns.offsets[kept]
        lines = [
            f'{prefix}{offset},"timestamp":{timestamp},"timestampType":"{kind}",'
            f'"key":{bytes_json_text(key)},"value":{bytes_json_text(value)},"headers":[]}}'
            for offset, timestamp, key, value, keep in zip(
                columns.offsets.tolist(),
                columns.consumer_timestamps().tolist(),
                columns.keys(),
                columns.values(),
                kept.tolist(),
                strict=True,
            )
            if keep
        ]
        return lines, offsets

    def render_range(
        self, fd: int, start: int, end: int, size: int | None = None, *, nowait: bool = False
    ) -> bytes | None:
        """`TextRenderer.render_range` for JSON Lines (None also when a record has headers)."""
        create_kind, append_kind = _TIME_KINDS
        return _core.render_json_range(
            fd, start, end, -1 if size is None else size, self._prefix_bytes, create_kind, append_kind, nowait
        )

    def render(self, header: BatchHeader, batch: bytes | bytearray | memoryview, min_offset: int = 0) -> bytes:
        """`lines` as UTF-8, each ended by a newline."""
        return self.render_some(header, batch, min_offset, None)[0]

    def render_some(
        self, header: BatchHeader, batch: bytes | bytearray | memoryview, min_offset: int, room: int | None
    ) -> tuple[bytes, int]:
        """The lines of at most `room` records (None: all) from `min_offset`, and how many:
        rendered by the compiled core, but for records with headers."""
        if header.is_control:
            return b"", 0
        rendered = self._render_section(header, batch, min_offset)
        if rendered is None:  # records with headers: one at a time
            lines = self.lines(header, batch, min_offset)[:room]
            return ("\n".join(lines) + "\n").encode() if lines else b"", len(lines)
        data, ends, _ = rendered
        return _first_lines(data, ends, room)

    def _render_section(
        self, header: BatchHeader, batch: bytes | bytearray | memoryview, min_offset: int
    ) -> tuple[bytes, np.ndarray, np.ndarray] | None:
        """The lines of the records with offsets ≥ `min_offset`, rendered by the compiled core
        straight from the records section, where each ends, and their offsets; None when one of
        them has headers. Raises ValueError when the records section is malformed."""
        section_args = _section_args(header, batch, min_offset)
        offsets, ends = np.empty((2, header.records_count), np.int64)
        rendered = _core.render_json_section(
            *section_args,
            self._prefix_bytes,
            header.timestamp_type.display_name.encode(),
            offsets,
            ends,
        )
        if rendered is None:
            return None
        data, lines = rendered
        return data, ends[:lines], offsets[:lines]

    def render_indexed(self, header: BatchHeader, batch: bytes | bytearray | memoryview) -> RenderedBatch:
        """`render` of the whole batch, with where each record's line ends."""
        if header.is_control:
            return _NO_RECORDS
        rendered = self._render_section(header, batch, _ALL_OFFSETS)
        if rendered is None:  # records with headers: one at a time
            lines, offsets = self._lines(header, batch, _ALL_OFFSETS)
            encoded = [line.encode() + b"\n" for line in lines]
            return RenderedBatch(b"".join(encoded), offsets, _ends(encoded))
        data, ends, offsets = rendered
        return RenderedBatch(data, offsets, ends)

    def measure(
        self, header: BatchHeader, batch: bytes | bytearray | memoryview, columns: RecordColumns | None = None
    ) -> int:
        """`len(render(header, batch))`, computed from the record columns and the compiled
        core's JSON text sizes of keys and values, without rendering (except for records with
        headers); `columns`: the batch's, when the caller has them."""
        if header.is_control:
            return 0
        if columns is None:
            columns = record_columns(header, batch)
        if bool(columns.header_counts.any()):
            return len(self.render(header, batch, _ALL_OFFSETS))
        count = len(columns)
        keys, values = np.empty(count, np.int64), np.empty(count, np.int64)
        _core.json_text_sizes(columns.section, columns.key_starts, columns.key_lengths, keys)
        _core.json_text_sizes(columns.section, columns.value_starts, columns.value_lengths, values)
        fixed = self._fixed_bytes + len(header.timestamp_type.display_name)
        widths = _decimal_widths(columns.offsets) + _decimal_widths(columns.consumer_timestamps())
        return int(count * fixed + widths.sum() + keys.sum() + values.sum())


def _section_args(
    header: BatchHeader, batch: bytes | bytearray | memoryview, min_offset: int
) -> tuple[bytes | memoryview, int, int, int, int | None, int]:
    """What the core's section renderers take first: the uncompressed records section (where it
    lies in `batch`, not a copy, when stored uncompressed: the core reads it during the call),
    the record count, base offset and base timestamp, the time every record shows (a
    LogAppendTime batch's) or None, and the lowest offset to render. ValueError when the record
    count is more than the section can hold (checked before the caller sizes arrays by it)."""
    if header.magic == CURRENT_MAGIC and header.compression is CompressionType.NONE:
        section: bytes | memoryview = memoryview(batch)[BATCH_OVERHEAD_BYTES:]
    else:
        section = records_section(header, batch)
    check_record_count(header.records_count, len(section))
    append_time = header.max_timestamp if header.timestamp_type is TimestampType.LOG_APPEND_TIME else None
    return section, header.records_count, header.base_offset, header.base_timestamp, append_time, min_offset


def _first_lines(data: bytes, ends: np.ndarray, room: int | None) -> tuple[bytes, int]:
    """The first `room` lines (None: all) of `data`, whose lines end at `ends`, and how many."""
    if room is None or room >= len(ends):
        return data, len(ends)
    return (data[: int(ends[room - 1])] if room > 0 else b""), max(room, 0)


def _ends(pieces: list[bytes]) -> np.ndarray:
    """Where each piece ends when they are joined."""
    return np.cumsum(np.fromiter(map(len, pieces), np.int64, len(pieces)))


_POWERS_OF_TEN = np.array([10**k for k in range(1, 20)], np.uint64)


def _decimal_widths(values: np.ndarray) -> np.ndarray:
    """The number of characters of each integer written in decimal (a minus sign included).
    Magnitudes as uint64: that of -2^63 is not an int64 (np.abs leaves it -2^63, whose bits as
    uint64 are 2^63, its magnitude)."""
    magnitudes = np.abs(values).view(np.uint64)
    return np.searchsorted(_POWERS_OF_TEN, magnitudes, side="right") + 1 + (values < 0)
