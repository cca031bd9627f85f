"""`seglogfs mount` and `seglogfs umount`.

    seglogfs mount DATADIR MNT [-o opt,...] [-f]
    seglogfs umount MNT

`-o` takes FUSE's `ro`, `allow_other` (which always brings `default_permissions`: the kernel
checks every request of another user against the owner and mode the data dir gives each node)
and `default_permissions`, the text view's
`print.key`, `print.offset`, `print.timestamp`, `print.partition`, `print.headers`,
`key.separator`, `null.literal`, the views' isolation level (`isolation.level=read_committed`,
Kafka's consumer setting; read_uncommitted by default), the append files' `parse.key`,
`key.separator`, `null.marker`, and any Kafka config name (`message.timestamp.type=LogAppendTime`,
`log.retention.hours=1`, …), which overrides the broker config; for a backup in object storage
(`seglogfs mount s3://bucket/prefix MNT`, always read-only), `cache.size=SIZE` (`4g`: what the
mount keeps of the segments it fetched). The options mount(8) passes
on (`rw`, `dev`, `suid`, `exec`, `auto`, `user`, `_netdev`, …) are accepted and ignored, so
`mount -t fuse.seglogfs` and fstab lines work (see `mount_helper` for which install they run).
Without `-f` the mount runs in the background once it is in place.

The mount point is checked first, as mount(8) users expect:
- already a mount point (of seglogfs or anything else): refused, nothing is stacked on it;
- not empty: refused unless `-o nonempty` (FUSE 2's option) says to hide its files;
- a seglogfs mount whose process died (ENOTCONN, "Transport endpoint is not connected"): it is
  unmounted lazily, with a line saying so, and mounted afresh (the data dir recovers as after any
  unclean stop). A dead mount of another filesystem is refused, naming what to run.
A writable mount of a data dir that does not exist creates it, as Kafka creates its `log.dirs`,
and says so (a mistyped DATADIR, or a disk not mounted yet, shows up at once).

`seglogfs umount MNT` unmounts a seglogfs mount and returns once the mount's process (the
holder of the data dir's lock) has exited: its checkpoints and clean-shutdown marker written,
the lock released, so that `seglogfs umount MNT && start-the-broker` (or `&& backup`) finds the
dir free. Past a second, a line on a terminal says what it waits for. It exits 1 when the process
ended without its clean-shutdown marker (the next open recovers as after a crash), quoting the
last error of the process in its log file (found as the file it holds open for appending). A
read-only mount holds no lock: umount returns once it is unmounted. A dead mount is unmounted
lazily and exits 0 with a line saying it was stale; anything else is refused with one line.

A writable mount of a data dir whose lock a seglogfs mount being unmounted still holds (it is
writing its checkpoints) says it waits for that process, naming it, and then goes on.

Exit codes, besides the CLI's (0 ok, 1 bad input, 2 bad command line, 3 data dir locked):
    5  the mount point is in use: already mounted, not empty (without -o nonempty), a dead
       mount of another filesystem; for umount, busy (a file or working directory open in it)
    6  umount: no seglogfs mount there (nothing mounted, or another filesystem)
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import logging
import os
import re
import select
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from seglogfs.engine import BrokerConfig, LogDirLockedError
from seglogfs.engine.check import log_dir_in_use
from seglogfs.engine.config import broker_name_for
from seglogfs.engine.errors import ConfigError, EngineError
from seglogfs.engine.fetched_files import BUDGET as FETCH_BUDGET
from seglogfs.engine.fetched_files import DEFAULT_CACHE_BYTES
from seglogfs.engine.log.checkpoint import CLEAN_SHUTDOWN_FILE
from seglogfs.engine.log.transactions import READ_COMMITTED, READ_UNCOMMITTED
from seglogfs.engine.object_store import parse_location as object_location
from seglogfs.engine.stored.local_copy import FOLLOW_INTERVAL_S, LocalCopy
from seglogfs.engine.text.console_formats import LineFormat, TextFormat
from seglogfs.mount_tools import mountpoints

EXIT_DATA = 1  # as the CLI's exit codes say
EXIT_LOCKED = 3
EXIT_MOUNT_POINT_IN_USE = 5
EXIT_NOT_MOUNTED = 6


class MountPointError(Exception):
    """The mount point is not in a state the command can work with: one line, and the exit code."""

    def __init__(self, message: str, exit_code: int = EXIT_MOUNT_POINT_IN_USE) -> None:
        super().__init__(message)
        self.exit_code = exit_code


_VIEW_OPTIONS = {
    "print.key",
    "print.offset",
    "print.timestamp",
    "print.partition",
    "print.headers",
    "print.value",
    "key.separator",
    "null.literal",
    "line.separator",
}
_APPEND_OPTIONS = {"parse.key", "key.separator", "null.marker"}
_IGNORED = {
    "rw",
    "dev",
    "nodev",
    "suid",
    "nosuid",
    "exec",
    "noexec",
    "auto",
    "noauto",
    "user",
    "nouser",
    "users",
    "_netdev",
    "nofail",
    "defaults",
    "atime",
    "noatime",
    "relatime",
}


def parse_mount_options(
    items: list[str] | None,
) -> tuple[dict[str, str], dict[str, str], list[str], dict[str, str]]:
    """`-o` values → (view properties, append properties, Kafka overrides, mount settings: the
    FUSE flags `ro`, `allow_other`, `default_permissions`, `nonempty` (checked here: FUSE 3 has
    no such option), `view.cache`, `log`, `measure` and `isolation.level`)."""
    view: dict[str, str] = {}
    append: dict[str, str] = {}
    overrides: list[str] = []
    flags: dict[str, str] = {}
    for item in items or ():
        for option in filter(None, item.split(",")):
            key, sep, value = option.partition("=")
            if key in ("ro", "allow_other", "default_permissions", "nonempty") and not sep:
                flags[key] = "true"
            elif key == "cache.size":
                flags[key] = str(parse_size(value, f"-o {option}"))
            elif key in ("view.cache", "log"):
                if not value:
                    raise ConfigError(f"-o {option}: give a {'file' if key == 'log' else 'directory'}, or none")
                flags[key] = value
            elif key == "measure":
                if value not in ("lazy", "background"):
                    raise ConfigError(f"-o {option}: measure=background (the default) or measure=lazy")
                flags[key] = value
            elif key == "isolation.level":  # (a consumer's setting, not a broker's: no override)
                if value not in (READ_UNCOMMITTED, READ_COMMITTED):
                    raise ConfigError(
                        f"-o {option}: isolation.level={READ_UNCOMMITTED} (the default) or "
                        f"isolation.level={READ_COMMITTED}"
                    )
                flags[key] = value
            elif key in _IGNORED or key.startswith("x-"):
                continue
            elif key in _VIEW_OPTIONS or key in _APPEND_OPTIONS:
                text = value if sep else "true"
                if key in _VIEW_OPTIONS:
                    view[key] = text
                if key in _APPEND_OPTIONS:
                    append[key] = text
            elif sep:
                # A topic-level name (`message.timestamp.type`) sets the default of every topic.
                overrides.append(f"{broker_name_for(key)}={value}")
            else:
                raise ConfigError(f"-o {option}: unknown mount option")
    return view, append, overrides, flags


def parse_size(text: str, what: str) -> int:
    """A size in bytes, with an optional binary suffix: `512m`, `2G`, `65536`."""
    match = re.fullmatch(r"(\d+)([kmgt]?)i?b?", text.strip().lower())
    if match is None:
        raise ConfigError(f"{what}: expected a size (bytes, or with k, m, g or t: 512m)")
    return int(match.group(1)) << (10 * " kmgt".index(match.group(2) or " "))


def view_cache_directory(option: str | None) -> Path | None:
    """Where measured view layouts are kept between mounts: `-o view.cache=DIR`, `none` for
    nowhere; by default /var/cache/seglogfs for root, else $XDG_CACHE_HOME/seglogfs."""
    if option is not None:
        return None if option == "none" else Path(option).expanduser().absolute()
    if os.geteuid() == 0:
        return Path("/var/cache/seglogfs")
    base = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    return Path(base) / "seglogfs"


def log_file(option: str | None) -> Path | None:
    """Where a mount logs: `-o log=FILE`, `none` for nowhere; by default
    /var/log/seglogfs/seglogfs.log for root, else $XDG_STATE_HOME/seglogfs/seglogfs.log
    (~/.local/state/seglogfs/seglogfs.log)."""
    if option is not None:
        return None if option == "none" else Path(option).expanduser().absolute()
    if os.geteuid() == 0:
        return Path("/var/log/seglogfs/seglogfs.log")
    base = os.environ.get("XDG_STATE_HOME") or os.path.expanduser("~/.local/state")
    return Path(base) / "seglogfs" / "seglogfs.log"


def check_log_file(log: Path | None) -> None:
    """Refuse, with one line and before anything starts, a log file that cannot be written."""
    if log is None:
        return
    try:
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "a"):
            pass
    except OSError as error:
        raise ConfigError(
            f"{log}: cannot write the mount's log there ({error.strerror}); -o log=FILE or none"
        ) from None


class _RepliesNobodyWaitsFor(logging.Filter):
    """pyfuse3 logs an ERROR when the kernel refuses a reply with ENOENT: the request is gone,
    interrupted (its process killed) or dropped by an unmount (a `close` just before `umount`
    leaves its release in flight). Nobody waits for that reply, and nothing is lost: DEBUG."""

    _GONE = os.strerror(errno.ENOENT)

    def filter(self, record: logging.LogRecord) -> bool:
        if str(record.msg).endswith("fuse_reply_* failed with %s") and record.args == (self._GONE,):
            record.levelno, record.levelname = logging.DEBUG, "DEBUG"
            return logging.getLogger(record.name).isEnabledFor(logging.DEBUG)
        return True


def set_up_logging(mountpoint: Path, *, foreground: bool, file: Path | None) -> None:
    """The mount's log lines: to stderr in the foreground; to `file` (appended, reopened when
    rotated) and to syslog (the journal) where there is one. Each line names the mount."""
    import logging.handlers  # noqa: PLC0415 (only a mount logs: imported here, not by every command)

    handlers: list[logging.Handler] = []
    if foreground:
        handlers.append(logging.StreamHandler())
    if file is not None:  # (checked writable by `check_log_file`)
        handlers.append(logging.handlers.WatchedFileHandler(file))
    formatter = logging.Formatter(
        f"%(asctime)s seglogfs[%(process)d] {mountpoint}: %(levelname)s %(name)s: %(message)s"
    )
    for handler in handlers:
        handler.setFormatter(formatter)
    if not foreground and os.path.exists("/dev/log"):
        syslog = logging.handlers.SysLogHandler("/dev/log", facility=logging.handlers.SysLogHandler.LOG_DAEMON)
        syslog.setFormatter(logging.Formatter(f"seglogfs[%(process)d]: {mountpoint}: %(levelname)s %(message)s"))
        handlers.append(syslog)
    if foreground and file is None:  # (several mounts may log to one terminal: each line names its own)
        handlers[0].setFormatter(logging.Formatter(f"seglogfs {mountpoint}: %(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=logging.INFO, handlers=handlers, force=True)
    pyfuse3_log = logging.getLogger("pyfuse3")
    if not any(isinstance(known, _RepliesNobodyWaitsFor) for known in pyfuse3_log.filters):
        pyfuse3_log.addFilter(_RepliesNobodyWaitsFor())


@dataclass(frozen=True)
class StoredSource:
    """A backup in object storage to mount read-only: its URI, the bound of what is kept of its
    segments (`-o cache.size`), and the broker config's file and overrides (`-c`, `--override`)."""

    uri: str
    cache_bytes: int
    properties_file: Path | None
    overrides: tuple[str, ...]

    @property
    def display(self) -> str:
        return object_location(self.uri).display


