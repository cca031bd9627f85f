"""`seglogfs backup` and `seglogfs restore`: incremental, consistent copies of a data dir.

    seglogfs backup SRC DEST [--stats] [--json] [-v]
    seglogfs restore BACKUP DATADIR [--force] [--stats] [--json] [-v]

What a backup holds is the mount's `.logdir` mirror (engine.mirror): Kafka's layout with everything a
broker needs to start from the copy (meta.properties, bootstrap.checkpoint, quorum-state, KRaft
snapshots, producer snapshots, leader-epoch checkpoints, …), sealed segments as on disk, the
active segment up to its last whole batch, indexes cut to match, root checkpoints generated from
the logs; no `.lock`, no `.kafka_cleanshutdown` (a copy opens as after an unclean stop). SRC is:

* a seglogfs mount point (or its `.logdir`): the mount's mirror is read through the filesystem;
* a data dir (several log dirs separated by commas, as `log.dirs`): the same mirror is resolved
  in this process over a read-only open of it (no lock taken, nothing written), so a writer — a
  mount, `seglogfs produce`, a broker — goes on writing; the copy is the data dir as that open
  found it: each partition's active segment up to the last batch that was whole then.

With several log dirs the backup holds them as `0/`, `1/`, … (as `.logdir` does), and a restore
gives them back to as many DATADIRs. Modes are kept (the mirror shows the files' own, 0644/0755
as Kafka leaves them), and owners too when run as root (a mount shows its own user's).

Incremental rules, per file (rsync's quick check and --append-verify, by kind of file — rsync
itself cannot stop a growing file at a batch boundary, and its --append keeps a copy that is
longer than a compacted segment):

* segment files (`.log`, `.index`, `.timeindex`, `.txnindex`): unchanged when size and mtime
  match — sealed segments already in DEST are never sent again; a `.log` that grew (the active
  segment, or one sealed since) is appended to when DEST's copy is a prefix of it (its first
  4 KiB and last 64 KiB compare equal), else sent whole (compaction replaced it);
* every other file (checkpoints, snapshots, metadata: small, and generated ones change without
  their mtime) is compared byte for byte and sent whole when it differs;
* what is no longer in SRC (segments retention deleted, topics deleted) is deleted from DEST.

Order, so that DEST is consistent after an interruption too. In each directory the small files
and indexes are read first and staged beside their targets (`.NAME.PID.seglogfs-tmp`), then the
subdirectories and `.log` files are copied, then the staged files renamed into place, then what
SRC no longer holds deleted. Read first: a checkpoint or index read before the logs it describes
never points past the bytes copied of them (logs only grow, and the mirror cuts an active index
to the bytes it shows). Renamed last: an interrupted backup leaves old indexes and checkpoints
beside logs that only grew, which is what a crash leaves; the next backup finishes the work. Every
file written is fsynced, and each directory it changed.

DEST holds `.seglogfs-backup.json` (source, log dir count, times, `"complete"`) and a `.lock`
that the backup or restore holds (POSIX record lock, as Kafka's): two runs never write one dir at
once, and a writer cannot open it meanwhile. The manifest is how a backup says it is whole, as a
backup tool's catalogue does: each run writes it first with `"complete": false` (fsynced, before
it changes a file of DEST) and replaces it with `"complete": true` as its very last step (fsynced,
after every file and directory). So whatever ends a run early — a reader of `-v` that went away
(`| head`), ENOSPC or EIO, SIGINT, SIGTERM, `kill -9`, a power cut — leaves DEST marked
incomplete: the run exits non-zero (1; 130 after SIGINT, 143 after SIGTERM; a closed pipe
quietly, with no line), `restore` refuses DEST, `check` and `consume` of it say in one line that
it is an incomplete backup (`incomplete_backup`; check exits 4), and the next backup into DEST
completes it, removing what the cut-short run left (its `.*.seglogfs-tmp` files, files SRC no
longer holds). A backup is otherwise a data dir: `seglogfs check`, `consume` and `mount` read it
as it is.

Links, FIFOs, sockets and devices are refused, never followed or read: a backup or a restore that
meets one (a symbolic link named like a segment, a FIFO in a backup) names it in one line on
stderr, copies everything else (an offline partition's files as they are on disk), records the
names in the manifest (`"refused"`), and exits 1. Files of the copy are written through
temporary files of its own (O_EXCL, O_NOFOLLOW) renamed into place, never through a link.

Refusals (one line on stderr): SRC or DEST missing or of the wrong kind, DEST inside SRC or SRC
inside DEST, DEST neither empty nor a backup, a non-empty DATADIR without --force: exit 2;
DEST or DATADIR a live data dir (its `.lock` held: a mount, a broker, a writer): exit 3; a backup
that did not complete (restore): exit 1. A backup or restore that fails or is cut short exits 1
(a backup: 130 after SIGINT, 143 after SIGTERM), a backup with one line naming the failure and
DEST as incomplete.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import fcntl
import json
import os
import shlex
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from seglogfs.engine import BrokerConfig, DataDir, EngineError, LogDirLockedError
from seglogfs.engine.check import log_dir_in_use
from seglogfs.engine.datadir import LOCK_FILE, describe_process
from seglogfs.engine.errors import UnsafeFileError
from seglogfs.engine.files import open_regular, read_regular
from seglogfs.engine.log.checkpoint import (
    CLEAN_SHUTDOWN_FILE,
    CLEANER_OFFSET_CHECKPOINT,
    LOG_START_OFFSET_CHECKPOINT,
    RECOVERY_POINT_CHECKPOINT,
    REPLICATION_OFFSET_CHECKPOINT,
    write_atomically,
)
from seglogfs.engine.log.naming import partition_dirs
from seglogfs.engine.mirror import Mirror
from seglogfs.engine.object_store import ObjectStore, ObjectStoreError, is_object_store_uri, open_object_store
from seglogfs.engine.stored.catalogue import (
    CATALOGUE_DIR,
    Catalogue,
    catalogue_key,
    catalogue_runs,
    latest_catalogue,
    read_catalogue,
)
from seglogfs.engine.topic_configs import META_PROPERTIES
from seglogfs.mount_tools.common import discard_stdout, quiet_broken_pipe
from seglogfs.mount_tools.copier import Copier, CopyStats, MirrorSource, Source, TreeSource
from seglogfs.mount_tools.object_backup import (
    UPLOADS_AT_ONCE,
    ObjectBackup,
    StoredSource,
    collect_garbage,
    read_journal,
    read_started,
    write_started,
)
from seglogfs.mount_tools.progress import Progress

COMMANDS = ("backup", "restore")


MANIFEST = ".seglogfs-backup.json"


MANIFEST_VERSION = 1


MOUNT_MIRROR = ".logdir"


EXIT_OK = 0


EXIT_DATA = 1


EXIT_USAGE = 2


EXIT_LOCKED = 3


EXIT_INTERRUPTED = 130  # 128 + SIGINT, as a shell reports a process Ctrl-C ended


EXIT_TERMINATED = 143  # 128 + SIGTERM


_MANIFEST_MAX_BYTES = 1 << 20  # a manifest is a few hundred bytes


_OPEN_ATTEMPTS = 3  # a read-only open may meet a segment that retention deletes under it


_LOG_DIR_MARKERS = (
    LOCK_FILE,
    CLEAN_SHUTDOWN_FILE,
    META_PROPERTIES,
    RECOVERY_POINT_CHECKPOINT,
    REPLICATION_OFFSET_CHECKPOINT,
    LOG_START_OFFSET_CHECKPOINT,
    CLEANER_OFFSET_CHECKPOINT,
)


_NOT_DATA = frozenset({LOCK_FILE, "lost+found"})  # what an empty DATADIR or DEST may hold


class Refused(Exception):
    """A backup or restore turned down before it changed anything: one line, an exit code."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def _holder(directory: Path) -> str:
    """Who holds the data dir's `.lock`: `process N (command line)` when the kernel says."""
    return describe_process(log_dir_in_use(directory)[1])


