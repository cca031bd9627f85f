"""The OS saying no: a full disk under the CLI and under a live mount. The answer is an error
(ENOSPC, exit 1 with one line), never a signal death; every record acknowledged before stays
readable; writing resumes once space is freed, and the data dir checks clean."""

from __future__ import annotations

import errno
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from seglogfs.engine import BrokerConfig, DataDir
from seglogfs.engine.check import check_log_dirs
from tests.conftest import NOW_MS, REPO
from tests.fs.conftest import Mount

SEGLOGFS = [sys.executable, "-m", "seglogfs.mount_tools.cli"]
LINES = b"".join(b"record-%08d-%s\n" % (i, b"x" * 40) for i in range(60_000))  # 3.4 MB


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 2 MiB tmpfs, unmounted after the test."""
    disk = tmp_path / "disk"
    disk.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(disk)], check=True)
    try:
        yield disk
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


def seglogfs(*args: str, data: bytes = b"") -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([*SEGLOGFS, *args], input=data, capture_output=True, cwd=REPO, timeout=120, check=False)


def consumed(data_dir: Path) -> list[bytes]:
    done = seglogfs("consume", str(data_dir), "--topic", "t", "--from-beginning")
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


def fill(disk: Path) -> Path:
    """A file taking what is left of `disk`."""
    filler = disk / "filler"
    subprocess.run(["dd", "if=/dev/zero", f"of={filler}", "bs=64k"], capture_output=True, check=False)
    return filler


def test_produce_on_a_full_disk(small_disk: Path) -> None:
    data_dir = small_disk / "data"
    with open(small_disk / "reserve", "wb") as reserve:  # freed later, for the records that follow
        reserve.write(b"r" * (256 << 10))
    done = seglogfs("produce", str(data_dir), "--topic", "t", data=LINES)
    assert done.returncode == 1, done  # an exit, not a signal (SIGBUS was -7)
    said_the_append_failed(done)
    stored = consumed(data_dir)
    assert 0 < len(stored) < 60_000
    assert stored == LINES.splitlines()[: len(stored)]  # what was acknowledged, in order, nothing torn
    assert check_log_dirs([data_dir]).clean
    (small_disk / "reserve").unlink()
    more = seglogfs("produce", str(data_dir), "--topic", "t", data=b"after\n")
    assert more.returncode == 0, more.stderr
    assert consumed(data_dir)[-1] == b"after"


def said_the_append_failed(done: subprocess.CompletedProcess[bytes]) -> None:
    """One line names the segment the append failed on; it may go on to say that the
    checkpoints could not be written either at the close (where the cut-back freed no page for
    them): one error, one line."""
    said = done.stderr.decode().strip().splitlines()
    assert len(said) == 1, said
    assert said[0].startswith("seglogfs: appending to ") and "00000000000000000000.log" in said[0], said
    assert said[0].endswith("No space left on device") or re.search(
        r"No space left on device \(then closing the data dir failed too: writing checkpoints: writing "
        r"/\S+/[a-z-]+-checkpoint: No space left on device; the next open recovers as after a crash\)$",
        said[0],
    ), said


def test_a_full_disk_that_takes_the_checkpoints_too_still_names_the_append(small_disk: Path) -> None:
    """When the disk is so full that the checkpoints cannot be written at the close either, the
    error is still the append's, naming the segment (it was the checkpoint's, and the append's
    was lost); the checkpoints' failure is said in the same line (it was a line of its own,
    without the `seglogfs:` of the CLI's lines). Nothing stored is lost: the next open recovers
    as after a crash."""
    data_dir = small_disk / "data"
    first = seglogfs("produce", str(data_dir), "--topic", "t", data=LINES)
    assert first.returncode == 1
    stored = consumed(data_dir)
    # The next close has a checkpoint to write (one whose lines would not change is not written).
    # (its first close may have found no room for them: then there is none to remove)
    (data_dir / "recovery-point-offset-checkpoint").unlink(missing_ok=True)
    filler = fill(small_disk)  # (not a page left: the cut-back of the next append frees none either)
    done = seglogfs("produce", str(data_dir), "--topic", "t", data=LINES[:100_000])
    assert done.returncode == 1, done
    said = done.stderr.decode().strip().splitlines()
    assert len(said) == 1 and "(then closing the data dir failed too: writing checkpoints: " in said[0], said
    assert said[0].endswith("the next open recovers as after a crash)") and "[Errno" not in said[0]
    said_the_append_failed(done)
    filler.unlink()
    assert consumed(data_dir) == stored
    assert check_log_dirs([data_dir]).clean


@pytest.mark.expect_warnings("write t/0/append: .*No space left on device")
def test_append_through_a_mount_on_a_full_disk(mount, small_disk: Path) -> None:
    m: Mount = mount(small_disk / "data")
    (m.path / "t").mkdir()
    append = m.path / "t" / "0" / "append"
    with pytest.raises(OSError) as raised, open(append, "ab") as handle:
        for start in range(0, len(LINES), 1 << 20):
            handle.write(LINES[start : start + (1 << 20)])
    assert raised.value.errno == errno.ENOSPC
    assert m.process.poll() is None  # the mount is up
    records = (m.path / "t" / "0" / "records").read_bytes().splitlines()
    # Every line of the writes that succeeded; the close made a record of the partial line the
    # last of them left (a line cut between two writes, as `cat` cuts them).
    assert 0 < len(records) < 60_000 and records[:-1] == LINES.splitlines()[: len(records) - 1]
    assert LINES.splitlines()[len(records) - 1].startswith(records[-1])
    filler = fill(small_disk)
    with pytest.raises(OSError) as raised:
        append.write_bytes(b"x" * 60_000 + b"\n")
    assert raised.value.errno == errno.ENOSPC
    filler.unlink()  # space freed: writing resumes
    with open(append, "ab") as handle:
        handle.write(b"after\n")
    assert (m.path / "t" / "0" / "records").read_bytes().splitlines()[-1] == b"after"
    m.stop()
    assert check_log_dirs([small_disk / "data"]).clean


@pytest.mark.expect_warnings("mkdir new: .*No space left on device")
def test_a_topic_made_on_a_full_disk_fails_whole_and_can_be_made_once_there_is_room(mount, small_disk: Path) -> None:
    """`mkdir` of a topic on a full disk is ENOSPC and leaves nothing behind: no partition dir,
    so the same `mkdir` works once there is room (a dir left behind made it EIO, "File exists",
    until a remount)."""
    m: Mount = mount(small_disk / "data", "-o", "num.partitions=3")
    (m.path / "t").mkdir()
    filler = fill(small_disk)
    with pytest.raises(OSError) as raised:
        (m.path / "new").mkdir()
    assert raised.value.errno == errno.ENOSPC
    assert not list((small_disk / "data").glob("new-*"))
    filler.unlink()
    (m.path / "new").mkdir()
    (m.path / "new" / "2" / "append").write_bytes(b"made\n")
    assert (m.path / "new" / "2" / "records").read_bytes() == b"made\n"
    assert sorted(path.name for path in (small_disk / "data").glob("new-*")) == ["new-0", "new-1", "new-2"]
    m.stop()
    assert check_log_dirs([small_disk / "data"]).clean


@pytest.mark.expect_warnings(r"write t/config: .*No space left on device \(ENOSPC\)$")
def test_config_written_by_a_shell_on_a_full_disk_fails_and_changes_nothing(mount, small_disk: Path) -> None:
    """`printf … > config` on a full disk exits non-zero: the write fails (a shell's builtin
    reports a failed write, never a failed close, which the shell does itself); the overrides
    stay as they were, the mount stays up, and the same command works once there is room."""
    m: Mount = mount(small_disk / "data")
    (m.path / "t").mkdir()
    config = m.path / "t" / "config"
    config.write_bytes(b"retention.ms=3600000\n")
    filler = fill(small_disk)
    shell = ["bash", "-c", f"printf 'retention.ms=1000\\n' > {config}"]
    done = subprocess.run(shell, capture_output=True, check=False)
    assert done.returncode != 0 and b"No space left on device" in done.stderr, done
    assert config.read_bytes() == b"retention.ms=3600000\n"
    assert m.process.poll() is None
    assert "ENOSPC" in m.output()
    filler.unlink()
    assert subprocess.run(shell, check=False).returncode == 0
    assert config.read_bytes() == b"retention.ms=1000\n"
    m.stop()


def log_shows(m: Mount, text: str, seconds: float = 10) -> bool:
    deadline = time.monotonic() + seconds
    while text not in m.output():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


@pytest.mark.expect_warnings(
    r"checkpoint failed, retried later",
    r"a/0/records: .*a directory where a regular file belongs: refused.*\(EIO\)",
    "Traceback",
)
def test_faults_under_a_mount_leave_the_rest_serving(mount, tmp_path: Path) -> None:
    """A checkpoint that cannot be written and a segment that cannot be read: the mount stays
    up, the other partition serves, the failed read answers EIO with a log line saying what
    (one failing background write took the whole mount down before)."""
    data = tmp_path / "data"
    with DataDir.open(BrokerConfig.load(log_dirs=[data]), now_ms=NOW_MS) as data_dir:
        for topic in ("a", "b"):
            data_dir.create_topic(topic, 1, now_ms=NOW_MS)
            data_dir.partition(topic, 0).append_records([b"%s-one" % topic.encode()], now_ms=NOW_MS)
        data_dir.partition("a", 0).roll(NOW_MS)  # a sealed segment, opened only when read
        data_dir.partition("a", 0).append_records([b"a-two"], now_ms=NOW_MS)
    m: Mount = mount(data, "-o", "log.flush.offset.checkpoint.interval.ms=200,view.cache=none,measure=lazy")
    checkpoint = data / "recovery-point-offset-checkpoint"
    checkpoint.unlink()
    checkpoint.mkdir()  # the checkpoint's rename onto it fails, every time
    with open(m.path / "b" / "0" / "append", "ab") as handle:  # (a line to write: an unchanged file is not written)
        handle.write(b"b-two\n")
    assert log_shows(m, "checkpoint failed, retried later")
    segment = data / "a-0" / "00000000000000000000.log"
    segment.rename(segment.with_name("moved.log"))
    segment.mkdir()  # the segment's bytes cannot be read any more
    with pytest.raises(OSError) as raised:
        (m.path / "a" / "0" / "records").read_bytes()
    assert raised.value.errno == errno.EIO
    with open(m.path / "b" / "0" / "append", "ab") as handle:
        handle.write(b"b-three\n")
    assert (m.path / "b" / "0" / "records").read_bytes() == b"b-one\nb-two\nb-three\n"
    assert m.process.poll() is None
    checkpoint.rmdir()  # the operator mends it: the next try succeeds, and the unmount is clean
    segment.rmdir()
    segment.with_name("moved.log").rename(segment)
    m.stop()


@pytest.mark.parametrize("fmt", ["text", "jsonl"])
def test_consume_into_a_full_disk_says_it_was_standard_output(small_disk: Path, tmp_path: Path, fmt: str) -> None:
    """`consume > file` on a full disk: exit 1 and one line naming standard output (it said only
    "No space left on device", which reads as if the data dir were full)."""
    data_dir = tmp_path / "data"
    assert seglogfs("produce", str(data_dir), "--topic", "t", data=LINES).returncode == 0
    with open(small_disk / "out", "wb") as out:
        done = subprocess.run(
            [*SEGLOGFS, "consume", str(data_dir), "--topic", "t", "--from-beginning", "--format", fmt],
            stdout=out,
            stderr=subprocess.PIPE,
            cwd=REPO,
            timeout=120,
            check=False,
        )
    assert done.returncode == 1
    assert done.stderr.decode().splitlines() == ["seglogfs: standard output: No space left on device"]


def test_a_background_mount_that_cannot_write_its_checkpoints_at_unmount_logs_one_line(
    small_disk: Path, tmp_path: Path
) -> None:
    """A mount in the background whose disk is full when it is unmounted: its log says in one
    line what could not be written and that the next open recovers (it logged a traceback, as
    for a bug); nothing stored is lost."""
    data_dir, mountpoint, log = small_disk / "data", tmp_path / "mnt", tmp_path / "mount.log"
    mountpoint.mkdir()
    started = seglogfs("mount", str(data_dir), str(mountpoint), "-o", f"log={log},view.cache=none")
    assert started.returncode == 0, started.stderr
    try:
        (mountpoint / "t").mkdir()
        with pytest.raises(OSError) as raised, open(mountpoint / "t" / "0" / "append", "ab") as handle:
            for start in range(0, len(LINES), 1 << 16):
                handle.write(LINES[start : start + (1 << 16)])
                handle.flush()
        assert raised.value.errno == errno.ENOSPC
        stored = (mountpoint / "t" / "0" / "records").read_bytes().splitlines()
        filler = fill(small_disk)  # (not a page left for the checkpoints)
    finally:
        umount = subprocess.run(
            [*SEGLOGFS, "umount", str(mountpoint)], cwd=REPO, timeout=60, capture_output=True, check=False
        )
    # umount returned once the process had ended, and says how: without its clean-shutdown marker
    assert umount.returncode == 1, umount
    said_by_umount = umount.stderr.decode().splitlines()
    assert (
        len(said_by_umount) == 1 and f"exited without writing .kafka_cleanshutdown in {data_dir}" in said_by_umount[0]
    )
    # (whichever checkpoint the close wrote first; Python's `[Errno 28]` is not the CLI's)
    assert re.search(
        r"\(its log says: the mount stopped: writing checkpoints: writing "
        rf"{re.escape(str(data_dir))}/[a-z-]+-checkpoint: No space left on device; "
        r"the next open recovers as after a crash\)$",
        said_by_umount[0],
    ), said_by_umount
    said = [line for line in log.read_text().splitlines() if " ERROR " in line]
    assert len(said) == 1 and "the mount stopped: writing checkpoints:" in said[0], said
    assert said[0].endswith("No space left on device; the next open recovers as after a crash")
    assert "Traceback" not in log.read_text()
    filler.unlink()
    assert consumed(data_dir) == stored
    assert check_log_dirs([data_dir]).clean
