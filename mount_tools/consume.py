"""`seglogfs consume`: kafka-console-consumer for a data dir.

    seglogfs consume DATADIR --topic T [--partition P]
        [--from-beginning | --offset N|earliest|latest | --timestamp T]
        [--max-messages N] [--follow] [--timeout-ms N] [--format text|jsonl] [--property k=v ...]
        [--isolation-level read_uncommitted|read_committed]

Without a start point it starts at the log end, as Kafka's console consumer does. It prints each
partition's records in turn up to its log end offset and ends; with `--follow` it then waits for
records other processes append (a broker, `seglogfs produce`), polling the log end offsets every
`POLL_MS`, as a console consumer polls. `--timeout-ms N` ends the wait after N ms without a new
record (and implies `--follow`, as it means "wait that long" in Kafka's tool); `--max-messages`
ends it after that many records. Either way, and on Ctrl-C or SIGTERM, the consumer ends with
status 0 and `Processed a total of N messages` on stderr. A reader that goes away (`| head -1`)
ends it quietly with status 0, also while it waits: a closed pipe is noticed without a write.
A DATADIR that is a backup whose last `seglogfs backup` did not complete is read as far as the
copy got, after one line on stderr saying so (mount_tools.backup.incomplete_backup).

The data dir is opened read-only (no lock: it works beside the writer it follows); each poll, a
partition takes in what the writer did since the last look (`PartitionLog.refresh`: appends,
rolls, retention, compaction). Records retention removed before they were printed are skipped.

`--isolation-level read_committed` reads as Kafka's read_committed consumers do: records of
aborted transactions are left out, and nothing is printed at or past the last stable offset (the
first offset of a transaction still open); the default, as in Kafka, is read_uncommitted.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import select
import signal
import sys
import threading
import time
from collections.abc import Callable, Generator, Iterator
from contextlib import contextmanager
from types import FrameType
from typing import BinaryIO, NamedTuple

from seglogfs.engine import DataDir, PartitionLog
from seglogfs.engine.errors import CorruptRecordError, OffsetOutOfRangeError
from seglogfs.engine.log.segment import LogSegment
from seglogfs.engine.log.transactions import READ_COMMITTED, READ_UNCOMMITTED, TransactionTracker
from seglogfs.engine.object_store import is_object_store_uri
from seglogfs.engine.read_ahead import map_ahead, read_ahead
from seglogfs.engine.record.records import CURRENT_MAGIC, BatchHeader
from seglogfs.engine.stored.local_copy import FOLLOW_INTERVAL_S, Partitions
from seglogfs.engine.text.console_formats import TextFormat
from seglogfs.engine.text.renderers import JsonLinesRenderer, TextRenderer
from seglogfs.engine.text.timestamps import parse_timestamp
from seglogfs.mount_tools.backup import incomplete_backup
from seglogfs.mount_tools.common import (
    EXIT_OK,
    UsageError,
    add_common,
    broker_config,
    key_values,
    now_ms,
    open_stored,
    quiet_broken_pipe,
)

POLL_MS = 100  # how often a follower looks for new records (a console consumer's poll)
# Threads rendering ahead of the writes (the compiled core renders without the GIL).
RENDER_THREADS = max(1, min(len(os.sched_getaffinity(0)), 4))
# Every record to the log end (no message limit, read_uncommitted) is rendered in runs of whole
# batches of about this many segment bytes and records, each read, checked and rendered by one
# call of the core (`render_range`) on a render thread, the GIL let go once: no Python work a
# batch. Its rendering is made in a block sized from the batch headers, at most 8 MiB for a run
# this size (JSON Lines of escaped bytes take six times theirs), which the allocator keeps for
# the next run (mount_tools.cli: _REUSED_BLOCK_BYTES). A whole `consume` of 1 GiB of 100-byte
# records went from 0.47 to 0.28 s as text, 0.81 to 0.56 s as JSON Lines.
RUN_BYTES = 1 << 20
RUN_RECORDS = 8192
# Otherwise (a message limit, read_committed) batches go one at a time, and text is rendered in
# the calling thread. A batch whose records average fewer bytes than this renders slower than it
# is read, so the reading thread checks its CRC (read_committed: there is no message limit);
# one of longer records renders at about copy speed, and is checked where it is rendered (else
# the reading thread is the slower one). 100-byte records consumed 10 % faster so, 1 KiB ones
# 8 % slower.
CHECKED_AHEAD_RECORD_BYTES = 512


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_common(parser)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--partition", type=int)
    parser.add_argument("--from-beginning", action="store_true", help="start at the log start offset")
    parser.add_argument("--offset", help="offset to start from (needs --partition), earliest or latest")
    parser.add_argument("--timestamp", help="start at the first record at or after this time (epoch ms or ISO-8601)")
    parser.add_argument("--max-messages", type=int, metavar="N", help="end after N records")
    parser.add_argument(
        "--follow", action="store_true", help="at the log end, wait for new records (Ctrl-C or SIGTERM ends it)"
    )
    parser.add_argument(
        "--timeout-ms", type=int, metavar="N", help="end after N ms without a new record (implies --follow)"
    )
    parser.add_argument("--format", choices=("text", "jsonl"), default="text")
    parser.add_argument(
        "--isolation-level",
        choices=(READ_UNCOMMITTED, READ_COMMITTED),
        default=READ_UNCOMMITTED,
        help="read_committed: leave out aborted transactions and stop at the last stable offset",
    )
    parser.add_argument(
        "--property",
        action="append",
        metavar="KEY=VALUE",
        help="print.key, print.offset, print.timestamp, print.partition, print.headers, "
        "key.separator, line.separator, null.literal",
    )


def _start_offset(args: argparse.Namespace, log: PartitionLog) -> int:
    if args.from_beginning:
        return log.log_start_offset
    if args.offset is not None:
        if args.offset in ("earliest", "latest"):
            return log.log_start_offset if args.offset == "earliest" else log.log_end_offset
        try:
            offset = int(args.offset)
        except ValueError:
            raise UsageError(f"--offset {args.offset!r}: expected a number, earliest or latest") from None
        if offset < log.log_start_offset or offset > log.log_end_offset:
            raise OffsetOutOfRangeError(
                f"--offset of {log.topic}-{log.partition}", offset, log.log_start_offset, log.log_end_offset
            )
        return offset
    if args.timestamp is not None:
        found = log.offset_for_timestamp(parse_timestamp(args.timestamp))
        return found.offset if found is not None else log.log_end_offset
    return log.log_end_offset  # Kafka's default: only records that arrive from now on


class _Cursor:
    """One partition being consumed: its log, its renderer and the next offset to print. With
    `read_committed`, the partition's transactions are tracked (engine.log.transactions): aborted
    ones are left out and nothing at or past the last stable offset is printed, as Kafka's
    read_committed consumers see it; a start at the log end starts at the last stable offset."""

    def __init__(self, log: PartitionLog, position: int, text_format: TextFormat | None, read_committed: bool) -> None:
        self.log = log
        self.renderer = (
            TextRenderer(text_format, log.partition)
            if text_format is not None
            else JsonLinesRenderer(log.topic, log.partition)
        )
        self.render_threads = RENDER_THREADS if text_format is None else 1
        self.transactions = TransactionTracker() if read_committed else None
        if self.transactions is not None and position == log.log_end_offset:
            position = self.transactions.catch_up(log)
        self.position = position

    def rendered(self, room: Callable[[], int | None]) -> Generator[tuple[bytes, int], None, None]:
        """The lines of the records from the position to the log end, a batch at a time, with how
        many records each holds; at most `room()` records each time (None: no limit). Records
        retention took meanwhile are skipped, as a consumer that finds its offset out of range
        starts again at the log start."""
        log = self.log
        self.position = max(self.position, log.log_start_offset)
        transactions = self.transactions
        stop = log.log_end_offset if transactions is None else transactions.catch_up(log)
        if self.position >= stop:
            return
        unlimited = room() is None  # no message limit: every batch to the end is printed
        if unlimited and transactions is None:
            yield from self._rendered_in_runs(stop)
            return
        ahead = unlimited and self.render_threads > 1  # rendered ahead of the writes, on a thread pool
        # The reading thread checks batches only when all it reads is printed: with a message
        # limit, a damaged batch past the last record printed is never looked at (as in Kafka's
        # consumer, which checks a batch when it gets to its records).
        small_checked = unlimited and not ahead
        read = log.batches(self.position, stop, checked=False)
        # Closed here, however this ends: an error's traceback would keep the reading thread
        # going (and its segments leased) until the garbage collector got to it.
        with contextlib.closing(read_ahead(_small_checked(read) if small_checked else read, _batch_bytes)) as batches:
            if ahead:
                start = self.position  # (only the first batch may hold records below it)
                for lines, records, last_offset in map_ahead(
                    lambda item: self._render(item, start, None, small_checked=False),
                    batches,
                    _batch_bytes,
                    workers=self.render_threads,
                ):
                    self.position = last_offset + 1
                    yield lines, records
                return
            for item in batches:
                left = room()
                if left is not None and left <= 0:
                    return
                lines, records, last_offset = self._render(item, self.position, left, small_checked=small_checked)
                self.position = last_offset + 1  # (cut short by `room` only when the consumer ends)
                yield lines, records

    def _rendered_in_runs(self, stop: int) -> Generator[tuple[bytes, int], None, None]:
        """`rendered` of every record from the position up to `stop` (read_uncommitted, no message
        limit): runs of batches (`_runs`) rendered by the core on the render threads, in order.
        A run the core does not render whole (compressed, damaged, legacy, headers shown) is
        rendered batch by batch on its thread: the records before a damaged batch are printed,
        then its error is raised."""
        start = self.position  # (only the first batch may hold records below it)
        runs = _runs(self.log.batch_headers(start, stop))
        with contextlib.closing(
            map_ahead(lambda run: self._render_run(run, start), runs, _run_bytes, workers=RENDER_THREADS, group_bytes=1)
        ) as rendered:
            for lines, records, last_offset, error in rendered:
                self.position = max(self.position, last_offset + 1)
                if records:
                    yield lines, records
                if error is not None:
                    raise error

    def _render_run(self, run: _Run, min_offset: int) -> tuple[bytes, int, int, Exception | None]:
        """A run's lines from `min_offset`, how many records, the last offset rendered, and the
        error that ended it early (None). Thread-safe."""
        segment = run.segment
        if run.plain and run.base_offset >= min_offset:
            lines = segment.with_descriptor(
                lambda fd: self.renderer.render_range(fd, run.start, run.end), run.start, run.end
            )
            if lines is not None:
                return lines, run.records, run.last_offset, None
        # Batch by batch: the same lines, or the error that made the core decline the run.
        pieces: list[bytes] = []
        records, last_offset = 0, run.base_offset - 1
        try:
            for header, batch in segment.iter_batches(run.start, run.end):
                lines, count, last_offset = self._render(
                    (segment, header, batch), min_offset, None, small_checked=False
                )
                pieces.append(lines)
                records += count
        except Exception as error:
            return b"".join(pieces), records, last_offset, error
        return b"".join(pieces), records, last_offset, None

    def _render(
        self,
        item: tuple[LogSegment, BatchHeader, memoryview],
        min_offset: int,
        room: int | None,
        *,
        small_checked: bool,
    ) -> tuple[bytes, int, int]:
        """A batch's lines from `min_offset` (at most `room`; None: all), how many, and the
        batch's last offset; the batch is checked first, unless `small_checked` and it is one
        the reading thread checked (`_small_checked`). Thread-safe."""
        segment, header, batch = item
        if not (small_checked and _checked_ahead(header, batch)):
            segment.check(header, batch)
        if self.transactions is not None and self.transactions.is_aborted(header):
            return b"", 0, header.last_offset
        try:
            lines, records = self.renderer.render_some(header, batch, min_offset, room)
        except Exception as error:  # a codec or varint error inside a batch whose CRC held
            raise CorruptRecordError(segment.log_path, header.position, f"undecodable records: {error}") from None
        return lines, records, header.last_offset


class _Run(NamedTuple):
    """Consecutive batches of one segment: the file's bytes [start, end), their first and last
    offsets and how many records they hold; `plain` when every one is a v2 batch stored
    uncompressed (what the core renders in one call)."""

    segment: LogSegment
    start: int
    end: int
    base_offset: int
    last_offset: int
    records: int
    plain: bool


def _runs(headers: Iterator[tuple[LogSegment, BatchHeader]]) -> Iterator[_Run]:
    """The batches of `headers` as runs of at most `RUN_BYTES` and `RUN_RECORDS` (or one batch
    larger than that); each segment's reading is advised ahead once its first header is read.
    An error of the scan (EIO, a segment gone) comes after the run of the headers before it."""
    run: list[BatchHeader] = []
    segment: LogSegment | None = None
    run_bytes = run_records = 0
    try:
        for batch_segment, header in headers:
            if run and (
                batch_segment is not segment
                or run_bytes + header.size_in_bytes > RUN_BYTES
                or run_records + header.records_count > RUN_RECORDS
            ):
                assert segment is not None
                yield _run(segment, run)
                run, run_bytes, run_records = [], 0, 0
            if batch_segment is not segment:
                batch_segment.advise_read_ahead(header.position)
                segment = batch_segment
            run.append(header)
            run_bytes += header.size_in_bytes
            run_records += header.records_count
    except Exception:
        if run:
            assert segment is not None
            yield _run(segment, run)
        raise
    if run:
        assert segment is not None
        yield _run(segment, run)


def _run(segment: LogSegment, headers: list[BatchHeader]) -> _Run:
    return _Run(
        segment,
        headers[0].position,
        headers[-1].next_position,
        headers[0].base_offset,
        headers[-1].last_offset,
        sum(header.records_count for header in headers if not header.is_control),
        # (a codec id no codec has is damage, reported batch by batch)
        all(header.magic == CURRENT_MAGIC and header.stored_uncompressed for header in headers),
    )


def _run_bytes(run: _Run) -> int:
    return run.end - run.start


def _batch_bytes(item: tuple[LogSegment, BatchHeader, memoryview]) -> int:
    return len(item[2])


def _checked_ahead(header: BatchHeader, batch: memoryview) -> bool:
    """Whether the reading thread checks this batch (see CHECKED_AHEAD_RECORD_BYTES)."""
    return len(batch) < header.records_count * CHECKED_AHEAD_RECORD_BYTES


def _small_checked(
    batches: Iterator[tuple[LogSegment, BatchHeader, memoryview]],
) -> Iterator[tuple[LogSegment, BatchHeader, memoryview]]:
    """The batches, those of small records checked (by the reading thread, which runs this)."""
    for item in batches:
        segment, header, batch = item
        if _checked_ahead(header, batch):
            segment.check(header, batch)
        yield item


class _Consumer:
    """The partitions being consumed and how many records have been printed."""

    def __init__(self, cursors: list[_Cursor], out: BinaryIO, max_messages: int | None) -> None:
        self.cursors = cursors
        self.out = out
        self.max_messages = max_messages
        self.count = 0
        self.stop: _Stop | None = None  # (the signals that end it: see `_Stop`)

    @property
    def done(self) -> bool:
        return self.max_messages is not None and self.count >= self.max_messages

    def _room(self) -> int | None:
        return None if self.max_messages is None else self.max_messages - self.count

    def write_available(self) -> int:
        """Every partition's records up to its log end offset now, in partition order; how many.
        Records are counted before they are written: a signal during a write (unbuffered output
        is on the reader's side then) leaves them counted."""
        before = self.count
        for cursor in self.cursors:
            # (closed here when a write fails, `| head`: its reading threads stop now)
            with contextlib.closing(cursor.rendered(self._room)) as rendered:
                for lines, records in rendered:
                    self.count += records
                    self._out(lambda: self.out.write(lines))  # noqa: B023 (called here, at once)
                    if self.stop is not None:
                        self.stop.check()
        return self.count - before

    def flush(self) -> None:
        self._out(self.out.flush)

    def _out(self, write: Callable[[], object]) -> None:
        """A write to stdout, which a signal may end at once (a reader that does not read holds
        it; it holds no lock of the engine's)."""
        stop = self.stop
        if stop is not None:
            stop.writing = True
        try:
            with _writing_out():
                write()
        finally:
            if stop is not None:
                stop.writing = False


@contextmanager
def _writing_out() -> Iterator[None]:
    """A write to stdout that fails (a full disk under `> file`) says it was stdout: one line,
    `seglogfs: standard output: No space left on device`, as the CLI prints an OSError's file.
    (A reader that went away, BrokenPipeError, ends the consumer quietly, as ever.)"""
    try:
        yield
    except BrokenPipeError:
        raise
    except OSError as error:
        if error.filename is not None:
            raise
        raise OSError(error.errno, error.strerror, "standard output") from None


def _partitions(data_dir: DataDir, args: argparse.Namespace) -> list[PartitionLog]:
    if args.partition is not None:
        log = data_dir.partition(args.topic, args.partition)
        log.check_online()  # (the partition asked for: its reason is the answer; a topic's others are read)
        return [log]
    logs = [data_dir.partition(args.topic, p) for p in data_dir.topics().get(args.topic, [])]
    if not logs:
        data_dir.partition(args.topic, 0)  # raises the unknown-topic error
    if args.offset is not None and len(logs) > 1:
        raise UsageError(f"--offset needs --partition: topic {args.topic!r} has {len(logs)} partitions")
    return logs


class _Stop:
    """A signal that ends the consumer, SIGTERM or Ctrl-C (Kafka's console consumer shuts down on
    both): its handler only notes it (and wakes the follower's wait through a pipe), and the
    consumer ends where it holds nothing, between two writes or at the follower's wait, with
    KeyboardInterrupt; in a write to stdout (which a reader that does not read may hold for
    ever) at once. (Raised by the handler itself, it came wherever the main thread was, in a
    lock's acquire too: the lock stayed taken, and closing the data dir then waited on it for
    ever.)"""

    def __init__(self) -> None:
        self.requested = False
        self.writing = False  # (in a write to stdout, which the signal ends at once)
        self.wakeup, self._wake = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)

    def handle(self, signum: int, frame: FrameType | None) -> None:
        self.requested = True
        with contextlib.suppress(OSError):  # (full: a wake-up is pending already)
            os.write(self._wake, b"\0")
        if self.writing:
            raise KeyboardInterrupt

    def check(self) -> None:
        if self.requested:
            raise KeyboardInterrupt

    def close(self) -> None:
        os.close(self.wakeup)
        os.close(self._wake)