def _refuse_live(directory: Path, what: str) -> None:
    if directory.is_dir() and log_dir_in_use(directory)[0]:
        raise Refused(f"{directory}: {what} is a data dir in use by {_holder(directory)}", EXIT_LOCKED)


def _check_apart(first: Path, first_what: str, second: Path, second_what: str) -> None:
    """Neither directory may be, or lie inside, the other."""
    one, two = os.path.realpath(first), os.path.realpath(second)
    if one == two:
        raise Refused(f"{second}: {second_what} is {first_what} itself", EXIT_USAGE)
    if two.startswith(one.rstrip(os.sep) + os.sep):
        raise Refused(f"{second}: {second_what} is inside {first_what} {first}", EXIT_USAGE)
    if one.startswith(two.rstrip(os.sep) + os.sep):
        raise Refused(f"{first}: {first_what} is inside {second_what} {second}", EXIT_USAGE)


def _data_names(directory: Path) -> set[str]:
    return set(os.listdir(directory)) - _NOT_DATA


def _is_mount_point(path: Path) -> bool:
    return (path / MOUNT_MIRROR).is_dir() and os.path.ismount(path)


def _looks_like_log_dir(directory: Path, *, lock_counts: bool = True) -> bool:
    """Whether partition dirs or Kafka's root files are there (`lock_counts`: a `.lock` alone,
    which a new data dir has, is enough)."""
    markers = _LOG_DIR_MARKERS if lock_counts else _LOG_DIR_MARKERS[1:]
    return bool(partition_dirs(directory)) or any((directory / name).exists() for name in markers)


