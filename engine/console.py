"""Records as people read and write them: Kafka's console producer and consumer formats, the
JSON Lines record format, and timestamps given as text.

Text (kafka-console-consumer's DefaultMessageFormatter): the enabled fields in this order, each
followed by `key.separator` (default tab) when another field follows, then `line.separator`:

    CreateTime:<ms>  Partition:<p>  Offset:<o>  <headers k:v,k:v | NO_HEADERS>  <key>  <value>

null keys, values and header values print as `null.literal` (default `null`).

Lines in (kafka-console-producer's LineMessageReader): each line is one record's value; with
`parse.key=true` the text before the first `key.separator` is the key; a key or value equal to
`null.marker` (when set) is null.

JSON Lines, one object per record:

    {"topic":"t","partition":0,"offset":12,"timestamp":1763800000000,"timestampType":"CreateTime",
     "key":"k","value":"v","headers":[{"key":"h","value":"x"}]}

bytes are a JSON string when they are UTF-8, `null` when null, else `{"base64":"..."}`. On input
topic/partition/offset/timestampType are ignored and timestamp is optional.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from json.encoder import encode_basestring as _encode_json_string

import numpy as np

from seglogfs.engine.columns import RecordColumns, record_columns
from seglogfs.engine.errors import InvalidRecordError, TimestampParseError
from seglogfs.engine.records import BatchHeader, Header, Record, decode_records


def parse_timestamp(text: str) -> int:
    """Epoch milliseconds, or ISO-8601 (`2026-11-22T10:00:00Z`, `2026-11-22T10:00:00.5+01:00`,
    `2026-11-22`); a time without a zone is UTC. Raises TimestampParseError."""
    stripped = text.strip()
    if stripped.lstrip("-").isdigit():
        return int(stripped)
    try:
        moment = datetime.fromisoformat(stripped)
    except ValueError:
        raise TimestampParseError(
            f"timestamp {text!r} is neither epoch milliseconds nor ISO-8601 (e.g. 2026-11-22T10:00:00Z)"
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return int(moment.timestamp() * 1000)


def _flag(properties: Mapping[str, str], name: str, default: bool = False) -> bool:
    value = properties.get(name)
    if value is None:
        return default
    lowered = value.strip().lower()
    if lowered not in ("true", "false"):
        raise InvalidRecordError(f"property {name}={value!r}: expected true or false")
    return lowered == "true"


def _unescape(text: str) -> str:
    """`\\t`, `\\n` and friends as typed on a command line."""
    return text.encode("latin-1", "backslashreplace").decode("unicode_escape")


@dataclass(frozen=True)
class TextFormat:
    """kafka-console-consumer's output options."""

    print_timestamp: bool = False
    print_partition: bool = False
    print_offset: bool = False
    print_headers: bool = False
    print_key: bool = False
    print_value: bool = True
    key_separator: bytes = b"\t"
    line_separator: bytes = b"\n"
    headers_separator: bytes = b","
    null_literal: bytes = b"null"

    @classmethod
    def from_properties(cls, properties: Mapping[str, str]) -> TextFormat:
        """Options from console-consumer property names (`print.key`, `key.separator`, …)."""
        known = {
            "print.timestamp",
            "print.partition",
            "print.offset",
            "print.headers",
            "print.key",
            "print.value",
            "key.separator",
            "line.separator",
            "headers.separator",
            "null.literal",
        }
        unknown = sorted(set(properties) - known)
        if unknown:
            raise InvalidRecordError(f"unknown formatter property {unknown[0]!r}")

        def text(name: str, default: bytes) -> bytes:
            value = properties.get(name)
            return default if value is None else _unescape(value).encode("utf-8")

        return cls(
            print_timestamp=_flag(properties, "print.timestamp"),
            print_partition=_flag(properties, "print.partition"),
            print_offset=_flag(properties, "print.offset"),
            print_headers=_flag(properties, "print.headers"),
            print_key=_flag(properties, "print.key"),
            print_value=_flag(properties, "print.value", True),
            key_separator=text("key.separator", b"\t"),
            line_separator=text("line.separator", b"\n"),
            headers_separator=text("headers.separator", b","),
            null_literal=text("null.literal", b"null"),
        )

    def render(self, record: Record, partition: int) -> bytes:
        """One record as the console consumer prints it, line separator included."""
        fields: list[bytes] = []
        if self.print_timestamp:
            fields.append(f"{record.timestamp_type.display_name}:{record.timestamp}".encode())
        if self.print_partition:
            fields.append(f"Partition:{partition}".encode())
        if self.print_offset:
            fields.append(f"Offset:{record.offset}".encode())
        if self.print_headers:
            if record.headers:
                fields.append(
                    self.headers_separator.join(
                        key.encode("utf-8", "surrogateescape") + b":" + (self.null_literal if value is None else value)
                        for key, value in record.headers
                    )
                )
            else:
                fields.append(b"NO_HEADERS")
        if self.print_key:
            fields.append(self.null_literal if record.key is None else record.key)
        if self.print_value:
            fields.append(self.null_literal if record.value is None else record.value)
        return self.key_separator.join(fields) + self.line_separator


