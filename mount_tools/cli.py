"""The `seglogfs` command line: the parser, `produce`, `clean`, `delete-records`, `check` and the
entry point; `consume` (with `--follow`), `topics`, `config show`, `dump` and `mount` live in their
own modules.

Every command takes `-c server.properties` and repeatable `--override key=value` (Kafka's config
names), and a DATADIR: one log dir, or several separated by commas, like `log.dirs`. `topics` and
`config` take their action after the command, before or after DATADIR (`seglogfs topics DATADIR
create …` or `seglogfs topics create DATADIR …`). `check`, `clean` and `topics describe` print one
JSON document on stdout with `--json` (its keys in `_check_document`, `_plan_document`/
`_clean_document`, topics.describe_document).

Long work shows its progress on stderr (mount_tools.progress): `produce` (of a file or a pipe;
not of lines typed at a terminal), `check` (and its re-check after `--repair`), `clean` and
`clean --dry-run`, `backup` and `restore`. On a terminal a line redrawn in place and erased at the
end; off one, nothing unless the run lasts: then one plain line after 5 s and at most one every
10 s. With `--json` the terminal's line still shows (stderr only, erased before the document is
printed: stdout holds the JSON document and nothing else), but no plain lines are written.

Exit codes (mount_tools.common):
    0  success
    1  the data or the input is bad (corrupt, out of range, malformed, too large, unknown topic,
       missing data dir, …)
    2  the command line is wrong
    3  the data dir is locked by another process
    4  `check` found problems (after `--repair`: problems it could not repair), or DATADIR is a
       backup that did not complete (`seglogfs backup` cut short or failed)
    7  `check` found no problems, but records are set aside beside a log dir (by recovery or a
       repair: see engine.log.set_aside) until an operator removes the place (`rm -r`)
    70 an internal error (a bug): one line, the traceback with SEGLOGFS_DEBUG=1
Errors are one line on stderr, `seglogfs: <what and where>` (a bad command line:
`seglogfs COMMAND: <what> (see seglogfs COMMAND --help)`), with no traceback. A reader that goes
away (`| head`) ends any command quietly with status 0, but `backup` and `restore`: a copy cut
short exits 1 (quietly too), as its work is not done.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import stat
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from seglogfs.engine import DataDir, EngineError, LogDirLockedError, _core
from seglogfs.engine.check import CheckReport, PlannedRepair, check_log_dirs, plan_repair
from seglogfs.engine.errors import ConfigError, InvalidRecordError
from seglogfs.engine.log.set_aside import SetAsidePiece, SetAsideRun, place_for
from seglogfs.engine.object_store import is_object_store_uri
from seglogfs.engine.producer import LineSplitter, Producer
from seglogfs.engine.text.console_formats import LineFormat
from seglogfs.mount_tools import backup, configs, consume, dump, groups, mounting, topics
from seglogfs.mount_tools.common import (
    EPILOG,
    EXIT_CHECK_FAILED,
    EXIT_DATA,
    EXIT_INTERNAL,
    EXIT_LOCKED,
    EXIT_OK,
    EXIT_SET_ASIDE,
    EXIT_USAGE,
    Parser,
    UsageError,
    add_common,
    broker_config,
    key_values,
    now_ms,
    print_json,
    quiet_broken_pipe,
    require_data_dirs,
)
from seglogfs.mount_tools.progress import Progress, format_bytes

_PRODUCE_CHUNK_BYTES = 1 << 20
# Rendered batches (consume, the mount's views) are blocks of up to a few MiB made and freed by
# the thousand: the allocator keeps freed ones for reuse, rather than map fresh pages for each
# and fault every page in again (see _core.keep_freed_memory).
_REUSED_BLOCK_BYTES = 8 << 20


# -- produce --------------------------------------------------------------------------------------
def _input_bytes(fd: int) -> int | None:
    """The bytes left to read of stdin when it is a regular file (`< big.txt`), from its size and
    where its offset stands; None for a pipe, a socket, a terminal (the size is not known ahead)."""
    try:
        status = os.fstat(fd)
        if not stat.S_ISREG(status.st_mode):
            return None
        return max(status.st_size - os.lseek(fd, 0, os.SEEK_CUR), 0)
    except OSError:
        return None


def cmd_produce(args: argparse.Namespace) -> int:
    config = broker_config(args)
    properties = key_values(args.property, "--property")
    line_format = LineFormat.from_properties(properties) if args.format == "text" else None
    if args.format == "jsonl" and properties:
        raise UsageError("--property applies to --format text only")
    stored = 0
    with DataDir.open(config, now_ms=now_ms()) as data_dir:
        producer = Producer(data_dir.partition_for_append(args.topic, args.partition, now_ms=now_ms()), line_format)
        splitter = LineSplitter(max(log.config.max_message_bytes for log in producer.logs), "stdin")
        line_number = 1

        def send(lines: list[bytes]) -> int:
            nonlocal stored, line_number
            # Kafka's console producer has sent the lines before one it cannot parse.
            produced = producer.send(lines, now_ms(), "stdin", first_line=line_number, atomic=False)
            stored += produced.records
            line_number += len(lines)
            return produced.records

        stdin = sys.stdin.buffer
        read = getattr(stdin, "read1", stdin.read)  # what is there, up to a chunk
        # Counted per chunk read (up to 1 MiB), never per record. Lines typed at a terminal get no line.
        with Progress("produce", _input_bytes(stdin.fileno()), records=True, quiet=stdin.isatty()) as progress:
            while chunk := read(_PRODUCE_CHUNK_BYTES):
                progress.advance(len(chunk), splitter.feed(chunk, send))
            progress.advance(0, send(splitter.finish()))
            for log in producer.logs:
                log.flush()
    if args.verbose:
        print(f"seglogfs: stored {stored} records in topic {args.topic}", file=sys.stderr)
    return EXIT_OK


# -- clean and delete-records ---------------------------------------------------------------------
def _unknown_configs_line(unknown: dict[str, str]) -> str:
    """The line naming the topics a pass leaves alone because their broker configs are unknown."""
    reasons = "; ".join(sorted(set(unknown.values())))
    return (
        f"not deleted or compacted, broker configs unknown ({reasons}): {', '.join(sorted(unknown))}; "
        "set cleanup.policy in a topic's config, or --override log.cleanup.policy=delete|compact for all"
    )


def _plan_document(data_dir: DataDir, now: int) -> dict[str, Any]:
    """`clean --dry-run`: what a pass would delete and compact now, as `clean --json` documents it."""
    plan = data_dir.plan_cleanup(now)
    retention = []
    for log, decision in plan.retention:
        kept = [segment for segment in log.segments if segment not in decision.segments]
        start = max(log.log_start_offset, kept[0].base_offset) if kept else log.log_end_offset
        retention.append(
            {
                "topic": log.topic,
                "partition": log.partition,
                "segments": [segment.base_offset for segment in decision.segments],
                "reason": decision.reason,
                "logStartOffset": start,
            }
        )
    compaction = [
        {
            "topic": candidate.log.topic,
            "partition": candidate.log.partition,
            "firstDirtyOffset": candidate.first_dirty_offset,
            "firstUncleanableOffset": candidate.first_uncleanable_offset,
            "cleanableBytes": candidate.cleanable_bytes,
            "totalBytes": candidate.total_bytes,
            "cleanableRatio": candidate.cleanable_ratio,
        }
        for candidate in plan.compaction
    ]
    return {
        "dryRun": True,
        "now": now,
        "retention": retention,
        "compaction": compaction,
        "failed": [],
        "unknownConfigs": dict(sorted(data_dir.unknown_config_topics().items())),
    }


def _clean_document(data_dir: DataDir, now: int) -> dict[str, Any]:
    """`clean`: one pass, and what it did (keys as in `_plan_document`, `dryRun` false)."""
    report = data_dir.clean(now)
    retention = [
        {
            "topic": log.topic,
            "partition": log.partition,
            "segments": [segment.base_offset for segment in decision.segments],
            "reason": decision.reason,
            "logStartOffset": log.log_start_offset,
        }
        for log, decision in report.retention
    ]
    compaction = [
        {
            "topic": result.topic,
            "partition": result.partition,
            "firstDirtyOffset": result.first_dirty_offset,
            "nextDirtyOffset": result.next_dirty_offset,
            "segmentsCleaned": result.stats.segments_cleaned,
            "groups": result.groups,
            "recordsRead": result.stats.records_read,
            "bytesRead": result.stats.bytes_read,
            "recordsWritten": result.stats.records_written,
            "bytesWritten": result.stats.bytes_written,
            "elapsedSeconds": result.stats.elapsed_seconds,
        }
        for result in report.compaction
    ]
    return {
        "dryRun": False,
        "now": now,
        "retention": retention,
        "compaction": compaction,
        "failed": [{"topic": t, "partition": p, "reason": reason} for (t, p), reason in report.failed],
        "unknownConfigs": dict(sorted(data_dir.unknown_config_topics().items())),
    }


def _print_cleanup(document: dict[str, Any]) -> None:
    would = document["dryRun"]
    for item in document["retention"]:
        bases = ", ".join(str(base) for base in item["segments"])
        print(
            f"{item['topic']}-{item['partition']}: {'would delete' if would else 'deleted'} "
            f"{len(item['segments'])} segments ({bases}) by {item['reason']}; log start offset "
            f"{'would be' if would else 'now'} {item['logStartOffset']}"
        )
    for item in document["compaction"]:
        name = f"{item['topic']}-{item['partition']}"
        if would:
            print(
                f"{name}: would compact offsets {item['firstDirtyOffset']}..{item['firstUncleanableOffset'] - 1}: "
                f"{item['cleanableBytes']} dirty bytes of {item['totalBytes']} "
                f"(dirty ratio {item['cleanableRatio']:.2f})"
            )
        else:
            print(
                f"{name}: compacted offsets {item['firstDirtyOffset']}..{item['nextDirtyOffset'] - 1} "
                f"({item['segmentsCleaned']} segments into {item['groups']}): {item['recordsRead']} records, "
                f"{item['bytesRead']} bytes read, {item['recordsWritten']} records, {item['bytesWritten']} bytes "
                f"kept; {item['elapsedSeconds']:.2f} s"
            )
    for item in document["failed"]:
        print(f"seglogfs: {item['topic']}-{item['partition']}: not compacted: {item['reason']}", file=sys.stderr)
    if document["unknownConfigs"]:
        print(_unknown_configs_line(document["unknownConfigs"]))
    if not (document["retention"] or document["compaction"] or document["failed"]):
        print("nothing to delete or compact")


def _extent(data_dir: DataDir) -> str:
    """`12 partitions, 3.3 GB`: what a cleanup pass goes over, for its progress line."""
    logs = list(data_dir.partitions())
    return f"{len(logs)} partitions, {format_bytes(sum(log.size_in_bytes() for log in logs))}"


def cmd_clean(args: argparse.Namespace) -> int:
    config = broker_config(args)
    require_data_dirs(config)
    now = now_ms() if args.now is None else args.now
    # A pass reports what it did only at its end (DataDir.clean and plan_cleanup take no progress
    # callback): the line shows the phase and the time so far, redrawn by a ticker.
    with Progress("clean", phase="opening the data dir", plain=not args.json, tick=True) as progress:
        if args.dry_run:
            # Read-only: no lock, no recovery, no checkpoint written; not a byte changes.
            with DataDir.open(config, read_only=True, now_ms=now) as data_dir:
                progress.phase = f"planning (dry run) over {_extent(data_dir)}"
                document = _plan_document(data_dir, now)
        else:
            with DataDir.open(config, now_ms=now) as data_dir:
                progress.phase = f"retention and compaction of {_extent(data_dir)}"
                document = _clean_document(data_dir, now)
                progress.phase = "closing the data dir"
    if args.json:
        print_json(document)
    else:
        _print_cleanup(document)
    return EXIT_DATA if document["failed"] else EXIT_OK


def cmd_delete_records(args: argparse.Namespace) -> int:
    config = broker_config(args)
    require_data_dirs(config)
    with DataDir.open(config, now_ms=now_ms()) as data_dir:
        log = data_dir.partition(args.topic, args.partition)
        start = log.delete_records(args.offset, now_ms())
        print(f"{log.topic}-{log.partition}: log start offset (low watermark) is {start}")
    return EXIT_OK


# -- mount ----------------------------------------------------------------------------------------
def cmd_mount(args: argparse.Namespace) -> int:
    _view, _append, overrides, _flags = mounting.parse_mount_options(args.options)
    args.override = [*(args.override or ()), *overrides]
    if is_object_store_uri(args.datadir):  # (opened by the mount's own process)
        return mounting.cmd_mount(args, None)
    return mounting.cmd_mount(args, broker_config(args))


# -- check ----------------------------------------------------------------------------------------
def _piece_document(piece: SetAsidePiece) -> dict[str, Any]:
    return {"path": str(piece.path), **piece.to_json()}


def _set_aside_document(runs: list[SetAsideRun]) -> list[dict[str, Any]]:
    return [
        {
            "place": str(run.place),
            "records": run.records,
            "pieces": [_piece_document(piece) for piece in run.pieces],
            "problem": run.problem,
        }
        for run in runs
    ]


def _check_document(dirs: list[Path], report: CheckReport, incomplete: str | None = None) -> dict[str, Any]:
    """`check --json`: the report's figures, its problems and notes, what is set aside beside the
    log dirs (`clean` is false while anything is), `incompleteBackup` (the line saying DATADIR
    is a backup that did not complete, or null; `clean` is false then too); `repaired`,
    `problemsBeforeRepair` and `setAsideByRepair` are set by `--repair`, `repairPlan` by
    `--repair --dry-run`."""
    return {
        "logDirs": [str(d) for d in dirs],
        "clean": report.clean and not report.set_aside and incomplete is None,
        "incompleteBackup": incomplete,
        "partitions": report.partitions,
        "segments": report.segments,
        "batches": report.batches,
        "records": report.records,
        "bytes": report.bytes,
        "problems": [{"path": str(problem.path), "message": problem.message} for problem in report.problems],
        "missingIndexes": [str(path) for path in report.missing_indexes],
        "inUseBy": {str(log_dir): pid for log_dir, pid in report.in_use_by.items()},
        "setAside": _set_aside_document(report.set_aside),
        "repaired": False,
        "problemsBeforeRepair": [],
        "setAsideByRepair": [],
    }


def _print_set_aside(report: CheckReport, told: list[SetAsidePiece]) -> None:
    """Every piece set aside beside the log dirs but those `told` already (by the repair)."""
    paths = {piece.path for piece in told}
    for run in report.set_aside:
        if run.problem is not None:
            print(f"set aside: {run.place}: {run.problem}")
        for piece in run.pieces:
            if piece.path not in paths:
                print(f"set aside: {piece.path}: {piece.describe()}")


def _summary(report: CheckReport, dirs: list[Path], incomplete: str | None) -> str:
    """The last line: never `clean` while records are set aside beside a log dir, nor of a
    backup that did not complete."""
    figures = (
        f"{report.partitions} partitions, {report.segments} segments, {report.batches} batches, "
        f"{report.records} records, {report.bytes} bytes: "
    )
    if incomplete is not None:
        problems = f"{len(report.problems)} problems" if report.problems else "no problems"
        return figures + f"{problems}, but an incomplete backup (see above)"
    if not report.set_aside:
        return figures + ("clean" if report.clean else f"{len(report.problems)} problems")
    places = sorted({str(place_for(log_dir)) for log_dir in dirs if os.path.lexists(place_for(log_dir))})
    records = sum(run.records for run in report.set_aside)
    size = sum(piece.bytes for run in report.set_aside for piece in run.pieces)
    state = "no problems" if report.clean else f"{len(report.problems)} problems"
    return (
        figures + f"{state}, but {size} bytes ({records} records in intact batches) are set aside in "
        f"{', '.join(places)} (read them with seglogfs dump; rm -r the place once they are dealt with)"
    )


def _print_plan(plans: list[PlannedRepair]) -> None:
    if not plans:
        print("a repair would cut nothing: it would rebuild the indexes and finish or remove leftover files")
    for plan in plans:
        place = plan.pieces[0].place
        print(
            f"a repair would set aside {plan.records} records of {plan.partition_dir.name} in "
            f"{place.parent}/<time of the repair>/{place.name}:"
        )
        for piece in plan.pieces:
            print(f"  {piece.describe()}")


def cmd_check(args: argparse.Namespace) -> int:
    if args.dry_run and not args.repair:
        raise UsageError("--dry-run goes with --repair")
    config = broker_config(args, stored=not args.repair)
    require_data_dirs(config)
    dirs = list(config.log_dirs)
    # (lstat: a link named like a segment is measured, never followed; check reports it)
    total = sum(p.lstat().st_size for d in dirs for p in d.glob("*/*.log"))
    with Progress("check", total, plain=not args.json) as progress:
        report = check_log_dirs(dirs, progress.advance)
    # A backup cut short holds files that each check out, but not the source's state as a whole.
    incomplete = backup.incomplete_backup(dirs)
    text = not args.json
    if incomplete is not None:
        print(f"seglogfs: {incomplete}", file=sys.stderr)
    if text:
        for log_dir, pid in report.in_use_by.items():
            holder = f"process {pid}" if pid else "another process"
            print(f"seglogfs: {log_dir} is in use by {holder}: checked as a reader sees it", file=sys.stderr)
        if report.missing_indexes:
            print(
                f"seglogfs: {len(report.missing_indexes)} index files are missing (rebuilt from the log when "
                f"the data dir is next opened for writing), e.g. {report.missing_indexes[0]}",
                file=sys.stderr,
            )
        for problem in report.problems:
            print(problem)
    before = report
    kept: list[SetAsidePiece] = []
    plans: list[PlannedRepair] | None = None
    if report.problems and args.repair:
        if report.in_use_by:
            if not text:
                print_json(_check_document(dirs, report, incomplete))
            print("seglogfs: not repairing a data dir that another process holds", file=sys.stderr)
            return EXIT_LOCKED
        if args.dry_run:
            plans = plan_repair(dirs)
            if text:
                _print_plan(plans)
        else:
            with (
                Progress("check", phase="repairing: recovering every segment", plain=not args.json, tick=True),
                DataDir.open(config, recover_all=True, now_ms=now_ms()) as data_dir,
            ):
                kept = sorted(
                    (piece for log in data_dir.partitions() for piece in log.set_aside),
                    key=lambda piece: (str(piece.place), piece.source, piece.position),
                )
            if text:
                print(f"repaired: recovered every segment ({len(report.problems)} problems found before)")
                for piece in kept:
                    print(f"repair set aside {piece.path}: {piece.describe()}")
            with Progress("check (after repair)", total, plain=not args.json) as progress:
                report = check_log_dirs(dirs, progress.advance)
            if text:
                for problem in report.problems:
                    print(f"still: {problem}")
    if text:
        _print_set_aside(report, kept)
        print(_summary(report, dirs, incomplete))
    else:
        document = _check_document(dirs, report, incomplete)
        if report is not before:
            document["repaired"] = True
            document["problemsBeforeRepair"] = _check_document(dirs, before)["problems"]
            document["setAsideByRepair"] = [_piece_document(piece) for piece in kept]
        if plans is not None:
            document["repairPlan"] = [
                {
                    "partitionDir": str(plan.partition_dir),
                    "records": plan.records,
                    "pieces": [{"place": str(piece.place), **piece.to_json()} for piece in plan.pieces],
                }
                for plan in plans
            ]
        print_json(document)
    if report.problems or incomplete is not None:
        return EXIT_CHECK_FAILED
    return EXIT_SET_ASIDE if report.set_aside else EXIT_OK


# -- entry point ----------------------------------------------------------------------------------
_COMMANDS = (
    "produce",
    "consume",
    "topics",
    "groups",
    "config",
    "dump",
    "clean",
    "delete-records",
    "mount",
    "umount",
    "check",
    *backup.COMMANDS,
)
_ACTIONS = {"topics": topics.ACTIONS, "groups": groups.ACTIONS, "config": configs.ACTIONS}


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="seglogfs",
        description="Partitioned logs in Apache Kafka's on-disk format.",
        epilog=EPILOG,
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    produce = commands.add_parser(
        "produce", help="append stdin lines as records (kafka-console-producer)", epilog=EPILOG
    )
    add_common(produce)
    produce.add_argument("--topic", required=True)
    produce.add_argument("--partition", type=int)
    produce.add_argument("--format", choices=("text", "jsonl"), default="text")
    produce.add_argument(
        "--property", action="append", metavar="KEY=VALUE", help="parse.key, key.separator, null.marker"
    )
    produce.add_argument("-v", "--verbose", action="store_true", help="say how many records were stored")
    produce.set_defaults(handler=cmd_produce)

    consume_parser = commands.add_parser("consume", help="print records (kafka-console-consumer)", epilog=EPILOG)
    consume.add_arguments(consume_parser)
    consume_parser.set_defaults(handler=consume.cmd_consume)

    topics.add_parser(commands)
    groups.add_parser(commands)
    configs.add_parser(commands)

    dump_parser = commands.add_parser(
        "dump", help="print segment, index and time index files (kafka-dump-log)", epilog=EPILOG
    )
    dump.add_arguments(dump_parser)
    dump_parser.set_defaults(handler=dump.cmd_dump)

    clean = commands.add_parser("clean", help="one retention and compaction pass", epilog=EPILOG)
    add_common(clean)
    clean.add_argument("--now", type=int, metavar="EPOCH_MS", help="the time to judge retention by (scripts)")
    clean.add_argument(
        "--dry-run", action="store_true", help="print what would be deleted or compacted, and change nothing"
    )
    clean.add_argument("--json", action="store_true", help="one JSON document")
    clean.set_defaults(handler=cmd_clean)

    delete_records = commands.add_parser("delete-records", help="raise a partition's log start offset", epilog=EPILOG)
    add_common(delete_records)
    delete_records.add_argument("--topic", required=True)
    delete_records.add_argument("--partition", type=int, required=True)
    delete_records.add_argument("--offset", type=int, required=True)
    delete_records.set_defaults(handler=cmd_delete_records)

    mount = commands.add_parser(
        "mount", help="mount a data dir as a filesystem (topics and partitions as dirs)", epilog=EPILOG
    )
    add_common(mount)
    mount.add_argument("mountpoint", metavar="MNT")
    mount.add_argument("-o", dest="options", action="append", metavar="OPT[,OPT...]", help="mount options")
    mount.add_argument("-f", "--foreground", action="store_true", help="stay in the foreground")
    mount.set_defaults(handler=cmd_mount)

    umount = commands.add_parser("umount", help="unmount a seglogfs mount", epilog=EPILOG)
    umount.add_argument("mountpoint", metavar="MNT")
    umount.set_defaults(handler=mounting.cmd_umount)

    check = commands.add_parser("check", help="verify every batch, index and checkpoint", epilog=EPILOG)
    add_common(check)
    check.add_argument(
        "--repair",
        action="store_true",
        help="recover every segment as Kafka would: cut at damage, rebuild indexes; what is cut is set aside",
    )
    check.add_argument("--dry-run", action="store_true", help="with --repair: say what it would do, change nothing")
    check.add_argument("--json", action="store_true", help="one JSON document")
    check.set_defaults(handler=cmd_check)
    backup.add_commands(commands)
    return parser


def _normalise(arguments: list[str]) -> list[str]:
    """The command line in the parser's order."""
    if len(arguments) >= 2 and arguments[0] not in _COMMANDS and not arguments[0].startswith("-"):
        # `seglogfs SOURCE MNT -o opts`: how mount(8) and fstab run a FUSE filesystem
        # (`mount -t fuse.seglogfs SOURCE MNT`, through mount.fuse3).
        return ["mount", *arguments]
    actions = _ACTIONS.get(arguments[0]) if arguments else None
    if actions and len(arguments) >= 3 and arguments[1] not in actions and arguments[2] in actions:
        # `seglogfs topics DATADIR create …` (the data dir first, as every other command has it) is
        # `seglogfs topics create DATADIR …`.
        return [arguments[0], arguments[2], arguments[1], *arguments[3:]]
    return arguments