@contextlib.contextmanager
def _locked(directory: Path, what: str, *, optional: bool = False) -> Iterator[None]:
    """Hold `directory/.lock` (made if need be, with the directory), as a writer of a data dir
    does: no writer, mount, backup or restore opens it meanwhile. `optional`: a directory where
    no lock file can be made (read-only media) is used without one."""
    if not optional:
        directory.mkdir(parents=True, exist_ok=True)
    try:
        fd = open_regular(directory / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as error:
        if optional and error.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
            yield
            return
        raise
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        raise Refused(f"{directory}: {what} is in use by {_holder(directory)}", EXIT_LOCKED) from None
    try:
        yield
    finally:
        os.close(fd)  # drops the lock


def _read_manifest(directory: Path) -> dict[str, object] | None:
    path = directory / MANIFEST
    try:
        document = json.loads(read_regular(path, _MANIFEST_MAX_BYTES).decode("utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError, UnsafeFileError) as error:
        raise Refused(f"{path}: unreadable backup manifest: {error}", EXIT_DATA) from None
    if not isinstance(document, dict) or document.get("format") != "seglogfs-backup":
        raise Refused(f"{path}: not a seglogfs backup manifest", EXIT_DATA)
    return document


def _write_manifest(directory: Path, document: dict[str, object]) -> None:
    """Replace the manifest durably (a temporary file fsynced, renamed, the directory fsynced):
    a crash leaves the one before or this one, never half of one."""
    write_atomically(directory / MANIFEST, json.dumps(document, indent=2) + "\n")


def incomplete_backup(log_dirs: Iterable[Path]) -> str | None:
    """The line saying a DATADIR is a backup that did not complete, for `seglogfs check` and
    `consume` to print (None when it is not one): a log dir holding the manifest of a backup
    whose last run was cut short or failed, or a numbered log dir (`B/0`) of such a backup of
    several log dirs. A manifest that cannot be read is said as such (its copy is not known to
    be whole either)."""
    for log_dir in log_dirs:
        candidates = [(log_dir, False)]
        if log_dir.name.isascii() and log_dir.name.isdigit():
            candidates.append((log_dir.parent, True))
        for directory, numbered in candidates:
            try:
                manifest = _read_manifest(directory)
            except Refused as error:
                return str(error)
            if manifest is None or manifest.get("complete") is True:
                continue
            if numbered and manifest.get("logDirs", 1) == 1:
                continue  # (a directory named 0 inside a backup of one log dir is not one of its log dirs)
            started = manifest.get("startedMs")
            when = (
                time.strftime(" %Y-%m-%dT%H:%M:%SZ", time.gmtime(started / 1000))
                if isinstance(started, int) and started >= 0
                else ""
            )
            source = manifest.get("source")
            again = (
                f"seglogfs backup {shlex.quote(source)} {shlex.quote(str(directory))}"
                if isinstance(source, str) and source
                else "a backup into it"
            )
            return (
                f"{directory}: an incomplete backup: the backup into it started{when} did not complete "
                f"(cut short or failed), so its files are not a consistent copy; {again} completes it"
            )
    return None


def _report(stats: CopyStats, args: argparse.Namespace) -> None:
    if args.json:
        print(json.dumps(stats.as_json(), indent=2))
    elif args.stats:
        print("\n".join(stats.lines()))


def _say(args: argparse.Namespace) -> Callable[[str], None] | None:
    return (lambda line: print(line, flush=True)) if args.verbose else None


def _open_read_only(config: BrokerConfig) -> DataDir:
    for attempt in range(_OPEN_ATTEMPTS):
        try:
            return DataDir.open(config, read_only=True, now_ms=now_ms())
        except FileNotFoundError:  # a segment deleted (retention) while the open listed it
            if attempt == _OPEN_ATTEMPTS - 1:
                raise
    raise AssertionError("unreachable")


def _refusals_answered(command: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """A command whose `Refused` is one line on stderr and its exit code."""

    def run(args: argparse.Namespace) -> int:
        try:
            return command(args)
        except Refused as error:
            print(f"seglogfs: {error}", file=sys.stderr)
            return error.exit_code

    return run


@dataclass
class _Opened:
    """The source of a backup, open: what the copy reads, its size, its log dirs, its name."""

    source: Source
    total: int
    log_dirs: int
    described: str
    kind: str  # "mount" or "data dir"


def _source_roots(args: argparse.Namespace) -> tuple[Path | None, list[Path]]:
    """The mount's mirror (when SRC is a mount point) and SRC's directories, checked."""
    given = Path(args.src)
    if "," not in args.src and _is_mount_point(given):
        return given / MOUNT_MIRROR, [given]
    if "," not in args.src and given.name == MOUNT_MIRROR and os.path.ismount(given.parent):
        return given, [given.parent]
    sources = [Path(part) for part in args.src.split(",") if part]
    if not sources:
        raise Refused("SRC names no directory", EXIT_USAGE)
    for log_dir in sources:
        if not log_dir.is_dir():
            raise Refused(f"{log_dir}: SRC is no data dir or mount point (no such directory)", EXIT_USAGE)
        if not _looks_like_log_dir(log_dir):
            raise Refused(
                f"{log_dir}: SRC is no data dir or mount point (no partition dirs, no checkpoints)", EXIT_USAGE
            )
    return None, sources


def _open_source(
    args: argparse.Namespace, mirror_root: Path | None, sources: list[Path], stack: contextlib.ExitStack
) -> _Opened:
    """The source opened for the copy: a mount's mirror read through the filesystem, or a data
    dir's resolved here over a read-only open (kept open by `stack`)."""
    if mirror_root is not None:
        tree = TreeSource(mirror_root, hidden=frozenset({MANIFEST}))
        names = {name for name, _ in tree.names(())}
        log_dirs = 1 if RECOVERY_POINT_CHECKPOINT in names else len(names)
        return _Opened(tree, tree.total_bytes(), log_dirs, str(sources[0].absolute()), "mount")
    config = BrokerConfig.load(args.config, args.override or (), log_dirs=sources)
    data_dir = stack.enter_context(_open_read_only(config))
    return _Opened(
        MirrorSource(Mirror(data_dir), hidden=frozenset({MANIFEST})),
        sum(log.size_in_bytes() for log in data_dir.partitions()),
        len(config.log_dirs),
        ",".join(str(s.absolute()) for s in sources),
        "data dir",
    )


def _backup(args: argparse.Namespace) -> int:
    mirror_root, sources = _source_roots(args)
    if is_object_store_uri(args.dest):
        return _backup_to_store(args, mirror_root, sources)
    dest = Path(args.dest)
    for root in sources:
        _check_apart(root, "SRC", dest, "DEST")
    if dest.exists() and not dest.is_dir():
        raise Refused(f"{dest}: DEST is not a directory", EXIT_USAGE)
    if dest.is_dir():
        _refuse_live(dest, "DEST")
        if _is_mount_point(dest):
            raise Refused(f"{dest}: DEST is a seglogfs mount point", EXIT_USAGE)
        if _data_names(dest) and _read_manifest(dest) is None:
            raise Refused(
                f"{dest}: DEST holds files and is no seglogfs backup (no {MANIFEST}): give a new or empty directory",
                EXIT_USAGE,
            )
    with contextlib.ExitStack() as stack:
        # The source first (a data dir that cannot be read leaves DEST as it was), then DEST.
        opened = _open_source(args, mirror_root, sources, stack)
        stack.enter_context(_locked(dest, "DEST, a data dir,"))
        manifest: dict[str, object] = {
            "format": "seglogfs-backup",
            "version": MANIFEST_VERSION,
            "source": opened.described,
            "sourceKind": opened.kind,
            "logDirs": opened.log_dirs,
            "startedMs": now_ms(),
            "complete": False,
        }
        # Marked incomplete before any file of DEST changes, complete after the last (module
        # docstring): a run that ends in between, however, leaves DEST saying so.
        _write_manifest(dest, manifest)
        try:
            with _terminated_as_interrupted(), Progress("backing up", opened.total, plain=not args.json) as progress:
                copier = Copier(opened.source, restoring=False, progress=progress, say=_say(args))
                copier.copy(dest, frozenset({LOCK_FILE, MANIFEST}))
                manifest.update(complete=True, finishedMs=now_ms(), stats=copier.stats.as_json())
                if copier.refused:
                    manifest["refused"] = copier.refused
                _write_manifest(dest, manifest)
        except (OSError, EngineError, KeyboardInterrupt, _Terminated) as error:
            return _ended_early(error, str(dest), _incomplete(dest))
    _report(copier.stats, args)
    return _refused_answer(copier.refused)


def _open_store(uri: str, what: str) -> ObjectStore:
    try:
        return open_object_store(uri)
    except ValueError as error:  # (it names the place)
        raise Refused(f"{error} ({what})", EXIT_USAGE) from None


def _backup_to_store(args: argparse.Namespace, mirror_root: Path | None, sources: list[Path]) -> int:
    """A backup into object storage (mount_tools.object_backup): the run's catalogue is
    written last, so a run that does not complete changes nothing the last complete one shows."""
    store = _open_store(args.dest, "DEST")
    runs = catalogue_runs(store)
    started = read_started(store)
    if not runs and started is None and store.list():
        raise Refused(
            f"{store.name()}: DEST holds objects and is no seglogfs backup (no {CATALOGUE_DIR}/): "
            "give a new or empty prefix",
            EXIT_USAGE,
        )
    previous = read_catalogue(store, runs[-1]) if runs else None
    kept = previous.keys() if previous is not None else set()
    if len(runs) > 1:
        kept |= read_catalogue(store, runs[-2]).keys()
    unnamed = {  # (what a run that did not complete uploaded: kept if it holds what is to be sent)
        info.key: info.size
        for info in (store.list() if started is not None else ())
        if info.key not in kept and not info.key.startswith(CATALOGUE_DIR + "/")
    }
    with contextlib.ExitStack() as stack:
        opened = _open_source(args, mirror_root, sources, stack)
        catalogue = Catalogue(
            (runs[-1] + 1) if runs else 1, opened.described, opened.kind, opened.log_dirs, started_ms=now_ms()
        )
        unfinished = f"the backup did not complete ({store.name()} still shows the last complete backup)"
        try:
            write_started(store, catalogue)
            with _terminated_as_interrupted(), Progress("backing up", opened.total, plain=not args.json) as progress:
                run = ObjectBackup(
                    opened.source,
                    store,
                    previous=previous,
                    kept_keys=kept,
                    unnamed=unnamed,
                    journal=read_journal(store, catalogue.run) if unnamed else None,
                    catalogue=catalogue,
                    progress=progress,
                    say=_say(args),
                    uploads=args.uploads,
                )
                run.run()
                if catalogue_runs(store)[-1:] != runs[-1:]:
                    raise ObjectStoreError(f"{store.name()}: another backup into it completed meanwhile")
                catalogue.finished_ms = now_ms()
                catalogue.stats = run.stats.as_json()
                store.put(catalogue_key(catalogue.run), json.dumps(catalogue.as_json()).encode())
                run.stats.files_deleted = collect_garbage(store, catalogue, previous)
        except (OSError, EngineError, KeyboardInterrupt, _Terminated) as error:
            return _ended_early(error, store.name(), unfinished)
    _report(run.stats, args)
    return _refused_answer(catalogue.refused)


def _ended_early(error: BaseException, place: str, unfinished: str) -> int:
    """The exit status of a backup that did not complete, and its one line: a reader of -v that
    went away (`| head`) quietly, but not as a success; a signal, naming it; a failure."""
    if isinstance(error, BrokenPipeError):
        quiet_broken_pipe()
        return EXIT_DATA
    if isinstance(error, (KeyboardInterrupt, _Terminated)):
        _tell(f"{place}: the backup was interrupted: {unfinished}")
        discard_stdout()  # (its -v lines: a reader that stopped reading must not hold the exit)
        return EXIT_TERMINATED if isinstance(error, _Terminated) else EXIT_INTERRUPTED
    _tell(f"{_one_line(error)}; {unfinished}")
    return EXIT_DATA


def _incomplete(dest: Path) -> str:
    return f"the backup did not complete ({dest} is marked incomplete until a backup into it completes)"


class _Terminated(BaseException):
    """SIGTERM during a copy: it ends as Ctrl-C does, removing the files it had staged."""


@contextlib.contextmanager
def _terminated_as_interrupted() -> Iterator[None]:
    """SIGTERM raises `_Terminated` meanwhile (in the main thread, where handlers belong)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def terminate(_signal: int, _frame: object) -> None:
        raise _Terminated

    previous = signal.signal(signal.SIGTERM, terminate)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _one_line(error: BaseException) -> str:
    """An error as the CLI prints it (an OSError as `path: reason`)."""
    if isinstance(error, OSError) and error.strerror:
        return f"{error.filename}: {error.strerror}" if error.filename else error.strerror
    return str(error)


def _tell(line: str) -> None:
    """One line on stderr, `seglogfs: …`; a stderr that is gone too (`2>&1 | head`) is let be."""
    with contextlib.suppress(OSError):
        print(f"seglogfs: {line}", file=sys.stderr, flush=True)


def _backup_log_dirs(backup: Path, manifest: dict[str, object] | None) -> int:
    """How many log dirs the backup holds (a backup made by hand, `rsync -a MNT/.logdir/`, has
    no manifest: its layout tells)."""
    if manifest is not None:
        count = manifest.get("logDirs", 1)
        if not isinstance(count, int) or count < 1:
            raise Refused(f"{backup / MANIFEST}: bad logDirs {count!r}", EXIT_DATA)
        return count
    if _looks_like_log_dir(backup, lock_counts=False):  # (the restore made the .lock it holds)
        return 1
    numbered = sorted(name for name in _data_names(backup) if name.isascii() and name.isdigit())
    in_order = numbered == [str(i) for i in range(len(numbered))]
    if numbered and in_order and all(_looks_like_log_dir(backup / name, lock_counts=False) for name in numbered):
        return len(numbered)
    raise Refused(f"{backup}: BACKUP is no seglogfs backup nor a copy of a log dir", EXIT_USAGE)


def _restore(args: argparse.Namespace) -> int:
    if is_object_store_uri(args.backup):
        return _restore_from_store(args)
    backup = Path(args.backup)
    if not backup.is_dir():
        raise Refused(f"{backup}: BACKUP is no directory", EXIT_USAGE)
    targets = [Path(part) for part in args.datadir.split(",") if part]
    for target in targets:
        _check_apart(backup, "BACKUP", target, "DATADIR")
    _check_targets(targets)
    with contextlib.ExitStack() as locks:
        locks.enter_context(_locked(backup, "BACKUP", optional=True))  # no backup into it meanwhile
        manifest = _read_manifest(backup)
        if manifest is not None and manifest.get("complete") is not True:
            raise Refused(
                f"{backup}: the backup did not complete (a backup into it was interrupted): run the backup again",
                EXIT_DATA,
            )
        count = _backup_log_dirs(backup, manifest)
        if len(targets) != count:
            raise Refused(f"the backup holds {count} log dirs, DATADIR names {len(targets)}", EXIT_USAGE)
        for target in targets:
            if target.is_dir() and _data_names(target) and not args.force:
                raise Refused(f"{target}: DATADIR is not empty (--force replaces what it holds)", EXIT_USAGE)
        for target in targets:
            locks.enter_context(_locked(target, "DATADIR, a data dir,"))
        hidden = frozenset({MANIFEST, LOCK_FILE})
        trees = [TreeSource(backup if count == 1 else backup / str(slot), hidden) for slot in range(count)]
        return _copy_back(args, list(zip(trees, targets, strict=True)))


def _add_stats(total: CopyStats, more: CopyStats) -> None:
    for field in ("bytes_sent", "files_sent", "files_appended", "files_skipped", "files_deleted"):
        setattr(total, field, getattr(total, field) + getattr(more, field))


def _check_targets(targets: list[Path]) -> None:
    """Each DATADIR of a restore is a directory, or not yet there, and not in use."""
    for target in targets:
        if target.exists() and not target.is_dir():
            raise Refused(f"{target}: DATADIR is not a directory", EXIT_USAGE)
        _refuse_live(target, "DATADIR")


def _restore_from_store(args: argparse.Namespace) -> int:
    """A restore of the newest complete backup run in object storage."""
    store = _open_store(args.backup, "BACKUP")
    targets = [Path(part) for part in args.datadir.split(",") if part]
    _check_targets(targets)
    catalogue = latest_catalogue(store)
    if catalogue is None:
        started = read_started(store)
        said = (
            "a backup into it began but did not complete: run it again"
            if started is not None
            else f"no {CATALOGUE_DIR}/"
        )
        raise Refused(f"{store.name()}: BACKUP holds no complete seglogfs backup ({said})", EXIT_DATA)
    if len(targets) != catalogue.log_dirs:
        raise Refused(f"the backup holds {catalogue.log_dirs} log dirs, DATADIR names {len(targets)}", EXIT_USAGE)
    for target in targets:
        if target.is_dir() and _data_names(target) and not args.force:
            raise Refused(f"{target}: DATADIR is not empty (--force replaces what it holds)", EXIT_USAGE)
    with contextlib.ExitStack() as locks:
        for target in targets:
            locks.enter_context(_locked(target, "DATADIR, a data dir,"))
        slots = [() if catalogue.log_dirs == 1 else (str(slot),) for slot in range(catalogue.log_dirs)]
        stored = [StoredSource(store, catalogue, slot) for slot in slots]
        return _copy_back(args, list(zip(stored, targets, strict=True)))


def _copy_back(args: argparse.Namespace, copies: list[tuple[TreeSource | StoredSource, Path]]) -> int:
    """Restore's copies (a backup's log dir, the DATADIR it goes to), and the exit status."""
    stats = CopyStats()
    refused: list[str] = []
    for source, target in copies:
        with Progress("restoring", source.total_bytes(), plain=not getattr(args, "json", False)) as progress:
            copier = Copier(source, restoring=True, progress=progress, say=_say(args))
            try:
                copier.copy(target, _NOT_DATA)
            except BrokenPipeError:  # the reader of -v went away: quietly, but the restore is not whole
                quiet_broken_pipe()
                return EXIT_DATA
        _add_stats(stats, copier.stats)
        refused += copier.refused
    _report(stats, args)
    return _refused_answer(refused)


def _refused_answer(refused: list[str]) -> int:
    """The exit status of a copy that refused files (each named on stderr as it was met): all
    else is copied, but the copy is not the whole source, and a script must know."""
    if not refused:
        return EXIT_OK
    print(
        f"seglogfs: {len(refused)} files not copied (links, FIFOs, sockets and devices never are), "
        f"e.g. {refused[0]}; everything else is",
        file=sys.stderr,
    )
    return EXIT_DATA


cmd_backup = _refusals_answered(_backup)


cmd_restore = _refusals_answered(_restore)


def add_commands(commands: argparse._SubParsersAction) -> None:
    """Register `backup` and `restore` with the `seglogfs` parser's subcommands."""
    backup = commands.add_parser(
        "backup",
        help="copy a data dir or a mount's .logdir into a backup dir, incrementally and consistently",
        description="Copy SRC (a data dir, even one being written, or a seglogfs mount point) into DEST: "
        "only what is new or grew since the last backup is sent, and what SRC no longer holds is deleted. "
        "DEST is marked incomplete (its .seglogfs-backup.json) until the backup has completed: a backup cut "
        "short or failed (a closed pipe, a full disk, a signal, kill -9) exits non-zero, check and consume of "
        "DEST say it is incomplete, restore refuses it, and the next backup into DEST completes it.",
        epilog="Exit codes: 0 complete, 1 failed or cut short (DEST marked incomplete) or files refused, "
        "2 bad command line, 3 DEST in use, 130 Ctrl-C, 143 SIGTERM.",
    )
    backup.add_argument("src", metavar="SRC", help="data dir (log dirs separated by commas) or seglogfs mount point")
    backup.add_argument(
        "dest",
        metavar="DEST",
        help="backup dir, or object storage URI (s3://bucket/prefix): new, empty, or an earlier backup of SRC",
    )
    backup.add_argument(
        "--uploads",
        type=_positive,
        default=UPLOADS_AT_ONCE,
        metavar="N",
        help=f"files uploaded at once into object storage (default {UPLOADS_AT_ONCE})",
    )
    backup.add_argument("-c", "--config", type=Path, metavar="server.properties", help="broker properties file")
    backup.add_argument("--override", action="append", metavar="KEY=VALUE", help="a config setting (repeatable)")
    _add_output(backup)
    backup.set_defaults(handler=cmd_backup)

    restore = commands.add_parser(
        "restore",
        help="copy a backup into a data dir (not one in use)",
        description="Copy BACKUP into DATADIR, which must not be in use (its .lock held) and must be "
        "empty unless --force: then it is made to hold exactly what the backup holds.",
    )
    restore.add_argument(
        "backup", metavar="BACKUP", help="a dir or object storage URI (s3://bucket/prefix) made by seglogfs backup"
    )
    restore.add_argument("datadir", metavar="DATADIR", help="log dir, or several separated by commas (log.dirs)")
    restore.add_argument("--force", action="store_true", help="replace what a non-empty DATADIR holds")
    _add_output(restore)
    restore.set_defaults(handler=cmd_restore)


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1: {value}")
    return value


def _add_output(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--stats", action="store_true", help="print bytes sent, files sent, skipped and deleted")
    parser.add_argument("--json", action="store_true", help="print those figures as one JSON object")
    parser.add_argument("-v", "--verbose", action="store_true", help="print each file sent, appended or deleted")


def main(argv: list[str] | None = None) -> int:
    """`python -m seglogfs.mount_tools.backup backup|restore …`: the two commands on their own,
    with the CLI's exit codes."""
    parser = argparse.ArgumentParser(prog="seglogfs", description="Backups of Kafka data dirs.")
    add_commands(parser.add_subparsers(dest="command", required=True, metavar="COMMAND"))
    args = parser.parse_args(argv)
    handler: Callable[[argparse.Namespace], int] = args.handler
    try:
        return handler(args)
    except LogDirLockedError as error:
        print(f"seglogfs: {error}", file=sys.stderr)
        return EXIT_LOCKED
    except EngineError as error:
        print(f"seglogfs: {error}", file=sys.stderr)
        return EXIT_DATA
    except OSError as error:
        where = f"{error.filename}: " if error.filename else ""
        print(f"seglogfs: {where}{error.strerror or error}", file=sys.stderr)
        return EXIT_DATA
    except KeyboardInterrupt:
        discard_stdout()  # (as an interrupted backup does)
        return EXIT_INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
