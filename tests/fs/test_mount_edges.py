"""Mounting as an admin expects it: a mount point that is mounted already or not empty is
refused, a mount whose process was killed is cleaned up by the next `mount` or `umount`, a lock
error names its holder whole, bad usage is one line with a documented exit code, and mount(8)
runs the install whose helper was installed. Real mounts of the real CLI; every one unmounted
(lazily) after the test, and its process gone, even when the test fails."""

from __future__ import annotations

import errno
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.fs.conftest import FUSERMOUNT, Mount, check_mount_log

EXIT_DATA, EXIT_LOCKED, EXIT_MOUNT_POINT_IN_USE, EXIT_NOT_MOUNTED = 1, 3, 5, 6
STALE = "Transport endpoint is not connected"

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="mounts a tmpfs / enters a mount namespace: root only")


def seglogfs(*args: object) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "seglogfs.mount_tools.cli", *map(str, args)]
    return subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=60, check=False)


def said(done: subprocess.CompletedProcess[str]) -> str:
    """The one line a command wrote on stderr."""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, f"expected one line, got (exit {done.returncode}):\n{done.stderr}"
    return lines[0]


def mounts_at(path: Path) -> list[str]:
    """The types of the mounts at `path` (stacked ones too), from /proc/self/mountinfo."""
    where = os.path.realpath(path)
    found = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split(" ")
        if fields[4].replace("\\040", " ") == where:
            found.append(fields[fields.index("-", 6) + 1])
    return found


def processes_naming(path: Path) -> list[int]:
    """Processes with `path` as an argument: the mounts a test started for it."""
    wanted = os.fsencode(path)
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if wanted in entry.joinpath("cmdline").read_bytes().split(b"\0"):
                    pids.append(int(entry.name))
            except OSError:  # gone meanwhile
                continue
    return pids


def kill_and_wait(m: Mount) -> None:
    """kill -9 the mount's process, as the OOM killer would: its mount point goes stale."""
    m.process.send_signal(signal.SIGKILL)
    m.process.wait(timeout=30)
    with pytest.raises(OSError) as raised:
        os.listdir(m.path)
    assert raised.value.errno == errno.ENOTCONN


@pytest.fixture
def unmounted_after() -> Iterator[Callable[[Path], Path]]:
    """`unmounted_after(path)`: after the test, whatever is mounted at `path` is unmounted lazily
    and the mount processes started for it are gone (killed, and the test failed, if they
    linger)."""
    points: list[Path] = []

    def track(path: Path) -> Path:
        points.append(path)
        return path

    yield track
    for point in points:
        for _ in range(8):  # stacked mounts: one at a time
            if not mounts_at(point):
                break
            subprocess.run([FUSERMOUNT, "-u", "-z", str(point)], capture_output=True, check=False)
            if mounts_at(point):
                subprocess.run(["umount", "-l", str(point)], capture_output=True, check=False)
    lingering = []
    for point in points:
        deadline = time.monotonic() + 15
        while (pids := processes_naming(point)) and time.monotonic() < deadline:
            time.sleep(0.05)
        for pid in pids:
            os.kill(pid, signal.SIGKILL)
        lingering += pids
    assert not lingering, f"mount processes still running after unmount: {lingering}"


def background_options(tmp_path: Path) -> str:
    return f"log={tmp_path / 'background.log'},view.cache=none"


# -- 1. a mount point that is mounted already ------------------------------------------------------
def test_a_mount_point_that_is_mounted_is_refused(mount, tmp_path: Path) -> None:
    m: Mount = mount()
    other = tmp_path / "other-data"
    for foreground in ([], ["-f"]):
        done = seglogfs("mount", other, m.path, *foreground)
        assert done.returncode == EXIT_MOUNT_POINT_IN_USE, done
        assert said(done) == (
            f"seglogfs: {m.path}: already mounted (fuse.seglogfs from {m.data}); "
            f"unmount it first: seglogfs umount {m.path}"
        )
    assert mounts_at(m.path) == ["fuse.seglogfs"]  # nothing stacked on it
    assert not other.exists()  # a refused mount changes nothing
    os.mkdir(m.path / "t")  # and the first one still serves


