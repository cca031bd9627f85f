"""How kafka-dump-log prints a batch and its records (Kafka's DumpLogSegments): the batch line
(`baseOffset: … isvalid: …`, or a legacy message's `offset: … compresscodec: … crc: …`), a
record's line (`| offset: … headerKeys: [...]`, a control record's contents, `key: … payload:
…`), byte for byte as Kafka prints it: keys and payloads decoded as Java decodes UTF-8 (each
malformed sequence one U+FFFD, where Python's decoder would make several), and the decoders'
JSON (`--offsets-decoder`, `--transaction-log-decoder`, `--cluster-metadata-decoder`). Plain
records of a batch are printed column-wise (`plain_record_lines`), the others one by one. The
files and the command are mount_tools.dump's."""

from __future__ import annotations

import argparse
import codecs
import struct
import sys
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from seglogfs.engine.errors import EngineError
from seglogfs.engine.internal_topics.consumer_offsets import (
    CONSUMER_PROTOCOL_ASSIGNMENT,
    CONSUMER_PROTOCOL_SUBSCRIPTION,
    CONSUMER_PROTOCOL_TYPE,
    GROUP_METADATA_KEY,
    GROUP_METADATA_KEY_TYPE,
    GROUP_METADATA_VALUE,
    OFFSET_COMMIT_KEY,
    OFFSET_COMMIT_VALUE,
    decode_consumer_protocol,
    decode_key,
    decode_value,
    key_type,
)
from seglogfs.engine.internal_topics.metadata_records import describe_metadata_record
from seglogfs.engine.internal_topics.transaction_log import (
    TRANSACTION_LOG_KEY,
    TRANSACTION_LOG_VALUE,
    decode_transaction_log_key,
    decode_transaction_log_value,
    transaction_state_name,
)
from seglogfs.engine.record import legacy
from seglogfs.engine.record.columns import record_columns
from seglogfs.engine.record.compression import CompressionType, decompress
from seglogfs.engine.record.control_records import describe_control_record
from seglogfs.engine.record.messages import json_ready, to_json
from seglogfs.engine.record.records import (
    CURRENT_MAGIC,
    BatchHeader,
    LegacyBatchHeader,
    Record,
)

RECORD_INDENT = "|"

# (key text or None, payload text or None) of a record, as a kafka-dump-log MessageParser gives it.
MessageParser = Callable[[Record], tuple[str | None, str | None]]


class DumpFailed(Exception):
    """A file could not be dumped to the end; the reason was printed."""


def _bool(value: bool) -> str:
    return "true" if value else "false"


def batch_line(header: BatchHeader, valid: bool) -> str:
    """A v2 batch as DumpLogSegments' printBatchLevel prints it."""
    horizon = header.delete_horizon_ms
    horizon_text = "OptionalLong.empty" if horizon is None else f"OptionalLong[{horizon}]"
    return (
        f"baseOffset: {header.base_offset} lastOffset: {header.last_offset} count: {header.records_count} "
        f"baseSequence: {header.base_sequence} lastSequence: {header.last_sequence} "
        f"producerId: {header.producer_id} producerEpoch: {header.producer_epoch} "
        f"partitionLeaderEpoch: {header.partition_leader_epoch} isTransactional: {_bool(header.is_transactional)} "
        f"isControl: {_bool(header.is_control)} deleteHorizonMs: {horizon_text} position: {header.position} "
        f"{header.timestamp_type.display_name}: {header.max_timestamp} size: {header.size_in_bytes} "
        f"magic: {header.magic} compresscodec: {header.compression.config_name} crc: {header.crc} "
        f"isvalid: {_bool(valid)}"
    )


def legacy_batch_line(header: LegacyBatchHeader, batch: bytes | memoryview) -> str:
    """A legacy message as printBatchLevel prints one (magic < 2): its own offset (a wrapper's is
    its last inner offset), its timestamp (the wrapper's own, -1 for magic 0), and `isvalid`
    for its CRC-32 alone."""
    timestamp = struct.unpack_from(">q", batch, 18)[0] if header.magic == 1 else legacy.NO_TIMESTAMP
    return (
        f"offset: {header.last_offset} position: {header.position} {header.timestamp_type.display_name}: "
        f"{timestamp} size: {header.size_in_bytes} magic: {header.magic} "
        f"compresscodec: {header.compression.config_name} crc: {header.crc} "
        f"isvalid: {_bool(legacy.crc_problem(batch) is None)}"
    )


