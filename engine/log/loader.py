"""Opening a partition dir: leftover files, segments, and recovery after an unclean stop
(Kafka's LogLoader).

In order:

1. Leftovers of interrupted work. `.deleted` files are removed. `.cleaned` files (cleaner output
   not yet trusted) are removed, and so is every `.swap` file at or above the lowest `.cleaned`
   base offset (that swap belongs to the same unfinished clean). Each remaining `.swap` log is a
   finished clean or split: the segments it replaces are removed and it is renamed into place;
   swapped index files are dropped, to be rebuilt, but the `.txnindex`, renamed with it (the
   aborted transactions the cleaner carried, which the log alone may no longer give).
2. Index files with no `.log` beside them are removed.
3. Segments are opened. A segment with a missing index file is recovered.
4. After an unclean stop (no `.kafka_cleanshutdown`), every segment from the one holding the
   recovery point on is recovered: batches checked, indexes rebuilt, the log cut at the first
   invalid batch — and every later segment removed, since what follows a torn write is not
   trusted. The live log is what Kafka's LogLoader leaves; what it cut or removed is moved
   beside the log dir first (engine.log.set_aside), and one WARNING line names it. After a clean
   stop nothing is read but the active segment's tail.
   The segments recovered here and in step 3 get their `.txnindex` rebuilt from the log
   (`rebuild_transaction_indexes`), as Kafka's LogSegment.recover rebuilds it.
5. No segment left: an empty one is created at the log start offset. A log end below the log
   start (a crash after delete-records) is replaced by an empty segment at the log start.

Read-only loads (a reader beside a writer, or a read-only copy) change nothing on disk: they skip
leftovers, never recover, and read only complete batches.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path

from seglogfs.engine.config import LogConfig
from seglogfs.engine.errors import CorruptIndexError, CorruptRecordError, UnsafeFileError, UnsupportedFormatError
from seglogfs.engine.files import describe_mode
from seglogfs.engine.log.checkpoint import fsync_dir
from seglogfs.engine.log.naming import (
    CLEANED_SUFFIX,
    DELETED_SUFFIX,
    INDEX_SUFFIX,
    INDEX_SUFFIXES,
    LOG_SUFFIX,
    SWAP_SUFFIX,
    TIME_INDEX_SUFFIX,
    TXN_INDEX_SUFFIX,
    parse_segment_file_name,
)
from seglogfs.engine.log.segment import LogSegment
from seglogfs.engine.log.set_aside import SetAside, SetAsideError, SetAsidePiece
from seglogfs.engine.log.transaction_index import AbortMarker, TransactionIndexBuilder, reconcile

log = logging.getLogger(__name__)


@dataclass
class LoadedLog:
    """What loading found: segments in order and the offsets derived from them."""

    segments: list[LogSegment]
    log_start_offset: int
    log_end_offset: int
    recovery_point: int
    recovered_bytes_truncated: int
    set_aside: list[SetAsidePiece]  # what recovery cut or removed, kept beside the log dir


def segment_for(
    directory: Path, base_offset: int, config: LogConfig, *, writable: bool, now_ms: int, file_suffix: str = ""
) -> LogSegment:
    return LogSegment(
        directory,
        base_offset,
        index_interval_bytes=config.index_interval_bytes,
        max_index_bytes=config.segment_index_bytes,
        writable=writable,
        created_ms=now_ms,
        file_suffix=file_suffix,
    )


def _remove_leftovers(directory: Path, names: list[str]) -> list[str]:
    swap_logs: list[tuple[int, str]] = []
    cleaned: list[tuple[int, str]] = []
    for name in names:
        parsed = parse_segment_file_name(name)
        if parsed is None:
            continue
        base, _kind, extra = parsed
        if extra == DELETED_SUFFIX:
            (directory / name).unlink(missing_ok=True)
        elif extra == CLEANED_SUFFIX:
            cleaned.append((base, name))
        elif extra == SWAP_SUFFIX:
            swap_logs.append((base, name))
    min_cleaned = min((base for base, _ in cleaned), default=None)
    for _base, name in cleaned:
        (directory / name).unlink(missing_ok=True)
    for base, name in swap_logs:
        if min_cleaned is not None and base >= min_cleaned:
            (directory / name).unlink(missing_ok=True)
    return sorted(os.listdir(directory))


def _complete_swaps(directory: Path, names: list[str], config: LogConfig, now_ms: int) -> list[str]:
    """Finish interrupted swaps: each `.log.swap` replaces the segments its offsets cover."""
    swaps = []
    transaction_indexes = []
    for name in names:
        parsed = parse_segment_file_name(name)
        if parsed is None or parsed[2] != SWAP_SUFFIX:
            continue
        base, kind, _ = parsed
        if kind == LOG_SUFFIX:
            swaps.append(base)
        elif kind == TXN_INDEX_SUFFIX:
            # The cleaner's carried entries, which the log alone may no longer give: kept, and
            # reconciled with the log when the swapped segment is recovered.
            transaction_indexes.append(base)
        else:
            (directory / name).unlink(missing_ok=True)  # indexes are rebuilt from the log
    if not swaps and not transaction_indexes:
        return names
    live_logs = sorted(
        parsed[0] for name in names if (parsed := parse_segment_file_name(name)) and parsed[1:] == (LOG_SUFFIX, "")
    )
    for base in sorted(swaps):
        swap = segment_for(directory, base, config, writable=True, now_ms=now_ms, file_suffix=SWAP_SUFFIX)
        end_offset = swap.read_next_offset(trust_index=False)
        swap.close_handlers()
        for old_base in live_logs:
            if base <= old_base < max(end_offset, base + 1):
                for suffix in (LOG_SUFFIX, *INDEX_SUFFIXES):
                    (directory / f"{old_base:020d}{suffix}").unlink(missing_ok=True)
        for suffix in INDEX_SUFFIXES:
            (directory / f"{base:020d}{suffix}").unlink(missing_ok=True)
        fsync_dir(directory)  # the replaced segments are gone for good before the swap takes their place
        if base in transaction_indexes:
            transaction_indexes.remove(base)
            os.replace(
                directory / f"{base:020d}{TXN_INDEX_SUFFIX}{SWAP_SUFFIX}", directory / f"{base:020d}{TXN_INDEX_SUFFIX}"
            )
        os.replace(directory / f"{base:020d}{LOG_SUFFIX}{SWAP_SUFFIX}", directory / f"{base:020d}{LOG_SUFFIX}")
    for base in transaction_indexes:
        # Its log was renamed live (the swap's last renames did not all happen): it goes live
        # too, or, with no log, away.
        swapped = directory / f"{base:020d}{TXN_INDEX_SUFFIX}{SWAP_SUFFIX}"
        if os.path.lexists(directory / f"{base:020d}{LOG_SUFFIX}"):
            os.replace(swapped, directory / f"{base:020d}{TXN_INDEX_SUFFIX}")
        else:
            swapped.unlink(missing_ok=True)
    return sorted(os.listdir(directory))


def _refuse_unsafe(directory: Path) -> list[str]:
    """The partition dir's names, sorted; UnsafeFileError for the first segment file (by name)
    that is not a regular file (lstat: a link is not followed). Recovery, which cuts and rewrites
    these files, and the indexes' opens, which size them, must never meet one."""
    with os.scandir(directory) as listing:
        entries = sorted(listing, key=lambda entry: entry.name)
    for entry in entries:
        if parse_segment_file_name(entry.name) is not None and not entry.is_file(follow_symlinks=False):
            raise UnsafeFileError(entry.path, describe_mode(entry.stat(follow_symlinks=False).st_mode))
    return [entry.name for entry in entries]


