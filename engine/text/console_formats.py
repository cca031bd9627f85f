"""Kafka's console producer and consumer formats.

Text out (kafka-console-consumer's DefaultMessageFormatter, `TextFormat`): the enabled fields in
this order, each followed by `key.separator` (default tab) when another field follows, then
`line.separator`:

    CreateTime:<ms>  Partition:<p>  Offset:<o>  <headers k:v,k:v | NO_HEADERS>  <key>  <value>

null keys, values and header values print as `null.literal` (default `null`).

Lines in (kafka-console-producer's LineMessageReader, `LineFormat`): each line is one record's
value; with `parse.key=true` the text before the first `key.separator` is the key; a key or
value equal to `null.marker` (when set) is null.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from seglogfs.engine.errors import InvalidRecordError
from seglogfs.engine.record.records import Record


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