@dataclass(frozen=True)
class LineFormat:
    """kafka-console-producer's input options."""

    parse_key: bool = False
    key_separator: bytes = b"\t"
    null_marker: bytes | None = None

    @classmethod
    def from_properties(cls, properties: Mapping[str, str]) -> LineFormat:
        unknown = sorted(set(properties) - {"parse.key", "key.separator", "null.marker"})
        if unknown:
            raise InvalidRecordError(f"unknown producer property {unknown[0]!r}")
        separator = _unescape(properties.get("key.separator", "\t")).encode("utf-8")
        if not separator:
            raise InvalidRecordError("property key.separator must not be empty")
        marker = properties.get("null.marker")
        return cls(
            parse_key=_flag(properties, "parse.key"),
            key_separator=separator,
            null_marker=None if marker is None else _unescape(marker).encode("utf-8"),
        )

    def parse(self, line: bytes, where: str) -> tuple[bytes | None, bytes | None]:
        """A line (without its newline) → (key, value); InvalidRecordError naming `where` when
        `parse.key` is on and the separator is missing."""
        key: bytes | None = None
        value: bytes | None = line
        if self.parse_key:
            key, separator, rest = line.partition(self.key_separator)
            if not separator:
                raise InvalidRecordError(f"{where}: no key separator {self.key_separator!r} in line {_preview(line)}")
            value = rest
            if self.null_marker is not None and key == self.null_marker:
                key = None
        if self.null_marker is not None and value == self.null_marker:
            value = None
        return key, value


def _preview(line: bytes) -> str:
    text = line[:60].decode("utf-8", "replace")
    return repr(text + ("…" if len(line) > 60 else ""))


def _bytes_json_text(data: bytes | None) -> str:
    if data is None:
        return "null"
    try:
        return _encode_json_string(data.decode("utf-8"))
    except UnicodeDecodeError:
        return '{"base64":"' + base64.b64encode(data).decode("ascii") + '"}'


def record_to_json(record: Record, topic: str, partition: int) -> str:
    """The JSON Lines object of a record (no newline). Assembled from pieces rather than through
    `json.dumps` of a dict: views and `consume` render millions of these."""
    headers = ",".join(
        '{"key":' + _encode_json_string(key) + ',"value":' + _bytes_json_text(value) + "}"
        for key, value in record.headers
    )
    return (
        f'{{"topic":{_encode_json_string(topic)},"partition":{partition},"offset":{record.offset},'
        f'"timestamp":{record.timestamp},"timestampType":"{record.timestamp_type.display_name}",'
        f'"key":{_bytes_json_text(record.key)},"value":{_bytes_json_text(record.value)},"headers":[{headers}]}}'
    )


@dataclass(frozen=True)
class JsonRecord:
    """A record read from a JSON line, ready to append."""

    key: bytes | None
    value: bytes | None
    headers: tuple[Header, ...]
    timestamp: int | None


def _json_to_bytes(value: object, field: str, where: str) -> bytes | None:
    if value is None:
        return None
    if isinstance(value, str):
        return value.encode("utf-8", "surrogatepass")
    if isinstance(value, dict) and set(value) == {"base64"} and isinstance(value["base64"], str):
        try:
            return base64.b64decode(value["base64"], validate=True)
        except ValueError:
            raise InvalidRecordError(f"{where}: {field} has invalid base64") from None
    raise InvalidRecordError(f'{where}: {field} must be a string, null or {{"base64": "..."}}')


