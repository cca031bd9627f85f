"""Kafka's message encoding: the records its coordinators and its Raft layer write, read by
their schemas (the `*.json` message definitions under Kafka's `common/message`), and the JSON
Kafka's generated JsonConverters print for them.

A schema (`Schema`) lists fields in order; each field exists in a range of versions and may be
nullable in a range of versions. Encoding, all integers big-endian:

    int8/int16/int32/int64   1/2/4/8 bytes, signed; uint16 2 bytes unsigned; float64 8 bytes
    bool                     1 byte, 0 or 1
    uuid                     16 bytes
    string                   int16 length (-1 = null), UTF-8           (non-flexible versions)
                             unsigned varint length + 1 (0 = null)      (flexible versions)
    bytes                    int32 length (-1 = null)                   (non-flexible)
                             unsigned varint length + 1 (0 = null)      (flexible)
    array                    int32 count (-1 = null), then the items    (non-flexible)
                             unsigned varint count + 1 (0 = null)       (flexible)
    struct                   its fields; in flexible versions followed by its tagged fields

Tagged fields (flexible versions only) come after a struct's regular fields: an unsigned varint
count, then per field an unsigned varint tag, an unsigned varint size and the field's bytes.
Tags the schema does not name are skipped, as Kafka skips them.

`decode` returns the fields present in the version as a dict, in the schema's order, with the
JSON names Kafka's JsonConverter writes (the field name with its first letter lower-cased);
`json_ready` and `to_json` write that dict as Jackson does (compact, no spaces, bytes as standard
base64, a uuid as URL-safe base64 without padding, a float64 as Java's Double.toString, non-ASCII
text as is). A tagged field given a `default` is left out of the JSON while it holds that value,
as Kafka's generated JsonConverters leave it out. Every failure is ValueError (a field running
past the end, a string that is not UTF-8, a length below -1).
"""

from __future__ import annotations

import base64
import json
import math
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

NO_LIMIT = 0x7FFF  # "N+": no upper version
ALWAYS_SHOWN: Any = object()  # a tagged field without a `default`: shown whenever its bytes hold it


@dataclass(frozen=True)
class Field:
    """One schema field. `kind` is a primitive name (`int32`, `string`, …), `[]kind` for an
    array of primitives, or a nested `Schema` (`array` says whether it is `[]Struct`).
    `versions` and `nullable` are inclusive (low, high) ranges; `tag` is set for tagged
    fields, and `default` is a tagged field's default in Kafka's schema (its `"default"`, else
    the type's: 0, false, "", an empty array), the value its JsonConverter does not print."""

    name: str
    kind: str | Schema
    versions: tuple[int, int] = (0, NO_LIMIT)
    nullable: tuple[int, int] | None = None
    array: bool = False
    tag: int | None = None
    default: Any = ALWAYS_SHOWN

    @property
    def json_name(self) -> str:
        return self.name[:1].lower() + self.name[1:]


@dataclass(frozen=True)
class Schema:
    """A message or struct: its fields, and the first flexible version (None: never)."""

    name: str
    fields: Sequence[Field] = field(default_factory=tuple)
    flexible_from: int | None = None

    def is_flexible(self, version: int) -> bool:
        return self.flexible_from is not None and version >= self.flexible_from


def since(low: int, high: int = NO_LIMIT) -> tuple[int, int]:
    """A version range: `since(3)` is Kafka's "3+", `since(1, 1)` is "1"."""
    return (low, high)


_FIXED = {"int8": ">b", "int16": ">h", "int32": ">i", "int64": ">q", "uint16": ">H", "float64": ">d"}


