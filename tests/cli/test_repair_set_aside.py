"""`check --repair` and recovery keep what they remove from a log beside the data dir, byte for
byte, and `check` reports it until an operator removes the place (engine.log.set_aside)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from seglogfs.engine import BrokerConfig, DataDir
from seglogfs.engine.producer import Producer
from seglogfs.engine.text.console_formats import LineFormat
from tests.cli.support import run
from tests.conftest import NOW_MS, REPO, broker_config, unmount

SEGMENT_BYTES = 600  # 8 segments of 2 batches of 10 records


def place_of(data: Path) -> Path:
    return data.with_name(data.name + ".seglogfs-set-aside")


def tree_digest(*roots: Path) -> dict[str, str]:
    """Every file and directory below `roots` (names, modes, bytes): what "changed nothing" means."""
    seen = {}
    for root in roots:
        for path in sorted([root, *root.rglob("*")]):
            info = path.lstat()
            content = hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else ""
            seen[str(path)] = f"{info.st_mode:o} {info.st_size} {content}"
    return seen


def log_files(data: Path) -> dict[str, bytes]:
    return {path.name: path.read_bytes() for path in sorted((data / "t-0").glob("*.log"))}


@pytest.fixture(scope="session")
def eight_segments_made(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Partition t-0 of 160 records, 10 a batch, in 8 segments of 20 (bases 0, 20, … 140),
    produced once: each test takes a copy (`eight_segments`)."""
    data = tmp_path_factory.mktemp("eight-segments") / "data"
    # (in this process, as each of 16 runs of `seglogfs produce` would append its 10 lines, and
    # close: the runs took 11-16 s of each test worker's set-up)
    for start in range(0, 160, 10):
        now = time.time_ns() // 1_000_000
        with DataDir.open(broker_config(data, log_segment_bytes=SEGMENT_BYTES), now_ms=now) as opened:
            producer = Producer(opened.partition_for_append("t", 0, now_ms=now), LineFormat.from_properties({}))
            lines = [b"value-%d" % n for n in range(start, start + 10)]
            assert producer.send(lines, now, "stdin", first_line=1, atomic=False).records == 10
            for log in producer.logs:
                log.flush()
    assert sorted(log_files(data)) == [f"{base:020d}.log" for base in range(0, 160, 20)]
    return data


@pytest.fixture
def eight_segments(eight_segments_made: Path, tmp_path: Path) -> Path:
    """A copy of `eight_segments_made`, the test's own."""
    return Path(shutil.copytree(eight_segments_made, tmp_path / "data", symlinks=True))


def flip_a_byte(data: Path, base: int, position: int = 100) -> None:
    path = data / "t-0" / f"{base:020d}.log"
    content = bytearray(path.read_bytes())
    content[position] ^= 0xFF
    path.write_bytes(bytes(content))


def test_repair_of_a_flipped_byte_in_a_middle_segment_keeps_the_records_after_it(eight_segments: Path) -> None:
    data = eight_segments
    flip_a_byte(data, 80)  # in the segment's first batch (offsets 80 to 89): its CRC fails
    before = log_files(data)

    repaired = run("check", str(data), "--repair", code=7)
    place = place_of(data)
    [run_dir] = place.iterdir()
    kept = run_dir / "t-0"
    lines = repaired.stdout.splitlines()
    # The repair names the place, each piece's offsets and records, and never says "clean".
    assert f"repair set aside {kept}/00000000000000000080.log: offsets 80 to 99, 10 records in intact batches" in (
        repaired.stdout
    )
    for base in (100, 120, 140):
        assert (
            f"repair set aside {kept}/{base:020d}.log: offsets {base} to {base + 19}, 20 records in intact batches"
            in repaired.stdout
        )
    assert lines[-1].startswith("1 partitions, 5 segments, 8 batches, 80 records")
    assert (
        f"no problems, but {422 + 3 * 442} bytes (70 records in intact batches) are set aside in {place}" in (lines[-1])
    )
    assert "clean" not in lines[-1]

    # The live log is what Kafka leaves: cut at the damage, the segments after it gone.
    after = log_files(data)
    assert sorted(after) == [f"{base:020d}.log" for base in (0, 20, 40, 60, 80)]
    assert after["00000000000000000080.log"] == b""
    assert all(after[name] == before[name] for name in after if name != "00000000000000000080.log")
    # What it removed is kept byte for byte: the damaged segment's tail and the three after it.
    assert (kept / "00000000000000000080.log").read_bytes() == before["00000000000000000080.log"]
    for base in (100, 120, 140):
        assert (kept / f"{base:020d}.log").read_bytes() == before[f"{base:020d}.log"]
    consumed = run("consume", str(data), "--topic", "t", "--from-beginning").stdout.splitlines()
    assert consumed == [f"value-{n}" for n in range(80)]

    # `check` goes on saying so, with its own exit status, until the place is removed.
    again = run("check", str(data), code=7)
    assert f"set aside: {kept}/00000000000000000100.log: offsets 100 to 119, 20 records" in again.stdout
    assert "clean" not in again.stdout.splitlines()[-1]
    document = json.loads(run("check", str(data), "--json", code=7).stdout)
    assert document["clean"] is False and document["problems"] == []
    [partition] = document["setAside"]
    assert partition["place"] == str(kept) and partition["records"] == 70

    # The pieces are segments `dump` reads: the damaged batch shown invalid, the rest whole.
    dumped = run("dump", str(kept / "00000000000000000100.log"), "--deep-iteration").stdout
    assert "baseOffset: 100 lastOffset: 109" in dumped and "| offset: 119 " in dumped
    tail = run("dump", str(kept / "00000000000000000080.log"), code=None).stdout
    assert "Log starting offset: 80" in tail and "baseOffset: 80 lastOffset: 89" in tail and "isvalid: false" in tail

    shutil.rmtree(place)  # the operator's clearing, as the README says
    assert run("check", str(data)).stdout.splitlines()[-1].endswith("clean")