def record_from_json(line: bytes | str, where: str) -> JsonRecord:
    """Parse one JSON line; InvalidRecordError naming `where` (and the column) when malformed."""
    try:
        document = json.loads(line)
    except ValueError as error:
        message = getattr(error, "msg", str(error))
        column = getattr(error, "colno", None)
        at = f", column {column}" if column else ""
        raise InvalidRecordError(f"{where}{at}: malformed JSON: {message}") from None
    if not isinstance(document, dict):
        raise InvalidRecordError(f"{where}: expected a JSON object per line")
    if "value" not in document:
        raise InvalidRecordError(f'{where}: the record has no "value" field')
    headers_doc = document.get("headers") or []
    if not isinstance(headers_doc, list):
        raise InvalidRecordError(f"{where}: headers must be a list")
    headers: list[Header] = []
    for slot, header in enumerate(headers_doc):
        if not isinstance(header, dict) or not isinstance(header.get("key"), str):
            raise InvalidRecordError(f'{where}: header {slot} must be {{"key": "...", "value": ...}}')
        headers.append((header["key"], _json_to_bytes(header.get("value"), f"header {slot} value", where)))
    timestamp = document.get("timestamp")
    if timestamp is not None and (isinstance(timestamp, bool) or not isinstance(timestamp, int)):
        if isinstance(timestamp, str):
            timestamp = parse_timestamp(timestamp)
        else:
            raise InvalidRecordError(f"{where}: timestamp must be epoch milliseconds or an ISO-8601 string")
    return JsonRecord(
        key=_json_to_bytes(document.get("key"), "key", where),
        value=_json_to_bytes(document["value"], "value", where),
        headers=tuple(headers),
        timestamp=timestamp,
    )


# -- whole batches at a time ------------------------------------------------------------------------
# `consume` and the mount's views render millions of records: a renderer lays a batch out
# column-wise (engine.columns) and formats its records without a Record object each. Batches with
# headers (when they are shown) are decoded record by record: the result is the same bytes.


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


_SMALL_BATCH_RECORDS = 8  # batches this small are decoded record by record (see TextRenderer)
_NO_RECORDS = RenderedBatch(b"", np.zeros(0, np.int64), np.zeros(0, np.int64))


class TextRenderer:
    """Batches as kafka-console-consumer prints them (`TextFormat`) for one partition."""

    def __init__(self, text_format: TextFormat, partition: int) -> None:
        self.text_format = text_format
        self.partition = partition

    def lines(self, header: BatchHeader, batch: bytes | bytearray | memoryview, min_offset: int = 0) -> list[bytes]:
        """The lines (separator included) of the batch's records with offsets ≥ `min_offset`;
        none for a control batch. Raises ValueError when the records section is malformed."""
        if header.is_control:
            return []
        fmt = self.text_format
        if self._record_at_a_time(header):
            return [fmt.render(r, self.partition) for r in decode_records(header, batch) if r.offset >= min_offset]
        columns = record_columns(header, batch)
        first = columns.first_at_or_after(min_offset) if min_offset > header.base_offset else 0
        return self._column_lines(header, columns, first)

    def render(self, header: BatchHeader, batch: bytes | bytearray | memoryview, min_offset: int = 0) -> bytes:
        """`lines` joined."""
        if header.is_control or self._record_at_a_time(header):
            return b"".join(self.lines(header, batch, min_offset))
        columns = record_columns(header, batch)
        first = columns.first_at_or_after(min_offset) if min_offset > header.base_offset else 0
        return self._render_columns(header, columns, first)

    def render_indexed(self, header: BatchHeader, batch: bytes | bytearray | memoryview) -> RenderedBatch:
        """`render` of the whole batch, with where each record's line ends."""
        fmt = self.text_format
        if header.is_control:
            return _NO_RECORDS
        if self._record_at_a_time(header):
            records = decode_records(header, batch)
            lines = [fmt.render(r, self.partition) for r in records]
            return RenderedBatch(b"".join(lines), np.array([r.offset for r in records], np.int64), _ends(lines))
        columns = record_columns(header, batch)
        return RenderedBatch(
            self._render_columns(header, columns, 0), columns.offsets, np.cumsum(self._sizes(header, columns))
        )

    def measure(self, header: BatchHeader, batch: bytes | bytearray | memoryview) -> int:
        """`len(render(header, batch))`, computed from the record columns without rendering
        (except when headers are shown)."""
        if header.is_control or self._record_at_a_time(header):
            return len(self.render(header, batch))
        return int(self._sizes(header, record_columns(header, batch)).sum())

    def _record_at_a_time(self, header: BatchHeader) -> bool:
        """Headers are shown, or the batch is small (the column-wise layout costs tens of
        microseconds a batch, whatever its size: a batch of a few records decodes faster)."""
        return self.text_format.print_headers or header.records_count <= _SMALL_BATCH_RECORDS

    def _render_columns(self, header: BatchHeader, columns: RecordColumns, first: int) -> bytes:
        if first >= len(columns):
            return b""
        if self._shown_fields() == 1:  # the usual case, values only: one join, no line per record
            end = self.text_format.line_separator
            return end.join(self._fields(header, columns, first)[0]) + end
        return b"".join(self._column_lines(header, columns, first))

    def _shown_fields(self) -> int:
        fmt = self.text_format
        return sum((fmt.print_timestamp, fmt.print_partition, fmt.print_offset, fmt.print_key, fmt.print_value))

    def _column_lines(self, header: BatchHeader, columns: RecordColumns, first: int) -> list[bytes]:
        fields = self._fields(header, columns, first)
        end = self.text_format.line_separator
        if not fields:
            return [end] * (len(columns) - first)
        if len(fields) == 1:
            return [field + end for field in fields[0]]
        separator = self.text_format.key_separator
        return [separator.join(parts) + end for parts in zip(*fields, strict=True)]

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

    def _fields(self, header: BatchHeader, columns: RecordColumns, first: int) -> list[list[bytes]]:
        fmt = self.text_format
        null = fmt.null_literal
        fields: list[list[bytes]] = []
        if fmt.print_timestamp:
            name = header.timestamp_type.display_name.encode() + b":"
            fields.append([name + b"%d" % t for t in columns.consumer_timestamps()[first:].tolist()])
        if fmt.print_partition:
            fields.append([b"Partition:%d" % self.partition] * (len(columns) - first))
        if fmt.print_offset:
            fields.append([b"Offset:%d" % o for o in columns.offsets[first:].tolist()])
        if fmt.print_key:
            fields.append(columns.keys(null)[first:])  # type: ignore[arg-type]
        if fmt.print_value:
            fields.append(columns.values(null)[first:])  # type: ignore[arg-type]
        return fields


