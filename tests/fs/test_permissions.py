"""Permissions on a mount shared with other users (`-o allow_other`): every node shows an owner,
a group and a mode from the data dir, and the kernel enforces them (allow_other always brings
default_permissions).

An unprivileged user, made by the test if absent, tries each request through a short program
run as that user with the system's Python (nothing of this checkout: its parents need not be
open to the user). The test's directories are made below /tmp with modes the user can traverse
(pytest's own tmp_path is under a 0700 directory), and removed after."""

from __future__ import annotations

import hashlib
import json
import os
import pwd
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from seglogfs.engine import DataDir
from seglogfs.fs.permissions import ROOT_ONLY, Access, shared_access
from seglogfs.fs.tree import MountOptions, Tree
from tests.conftest import NOW_MS, REPO, broker_config
from tests.fs.conftest import FUSERMOUNT, REFUSED, Mount, check_mount_log
from tests.fs.test_mount_edges import mounts_at, processes_naming

USER = "seglogfs-test"
SYSTEM_PYTHON = "/usr/bin/python3"
RECORDS = b"one\ntwo\nthree\n"
CONFIG = b"max.message.bytes=100000\n"  # (a harmless override: retention.ms=1 would delete the records)

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root: mounts for other users and runs as one"),
    pytest.mark.expect_warnings(REFUSED),  # the refusals the mount turns down itself (EPERM) are logged
]

# Runs as the user: each (request, path, data) in argv[1], and prints what each did: ["ok",
# what it read or listed] or [the errno's name, null].
_TRY = r"""
import errno, json, os, sys
results = []
for request, path, data in json.loads(sys.argv[1]):
    try:
        out = None
        if request == "read":
            with open(path, "rb") as file:
                out = file.read().decode(errors="replace")
        elif request == "list":
            out = sorted(os.listdir(path))
        elif request == "write":  # appends a line (append files), or replaces the content (config)
            flags = os.O_WRONLY | (os.O_TRUNC if path.endswith("/config") else os.O_APPEND)
            fd = os.open(path, flags)
            try:
                os.write(fd, bytes.fromhex(data))
            finally:
                os.close(fd)
        elif request == "mkdir":
            os.mkdir(path)
        elif request == "rmdir":
            os.rmdir(path)
        elif request == "chmod":
            os.chmod(path, 0o666)
        elif request == "chown":
            os.chown(path, os.getuid(), os.getgid())
        elif request == "touch":
            os.utime(path)
        results.append(["ok", out])
    except OSError as error:
        results.append([errno.errorcode[error.errno], None])
print(json.dumps(results))
"""


@pytest.fixture(scope="module")
def user() -> tuple[int, int]:
    """The unprivileged user's uid and gid (a system user with no home, made if absent and kept:
    other tests and runs use it too)."""
    try:
        entry = pwd.getpwnam(USER)
    except KeyError:
        entry = None
    if entry is None:
        made = subprocess.run(
            ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", USER],
            capture_output=True,
            text=True,
            check=False,
        )
        if made.returncode not in (0, 9):  # (9: made meanwhile by another run)
            raise RuntimeError(f"useradd {USER}: {made.stderr}")
        entry = pwd.getpwnam(USER)
    return entry.pw_uid, entry.pw_gid