@needs_root
def test_a_mount_point_of_another_filesystem_is_refused_and_not_unmounted(tmp_path: Path, unmounted_after) -> None:
    other = unmounted_after(tmp_path / "tmpfs")
    other.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(other)], check=True)
    done = seglogfs("mount", tmp_path / "data", other)
    assert done.returncode == EXIT_MOUNT_POINT_IN_USE, done
    assert said(done) == f"seglogfs: {other}: already mounted (tmpfs from tmpfs); unmount it first: umount {other}"
    done = seglogfs("umount", other)
    assert done.returncode == EXIT_NOT_MOUNTED, done
    assert said(done) == f"seglogfs: {other}: not a seglogfs mount (tmpfs from tmpfs); unmount it with: umount {other}"
    assert mounts_at(other) == ["tmpfs"]


# -- 2. a mount point that is not empty ------------------------------------------------------------
def test_a_non_empty_mount_point_needs_the_nonempty_option(tmp_path: Path) -> None:
    data, mountpoint = tmp_path / "data", tmp_path / "mnt"
    mountpoint.mkdir()
    (mountpoint / "keep.txt").write_text("mine\n")
    done = seglogfs("mount", data, mountpoint)
    assert done.returncode == EXIT_MOUNT_POINT_IN_USE, done
    assert said(done) == (
        f"seglogfs: {mountpoint}: mount point is not empty (its files would be hidden while mounted; "
        f"-o nonempty mounts over them)"
    )
    assert not mounts_at(mountpoint) and not data.exists()
    m = Mount(data, mountpoint, ["-o", f"nonempty,view.cache={tmp_path / 'view-cache'}"])
    try:
        assert "keep.txt" not in os.listdir(mountpoint)  # hidden while mounted
        os.mkdir(mountpoint / "t")
        (mountpoint / "t" / "0" / "append").write_bytes(b"over\n")
        assert (mountpoint / "t" / "0" / "records").read_bytes() == b"over\n"
    finally:
        m.stop()
    check_mount_log(m, [])
    assert (mountpoint / "keep.txt").read_text() == "mine\n"  # there all along, under the mount


# -- 3. a mount whose process was killed -----------------------------------------------------------
def test_umount_of_a_killed_mount_cleans_it_up(tmp_path: Path) -> None:
    mountpoint = tmp_path / "mnt"
    mountpoint.mkdir()
    m = Mount(tmp_path / "data", mountpoint, ["-o", "view.cache=none"])
    try:
        kill_and_wait(m)
        assert mounts_at(mountpoint) == ["fuse.seglogfs"]  # still in the table, answering ENOTCONN
        done = seglogfs("umount", mountpoint)
        assert done.returncode == 0, done
        assert said(done) == (
            f"seglogfs: {mountpoint}: the mount was stale (its process had died: {STALE}): unmounted it lazily"
        )
        assert not mounts_at(mountpoint)
        assert os.listdir(mountpoint) == []
        done = seglogfs("umount", mountpoint)  # once more: nothing is mounted there now
        assert done.returncode == EXIT_NOT_MOUNTED
        assert said(done) == f"seglogfs: {mountpoint}: not mounted (no seglogfs mount there)"
    finally:
        m.stop()


def test_mount_on_a_killed_mount_cleans_it_up_and_mounts(tmp_path: Path, unmounted_after) -> None:
    data, mountpoint = tmp_path / "data", unmounted_after(tmp_path / "mnt")
    mountpoint.mkdir()
    m = Mount(data, mountpoint, ["-o", "view.cache=none"])
    try:
        os.mkdir(mountpoint / "t")
        (mountpoint / "t" / "0" / "append").write_bytes(b"before the kill\n")
        kill_and_wait(m)
        done = seglogfs("mount", data, mountpoint, "-o", background_options(tmp_path))
        assert done.returncode == 0, done
        assert said(done) == (
            f"seglogfs: {mountpoint}: was a stale mount (the seglogfs process serving {data} had died: {STALE}): "
            f"unmounted it lazily, mounting again"
        )
        assert mounts_at(mountpoint) == ["fuse.seglogfs"]  # in place of the dead one, not on top
        assert (mountpoint / "t" / "0" / "records").read_bytes() == b"before the kill\n"
        done = seglogfs("umount", mountpoint)
        assert (done.returncode, done.stderr) == (0, "")
        assert not mounts_at(mountpoint)
    finally:
        m.stop()


