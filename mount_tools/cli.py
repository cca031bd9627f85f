"""The `seglogfs` command line.

Every command takes `-c server.properties` and repeatable `--override key=value` (Kafka's config
names), and a DATADIR: one log dir, or several separated by commas, like `log.dirs`.

Exit codes:
    0  success
    1  the data or the input is bad (corrupt, out of range, malformed, too large, …)
    2  the command line is wrong
    3  the data dir is locked by another process
    4  `check` found problems (after `--repair`: problems it could not repair)
    70 an internal error (a bug): one line, the traceback with SEGLOGFS_DEBUG=1
Errors are one line on stderr, `seglogfs: <what and where>`, with no traceback.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import BinaryIO

from seglogfs.engine import BrokerConfig, DataDir, EngineError, LogDirLockedError, PartitionLog
from seglogfs.engine.check import check_log_dirs
from seglogfs.engine.console_formats import LineFormat, TextFormat
from seglogfs.engine.errors import ConfigError, CorruptRecordError, InvalidRecordError, OffsetOutOfRangeError
from seglogfs.engine.producer import LineSplitter, Producer
from seglogfs.engine.renderers import JsonLinesRenderer, TextRenderer
from seglogfs.engine.timestamps import parse_timestamp
from seglogfs.mount_tools import dump, mounting
from seglogfs.mount_tools.progress import Progress

EXIT_OK = 0
EXIT_DATA = 1
EXIT_USAGE = 2
EXIT_LOCKED = mounting.EXIT_LOCKED
EXIT_CHECK_FAILED = 4
EXIT_INTERNAL = 70  # EX_SOFTWARE

_PRODUCE_CHUNK_BYTES = 1 << 20


def now_ms() -> int:
    return time.time_ns() // 1_000_000


class UsageError(Exception):
    """A command line that parses but does not make sense."""


def _properties(items: Sequence[str] | None) -> dict[str, str]:
    out = {}
    for item in items or ():
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise UsageError(f"--property {item!r}: expected key=value")
        out[key.strip()] = value
    return out


def _broker_config(args: argparse.Namespace) -> BrokerConfig:
    dirs = [Path(part) for part in args.datadir.split(",") if part]
    if not dirs:
        raise UsageError("DATADIR names no directory")
    return BrokerConfig.load(args.config, args.override or (), log_dirs=dirs)


# -- produce --------------------------------------------------------------------------------------
def cmd_produce(args: argparse.Namespace) -> int:
    config = _broker_config(args)
    properties = _properties(args.property)
    line_format = LineFormat.from_properties(properties) if args.format == "text" else None
    if args.format == "jsonl" and properties:
        raise UsageError("--property applies to --format text only")
    stored = 0
    with DataDir.open(config, now_ms=now_ms()) as data_dir:
        producer = Producer(data_dir.partition_for_append(args.topic, args.partition, now_ms=now_ms()), line_format)
        splitter = LineSplitter(max(log.config.max_message_bytes for log in producer.logs), "stdin")
        line_number = 1

        def send(lines: list[bytes]) -> None:
            nonlocal stored, line_number
            # Kafka's console producer has sent the lines before one it cannot parse.
            produced = producer.send(lines, now_ms(), "stdin", first_line=line_number, atomic=False)
            stored += produced.records
            line_number += len(lines)

        read = getattr(sys.stdin.buffer, "read1", sys.stdin.buffer.read)  # what is there, up to a chunk
        while chunk := read(_PRODUCE_CHUNK_BYTES):
            splitter.feed(chunk, send)
        send(splitter.finish())
        for log in producer.logs:
            log.flush()
    if args.verbose:
        print(f"seglogfs: stored {stored} records in topic {args.topic}", file=sys.stderr)
    return EXIT_OK


# -- consume --------------------------------------------------------------------------------------
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


def cmd_consume(args: argparse.Namespace) -> int:
    config = _broker_config(args)
    properties = _properties(args.property)
    text_format = TextFormat.from_properties(properties) if args.format == "text" else None
    if sum(x is not None and x is not False for x in (args.from_beginning or None, args.offset, args.timestamp)) > 1:
        raise UsageError("give one of --from-beginning, --offset and --timestamp")
    if args.timestamp is not None:
        parse_timestamp(args.timestamp)  # fail before opening anything
    count = 0
    out = sys.stdout.buffer
    with DataDir.open(config, read_only=True, now_ms=now_ms()) as data_dir:
        if args.partition is not None:
            logs = [data_dir.partition(args.topic, args.partition)]
        else:
            logs = [data_dir.partition(args.topic, p) for p in data_dir.topics().get(args.topic, [])]
            if not logs:
                data_dir.partition(args.topic, 0)  # raises the unknown-topic error
            if args.offset is not None and len(logs) > 1:
                raise UsageError(f"--offset needs --partition: topic {args.topic!r} has {len(logs)} partitions")
        try:
            for log in logs:
                start = _start_offset(args, log)
                remaining = None if args.max_messages is None else args.max_messages - count
                count += _write_records(out, log, start, text_format, remaining)
            out.flush()
        except BrokenPipeError:
            _quiet_broken_pipe()
            return EXIT_OK
    print(f"Processed a total of {count} messages", file=sys.stderr)
    return EXIT_OK


def _write_records(
    out: BinaryIO, log: PartitionLog, start: int, text_format: TextFormat | None, limit: int | None
) -> int:
    """Write the partition's records from `start` (at most `limit`), a batch at a time; how many."""
    text = TextRenderer(text_format, log.partition) if text_format is not None else None
    jsonl = JsonLinesRenderer(log.topic, log.partition)
    count = 0
    for segment, header, batch in log.batches(start):
        room = None if limit is None else limit - count
        if room is not None and room <= 0:
            break
        try:  # only the decoding: a failing write (a closed pipe) is no damage in the data
            rendered, records = (text or jsonl).render_some(header, batch, start, room)
        except Exception as error:  # a codec or varint error inside a batch whose CRC held
            raise CorruptRecordError(segment.log_path, header.position, f"undecodable records: {error}") from None
        out.write(rendered)
        count += records
    return count


