"""`rsync -a MNT/.logdir/ BACKUP/` while writers run: a consistent copy, as writable as the data
dir; a second rsync copies only what changed; the copy mounts and reads back."""

from __future__ import annotations

import os
import re
import stat
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from seglogfs.engine import BrokerConfig, DataDir
from seglogfs.engine.log.time_index import TIME_INDEX_DTYPE
from seglogfs.engine.mirror import Mirror, MirrorFile
from tests.conftest import NOW_MS, REPO
from tests.fs.conftest import Mount
from tests.fs.test_concurrency import acknowledged, start_writer


def rsync(source: Path, target: Path) -> tuple[list[str], str]:
    done = subprocess.run(
        ["rsync", "-a", "--stats", "--out-format=%n", f"{source}/", f"{target}/"],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert done.returncode == 0, f"rsync exited {done.returncode}: {done.stderr}"
    names = [line for line in done.stdout.splitlines() if line and not line.startswith(("Number", "Total"))]
    names = [n for n in names if "/" in n and not n.endswith("/")] + [n for n in names if "/" not in n and "." in n]
    return names, done.stdout


def check(data: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "seglogfs.mount_tools.cli", "check", str(data)],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_rsync_of_the_logdir_mirror(mount, tmp_path: Path) -> None:
    m: Mount = mount(None, "-o", "num.partitions=2,log.segment.bytes=20000")
    os.mkdir(m.path / "t")
    backup = tmp_path / "backup"
    writers = [start_writer(m.path / "t" / str(p) / "append", p, 6) for p in range(2)]
    time.sleep(2)
    rsync(m.path / ".logdir", backup)  # while the writers write
    for writer in writers:
        acknowledged(writer)
    check(backup)
    for path in [backup, *backup.rglob("*")]:  # the mirror shows the files' own modes: rsync -a keeps them
        assert stat.S_IMODE(path.stat().st_mode) == (0o755 if path.is_dir() else 0o644), path
    for p in range(2):
        live = (m.path / "t" / str(p) / "records").read_bytes()
        copied = backup / f"t-{p}"
        assert copied.is_dir()
        with_copy = subprocess.run(
            [
                sys.executable,
                "-m",
                "seglogfs.mount_tools.cli",
                "consume",
                str(backup),
                "--topic",
                "t",
                "--partition",
                str(p),
                "--from-beginning",
            ],
            cwd=REPO,
            capture_output=True,
            check=True,
        ).stdout
        assert with_copy and live.startswith(with_copy), f"partition {p}: the copy is not a prefix"
    # Once the writers are done the copy catches up; then more writes to partition 0, enough to
    # roll: the next rsync copies only that partition's new and changed files.
    rsync(m.path / ".logdir", backup)
    sealed = {f"t-{p}/{name}" for p in range(2) for name in os.listdir(backup / f"t-{p}") if name.endswith(".log")}
    active = {f"t-{p}/{max(n for n in os.listdir(backup / f't-{p}') if n.endswith('.log'))}" for p in range(2)}
    sealed -= active
    (m.path / "t" / "0" / "append").write_bytes(b"".join(b"more-%d\n" % i for i in range(4000)))
    transferred, stats = rsync(m.path / ".logdir", backup)
    assert re.search(r"Number of regular files transferred: \d+", stats), stats
    assert not sealed & set(transferred), f"unchanged sealed segments copied again: {sealed & set(transferred)}"
    assert any(name.startswith("t-0/") and name.endswith(".log") for name in transferred)
    assert not any(name.startswith("t-1/") and name.endswith(".log") for name in transferred), transferred
    check(backup)
    # The copy mounts and reads back what the live mount shows.
    copy_mount: Mount = mount(backup, "-o", "ro")
    for p in range(2):
        assert (copy_mount.path / "t" / str(p) / "records").read_bytes() == (
            m.path / "t" / str(p) / "records"
        ).read_bytes()


def test_an_active_segment_s_indexes_are_cut_to_its_log_as_last_shown(tmp_path: Path) -> None:
    """rsync copies `.index`, `.log`, `.timeindex` in that order while a writer appends: the
    `.timeindex` read after the `.log` holds no entry past the `.log` copied, and the copy checks
    clean; the next look at the `.log` moves the bound on."""
    config = BrokerConfig.load(overrides=["log.index.interval.bytes=100"], log_dirs=[tmp_path / "data"])
    with DataDir.open(config, now_ms=NOW_MS) as data_dir:
        data_dir.create_topic("t", 1, now_ms=NOW_MS)
        log = data_dir.partition("t", 0)
        mirror = Mirror(data_dir)
        names = ("t-0", "00000000000000000000")
        stamp = iter(range(NOW_MS, NOW_MS + 1000))

        def append(count: int) -> None:
            for _ in range(count):
                log.append_records([b"x" * 150], timestamps=[next(stamp)], now_ms=NOW_MS)

        def content(suffix: str) -> bytes:
            handle = MirrorFile(mirror, (*names[:1], names[1] + suffix))
            try:
                return handle.read(0, handle.entry.size)
            finally:
                handle.close()

        append(10)
        backup = tmp_path / "backup" / "t-0"
        backup.mkdir(parents=True)
        for suffix in (".index", ".log"):
            (backup / f"{names[1]}{suffix}").write_bytes(content(suffix))
        append(10)  # between the `.log` and the `.timeindex`
        (backup / f"{names[1]}.timeindex").write_bytes(content(".timeindex"))
        shown_log = (backup / f"{names[1]}.log").read_bytes()
        entries = np.frombuffer((backup / f"{names[1]}.timeindex").read_bytes(), dtype=TIME_INDEX_DTYPE)
        assert len(entries) > 0
        assert int(entries["relative_offset"].max()) < 10, "a time index entry past the .log copied"
        assert len(shown_log) < log.active_segment.size
        assert len(np.frombuffer(content(".timeindex"), dtype=TIME_INDEX_DTYPE)) == len(entries)
        content(".log")  # looked at again: the bound moves on
        later = np.frombuffer(content(".timeindex"), dtype=TIME_INDEX_DTYPE)
        assert int(later["relative_offset"].max()) >= 10
