"""`seglogfs backup` and `seglogfs restore`, run as real processes: backups of a data dir that
`seglogfs produce` is writing, of a broker's dir, and through a mount's `.logdir`; restores that
pass `seglogfs check` and hold, record for record, what the source held at the backup's moment.

The commands run as `python -m seglogfs.mount_tools.backup` (the same handlers `seglogfs backup`
and `seglogfs restore` run once the CLI registers them)."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import re
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from seglogfs.engine import BrokerConfig, DataDir, Record
from seglogfs.engine.check import log_dir_in_use
from seglogfs.engine.log.checkpoint import (
    CLEANER_OFFSET_CHECKPOINT,
    LOG_START_OFFSET_CHECKPOINT,
    RECOVERY_POINT_CHECKPOINT,
    REPLICATION_OFFSET_CHECKPOINT,
    read_offset_checkpoint,
)
from tests.conftest import REPO, copy_fixture
from tests.fs.conftest import REFUSED, Mount

SEGLOGFS = [sys.executable, "-m", "seglogfs.mount_tools.cli"]
BACKUP_TOOL = [sys.executable, "-m", "seglogfs.mount_tools.backup"]
SMALL_SEGMENTS = ["--override", "log.segment.bytes=6000"]
MANIFEST = ".seglogfs-backup.json"
ROOT_CHECKPOINTS = (
    RECOVERY_POINT_CHECKPOINT,
    REPLICATION_OFFSET_CHECKPOINT,
    LOG_START_OFFSET_CHECKPOINT,
    CLEANER_OFFSET_CHECKPOINT,
)


def run(command: list[str], *args: object, expect: int = 0) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [*command, *map(str, args)], cwd=REPO, capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == expect, (
        f"{' '.join(map(str, args))} exited {done.returncode}, not {expect}: {done.stdout}{done.stderr}"
    )
    return done


def backup(*args: object, expect: int = 0) -> subprocess.CompletedProcess[str]:
    return run(BACKUP_TOOL, "backup", *args, expect=expect)


def restore(*args: object, expect: int = 0) -> subprocess.CompletedProcess[str]:
    return run(BACKUP_TOOL, "restore", *args, expect=expect)


def stats(done: subprocess.CompletedProcess[str]) -> dict[str, int]:
    """The figures `--stats` printed (the last four lines of the output)."""
    figures = dict(re.findall(r"^(bytes sent|files sent|files skipped|files deleted): (\d+)", done.stdout, re.M))
    assert len(figures) == 4, done.stdout
    return {name: int(value) for name, value in figures.items()}


def check(data: Path) -> None:
    """`seglogfs check` finds nothing wrong."""
    done = run(SEGLOGFS, "check", data)
    assert done.stdout.rstrip().endswith(": clean"), done.stdout


def records(data: Path) -> dict[tuple[str, int], list[Record]]:
    """Every partition's records, as the engine reads them from a read-only open."""
    config = BrokerConfig.load(None, [], log_dirs=[data])
    with DataDir.open(config, read_only=True, now_ms=time.time_ns() // 1_000_000) as data_dir:
        return {(log.topic, log.partition): list(log.records(log.log_start_offset)) for log in data_dir.partitions()}


def files(directory: Path) -> dict[str, Path]:
    return {str(path.relative_to(directory)): path for path in directory.rglob("*") if path.is_file()}


def assert_writable_modes(directory: Path) -> None:
    """Files 0644 and directories 0755, as Kafka leaves them."""
    for path in [directory, *directory.rglob("*")]:
        mode = stat.S_IMODE(path.stat().st_mode)
        assert mode == (0o755 if path.is_dir() else 0o644), f"{path}: mode {mode:o}"


def wait_until(condition: Callable[[], bool], what: str, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


class Writer:
    """`seglogfs produce DATA --topic t` fed lines on its stdin: a live writer holding the data
    dir's lock for as long as it runs."""

    def __init__(self, data: Path) -> None:
        self.data = data
        self.sent = 0
        self._lock = threading.Lock()
        self.process = subprocess.Popen(
            [*SEGLOGFS, "produce", str(data), "--topic", "t", *SMALL_SEGMENTS],
            cwd=REPO,
            stdin=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        wait_until(lambda: log_dir_in_use(data)[0], "the writer to take the data dir's lock")

    def send(self, count: int) -> None:
        """`count` lines, one write: about one batch."""
        assert self.process.stdin is not None
        with self._lock:
            lines = b"".join(b"record-%06d %s\n" % (n, b"x" * (n % 50)) for n in range(self.sent, self.sent + count))
            self.process.stdin.write(lines)
            self.process.stdin.flush()
            self.sent += count

    def visible(self) -> int:
        data = records(self.data) if (self.data / "t-0").is_dir() else {}
        return len(data.get(("t", 0), []))

    def wait_visible(self) -> None:
        wait_until(lambda: self.visible() == self.sent, f"{self.sent} records in the data dir")

    @contextlib.contextmanager
    def writing(self) -> Iterator[None]:
        """Lines keep arriving (a batch of 5 every few milliseconds) for as long as the block runs."""
        stop = threading.Event()

        def feed() -> None:
            while not stop.is_set():
                self.send(5)
                stop.wait(0.003)

        thread = threading.Thread(target=feed)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join()

    def close(self) -> None:
        assert self.process.stdin is not None
        with contextlib.suppress(BrokenPipeError):
            self.process.stdin.close()
        self.process.wait(timeout=60)
        assert self.process.stderr is not None
        said = self.process.stderr.read().decode()
        self.process.stderr.close()
        assert self.process.returncode == 0, said


@pytest.fixture
def writer(tmp_path: Path) -> Iterator[Writer]:
    started = Writer(tmp_path / "data")
    try:
        yield started
    finally:
        if started.process.poll() is None:
            started.process.kill()
            started.process.wait(timeout=30)
        for stream in (started.process.stdin, started.process.stderr):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()


def test_backups_of_a_data_dir_being_written_restore_to_the_second_backups_moment(
    writer: Writer, tmp_path: Path
) -> None:
    data, dest, restored = writer.data, tmp_path / "backup", tmp_path / "restored"
    writer.send(200)
    writer.wait_visible()

    # The first backup runs while batches keep arriving: what it holds is whole and consistent.
    with writer.writing():
        first = backup(data, dest, "--stats")
    check(dest)
    assert json.loads((dest / MANIFEST).read_text())["complete"] is True
    backed_up = records(dest)[("t", 0)]
    writer.wait_visible()
    assert records(data)[("t", 0)][: len(backed_up)] == backed_up and len(backed_up) >= 200

    # More records (several rolls); quiet, then the second backup: its moment is now.
    logs_before = {path.name: path.stat().st_size for path in (dest / "t-0").glob("*.log")}
    for _ in range(8):
        writer.send(40)
        writer.wait_visible()  # a batch each
    moment = records(data)
    assert len(list((data / "t-0").glob("*.log"))) > len(logs_before) + 1
    second = backup(data, dest, "--stats", "-v")
    check(dest)

    # Only the new data went: no sealed segment again; a segment that grew since was appended to.
    sent = re.findall(r"^sent t-0/(\S+\.log)", second.stdout, re.M)
    appended = re.findall(r"^appended t-0/(\S+\.log)", second.stdout, re.M)
    on_disk = {path.name: path.stat().st_size for path in (data / "t-0").glob("*.log")}
    assert not set(sent) & set(logs_before), f"segments copied again: {set(sent) & set(logs_before)}"
    assert set(appended) == {name for name, size in logs_before.items() if on_disk[name] > size}
    new_bytes = sum(on_disk.values()) - sum(logs_before.values())
    figures_1, figures_2 = stats(first), stats(second)
    assert figures_2["files skipped"] >= len(logs_before) - len(appended)
    assert new_bytes <= figures_2["bytes sent"] < new_bytes + 4096  # the logs' growth, indexes, checkpoints
    assert figures_2["bytes sent"] < figures_1["bytes sent"] + new_bytes

    # The writer goes on past the moment; a restore gives the moment back.
    writer.send(300)
    writer.close()
    restore(dest, restored)
    check(restored)
    assert records(restored) == moment
    assert len(records(data)[("t", 0)]) == writer.sent > len(moment[("t", 0)])
    assert_writable_modes(restored)
    assert sorted(files(restored)) == sorted(set(files(dest)) - {MANIFEST})


def test_a_batch_being_written_stays_out_of_a_backup(writer: Writer, tmp_path: Path) -> None:
    writer.send(50)
    writer.wait_visible()
    active = max((writer.data / "t-0").glob("*.log"))
    whole = active.stat().st_size
    with open(active, "r+b") as file:  # a batch as its writer leaves it midway: the header, part of the rest
        file.seek(whole)
        file.write(active.read_bytes()[:70])
    dest = tmp_path / "backup"
    backup(writer.data, dest)
    assert (dest / "t-0" / active.name).stat().st_size == whole
    check(dest)
    assert records(dest) == records(writer.data)

    writer.send(10)  # the writer writes its batch where it left off
    writer.wait_visible()
    again = backup(writer.data, dest, "-v")
    assert f"appended t-0/{active.name} (+{active.stat().st_size - whole} bytes)" in again.stdout
    check(dest)
    assert records(dest) == records(writer.data)


def test_restore_and_backup_refuse_a_live_data_dir(writer: Writer, tmp_path: Path) -> None:
    writer.send(10)
    writer.wait_visible()
    dest = tmp_path / "backup"
    backup(writer.data, dest)
    pid = writer.process.pid
    refused = restore(dest, writer.data, "--force", expect=3)
    assert f"in use by process {pid}" in refused.stderr and refused.stderr.count("\n") == 1
    refused = backup(dest, writer.data, expect=3)  # a backup into a live data dir
    assert f"in use by process {pid}" in refused.stderr
    writer.close()
    assert records(writer.data)[("t", 0)] == records(dest)[("t", 0)]  # nothing was written over


def test_a_broker_dir_restored_holds_every_file_with_writable_modes(tmp_path: Path) -> None:
    source = copy_fixture("flink-on-prem-cp760", tmp_path)
    metadata = source / "__cluster_metadata-0"
    assert list(metadata.glob("*.checkpoint")) and (metadata / "quorum-state").exists()
    (source / "meta.properties").chmod(0o444)  # a read-only file at the source stays so in the backup
    dest, restored = tmp_path / "backup", tmp_path / "restored"
    first = backup(source, dest, "--stats")
    assert stat.S_IMODE((dest / "meta.properties").stat().st_mode) == 0o444
    again = backup(source, dest, "--stats")  # nothing changed: nothing is sent
    assert stats(again) == {
        "bytes sent": 0,
        "files sent": 0,
        "files skipped": stats(first)["files sent"],
        "files deleted": 0,
    }
    restore(dest, restored, "--stats")
    check(restored)

    expected = set(files(source)) - {".lock", ".kafka_cleanshutdown"}
    got = files(restored)
    assert set(got) - {".lock"} == expected
    for name in expected - set(ROOT_CHECKPOINTS):
        assert got[name].read_bytes() == (source / name).read_bytes(), name
    for name in ROOT_CHECKPOINTS:  # generated from the logs: the broker's offsets, for the partitions here
        mine, broker = read_offset_checkpoint(got[name]), read_offset_checkpoint(source / name)
        assert {key: offset for key, offset in mine.items() if key in broker} == {
            key: offset for key, offset in broker.items() if key in mine
        }, name
    (source / "meta.properties").chmod(0o644)
    assert_writable_modes(restored)
    assert records(restored) == records(source)


@pytest.mark.expect_warnings(REFUSED)  # the write to .logdir
def test_backups_through_a_mounts_logdir(mount, tmp_path: Path) -> None:
    m: Mount = mount(None, "-o", "log.segment.bytes=6000")
    os.mkdir(m.path / "t")
    append = m.path / "t" / "0" / "append"

    def write(tag: str, count: int) -> None:  # one write, one batch
        append.write_bytes(b"".join(b"%s-%05d\n" % (tag.encode(), n) for n in range(count)))

    def logs(directory: Path) -> dict[str, int]:
        return {path.name: path.stat().st_size for path in (directory / "t-0").glob("*.log")}

    # The mirror shows the files' own modes; writing is refused all the same.
    write("a", 600)  # a batch larger than a segment: a segment of its own
    write("b", 100)  # the next segment, the active one
    logdir = m.path / ".logdir"
    segment = logdir / "t-0" / "00000000000000000000.log"
    assert stat.S_IMODE(segment.stat().st_mode) == 0o644
    assert stat.S_IMODE((logdir / "t-0").stat().st_mode) == 0o755
    with pytest.raises(PermissionError) as refused:
        segment.open("ab")
    assert refused.value.errno == errno.EACCES

    dest = tmp_path / "backup"
    first = backup(m.path, dest, "--stats", "-v")
    check(dest)
    assert records(dest) == records(m.data)
    sealed, active = sorted(logs(dest))
    assert logs(dest) == logs(m.data) and re.search(rf"^sent t-0/{active} ", first.stdout, re.M)

    # The active segment grows: the next backup appends the new batch and sends nothing else of the log.
    write("c", 100)
    assert sorted(logs(m.data)) == [sealed, active]
    grown = logs(m.data)[active] - logs(dest)[active]
    second = backup(m.path, dest, "--stats", "-v")
    assert re.findall(r"^(?:sent|appended) t-0/\S+\.log.*", second.stdout, re.M) == [
        f"appended t-0/{active} (+{grown} bytes)"
    ]
    assert grown <= stats(second)["bytes sent"] < grown + 1024  # with its index entries and checkpoints
    assert stats(second)["bytes sent"] < stats(first)["bytes sent"] / 4
    check(dest)
    assert records(dest) == records(m.data)

    # Rolls: the third backup (given the .logdir itself) sends the new segments, never the old.
    before = logs(dest)
    for n in range(6):
        write(f"d{n}", 100)
    third = backup(logdir, dest, "--stats", "-v")
    sent = re.findall(r"^(?:sent|appended) t-0/(\S+\.log)", third.stdout, re.M)
    assert sent and sealed not in sent and set(logs(dest)) - set(before) <= set(sent), third.stdout
    new_bytes = sum(logs(m.data).values()) - sum(before.values())
    assert new_bytes <= stats(third)["bytes sent"] < new_bytes + 4096
    check(dest)
    assert records(dest) == records(m.data)

    refused = restore(dest, m.data, "--force", expect=3)  # the mount holds the data dir
    assert f"in use by process {m.process.pid}" in refused.stderr


def test_a_mount_of_a_broker_dir_mirrors_every_file(mount, tmp_path: Path) -> None:
    source = copy_fixture("experts-kafka-data", tmp_path)
    m: Mount = mount(source, "-o", "ro,measure=lazy")
    mirrored = files(m.path / ".logdir")
    assert set(mirrored) == set(files(source)) - {".kafka_cleanshutdown"}
    for name, path in mirrored.items():
        assert stat.S_IMODE(path.stat().st_mode) == 0o444, name  # the files' 0644, on a read-only mount
        if name not in ROOT_CHECKPOINTS:
            assert path.read_bytes() == (source / name).read_bytes(), name
    assert stat.S_IMODE((m.path / ".logdir" / "__cluster_metadata-0").stat().st_mode) == 0o555


def test_bad_sources_and_destinations_are_refused(tmp_path: Path) -> None:
    data = tmp_path / "data"
    subprocess.run([*SEGLOGFS, "produce", str(data), "--topic", "t"], input=b"a\nb\n", cwd=REPO, check=True)
    (tmp_path / "file").write_text("x")
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("keep me")
    for src, dest, why in [
        (data, data / "backup", "is inside SRC"),
        (data, data, "is SRC itself"),
        (data, tmp_path, "is inside DEST"),
        (data, tmp_path / "file", "is not a directory"),
        (data, tmp_path / "other", "is no seglogfs backup"),
        (tmp_path / "missing", tmp_path / "b", "no such directory"),
        (tmp_path / "other", tmp_path / "b", "no partition dirs"),
    ]:
        refused = backup(src, dest, expect=2)
        assert why in refused.stderr and refused.stderr.startswith("seglogfs: "), refused.stderr
        assert refused.stderr.count("\n") == 1
    assert not (data / "backup").exists() and not (tmp_path / "b").exists()
    assert (tmp_path / "other" / "notes.txt").read_text() == "keep me"

    dest = tmp_path / "backup"
    backup(data, dest)
    refused = restore(dest, tmp_path / "other", expect=2)
    assert "not empty (--force" in refused.stderr
    assert restore(tmp_path / "other", tmp_path / "r", expect=2).stderr.count("no seglogfs backup") == 1
    restore(dest, tmp_path / "other", "--force")
    assert not (tmp_path / "other" / "notes.txt").exists()
    assert records(tmp_path / "other") == records(data)

    fd = os.open(dest / ".lock", os.O_RDWR)  # as a backup into it holds it while it runs
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        assert f"in use by process {os.getpid()}" in restore(dest, tmp_path / "r", expect=3).stderr
        assert f"in use by process {os.getpid()}" in backup(data, dest, expect=3).stderr
    finally:
        os.close(fd)
    assert not (tmp_path / "r").exists()

    manifest = json.loads((dest / MANIFEST).read_text())
    (dest / MANIFEST).write_text(json.dumps({**manifest, "complete": False}))  # as an interrupted backup leaves it
    assert "did not complete" in restore(dest, tmp_path / "r", expect=1).stderr


def test_a_segment_whose_mtime_moved_but_not_its_bytes_is_not_sent_again(writer: Writer, tmp_path: Path) -> None:
    """A backup taken while a batch was being written can record the segment's mtime from before
    that write and its size from after: the next backup finds the same bytes under another mtime,
    checks that they are the same and sends nothing."""
    data, dest = writer.data, tmp_path / "backup"
    writer.send(50)
    writer.wait_visible()
    writer.close()
    backup(data, dest)
    for log in (data / "t-0").glob("*.log"):
        later = log.stat().st_mtime_ns + 5_000_000_000
        os.utime(log, ns=(later, later))
    again = backup(data, dest, "--stats", "-v")
    assert not re.findall(r"^(sent|appended) t-0/\S+\.log", again.stdout, re.M), again.stdout
    assert stats(again)["bytes sent"] == 0
    for log in (data / "t-0").glob("*.log"):
        assert (dest / "t-0" / log.name).stat().st_mtime_ns == log.stat().st_mtime_ns


def test_a_backup_onto_a_full_disk_names_the_file_and_leaves_an_incomplete_backup(tmp_path: Path) -> None:
    data, small = tmp_path / "data", tmp_path / "small"
    subprocess.run(
        [sys.executable, "-m", "seglogfs.mount_tools.cli", "produce", str(data), "--topic", "t"],
        input="".join(f"record-{i}\n" for i in range(40_000)).encode(),
        check=True,
        capture_output=True,
    )
    small.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(small)], check=True)
    try:
        done = backup(data, small / "b", expect=1)
        assert done.stderr.splitlines() == [
            f"seglogfs: {small / 'b' / 't-0' / '00000000000000000000.log'}: No space left on device; the backup "
            f"did not complete ({small / 'b'} is marked incomplete until a backup into it completes)"
        ]
        assert not list((small / "b").rglob("*.seglogfs-tmp"))  # no half-written copy left
        assert json.loads((small / "b" / MANIFEST).read_text())["complete"] is False
        restore(small / "b", tmp_path / "restored", expect=1)  # an incomplete backup is refused
        checked = run(SEGLOGFS, "check", small / "b", expect=4)  # and check says what it is
        assert checked.stderr.startswith(f"seglogfs: {small / 'b'}: an incomplete backup: "), checked.stderr
        assert checked.stdout.rstrip().endswith("but an incomplete backup (see above)"), checked.stdout
    finally:
        subprocess.run(["umount", str(small)], check=True)
    check(data)