def _quiet_broken_pipe() -> None:
    # The reader went away (`| head`): stop quietly, as a Unix tool does.
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())


# -- clean and delete-records ---------------------------------------------------------------------
def _print_unknown_configs(data_dir: DataDir) -> None:
    """One line naming the topics a pass leaves alone because their broker configs are unknown."""
    unknown = data_dir.unknown_config_topics()
    if unknown:
        reasons = "; ".join(sorted(set(unknown.values())))
        print(
            f"not deleted or compacted, broker configs unknown ({reasons}): {', '.join(sorted(unknown))}; "
            "set cleanup.policy in a topic's config, or --override log.cleanup.policy=delete|compact for all"
        )


def _print_plan(data_dir: DataDir, now: int) -> bool:
    """`clean --dry-run`: what a pass would delete and compact now; whether anything."""
    plan = data_dir.plan_cleanup(now)
    for log, decision in plan.retention:
        bases = ", ".join(str(segment.base_offset) for segment in decision.segments)
        kept = [segment for segment in log.segments if segment not in decision.segments]
        start = max(log.log_start_offset, kept[0].base_offset) if kept else log.log_end_offset
        print(
            f"{log.topic}-{log.partition}: would delete {len(decision.segments)} segments ({bases}) by "
            f"{decision.reason}; log start offset would be {start}"
        )
    for candidate in plan.compaction:
        log = candidate.log
        print(
            f"{log.topic}-{log.partition}: would compact offsets {candidate.first_dirty_offset}.."
            f"{candidate.first_uncleanable_offset - 1}: {candidate.cleanable_bytes} dirty bytes of "
            f"{candidate.total_bytes} (dirty ratio {candidate.cleanable_ratio:.2f})"
        )
    return bool(plan)


def cmd_clean(args: argparse.Namespace) -> int:
    config = _broker_config(args)
    now = now_ms() if args.now is None else args.now
    if args.dry_run:
        # Read-only: no lock, no recovery, no checkpoint written; not a byte changes.
        with DataDir.open(config, read_only=True, now_ms=now) as data_dir:
            planned = _print_plan(data_dir, now)
            _print_unknown_configs(data_dir)
        if not planned:
            print("nothing to delete or compact")
        return EXIT_OK
    with DataDir.open(config, now_ms=now) as data_dir:
        report = data_dir.clean(now)
        for log, decision in report.retention:
            bases = ", ".join(str(segment.base_offset) for segment in decision.segments)
            print(
                f"{log.topic}-{log.partition}: deleted {len(decision.segments)} segments ({bases}) by "
                f"{decision.reason}; log start offset now {log.log_start_offset}"
            )
        for result in report.compaction:
            stats = result.stats
            print(
                f"{result.topic}-{result.partition}: compacted offsets {result.first_dirty_offset}.."
                f"{result.next_dirty_offset - 1} ({stats.segments_cleaned} segments into {result.groups}): "
                f"{stats.records_read} records, {stats.bytes_read} bytes read, {stats.records_written} records, "
                f"{stats.bytes_written} bytes kept; {stats.elapsed_seconds:.2f} s"
            )
        for (topic, partition), reason in report.failed:
            print(f"{topic}-{partition}: not compacted: {reason}", file=sys.stderr)
        _print_unknown_configs(data_dir)
    if not report:
        print("nothing to delete or compact")
    return EXIT_DATA if report.failed else EXIT_OK


