"""The first look at a partition never blocks the filesystem: listing a directory does not measure
its views; while a view is measured (made slow by the test hook), other requests answer, and a
`stat` waiting for it returns when Ctrl-C reaches it; the measure goes on and shows its progress
in `status`; after mounting, unmeasured partitions are measured in the background (not with
`-o measure=lazy`)."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path

import pytest

from seglogfs.engine import BrokerConfig, DataDir
from seglogfs.fs.views import MEASURE_DELAY_ENV
from tests.conftest import AS_FOREGROUND, NOW_MS
from tests.fs.conftest import Mount

BATCHES = 400


def build(path: Path) -> None:
    """t-0: BATCHES batches of 5 records (slow to measure with the hook); t-1: 3 batches."""
    config = BrokerConfig.load(log_dirs=[path])
    with DataDir.open(config, now_ms=NOW_MS) as data_dir:
        data_dir.create_topic("t", 2, now_ms=NOW_MS)
        for partition, batches in ((0, BATCHES), (1, 3)):
            log = data_dir.partition("t", partition)
            for batch in range(batches):
                log.append_records([b"p%d-b%d-r%d" % (partition, batch, r) for r in range(5)], now_ms=NOW_MS)


def status(m: Mount, partition: int) -> dict:
    return json.loads((m.path / "t" / str(partition) / "status").read_text())


def finishes(command: list[str], seconds: float = 30) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(command, capture_output=True, timeout=seconds, check=True)


def wait_until(condition, what: str, seconds: float = 120) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def test_other_requests_answer_while_a_view_is_measured_and_ctrl_c_stops_the_stat(
    mount, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    build(tmp_path / "data")
    monkeypatch.setenv(MEASURE_DELAY_ENV, "25")  # t-0's text view: 400 batches, 10 s
    m: Mount = mount(tmp_path / "data", "-o", "measure=lazy")
    records = m.path / "t" / "0" / "records"
    assert (m.path / "t" / "1" / "records").read_bytes().count(b"\n") == 15  # measured now (75 ms)
    listing = finishes(["ls", "-a", str(m.path / "t" / "0")])  # lists, measures nothing
    assert b"records.jsonl" in listing.stdout
    assert not any(v["measured"] or v["measuredBytes"] for v in status(m, 0)["views"].values())
    waiting = subprocess.Popen([*AS_FOREGROUND, "stat", "-c", "%s", str(records)], stdout=subprocess.PIPE)
    try:
        wait_until(lambda: status(m, 0)["views"].get("text", {}).get("measuredBytes", 0) > 0, "the measure to start")
        # While it measures: a listing, another partition's status and a measured view answer.
        finishes(["ls", "-a", str(m.path / "t" / "0")])
        finishes(["ls", "-la", str(m.path / "t" / "1")])
        assert status(m, 1)["logEndOffset"] == 15
        assert finishes(["cat", str(m.path / "t" / "1" / "records")]).stdout.count(b"\n") == 15
        progress = status(m, 0)["views"]["text"]
        assert not progress["measured"] and 0 < progress["measuredBytes"] < progress["segmentBytes"]
        assert waiting.poll() is None  # all that while, the stat waited for the measure
        waiting.send_signal(signal.SIGINT)
        assert waiting.wait(timeout=5) == -signal.SIGINT  # Ctrl-C reached it: it ended
    finally:
        waiting.kill()
        waiting.wait()
    assert m.process.poll() is None
    wait_until(lambda: status(m, 0)["views"]["text"]["measured"], "the measure to finish in the background")
    expected = b"".join(b"p0-b%d-r%d\n" % (batch, r) for batch in range(BATCHES) for r in range(5))
    assert records.stat().st_size == len(expected)
    assert records.read_bytes() == expected
    assert "got a signal: EINTR" in m.output()


def test_unmeasured_partitions_are_measured_in_the_background(
    mount, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    build(tmp_path / "data")
    monkeypatch.setenv(MEASURE_DELAY_ENV, "1")
    m: Mount = mount(tmp_path / "data")
    for partition in (0, 1):
        wait_until(
            lambda p=partition: all(status(m, p)["views"].get(f, {}).get("measured") for f in ("text", "jsonl")),
            f"partition {partition}'s views measured",
        )
    m.stop()
    lazy: Mount = mount(tmp_path / "data", "-o", "measure=lazy,view.cache=none")
    time.sleep(1)
    assert status(lazy, 0)["views"] == {}  # nothing asked for a view: nothing measured