@contextmanager
def _signals_stop(consumer: _Consumer) -> Iterator[None]:
    """SIGTERM, and SIGINT unless it is ignored (a job started in the background), end the
    consumer at its next safe point (`_Stop`) while the block runs."""
    if threading.current_thread() is not threading.main_thread():
        yield  # (signal handlers belong to the main thread; an in-process caller's thread keeps its own)
        return
    stop = _Stop()
    previous = {signal.SIGTERM: signal.signal(signal.SIGTERM, stop.handle)}
    if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:
        previous[signal.SIGINT] = signal.signal(signal.SIGINT, stop.handle)
    consumer.stop = stop
    try:
        yield
        stop.check()  # (a signal during the last steps: as if it came at the end)
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        consumer.stop = None
        stop.close()


class _Follower:
    """The wait at the log end: every poll interval each partition takes in what the writer did
    (`PartitionLog.refresh`: a stat of its dir and last segment) and what is new is printed, until
    the timeout or the message count ends it. The wait returns at once when stdout's reader goes
    away, so `| head` ends a follower that has nothing new to write."""

    def __init__(self, consumer: _Consumer, timeout_ms: int | None) -> None:
        self.consumer = consumer
        self.timeout_ms = timeout_ms
        self.poller = select.poll()
        # POLLERR, POLLHUP: a pipe's reader closed it. (Not a descriptor, an in-process caller's
        # buffer: a write will tell.)
        with contextlib.suppress(OSError, ValueError, AttributeError):
            self.poller.register(consumer.out.fileno(), 0)
        if consumer.stop is not None:  # (a signal wakes the wait)
            self.poller.register(consumer.stop.wakeup, select.POLLIN)

    def run(self) -> None:
        consumer = self.consumer
        last_record = time.monotonic()
        while not consumer.done:
            idle_ms = (time.monotonic() - last_record) * 1000
            if self.timeout_ms is not None and idle_ms >= self.timeout_ms:
                return
            wait_ms = POLL_MS if self.timeout_ms is None else min(POLL_MS, self.timeout_ms - idle_ms)
            events = self.poller.poll(max(wait_ms, 0))
            if consumer.stop is not None:
                consumer.stop.check()
            if any(event & (select.POLLERR | select.POLLHUP) for _, event in events):
                raise BrokenPipeError  # `| head` took what it wanted while nothing new came
            for cursor in consumer.cursors:
                cursor.log.refresh(now_ms())
            if consumer.write_available():
                consumer.flush()
                last_record = time.monotonic()


