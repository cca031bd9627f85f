"""`seglogfs dump`: kafka-dump-log's output for `.log`, `.index` and `.timeindex` files.

Same flags and lines as Kafka's DumpLogSegments: a `Dumping <file>` line, then per batch
`baseOffset: … isvalid: …`, per record (`--deep-iteration`, implied by `--print-data-log`)
`| offset: … headerKeys: [...]` with ` key: … payload: …` when printing data; index entries as
`offset: X position: Y` and `timestamp: T offset: O`; mismatches and trailing garbage reported as
Kafka reports them. Files are opened read-only and never changed.
"""

from __future__ import annotations

import argparse
import os
import struct
import sys
from pathlib import Path

import numpy as np

from seglogfs.engine.errors import CorruptIndexError
from seglogfs.engine.index import OFFSET_INDEX_DTYPE, TIME_INDEX_DTYPE, OffsetIndex, TimeIndex, entries_in_use
from seglogfs.engine.naming import INDEX_SUFFIX, LOG_SUFFIX, TIME_INDEX_SUFFIX
from seglogfs.engine.records import BatchHeader, Record, check_batch, control_type, decode_records
from seglogfs.engine.segment import LogSegment


class DumpFailed(Exception):
    """A file could not be dumped to the end; the reason was printed."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("files", nargs="*", metavar="FILE", help=".log, .index or .timeindex files")
    parser.add_argument("--files", dest="files_option", metavar="F1,F2", help="comma-separated files (Kafka's form)")
    parser.add_argument("--print-data-log", action="store_true", help="print keys and values (implies deep iteration)")
    parser.add_argument("--deep-iteration", action="store_true", help="print every record, not only batches")
    parser.add_argument("--verify-index-only", action="store_true", help="check index entries, print only mismatches")
    parser.add_argument("--index-sanity-check", action="store_true", help="only run the index sanity check")


def cmd_dump(args: argparse.Namespace) -> int:
    files = list(args.files) + [f for f in (args.files_option or "").split(",") if f]
    if not files:
        print("seglogfs: dump needs at least one FILE", file=sys.stderr)
        return 2
    out = sys.stdout
    failed = False
    for name in files:
        path = Path(name)
        out.write(f"Dumping {name}\n")
        try:
            if path.name.endswith(LOG_SUFFIX):
                _dump_log(path, args.deep_iteration or args.print_data_log, args.print_data_log, out)
            elif path.name.endswith(INDEX_SUFFIX):
                failed |= not _dump_offset_index(path, name, args.verify_index_only, args.index_sanity_check, out)
            elif path.name.endswith(TIME_INDEX_SUFFIX):
                failed |= not _dump_time_index(path, name, args.verify_index_only, args.index_sanity_check, out)
            else:
                print(f"Ignoring unknown file {name}", file=sys.stderr)
        except FileNotFoundError:
            print(f"seglogfs: {name}: no such file", file=sys.stderr)
            failed = True
        except CorruptIndexError as error:
            print(f"seglogfs: {error}", file=sys.stderr)
            failed = True
        except DumpFailed:
            failed = True
    out.flush()
    return 1 if failed else 0


def _base_offset(path: Path) -> int:
    try:
        return int(path.name.split(".", 1)[0])
    except ValueError:
        raise CorruptIndexError(path, "file name does not start with a base offset") from None


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


def _record_line(header: BatchHeader, record: Record, print_data: bool) -> str:
    sequence = header.base_sequence + (record.offset - header.base_offset) if header.base_sequence >= 0 else -1
    line = (
        f"| offset: {record.offset} {record.timestamp_type.display_name}: {record.timestamp} "
        f"keySize: {-1 if record.key is None else len(record.key)} "
        f"valueSize: {-1 if record.value is None else len(record.value)}"
    )
    if header.is_control:
        kind = control_type(record)
        if kind is not None and record.value is not None and len(record.value) >= 6:
            _version, coordinator_epoch = struct.unpack_from(">hi", record.value)
            line += f" endTxnMarker: {kind.name} coordinatorEpoch: {coordinator_epoch}"
        elif record.key is not None and len(record.key) >= 4:
            code = struct.unpack_from(">h", record.key, 2)[0]
            line += f" controlType: UNKNOWN({code})"
        return line
    line += f" sequence: {sequence} headerKeys: [{','.join(key for key, _ in record.headers)}]"
    if print_data:
        if record.key is not None:
            line += f" key: {record.key.decode('utf-8', 'replace')}"
        if record.value is not None:
            line += f" payload: {record.value.decode('utf-8', 'replace')}"
    return line


def _dump_log(path: Path, deep: bool, print_data: bool, out: object) -> None:
    write = out.write  # type: ignore[attr-defined]
    segment = _segment(path)
    try:
        write(f"Log starting offset: {segment.base_offset}\n")
        valid_bytes = 0
        previous_offset: int | None = None
        gaps: list[tuple[int, int]] = []
        for header, batch in segment.iter_batches(0):
            reason = check_batch(header, batch)
            write(_batch_line(header, reason is None) + "\n")
            if reason is not None:
                break
            valid_bytes = header.next_position
            if deep:
                try:
                    records = decode_records(header, batch, include_control=True)
                except Exception as error:  # a codec or varint error inside a batch whose CRC held
                    print(
                        f"seglogfs: {path}: batch at position {header.position} has undecodable records: {error}",
                        file=sys.stderr,
                    )
                    raise DumpFailed from None
                for record in records:
                    if previous_offset is not None and record.offset != previous_offset + 1:
                        gaps.append((previous_offset, record.offset))
                    previous_offset = record.offset
                    write(_record_line(header, record, print_data) + "\n")
        invalid = segment.size - valid_bytes
        if invalid > 0:
            write(f"Found {invalid} invalid bytes at the end of {path.name}\n")
        if gaps:
            print(f"Non-consecutive offsets in {path.resolve()}", file=sys.stderr)
            for before, after in gaps:
                print(f"  {before} is followed by {after}", file=sys.stderr)
    finally:
        segment.close_handlers()


def _read_entries(path: Path, dtype: np.dtype) -> np.ndarray:
    raw = path.read_bytes()
    if len(raw) % dtype.itemsize:
        raise CorruptIndexError(
            path, f"found {len(raw)} bytes which is neither positive nor a multiple of {dtype.itemsize}"
        )
    return entries_in_use(np.frombuffer(raw, dtype=dtype))


def _dump_offset_index(path: Path, name: str, verify_only: bool, sanity_only: bool, out: object) -> bool:
    write = out.write  # type: ignore[attr-defined]
    base = _base_offset(path)
    if sanity_only:
        index = OffsetIndex(path, base, max(os.path.getsize(path), 8), writable=False)
        try:
            log_path = path.with_name(path.name[: -len(INDEX_SUFFIX)] + LOG_SUFFIX)
            index.sanity_check(log_path.stat().st_size if log_path.exists() else None)
        finally:
            index.close()
        write(f"{name} passed sanity check.\n")
        return True
    entries = _read_entries(path, OFFSET_INDEX_DTYPE)
    if len(entries) == 0:
        write(f"{name} is empty.\n")
        return True
    log_path = path.with_name(path.name[: -len(INDEX_SUFFIX)] + LOG_SUFFIX)
    log_fd = os.open(log_path, os.O_RDONLY | os.O_CLOEXEC) if log_path.exists() else None
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


def _dump_time_index(path: Path, name: str, verify_only: bool, sanity_only: bool, out: object) -> bool:
    write = out.write  # type: ignore[attr-defined]
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
    segment = _segment(log_path) if log_path.exists() else None
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
        print("The following indexed offsets are not found in the log.", file=sys.stderr)
        for offset, log_offset in not_found:
            print(f"Indexed offset: {offset}, found log offset: {log_offset}", file=sys.stderr)
    return True