def legacy_checksums(header: LegacyBatchHeader, batch: bytes | memoryview) -> list[int]:
    """The stored CRC-32 of each of a legacy message's records, in order: the message's own for
    a plain message, each inner message's for a wrapper (whose inner CRCs the engine checked
    when it read the records)."""
    if header.compression is CompressionType.NONE:
        return [header.crc]
    if header.magic == 0 and header.compression is CompressionType.LZ4:
        # Kafka 0.8's LZ4 frames carry a wrong descriptor checksum that only engine.record.legacy reads
        # past; a magic 0 inner message holds no timestamp, so its bytes follow from its record.
        return [_magic0_checksum(record) for record in header.records]
    data = decompress(header.compression, legacy.parse_message(batch).value or b"")
    checksums = []
    position = 0
    while position < len(data):
        size, checksum = struct.unpack_from(">iI", data, position + 8)
        checksums.append(checksum)
        position += legacy.LOG_OVERHEAD_BYTES + size
    return checksums


def _magic0_checksum(record: Record) -> int:
    """CRC-32 of an uncompressed magic 0 message holding `record`: magic, attributes (0), key and
    value with their int32 lengths (-1 for null)."""
    body = bytearray(b"\x00\x00")
    for field in (record.key, record.value):
        body += struct.pack(">i", -1 if field is None else len(field)) + (field or b"")
    return zlib.crc32(body)


# -- message parsers (kafka-dump-log's MessageParser implementations) -----------------------------
def default_parser(record: Record) -> tuple[str | None, str | None]:
    """Kafka's StringDecoder for keys and values."""
    key = None if record.key is None else java_utf8(bytes(record.key))
    value = None if record.value is None else java_utf8(bytes(record.value))
    return key, value


REPLACEMENT = "\ufffd"


def _continuation(byte: int) -> bool:
    return byte & 0xC0 == 0x80


def java_utf8(data: bytes) -> str:
    """`data` as Java's `new String(data, UTF_8)` reads it, which is what kafka-dump-log prints:
    valid UTF-8 as Python decodes it, and malformed sequences each replaced by U+FFFD as the
    JDK's decoder cuts them, which is not always as Python's "replace" does (ED BA 69 is one
    U+FFFD and an `i` to Java, two U+FFFD and an `i` to Python; a UTF-8 encoded surrogate is one
    U+FFFD to Java, three to Python). Python's decoder decodes the valid stretches; each
    malformed sequence it stops at is cut as Java cuts it (`_java_malformed`)."""
    return data.decode("utf-8", errors=_JAVA_UTF8_ERRORS)


def _java_malformed(error: UnicodeError) -> tuple[str, int]:
    """The error handler of `java_utf8`: one U+FFFD for the malformed sequence at the point
    Python's decoder stopped, and where Java's decoder goes on after it."""
    if not isinstance(error, UnicodeDecodeError):
        raise error
    return REPLACEMENT, _java_malformed_end(error.object, error.start)


def _java_malformed_end(data: bytes, i: int) -> int:
    """Where the malformed sequence at `data[i]` ends for the JDK's UTF-8 decoder: after the
    lead alone, or after the bytes that began a sequence the next byte does not continue, or at
    the end of `data` for a sequence cut there."""
    size, lead = len(data), data[i]
    if 0xC2 <= lead <= 0xDF:  # two bytes: the second is no continuation, or missing
        return i + 1 if i + 1 < size else size
    if 0xE0 <= lead <= 0xEF:  # three bytes
        if i + 1 < size and ((lead == 0xE0 and data[i + 1] & 0xE0 == 0x80) or not _continuation(data[i + 1])):
            return i + 1
        if i + 2 >= size:
            return size  # cut at the end: one U+FFFD for all of it
        if not _continuation(data[i + 2]):
            return i + 2
        return i + 3  # (well formed, but a surrogate)
    if 0xF0 <= lead <= 0xF7:  # four bytes
        if i + 3 < size:
            if _bad_second_of_four(lead, data[i + 1]):
                return i + 1
            return i + 2 if not _continuation(data[i + 2]) else i + 3
        if lead > 0xF4 or (i + 1 < size and _bad_second_of_four(lead, data[i + 1])):
            return i + 1
        if i + 2 < size and not _continuation(data[i + 2]):
            return i + 2
        return size  # cut at the end: one U+FFFD for all of it
    return i + 1  # a continuation byte without its lead, C0, C1, F8-FF


_JAVA_UTF8_ERRORS = "seglogfs-java-utf8"
codecs.register_error(_JAVA_UTF8_ERRORS, _java_malformed)


