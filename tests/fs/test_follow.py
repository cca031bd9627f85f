"""A read-only mount beside another writer: what `seglogfs produce` appends, rolls, retains and
compacts in the data dir shows through the mount's views, `status` and `.logdir` within two
seconds (`tail -f` sees every record once, in order), and the views agree with each other."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from seglogfs.fs.operations import INVALIDATE_DELAY_ENV
from tests.fs.conftest import Mount, check_mount_log

SEGLOGFS = [sys.executable, "-m", "seglogfs.mount_tools.cli"]
SMALL_SEGMENTS = ["--override", "log.segment.bytes=4000"]


def produce(data: Path, lines: list[str]) -> None:
    subprocess.run(
        [*SEGLOGFS, "produce", str(data), "--topic", "t", *SMALL_SEGMENTS, "--property", "parse.key=true"],
        input="".join(line + "\n" for line in lines).encode(),
        check=True,
        capture_output=True,
    )


def clean(data: Path, *overrides: str) -> str:
    done = subprocess.run(
        [*SEGLOGFS, "clean", str(data), *SMALL_SEGMENTS, *(x for o in overrides for x in ("--override", o))],
        check=True,
        capture_output=True,
        text=True,
    )
    return done.stdout


def consumed(data: Path) -> list[str]:
    """The partition's records as the CLI reads them from the data dir (values, one per line)."""
    done = subprocess.run(
        [*SEGLOGFS, "consume", str(data), "--topic", "t", "--from-beginning"], check=True, capture_output=True
    )
    return done.stdout.decode().splitlines()


def views(m: Mount) -> tuple[int, int, int]:
    """(records per `status`, lines of `records`, lines of `records.jsonl`) read one after the other."""
    partition = m.path / "t" / "0"
    status = json.loads((partition / "status").read_text())
    return (
        status["logEndOffset"] - status["logStartOffset"],
        (partition / "records").read_bytes().count(b"\n"),
        (partition / "records.jsonl").read_bytes().count(b"\n"),
    )


def wait_for(condition, what: str, timeout: float = 2.0) -> float:
    """Seconds until `condition()` held; fails after `timeout`."""
    start = time.monotonic()
    while not condition():
        assert time.monotonic() - start < timeout, f"not within {timeout} s: {what}"
        time.sleep(0.05)
    return time.monotonic() - start


def test_a_read_only_mount_follows_another_writer(mount, tmp_path: Path) -> None:
    data = tmp_path / "data"
    produce(data, [f"k{i % 40}\tv{i}" for i in range(300)])
    m: Mount = mount(data, "-o", "ro")
    out = tmp_path / "tail.out"
    with open(out, "wb") as sink:
        tail = subprocess.Popen(["tail", "-n", "+1", "-f", str(m.path / "t" / "0" / "records")], stdout=sink)
    try:
        wait_for(lambda: out.read_bytes().count(b"\n") == 300, "tail's first 300 lines")
        sent = 300
        latencies = []
        for round_ in range(8):
            produce(data, [f"k{i % 40}\tv{i}" for i in range(sent, sent + 150)])
            sent += 150
            last = f"v{sent - 1}\n".encode()
            latencies.append(wait_for(lambda: out.read_bytes().endswith(last), f"tail showing {last!r}"))  # noqa: B023
            if round_ % 3 == 2:  # retention by another process, while the views are followed
                assert "deleted" in clean(data, "log.retention.bytes=5000")
            # Quiet now: the three views must agree with each other and with the data dir.
            wait_for(lambda: views(m)[0] == len(consumed(data)), "status catching up")
            assert len(set(views(m))) == 1, views(m)
            logdir = m.path / ".logdir" / "t-0"
            on_disk = sorted(p.name for p in (data / "t-0").glob("*.log"))
            assert sorted(p.name for p in logdir.glob("*.log")) == on_disk
            assert sum((logdir / n).stat().st_size for n in on_disk) == sum(
                (data / "t-0" / n).stat().st_size for n in on_disk
            )
        assert max(latencies) < 2.0
        lines = out.read_bytes().decode().splitlines()
        assert lines == [f"v{i}" for i in range(sent)]  # every record once, in order, across rolls and deletes
        assert (m.path / "t" / "0" / "records").read_text().splitlines() == consumed(data)

        # Compaction by another process swaps segments under the views: they show the result.
        report = clean(data, "log.cleanup.policy=compact", "log.cleaner.min.cleanable.ratio=0.01")
        assert "compacted" in report, report
        wait_for(lambda: (m.path / "t" / "0" / "records").read_text().splitlines() == consumed(data), "compaction")
        _, text_lines, jsonl_lines = views(m)
        jsonl = [json.loads(line) for line in (m.path / "t" / "0" / "records.jsonl").read_text().splitlines()]
        assert text_lines == jsonl_lines == len(jsonl) < sent
        assert [r["value"] for r in jsonl] == consumed(data)
        status = json.loads((m.path / "t" / "0" / "status").read_text())
        assert status["logEndOffset"] == jsonl[-1]["offset"] + 1 == sent
    finally:
        tail.terminate()
        tail.wait(timeout=10)
    m.stop()
    assert m.process.returncode == 0
    check_mount_log(m, [])


