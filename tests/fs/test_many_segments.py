"""A partition of 2,000 segments under `ulimit -n 256`: the mount (status over every segment,
records, by-offset views all over the log, retention deleting 200 segments at once) and the CLI
(`consume`, `check`) work within the descriptor limit, because segments give their files back
(engine.log.handles). Without that, one `cat status` held four descriptors per segment."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from seglogfs.engine import BrokerConfig, DataDir
from tests.conftest import REPO
from tests.fs.conftest import Mount

SEGMENTS = 2000
EXPIRED = 200  # the oldest segments, two days old: retention deletes them while mounted
NOFILE = 256
DAY_MS = 86_400_000


def value(offset: int) -> bytes:
    return b"record-%d" % offset


def build(data: Path, now_ms: int) -> None:
    """One record per segment (segment.bytes=100). fsync is skipped while building: the data
    is the test's own, and 2,000 rolls would fsync 2,000 times."""
    with pytest.MonkeyPatch.context() as patched:
        patched.setattr(os, "fsync", lambda fd: None)
        config = BrokerConfig.load(overrides=["log.segment.bytes=100"], log_dirs=[data])
        with DataDir.open(config, now_ms=now_ms) as data_dir:
            data_dir.create_topic("t", 1, now_ms=now_ms)
            log = data_dir.partition("t", 0)
            for offset in range(SEGMENTS):
                timestamp = now_ms - 2 * DAY_MS if offset < EXPIRED else now_ms - SEGMENTS + offset
                log.append_records([value(offset)], timestamps=[timestamp], now_ms=now_ms)
            assert len(log.segments) == SEGMENTS


def limit_descriptors() -> None:
    """`ulimit -n 256` (soft; in a child, before it runs anything)."""
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (NOFILE, hard))


@contextmanager
def descriptor_limit() -> Iterator[None]:
    """This process at `ulimit -n 256` while it starts a child, which inherits the limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (NOFILE, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def child_limit(pid: int) -> int:
    for line in Path(f"/proc/{pid}/limits").read_text().splitlines():
        if line.startswith("Max open files"):
            return int(line.split()[3])
    raise AssertionError("no open-file limit")


@pytest.fixture
def many(tmp_path: Path) -> tuple[Path, int]:
    data = tmp_path / "data"
    now_ms = int(time.time() * 1000)
    build(data, now_ms)
    return data, now_ms


def test_a_mount_of_2000_segments_at_ulimit_256(mount, many: tuple[Path, int]) -> None:
    data, now_ms = many
    options = [
        "-o",
        "log.retention.ms=86400000,log.retention.check.interval.ms=200,log.segment.delete.delay.ms=300,"
        "log.flush.offset.checkpoint.interval.ms=500",
    ]
    with descriptor_limit():
        m: Mount = mount(data, *options)
    pid = m.process.pid
    assert child_limit(pid) == NOFILE
    part = m.path / "t" / "0"

    # The scheduler's retention removes the 200 expired segments at once (one pass).
    deadline = time.monotonic() + 30
    while (status := json.loads((part / "status").read_bytes()))["logStartOffset"] < EXPIRED:
        assert time.monotonic() < deadline, "retention did not run"
        time.sleep(0.1)
    assert status["logStartOffset"] == EXPIRED
    # `cat status`: every segment's max timestamp (each segment's indexes and log opened).
    status = json.loads(subprocess.run(["cat", str(part / "status")], check=True, capture_output=True).stdout)
    segments = status["segments"]
    assert [s["baseOffset"] for s in segments] == list(range(EXPIRED, SEGMENTS))
    assert [s["maxTimestamp"] for s in segments] == [now_ms - SEGMENTS + o for o in range(EXPIRED, SEGMENTS)]

    # `cat records`: every segment read through.
    records = subprocess.run(["cat", str(part / "records")], check=True, capture_output=True).stdout
    assert records == b"".join(value(o) + b"\n" for o in range(EXPIRED, SEGMENTS))

    # by-offset/N all over the log: each a look-up (indexes) and a read to the end.
    for offset in range(EXPIRED, SEGMENTS, (SEGMENTS - EXPIRED) // 100):
        view = part / "by-offset" / str(offset)
        assert view.read_bytes() == b"".join(value(o) + b"\n" for o in range(offset, SEGMENTS)), offset

    # The delayed deletes ran, and the scheduler goes on (flushes, checkpoints) without errors.
    deadline = time.monotonic() + 30
    while any(name.endswith(".deleted") for name in os.listdir(data / "t-0")):
        assert time.monotonic() < deadline, "the .deleted files stayed"
        time.sleep(0.1)
    time.sleep(1.0)
    assert json.loads((part / "status").read_bytes())["logStartOffset"] == EXPIRED
    open_now = len(os.listdir(f"/proc/{pid}/fd"))
    assert open_now < NOFILE - 32, open_now
    # The fixture unmounts and checks the mount exited 0 and logged no warning or traceback.


def seglogfs(*args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [sys.executable, "-m", "seglogfs.mount_tools.cli", *args],
        cwd=REPO,
        capture_output=True,
        timeout=300,
        preexec_fn=limit_descriptors,
        check=False,
    )


def test_consume_and_check_of_2000_segments_at_ulimit_256(many: tuple[Path, int]) -> None:
    data, _now_ms = many
    consumed = seglogfs("consume", str(data), "--topic", "t", "--from-beginning")
    assert consumed.returncode == 0, consumed.stderr.decode()
    assert consumed.stdout == b"".join(value(o) + b"\n" for o in range(SEGMENTS))
    checked = seglogfs("check", str(data))
    assert checked.returncode == 0, (checked.stdout + checked.stderr).decode()
    assert b"Too many open files" not in checked.stdout + checked.stderr