class Reader:
    """Reads Kafka's primitives from a buffer, from `position` on; ValueError past the end."""

    def __init__(self, buf: bytes | bytearray | memoryview, position: int = 0) -> None:
        self.buf = bytes(buf)
        self.position = position

    def take(self, count: int) -> bytes:
        if count < 0 or self.position + count > len(self.buf):
            raise ValueError(f"a field of {count} bytes at byte {self.position} runs past the end ({len(self.buf)})")
        out = self.buf[self.position : self.position + count]
        self.position += count
        return out

    def fixed(self, kind: str) -> Any:
        code = _FIXED[kind]
        return struct.unpack(code, self.take(struct.calcsize(code)))[0]

    def unsigned_varint(self) -> int:
        result = shift = 0
        while True:
            byte = self.take(1)[0]
            result |= (byte & 0x7F) << shift
            if byte < 0x80:
                return result
            shift += 7
            if shift > 28:
                raise ValueError("unsigned varint longer than five bytes")

    def length(self, flexible: bool, wide: bool) -> int:
        """A length or count: compact (unsigned varint - 1) or int16/int32; -1 is null."""
        if flexible:
            return self.unsigned_varint() - 1
        value = int(self.fixed("int32" if wide else "int16"))
        if value < -1:
            raise ValueError(f"negative length {value} at byte {self.position}")
        return value

    def string(self, flexible: bool) -> str | None:
        size = self.length(flexible, wide=False)
        if size < 0:
            return None
        try:
            return self.take(size).decode("utf-8")
        except UnicodeDecodeError as error:
            raise ValueError(f"a string that is not UTF-8: {error}") from None

    def raw_bytes(self, flexible: bool) -> bytes | None:
        size = self.length(flexible, wide=True)
        return None if size < 0 else self.take(size)

    def at_end(self) -> bool:
        return self.position >= len(self.buf)


def _in(version: int, versions: tuple[int, int] | None) -> bool:
    return versions is not None and versions[0] <= version <= versions[1]


def _primitive(reader: Reader, kind: str, flexible: bool) -> Any:
    if kind in _FIXED:
        return reader.fixed(kind)
    if kind == "bool":
        return reader.take(1)[0] != 0
    if kind == "uuid":
        return reader.take(16)
    if kind == "string":
        return reader.string(flexible)
    if kind == "bytes":
        return reader.raw_bytes(flexible)
    raise ValueError(f"unknown field type {kind}")


def _value(reader: Reader, spec: Field, version: int, flexible: bool) -> Any:
    kind = spec.kind
    if spec.array or (isinstance(kind, str) and kind.startswith("[]")):
        count = reader.length(flexible, wide=True)
        if count < 0:
            return None
        if isinstance(kind, Schema):
            return [decode_struct(reader, kind, version, flexible) for _ in range(count)]
        return [_primitive(reader, kind[2:], flexible) for _ in range(count)]
    if isinstance(kind, Schema):
        if _in(version, spec.nullable) and reader.fixed("int8") < 0:
            return None
        return decode_struct(reader, kind, version, flexible)
    return _primitive(reader, kind, flexible)


def decode_struct(reader: Reader, schema: Schema, version: int, flexible: bool) -> dict[str, Any]:
    """The fields of `schema` at `version`, read from `reader` (tagged ones included)."""
    out: dict[str, Any] = {}
    tagged = {}
    for spec in schema.fields:
        if spec.tag is not None:
            tagged[spec.tag] = spec
        elif _in(version, spec.versions):
            out[spec.json_name] = _value(reader, spec, version, flexible)
    if flexible:
        for _ in range(reader.unsigned_varint()):
            tag = reader.unsigned_varint()
            size = reader.unsigned_varint()
            spec_or_none = tagged.get(tag)
            body = reader.take(size)
            if spec_or_none is not None and _in(version, spec_or_none.versions):
                out[spec_or_none.json_name] = _value(Reader(body), spec_or_none, version, flexible)
        if tagged:  # in the schema's order, as Kafka's JsonConverter writes them
            order = [spec.json_name for spec in schema.fields]
            out = {name: out[name] for name in order if name in out}
    return out


def decode(buf: bytes | bytearray | memoryview, schema: Schema, version: int, position: int = 0) -> dict[str, Any]:
    """The message `schema` at `version` from `buf[position:]`, which it must fill exactly (as
    Kafka's readers insist for a record's key and value)."""
    reader = Reader(buf, position)
    out = decode_struct(reader, schema, version, schema.is_flexible(version))
    if not reader.at_end():
        raise ValueError(f"{len(reader.buf) - reader.position} bytes follow the {schema.name} v{version} fields")
    return out