def test_a_follower_never_reads_past_the_size_fstat_gives(
    mount, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`tail -f` reads to the end, then fstat's: a size below what it read is "file truncated" to
    it, and it prints the file again. A read returns what the view holds when it is read, which
    can be more than the size the kernel holds: here the mount's invalidation after taking in
    another writer's append is held back (a test hook) while the follower reads."""
    data = tmp_path / "data"
    produce(data, ["k\tone"])
    monkeypatch.setenv(INVALIDATE_DELAY_ENV, "2000")
    m: Mount = mount(data, "-o", "ro")
    follower = os.open(m.path / "t" / "0" / "records", os.O_RDONLY)
    try:
        assert os.fstat(follower).st_size == 4  # (the kernel holds 4 from here)
        produce(data, ["k\ttwo"])
        wait_for(lambda: os.pread(follower, 100, 0) == b"one\ntwo\n", "the second record", timeout=1.5)
        assert os.fstat(follower).st_size == 8
    finally:
        os.close(follower)


def test_a_read_only_mount_never_shows_a_batch_being_written(mount, tmp_path: Path) -> None:
    """Only complete batches: a batch cut short at the end of the active segment (a writer
    midway, or killed) is not in any view until it is whole."""
    data = tmp_path / "data"
    produce(data, [f"k\tv{i}" for i in range(10)])
    m: Mount = mount(data, "-o", "ro")
    segment = data / "t-0" / f"{0:020d}.log"
    whole = segment.read_bytes()
    batch = whole[-(len(whole) // 10) :]  # not a batch boundary: a piece of the last batch
    with open(segment, "ab") as log:
        log.write(batch[: len(batch) // 2])
        log.flush()
        time.sleep(1.5)  # several looks of the mount
        assert views(m) == (10, 10, 10)
        assert (m.path / "t" / "0" / "records").read_text().splitlines() == [f"v{i}" for i in range(10)]
        os.ftruncate(log.fileno(), len(whole))  # the writer's recovery cuts it back
    produce(data, [f"k\tv{i}" for i in range(10, 20)])
    wait_for(lambda: views(m) == (20, 20, 20), "the next complete batch")
    m.stop()
    assert m.process.returncode == 0
    check_mount_log(m, [])


def test_a_read_only_mount_follows_topics_another_process_creates_and_deletes(mount, tmp_path: Path) -> None:
    data = tmp_path / "data"
    produce(data, ["k\tv0"])
    m: Mount = mount(data, "-o", "ro")
    assert sorted(p.name for p in m.path.iterdir() if not p.name.startswith(".")) == ["t"]
    subprocess.run(
        [*SEGLOGFS, "produce", str(data), "--topic", "u", "--override", "num.partitions=2"],
        input=b"one\ntwo\n",
        check=True,
        capture_output=True,
    )

    # (the mount's look may have come while `produce` was making the partition dirs, one after
    # the other: the second shows at the next look)
    def both_partitions() -> bool:
        topic = m.path / "u"
        return topic.is_dir() and sorted(p.name for p in topic.iterdir() if p.name.isdigit()) == ["0", "1"]

    wait_for(both_partitions, "the new topic's two partitions")
    wait_for(
        lambda: (
            sorted((m.path / "u" / "0" / "records").read_text().splitlines())
            + sorted((m.path / "u" / "1" / "records").read_text().splitlines())
            in (["one", "two"], ["two", "one"], ["one", "two"][::-1])
        ),
        "the new topic's records",
    )
    subprocess.run([*SEGLOGFS, "topics", str(data), "delete", "--topic", "u"], check=True, capture_output=True)
    wait_for(lambda: not (m.path / "u").exists(), "the deleted topic gone")
    assert (m.path / "t" / "0" / "records").read_text() == "v0\n"
    m.stop()
    assert m.process.returncode == 0
    check_mount_log(m, [])
