"""`seglogfs mount` and `seglogfs umount`.

    seglogfs mount DATADIR MNT [-o opt,...] [-f]
    seglogfs umount MNT

`-o` takes FUSE's `ro`, `allow_other` and `default_permissions`, the text view's
`print.key`, `print.offset`, `print.timestamp`, `print.partition`, `print.headers`,
`key.separator`, `null.literal`, the append files' `parse.key`, `key.separator`, `null.marker`,
and any Kafka config name (`message.timestamp.type=LogAppendTime`, `log.retention.hours=1`, …),
which overrides the broker config. The options mount(8) passes on (`rw`, `dev`, `suid`, `exec`,
`auto`, `user`, `_netdev`, …) are accepted and ignored, so `mount -t fuse.seglogfs` and fstab
lines work. Without `-f` the mount runs in the background once it is in place.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import logging.handlers
import os
import shutil
import subprocess
import sys
from pathlib import Path

from seglogfs.engine import BrokerConfig, LogDirLockedError
from seglogfs.engine.config import broker_name_for
from seglogfs.engine.console_formats import LineFormat, TextFormat
from seglogfs.engine.errors import ConfigError

EXIT_LOCKED = 3  # as the CLI's exit codes say

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
    FUSE flags `ro`, `allow_other`, `default_permissions`, `view.cache`, `log` and `measure`)."""
    view: dict[str, str] = {}
    append: dict[str, str] = {}
    overrides: list[str] = []
    flags: dict[str, str] = {}
    for item in items or ():
        for option in filter(None, item.split(",")):
            key, sep, value = option.partition("=")
            if key in ("ro", "allow_other", "default_permissions") and not sep:
                flags[key] = "true"
            elif key in ("view.cache", "log"):
                if not value:
                    raise ConfigError(f"-o {option}: give a {'file' if key == 'log' else 'directory'}, or none")
                flags[key] = value
            elif key == "measure":
                if value not in ("lazy", "background"):
                    raise ConfigError(f"-o {option}: measure=background (the default) or measure=lazy")
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


def set_up_logging(mountpoint: Path, *, foreground: bool, file: Path | None) -> None:
    """The mount's log lines: to stderr in the foreground; to `file` (appended, reopened when
    rotated) and to syslog (the journal) where there is one. Each line names the mount."""
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
    if foreground and file is None:
        handlers[0].setFormatter(logging.Formatter("seglogfs: %(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=logging.INFO, handlers=handlers, force=True)


def cmd_mount(args: argparse.Namespace, broker_config: BrokerConfig) -> int:
    from seglogfs.fs.tree import MountOptions  # noqa: PLC0415 (imported only for the mount)
    from seglogfs.mount_tools.serving import serve  # noqa: PLC0415

    view, append, _overrides, flags = parse_mount_options(args.options)
    options = MountOptions(
        text_format=TextFormat.from_properties(view),
        line_format=LineFormat.from_properties(append),
        read_only="ro" in flags,
        view_cache=view_cache_directory(flags.get("view.cache")),
        measure=flags.get("measure", "background") == "background",
    )
    mountpoint = Path(args.mountpoint)
    if not mountpoint.is_dir():
        raise ConfigError(f"{mountpoint}: mount point is not a directory")
    kwargs = {"allow_other": "allow_other" in flags, "default_permissions": "default_permissions" in flags}
    log = log_file(flags.get("log")) if "log" in flags or not args.foreground else None
    check_log_file(log)
    if args.foreground:
        set_up_logging(mountpoint.absolute(), foreground=True, file=log)
        serve(broker_config, mountpoint, options, ready=lambda: None, **kwargs)
        return 0
    return _serve_in_background(broker_config, mountpoint, options, kwargs, log)


def _serve_in_background(
    broker_config: BrokerConfig, mountpoint: Path, options: object, kwargs: dict, log: Path | None
) -> int:
    """Fork; the child mounts and serves, the parent returns once the mount is in place (or
    with the child's error)."""
    from seglogfs.mount_tools.serving import serve  # noqa: PLC0415

    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid:
        os.close(write_end)
        with os.fdopen(read_end, "rb") as pipe:
            said = pipe.read().decode(errors="replace")
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

    def ready() -> None:
        os.write(write_end, b"ok")
        os.close(write_end)
        os.dup2(devnull, 2)

    try:
        serve(broker_config, mountpoint, options, ready=ready, **kwargs)  # type: ignore[arg-type]
    except BaseException as error:  # reported to the waiting parent
        with contextlib.suppress(OSError):
            os.write(write_end, str(error).encode())
        os._exit(EXIT_LOCKED if isinstance(error, LogDirLockedError) else 1)
    os._exit(0)


def cmd_umount(args: argparse.Namespace) -> int:
    tool = shutil.which("fusermount3") or shutil.which("fusermount")
    command = [tool, "-u", args.mountpoint] if tool else ["umount", args.mountpoint]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        print(f"seglogfs: {done.stderr.strip() or 'unmount failed'}", file=sys.stderr)
        return 1
    return 0
