"""What every `seglogfs` command shares: exit codes, the common arguments (DATADIR, `-c`,
`--override`), the clock, `key=value` lists, JSON output and a reader that went away.

Exit codes (the CLI's contract, in `seglogfs --help`):
    0  success
    1  the data or the input is bad (corrupt, out of range, malformed, unknown topic, missing dir)
    2  the command line is wrong
    3  the data dir is locked by another process (a mount, a broker, another writer)
    4  `check` found problems (after `--repair`: problems it could not repair), or DATADIR is a
       backup that did not complete
    5  the mount point is in use: already mounted, not empty (without -o nonempty), a dead mount
       of another filesystem; for umount, busy
    6  umount: no seglogfs mount there (nothing mounted, or another filesystem)
    7  `check` found no problems, but records are set aside beside a log dir (recovery or a
       repair cut them), until an operator removes the place
    70 an internal error (a bug): one line, the traceback with SEGLOGFS_DEBUG=1
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

from seglogfs.engine import BrokerConfig, UnknownTopicOrPartitionError
from seglogfs.engine.object_store import ObjectStore, is_object_store_uri, parse_location
from seglogfs.engine.stored.catalogue import catalogue_runs
from seglogfs.engine.stored.local_copy import EVERY_PARTITION, LocalCopy, Partitions, shared_copy
from seglogfs.mount_tools.mountpoints import mount_containing, real

EXIT_OK = 0
EXIT_DATA = 1
EXIT_USAGE = 2
EXIT_LOCKED = 3
EXIT_CHECK_FAILED = 4
EXIT_SET_ASIDE = 7
EXIT_INTERNAL = 70  # EX_SOFTWARE
EPILOG = (
    "Exit codes: 0 ok, 1 bad data or input, 2 bad command line, 3 data dir locked, "
    "4 check found problems (or an incomplete backup), 5 mount point in use, 6 not a seglogfs mount (umount), "
    "7 check: records set aside beside the data dir."
)


class UsageError(Exception):
    """A command line that parses but does not make sense (exit 2)."""


class Parser(argparse.ArgumentParser):
    """argparse with one-line errors: `seglogfs consume: argument --max-messages: invalid int value:
    'x' (see seglogfs consume --help)`, exit 2, instead of the usage block."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: {message} (see {self.prog} --help)\n")


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def add_common(parser: argparse.ArgumentParser, *, long_config: bool = True) -> None:
    """DATADIR, `-c server.properties` and `--override`. Without `long_config` the properties file
    is `-c` only, for the commands whose `--config` is a topic config, as in kafka-topics."""
    parser.add_argument("datadir", metavar="DATADIR", help="log dir, or several separated by commas (log.dirs)")
    names = ("-c", "--config") if long_config else ("-c",)
    parser.add_argument(*names, dest="config", type=Path, metavar="server.properties", help="broker properties file")
    parser.add_argument("--override", action="append", metavar="KEY=VALUE", help="a broker config setting (repeatable)")


def broker_config(
    args: argparse.Namespace, *, stored: bool = False, partitions: Partitions = EVERY_PARTITION
) -> BrokerConfig:
    """The broker config of the command's DATADIR (log dirs separated by commas), `-c` and
    `--override`. A seglogfs mount point given as DATADIR is refused in one line: the mount
    point holds topics as directories, not Kafka's layout (read with `MNT/.logdir`, or give the
    data dir the mount serves).

    A commands that only reads (`stored`) also takes a backup in object storage as DATADIR
    (`s3://bucket/prefix`): the config is then of its local copy (`open_stored`, with the
    `partitions` the command reads laid out); the others refuse one in a line."""
    if is_object_store_uri(args.datadir):
        if not stored:
            try:
                shown = parse_location(args.datadir).display
            except ValueError as error:
                raise UsageError(str(error)) from None
            raise UsageError(
                f"{shown} is a backup in object storage, which this command does not change: "
                "`seglogfs restore URI DATADIR` copies it to a disk"
            )
        copy = open_stored(args.datadir, partitions)
        return BrokerConfig.load(args.config, args.override or (), log_dirs=copy.log_dirs)
    dirs = [Path(part) for part in args.datadir.split(",") if part]
    if not dirs:
        raise UsageError("DATADIR names no directory")
    for log_dir in dirs:
        entry = mount_containing(real(log_dir))
        if entry is not None and entry.is_seglogfs and entry.mount_point == real(log_dir):
            raise UsageError(
                f"{log_dir} is a seglogfs mount of {entry.source}: give that data dir, "
                f"or {log_dir / '.logdir'} to read it through the mount"
            )
    return BrokerConfig.load(args.config, args.override or (), log_dirs=dirs)


def open_stored(uri: str, partitions: Partitions = EVERY_PARTITION) -> LocalCopy:
    """The backup at `uri` read where it is: the process's local copy of its newest complete run
    (engine.stored.local_copy.shared_copy: of `partitions`, indexes and checkpoints fetched, each
    segment's bytes as they are read), removed when the command ends. UsageError for a malformed
    URI."""
    try:
        return shared_copy(uri, partitions)
    except ValueError as error:
        raise UsageError(str(error)) from None


def stored_file(uri: str) -> Path:
    """A file of a backup in object storage named by URI (`s3://bucket/prefix/topic-0/….log`),
    fetched whole into its backup's local copy (`open_stored`): the prefix is the longest one
    above the file that holds a complete backup. FileNotFoundError when none does, or its newest
    run has no such file."""
    base, _, query = uri.partition("?")
    scheme, _, rest = base.partition("://")
    parts = rest.rstrip("/").split("/")
    for cut in range(len(parts) - 1, 0, -1):
        prefix = f"{scheme}://{'/'.join(parts[:cut])}" + (f"?{query}" if query else "")
        if catalogue_runs(ObjectStore(parse_location(prefix))):
            return open_stored(prefix).materialize("/".join(parts[cut:]))
    raise FileNotFoundError(f"{parse_location(uri).display}: in no complete backup")


def require_data_dirs(config: BrokerConfig) -> None:
    """Refuse a DATADIR that does not exist (exit 1), for the commands that would otherwise create
    an empty one (a writable open makes missing log dirs, as a broker does)."""
    for log_dir in config.log_dirs:
        if not log_dir.is_dir():
            raise UnknownTopicOrPartitionError(f"{log_dir}: no such data dir")


def key_values(items: Sequence[str] | None, option: str) -> dict[str, str]:
    """Repeated `key=value` arguments as a dict (the last one of a key wins); UsageError naming
    `option` for an item without `=` or a key."""
    out = {}
    for item in items or ():
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise UsageError(f"{option} {item!r}: expected key=value")
        out[key.strip()] = value
    return out


def print_json(document: Any) -> None:
    """One JSON document on stdout (indented, keys as given, a final newline)."""
    sys.stdout.write(json.dumps(document, indent=2) + "\n")


def quiet_broken_pipe() -> None:
    """The reader went away (`| head`): stop quietly, as a Unix tool does. What is still buffered
    for stdout goes to /dev/null, so the interpreter's last flush cannot fail again."""
    discard_stdout()


def discard_stdout() -> None:
    """What is still buffered for stdout, and anything written after, goes to /dev/null: the
    interpreter's last flush can neither fail (a reader gone) nor block (a reader that does not
    read: a full pipe would hold an interrupted run from exiting)."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
