"""`seglogfs mount s3://bucket/prefix MNT -o ro`: the tree a read-only mount of the data dir
serves (views, `by-offset`, `by-time`, `status`, `.logdir`), read with real tools; `tail -f`
follows new backup runs; a stalled server makes a read fail with EIO and a log line naming the
object, and the mount stays up; `-o cache.size` bounds what is kept."""

from __future__ import annotations

import os
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from tests.conftest import copy_fixture
from tests.objectstore.conftest import S3
from tests.objectstore.test_backup import produce, run
from tests.objectstore.test_read_stored import big_topic


def shell(command: list[str] | str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        command,
        shell=isinstance(command, str),
        capture_output=True,
        text=True,
        errors="replace",
        timeout=120,
        check=False,
    )


def tree_of(root: Path, skip: tuple[str, ...] = ("append",)) -> dict[str, bytes]:
    out = {}
    for path in sorted(root.rglob("*")):
        name = str(path.relative_to(root))
        if path.is_file() and not path.name.startswith(skip):
            out[name] = path.read_bytes()
    return out


def test_the_mount_of_the_bucket_serves_what_the_mount_of_the_data_dir_serves(s3: S3, tmp_path: Path, mount) -> None:
    data = copy_fixture("experts-kafka-data", tmp_path)
    big_topic(data, 20_000)
    run("backup", data, s3.uri())
    local = mount(data, "-o", "ro")
    stored = mount(s3.uri(), "-o", "ro")
    mount_line = next(line for line in Path("/proc/mounts").read_text().splitlines() if str(stored.path) in line)
    assert mount_line.startswith(f"s3://{s3.bucket}/backup "), mount_line
    for view in ("records", "records.jsonl", "read_committed/records", "by-offset/12345", "by-offset/19990.jsonl"):
        assert (stored.path / "big/0" / view).read_bytes() == (local.path / "big/0" / view).read_bytes(), view
    stamps = sorted(os.listdir(local.path / "big/0/by-time"))
    assert stamps == sorted(os.listdir(stored.path / "big/0/by-time"))
    assert (stored.path / "big/0/status").read_text() == (local.path / "big/0/status").read_text()
    assert tree_of(stored.path / "sensor-data") == tree_of(local.path / "sensor-data")
    for tool in ("grep -c 00017", "wc -l"):
        counted = shell(f"{tool} < {stored.path}/big/0/records").stdout
        assert counted == shell(f"{tool} < {local.path}/big/0/records").stdout and int(counted) > 0
    head = shell(f"cat {stored.path}/big/0/records | head -3")
    assert head.stdout.splitlines() == (local.path / "big/0/records").read_text().splitlines()[:3]
    listing = shell(["rsync", "-a", "--checksum", f"{stored.path}/.logdir/", str(tmp_path / "copied")])
    assert listing.returncode == 0, listing.stderr
    for name in ("big-0", "sensor-data-0"):
        for file in (local.path / ".logdir" / name).iterdir():
            assert (tmp_path / "copied" / name / file.name).read_bytes() == file.read_bytes(), file.name
    write = shell(f"echo x >> {stored.path}/big/append")
    assert write.returncode != 0 and "Read-only file system" in write.stderr


def test_tail_follows_new_backup_runs_once(s3: S3, tmp_path: Path, mount) -> None:
    data = tmp_path / "data"
    produce(data, "t", [f"run0-{n}" for n in range(100)], "--override", "log.segment.bytes=6000")
    run("backup", data, s3.uri())
    stored = mount(s3.uri(), "-o", "ro")
    out = tmp_path / "tail.out"
    with open(out, "wb") as sink:
        tail = subprocess.Popen(["tail", "-n", "+1", "-f", str(stored.path / "t/0/records")], stdout=sink)
    try:
        expected = [f"run0-{n}" for n in range(100)]
        for round_ in range(1, 4):
            lines = [f"run{round_}-{n}" for n in range(150)]
            produce(data, "t", lines, "--override", "log.segment.bytes=6000")
            run("backup", data, s3.uri())
            expected += lines
            deadline = time.monotonic() + 30
            while out.read_text().splitlines() != expected:
                assert time.monotonic() < deadline, (
                    f"tail -f saw {len(out.read_text().splitlines())} of {len(expected)}"
                )
                time.sleep(0.2)
        time.sleep(3)
        assert out.read_text().splitlines() == expected
    finally:
        tail.send_signal(signal.SIGTERM)
        tail.wait(timeout=10)


@pytest.mark.expect_warnings(r"s3://b-\w+/backup/big-0/\d{20}\.log: (opening|reading)")
def test_a_stalled_server_fails_the_read_not_the_mount(s3: S3, tmp_path: Path, mount) -> None:
    data = tmp_path / "data"
    big_topic(data, 20_000)
    run("backup", data, s3.uri())
    logs = sorted(path.name for path in (data / "big-0").glob("*.log"))
    second, last = logs[1], logs[-1]
    uri = s3.uri() + "?request_timeout=1&connect_timeout=1&retries=0"
    stored = mount(uri, "-o", "ro,measure=lazy")
    # (no view read yet: a view's size is measured from its records, which reads its segments)
    assert (stored.path / ".logdir/big-0" / last).read_bytes() == (data / "big-0" / last).read_bytes()
    s3.server.pause()
    try:
        failed = shell(["cat", str(stored.path / ".logdir/big-0" / second)])
        assert failed.returncode != 0 and "Input/output error" in failed.stderr, failed
    finally:
        s3.server.resume()
    assert s3.bucket in stored.output() and second in stored.output()
    assert (stored.path / "big/0/by-offset/10").read_bytes().startswith(b"00000010 ")
    assert (stored.path / ".logdir/big-0" / second).read_bytes() == (data / "big-0" / second).read_bytes()


def test_the_cache_size_bounds_what_the_mount_keeps(s3: S3, tmp_path: Path, mount) -> None:
    data = tmp_path / "data"
    big_topic(data)
    run("backup", data, s3.uri())
    stored = mount(s3.uri(), "-o", "ro,cache.size=1m,measure=lazy")
    for _ in range(2):
        lines = (stored.path / "big/0/records").read_text().splitlines()
        assert lines == [f"{n:08d} " + "v" * 190 for n in range(60_000)]
    copies = list(Path(tempfile.gettempdir()).glob(f"seglogfs-stored-{stored.process.pid}-*"))
    assert len(copies) == 1
    held = sum(p.stat().st_blocks * 512 for p in copies[0].glob("big-0/*.log"))
    assert held <= 5 << 20, held  # (1 MiB, passed by at most one read's span)
    stored.stop()
    assert not copies[0].exists()
