"""The JSON Lines record format, one object per record:

    {"topic":"t","partition":0,"offset":12,"timestamp":1763800000000,"timestampType":"CreateTime",
     "key":"k","value":"v","headers":[{"key":"h","value":"x"}]}

bytes are a JSON string when they are UTF-8, `null` when null, else `{"base64":"..."}`; a header's
key, a string in Kafka but bytes on disk, likewise when it is not UTF-8 (not null). On input
topic/partition/offset/timestampType are ignored and timestamp is optional (epoch milliseconds or
ISO-8601).
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass
from json.encoder import encode_basestring as encode_json_string

from seglogfs.engine.errors import InvalidRecordError
from seglogfs.engine.record.records import Header, Record
from seglogfs.engine.text.timestamps import parse_timestamp


def bytes_json_text(data: bytes | None) -> str:
    if data is None:
        return "null"
    try:
        return encode_json_string(data.decode("utf-8"))
    except UnicodeDecodeError:
        return '{"base64":"' + base64.b64encode(data).decode("ascii") + '"}'


def header_key_json_text(key: str) -> str:
    """A header key (decoded with surrogateescape, as records hold it): a JSON string, or
    `{"base64":"..."}` of its bytes when they are not UTF-8 (a client other than Java's wrote it)."""
    try:
        key.encode("utf-8")
    except UnicodeEncodeError:
        return '{"base64":"' + base64.b64encode(key.encode("utf-8", "surrogateescape")).decode("ascii") + '"}'
    return encode_json_string(key)


def record_to_json(record: Record, topic: str, partition: int) -> str:
    """The JSON Lines object of a record (no newline). Assembled from pieces rather than through
    `json.dumps` of a dict: views and `consume` render millions of these."""
    headers = ",".join(
        '{"key":' + header_key_json_text(key) + ',"value":' + bytes_json_text(value) + "}"
        for key, value in record.headers
    )
    return (
        f'{{"topic":{encode_json_string(topic)},"partition":{partition},"offset":{record.offset},'
        f'"timestamp":{record.timestamp},"timestampType":"{record.timestamp_type.display_name}",'
        f'"key":{bytes_json_text(record.key)},"value":{bytes_json_text(record.value)},"headers":[{headers}]}}'
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
        key = _json_to_bytes(header.get("key"), f"header {slot} key", where) if isinstance(header, dict) else None
        if key is None:
            raise InvalidRecordError(f'{where}: header {slot} must be {{"key": "...", "value": ...}}')
        # (as records hold a key: its bytes, those that are not UTF-8 as surrogates)
        headers.append(
            (key.decode("utf-8", "surrogateescape"), _json_to_bytes(header.get("value"), f"header {slot} value", where))
        )
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