def test_dry_run_says_what_a_repair_would_do_and_changes_nothing(eight_segments: Path) -> None:
    data = eight_segments
    flip_a_byte(data, 80)
    before = tree_digest(data.parent)

    said = run("check", str(data), "--repair", "--dry-run", code=4)
    assert f"a repair would set aside 70 records of t-0 in {place_of(data)}/<time of the repair>/t-0:" in said.stdout
    assert "offsets 80 to 99, 10 records in intact batches (422 bytes, 211 of them damaged): the tail from " in (
        said.stdout
    )
    assert "offsets 140 to 159, 20 records in intact batches (442 bytes): segment 00000000000000000140.log" in (
        said.stdout
    )
    assert tree_digest(data.parent) == before
    assert not place_of(data).exists()

    plan = json.loads(run("check", str(data), "--repair", "--dry-run", "--json", code=4).stdout)
    assert plan["repaired"] is False
    [partition] = plan["repairPlan"]
    assert partition["records"] == 70
    assert [(p["source"], p["position"], p["wholeSegment"]) for p in partition["pieces"]] == [
        ("00000000000000000080.log", 0, False),
        ("00000000000000000100.log", 0, True),
        ("00000000000000000120.log", 0, True),
        ("00000000000000000140.log", 0, True),
    ]
    assert tree_digest(data.parent) == before

    # What the dry run announced is what the repair does.
    done = json.loads(run("check", str(data), "--repair", "--json", code=7).stdout)
    assert [(p["source"], p["position"], p["records"], p["bytes"]) for p in done["setAsideByRepair"]] == [
        (p["source"], p["position"], p["records"], p["bytes"]) for p in partition["pieces"]
    ]


TORN_WRITER = """
import os, sys, time
from seglogfs.engine import BrokerConfig, DataDir
from seglogfs.engine.record.builder import encode_batches
data_dir = DataDir.open(BrokerConfig.load(log_dirs=[sys.argv[1]]), now_ms=time.time_ns() // 1_000_000)
log = data_dir.partition_for_append("crash", 0, now_ms=time.time_ns() // 1_000_000)[0]
log.append_records([b"record-%d" % n for n in range(50)], now_ms=time.time_ns() // 1_000_000)
log.flush()
# A write of the next batch cut short by the kill: its first half reaches the file.
[batch] = encode_batches([b"lost-%d" % n for n in range(20)], keys=None, headers=None, timestamps=0,
                         max_batch_bytes=1 << 20, where="test", base_offset=log.log_end_offset)
fd = os.open(log.active_segment.log_path, os.O_WRONLY | os.O_APPEND)
os.write(fd, batch[: len(batch) // 2])
print(len(batch) // 2, flush=True)
time.sleep(3600)
"""