def cmd_mount(args: argparse.Namespace, broker_config: BrokerConfig | None) -> int:
    """Mount DATADIR (`broker_config`), or, when that is None, the backup in object storage that
    DATADIR names by URI: read-only, following new backup runs."""
    from seglogfs.fs.tree import MountOptions  # noqa: PLC0415 (imported only for the mount)

    view, append, _overrides, flags = parse_mount_options(args.options)
    source: BrokerConfig | StoredSource
    if broker_config is None:
        try:
            object_location(args.datadir)
        except ValueError as error:
            raise ConfigError(str(error)) from None
        if "ro" not in flags:  # (as mount(8) mounts a write-protected device)
            print(f"seglogfs: {object_location(args.datadir).display} is read-only: mounting it -o ro", file=sys.stderr)
            flags["ro"] = "true"
        cache_bytes = int(flags.get("cache.size", DEFAULT_CACHE_BYTES))
        source = StoredSource(args.datadir, cache_bytes, args.config, tuple(args.override or ()))
    else:
        if "cache.size" in flags:
            raise ConfigError("-o cache.size is for a backup in object storage (s3://…): a data dir is read in place")
        source = broker_config
    options = MountOptions(
        text_format=TextFormat.from_properties(view),
        line_format=LineFormat.from_properties(append),
        read_only="ro" in flags,
        # (a backup's local copy is new each mount: layouts measured over it would never be found
        # again, and would pile up in the cache until pruned)
        view_cache=None if isinstance(source, StoredSource) else view_cache_directory(flags.get("view.cache")),
        measure=flags.get("measure", "background") == "background",
        read_committed=flags.get("isolation.level", READ_UNCOMMITTED) == READ_COMMITTED,
    )
    mountpoint = Path(args.mountpoint)
    try:
        prepare_mount_point(mountpoint, nonempty="nonempty" in flags)
    except MountPointError as error:
        print(f"seglogfs: {error}", file=sys.stderr)
        return error.exit_code
    kwargs = {"allow_other": "allow_other" in flags, "default_permissions": "default_permissions" in flags}
    log = log_file(flags.get("log")) if "log" in flags or not args.foreground else None
    check_log_file(log)
    if isinstance(source, BrokerConfig) and not options.read_only:
        say_which_data_dirs_are_created(source)
        wait_for_closing_mounts(source)
    if args.foreground:
        set_up_logging(mountpoint.absolute(), foreground=True, file=log)
        _serve(source, mountpoint, options, lambda: None, kwargs)
        return 0
    return _serve_in_background(source, mountpoint, options, kwargs, log)