def load_partition(
    directory: Path,
    config: LogConfig,
    *,
    writable: bool,
    clean_shutdown: bool,
    recovery_point: int,
    log_start_offset: int,
    now_ms: int,
) -> LoadedLog:
    """Open the segments of one partition dir; see the module docstring for the steps.
    UnsafeFileError, before anything is opened or changed, when a link, a FIFO, a socket, a
    device or a directory stands where a segment's file belongs (`.log`, an index, a snapshot,
    leftovers included): the partition is then offline (engine.datadir), its files untouched."""
    names = _refuse_unsafe(directory)
    if writable:
        listed = names
        names = _remove_leftovers(directory, names)
        names = _complete_swaps(directory, names, config, now_ms)
        if names != listed:
            fsync_dir(directory)  # what was removed or renamed stays so after a power cut
    # One parse of the listing: which bases have a log, and which index files exist.
    files: dict[int, set[str]] = {}
    for name in names:
        parsed = parse_segment_file_name(name)
        if parsed is not None and not parsed[2]:
            files.setdefault(parsed[0], set()).add(parsed[1])
    segments: list[LogSegment] = []
    recovered: list[LogSegment] = []  # what recovery re-read: their `.txnindex` is rebuilt
    truncated = 0
    set_aside = SetAside(directory, now_ms)
    bases = [base for base, kinds in sorted(files.items()) if LOG_SUFFIX in kinds]
    next_bases: dict[int, int | None] = dict(zip(bases, [*bases[1:], None], strict=False))
    for base, kinds in sorted(files.items()):
        if LOG_SUFFIX not in kinds:
            if writable:  # index files whose log is gone
                for kind in kinds & set(INDEX_SUFFIXES):
                    (directory / f"{base:020d}{kind}").unlink(missing_ok=True)
            continue
        segment = segment_for(directory, base, config, writable=writable, now_ms=now_ms)
        segment.next_base_offset = next_bases[base]
        if writable:
            segment.keep_cut = set_aside.keep_later
        if writable and not {INDEX_SUFFIX, TIME_INDEX_SUFFIX} <= kinds:
            log.info("%s: index files missing, rebuilding them from the log", segment.log_path)
            try:
                cut = segment.recover(keep=set_aside.keep_tail)
            except UnsupportedFormatError:
                # Data this engine cannot read: leave the dir exactly as it was found.
                segment.close_handlers()
                for kind in set(INDEX_SUFFIXES) - kinds:
                    (directory / f"{base:020d}{kind}").unlink(missing_ok=True)
                raise
            if cut:
                # Kafka warns here too (LogSegment.recover: "Found invalid messages"): what
                # followed the last valid batch is gone.
                log.warning(
                    "%s: cut %d bytes after the last valid batch at position %d (rebuilding its indexes); "
                    "set aside in %s",
                    segment.log_path,
                    cut,
                    segment.size,
                    set_aside.pieces[-1].place,
                )
                truncated += cut
            segment.release_handles()
            recovered.append(segment)
        segments.append(segment)

    if writable and not clean_shutdown and segments:
        try:
            truncated += _recover_from(segments, recovery_point, recovered, set_aside)
        except SetAsideError:
            for segment in segments:  # the partition stays as it was, offline or not opened
                segment.close_handlers()
            raise
    if recovered:
        rebuild_transaction_indexes(segments, [segment for segment in recovered if segment in segments])
    start = max(log_start_offset, segments[0].base_offset) if segments else log_start_offset
    made_segment = not segments and writable
    if made_segment:
        segments.append(segment_for(directory, start, config, writable=True, now_ms=now_ms))
    if segments and not writable:
        segments[-1].refresh_size()  # another process may be writing it: complete batches only
        end = segments[-1].followed_next_offset
    else:
        end = segments[-1].read_next_offset() if segments else start
    if writable and end < start:
        # Everything on disk lies below the log start (Kafka's testLogEndLessThanStartAfterReopen).
        for segment in segments:
            segment.delete_files()
        segments = [segment_for(directory, start, config, writable=True, now_ms=now_ms)]
        end = start
        made_segment = True
    if made_segment:
        # Records flushed into it survive a power cut only with its name (and the removed
        # segments stay removed): a flush fsyncs the segment's files, never its directory.
        fsync_dir(directory)
    if writable:
        segments[-1].make_active()
    return LoadedLog(
        segments, start, end, min(recovery_point, end) if not clean_shutdown else end, truncated, set_aside.pieces
    )


