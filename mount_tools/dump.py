"""`seglogfs dump`: kafka-dump-log's output for `.log`, `.index`, `.timeindex`, `.snapshot`,
`.txnindex` and KRaft snapshot (`.checkpoint`) files.

Same flags and lines as Kafka's DumpLogSegments (as of Kafka 4.0): a `Dumping <file>` line, then

* `.log` (and `.checkpoint`, headed `Snapshot end offset: N, epoch: E`): per batch `baseOffset: …
  isvalid: …`; per record (`--deep-iteration`, implied by `--print-data-log` and the decoders)
  `| offset: … sequence: … headerKeys: [...]`, then for a control record what it holds
  (` endTxnMarker: COMMIT coordinatorEpoch: N`, ` LeaderChange: {json}`, ` SnapshotHeader {json}`,
  …), and when printing data ` key: … payload: …`. The decoders print keys and values as Kafka's
  do: `--offsets-decoder` `{"type":"1","data":{…}}` / `{"version":"3","data":{…}}` (`<DELETE>`
  for a tombstone), `--transaction-log-decoder` the same for `__transaction_state`,
  `--cluster-metadata-decoder` `{"type":"TOPIC_RECORD","version":0,"data":{…}}` (every KRaft
  metadata record type); a record a decoder cannot read prints Kafka's `Error at offset N,
  skipping. …` or `Unknown record type N at offset O, skipping.` in its place.
  `--skip-record-metadata` leaves out the record metadata (lines start `| key: …`), `--max-bytes N`
  reads only the batches within the first N bytes.
  A legacy message (magic 0 or 1) is a batch of its own, printed as Kafka prints one: `offset:
  <its offset> position: … NoTimestampType|CreateTime|LogAppendTime: … size: … magic: …
  compresscodec: … crc: … isvalid: …`; its records (a compressed wrapper's inner messages) as
  `| offset: … keySize: … valueSize: … isValid: true crc: N` (Kafka 4's line: Kafka 3 ended it
  with a stray `}`), then key and payload as for any record.
* `.index` / `.timeindex`: `offset: X position: Y` / `timestamp: T offset: O`; mismatches on stderr.
* `.snapshot` (producer state): per producer `producerId: … producerEpoch: … coordinatorEpoch: …
  currentTxnFirstOffset: OptionalLong… lastTimestamp: … firstSequence: … lastSequence: …
  lastOffset: … offsetDelta: … timestamp: …`; a corrupt snapshot is one stderr line.
* `.txnindex`: per aborted transaction `version: … producerId: … firstOffset: … lastOffset: …
  lastStableOffset: …`.

Files are opened read-only and never changed.
"""

from __future__ import annotations

import argparse
import codecs
import os
import re
import struct
import sys
import zlib
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from seglogfs.engine.errors import CorruptIndexError, EngineError, UnsafeFileError
from seglogfs.engine.files import check_regular, is_regular, open_regular
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
from seglogfs.engine.log.index import entries_in_use, read_index_prefix
from seglogfs.engine.log.naming import INDEX_SUFFIX, LOG_SUFFIX, SNAPSHOT_SUFFIX, TIME_INDEX_SUFFIX, TXN_INDEX_SUFFIX
from seglogfs.engine.log.offset_index import OFFSET_INDEX_DTYPE, OffsetIndex
from seglogfs.engine.log.producer_snapshot import CorruptSnapshotError, read_producer_snapshot
from seglogfs.engine.log.segment import LogSegment
from seglogfs.engine.log.time_index import TIME_INDEX_DTYPE, TimeIndex
from seglogfs.engine.log.transaction_index import read_transaction_index
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
    check_batch,
    decode_records,
    iter_batch_headers,
)

KRAFT_SNAPSHOT_SUFFIX = ".checkpoint"  # Kafka's Snapshots.SUFFIX
BOOTSTRAP_SNAPSHOT_NAME = "bootstrap.checkpoint"
_KRAFT_SNAPSHOT_NAME = re.compile(r"(\d{20})-(\d{10})\.checkpoint")
MAX_BYTES_DEFAULT = 2**31 - 1  # Integer.MAX_VALUE: the whole file, and trailing bytes reported
RECORD_INDENT = "|"

# (key text or None, payload text or None) of a record, as a kafka-dump-log MessageParser gives it.
MessageParser = Callable[[Record], tuple[str | None, str | None]]


