"""SIGKILL a producing process at random moments, reopen, and check what survived."""

from __future__ import annotations

import json
import os
import random
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from seglogfs.engine import BrokerConfig, DataDir
from seglogfs.mount_tools.cli import main as cli_main
from tests.cli.crash_writer import value_for
from tests.conftest import NOW_MS, REPO, assert_log_dir_valid

pytestmark = pytest.mark.expect_warnings(r"cut \d+ bytes after the last valid batch")

TRIALS = int(os.environ.get("SEGLOGFS_CRASH_TRIALS", "30"))


def run_until_killed(log_dir: Path, seed: int, delay_s: float) -> int:
    """Start the writer, wait until it is ready, let it run `delay_s`, SIGKILL it; returns the
    highest acknowledged log end offset (0 when none was acknowledged)."""
    process = subprocess.Popen(
        [sys.executable, "-m", "tests.cli.crash_writer", str(log_dir), str(seed)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    acked = 0
    try:
        assert process.stdout is not None
        first = process.stdout.readline()
        assert first.startswith(b"ready"), first + process.stderr.read() if process.stderr else first
        deadline = time.monotonic() + delay_s
        buffered = b""
        fd = process.stdout.fileno()
        os.set_blocking(fd, False)
        while (remaining := deadline - time.monotonic()) > 0:
            ready, _, _ = select.select([fd], [], [], remaining)
            if ready:
                chunk = os.read(fd, 65536)
                if not chunk:
                    break
                buffered += chunk
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=30)
        while chunk := _read_rest(fd):
            buffered += chunk
        # Only complete lines count: the kill may land between two writes of one line.
        for line in buffered.split(b"\n")[:-1]:
            if line.startswith(b"acked "):
                acked = max(acked, int(line.split()[1]))
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        for stream in (process.stdout, process.stderr):
            if stream is not None:
                stream.close()
    assert process.returncode == -signal.SIGKILL, f"writer ended on its own with {process.returncode}"
    return acked


def _read_rest(fd: int) -> bytes:
    try:
        return os.read(fd, 65536)
    except BlockingIOError:
        return b""


@pytest.mark.parametrize("trial", range(TRIALS))
def test_sigkill_loses_no_acknowledged_record(tmp_path: Path, trial: int) -> None:
    rng = random.Random(trial)
    log_dir = tmp_path / "logs"
    acked_before = 0
    set_aside = False  # whether a recovery cut a torn tail (kept beside the data dir)
    # Two kills in a row: the second one lands on a dir that was itself recovered from a crash.
    for round_number in range(2):
        acked = run_until_killed(log_dir, seed=trial * 10 + round_number, delay_s=rng.uniform(0.0, 0.4))
        acked = max(acked, acked_before)
        config = BrokerConfig.load(overrides=["log.segment.bytes=20000"], log_dirs=[log_dir])
        with DataDir.open(config, now_ms=NOW_MS) as data_dir:
            log = data_dir.partition("crash", 0)
            set_aside = set_aside or bool(log.set_aside)
            records = list(log.records(0))
            assert log.log_end_offset >= acked, f"acknowledged up to {acked}, recovered only {log.log_end_offset}"
            assert [r.offset for r in records] == list(range(log.log_end_offset))
            for record in records:
                assert record.value == value_for(record.offset), f"offset {record.offset} holds the wrong value"
            acked_before = log.log_end_offset
        assert_log_dir_valid(log_dir)
    # Appending continues at the right offset after the last recovery.
    config = BrokerConfig.load(log_dirs=[log_dir])
    with DataDir.open(config, now_ms=NOW_MS) as data_dir:
        log = data_dir.partition("crash", 0)
        end = log.log_end_offset
        info = log.append_records([value_for(end)], now_ms=NOW_MS)
        assert info.first_offset == end
    # Exit 7: no problems, but what recovery cut is set aside beside the data dir.
    assert cli_main(["check", str(log_dir)]) == (7 if set_aside else 0)


def test_readers_beside_a_live_writer_see_only_whole_records(tmp_path: Path) -> None:
    """consume opens read-only and takes no lock: while another process appends and rolls,
    every read is a gap-free prefix of what the writer wrote, with the right values."""
    log_dir = tmp_path / "live"
    process = subprocess.Popen(
        [sys.executable, "-m", "tests.cli.crash_writer", str(log_dir), "7"],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    try:
        assert process.stdout is not None and process.stdout.readline().startswith(b"ready")
        process.stdout.readline()  # the first acknowledgement: data exists
        seen = []
        for _ in range(5):
            result = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "seglogfs.mount_tools.cli",
                    "consume",
                    str(log_dir),
                    "--topic",
                    "crash",
                    "--from-beginning",
                    "--format",
                    "jsonl",
                ],
                cwd=REPO,
                capture_output=True,
                timeout=120,
                check=False,
            )
            assert result.returncode == 0, result.stderr
            records = [json.loads(line) for line in result.stdout.splitlines()]
            assert [r["offset"] for r in records] == list(range(len(records)))
            assert all(r["value"] == value_for(r["offset"]).decode() for r in records)
            seen.append(len(records))
        assert seen[-1] > seen[0] > 0, f"the writer should have moved on between reads: {seen}"
    finally:
        process.kill()
        process.wait()
        if process.stdout is not None:
            process.stdout.close()