class JsonLinesRenderer:
    """Batches as JSON Lines (`record_to_json`) for one partition."""

    def __init__(self, topic: str, partition: int) -> None:
        self.topic = topic
        self.partition = partition
        self._prefix = f'{{"topic":{_encode_json_string(topic)},"partition":{partition},"offset":'

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
        first = columns.first_at_or_after(min_offset) if min_offset > header.base_offset else 0
        prefix = self._prefix
        kind = header.timestamp_type.display_name
        offsets = columns.offsets[first:]
        lines = [
            f'{prefix}{offset},"timestamp":{timestamp},"timestampType":"{kind}",'
            f'"key":{_bytes_json_text(key)},"value":{_bytes_json_text(value)},"headers":[]}}'
            for offset, timestamp, key, value in zip(
                offsets.tolist(),
                columns.consumer_timestamps()[first:].tolist(),
                columns.keys()[first:],
                columns.values()[first:],
                strict=True,
            )
        ]
        return lines, offsets

    def render(self, header: BatchHeader, batch: bytes | bytearray | memoryview, min_offset: int = 0) -> bytes:
        """`lines` as UTF-8, each ended by a newline."""
        lines = self.lines(header, batch, min_offset)
        return ("\n".join(lines) + "\n").encode() if lines else b""

    def render_indexed(self, header: BatchHeader, batch: bytes | bytearray | memoryview) -> RenderedBatch:
        """`render` of the whole batch, with where each record's line ends."""
        lines, offsets = self._lines(header, batch, 0)
        encoded = [line.encode() + b"\n" for line in lines]
        return RenderedBatch(b"".join(encoded), offsets, _ends(encoded))

    def measure(self, header: BatchHeader, batch: bytes | bytearray | memoryview) -> int:
        """`len(render(header, batch))`."""
        return len(self.render(header, batch))


def _ends(pieces: list[bytes]) -> np.ndarray:
    """Where each piece ends when they are joined."""
    return np.cumsum(np.fromiter(map(len, pieces), np.int64, len(pieces)))


_POWERS_OF_TEN = np.array([10**k for k in range(1, 19)], np.int64)


def _decimal_widths(values: np.ndarray) -> np.ndarray:
    """The number of characters of each integer written in decimal (a minus sign included)."""
    return np.searchsorted(_POWERS_OF_TEN, np.abs(values), side="right") + 1 + (values < 0)