class DumpFailed(Exception):
    """A file could not be dumped to the end; the reason was printed."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "files", nargs="*", metavar="FILE", help=".log, .index, .timeindex, .snapshot, .txnindex or .checkpoint files"
    )
    parser.add_argument("--files", dest="files_option", metavar="F1,F2", help="comma-separated files (Kafka's form)")
    parser.add_argument("--print-data-log", action="store_true", help="print keys and values (implies deep iteration)")
    parser.add_argument("--deep-iteration", action="store_true", help="print every record, not only batches")
    parser.add_argument("--verify-index-only", action="store_true", help="check index entries, print only mismatches")
    parser.add_argument("--index-sanity-check", action="store_true", help="only run the index sanity check")
    decoders = parser.add_mutually_exclusive_group()
    decoders.add_argument(
        "--offsets-decoder", action="store_true", help="decode records as __consumer_offsets data (implies printing)"
    )
    decoders.add_argument(
        "--transaction-log-decoder",
        action="store_true",
        help="decode records as __transaction_state data (implies printing)",
    )
    decoders.add_argument(
        "--cluster-metadata-decoder",
        action="store_true",
        help="decode records as KRaft cluster metadata records (implies printing)",
    )
    parser.add_argument(
        "--max-bytes",
        type=int,
        default=MAX_BYTES_DEFAULT,
        metavar="N",
        help="read only the batches within the first N bytes of a .log file",
    )
    parser.add_argument(
        "--skip-record-metadata", action="store_true", help="print records without their metadata (nor control records)"
    )


def cmd_dump(args: argparse.Namespace) -> int:
    files = list(args.files) + [f for f in (args.files_option or "").split(",") if f]
    if not files:
        print("seglogfs: dump needs at least one FILE", file=sys.stderr)
        return 2
    if args.max_bytes < 0:
        print(f"seglogfs: dump: --max-bytes {args.max_bytes} is negative", file=sys.stderr)
        return 2
    parser = _message_parser(args)
    print_data = args.print_data_log or parser is not _default_parser
    deep = args.deep_iteration or print_data
    out = sys.stdout
    failed = False
    for name in files:
        path = Path(name)
        out.write(f"Dumping {name}\n")
        try:
            # (lstat: a link is refused, never followed; a FIFO never opened, so never waited on)
            check_regular(path, os.lstat(path).st_mode)
        except FileNotFoundError:
            print(f"seglogfs: {name}: no such file", file=sys.stderr)
            failed = True
            continue
        except UnsafeFileError as error:
            print(f"seglogfs: {error}", file=sys.stderr)
            failed = True
            continue
        try:
            if path.name.endswith(LOG_SUFFIX) or path.name.endswith(KRAFT_SNAPSHOT_SUFFIX):
                _dump_log(
                    path,
                    deep=deep,
                    print_data=print_data,
                    skip_metadata=args.skip_record_metadata,
                    max_bytes=args.max_bytes,
                    parser=parser,
                    out=out,
                )
            elif path.name.endswith(INDEX_SUFFIX):
                failed |= not _dump_offset_index(path, name, args.verify_index_only, args.index_sanity_check, out)
            elif path.name.endswith(TIME_INDEX_SUFFIX):
                failed |= not _dump_time_index(path, name, args.verify_index_only, args.index_sanity_check, out)
            elif path.name.endswith(SNAPSHOT_SUFFIX):
                failed |= not _dump_producer_snapshot(path, out)
            elif path.name.endswith(TXN_INDEX_SUFFIX):
                _dump_transaction_index(path, out)
            else:
                print(f"Ignoring unknown file {name}", file=sys.stderr)
        except FileNotFoundError:
            print(f"seglogfs: {name}: no such file", file=sys.stderr)
            failed = True
        except (CorruptIndexError, NotSegmentFileName, UnsafeFileError) as error:
            print(f"seglogfs: {error}", file=sys.stderr)
            failed = True
        except DumpFailed:
            failed = True
    out.flush()
    return 1 if failed else 0


class NotSegmentFileName(ValueError):
    """A file to dump whose name does not start with a base offset (Kafka's tools read the
    segment's base offset from its name)."""


def _base_offset(path: Path) -> int:
    try:
        return int(path.name.split(".", 1)[0])
    except ValueError:
        raise NotSegmentFileName(
            f"{path}: not a segment file name (a base offset, then .log, .index, .timeindex, .snapshot or .txnindex)"
        ) from None


def _segment(path: Path) -> LogSegment:
    return LogSegment(
        path.parent,
        _base_offset(path),
        index_interval_bytes=4096,
        max_index_bytes=10 * 1024 * 1024,
        writable=False,
        created_ms=0,
    )


def _bool(value: bool) -> str:
    return "true" if value else "false"


def _batch_line(header: BatchHeader, valid: bool) -> str:
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


def _legacy_batch_line(header: LegacyBatchHeader, batch: bytes | memoryview) -> str:
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


def _legacy_checksums(header: LegacyBatchHeader, batch: bytes | memoryview) -> list[int]:
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
def _default_parser(record: Record) -> tuple[str | None, str | None]:
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


def _message_parser(args: argparse.Namespace) -> MessageParser:
    if args.offsets_decoder:
        return _offsets_parser
    if args.transaction_log_decoder:
        return _transaction_log_parser
    if args.cluster_metadata_decoder:
        return _cluster_metadata_parser
    return _default_parser


def _record_line(
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


# Batches with fewer records are printed record by record (`_plain_record_lines`).
_COLUMN_WISE_RECORDS = 8


def _plain_record_lines(header: BatchHeader, batch: Any, print_data: bool) -> tuple[list[int], str] | None:
    """A plain v2 batch's record lines, as `_record_line` prints them with the default parser,
    from its records' columns (`record_columns`, laid out in C) rather than a `Record` each:
    most of a dump of a big segment is these lines. None for what `_record_line` must print
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
    """Keys or values as `_default_parser` prints them (None for a null one)."""
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


def _file_batches(path: Path, max_bytes: int) -> tuple[Iterator[tuple[BatchHeader, bytes]], int]:
    """The whole batches of a file that is not a segment (a KRaft snapshot) within `max_bytes`,
    and how many bytes were read."""
    with os.fdopen(open_regular(path), "rb") as handle:
        data = handle.read(max_bytes)

    def batches() -> Iterator[tuple[BatchHeader, bytes]]:
        for header in iter_batch_headers(data):
            yield header, data[header.position : header.next_position]

    return batches(), len(data)


def _dump_log(
    path: Path,
    *,
    deep: bool,
    print_data: bool,
    skip_metadata: bool,
    max_bytes: int,
    parser: MessageParser,
    out: Any,
) -> None:
    write = out.write
    segment = None
    if path.name.endswith(LOG_SUFFIX):
        segment = _segment(path)
        write(f"Log starting offset: {segment.base_offset}\n")
        size = min(segment.size, max_bytes)
        batches: Iterable[tuple[BatchHeader, Any]] = segment.iter_batches(0, size)
    else:
        if path.name == BOOTSTRAP_SNAPSHOT_NAME:
            write("KRaft bootstrap snapshot\n")
        else:
            match = _KRAFT_SNAPSHOT_NAME.fullmatch(path.name)
            if match is None:
                print(f"seglogfs: {path}: not a KRaft snapshot name (<offset>-<epoch>.checkpoint)", file=sys.stderr)
                raise DumpFailed
            write(f"Snapshot end offset: {int(match.group(1))}, epoch: {int(match.group(2))}\n")
        batches, size = _file_batches(path, max_bytes)
    try:
        valid_bytes = 0
        previous_offset: int | None = None
        gaps: list[tuple[int, int]] = []
        for header, batch in batches:
            reason = check_batch(header, batch)
            if isinstance(header, LegacyBatchHeader):
                write(_legacy_batch_line(header, batch) + "\n")
            else:
                write(_batch_line(header, reason is None) + "\n")
            if reason is not None:
                if isinstance(header, LegacyBatchHeader) and legacy.crc_problem(batch) is None:
                    print(f"seglogfs: {path}: message at position {header.position}: {reason}", file=sys.stderr)
                break
            valid_bytes = header.next_position
            if deep and parser is _default_parser and not skip_metadata:
                lines = _plain_record_lines(header, batch, print_data)
                if lines is not None:
                    offsets, text = lines
                    if len(offsets):
                        if previous_offset is not None and offsets[0] != previous_offset + 1:
                            gaps.append((previous_offset, offsets[0]))
                        steps = np.flatnonzero(np.diff(offsets) != 1).tolist()
                        gaps.extend((offsets[i], offsets[i + 1]) for i in steps)
                        previous_offset = offsets[-1]
                    write(text)
                    continue
            if deep:
                checksums: list[int | None]
                try:
                    records = decode_records(header, batch, include_control=True)
                    if isinstance(header, LegacyBatchHeader):
                        checksums = list(_legacy_checksums(header, batch))
                    else:
                        checksums = [None] * len(records)
                except Exception as error:  # a codec or varint error inside a batch whose CRC held
                    print(
                        f"seglogfs: {path}: batch at position {header.position} has undecodable records: {error}",
                        file=sys.stderr,
                    )
                    raise DumpFailed from None
                for record, checksum in zip(records, checksums, strict=True):
                    if previous_offset is not None and record.offset != previous_offset + 1:
                        gaps.append((previous_offset, record.offset))
                    previous_offset = record.offset
                    line = _record_line(
                        path,
                        header,
                        record,
                        print_data=print_data,
                        skip_metadata=skip_metadata,
                        parser=parser,
                        legacy_checksum=checksum,
                    )
                    write(line + "\n")
        invalid = size - valid_bytes
        if invalid > 0 and max_bytes == MAX_BYTES_DEFAULT:
            write(f"Found {invalid} invalid bytes at the end of {path.name}\n")
        if gaps:
            print(f"Non-consecutive offsets in {path.resolve()}", file=sys.stderr)
            for before, after in gaps:
                print(f"  {before} is followed by {after}", file=sys.stderr)
    finally:
        if segment is not None:
            segment.close_handlers()


def _dump_producer_snapshot(path: Path, out: Any) -> bool:
    """Kafka's dumpProducerIdSnapshot: a line per producer (its last batch's metadata where the
    snapshot holds one); a corrupt snapshot is one stderr line (and exit 1 here, where Kafka goes
    on with status 0)."""
    try:
        entries = read_producer_snapshot(path)
    except CorruptSnapshotError as error:
        print(error, file=sys.stderr)
        return False
    for entry in entries:
        first = (
            "OptionalLong.empty"
            if entry.current_txn_first_offset < 0
            else f"OptionalLong[{entry.current_txn_first_offset}]"
        )
        line = (
            f"producerId: {entry.producer_id} producerEpoch: {entry.producer_epoch} "
            f"coordinatorEpoch: {entry.coordinator_epoch} currentTxnFirstOffset: {first} "
            f"lastTimestamp: {entry.timestamp}"
        )
        if entry.last_offset >= 0:  # (a producer whose last batch the snapshot remembers)
            line += (
                f" firstSequence: {entry.first_sequence} lastSequence: {entry.last_sequence} "
                f"lastOffset: {entry.last_offset} offsetDelta: {entry.offset_delta} timestamp: {entry.timestamp}"
            )
        out.write(line + "\n")
    return True


def _dump_transaction_index(path: Path, out: Any) -> None:
    """Kafka's dumpTxnIndex: a line per aborted transaction."""
    for txn in read_transaction_index(path):
        out.write(
            f"version: {txn.version} producerId: {txn.producer_id} firstOffset: {txn.first_offset} "
            f"lastOffset: {txn.last_offset} lastStableOffset: {txn.last_stable_offset}\n"
        )


def _read_entries(path: Path, dtype: np.dtype) -> np.ndarray:
    """The entries kafka-dump-log goes over, read up to the zero tail (a hole reads as one):
    never the whole length of a file that may be a sparse terabyte. Kafka takes an existing
    index as full to its end and stops at the first entry after the first whose relative offset
    is 0: of a preallocated index with no entry yet (a live broker's active segment) it prints,
    and checks, the first slot's zeros."""
    fd = open_regular(path)
    try:
        length = os.fstat(fd).st_size
        if length % dtype.itemsize:
            raise CorruptIndexError(
                path, f"found {length} bytes which is neither positive nor a multiple of {dtype.itemsize}"
            )
        entries = read_index_prefix(fd, dtype, length)
        in_use = entries_in_use(entries)
        return in_use if len(in_use) else entries[:1]
    finally:
        os.close(fd)


def _dump_offset_index(path: Path, name: str, verify_only: bool, sanity_only: bool, out: Any) -> bool:
    write = out.write
    base = _base_offset(path)
    if sanity_only:
        # (Kafka reads an existing index as full to its end: it has no entry only when it is
        # shorter than one, and then says so rather than checking it.)
        if os.path.getsize(path) < OFFSET_INDEX_DTYPE.itemsize:
            write(f"{name} is empty.\n")
            return True
        index = OffsetIndex(path, base, max(os.path.getsize(path), 8), writable=False)
        try:
            log_path = path.with_name(path.name[: -len(INDEX_SUFFIX)] + LOG_SUFFIX)
            index.sanity_check(os.lstat(log_path).st_size if is_regular(log_path) else None)
        finally:
            index.close()
        write(f"{name} passed sanity check.\n")
        return True
    entries = _read_entries(path, OFFSET_INDEX_DTYPE)
    if len(entries) == 0:  # (shorter than one entry)
        write(f"{name} is empty.\n")
        return True
    log_path = path.with_name(path.name[: -len(INDEX_SUFFIX)] + LOG_SUFFIX)
    log_fd = open_regular(log_path) if os.path.lexists(log_path) else None  # (a link there: UnsafeFileError)
    mismatches = []
    try:
        for relative, position in entries.tolist():
            offset = base + relative
            if log_fd is not None:
                raw = os.pread(log_fd, 61, position)
                log_offset = BatchHeader.parse(raw, 0, position).last_offset if len(raw) == 61 else -1
                if log_offset != offset:
                    mismatches.append((offset, log_offset))
            if not verify_only:
                write(f"offset: {offset} position: {position}\n")
    finally:
        if log_fd is not None:
            os.close(log_fd)
    if mismatches:
        print(f"Mismatches in :{path.resolve()}", file=sys.stderr)
        for offset, log_offset in reversed(mismatches):
            print(f"  Index offset: {offset}, log offset: {log_offset}", file=sys.stderr)
    return True  # like kafka-dump-log: mismatches are reported, the exit status stays 0


def _dump_time_index(path: Path, name: str, verify_only: bool, sanity_only: bool, out: Any) -> bool:
    write = out.write
    base = _base_offset(path)
    if sanity_only:
        index = TimeIndex(path, base, max(os.path.getsize(path), 12), writable=False)
        try:
            index.sanity_check()
        finally:
            index.close()
        write(f"{name} passed sanity check.\n")
        return True
    entries = _read_entries(path, TIME_INDEX_DTYPE)
    log_path = path.with_name(path.name[: -len(TIME_INDEX_SUFFIX)] + LOG_SUFFIX)
    segment = _segment(log_path) if os.path.lexists(log_path) else None  # (a link there: UnsafeFileError)
    mismatches, out_of_order, not_found = [], [], []
    previous = None
    try:
        for timestamp, relative in entries.tolist():
            offset = base + relative
            if segment is not None:
                found = segment.translate_offset(offset)
                if found is None or found.last_offset != offset:
                    not_found.append((offset, -1 if found is None else found.last_offset))
                elif found.max_timestamp != timestamp:
                    mismatches.append((timestamp, found.max_timestamp))
            if previous is not None and timestamp <= previous:
                out_of_order.append((timestamp, previous))
            previous = timestamp
            if not verify_only:
                write(f"timestamp: {timestamp} offset: {offset}\n")
    finally:
        if segment is not None:
            segment.close_handlers()
    if mismatches:
        print(f"Found timestamp mismatch in :{path.resolve()}", file=sys.stderr)
        for index_ts, log_ts in mismatches:
            print(f"  Index timestamp: {index_ts}, log timestamp: {log_ts}", file=sys.stderr)
    if out_of_order:
        print(f"Found out of order timestamp in :{path.resolve()}", file=sys.stderr)
        for index_ts, prev_ts in out_of_order:
            print(f"  Index timestamp: {index_ts}, Previously indexed timestamp: {prev_ts}", file=sys.stderr)
    if not_found:
        # (Kafka 4's heading names the file; Kafka 3's said "… not found in the log.")
        print(f"The following indexed offsets are not found in :{path.resolve()}", file=sys.stderr)
        for offset, log_offset in not_found:
            print(f"Indexed offset: {offset}, found log offset: {log_offset}", file=sys.stderr)
    return True