def _bad_second_of_four(lead: int, second: int) -> bool:
    return (
        lead > 0xF4
        or (lead == 0xF0 and not 0x90 <= second <= 0xBF)
        or (lead == 0xF4 and second & 0xF0 != 0x80)
        or not _continuation(second)
    )


def _coordinator_record(
    record: Record,
    decode_key_fields: Callable[[bytes], tuple[int, dict[str, Any]] | None],
    key_schema: Callable[[int], Any],
    decode_value_fields: Callable[[int, bytes], tuple[int, dict[str, Any]]],
    value_json: Callable[[int, int, dict[str, Any]], Any],
) -> tuple[str | None, str | None]:
    """Kafka's CoordinatorRecordMessageParser: `{"type":"<record type>","data":{key}}` and
    `{"version":"<version>","data":{value}}`, `<DELETE>` for a tombstone, Kafka's skip lines for
    what it cannot read."""
    if record.key is None:
        raise ValueError(
            f"Failed to decode message at offset {record.offset} using the specified decoder "
            "(message had a missing key)"
        )
    key = bytes(record.key)
    try:
        decoded = decode_key_fields(key)
        if decoded is None:
            return f"Unknown record type {key_type(key)} at offset {record.offset}, skipping.", None
        kind, fields = decoded
        key_text = to_json({"type": str(kind), "data": json_ready(fields, key_schema(kind))})
        if record.value is None:
            return key_text, "<DELETE>"
        version, value_fields = decode_value_fields(kind, bytes(record.value))
        value_text = to_json({"version": str(version), "data": value_json(kind, version, value_fields)})
    except (ValueError, UnicodeDecodeError) as error:
        return f"Error at offset {record.offset}, skipping. {error}", None
    return key_text, value_text


def _consumer_protocol_json(raw: bytes | None, schema: Any) -> Any:
    """A member's subscription or assignment as its consumer protocol JSON; the raw bytes
    (base64) when they do not decode, as Kafka keeps them."""
    try:
        _version, fields = decode_consumer_protocol(raw or b"", schema)
    except ValueError:
        return json_ready({"raw": raw}, GROUP_METADATA_VALUE)["raw"]
    return json_ready(fields, schema)


def _offsets_value_json(kind: int, _version: int, fields: dict[str, Any]) -> Any:
    if kind != GROUP_METADATA_KEY_TYPE:
        return json_ready(fields, OFFSET_COMMIT_VALUE)
    data = json_ready(fields, GROUP_METADATA_VALUE)
    if fields.get("protocolType") == CONSUMER_PROTOCOL_TYPE:
        for member, raw in zip(data.get("members") or (), fields.get("members") or (), strict=True):
            member["subscription"] = _consumer_protocol_json(raw["subscription"], CONSUMER_PROTOCOL_SUBSCRIPTION)
            member["assignment"] = _consumer_protocol_json(raw["assignment"], CONSUMER_PROTOCOL_ASSIGNMENT)
    return data


def _offsets_parser(record: Record) -> tuple[str | None, str | None]:
    return _coordinator_record(
        record,
        decode_key,
        lambda kind: GROUP_METADATA_KEY if kind == GROUP_METADATA_KEY_TYPE else OFFSET_COMMIT_KEY,
        decode_value,
        _offsets_value_json,
    )


def _transaction_log_value_json(_kind: int, _version: int, fields: dict[str, Any]) -> Any:
    """A TransactionLogValue's JSON, its status named as Kafka 4 names it."""
    data = json_ready(fields, TRANSACTION_LOG_VALUE)
    data["transactionStatus"] = transaction_state_name(fields["transactionStatus"])
    return data


def _transaction_log_parser(record: Record) -> tuple[str | None, str | None]:
    return _coordinator_record(
        record,
        decode_transaction_log_key,
        lambda _kind: TRANSACTION_LOG_KEY,
        lambda _kind, value: decode_transaction_log_value(value),
        _transaction_log_value_json,
    )


def _cluster_metadata_parser(record: Record) -> tuple[str | None, str | None]:
    """No key; the value as its metadata record JSON, or Kafka's `Error at N, skipping. …`."""
    try:
        return None, describe_metadata_record(bytes(record.value or b""))
    except (ValueError, UnicodeDecodeError) as error:
        return None, f"Error at {record.offset}, skipping. {error}"


def message_parser(args: argparse.Namespace) -> MessageParser:
    if args.offsets_decoder:
        return _offsets_parser
    if args.transaction_log_decoder:
        return _transaction_log_parser
    if args.cluster_metadata_decoder:
        return _cluster_metadata_parser
    return default_parser