def cmd_delete_records(args: argparse.Namespace) -> int:
    config = _broker_config(args)
    with DataDir.open(config, now_ms=now_ms()) as data_dir:
        log = data_dir.partition(args.topic, args.partition)
        start = log.delete_records(args.offset, now_ms())
        print(f"{log.topic}-{log.partition}: log start offset (low watermark) is {start}")
    return EXIT_OK


# -- mount ----------------------------------------------------------------------------------------
def cmd_mount(args: argparse.Namespace) -> int:
    _view, _append, overrides, _flags = mounting.parse_mount_options(args.options)
    args.override = [*(args.override or ()), *overrides]
    return mounting.cmd_mount(args, _broker_config(args))


# -- check ----------------------------------------------------------------------------------------
def cmd_check(args: argparse.Namespace) -> int:
    config = _broker_config(args)
    dirs = list(config.log_dirs)
    total = sum(p.stat().st_size for d in dirs if d.is_dir() for p in d.glob("*/*.log"))
    with Progress("checking", total) as progress:
        report = check_log_dirs(dirs, progress.advance)
    for log_dir, pid in report.in_use_by.items():
        holder = f"process {pid}" if pid else "another process"
        print(f"seglogfs: {log_dir} is in use by {holder}: checked as a reader sees it", file=sys.stderr)
    if report.missing_indexes:
        print(
            f"seglogfs: {len(report.missing_indexes)} index files are missing (rebuilt from the log when the "
            f"data dir is next opened for writing), e.g. {report.missing_indexes[0]}",
            file=sys.stderr,
        )
    for problem in report.problems:
        print(problem)
    if report.problems and args.repair:
        if report.in_use_by:
            print("seglogfs: not repairing a data dir that another process holds", file=sys.stderr)
            return EXIT_LOCKED
        with DataDir.open(config, recover_all=True, now_ms=now_ms()):
            pass
        print(f"repaired: recovered every segment ({len(report.problems)} problems found before)")
        with Progress("re-checking", total) as progress:
            report = check_log_dirs(dirs, progress.advance)
        for problem in report.problems:
            print(f"still: {problem}")
    summary = (
        f"{report.partitions} partitions, {report.segments} segments, {report.batches} batches, "
        f"{report.records} records, {report.bytes} bytes: "
        + ("clean" if report.clean else f"{len(report.problems)} problems")
    )
    print(summary)
    return EXIT_OK if report.clean else EXIT_CHECK_FAILED


# -- entry point ----------------------------------------------------------------------------------
def _add_common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("datadir", metavar="DATADIR", help="log dir, or several separated by commas (log.dirs)")
    parser.add_argument("-c", "--config", type=Path, metavar="server.properties", help="broker properties file")
    parser.add_argument("--override", action="append", metavar="KEY=VALUE", help="a config setting (repeatable)")