def _jsonable(value: Any, spec: Field | None) -> Any:
    if isinstance(value, dict):
        return value
    if isinstance(value, list):
        return [_jsonable(item, None) for item in value]
    if isinstance(value, bytes):
        if spec is not None and spec.kind == "uuid":
            return uuid_text(value)
        return base64.b64encode(value).decode("ascii")
    return value


def json_ready(data: Mapping[str, Any], schema: Schema) -> dict[str, Any]:
    """`data` (from `decode`) with bytes as base64 and uuids as Kafka prints them, nested
    structs included: what `to_json` writes."""
    specs = {spec.json_name: spec for spec in schema.fields}
    out: dict[str, Any] = {}
    for name, value in data.items():
        spec = specs.get(name)
        if spec is not None and spec.tag is not None and spec.default is not ALWAYS_SHOWN and value == spec.default:
            continue
        if spec is not None and isinstance(spec.kind, Schema) and value is not None:
            nested = spec.kind
            out[name] = (
                [json_ready(item, nested) for item in value] if isinstance(value, list) else json_ready(value, nested)
            )
        elif isinstance(value, list) and spec is not None and isinstance(spec.kind, str):
            element = Field(spec.name, spec.kind[2:])
            out[name] = [_jsonable(item, element) for item in value]
        else:
            out[name] = _jsonable(value, spec)
    return out


def to_json(document: Any) -> str:
    """Compact JSON as Jackson's ObjectNode.toString writes it."""
    if not _holds_float(document):
        return json.dumps(document, separators=(",", ":"), ensure_ascii=False)
    if isinstance(document, dict):
        return "{" + ",".join(f"{to_json(str(name))}:{to_json(value)}" for name, value in document.items()) + "}"
    if isinstance(document, list):
        return "[" + ",".join(to_json(item) for item in document) + "]"
    text = java_double_text(document)
    return text if math.isfinite(document) else f'"{text}"'  # Jackson's QUOTE_NON_NUMERIC_NUMBERS


def _holds_float(document: Any) -> bool:
    if isinstance(document, float):
        return True
    if isinstance(document, dict):
        return any(_holds_float(value) for value in document.values())
    if isinstance(document, list):
        return any(_holds_float(item) for item in document)
    return False


def java_double_text(value: float) -> str:
    """A double as Java's Double.toString writes it (which Jackson uses for a DoubleNode): the
    shortest digits that read back as the same double; plain (`1048576.0`, `0.25`) from 10^-3
    up to below 10^7, else `1.0E7`, `2.5E-4`; `NaN`, `Infinity`, `-Infinity`, `-0.0`."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "Infinity" if value > 0 else "-Infinity"
    sign = "-" if math.copysign(1.0, value) < 0 else ""
    magnitude = abs(value)
    if magnitude == 0:
        return sign + "0.0"
    # repr gives the shortest digits that round-trip, as Java does; Decimal splits them into the
    # significant digits and the power of ten of the first one. (decimal is imported here, as only
    # floats in JSON documents need it, and every `seglogfs` start would pay for it.)
    from decimal import Decimal  # noqa: PLC0415

    shortest = Decimal(repr(magnitude)).normalize()
    digits = "".join(map(str, shortest.as_tuple().digits))
    exponent = shortest.adjusted()
    if 1e-3 <= magnitude < 1e7:
        if exponent >= 0:
            integer = digits[: exponent + 1].ljust(exponent + 1, "0")
            return f"{sign}{integer}.{digits[exponent + 1 :] or '0'}"
        return f"{sign}0.{'0' * (-exponent - 1)}{digits}"
    return f"{sign}{digits[0]}.{digits[1:] or '0'}E{exponent}"


def uuid_text(raw: bytes) -> str:
    """A uuid as Kafka prints it (Uuid.toString): URL-safe base64 of the 16 bytes, no padding."""
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")