@pytest.mark.expect_warnings(r"cut \d+ bytes after the last valid batch")
def test_a_torn_tail_after_kill_9_is_set_aside_by_the_next_open(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    data = tmp_path / "data"
    writer = subprocess.Popen([sys.executable, "-c", TORN_WRITER, str(data)], cwd=REPO, stdout=subprocess.PIPE)
    try:
        assert writer.stdout is not None
        torn = int(writer.stdout.readline())
        writer.send_signal(signal.SIGKILL)
        assert writer.wait(timeout=30) == -signal.SIGKILL
    finally:
        if writer.poll() is None:
            writer.kill()
            writer.wait()
        if writer.stdout is not None:
            writer.stdout.close()
    segment = data / "crash-0" / "00000000000000000000.log"
    on_disk = segment.read_bytes()

    with DataDir.open(BrokerConfig.load(log_dirs=[data]), now_ms=NOW_MS) as data_dir:
        log = data_dir.partition("crash", 0)
        assert log.log_end_offset == 50
        [piece] = log.set_aside
    # One WARNING line, naming the place.
    [warning] = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert f"cut {torn} bytes after the last valid batch at position {len(on_disk) - torn}" in warning
    assert str(piece.place) in warning
    assert piece.path == place_of(data) / piece.place.parent.name / "crash-0" / "00000000000000000050.log"
    assert piece.path.read_bytes() == on_disk[-torn:]
    assert segment.read_bytes() == on_disk[:-torn]
    assert (piece.records, piece.damaged_bytes, piece.start_offset) == (0, torn, 50)
    said = run("check", str(data), code=7)
    assert f"set aside: {piece.path}: from offset 50, no intact batch ({torn} bytes, all damaged)" in said.stdout


def test_no_space_to_set_aside_cuts_nothing_and_says_so(tmp_path: Path, small_tmpfs: Path) -> None:
    """The data dir on a 4 MiB tmpfs, filled: the damaged segment's tail (about 1 MiB) cannot be
    copied beside it. The repair fails with one line saying so; no `.log` byte is changed."""
    data = small_tmpfs / "data"
    values = b"".join(b"%06d-" % n + b"x" * 1000 + b"\n" for n in range(2000))
    big_segments = "log.segment.bytes=1500000"
    run("produce", str(data), "--topic", "t", "--partition", "0", "--override", big_segments, stdin=values)
    flip_a_byte(data, 0, position=200)  # the first batch of the first segment: all of it is cut
    before = log_files(data)
    filler = small_tmpfs / "filler"
    with open(filler, "wb") as handle:
        try:
            while True:
                handle.write(b"\0" * 65536)
                handle.flush()
        except OSError:
            pass
    failed = run("check", str(data), "--repair", code=1)
    [line] = failed.stderr.splitlines()
    assert "cannot set aside" in line and "No space left on device" in line
    assert "nothing was cut or removed" in line
    assert log_files(data) == before
    assert not list(place_of(data).rglob("*.log"))  # the partial copy went
    filler.unlink()
    run("check", str(data), "--repair", code=7)  # with room, it goes through
    assert list(place_of(data).rglob("*.log"))


@pytest.fixture
def read_only_place(eight_segments: Path) -> Iterator[Path]:
    """A read-only file system mounted where the data dir's set-aside place belongs."""
    place = place_of(eight_segments)
    place.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(place)], check=True)
    try:
        yield place
    finally:
        unmount(place)


def test_an_unwritable_place_cuts_nothing(eight_segments: Path, read_only_place: Path) -> None:
    flip_a_byte(eight_segments, 80)
    before = log_files(eight_segments)
    failed = run("check", str(eight_segments), "--repair", code=1)
    [line] = failed.stderr.splitlines()
    assert str(read_only_place) in line and "Read-only file system" in line and "nothing was cut" in line
    assert log_files(eight_segments) == before


def test_a_place_on_another_file_system_gets_copies(eight_segments: Path) -> None:
    """Where a rename cannot go (EXDEV), each segment is copied, fsynced, then removed."""
    place = place_of(eight_segments)
    place.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(place)], check=True)
    try:
        flip_a_byte(eight_segments, 80)
        before = log_files(eight_segments)
        run("check", str(eight_segments), "--repair", code=7)
        [kept] = place.glob("*/t-0")
        for base in (100, 120, 140):
            assert (kept / f"{base:020d}.log").read_bytes() == before[f"{base:020d}.log"]
            assert not (eight_segments / "t-0" / f"{base:020d}.log").exists()
        assert os.stat(kept / "00000000000000000100.log").st_dev != os.stat(eight_segments).st_dev
    finally:
        unmount(place)
