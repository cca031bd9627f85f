"""Four writers and four `tail -f` followers on one partition; an unmount in the middle of
writing loses no acknowledged line."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from seglogfs.fs.operations import GETATTR_DELAY_ENV, INVALIDATE_DELAY_ENV
from tests.conftest import REPO
from tests.fs.conftest import Mount

SECONDS = float(os.environ.get("SEGLOGFS_CONCURRENCY_SECONDS", "20"))
WRITERS = 4


def start_writer(append: Path, writer: int, seconds: float) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.fs.line_writer", str(append), str(writer), str(seconds)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


def acknowledged(process: subprocess.Popen[bytes]) -> int:
    out, _ = process.communicate(timeout=120)
    acks = [int(n) for n in re.findall(rb"acked (\d+)", out)]
    return max(acks, default=0)


def check_lines(text: bytes, acked: dict[int, int], what: str) -> None:
    """Every acknowledged line exactly once, each writer's lines in order."""
    lines = text.split(b"\n")[:-1]
    assert len(lines) == len(set(lines)), f"{what}: a line appears twice"
    per_writer: dict[int, list[int]] = {}
    for line in lines:
        writer, n = line[1:].split(b"-")
        per_writer.setdefault(int(writer), []).append(int(n))
    for writer, last in acked.items():
        got = per_writer.get(writer, [])
        assert got == list(range(1, len(got) + 1)), f"{what}: writer {writer}'s lines out of order or missing"
        assert len(got) >= last, f"{what}: writer {writer} acknowledged {last} lines, {len(got)} arrived"


def test_four_writers_and_four_followers(mount) -> None:
    m: Mount = mount()
    os.mkdir(m.path / "t")
    records = m.path / "t" / "0" / "records"
    outputs = [m.path.parent / f"follower-{i}.out" for i in range(4)]
    followers = []
    for output in outputs:
        with open(output, "wb") as sink:
            followers.append(subprocess.Popen(["tail", "-f", "-n", "+1", str(records)], stdout=sink))
    try:
        writers = [start_writer(m.path / "t" / "0" / "append", w, SECONDS) for w in range(WRITERS)]
        acked = {w: acknowledged(p) for w, p in enumerate(writers)}
        assert all(acked.values()), acked
        total = (m.path / "t" / "0" / "records").stat().st_size
        deadline = time.monotonic() + 10
        while any(o.stat().st_size < total for o in outputs) and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        for follower in followers:
            follower.kill()
            follower.wait(timeout=10)
    check_lines(records.read_bytes(), acked, "records")
    for output in outputs:
        check_lines(output.read_bytes(), acked, output.name)


def test_a_stale_stat_never_lands_after_a_read_past_it(mount, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two followers: one's fstat is answered before an append and lands after the other has
    read the append (the answers are held back by a test hook, and so is the append's
    invalidation). The reader's next fstat must not give the older size: `tail -f` would call
    the file truncated and print it again. (The fix holds however late the read comes; the test
    shows the race when the read comes within the 2 s the stale answer is held back, which it
    does on any but a very slow machine.)"""
    monkeypatch.setenv(GETATTR_DELAY_ENV, "2000")
    monkeypatch.setenv(INVALIDATE_DELAY_ENV, "4000")
    m: Mount = mount()
    os.mkdir(m.path / "t")
    partition = m.path / "t" / "0"
    with open(partition / "append", "ab", buffering=0) as writer:
        writer.write(b"one\n")  # (returns once its invalidation is sent: 4 s)
        reader = os.open(partition / "records", os.O_RDONLY)
        try:
            assert os.pread(reader, 100, 0) == b"one\n"
            other = threading.Thread(target=os.fstat, args=(reader,))  # answered 4, two seconds late
            other.start()
            time.sleep(0.2)
            second = threading.Thread(target=writer.write, args=(b"two\n",))
            second.start()
            deadline = time.monotonic() + 10
            while (read := os.pread(reader, 100, 0)) == b"one\n" and time.monotonic() < deadline:
                time.sleep(0.01)
            assert read == b"one\ntwo\n"
            other.join()
            assert os.fstat(reader).st_size == len(read)
            second.join()
        finally:
            os.close(reader)


def test_unmount_during_writes_loses_no_acknowledged_line(mount, tmp_path: Path) -> None:
    m: Mount = mount()
    os.mkdir(m.path / "t")
    writers = [start_writer(m.path / "t" / "0" / "append", w, 60) for w in range(WRITERS)]
    time.sleep(3)
    m.process.send_signal(signal.SIGTERM)  # unmount and close while the writers write
    acked = {w: acknowledged(p) for w, p in enumerate(writers)}
    m.process.wait(timeout=60)
    assert all(acked.values()), acked
    again: Mount = mount(m.data)
    check_lines((again.path / "t" / "0" / "records").read_bytes(), acked, "after remount")