_COMMANDS = ("produce", "consume", "dump", "clean", "delete-records", "mount", "umount", "check")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="seglogfs",
        description="Partitioned logs in Apache Kafka's on-disk format.",
        epilog="Exit codes: 0 ok, 1 bad data or input, 2 bad command line, 3 data dir locked, 4 check found problems.",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    produce = commands.add_parser("produce", help="append stdin lines as records (kafka-console-producer)")
    _add_common(produce)
    produce.add_argument("--topic", required=True)
    produce.add_argument("--partition", type=int)
    produce.add_argument("--format", choices=("text", "jsonl"), default="text")
    produce.add_argument(
        "--property", action="append", metavar="KEY=VALUE", help="parse.key, key.separator, null.marker"
    )
    produce.add_argument("-v", "--verbose", action="store_true", help="say how many records were stored")
    produce.set_defaults(handler=cmd_produce)

    consume = commands.add_parser("consume", help="print records (kafka-console-consumer)")
    _add_common(consume)
    consume.add_argument("--topic", required=True)
    consume.add_argument("--partition", type=int)
    consume.add_argument("--from-beginning", action="store_true")
    consume.add_argument("--offset", help="offset to start from (needs --partition), earliest or latest")
    consume.add_argument("--timestamp", help="start at the first record at or after this time (epoch ms or ISO-8601)")
    consume.add_argument("--max-messages", type=int)
    consume.add_argument("--format", choices=("text", "jsonl"), default="text")
    consume.add_argument(
        "--property",
        action="append",
        metavar="KEY=VALUE",
        help="print.key, print.offset, print.timestamp, print.partition, print.headers, "
        "key.separator, line.separator, null.literal",
    )
    consume.set_defaults(handler=cmd_consume)

    dump_parser = commands.add_parser("dump", help="print segment, index and time index files (kafka-dump-log)")
    dump.add_arguments(dump_parser)
    dump_parser.set_defaults(handler=dump.cmd_dump)

    clean = commands.add_parser("clean", help="one retention and compaction pass")
    _add_common(clean)
    clean.add_argument("--now", type=int, metavar="EPOCH_MS", help="the time to judge retention by (scripts)")
    clean.add_argument(
        "--dry-run", action="store_true", help="print what would be deleted or compacted, and change nothing"
    )
    clean.set_defaults(handler=cmd_clean)

    delete_records = commands.add_parser("delete-records", help="raise a partition's log start offset")
    _add_common(delete_records)
    delete_records.add_argument("--topic", required=True)
    delete_records.add_argument("--partition", type=int, required=True)
    delete_records.add_argument("--offset", type=int, required=True)
    delete_records.set_defaults(handler=cmd_delete_records)

    mount = commands.add_parser("mount", help="mount a data dir as a filesystem (topics and partitions as dirs)")
    _add_common(mount)
    mount.add_argument("mountpoint", metavar="MNT")
    mount.add_argument("-o", dest="options", action="append", metavar="OPT[,OPT...]", help="mount options")
    mount.add_argument("-f", "--foreground", action="store_true", help="stay in the foreground")
    mount.set_defaults(handler=cmd_mount)

    umount = commands.add_parser("umount", help="unmount a seglogfs mount")
    umount.add_argument("mountpoint", metavar="MNT")
    umount.set_defaults(handler=mounting.cmd_umount)

    check = commands.add_parser("check", help="verify every batch, index and checkpoint")
    _add_common(check)
    check.add_argument("--repair", action="store_true", help="recover every segment: cut torn tails, rebuild indexes")
    check.set_defaults(handler=cmd_check)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    arguments = list(sys.argv[1:] if argv is None else argv)
    if len(arguments) >= 2 and arguments[0] not in _COMMANDS and not arguments[0].startswith("-"):
        # `seglogfs SOURCE MNT -o opts`: how mount(8) and fstab run a FUSE filesystem
        # (`mount -t fuse.seglogfs SOURCE MNT`, through mount.fuse3).
        arguments = ["mount", *arguments]
    args = parser.parse_args(arguments)
    handler: Callable[[argparse.Namespace], int] = args.handler
    try:
        return handler(args)
    except UsageError as error:
        print(f"seglogfs: {error}", file=sys.stderr)
        return EXIT_USAGE
    except LogDirLockedError as error:
        print(f"seglogfs: {error}", file=sys.stderr)
        return EXIT_LOCKED
    except (ConfigError, InvalidRecordError, EngineError) as error:
        print(f"seglogfs: {error}", file=sys.stderr)
        return EXIT_DATA
    except OSError as error:
        where = f"{error.filename}: " if error.filename else ""
        print(f"seglogfs: {where}{error.strerror or error}", file=sys.stderr)
        return EXIT_DATA
    except KeyboardInterrupt:
        return 130
    except Exception as error:  # a bug: one line, the traceback only when asked for
        if os.environ.get("SEGLOGFS_DEBUG"):
            raise
        print(
            f"seglogfs: internal error: {type(error).__name__}: {error} (set SEGLOGFS_DEBUG=1 for the traceback)",
            file=sys.stderr,
        )
        return EXIT_INTERNAL


if __name__ == "__main__":
    sys.exit(main())