def test_a_path_inside_a_killed_mount_names_the_mount_to_clean_up(tmp_path: Path) -> None:
    mountpoint = tmp_path / "mnt"
    mountpoint.mkdir()
    m = Mount(tmp_path / "data", mountpoint, ["-o", "view.cache=none"])
    try:
        os.mkdir(mountpoint / "t")
        kill_and_wait(m)
        for args, code in (
            (("mount", tmp_path / "data2", mountpoint / "t"), EXIT_MOUNT_POINT_IN_USE),
            (("umount", mountpoint / "t"), EXIT_NOT_MOUNTED),
        ):
            done = seglogfs(*args)
            assert done.returncode == code, done
            assert said(done) == (
                f"seglogfs: {mountpoint / 't'}: {STALE}: it is inside {mountpoint} (fuse.seglogfs from "
                f"{m.data}), whose process is gone; run: seglogfs umount {mountpoint}"
            )
    finally:
        m.stop()


def test_umount_of_a_busy_mount_says_what_holds_it(mount) -> None:
    m: Mount = mount()
    holder = subprocess.Popen(["sleep", "60"], cwd=m.path)  # a shell's working directory, say
    try:
        done = seglogfs("umount", m.path)
        assert done.returncode == EXIT_MOUNT_POINT_IN_USE, done
        assert said(done) == (
            f"seglogfs: {m.path}: busy: a process has a file or its working directory in it (fuser -vm {m.path} "
            f"lists them); close them, or detach it now and let them finish: umount -l {m.path}"
        )
        assert mounts_at(m.path) == ["fuse.seglogfs"]
    finally:
        holder.kill()
        holder.wait(timeout=30)
    done = seglogfs("umount", m.path)
    assert (done.returncode, done.stderr) == (0, "")