def _mounts_process(entry: mountpoints.MountEntry) -> _Closing | None:
    """A writable mount's process: the one holding the lock of its log dirs (its source). A
    read-only mount takes no lock (the holder, if any, is another writer)."""
    if entry.read_only:
        return None
    log_dirs = [Path(source) for source in entry.source.split(",") if source]
    in_use, pid = log_dir_in_use(log_dirs[0]) if log_dirs else (False, None)
    if not in_use or pid is None:
        return None
    try:
        return _Closing(pid, os.pidfd_open(pid), log_dirs, _log_of(pid, log_dirs))
    except OSError:  # (it has exited meanwhile)
        return None


def prepare_mount_point(mountpoint: Path, *, nonempty: bool) -> None:
    """Refuse a mount point that is mounted already or not empty (unless `nonempty`); unmount
    (lazily) a seglogfs mount there whose process died, saying so. Raises MountPointError, or
    ConfigError when it is no directory."""
    for _ in range(16):  # dead mounts stacked on one another are taken off one by one
        where = mountpoints.real(mountpoint)
        entry = mountpoints.mount_containing(where)
        if not mountpoints.is_stale(where):
            break
        if entry is None or entry.mount_point != where:
            raise MountPointError(f"{mountpoint}: Transport endpoint is not connected: {_inside_dead_mount(entry)}")
        if not entry.is_seglogfs:
            raise MountPointError(
                f"{mountpoint}: a {entry.describe()} mount whose process is gone is there (Transport endpoint "
                f"is not connected); unmount it with: fusermount3 -u -z {where}"
            )
        why = mountpoints.unmount(where, lazy=True)
        if why is not None:
            raise MountPointError(
                f"{mountpoint}: a seglogfs mount whose process died is there, and unmounting it failed ({why}); "
                f"run as its owner or root: fusermount3 -u -z {where}"
            )
        print(
            f"seglogfs: {mountpoint}: was a stale mount (the seglogfs process serving {entry.source} had died: "
            f"Transport endpoint is not connected): unmounted it lazily, mounting again",
            file=sys.stderr,
        )
    else:
        raise MountPointError(f"{mountpoint}: still a dead mount after unmounting it again and again")
    if entry is not None and entry.mount_point == where:
        command = "seglogfs umount" if entry.is_seglogfs else "umount"
        raise MountPointError(
            f"{mountpoint}: already mounted ({entry.describe()}); unmount it first: {command} {where}"
        )
    if not mountpoint.is_dir():
        missing = "" if mountpoint.exists() else f" (no such directory: mkdir -p {mountpoint})"
        raise ConfigError(f"{mountpoint}: mount point is not a directory{missing}")
    if not nonempty:
        with os.scandir(mountpoint) as names:
            if next(names, None) is not None:
                raise MountPointError(
                    f"{mountpoint}: mount point is not empty (its files would be hidden while mounted; "
                    f"-o nonempty mounts over them)"
                )


