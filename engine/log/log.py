"""One partition's log: segments, offsets, appends, reads, rolls, flushes (Kafka's UnifiedLog
and LocalLog, for a single replica).

Offsets: the log start offset (first offset readable), the log end offset (next offset to be
written), the high watermark (with one replica, the log end offset once an append returns) and
the recovery point (every offset below it is flushed to disk).

Transactions: an ABORT marker appended for a producer with an open transaction adds the
transaction's entry to its segment's `.txnindex` (engine.log.transaction_index). The producers' open
transactions are read from the log at the first transactional append of the process and then
followed append by append; a log without transactions pays one attribute test per batch.

Thread safety: appends, rolls, flushes and truncation take the partition's lock. Readers take no
lock: they work on a snapshot of the segment map and read each segment up to the size it had
when they looked, so they only ever see whole batches.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import mmap
import os
import random
import threading
import traceback
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from seglogfs.engine.config import METADATA_TOPIC, LogConfig
from seglogfs.engine.errors import (
    CorruptRecordError,
    InvalidRecordError,
    LogOfflineError,
    OffsetOutOfRangeError,
    ReadOnlyError,
    RecordTooLargeError,
    UnsafeFileError,
)
from seglogfs.engine.files import open_regular
from seglogfs.engine.log.checkpoint import (
    LEADER_EPOCH_CHECKPOINT,
    PARTITION_METADATA,
    fsync_dir,
    write_leader_epochs,
    write_partition_metadata,
)
from seglogfs.engine.log.follower import FollowedDirectory
from seglogfs.engine.log.index import INT32_MAX
from seglogfs.engine.log.leader_epochs import DEFAULT_LEADER_EPOCH, LeaderEpochCache
from seglogfs.engine.log.loader import load_partition, segment_for
from seglogfs.engine.log.naming import CLEANED_SUFFIX, SWAP_SUFFIX
from seglogfs.engine.log.retention import RetentionDecision, segments_below_log_start, segments_to_delete
from seglogfs.engine.log.segment import LogSegment, TimestampAndOffset
from seglogfs.engine.log.segments import LogSegments
from seglogfs.engine.log.set_aside import SetAsidePiece
from seglogfs.engine.log.transaction_index import TransactionIndexBuilder
from seglogfs.engine.log.validator import stamp_batches, validate_batches
from seglogfs.engine.record.builder import NO_PRODUCER, ProducerState, encode_batches, set_log_append_time
from seglogfs.engine.record.compression import CompressionType
from seglogfs.engine.record.records import (
    BatchHeader,
    Header,
    Record,
    TimestampType,
    decode_records,
    iter_batch_headers,
)

logger = logging.getLogger(__name__)

# How many times `refresh` lists a directory whose segments go as it looks at them.
_LOOKS_AT_A_CHANGING_DIRECTORY = 3


@dataclass(frozen=True, slots=True)
class AppendInfo:
    """What an append stored."""

    first_offset: int
    last_offset: int
    records: int
    batches: int
    bytes: int
    max_timestamp: int


@dataclass
class _RollFlush:
    """The fsync of the segment the last roll sealed, on a thread of its own (Kafka schedules it
    right after the roll): the recovery point passes the segment once it is done."""

    segment: LogSegment
    recovery_point: int  # the recovery point once it is done
    truncations: int  # the log's truncations when it started (cut back since: it says nothing)
    thread: threading.Thread | None = None  # (None: done in the rolling thread)
    failure: BaseException | None = None  # what it raised

    @property
    def done(self) -> bool:
        return self.thread is None or not self.thread.is_alive()

    def passes(self, truncations: int) -> bool:
        """Whether the recovery point passes its segment, the log cut back `truncations` times:
        done, without a failure, and the log not cut back since it started."""
        return self.done and self.failure is None and self.truncations == truncations


class PartitionLog:
    """One partition dir. Create with `PartitionLog.open` or `PartitionLog.create`."""

    def __init__(
        self,
        directory: Path,
        topic: str,
        partition: int,
        config: LogConfig,
        *,
        writable: bool,
        segments: list[LogSegment],
        log_start_offset: int,
        log_end_offset: int,
        recovery_point: int,
        now_ms: int,
        rng: random.Random | None = None,
    ) -> None:
        self.directory = directory
        self.topic = topic
        self.partition = partition
        self._where = f"{topic}-{partition}"  # (in errors, where they happened)
        self.config = config
        self.writable = writable
        self.lock = threading.RLock()
        self._segments = LogSegments(segments)
        self._log_start_offset = log_start_offset
        self._log_end_offset = log_end_offset
        self._recovery_point = recovery_point
        self._rng = rng or random.Random()
        self._unflushed_records = 0
        self._last_flush_ms = now_ms
        self._closed = False
        self._behind: _RollFlush | None = None  # the last roll's flush, until it is waited for
        self._pending_deletes: list[tuple[int, LogSegment]] = []
        self.offline_reason: str | None = None  # why the partition was taken offline, if it was
        # What the open's recovery cut or removed, kept beside the log dir (engine.log.set_aside).
        self.set_aside: list[SetAsidePiece] = []
        self.truncations = 0  # how often the log was cut back: readers that measured it look again
        self._directory = FollowedDirectory(directory)  # read-only: what `refresh` last saw of it
        # The producers' open transactions (Kafka's producer state), for `.txnindex` entries:
        # built by `_transactions_locked` when the first transactional batch arrives in this
        # process, then kept up to date by every transactional batch appended; None again after
        # a truncation. A log without transactions never builds it.
        self._transactions: TransactionIndexBuilder | None = None
        # The leader epochs of `leader-epoch-checkpoint` (engine.log.leader_epochs): read at the first
        # append, truncation or move of the log start, which keep it in line with the log.
        self._leader_epochs: LeaderEpochCache | None = None
        if writable and segments:
            segments[-1].roll_jitter_ms = self._new_jitter()

    def __repr__(self) -> str:
        return f"PartitionLog({self.topic}-{self.partition}, {self._log_start_offset}..{self._log_end_offset})"

    @classmethod
    def open(
        cls,
        directory: Path,
        topic: str,
        partition: int,
        config: LogConfig,
        *,
        writable: bool,
        clean_shutdown: bool,
        recovery_point: int = 0,
        log_start_offset: int = 0,
        now_ms: int,
    ) -> PartitionLog:
        """Load an existing partition dir (recovering it when `writable` and not cleanly shut)."""
        loaded = load_partition(
            directory,
            config,
            writable=writable,
            clean_shutdown=clean_shutdown,
            recovery_point=recovery_point,
            log_start_offset=log_start_offset,
            now_ms=now_ms,
        )
        log = cls(
            directory,
            topic,
            partition,
            config,
            writable=writable,
            segments=loaded.segments,
            log_start_offset=loaded.log_start_offset,
            log_end_offset=loaded.log_end_offset,
            recovery_point=loaded.recovery_point,
            now_ms=now_ms,
        )
        log.set_aside = loaded.set_aside
        return log

    @classmethod
    def unreadable(
        cls,
        directory: Path,
        topic: str,
        partition: int,
        config: LogConfig,
        reason: str,
        *,
        log_start_offset: int,
        recovery_point: int,
        now_ms: int,
    ) -> PartitionLog:
        """A partition dir that could not be opened (legacy data, damage beyond repair, the OS
        refusing to read it), kept in the data dir as offline: it serves nothing (reads raise
        LogOfflineError naming `reason`), its files stay untouched, and its checkpoint entries
        are written back as they were read."""
        log = cls(
            directory,
            topic,
            partition,
            config,
            writable=False,
            segments=[],
            log_start_offset=log_start_offset,
            log_end_offset=log_start_offset,
            recovery_point=recovery_point,
            now_ms=now_ms,
        )
        log.offline_reason = reason
        return log

    @classmethod
    def create(
        cls, directory: Path, topic: str, partition: int, config: LogConfig, *, topic_id: str, now_ms: int
    ) -> PartitionLog:
        """Make a new partition dir with an empty segment, `partition.metadata` and a
        leader-epoch checkpoint, as a Kafka broker leaves a new partition."""
        directory.mkdir(parents=False, exist_ok=False)
        write_partition_metadata(directory / PARTITION_METADATA, topic_id)
        write_leader_epochs(directory / LEADER_EPOCH_CHECKPOINT, [(DEFAULT_LEADER_EPOCH, 0)])
        log = cls.open(directory, topic, partition, config, writable=True, clean_shutdown=True, now_ms=now_ms)
        # The first segment's names and the partition dir's own name: durable before a record
        # is (an fsync of the segment alone does not make its name survive a power cut).
        fsync_dir(directory)
        fsync_dir(directory.parent)
        return log

    # -- offsets --------------------------------------------------------------------------------
    @property
    def log_start_offset(self) -> int:
        return self._log_start_offset

    @property
    def log_end_offset(self) -> int:
        return self._log_end_offset

    @property
    def high_watermark(self) -> int:
        return self._log_end_offset

    @property
    def recovery_point(self) -> int:
        """Below it, everything is on disk: a roll's flush done in the background counts once it
        is done."""
        behind = self._behind
        if behind is not None and behind.passes(self.truncations):
            return max(self._recovery_point, behind.recovery_point)
        return self._recovery_point

    @property
    def segments(self) -> list[LogSegment]:
        return self._segments.snapshot()

    @property
    def active_segment(self) -> LogSegment:
        segment = self._segments.last
        assert segment is not None, "a log always has an active segment"
        return segment

    def size_in_bytes(self) -> int:
        return self._segments.size_in_bytes()

    def _check_writable(self) -> None:
        if not self.writable:
            raise ReadOnlyError(f"{self.directory}: partition is open read-only")

    def take_offline(self, reason: str) -> None:
        """Stop serving the partition after its storage failed (Kafka takes the log dir
        offline): appends and reads raise LogOfflineError naming `reason` from now on; what
        is on disk stays as it is for the operator (and the next open's recovery) to judge."""
        if self.offline_reason is None:
            self.offline_reason = reason
            logger.error("%s-%d is offline: %s", self.topic, self.partition, reason)

    def check_online(self) -> None:
        if self.offline_reason is not None:
            raise LogOfflineError(f"{self.topic}-{self.partition} is offline: {self.offline_reason}")

    def _check_appendable(self) -> None:
        self.check_online()  # (first: an offline partition of a writable data dir is read-only too, and why says more)
        self._check_writable()
        if self.topic == METADATA_TOPIC:
            # A broker's KRaft metadata log: only the controller writes it; a record from here
            # would corrupt the broker's metadata.
            raise InvalidRecordError(f"{self.topic}-{self.partition}: the broker's metadata log takes no appends")

    # -- appending -------------------------------------------------------------------------------
    def append_records(
        self,
        values: Sequence[bytes | None],
        *,
        keys: Sequence[bytes | None] | None = None,
        headers: Sequence[Sequence[Header]] | None = None,
        timestamps: Sequence[int] | np.ndarray | int | None = None,
        now_ms: int,
        compression: CompressionType | None = None,
        producer: ProducerState = NO_PRODUCER,
    ) -> AppendInfo:
        """Append records as batches of at most `max.message.bytes`, offsets assigned from the
        log end offset. All records are stored or none (on error the log is cut back).

        Timestamps default to `now_ms` (CreateTime); topics with LogAppendTime get `now_ms`.
        Raises RecordTooLargeError for a record that alone exceeds `max.message.bytes`,
        InvalidRecordError for a null key on a compacted topic."""
        self._check_records(values, keys)
        ts = now_ms if timestamps is None else timestamps  # (one time for all: no column to make)
        codec = compression if compression is not None else self._topic_compression()
        with self.lock:
            batches = self._encode(
                values,
                keys,
                headers,
                ts,
                compression=codec,
                producer=producer,
                base_offset=self._log_end_offset,
                leader_epoch=self._leader_epochs_locked().leader_epoch,
            )
            if self.config.timestamp_type is TimestampType.LOG_APPEND_TIME:
                for batch in batches:  # (built here, each its own: stamped in place)
                    set_log_append_time(batch, now_ms)
            # Batches built here are valid by construction: append them without re-checking; each
            # header is parsed once, from the batch as it is stored.
            return self._append_valid_locked(batches, [BatchHeader.parse(batch) for batch in batches], now_ms)

    def encode_records(
        self,
        values: Sequence[bytes | None],
        *,
        keys: Sequence[bytes | None] | None = None,
        headers: Sequence[Sequence[Header]] | None = None,
        timestamps: Sequence[int] | int,
    ) -> bytes:
        """The batches `append_records` would append, offsets from 0, each check of it made
        (the same errors), nothing appended: for `append_encoded`. An append to several
        partitions that must store all or nothing encodes each first."""
        self._check_records(values, keys)
        return b"".join(self._encode(values, keys, headers, timestamps, compression=self._topic_compression()))

    def _encode(
        self,
        values: Sequence[bytes | None],
        keys: Sequence[bytes | None] | None,
        headers: Sequence[Sequence[Header]] | None,
        timestamps: Sequence[int] | np.ndarray | int,
        *,
        compression: CompressionType,
        producer: ProducerState = NO_PRODUCER,
        base_offset: int = 0,
        leader_epoch: int = DEFAULT_LEADER_EPOCH,
    ) -> list[bytearray]:
        """The records as this log's batches (`max.message.bytes` each at most), stamped with
        `leader_epoch` (the append stamps its own again: see `_stamp`)."""
        return encode_batches(
            values,
            keys=keys,
            headers=headers,
            timestamps=timestamps,
            max_batch_bytes=self.config.max_message_bytes,
            where=self._where,
            base_offset=base_offset,
            compression=compression,
            producer=producer,
            partition_leader_epoch=leader_epoch,
        )

    def append_encoded(self, encoded: bytes, now_ms: int) -> AppendInfo:
        """Append what `encode_records` made, offsets from the log end offset (LogAppendTime
        stamped where the topic asks for it), without checking its batches again."""
        self._check_appendable()
        with self.lock:
            return self._append_batches_locked(encoded, assign_offsets=True, now_ms=now_ms, checked=True)

    def _check_records(self, values: Sequence[bytes | None], keys: Sequence[bytes | None] | None) -> None:
        """What `append_records` refuses before it encodes."""
        self._check_appendable()
        if len(values) == 0:
            raise InvalidRecordError(f"{self.topic}-{self.partition}: nothing to append")
        if self.config.compact and (keys is None or any(key is None for key in keys)):
            slot = 0 if keys is None else next(i for i, key in enumerate(keys) if key is None)
            raise InvalidRecordError(
                f"{self.topic}-{self.partition}: compacted topic refuses record {slot}, which has no key"
            )

    @contextlib.contextmanager
    def quick_append(self, most_bytes: int, most_records: int, now_ms: int) -> Iterator[bool]:
        """For an event loop, which must wait neither on another thread's append nor on the disk
        (a one-line `echo >> append`): whether an append of at most `most_records` records in
        `most_bytes` of batches, timestamped `now_ms`, made inside the block would only write to
        the page cache (no roll, no flush due, nothing to load from the disk first). True when
        `lock` was free: it is held until the block ends, so nothing changes that between the
        answer and the append. False at once otherwise (a closed, offline or read-only log; the
        lock held by another thread)."""
        held = self.writable and self.offline_reason is None and not self._closed and self.lock.acquire(blocking=False)
        try:
            config = self.config
            yield held and (
                self._unflushed_records + most_records < config.flush_messages
                and now_ms - self._last_flush_ms < config.flush_ms
                and self.active_segment.appends_in_memory(
                    most_bytes, self._log_end_offset + most_records, now_ms, config.segment_bytes, config.max_segment_ms
                )
            )
        finally:
            if held:
                self.lock.release()

    def _topic_compression(self) -> CompressionType:
        name = self.config.compression_type
        return CompressionType.NONE if name == "producer" else CompressionType.from_name(name)

    def append_batches(self, data: bytes, *, assign_offsets: bool, now_ms: int) -> AppendInfo:
        """Append encoded v2 batches. With `assign_offsets` (a producer) offsets are rewritten
        from the log end offset; without (restore, replication) each batch must start above the
        previous one and at or above the log end offset. Each batch is checked (CRC, size,
        keys on compacted topics) before anything is written."""
        self._check_appendable()
        with self.lock:
            return self._append_batches_locked(data, assign_offsets=assign_offsets, now_ms=now_ms)

    def adopt_batches(self, path: Path, *, now_ms: int) -> AppendInfo:
        """Append the v2 batches in the file at `path` by making the file itself the partition's
        new active segment: renamed into the partition's directory, not copied (a bulk load's
        staged batches, at disk speed). Offsets are assigned from the log end and the batches
        checked exactly as `append_batches(assign_offsets=True)` does; the file is changed in
        place (base offsets, leader epoch, LogAppendTime) and is gone on success. It must be on
        the log dir's filesystem (OSError EXDEV otherwise) and at most `segment.bytes`. On any
        failure nothing is appended and the file stays at `path` (its offsets may be rewritten:
        a later append assigns them again)."""
        self._check_appendable()
        where = self._where
        with self.lock:
            with os.fdopen(open_regular(path, os.O_RDWR), "r+b") as file:  # (a link or a FIFO: refused)
                size = os.fstat(file.fileno()).st_size
                if size > self.config.segment_bytes:
                    raise RecordTooLargeError(
                        f"{where}: {path} holds {size} bytes of batches, over segment.bytes={self.config.segment_bytes}"
                    )
                if size == 0:
                    raise CorruptRecordError(str(path), 0, "incomplete record batch")
                with mmap.mmap(file.fileno(), size) as mapped:
                    view = memoryview(mapped)
                    try:
                        headers = self._validate_input(view, assign_offsets=True, source=str(path))
                        self._stamp(view, headers, now_ms, assign_offsets=True)
                        headers = list(iter_batch_headers(view))
                    except BaseException as error:
                        traceback.clear_frames(error.__traceback__)  # (their views of the map)
                        raise
                    finally:
                        view.release()
            records = sum(header.records_count for header in headers)
            if records > INT32_MAX:
                raise RecordTooLargeError(f"{where}: {path} holds {records} records, too many for one segment")
            if os.stat(path).st_dev != os.stat(self.directory).st_dev:  # (before the roll: nothing changes)
                raise OSError(errno.EXDEV, f"{path} is not on the filesystem of {self.directory}")
            self._assign_leader_epoch_locked(headers[0].base_offset)
            segment = self._roll_locked(self._log_end_offset, now_ms)
            self._join_behind()  # (the sealed segment's batches durable before the adopted file's name)
            segment.adopt(path)
            fsync_dir(self.directory)
            self._log_end_offset = headers[-1].next_offset
            if any(header.is_transactional for header in headers):
                try:
                    for header, batch in segment.iter_batches(0):
                        if header.is_transactional:
                            self._track_transaction_locked(segment, header, batch)
                except BaseException:
                    self._transactions = None  # built again from the log when next needed
                    raise
            return self._appended_locked(headers, size, now_ms)

    def _stamp(self, view: memoryview, headers: list[BatchHeader], now_ms: int, *, assign_offsets: bool) -> None:
        """What the log writes into checked batches before they are appended (`stamp_batches`)."""
        stamp_batches(
            view,
            headers,
            base_offset=self._log_end_offset if assign_offsets else None,
            leader_epoch=self._leader_epochs_locked().leader_epoch,
            log_append_time_ms=now_ms if self.config.timestamp_type is TimestampType.LOG_APPEND_TIME else None,
        )

    def _validate_input(
        self, data: bytearray | memoryview, assign_offsets: bool, source: str | None = None
    ) -> list[BatchHeader]:
        """The headers of `data`'s batches, each checked (`validate_batches`)."""
        return validate_batches(
            data,
            self.config,
            where=self._where,
            source=source or f"<input to {self._where}>",
            expected_offset=None if assign_offsets else self._log_end_offset,
        )

    def _append_batches_locked(
        self, data: bytes, *, assign_offsets: bool, now_ms: int, checked: bool = False
    ) -> AppendInfo:
        buffer = bytearray(data)
        headers = list(iter_batch_headers(buffer)) if checked else self._validate_input(buffer, assign_offsets)
        self._stamp(memoryview(buffer), headers, now_ms, assign_offsets=assign_offsets)
        # (stamping rewrites fields, never a length: each batch is where it was, parsed anew below)
        batches = [bytes(buffer[header.position : header.next_position]) for header in headers]
        return self._append_valid_locked(batches, [BatchHeader.parse(b) for b in batches], now_ms)

    def _append_valid_locked(
        self, batches: Sequence[bytes | bytearray], headers: list[BatchHeader], now_ms: int
    ) -> AppendInfo:
        """Append checked batches (`headers[i]` parsed from `batches[i]`, position 0), rolling
        as needed; on any failure cut the log back so that none of them stays."""
        start_end = self._log_end_offset
        self._assign_leader_epoch_locked(headers[0].base_offset)
        try:  # (a batch that fails midway is cut back by the segment itself)
            for batch, header in zip(batches, headers, strict=True):
                segment = self._maybe_roll(len(batch), header, now_ms)
                segment.append(batch, [header])
                self._log_end_offset = header.next_offset
                if header.is_transactional:  # (the one test ordinary data pays)
                    self._track_transaction_locked(segment, header, batch)
        except BaseException:
            if self.log_end_offset > start_end:
                self._truncate_to_locked(start_end, now_ms)
                with contextlib.suppress(OSError):  # the cut made durable: a failed write never reappears
                    self.active_segment.flush()
            raise
        size = len(batches[0]) if len(batches) == 1 else sum(map(len, batches))
        return self._appended_locked(headers, size, now_ms)

    def _leader_epochs_locked(self) -> LeaderEpochCache:
        """The partition's leader epochs, read from its checkpoint the first time. Holds: the lock."""
        if self._leader_epochs is None:
            self._leader_epochs = LeaderEpochCache.load(
                self.directory, log_start_offset=self._log_start_offset, log_end_offset=self._log_end_offset
            )
        return self._leader_epochs

    def _assign_leader_epoch_locked(self, start_offset: int) -> None:
        """Before batches stamped with the current leader epoch are appended from `start_offset`:
        the epoch's entry in the checkpoint (written when it has none yet), as Kafka's
        UnifiedLog.append assigns each batch's epoch before it appends the batch. Every append
        comes here: records, batches, encoded batches, adopted files."""
        epochs = self._leader_epochs_locked()
        epochs.assign(epochs.leader_epoch, start_offset)

    def _track_transaction_locked(
        self, segment: LogSegment, header: BatchHeader, batch: bytes | bytearray | memoryview
    ) -> None:
        """A transactional batch was appended to `segment`: a data batch opens or joins its
        producer's transaction; an ABORT marker that ends an open one adds the transaction's
        entry to the segment's `.txnindex` (Kafka's UnifiedLog.append → updateTxnIndex)."""
        marker = self._transactions_locked(header.base_offset).add(header, batch)
        if marker is not None and marker.rebuilt is not None:
            segment.transaction_index.append(marker.rebuilt)

    def _transactions_locked(self, end_offset: int) -> TransactionIndexBuilder:
        """The producers' open transactions below `end_offset`, the first time from a scan of
        every segment from the first (its batch headers, and its transactional batches whole;
        once per process, when its first transactional batch arrives: Kafka loads this state
        from its producer snapshots instead)."""
        if self._transactions is None:
            builder = TransactionIndexBuilder()
            # Headers only, and the transactional batches whole and checked, as
            # TransactionTracker.catch_up reads (a log with few transactions costs a read per
            # large batch, not a read of the log under the lock). Damage in a sealed segment is
            # an error, not its end: open transactions after it would be missed.
            for segment, header in self.batch_headers(0, end_offset):
                if header.is_transactional:
                    builder.add(header, segment.checked_batch(header))
            self._transactions = builder
        return self._transactions

    def _appended_locked(self, headers: list[BatchHeader], size: int, now_ms: int) -> AppendInfo:
        """After batches were appended: count them towards `flush.messages`, flush if due, and
        say what was appended."""
        first, last = headers[0], headers[-1]
        if first is last:  # (one batch: `echo >> append`, a batch at a time)
            records, max_timestamp = first.records_count, first.max_timestamp
        else:
            records, max_timestamp = sum(h.records_count for h in headers), max(h.max_timestamp for h in headers)
        self._unflushed_records += records
        self._maybe_flush_locked(now_ms)
        return AppendInfo(first.base_offset, last.last_offset, records, len(headers), size, max_timestamp)

    def _maybe_roll(self, messages_bytes: int, header: BatchHeader, now_ms: int) -> LogSegment:
        segment = self.active_segment
        config = self.config
        if segment.should_roll(
            messages_bytes=messages_bytes,
            max_timestamp=header.max_timestamp,
            max_offset=header.last_offset,
            now_ms=now_ms,
            max_bytes=config.segment_bytes,
            max_ms=config.max_segment_ms,
        ):
            return self._roll_locked(header.base_offset, now_ms)
        return segment

    def roll(self, now_ms: int, expected_next_offset: int | None = None) -> LogSegment:
        """Start a new active segment at max(expected, log end offset). Rolling an empty active
        segment returns it unchanged (Kafka re-creates it in place)."""
        self._check_writable()
        with self.lock:
            return self._roll_locked(expected_next_offset or self._log_end_offset, now_ms)

    def _roll_locked(self, expected_next_offset: int, now_ms: int) -> LogSegment:
        new_base = max(expected_next_offset, self._log_end_offset)
        active = self.active_segment
        if active.base_offset == new_base and active.size == 0:
            return active
        self._join_behind()  # (the last roll's flush: one at a time, and its failure said here)
        active.on_become_inactive()
        # Rolling flushes what came before. Kafka schedules that flush right after the roll: the
        # `.log`'s fsync runs on a thread of its own while the appends go on (a GiB's took a
        # quarter of a second and more in the appending thread), and the recovery point passes
        # the segment once it is done.
        if self._recovery_point < active.base_offset:
            for segment in self._segments.from_offset(self._recovery_point):
                if segment is not active:
                    segment.flush()
        segment = segment_for(self.directory, new_base, self.config, writable=True, now_ms=now_ms)
        segment.roll_jitter_ms = self._new_jitter()
        segment.make_active()
        self._segments.add(segment)
        # The new files' directory entries are made durable after the sealed segment's batches
        # (its fsync, then the directory's): a power cut between the two must not leave the new
        # segment's name without the batches below its base offset, a gap no recovery sees. The
        # recovery point passes the new base once both are done.
        try:
            descriptor = active.take_flush()  # (only now: a roll that failed above left it to be flushed)
        except OSError:  # (no descriptor to spare, EMFILE: flushed here and now)
            active.flush()
            descriptor = None
        if descriptor is None:
            fsync_dir(self.directory)
            self._recovery_point = max(self._recovery_point, new_base)
        else:
            self._flush_behind(active, descriptor, new_base)
        return segment

    def _flush_behind(self, segment: LogSegment, descriptor: int, recovery_point: int) -> None:
        """fsync `descriptor` (a duplicate of `segment`'s `.log`, closed when done), then the
        partition's directory (the new segment's names), on a thread of its own (here, when no
        thread can be started); `_join_behind` waits for it."""
        behind = _RollFlush(segment, recovery_point, self.truncations)
        directory = self.directory

        def flush() -> None:
            try:
                os.fsync(descriptor)
                fsync_dir(directory)
            except BaseException as error:  # said by `_join_behind`, in the thread that rolls or flushes next
                behind.failure = error
            finally:
                os.close(descriptor)

        behind.thread = threading.Thread(target=flush, name=f"flush {self._where}", daemon=True)
        try:
            behind.thread.start()
        except RuntimeError:  # (no thread to be had)
            behind.thread = None
            flush()
        self._behind = behind  # (only now: the recovery point reads it without the lock)

    def _join_behind(self) -> None:
        """Wait for the last roll's flush; the recovery point passes its segment (unless the log
        was cut back meanwhile). Its failure takes the partition offline, as Kafka takes a log
        dir offline when a flush fails (a second fsync would succeed without the data: Linux
        reports a failed writeback once and drops the pages), and is raised here. Holds: the
        partition lock."""
        behind = self._behind
        if behind is None:
            return
        if behind.thread is not None:
            behind.thread.join()
        self._behind = None  # (only once done: an interrupted join waits again next time)
        if behind.failure is not None:
            self.take_offline(f"flush of {behind.segment.log_path} failed: {behind.failure}")
            raise behind.failure
        if behind.passes(self.truncations):
            self._recovery_point = max(self._recovery_point, behind.recovery_point)

    def _new_jitter(self) -> int:
        """A segment's random share of `segment.jitter.ms` (Kafka's randomSegmentJitter)."""
        if self.config.segment_jitter_ms <= 0:
            return 0
        return self._rng.randrange(min(self.config.segment_jitter_ms, self.config.max_segment_ms))

    # -- durability ------------------------------------------------------------------------------
    def flush(self) -> None:
        """fsync every segment holding unflushed data; the recovery point becomes the log end."""
        with self.lock:
            self._flush_locked()

    def _flush_locked(self) -> None:
        if self.offline_reason is not None:
            return  # (its storage failed: nothing it says is trusted, and the recovery point stays)
        self._join_behind()
        for segment in self._segments.from_offset(self._recovery_point):
            segment.flush()
        self._recovery_point = self._log_end_offset
        self._unflushed_records = 0

    def maybe_flush(self, now_ms: int) -> None:
        """Flush when `flush.messages` records or `flush.ms` have passed since the last flush."""
        with self.lock:
            self._maybe_flush_locked(now_ms)

    def _maybe_flush_locked(self, now_ms: int) -> None:
        if self._unflushed_records == 0:
            self._last_flush_ms = now_ms
            return
        if (
            self._unflushed_records >= self.config.flush_messages
            or now_ms - self._last_flush_ms >= self.config.flush_ms
        ):
            self._flush_locked()
            self._last_flush_ms = now_ms

    # -- following another writer (read-only) ---------------------------------------------------
    def refresh(self, now_ms: int) -> bool:
        """Read-only: take in what another process (a broker, `seglogfs produce`) did to the
        partition since the last look — batches appended (complete ones only), segments rolled,
        deleted by retention, or swapped in by compaction — and publish it at once: readers see
        the old state or the new one, never a mix. Costs a `stat` of the partition's directory
        and of its last segment, plus a scan of the batch headers appended. Returns whether
        anything changed. A writable log is its own writer: nothing to do. An offline log is not
        looked at; a link, a FIFO or a directory found where a segment belongs (UnsafeFileError)
        takes this one offline."""
        if self.writable or self.offline_reason is not None:
            return False
        with self.lock:
            current = self._segments.snapshot()
            # A segment removed between the listing and the look at its size (retention, the
            # cleaner's swap, racing this look): the directory changed, so it is listed again. A
            # writer that outruns every try leaves the log as last seen until the next look.
            for _ in range(_LOOKS_AT_A_CHANGING_DIRECTORY):
                try:
                    looked = self._directory.look(current, self.config, now_ms)
                except FileNotFoundError:
                    self._directory.forget_listing()
                    continue
                except UnsafeFileError as error:
                    self.take_offline(str(error))
                    return True
                break
            else:
                return False
            segments, changed, grown = looked
            if not changed and not grown:
                return False
            gone = [segment for segment in current if segment not in segments]
            if changed:
                self._segments = LogSegments(segments)
            if segments:
                self._log_start_offset = max(self._log_start_offset, segments[0].base_offset)
                self._log_end_offset = max(segments[-1].followed_next_offset, self._log_start_offset)
            for segment in gone:
                segment.close_handlers()
            return True

    # -- reading ---------------------------------------------------------------------------------
    def batches(
        self, start_offset: int, end_offset: int | None = None, *, checked: bool = True
    ) -> Iterator[tuple[LogSegment, BatchHeader, memoryview]]:
        """Every whole, CRC-checked batch holding offsets in [start, end), in order, across
        segments. Raises CorruptRecordError (path, position) on a batch that fails its check,
        LogOfflineError for a partition taken offline. `checked` false: the batches are not
        checked here, the caller checks each with its segment's `check` (on other threads)."""
        for segment, header, batch in self._scan(start_offset, end_offset, whole=True):
            assert batch is not None
            if checked:
                segment.check(header, batch)
            yield segment, header, batch

    def batch_headers(
        self, start_offset: int, end_offset: int | None = None, *, skip: Callable[[LogSegment], bool] | None = None
    ) -> Iterator[tuple[LogSegment, BatchHeader]]:
        """The headers of the batches `batches` would give, without reading the batches whole
        (LogSegment.iter_headers) and so without checking them: for a scan that needs few of
        them (the caller checks those, `LogSegment.checked_batch`). A segment for which `skip`
        says so is not read (asked in order, as the scan reaches it)."""
        for segment, header, _ in self._scan(start_offset, end_offset, whole=False, skip=skip):
            yield segment, header

    def _scan(
        self,
        start_offset: int,
        end_offset: int | None,
        *,
        whole: bool,
        skip: Callable[[LogSegment], bool] | None = None,
    ) -> Iterator[tuple[LogSegment, BatchHeader, memoryview | None]]:
        """The batches holding offsets in [start, end), across segments: whole (unchecked) or
        (not `whole`) their headers only, with None."""
        self.check_online()
        stop = self._log_end_offset if end_offset is None else end_offset
        last = self._segments.last
        for segment in self._segments.from_offset(start_offset):
            if segment.base_offset >= stop:
                return
            if skip is not None and skip(segment):
                continue
            size = segment.size  # (read-only: as the last `refresh` found it)
            first = segment.translate_offset(start_offset) if start_offset > segment.base_offset else None
            if start_offset > segment.base_offset and first is None:
                continue
            position = first.position if first is not None else 0
            # A sealed segment is whole batches to its end: a scan stopping short of it met damage
            # (the rest of the segment would be skipped without a word).
            sealed = segment is not last
            read: Iterator[tuple[BatchHeader, memoryview | None]] = (
                segment.iter_batches(position, size, to_end=sealed)
                if whole
                else ((header, None) for header in segment.iter_headers(position, size, to_end=sealed))
            )
            for header, batch in read:
                position = header.next_position
                if header.last_offset < start_offset:
                    continue
                if header.base_offset >= stop:
                    return
                yield segment, header, batch
            if not sealed and position < size:  # (a batch being written, a torn tail)
                segment.check_not_legacy(position)  # legacy messages too short to parse as batches

    def records(self, start_offset: int, end_offset: int | None = None) -> Iterator[Record]:
        """User records with offsets in [start, end), skipping control batches."""
        stop = self._log_end_offset if end_offset is None else end_offset
        for segment, header, batch in self.batches(start_offset, stop):
            if header.is_control:
                continue
            try:
                records = decode_records(header, batch)
            except Exception as error:  # a codec or varint error inside a batch whose CRC held
                raise CorruptRecordError(segment.log_path, header.position, f"undecodable records: {error}") from None
            for record in records:
                if start_offset <= record.offset < stop:
                    yield record

    def offset_for_timestamp(self, timestamp: int) -> TimestampAndOffset | None:
        """The first record with timestamp ≥ `timestamp` (Kafka's ListOffsets by time): the first
        segment whose largest timestamp reaches it, then that segment's time index, offset
        index and a scan. None when every record is older."""
        for segment in self._segments.snapshot():
            if segment.largest_timestamp >= timestamp and segment.size > 0:
                found = segment.find_offset_by_timestamp(timestamp, self._log_start_offset)
                if found is not None:
                    return found
        return None

    def offset_for_timestamp_bound(self, timestamp: int) -> int | None:
        """`offset_for_timestamp` as far as the indexes and the segments' largest timestamps
        tell, reading no batch (for a backup's copy, whose batches are fetched: planning): a
        lower bound of its offset; None when no segment's largest timestamp reaches it (then it
        finds none either — it may also find none where this gives a bound, when only records
        below the log start offset reach it)."""
        for segment in self._segments.snapshot():
            if segment.largest_timestamp >= timestamp and segment.size > 0:
                return segment.offset_for_timestamp_bound(timestamp, self._log_start_offset)
        return None

    # -- retention --------------------------------------------------------------------------------
    def delete_old_segments(self, now_ms: int) -> RetentionDecision:
        """One retention pass (see engine.log.retention): the segments due go out of the segment map
        at once, are renamed `.deleted` and removed after `file.delete.delay.ms` (readers that
        hold one keep reading it); the log start offset moves to the first segment left. When
        every segment is due the log rolls first, so an empty segment keeps the log end offset."""
        self._check_writable()
        with self.lock:
            return self._delete_segments_locked(self.retention_due(now_ms), now_ms)

    def retention_due(self, now_ms: int) -> RetentionDecision:
        """What a retention pass would delete now (engine.log.retention), deleting nothing: the
        pass's own decision when called under the lock, a plan (`clean --dry-run`) otherwise."""
        return segments_to_delete(
            self._segments.snapshot(),
            self.config,
            log_start_offset=self._log_start_offset,
            high_watermark=self.high_watermark,
            log_end_offset=self._log_end_offset,
            now_ms=now_ms,
        )

    def _delete_segments_locked(self, decision: RetentionDecision, now_ms: int) -> RetentionDecision:
        """Take the decided segments out (see delete_old_segments). Holds: the partition lock."""
        if decision:
            if decision.segments[-1] is self.active_segment:
                self._roll_locked(self._log_end_offset, now_ms)
            for segment in decision.segments:
                self._segments.remove(segment.base_offset)
                segment.mark_deleted()
                self._pending_deletes.append((now_ms + self.config.file_delete_delay_ms, segment))
            first = self.segments[0].base_offset
            self._log_start_offset = max(self._log_start_offset, first)
            self._recovery_point = max(self._recovery_point, first)
            fsync_dir(self.directory)
            self._leader_epochs_locked().truncate_from_start(self._log_start_offset)
        return decision

    def delete_records(self, offset: int, now_ms: int) -> int:
        """Raise the log start offset to `offset` (kafka-delete-records); segments wholly below
        it go at once, and nothing else: time and size retention are the retention pass's.
        Returns the new log start offset. OffsetOutOfRangeError above the high watermark; a
        lower offset than the current start changes nothing."""
        self._check_writable()
        with self.lock:
            if offset > self.high_watermark or offset < 0:
                raise OffsetOutOfRangeError(
                    f"delete-records of {self.topic}-{self.partition}",
                    offset,
                    self._log_start_offset,
                    self.high_watermark,
                )
            if offset > self._log_start_offset:
                self._log_start_offset = offset
                self._leader_epochs_locked().truncate_from_start(offset)
            decision = segments_below_log_start(
                self._segments.snapshot(),
                log_start_offset=self._log_start_offset,
                high_watermark=self.high_watermark,
                log_end_offset=self._log_end_offset,
            )
            self._delete_segments_locked(decision, now_ms)
            return self._log_start_offset

    def delete_pending(self, now_ms: int, *, all_of_them: bool = False) -> int:
        """Remove the files of deleted segments whose `file.delete.delay.ms` has passed (or all
        of them); returns how many segments went."""
        with self.lock:
            due = [(at, s) for at, s in self._pending_deletes if all_of_them or at <= now_ms]
            for entry in due:
                self._pending_deletes.remove(entry)
                entry[1].delete_files()
            return len(due)

    # -- compaction -------------------------------------------------------------------------------
    def replace_segments(self, old: list[LogSegment], new: LogSegment, now_ms: int) -> bool:
        """Swap the cleaner's output (`new`, in `.cleaned` files) in for the segments it was
        built from, as Kafka's replaceSegments does: `.cleaned` → `.swap`, the old segments out of
        the map and renamed `.deleted` (removed after `file.delete.delay.ms`; readers holding one
        keep reading it), `.swap` → live. A crash between any two steps leaves files the loader
        finishes or undoes. Returns False, changing nothing, when one of `old` has meanwhile left
        the log (retention, delete-records, truncation)."""
        self._check_writable()
        with self.lock:
            live = {id(segment) for segment in self._segments.snapshot()}
            if not old or any(id(segment) not in live for segment in old):
                return False
            new.change_file_suffixes(CLEANED_SUFFIX, SWAP_SUFFIX)
            fsync_dir(self.directory)
            self._segments.replace(old, new)
            for segment in old:
                segment.mark_deleted()
                self._pending_deletes.append((now_ms + self.config.file_delete_delay_ms, segment))
            fsync_dir(self.directory)  # the old segments are out for good before the new one is in
            new.change_file_suffixes(SWAP_SUFFIX, "")
            fsync_dir(self.directory)
            return True

    # -- truncation -------------------------------------------------------------------------------
    def truncate_to(self, offset: int, now_ms: int) -> None:
        """Remove every batch from the one holding `offset` on (Kafka truncates whole batches);
        a no-op at or past the log end offset. Below the first segment's base offset every
        segment goes and the log starts empty at `offset`, as in Kafka's truncateTo."""
        self._check_writable()
        with self.lock:
            self._truncate_to_locked(offset, now_ms)

    def _truncate_to_locked(self, offset: int, now_ms: int) -> None:
        self.truncations += 1
        if offset >= self._log_end_offset:
            return
        self._transactions = None  # transactions the cut ends or reopens: read again when needed
        if offset < self.segments[0].base_offset:
            self._truncate_fully_locked(offset, now_ms)
            return
        for segment in reversed(self._segments.snapshot()):
            if segment.base_offset > offset:
                self._segments.remove(segment.base_offset)
                segment.delete_files()
        active = self.active_segment
        active.truncate_to(offset, now_ms)
        active.make_active()
        self._log_end_offset = active.read_next_offset()
        self._recovery_point = min(self._recovery_point, self._log_end_offset)
        self._log_start_offset = min(self._log_start_offset, self._log_end_offset)
        self._leader_epochs_locked().truncate_from_end(self._log_end_offset)

    def _truncate_fully_locked(self, offset: int, now_ms: int) -> None:
        """Drop every segment and start empty at `offset` (Kafka's truncateFullyAndStartAt)."""
        self.truncations += 1
        self._transactions = None
        for segment in self._segments.snapshot():
            self._segments.remove(segment.base_offset)
            segment.delete_files()
        segment = segment_for(self.directory, offset, self.config, writable=True, now_ms=now_ms)
        segment.roll_jitter_ms = self._new_jitter()
        segment.make_active()
        self._segments.add(segment)
        fsync_dir(self.directory)
        self._log_start_offset = self._log_end_offset = offset
        self._recovery_point = offset
        self._leader_epochs_locked().clear()

    # -- closing ------------------------------------------------------------------------------------
    def close(self) -> None:
        """Flush and close every segment; indexes are left trimmed, as after Kafka's clean
        shutdown. Safe to call twice."""
        with self.lock:
            if self._closed:
                return
            self._closed = True
            if self.writable:
                failure: BaseException | None = None
                try:
                    self._flush_locked()
                except BaseException as error:  # (raised below, once the files are closed all the same)
                    failure = error
                for segment in self._segments.snapshot():
                    try:
                        segment.close()
                    except BaseException as error:
                        failure = failure or error
                for _, segment in self._pending_deletes:
                    segment.close_handlers()  # the `.deleted` files go at the next open, as in Kafka
                if failure is not None:
                    raise failure
            else:
                for segment in self._segments.snapshot():
                    segment.close_handlers()