def _recover_from(
    segments: list[LogSegment], recovery_point: int, recovered: list[LogSegment], set_aside: SetAside
) -> int:
    """Recover each segment that may hold offsets ≥ the recovery point (added to `recovered`);
    after the first one that had to be cut, remove the rest. What is cut or removed is set
    aside first (a SetAsideError stops here, the rest of the log as it was). Returns the bytes
    cut."""
    first = 0
    for slot, segment in enumerate(segments):
        if segment.base_offset <= recovery_point:
            first = slot
    truncated_total = 0
    slot = first
    while slot < len(segments):
        later = segments[slot + 1 :]

        def keep(
            path: Path, handle: int, position: int, size: int, next_offset: int, *, later: list[LogSegment] = later
        ) -> None:
            # Kafka deletes the segments after a cut (LogLoader); they are set aside before the
            # cut, after the tail (the one copy that needs room), the last first: whatever
            # fails, the log left is the damaged segment and the segments that follow it
            # without a gap, and the next open takes up the work.
            set_aside.keep_tail(path, handle, position, size, next_offset)
            for segment in reversed(later):
                set_aside.keep_segment(segment)

        truncated = segments[slot].recover(keep=keep)
        recovered.append(segments[slot])
        if slot < len(segments) - 1:
            segments[slot].release_handles()  # thousands of segments may be recovered in one open
        truncated_total += truncated
        if truncated > 0:
            # Kafka warns here too: bytes after the last valid batch were cut (a torn write).
            tail = set_aside.pieces[-1 - len(later)]
            removed = set_aside.pieces[len(set_aside.pieces) - len(later) :]
            truncated_total += sum(piece.bytes for piece in removed)
            del segments[slot + 1 :]
            log.warning(
                "%s: cut %d bytes after the last valid batch at position %d (unclean stop)%s; set aside in %s",
                segments[slot].log_path,
                truncated,
                segments[slot].size,
                f" and the {len(removed)} segments after it ({sum(piece.records for piece in removed)} records)"
                if removed
                else "",
                tail.place,
            )
            break
        slot += 1
    return truncated_total