def _inside_dead_mount(entry: mountpoints.MountEntry | None) -> str:
    if entry is None or not entry.is_fuse:
        return "a dead FUSE mount is in the way"
    command = "seglogfs umount" if entry.is_seglogfs else "fusermount3 -u -z"
    point = entry.mount_point
    return f"it is inside {point} ({entry.describe()}), whose process is gone; run: {command} {point}"


def wait_for_closing_mounts(broker_config: BrokerConfig) -> None:
    """Wait for a seglogfs mount of these log dirs that was unmounted and still closes them (it
    holds the lock while it writes its checkpoints), saying so; a lock held by anything else is
    left for the open to refuse."""
    for log_dir in broker_config.log_dirs:
        in_use, pid = log_dir_in_use(log_dir)
        if not in_use or pid is None or not _is_closing_mount(pid, log_dir):
            continue
        try:
            process = os.pidfd_open(pid)
        except OSError:  # (it has exited meanwhile)
            continue
        print(
            f"seglogfs: {log_dir}: waiting for process {pid}, a seglogfs mount of it that was unmounted, to "
            f"finish closing it",
            file=sys.stderr,
        )
        _wait_for_exit(process)


def _is_closing_mount(pid: int, log_dir: Path) -> bool:
    """Whether `pid` is a `seglogfs mount` whose mount of `log_dir` is gone (it is closing)."""
    try:
        arguments = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    if b"mount" not in arguments or not any(b"seglogfs" in argument for argument in arguments):
        return False
    served = os.path.realpath(log_dir)
    return not any(
        entry.is_seglogfs
        and not entry.read_only
        and served in {os.path.realpath(source) for source in entry.source.split(",")}
        for entry in mountpoints.mounts()
    )