@pytest.fixture
def place() -> Iterator[Path]:
    """A directory the user may traverse (0755, below /tmp), removed after the test."""
    path = Path(tempfile.mkdtemp(prefix="seglogfs-permissions-", dir="/tmp"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def mounts(place: Path, request: pytest.FixtureRequest) -> Iterator[list[Mount]]:
    """Mounts a test makes (`mount_at`), unmounted after it and their logs checked."""
    made: list[Mount] = []
    yield made
    for each in made:
        each.stop()
    expected = [pattern for marker in request.node.iter_markers("expect_warnings") for pattern in marker.args]
    for each in made:
        check_mount_log(each, expected)


def mount_at(mounts: list[Mount], data: Path, *options: str) -> Mount:
    place = data.parent
    mountpoint = place / f"mnt{len(mounts)}"
    mountpoint.mkdir()
    mountpoint.chmod(0o755)
    mounts.append(Mount(data, mountpoint, ["-o", ",".join(["allow_other", "view.cache=none", *options])]))
    return mounts[-1]


def make_data_dir(place: Path, *, dir_mode: int, file_mode: int, owner: tuple[int, int] | None = None) -> Path:
    """A data dir with topic `t` (one partition: three records), every directory in it
    `dir_mode`, every file `file_mode`, all of it root's or `owner`'s."""
    data = place / "data"
    subprocess.run(
        [sys.executable, "-m", "seglogfs.mount_tools.cli", "produce", str(data), "--topic", "t"],
        input=RECORDS,
        cwd=REPO,
        check=True,
        capture_output=True,
        timeout=60,
    )
    for path in [data, *data.rglob("*")]:
        path.chmod(dir_mode if path.is_dir() else file_mode)
        if owner is not None:
            os.chown(path, *owner)
    return data


def as_user(user: tuple[int, int], *requests: tuple[str, Path | str] | tuple[str, Path | str, bytes]) -> list:
    """What each request did, made by the user: ["ok", content] or [errno name, None]."""
    wire = [[request[0], str(request[1]), (request[2] if len(request) > 2 else b"").hex()] for request in requests]  # type: ignore[misc]
    uid, gid = user
    done = subprocess.run(
        ["setpriv", f"--reuid={uid}", f"--regid={gid}", "--clear-groups", SYSTEM_PYTHON, "-c", _TRY, json.dumps(wire)],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
        cwd="/",
    )
    return json.loads(done.stdout)


def on_disk(data: Path) -> dict[str, tuple[int, int, int, str]]:
    """Every file and directory of the data dir: (mode, uid, gid, hash of the content)."""
    listing = {}
    for path in sorted([data, *data.rglob("*")]):
        status = path.lstat()
        digest = hashlib.sha256(path.read_bytes()).hexdigest() if stat.S_ISREG(status.st_mode) else ""
        listing[str(path.relative_to(data))] = (status.st_mode, status.st_uid, status.st_gid, digest)
    return listing


def mode_and_owner(path: Path) -> tuple[str, int, int]:
    status = path.stat()
    return stat.filemode(status.st_mode), status.st_uid, status.st_gid


SEGMENT = "00000000000000000000.log"
VIEWS = [
    "t/0/records",
    "t/0/records.jsonl",
    "t/0/by-offset/0",
    "t/0/by-offset/1.jsonl",
    "t/0/by-time/0",
    "t/0/read_committed/records",
    "t/0/read_uncommitted/by-offset/0.jsonl",
    "t/0/status",
]
APPENDS = [
    ("t/append", b"x\n"),
    ("t/append.jsonl", b'{"value":"x"}\n'),
    ("t/0/append", b"x\n"),
    ("t/0/append.jsonl", b'{"value":"x"}\n'),
]


def writes(m: Mount, batch: bytes, *, rmdir: bool = True) -> list[tuple[str, Path, bytes] | tuple[str, Path]]:
    """Every request that changes something: appends to each append file, config, mkdir and
    rmdir of a topic (unless not `rmdir`), chmod, chown and touch of a view."""
    return [
        *(("write", m.path / name, data) for name, data in APPENDS),
        ("write", m.path / "t/0/append.batches", batch),
        ("write", m.path / "t/config", CONFIG),
        ("mkdir", m.path / "u"),
        *([("rmdir", m.path / "t")] if rmdir else []),
        ("chmod", m.path / "t/0/records"),
        ("chown", m.path / "t/0/records"),
        ("touch", m.path / "t/0/records"),
    ]


def test_a_closed_data_dir_refuses_another_user_everything(
    place: Path, user: tuple[int, int], mounts: list[Mount]
) -> None:
    """Data dir 0700, segments 0600, root's: the user reads, writes, makes and changes nothing,
    through any node, and nothing on disk changes."""
    data = make_data_dir(place, dir_mode=0o700, file_mode=0o600)
    batch = (data / "t-0" / SEGMENT).read_bytes()
    m = mount_at(mounts, data)
    assert mode_and_owner(m.path) == ("drwx------", 0, 0)  # the data dir's
    assert mode_and_owner(m.path / "t") == ("drwx------", 0, 0)
    assert mode_and_owner(m.path / "t/config") == ("-rw-------", 0, 0)
    assert mode_and_owner(m.path / "t/0") == ("drwx------", 0, 0)  # the segments' bits, and x to reach them
    assert mode_and_owner(m.path / "t/0/by-offset") == ("drwx------", 0, 0)  # (as t/0: rm -r unlinks in it)
    assert mode_and_owner(m.path / "t/0/records") == ("-r--------", 0, 0)
    assert mode_and_owner(m.path / "t/0/status") == ("-r--------", 0, 0)
    assert mode_and_owner(m.path / "t/0/append") == ("--w-------", 0, 0)
    assert mode_and_owner(m.path / "t/append") == ("--w-------", 0, 0)
    assert mode_and_owner(m.path / ".logdir") == ("drwx------", 0, 0)
    assert mode_and_owner(m.path / ".logdir/t-0" / SEGMENT) == ("-rw-------", 0, 0)
    before = on_disk(data)
    reads = [("read", m.path / name) for name in VIEWS] + [("read", m.path / ".logdir/t-0" / SEGMENT), ("list", m.path)]
    results = as_user(user, *reads, *writes(m, batch))
    assert all(result[0] in ("EACCES", "EPERM") for result in results), results
    assert on_disk(data) == before
    assert (m.path / "t/0/records").read_bytes() == RECORDS  # (and root reads it all)


def test_views_follow_the_segments_not_the_data_dir(place: Path, user: tuple[int, int], mounts: list[Mount]) -> None:
    """Data dir 0755, segments 0600: the user lists the topics and partitions, but reads no view,
    no status and no segment, as on disk."""
    data = make_data_dir(place, dir_mode=0o755, file_mode=0o600)
    m = mount_at(mounts, data)
    reads = [("read", m.path / name) for name in VIEWS] + [("read", m.path / ".logdir/t-0" / SEGMENT)]
    listed, *results = as_user(user, ("list", m.path / "t"), *reads)
    assert listed == ["ok", ["0", "append", "append.jsonl", "config"]]
    assert [result[0] for result in results] == ["EACCES"] * len(reads), results
    assert as_user(user, ("read", data / "t-0" / SEGMENT)) == [["EACCES", None]]  # (as on disk)


def test_a_readable_data_dir_is_read_and_not_written(place: Path, user: tuple[int, int], mounts: list[Mount]) -> None:
    """Data dir 0755, segments 0644: the user reads every view, status and `.logdir`; every
    write is refused and nothing on disk changes. Root writes, but changes no owner, mode or
    time (EPERM)."""
    data = make_data_dir(place, dir_mode=0o755, file_mode=0o644)
    batch = (data / "t-0" / SEGMENT).read_bytes()
    m = mount_at(mounts, data)
    assert mode_and_owner(m.path / "t/0") == ("drwxr-xr-x", 0, 0)
    assert mode_and_owner(m.path / "t/0/records") == ("-r--r--r--", 0, 0)
    assert mode_and_owner(m.path / "t/0/append") == ("--w-------", 0, 0)
    assert mode_and_owner(m.path / "t/config") == ("-rw-r--r--", 0, 0)
    before = on_disk(data)
    read = as_user(user, *[("read", m.path / name) for name in VIEWS], ("read", m.path / ".logdir/t-0" / SEGMENT))
    assert all(result[0] == "ok" for result in read), read
    assert read[0][1].encode() == RECORDS
    assert read[2][1].encode() == RECORDS and read[3][1].count("\n") == 2
    assert json.loads(read[7][1])["logEndOffset"] == 3 and "three" in read[-1][1]
    results = as_user(user, *writes(m, batch))
    assert [result[0] for result in results] == ["EACCES"] * 8 + ["EPERM", "EPERM", "EACCES"], results
    assert on_disk(data) == before

    # Root: the same requests work, except changing a node's owner, mode or times.
    for request in ("chmod", "chown", "touch"):
        with pytest.raises(PermissionError) as refused:
            {"chmod": lambda p: os.chmod(p, 0o666), "chown": lambda p: os.chown(p, 0, 0), "touch": os.utime}[request](
                m.path / "t/0/records"
            )
        assert refused.value.errno == 1, request  # EPERM
    for name, line in APPENDS:
        with open(m.path / name, "ab") as file:
            file.write(line)
    (m.path / "t/config").write_bytes(CONFIG)
    assert (m.path / "t/config").read_bytes() == CONFIG
    (m.path / "t/config").write_text("")  # (O_TRUNC still truncates: applied at the release, after close)
    assert eventually(lambda: (m.path / "t/config").read_bytes() == b"")
    os.mkdir(m.path / "u")
    assert mode_and_owner(m.path / "u/0/records") == ("-r--r--r--", 0, 0)
    assert (m.path / "t/0/records").read_bytes().count(b"\n") == 3 + len(APPENDS)


def test_a_chmod_in_the_data_dir_takes_effect_within_a_second(
    place: Path, user: tuple[int, int], mounts: list[Mount]
) -> None:
    """The kernel keeps a directory's mode for a second: taking the read bits off the segments,
    or the data dir's x bits, shuts the user out of the views within that (giving them back
    lets the user in again)."""
    data = make_data_dir(place, dir_mode=0o755, file_mode=0o644)
    m = mount_at(mounts, data)
    records = m.path / "t/0/records"
    assert as_user(user, ("read", records)) == [["ok", RECORDS.decode()]]
    assert records.stat().st_size == len(RECORDS)  # (the kernel holds the view's attributes now)
    segment = data / "t-0" / SEGMENT
    segment.chmod(0o600)
    assert eventually(lambda: as_user(user, ("read", records)) == [["EACCES", None]])
    segment.chmod(0o644)
    assert eventually(lambda: as_user(user, ("read", records)) == [["ok", RECORDS.decode()]])
    data.chmod(0o700)
    assert eventually(lambda: as_user(user, ("read", records), ("list", m.path)) == [["EACCES", None]] * 2)


def test_the_owner_of_the_files_does_everything(place: Path, user: tuple[int, int], mounts: list[Mount]) -> None:
    """Root mounts a data dir (0700, segments 0600) that the user owns: the user reads, appends,
    writes config, makes topics, which are the user's, and removes them; changing a node's
    mode is EPERM still."""
    data = make_data_dir(place, dir_mode=0o700, file_mode=0o600, owner=user)
    batch = (data / "t-0" / SEGMENT).read_bytes()
    m = mount_at(mounts, data)
    uid, gid = user
    assert mode_and_owner(m.path / "t/0/records") == ("-r--------", uid, gid)
    assert mode_and_owner(m.path / "t/0/append.batches") == ("--w-------", uid, gid)
    reads = [("read", m.path / name) for name in VIEWS] + [("read", m.path / ".logdir/t-0" / SEGMENT)]
    results = as_user(user, *reads, *writes(m, batch, rmdir=False))
    assert [result[0] for result in results[: len(reads)]] == ["ok"] * len(reads), results
    assert [result[0] for result in results[len(reads) :]] == ["ok"] * 7 + ["EPERM"] * 3, results
    # (chmod, chown, touch: the owner's mode and times come from the data dir)
    after = (m.path / "t/0/records").read_bytes()
    assert after.startswith(RECORDS) and after.count(b"\n") == 3 + len(APPENDS) + 3  # and the batch's three
    assert (m.path / "t/config").read_bytes() == CONFIG
    assert all(
        path.stat().st_uid == uid and path.stat().st_gid == gid for path in [data / "u-0", *(data / "u-0").iterdir()]
    )
    assert mode_and_owner(m.path / "u/0/records")[1:] == (uid, gid)
    assert as_user(user, ("rmdir", m.path / "u")) == [["ok", None]]
    assert not (data / "u-0").exists() and not (m.path / "u").exists()
    removed = run_as(user, "rm", "-r", m.path / "t")
    assert removed.returncode == 0, removed.stderr
    assert sorted(os.listdir(data)) == sorted(name for name in os.listdir(data) if not name.startswith("t-"))


def run_as(user: tuple[int, int], *command: str | Path) -> subprocess.CompletedProcess[str]:
    """A real tool run by the user."""
    uid, gid = user
    return subprocess.run(
        ["setpriv", f"--reuid={uid}", f"--regid={gid}", "--clear-groups", *(str(part) for part in command)],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
        cwd="/",
    )


def test_a_topic_is_removed_only_by_who_may_remove_its_files(
    place: Path, user: tuple[int, int], mounts: list[Mount]
) -> None:
    """The user may not write the data dir (0755, root's): `rmdir` and `rm -r` of a topic fail
    (the kernel refuses, EACCES). The user owns the data dir, but the partition's files are
    root's (0644, in a dir of root's): refused by the mount too, which says why, as `rm -r` of
    the partition dir on disk would fail. Nothing on disk changes."""
    data = make_data_dir(place, dir_mode=0o755, file_mode=0o644)
    m = mount_at(mounts, data)
    before = on_disk(data)
    assert as_user(user, ("rmdir", m.path / "t")) == [["EACCES", None]]
    removed = run_as(user, "rm", "-r", m.path / "t")
    assert removed.returncode == 1 and "Permission denied" in removed.stderr
    assert on_disk(data) == before

    os.chown(data, *user)
    assert eventually(lambda: mode_and_owner(m.path)[1:] == user)  # (the kernel keeps a directory's a second)
    said = len(m.output().splitlines())
    assert as_user(user, ("rmdir", m.path / "t")) == [["EACCES", None]]
    [line] = [line for line in m.output().splitlines()[said:] if "WARNING" in line]
    assert line.endswith("rmdir t: the caller may not write the files of partition 0: Permission denied (EACCES)")
    assert on_disk(data) == {**before, ".": (before["."][0], *user, "")}
    assert (m.path / "t/0/records").read_bytes() == RECORDS


def test_a_read_only_mount_shows_no_write_bits(place: Path, user: tuple[int, int], mounts: list[Mount]) -> None:
    data = make_data_dir(place, dir_mode=0o755, file_mode=0o644)
    m = mount_at(mounts, data, "ro")
    assert mode_and_owner(m.path) == ("dr-xr-xr-x", 0, 0)
    assert mode_and_owner(m.path / "t/config") == ("-r--r--r--", 0, 0)
    assert mode_and_owner(m.path / "t/0/append") == ("----------", 0, 0)
    assert mode_and_owner(m.path / ".logdir") == ("dr-xr-xr-x", 0, 0)
    for path in (m.path / ".logdir").rglob("*"):
        assert not path.stat().st_mode & 0o222, path
    results = as_user(user, ("read", m.path / ".logdir/t-0" / SEGMENT), ("write", m.path / "t/0/append", b"x\n"))
    assert results[0][0] == "ok" and results[1] == ["EROFS", None]  # (the kernel says it first)


def test_allow_other_brings_default_permissions_on_every_way_to_mount(place: Path, mounts: list[Mount]) -> None:
    """`seglogfs mount -o allow_other` and mount(8)'s helper (`mount -t fuse.seglogfs`, fstab)."""
    data = make_data_dir(place, dir_mode=0o755, file_mode=0o644)
    m = mount_at(mounts, data)
    assert "default_permissions" in fuse_options_at(m.path)
    helper_point = place / "helper"
    helper_point.mkdir()
    log = place / "helper.log"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "seglogfs.mount_tools.mount_helper",
            str(data),
            str(helper_point),
            "-o",
            f"ro,allow_other,view.cache=none,log={log}",
        ],
        cwd=REPO,
        check=True,
        capture_output=True,
        timeout=60,
    )
    try:
        assert "default_permissions" in fuse_options_at(helper_point)
    finally:
        subprocess.run(
            [sys.executable, "-m", "seglogfs.mount_tools.cli", "umount", str(helper_point)],
            cwd=REPO,
            check=False,
            capture_output=True,
            timeout=60,
        )
        if mounts_at(helper_point):
            subprocess.run([FUSERMOUNT, "-u", "-z", str(helper_point)], check=False, capture_output=True)
        # (the mount's process ends after the unmount: its data dir goes with the test's place)
        assert eventually(lambda: not processes_naming(helper_point), 30), "the helper's mount lingers"


