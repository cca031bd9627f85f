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

Files are opened read-only and never changed. How a batch and its records print is
mount_tools.dump_records'.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from seglogfs.engine.errors import CorruptIndexError, UnsafeFileError
from seglogfs.engine.files import check_regular, is_regular, open_regular
from seglogfs.engine.log.index import entries_in_use, read_index_prefix
from seglogfs.engine.log.naming import INDEX_SUFFIX, LOG_SUFFIX, SNAPSHOT_SUFFIX, TIME_INDEX_SUFFIX, TXN_INDEX_SUFFIX
from seglogfs.engine.log.offset_index import OFFSET_INDEX_DTYPE, OffsetIndex
from seglogfs.engine.log.producer_snapshot import CorruptSnapshotError, read_producer_snapshot
from seglogfs.engine.log.segment import LogSegment
from seglogfs.engine.log.time_index import TIME_INDEX_DTYPE, TimeIndex
from seglogfs.engine.log.transaction_index import read_transaction_index
from seglogfs.engine.object_store import is_object_store_uri
from seglogfs.engine.record import legacy
from seglogfs.engine.record.records import (
    BatchHeader,
    LegacyBatchHeader,
    check_batch,
    decode_records,
    iter_batch_headers,
)
from seglogfs.mount_tools.common import stored_file
from seglogfs.mount_tools.dump_records import (
    DumpFailed,
    MessageParser,
    batch_line,
    default_parser,
    legacy_batch_line,
    legacy_checksums,
    message_parser,
    plain_record_lines,
    record_line,
)

KRAFT_SNAPSHOT_SUFFIX = ".checkpoint"  # Kafka's Snapshots.SUFFIX
BOOTSTRAP_SNAPSHOT_NAME = "bootstrap.checkpoint"
_KRAFT_SNAPSHOT_NAME = re.compile(r"(\d{20})-(\d{10})\.checkpoint")
MAX_BYTES_DEFAULT = 2**31 - 1  # Integer.MAX_VALUE: the whole file, and trailing bytes reported


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


def _local(name: str) -> Path:
    """The file a FILE argument names: a path, or a file of a backup in object storage by URI
    (fetched whole, and an index's `.log` with it: Kafka's index dumps read the log too)."""
    if not is_object_store_uri(name):
        return Path(name)
    path = stored_file(name)
    base, separator, query = name.partition("?")
    for suffix in (INDEX_SUFFIX, TIME_INDEX_SUFFIX):
        if base.endswith(suffix):
            with contextlib.suppress(FileNotFoundError):
                stored_file(base[: -len(suffix)] + LOG_SUFFIX + separator + query)
    return path


def cmd_dump(args: argparse.Namespace) -> int:
    files = list(args.files) + [f for f in (args.files_option or "").split(",") if f]
    if not files:
        print("seglogfs: dump needs at least one FILE", file=sys.stderr)
        return 2
    if args.max_bytes < 0:
        print(f"seglogfs: dump: --max-bytes {args.max_bytes} is negative", file=sys.stderr)
        return 2
    parser = message_parser(args)
    print_data = args.print_data_log or parser is not default_parser
    deep = args.deep_iteration or print_data
    out = sys.stdout
    failed = False
    for name in files:
        out.write(f"Dumping {name}\n")
        try:
            path = _local(name)
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
                write(legacy_batch_line(header, batch) + "\n")
            else:
                write(batch_line(header, reason is None) + "\n")
            if reason is not None:
                if isinstance(header, LegacyBatchHeader) and legacy.crc_problem(batch) is None:
                    print(f"seglogfs: {path}: message at position {header.position}: {reason}", file=sys.stderr)
                break
            valid_bytes = header.next_position
            if deep and parser is default_parser and not skip_metadata:
                lines = plain_record_lines(header, batch, print_data)
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
                        checksums = list(legacy_checksums(header, batch))
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
                    line = record_line(
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