def _wait_for_exit(process: int, *, progress: Callable[[float], None] | None = None) -> None:
    """Wait until the process of the pidfd `process` has exited (and close the pidfd);
    `progress(seconds)` is called each second meanwhile."""
    started = time.monotonic()
    try:
        poller = select.poll()
        poller.register(process, select.POLLIN)
        while not poller.poll(1000):
            if progress is not None:
                progress(time.monotonic() - started)
    finally:
        os.close(process)


def say_which_data_dirs_are_created(broker_config: BrokerConfig) -> None:
    """A writable mount creates a missing log dir, as Kafka does with `log.dirs`: one line each, so
    that a mistyped DATADIR (or a disk not mounted yet at boot) does not pass unnoticed."""
    for log_dir in broker_config.log_dirs:
        if not log_dir.exists():
            print(f"seglogfs: {log_dir}: no such data dir: creating it, as Kafka creates log.dirs", file=sys.stderr)
        elif not log_dir.is_dir():
            raise ConfigError(f"{log_dir}: not a directory (a data dir is one)")


def _serve(
    source: BrokerConfig | StoredSource, mountpoint: Path, options: object, ready: Callable[[], None], kwargs: dict
) -> None:
    from seglogfs.mount_tools.serving import serve  # noqa: PLC0415 (imported only for the mount)

    if isinstance(source, BrokerConfig):
        serve(source, mountpoint, options, ready=ready, **kwargs)  # type: ignore[arg-type]
        return
    # A backup in object storage: its local copy is this (serving) process's, removed as it ends.
    FETCH_BUDGET.limit_bytes = source.cache_bytes
    copy = LocalCopy.open(source.uri)
    try:
        config = BrokerConfig.load(source.properties_file, source.overrides, log_dirs=copy.log_dirs)
        copy.follow(FOLLOW_INTERVAL_S, lambda line: logging.getLogger(__name__).warning("%s", line))
        serve(config, mountpoint, options, ready=ready, source=source.display, **kwargs)  # type: ignore[arg-type]
    finally:
        copy.close()