def _tell(line: str) -> None:
    print(f"seglogfs: {line}", file=sys.stderr, flush=True)


def cmd_consume(args: argparse.Namespace) -> int:
    topic = Partitions(topics=frozenset([args.topic]))  # (of a backup in object storage: nothing else fetched)
    config = broker_config(args, stored=True, partitions=topic)
    properties = key_values(args.property, "--property")
    text_format = TextFormat.from_properties(properties) if args.format == "text" else None
    if sum(x is not None and x is not False for x in (args.from_beginning or None, args.offset, args.timestamp)) > 1:
        raise UsageError("give one of --from-beginning, --offset and --timestamp")
    if args.timeout_ms is not None and args.timeout_ms < 0:
        raise UsageError(f"--timeout-ms {args.timeout_ms}: expected a number of milliseconds, 0 or more")
    if args.timestamp is not None:
        parse_timestamp(args.timestamp)  # fail before opening anything
    follow = args.follow or args.timeout_ms is not None
    incomplete = incomplete_backup(config.log_dirs)
    if incomplete is not None:  # (its records are read as far as the copy got; the reader is told)
        print(f"seglogfs: {incomplete}", file=sys.stderr, flush=True)
    consumer = _Consumer([], sys.stdout.buffer, args.max_messages)
    try:
        with _signals_stop(consumer), DataDir.open(config, read_only=True, now_ms=now_ms()) as data_dir:
            consumer.cursors = [
                _Cursor(log, _start_offset(args, log), text_format, args.isolation_level == READ_COMMITTED)
                for log in _partitions(data_dir, args)
            ]
            consumer.write_available()
            consumer.flush()
            if follow:
                if is_object_store_uri(args.datadir):  # (new backup runs appear as a writer's appends)
                    open_stored(args.datadir, topic).follow(FOLLOW_INTERVAL_S, _tell)
                _Follower(consumer, args.timeout_ms).run()
    except BrokenPipeError:
        quiet_broken_pipe()
        return EXIT_OK
    except KeyboardInterrupt:
        try:
            consumer.flush()
        except BrokenPipeError:
            quiet_broken_pipe()
            return EXIT_OK
    print(f"Processed a total of {consumer.count} messages", file=sys.stderr)
    return EXIT_OK