# -- 5. the holder of a lock, whole ----------------------------------------------------------------
def test_a_locked_data_dir_names_its_holder_whole(mount, tmp_path: Path) -> None:
    m: Mount = mount(None, "-o", "print.key,print.offset,print.timestamp,key.separator=:")
    holder = Path(f"/proc/{m.process.pid}/cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
    assert len(holder) > 200  # longer than any cut an error message might make
    second = tmp_path / "second"
    second.mkdir()
    for foreground in ([], ["-f"]):
        done = seglogfs("mount", m.data, second, *foreground)
        assert done.returncode == EXIT_LOCKED, done
        assert said(done) == (
            f"seglogfs: {m.data}: data dir is in use by process {m.process.pid} ({holder}) "
            f"(lock file {m.data / '.lock'})"
        )
    assert not mounts_at(second)


# -- bad usage -------------------------------------------------------------------------------------
def test_bad_usage_is_one_line_with_a_documented_exit_code(tmp_path: Path, unmounted_after) -> None:
    plain = tmp_path / "plain"
    plain.mkdir()
    done = seglogfs("umount", plain)
    assert (done.returncode, said(done)) == (
        EXIT_NOT_MOUNTED,
        f"seglogfs: {plain}: not mounted (no seglogfs mount there)",
    )
    done = seglogfs("umount", tmp_path / "missing")
    assert (done.returncode, said(done)) == (
        EXIT_NOT_MOUNTED,
        f"seglogfs: {tmp_path / 'missing'}: no such directory (no seglogfs mount there)",
    )
    done = seglogfs("mount", tmp_path / "data", tmp_path / "missing")
    assert (done.returncode, said(done)) == (
        EXIT_DATA,
        f"seglogfs: {tmp_path / 'missing'}: mount point is not a directory (no such directory: "
        f"mkdir -p {tmp_path / 'missing'})",
    )
    missing = tmp_path / "no-such-data"
    done = seglogfs("mount", missing, plain, "-o", f"ro,{background_options(tmp_path)}")
    assert (done.returncode, said(done)) == (EXIT_DATA, f"seglogfs: {missing}: no such data dir")
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    done = seglogfs("mount", a_file, plain, "-o", background_options(tmp_path))
    assert (done.returncode, said(done)) == (EXIT_DATA, f"seglogfs: {a_file}: not a directory (a data dir is one)")
    assert not mounts_at(plain) and not missing.exists()
    # Writable, a missing data dir is created, as Kafka creates its log.dirs: one line says so.
    done = seglogfs("mount", missing, unmounted_after(plain), "-o", background_options(tmp_path))
    assert (done.returncode, said(done)) == (
        0,
        f"seglogfs: {missing}: no such data dir: creating it, as Kafka creates log.dirs",
    )
    assert mounts_at(plain) == ["fuse.seglogfs"] and missing.is_dir()
    done = seglogfs("umount", plain)
    assert (done.returncode, done.stderr) == (0, "")


# -- 4. mount(8) runs the install whose helper was installed ---------------------------------------
@needs_root
@pytest.mark.skipif(not shutil.which("unshare"), reason="needs unshare(1)")
def test_mount_runs_the_install_whose_helper_is_installed(tmp_path: Path, unmounted_after) -> None:
    """In a private mount namespace (nothing outside sees it), /sbin gets the helper (an overlay)
    and /usr/local/bin is emptied: mount.fuse3's way, `seglogfs` on PATH, is gone, so
    `mount -t fuse.seglogfs` and an fstab line can only have run the helper, that is, this
    checkout's Python."""
    helpers = tmp_path / "sbin"
    helpers.mkdir()
    helper = helpers / "mount.fuse.seglogfs"
    install = [sys.executable, "-m", "seglogfs.mount_tools.mount_helper", "--install", str(helper)]
    done = subprocess.run(install, capture_output=True, text=True, check=False, timeout=60)
    assert done.returncode == 0 and done.stdout == (
        f"{helper}: mount -t fuse.seglogfs and fstab lines now run {sys.executable} "
        f"-m seglogfs.mount_tools.mount_helper\n"
    ), done
    again = subprocess.run(install, capture_output=True, text=True, check=False, timeout=60)
    assert (again.returncode, again.stdout) == (0, f"{helper}: already runs {sys.executable}\n")
    foreign = helpers / "foreign"
    foreign.write_text("#!/bin/sh\n")
    refused = subprocess.run([*install[:-1], str(foreign)], capture_output=True, text=True, check=False)
    assert refused.returncode == 1 and "was not written by --install; left as is" in refused.stderr
    foreign.unlink()

    data, mountpoint, empty = tmp_path / "data", unmounted_after(tmp_path / "mnt"), tmp_path / "empty"
    mountpoint.mkdir()
    empty.mkdir()
    subprocess.run(
        [sys.executable, "-m", "seglogfs.mount_tools.cli", "produce", str(data), "--topic", "t"],
        input=b"hello\n",
        cwd=REPO,
        check=True,
        timeout=60,
    )
    options = background_options(tmp_path)
    fstab = tmp_path / "fstab"
    fstab.write_text(
        f"{data} {mountpoint} fuse.seglogfs ro,noauto,nofail,_netdev,x-systemd.requires-mounts-for={tmp_path},"
        f"print.offset,{options} 0 0\n"
    )
    sbin = os.path.realpath("/sbin")
    script = f"""
        set -e
        mount -t overlay overlay -o lowerdir={helpers}:{sbin} {sbin}
        mount --bind {empty} /usr/local/bin
        trap 'umount -l {mountpoint} 2>/dev/null || true' EXIT
        mount -t fuse.seglogfs {data} {mountpoint} -o ro,{options}
        cat {mountpoint}/t/0/records
        umount {mountpoint}
        mount --fstab {fstab} {mountpoint}
        cat {mountpoint}/t/0/records
        umount {mountpoint}
    """
    done = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", script],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert (done.returncode, done.stdout, done.stderr) == (0, "hello\nOffset:0\thello\n", "")