def _one_line(error: BaseException) -> str:
    """An error as the CLI prints it (an OSError as `path: reason`)."""
    if isinstance(error, OSError) and error.strerror:
        return f"{error.filename}: {error.strerror}" if error.filename else error.strerror
    if isinstance(error, (EngineError, ConfigError)):
        return str(error)
    return f"internal error: {type(error).__name__}: {error}"


def _exit_code(error: BaseException) -> int:
    if isinstance(error, LogDirLockedError):
        return EXIT_LOCKED
    return EXIT_DATA


def _serve_in_background(
    source: BrokerConfig | StoredSource, mountpoint: Path, options: object, kwargs: dict, log: Path | None
) -> int:
    """Fork; the child mounts and serves, the parent returns once the mount is in place (or
    with the child's error)."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid:
        os.close(write_end)
        with os.fdopen(read_end, "rb") as pipe:
            said = pipe.read().decode(errors="replace")  # whole: read to the end of the pipe
        if said == "ok":
            return 0
        _, status = os.waitpid(pid, 0)
        print(f"seglogfs: {said or 'the mount process died'}", file=sys.stderr)
        return os.waitstatus_to_exitcode(status) or 1  # the child exits as the CLI would
    os.close(read_end)
    os.setsid()
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1):
        os.dup2(devnull, fd)
    set_up_logging(mountpoint.absolute(), foreground=False, file=log)

    waiting = [True]  # the parent waits on the pipe until `ready` (after it, the fd is closed)

    def ready() -> None:
        os.write(write_end, b"ok")
        os.close(write_end)
        waiting[0] = False
        os.dup2(devnull, 2)

    try:
        _serve(source, mountpoint, options, ready, kwargs)
    except BaseException as error:  # reported to the parent if it still waits, else logged
        if waiting[0]:
            with contextlib.suppress(OSError), os.fdopen(write_end, "wb") as to_parent:
                to_parent.write(_one_line(error).encode())  # (a buffered file writes it all)
        elif isinstance(error, (EngineError, OSError)):  # (what the data or the OS said: one line)
            logging.getLogger(__name__).error("the mount stopped: %s", _one_line(error))
        else:  # (a bug: its traceback)
            logging.getLogger(__name__).exception("the mount stopped")
        os._exit(_exit_code(error))
    os._exit(0)


@dataclass
class _Closing:
    """The process of a writable mount being unmounted: its pid, a pidfd of it (opened before
    the unmount, so that the pid cannot name another process meanwhile), and its log dirs."""

    pid: int
    pidfd: int
    log_dirs: list[Path]
    log: Path | None  # the mount's log file, when it writes one


def _log_of(pid: int, log_dirs: list[Path]) -> Path | None:
    """The file a mount's process logs to: the one it holds open for appending outside its
    data dir (a logging file handler's); None when it has none or /proc will not say."""
    with contextlib.suppress(OSError):
        for fd in os.listdir(f"/proc/{pid}/fd"):
            with contextlib.suppress(OSError, ValueError):
                info = Path(f"/proc/{pid}/fdinfo/{fd}").read_text().splitlines()
                flags = next(line for line in info if line.startswith("flags:"))
                if not int(flags.split()[1], 8) & os.O_APPEND:
                    continue
                target = Path(os.readlink(f"/proc/{pid}/fd/{fd}"))
                if target.is_file() and not any(target.is_relative_to(log_dir) for log_dir in log_dirs):
                    return target
    return None


def _last_error(log: Path | None, pid: int) -> str | None:
    """The message of the last ERROR line process `pid` wrote to `log`."""
    if log is None:
        return None
    try:
        with open(log, "rb") as file:
            file.seek(max(0, file.seek(0, os.SEEK_END) - (1 << 20)))
            lines = file.read().decode(errors="replace").splitlines()
    except OSError:
        return None
    mine = [line for line in lines if f"seglogfs[{pid}]" in line and " ERROR " in line]
    if not mine:
        return None
    _logger, _, message = mine[-1].split(" ERROR ", 1)[1].partition(": ")  # (the logger's name, then the message)
    return message


def cmd_umount(args: argparse.Namespace) -> int:
    mountpoint = Path(args.mountpoint)
    closing: list[_Closing] = []
    try:
        stale = unmount_seglogfs(mountpoint, closing)
    except MountPointError as error:
        print(f"seglogfs: {error}", file=sys.stderr)
        return error.exit_code
    if stale:
        print(
            f"seglogfs: {mountpoint}: the mount was stale (its process had died: Transport endpoint is not "
            f"connected): unmounted it lazily",
            file=sys.stderr,
        )
        return 0
    return _wait_for_close(mountpoint, closing[0]) if closing else 0


def _wait_for_close(mountpoint: Path, closing: _Closing) -> int:
    """After the unmount: wait for the mount's process to exit, then see that it left its
    clean-shutdown marker in every log dir."""
    terminal = sys.stderr.isatty()
    said = False

    def progress(seconds: float) -> None:
        nonlocal said
        if terminal:
            said = True
            print(
                f"\rseglogfs: {mountpoint}: waiting for the mount's process {closing.pid} to write its "
                f"checkpoints and exit ({seconds:.0f} s)",
                end="",
                file=sys.stderr,
                flush=True,
            )

    _wait_for_exit(closing.pidfd, progress=progress)
    if said:
        print(file=sys.stderr)
    unclean = [str(log_dir) for log_dir in closing.log_dirs if not os.path.lexists(log_dir / CLEAN_SHUTDOWN_FILE)]
    if unclean:
        error = _last_error(closing.log, closing.pid)
        why = f"its log says: {error}" if error else "the mount's log says why"
        print(
            f"seglogfs: {mountpoint}: the mount's process {closing.pid} exited without writing "
            f"{CLEAN_SHUTDOWN_FILE} in {', '.join(unclean)}: the next open recovers as after a crash ({why})",
            file=sys.stderr,
        )
        return EXIT_DATA
    return 0


def unmount_seglogfs(mountpoint: Path, closing: list[_Closing] | None = None) -> bool:
    """Unmount the seglogfs mount at `mountpoint`; True when it was a dead one (unmounted
    lazily). Raises MountPointError for anything else there. `closing`, when given, gets the
    mount's process when it holds its log dirs' lock (a writable mount), to wait for."""
    where = mountpoints.real(mountpoint)
    entry = mountpoints.mount_containing(where)
    stale = mountpoints.is_stale(where)
    if entry is None or entry.mount_point != where:
        if stale:
            raise MountPointError(
                f"{mountpoint}: Transport endpoint is not connected: {_inside_dead_mount(entry)}", EXIT_NOT_MOUNTED
            )
        what = "no such directory" if not os.path.lexists(mountpoint) else "not mounted"
        raise MountPointError(f"{mountpoint}: {what} (no seglogfs mount there)", EXIT_NOT_MOUNTED)
    if not entry.is_seglogfs:
        command = "fusermount3 -u -z" if stale else ("fusermount3 -u" if entry.is_fuse else "umount")
        dead = ", whose process is gone" if stale else ""
        raise MountPointError(
            f"{mountpoint}: not a seglogfs mount ({entry.describe()}{dead}); unmount it with: {command} {where}",
            EXIT_NOT_MOUNTED,
        )
    found = _mounts_process(entry) if closing is not None and not stale else None
    why = mountpoints.unmount(where, lazy=stale)
    if why is None:
        if found is not None and closing is not None:
            closing.append(found)
        return stale
    if found is not None:
        os.close(found.pidfd)
    if "busy" in why.lower():
        raise MountPointError(
            f"{mountpoint}: busy: a process has a file or its working directory in it (fuser -vm {where} "
            f"lists them); close them, or detach it now and let them finish: umount -l {where}"
        )
    raise MountPointError(f"{mountpoint}: {why}", EXIT_DATA)