def _say(error: object, *also: str) -> None:
    """The error line: `seglogfs: <what and where>`, one line whatever the message holds; `also`:
    what failed after it because of it (closing the data dir on the same full disk), said in
    the same line."""
    line = " ".join(str(error).splitlines())
    if also:
        line += f" (then closing the data dir failed too: {'; '.join(also)})"
    print(f"seglogfs: {line}", file=sys.stderr)


class _LogLines(logging.Handler):
    """How the engine's log records reach stderr when a command runs (the mount sets up its
    own logging): `seglogfs: <message>`, one line each, WARNING and above. It stands in for
    Python's last-resort handler, which printed the bare message; `Progress` wraps it, erasing
    its line first. A record that follows an error the command is about to print (the data
    dir's close failing after the append that failed, `after_error`) is held, and said in that
    error's line: one error, one line."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.held: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        message = " ".join(record.getMessage().splitlines())
        if getattr(record, "after_error", None) is not None:
            self.held.append(message)
            return
        with contextlib.suppress(OSError, ValueError):  # (a stderr gone: the command goes on)
            print(f"seglogfs: {message}", file=sys.stderr, flush=True)

    def take_held(self) -> list[str]:
        held, self.held = self.held, []
        return held


def main(argv: Sequence[str] | None = None) -> int:
    _core.keep_freed_memory(_REUSED_BLOCK_BYTES)
    parser = build_parser()
    args = parser.parse_args(_normalise(list(sys.argv[1:] if argv is None else argv)))
    handler: Callable[[argparse.Namespace], int] = args.handler
    lines = _LogLines()
    previous, logging.lastResort = logging.lastResort, lines
    try:
        return _run(handler, args, lines)
    finally:
        logging.lastResort = previous
        for held in lines.take_held():  # (the command caught the error it followed: said on its own)
            with contextlib.suppress(OSError, ValueError):
                _say(held)


def _run(handler: Callable[[argparse.Namespace], int], args: argparse.Namespace, lines: _LogLines) -> int:
    """The command, its errors as one line each and the documented exit codes."""
    try:
        return handler(args)
    except BrokenPipeError:  # the reader went away (`| head`): quietly, as a Unix tool
        quiet_broken_pipe()
        return EXIT_OK
    except UsageError as error:
        _say(error)
        return EXIT_USAGE
    except LogDirLockedError as error:
        _say(error, *lines.take_held())
        return EXIT_LOCKED
    except (ConfigError, InvalidRecordError, EngineError) as error:
        _say(error, *lines.take_held())
        return EXIT_DATA
    except OSError as error:
        what = f"{error.filename}: {error.strerror or error}" if error.filename else (error.strerror or error)
        _say(what, *lines.take_held())
        return EXIT_DATA
    except KeyboardInterrupt:
        return 130
    except Exception as error:  # a bug: one line, the traceback only when asked for
        if os.environ.get("SEGLOGFS_DEBUG"):
            raise
        _say(f"internal error: {type(error).__name__}: {error} (set SEGLOGFS_DEBUG=1 for the traceback)")
        return EXIT_INTERNAL


if __name__ == "__main__":
    sys.exit(main())