def record_line(
    path: Path,
    header: BatchHeader,
    record: Record,
    *,
    print_data: bool,
    skip_metadata: bool,
    parser: MessageParser,
    legacy_checksum: int | None = None,
) -> str:
    """One record as DumpLogSegments prints it: its metadata (unless skipped; for a v2 record its
    sequence and header keys, for a legacy one, whose CRC-32 is `legacy_checksum`, Kafka's
    `isValid: true crc: N}`), what a control record holds, and the key and payload when
    printing data (never for control records)."""
    line = ""
    if not skip_metadata:
        line = (
            f"{RECORD_INDENT} offset: {record.offset} {header.timestamp_type.display_name}: {record.timestamp} "
            f"keySize: {-1 if record.key is None else len(record.key)} "
            f"valueSize: {-1 if record.value is None else len(record.value)}"
        )
        if header.magic >= CURRENT_MAGIC:
            first = header.base_sequence
            sequence = first + (record.offset - header.base_offset) if first >= 0 else -1
            line += f" sequence: {sequence} headerKeys: [{','.join(key for key, _ in record.headers)}]"
        else:
            line += f" isValid: true crc: {legacy_checksum}"
        if header.is_control:
            try:
                line += describe_control_record(record.key, record.value)
            except ValueError as error:
                print(f"seglogfs: {path}: control record at offset {record.offset}: {error}", file=sys.stderr)
                raise DumpFailed from None
    if print_data and not header.is_control:
        try:
            key, payload = parser(record)
        except ValueError as error:
            print(f"seglogfs: {path}: {error}", file=sys.stderr)
            raise DumpFailed from None
        prefix = f"{RECORD_INDENT} " if skip_metadata else " "
        if key is not None:
            line += f"{prefix}key: {key}"
            prefix = " "
        if payload is not None:
            line += f"{prefix}payload: {payload}"
    return line


# Batches with fewer records are printed record by record (`plain_record_lines`).
_COLUMN_WISE_RECORDS = 8


def plain_record_lines(header: BatchHeader, batch: Any, print_data: bool) -> tuple[list[int], str] | None:
    """A plain v2 batch's record lines, as `record_line` prints them with the default parser,
    from its records' columns (`record_columns`, laid out in C) rather than a `Record` each:
    most of a dump of a big segment is these lines. None for what `record_line` must print
    (control and legacy batches, records with headers) and for a batch whose records the
    columns refuse (the record-wise path then reports it as it always has)."""
    if isinstance(header, LegacyBatchHeader) or header.magic < CURRENT_MAGIC or header.is_control:
        return None
    if header.records_count < _COLUMN_WISE_RECORDS:  # (laying out columns costs more than it saves)
        return None
    try:
        columns = record_columns(header, batch)
    except (ValueError, EngineError):  # damaged records or a codec's error: reported by the record-wise path
        return None
    if len(columns.header_counts) and int(columns.header_counts.max()) > 0:
        return None
    offsets = columns.offsets.tolist()
    first = header.base_sequence
    sequences = [first + (o - header.base_offset) for o in offsets] if first >= 0 else [-1] * len(offsets)
    kind = header.timestamp_type.display_name
    section = columns.section
    heads = [
        f"{RECORD_INDENT} offset: {o} {kind}: {t} keySize: {kl} valueSize: {vl} sequence: {q} headerKeys: []"
        for o, t, kl, vl, q in zip(
            offsets,
            columns.consumer_timestamps().tolist(),
            columns.key_lengths.tolist(),
            columns.value_lengths.tolist(),
            sequences,
            strict=True,
        )
    ]
    if print_data:
        keys = _texts(section, columns.key_starts, columns.key_lengths)
        values = _texts(section, columns.value_starts, columns.value_lengths)
        heads = [
            head + ("" if key is None else f" key: {key}") + ("" if value is None else f" payload: {value}")
            for head, key, value in zip(heads, keys, values, strict=True)
        ]
    return offsets, "".join(f"{line}\n" for line in heads)


def _texts(section: Any, starts: np.ndarray, lengths: np.ndarray) -> list[str | None]:
    """Keys or values as `default_parser` prints them (None for a null one)."""
    out: list[str | None] = []
    append = out.append
    for start, length in zip(starts.tolist(), lengths.tolist(), strict=True):
        if length < 0:
            append(None)
            continue
        piece = bytes(section[start : start + length])
        try:
            append(piece.decode("utf-8"))
        except UnicodeDecodeError:
            append(java_utf8(piece))
    return out