def eventually(condition: Callable[[], bool], seconds: float = 5.0) -> bool:
    """Whether `condition()` holds within `seconds` (the kernel releases a file after close
    returns)."""
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def fuse_options_at(mountpoint: Path) -> list[str]:
    for line in Path("/proc/mounts").read_text().splitlines():
        fields = line.split()
        if fields[1] == str(mountpoint):
            return fields[3].split(",")
    raise AssertionError(f"{mountpoint} is not mounted")


# -- the tree model alone ---------------------------------------------------------------------------
def test_directories_open_to_whoever_may_read_or_write_their_files() -> None:
    assert Access(5, 6, 0o600).directory() == Access(5, 6, 0o700)
    assert Access(5, 6, 0o644).directory() == Access(5, 6, 0o755)
    assert Access(5, 6, 0o620).directory() == Access(5, 6, 0o730)  # the group reaches its append files
    assert Access(5, 6, 0o4755).file() == Access(5, 6, 0o644)
    assert shared_access([Access(5, 6, 0o600), Access(5, 6, 0o660)]) == Access(5, 6, 0o600)
    assert shared_access([Access(5, 6, 0o600), Access(7, 6, 0o600)]) == ROOT_ONLY


def test_a_topics_append_files_take_what_its_partitions_share(place: Path) -> None:
    """Partition 1's active segment another user's: each partition's nodes show its own owner;
    the topic's append files, which write to both, root's alone."""
    log_dir = place / "logs"
    data_dir = DataDir.open(broker_config(log_dir), now_ms=NOW_MS)
    try:
        data_dir.create_topic("t", 2, now_ms=NOW_MS)
        segment = data_dir.partition("t", 1).active_segment.log_path
        os.chown(segment, 5, 6)
        segment.chmod(0o640)
        tree = Tree(data_dir, MountOptions(), clock=lambda: NOW_MS)

        def shown(path: str) -> tuple[str, int, int]:
            node = tree.root
            for name in path.split("/"):
                node = tree.lookup(node, name)
            attributes = node.attributes()
            return stat.filemode(attributes.mode), attributes.uid, attributes.gid

        assert shown("t/1/records") == ("-r--r-----", 5, 6)
        assert shown("t/1/status") == ("-r--r-----", 5, 6)
        assert shown("t/1/append.batches") == ("--w-------", 5, 6)
        assert shown("t/1") == ("drwxr-x---", 5, 6)
        assert shown("t/1/by-offset") == ("drwxr-x---", 5, 6)
        assert shown("t/0/append") == ("--w-------", 0, 0)
        assert shown("t/append") == ("----------", 0, 0)  # root alone
        assert shown(".logdir/t-1/" + segment.name) == ("-rw-r-----", 5, 6)
    finally:
        data_dir.close()