def rebuild_transaction_indexes(segments: list[LogSegment], recovered: list[LogSegment]) -> None:
    """Give each recovered segment the `.txnindex` the log gives (Kafka's LogSegment.recover
    rebuilds it from the producer state), keeping the entries of the file that only it still
    knows (engine.log.transaction_index.reconcile). Nothing is read unless a recovered segment
    holds a transactional batch or has a `.txnindex`; then the log is read from its first
    segment up to the last such one (the open transactions before it: Kafka loads them from
    its producer snapshots)."""
    wanted = [s for s in recovered if s.holds_transactions or os.path.lexists(s.transaction_index_path)]
    if not wanted:
        return
    builder = TransactionIndexBuilder()
    last = max(segments.index(segment) for segment in wanted)
    for segment in segments[: last + 1]:
        markers: list[AbortMarker] = []
        try:
            # Headers, and the transactional batches whole and checked. Every segment here is
            # whole batches (sealed, or recovered: cut at its first invalid batch).
            for header in segment.iter_headers(0, to_end=True):
                if header.is_transactional:
                    marker = builder.add(header, segment.checked_batch(header))
                    if marker is not None:
                        markers.append(marker)
        except (CorruptRecordError, UnsupportedFormatError) as error:
            # Damage in a sealed segment: the transactions open across it are unknown. The log
            # after it is read as a log whose head retention removed (the files keep the
            # entries it cannot contradict), and the segment's own file is left as it is.
            log.warning(
                "%s; the transaction indexes after it are rebuilt from the log that follows the damage alone",
                error,
            )
            builder = TransactionIndexBuilder()
            segment.release_handles()
            continue
        if segment not in wanted:
            segment.release_handles()  # thousands of segments may be read
            continue
        try:
            written = segment.transaction_index.entries(max_entries=len(markers))
        except CorruptIndexError as error:
            log.info("%s; rebuilding it from the log", error)
            written = []
        entries, problems = reconcile(written, markers)
        if problems or entries != written:
            log.info(
                "%s: rebuilt from the log (%s)", segment.transaction_index_path, "; ".join(problems) or "reordered"
            )
            segment.transaction_index.write(entries)
        segment.release_handles()
