"""mount(8)'s helper for `-t fuse.seglogfs` and fstab lines, bound to one install of seglogfs.

How mount(8) runs a `fuse.seglogfs` mount (util-linux 2.38 and fuse3 3.14, read in their manual
pages and watched with strace): it looks for `/sbin/mount.fuse.seglogfs` (then /sbin/fs.d,
/sbin/fs), and runs it as

    /sbin/mount.fuse.seglogfs SOURCE MNT [-sfnv] [-N NAMESPACE] -o OPTIONS

with `noauto`, `x-*` and the other options meant for mount(8) alone removed. Without that file it
runs `/sbin/mount.fuse` (mount.fuse3), which runs `seglogfs SOURCE MNT -o OPTIONS,dev,suid`
through /bin/sh with the shell's default PATH (mount(8) drops the caller's PATH): whichever
`seglogfs` comes first in /usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin, that is,
whichever install linked itself there last.

This module is that helper. An admin installs it deliberately, with the Python of the install
that fstab lines are to run:

    /opt/seglogfs/.venv/bin/python -m seglogfs.mount_tools.mount_helper --install

writes /sbin/mount.fuse.seglogfs, a script of two lines that runs this module with that
interpreter, and says which install it now runs (and which one it ran before, if it replaces
one). `--install PATH` writes it elsewhere. To undo: `rm /sbin/mount.fuse.seglogfs` (mount(8)
falls back on mount.fuse3 and PATH).

Options: `-f` (fake) checks the options and mounts nothing, `-v` says what it runs, `-n` and
`-s` are accepted (seglogfs writes no /etc/mtab; every option it does not know is an error
anyway); `-N` (another mount namespace) and mount.fuse3's `setuid=USER` and `drop_privileges`
are refused with one line (run seglogfs as that user, e.g. a systemd unit with `User=`).
Exit codes are the seglogfs CLI's (`seglogfs.mount_tools.mounting`). The mount itself is
`seglogfs mount`'s, options and all: an fstab line's `allow_other` brings `default_permissions`
as on the command line (`serving.fuse_options`), so other users get only what the data dir's
owners and modes allow.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path

DEFAULT_PATH = Path("/sbin/mount.fuse.seglogfs")
_MARK = "# mount(8)'s helper for fuse.seglogfs, written by seglogfs.mount_tools.mount_helper --install"
_MODULE = "seglogfs.mount_tools.mount_helper"
EXIT_USAGE = 2  # as the CLI's exit codes say
_REFUSED = {
    "setuid": "setuid=USER is mount.fuse3's: run seglogfs as that user instead (a systemd unit with User=)",
    "drop_privileges": "drop_privileges is mount.fuse3's: run seglogfs as an unprivileged user instead",
}


def script_for(python: str) -> str:
    """The helper's text: this module, run by `python` (the interpreter of one install)."""
    return f'#!/bin/sh\n{_MARK}\nexec {shlex.quote(python)} -m {_MODULE} "$@"\n'


def _runs(text: str) -> str | None:
    """The interpreter a helper written by `--install` runs, or None for any other file."""
    lines = text.splitlines()
    if len(lines) < 3 or lines[1] != _MARK:
        return None
    words = shlex.split(lines[2])
    return words[1] if len(words) > 1 else None


def install(target: Path) -> int:
    python = sys.executable  # as it was run, not resolved: a venv's bin/python is the venv
    before = None
    if target.exists() or target.is_symlink():
        try:
            before = _runs(target.read_text(errors="replace"))
        except OSError:
            before = None
        if before is None:
            print(
                f"mount.fuse.seglogfs: {target} exists and was not written by --install; "
                f"left as is (remove it first to replace it)",
                file=sys.stderr,
            )
            return 1
    if before == python:
        print(f"{target}: already runs {python}")
        return 0
    temporary = target.with_name(f".{target.name}.{os.getpid()}")
    try:
        temporary.write_text(script_for(python))
        temporary.chmod(0o755)
        temporary.replace(target)
    except OSError as error:
        temporary.unlink(missing_ok=True)
        print(f"mount.fuse.seglogfs: {target}: {error.strerror}", file=sys.stderr)
        return 1
    replaced = f" (it ran {before})" if before else ""
    print(f"{target}: mount -t fuse.seglogfs and fstab lines now run {python} -m {_MODULE}{replaced}")
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="mount.fuse.seglogfs",
        description="mount(8)'s helper for fuse.seglogfs (fstab lines, mount -t fuse.seglogfs).",
        epilog=f"Install it, with the Python of the seglogfs to run: PYTHON -m {_MODULE} --install [PATH] "
        f"(default {DEFAULT_PATH}).",
    )
    parser.add_argument("source", metavar="DATADIR")
    parser.add_argument("mountpoint", metavar="MNT")
    parser.add_argument("-o", dest="options", action="append", default=[], metavar="OPTIONS")
    parser.add_argument("-f", dest="fake", action="store_true", help="check the options, mount nothing")
    parser.add_argument("-v", dest="verbose", action="store_true", help="say what runs")
    parser.add_argument("-n", dest="no_mtab", action="store_true", help="(accepted: nothing writes /etc/mtab)")
    parser.add_argument("-s", dest="sloppy", action="store_true", help="(accepted)")
    parser.add_argument("-N", dest="namespace", metavar="NAMESPACE", help="(refused)")
    parser.add_argument("-t", dest="type", metavar="TYPE", help="fuse.seglogfs")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    arguments = list(sys.argv[1:] if argv is None else argv)
    if arguments[:1] == ["--install"]:
        if len(arguments) > 2:
            print("usage: mount.fuse.seglogfs --install [PATH]", file=sys.stderr)
            return EXIT_USAGE
        return install(Path(arguments[1]) if len(arguments) == 2 else DEFAULT_PATH)
    args = _parser().parse_args(arguments)
    options = [option for item in args.options for option in item.split(",") if option]
    refused = [
        _REFUSED[name] for name in dict.fromkeys(option.partition("=")[0] for option in options) if name in _REFUSED
    ]
    if args.namespace is not None:
        refused.append("-N: mounting into another mount namespace is not supported")
    if args.type not in (None, "fuse.seglogfs"):
        refused.append(f"-t {args.type}: this helper mounts fuse.seglogfs")
    if refused:
        print(f"mount.fuse.seglogfs: {refused[0]}", file=sys.stderr)
        return EXIT_USAGE
    command = ["mount", args.source, args.mountpoint, *(["-o", ",".join(options)] if options else [])]
    if args.verbose:
        print(
            f"mount.fuse.seglogfs: {sys.executable} -m seglogfs.mount_tools.cli {shlex.join(command)}", file=sys.stderr
        )
    from seglogfs.engine.errors import ConfigError  # noqa: PLC0415 (not needed to --install)
    from seglogfs.mount_tools import cli, mounting  # noqa: PLC0415

    if args.fake:
        try:
            mounting.parse_mount_options(options)
        except ConfigError as error:
            print(f"seglogfs: {error}", file=sys.stderr)
            return 1
        return 0
    return cli.main(command)


if __name__ == "__main__":
    sys.exit(main())
