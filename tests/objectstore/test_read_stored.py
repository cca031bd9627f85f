"""Reading a backup where it is, in object storage (s3proxy on loopback): every reader the CLI has
prints over `s3://bucket/prefix` what it prints over the data dir backed up; a follower sees each
new backup run's records once, in order; only the ranges read are fetched, within the cache's
bound; a stalled server or a missing object is one line naming the object; the commands that
change a data dir refuse a URI."""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import pytest

from seglogfs.engine import BrokerConfig, DataDir
from seglogfs.engine.fetched_files import BUDGET, CHUNK_BYTES, FetchBudget
from seglogfs.engine.log.file_records import FileRecords
from seglogfs.engine.stored import local_copy
from seglogfs.engine.stored.local_copy import LocalCopy
from tests.cli.support import SEGLOGFS, one_error_line
from tests.conftest import REPO, copy_fixture
from tests.objectstore.conftest import S3
from tests.objectstore.test_backup import produce, run

STORED_COPY = re.compile(re.escape(tempfile.gettempdir()) + r"/seglogfs-stored-[^/\s]+")
LOG_DIRS_LINE = re.compile(r"^(log\.dirs=DATA) +", re.MULTILINE)


def same_output(data: Path, uri: str, *args: str) -> str:
    """`seglogfs ARGS` (DATA: the data dir, or the backup's URI) prints the same over both (the
    local copy's temporary directory read as the data dir's path), and exits 0."""
    outputs = []
    for where in (str(data), uri):
        done = subprocess.run(
            [SEGLOGFS, *[where if a == "DATA" else a for a in args]],
            cwd=REPO,
            capture_output=True,
            timeout=120,
            check=False,
        )
        text = (done.stdout + done.stderr).decode(errors="surrogateescape")
        assert done.returncode == 0, f"seglogfs {' '.join(args)} over {where} exited {done.returncode}:\n{text[-3000:]}"
        outputs.append(text)
    local, stored = outputs
    # (`config show`'s log.dirs is the URI, padded as its own length has it)
    stored, local = (
        LOG_DIRS_LINE.sub(r"\1  ", text)
        for text in (STORED_COPY.sub("DATA", stored).replace(uri, "DATA"), local.replace(str(data), "DATA"))
    )
    assert stored == local, f"seglogfs {' '.join(args)}"
    return local


@pytest.mark.parametrize("fixture", ["experts-kafka-data", "flink-on-prem-cp760", "spooldir-cp512"])
def test_every_reader_prints_over_the_bucket_what_it_prints_over_the_data_dir(
    s3: S3, tmp_path: Path, fixture: str
) -> None:
    data = copy_fixture(fixture, tmp_path)
    uri = s3.uri()
    run("backup", data, uri)
    topics = same_output(data, uri, "topics", "list", "DATA").split()
    assert topics
    same_output(data, uri, "topics", "describe", "DATA")
    same_output(data, uri, "check", "DATA")
    same_output(data, uri, "groups", "list", "DATA")
    same_output(data, uri, "groups", "describe", "DATA")

    def size(topic: str) -> int:
        return sum(log.stat().st_size for log in data.glob(f"{topic}-*/*.log"))

    user = sorted((topic for topic in topics if not topic.startswith("__")), key=size, reverse=True)[:3]
    for topic in [*user, "__consumer_offsets"] if "__consumer_offsets" in topics else user:
        same_output(data, uri, "consume", "DATA", "--topic", topic, "--from-beginning", "--format", "jsonl")
        same_output(data, uri, "config", "show", "DATA", "--topic", topic)
    same_output(
        data, uri, "consume", "DATA", "--topic", user[0], "--from-beginning", "--isolation-level", "read_committed"
    )
    same_output(data, uri, "consume", "DATA", "--topic", user[0], "--offset", "1", "--max-messages", "5")
    # (a copy of the partitions `--topic` may match)
    same_output(data, uri, "topics", "describe", "DATA", "--topic", user[0])
    same_output(data, uri, "config", "show", "DATA")  # (the broker's: no partition laid out)
    shown = run("config", "show", uri).stdout
    assert f"log.dirs={uri} " in shown and "seglogfs-stored-" not in shown, shown
    same_output(data, uri, "topics", "list", "DATA", "--topic", user[0][:2] + ".*")
    assert "not a regular expression" in one_error_line(run("topics", "describe", uri, "--topic", "(", code=2))
    partition = sorted(p for p in data.iterdir() if p.is_dir() and p.name.startswith(user[0] + "-"))[0]
    for file in sorted(partition.iterdir()):
        if file.suffix in (".log", ".index", ".timeindex", ".snapshot", ".txnindex"):
            relative = file.relative_to(data)
            local = dump(file)
            stored = dump(f"{uri}/{relative}")
            assert stored.returncode == local.returncode, stored.stderr
            assert stored.stdout.replace(f"{uri}/{relative}", "FILE") == local.stdout.replace(str(file), "FILE")


def dump(file: Path | str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [SEGLOGFS, "dump", "--deep-iteration", "--print-data-log", "--files", str(file)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


class Lines:
    """The lines a process writes, read by a thread of their own as they come."""

    def __init__(self, process: subprocess.Popen[str]) -> None:
        assert process.stdout is not None
        self.seen: list[str] = []
        self._stream = process.stdout
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        for line in self._stream:
            self.seen.append(line.rstrip("\n"))

    def wait_for(self, count: int, timeout: float = 60) -> list[str]:
        deadline = time.monotonic() + timeout
        while len(self.seen) < count:
            assert time.monotonic() < deadline, f"{len(self.seen)} of {count} lines after {timeout} s"
            assert self._thread.is_alive() or len(self.seen) >= count, (
                f"the follower ended after {len(self.seen)} lines"
            )
            time.sleep(0.05)
        return list(self.seen)


def test_a_follower_of_the_bucket_reads_each_new_run_once_in_order(s3: S3, tmp_path: Path) -> None:
    data = tmp_path / "data"
    produce(data, "t", [f"first-{n}" for n in range(300)], "--override", "log.segment.bytes=6000")
    uri = s3.uri()
    run("backup", data, uri)
    follower = subprocess.Popen(
        [SEGLOGFS, "consume", uri, "--topic", "t", "--from-beginning", "--follow"],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        lines = Lines(follower)
        expected = [f"first-{n}" for n in range(300)]
        for round_ in range(3):
            assert lines.wait_for(len(expected)) == expected
            more = [f"run{round_}-{n}" for n in range(200)]
            produce(data, "t", more, "--override", "log.segment.bytes=6000")
            run("backup", data, uri)
            expected += more
        assert lines.wait_for(len(expected)) == expected
        time.sleep(3)  # (a refresh or two more: nothing is read twice)
        assert lines.seen == expected
    finally:
        follower.terminate()
        _, stderr = follower.communicate(timeout=30)
    assert follower.returncode == 0, stderr
    assert stderr.strip().endswith(f"Processed a total of {len(expected)} messages"), stderr


def big_topic(data: Path, records: int = 60_000) -> None:
    """One partition of about 12 MiB in 1 MiB segments (200-byte records)."""
    produce(
        data,
        "big",
        [f"{n:08d} " + "v" * 190 for n in range(records)],
        "--override",
        "log.segment.bytes=1048576",
    )


def test_a_reader_fetches_the_indexes_and_the_ranges_it_reads(s3: S3, tmp_path: Path) -> None:
    data = tmp_path / "data"
    big_topic(data)
    run("backup", data, s3.uri())
    segment_bytes = sum(p.stat().st_size for p in data.glob("big-0/*.log"))
    before = BUDGET.fetched_bytes
    with LocalCopy.open(s3.uri()) as copy:
        config = BrokerConfig.load(None, [], log_dirs=copy.log_dirs)
        with DataDir.open(config, read_only=True, now_ms=int(time.time() * 1000)) as data_dir:
            log = data_dir.partition("big", 0)
            assert log.log_end_offset == 60_000
            opened = BUDGET.fetched_bytes - before
            # (the log end is the last segment's summary's: tests/objectstore/test_summaries.py)
            assert opened == 0, f"{opened} bytes fetched to open the log"
            assert CHUNK_BYTES <= 256 << 10
            records = list(log.records(59_000, 59_100))
            assert [r.offset for r in records] == list(range(59_000, 59_100))
            assert records[0].value == b"00059000 " + b"v" * 190
            near_the_end = BUDGET.fetched_bytes - before
            assert near_the_end <= 512 << 10, near_the_end  # (of 12 MiB)
            everything = list(log.records(0))
            assert [r.offset for r in everything] == list(range(60_000))
    assert BUDGET.fetched_bytes - before >= segment_bytes


def test_the_cache_stays_within_its_bound_and_reads_stay_right(
    s3: S3, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = tmp_path / "data"
    big_topic(data)
    run("backup", data, s3.uri())
    budget = FetchBudget(1 << 20)
    monkeypatch.setattr("seglogfs.engine.fetched_files.BUDGET", budget)
    with LocalCopy.open(s3.uri()) as copy:
        config = BrokerConfig.load(None, [], log_dirs=copy.log_dirs)
        for _ in range(2):  # (the second pass fetches again what was given back)
            with DataDir.open(config, read_only=True, now_ms=int(time.time() * 1000)) as data_dir:
                log = data_dir.partition("big", 0)
                values = [r.value for r in log.records(0)]
                assert values == [f"{n:08d} ".encode() + b"v" * 190 for n in range(60_000)]
            # (the bound, passed by at most one read's span: the segment's reads of 4 MiB)
            assert budget.held_bytes <= (1 << 20) + (4 << 20)
            held_on_disk = sum(p.stat().st_blocks * 512 for p in copy.directory.glob("big-0/*.log"))
            assert held_on_disk <= budget.held_bytes + CHUNK_BYTES  # (holes punched where chunks were given back)
        assert budget.fetched_bytes > 2 * sum(p.stat().st_size for p in data.glob("big-0/*.log")) * 0.9


def test_a_stalled_server_fails_a_reader_naming_the_object(s3: S3, tmp_path: Path) -> None:
    data = tmp_path / "data"
    big_topic(data, 20_000)
    run("backup", data, s3.uri())
    uri = s3.uri() + "?request_timeout=1&connect_timeout=1&retries=0"
    s3.server.pause()
    try:
        started = time.monotonic()
        done = run("consume", uri, "--topic", "big", "--from-beginning", code=1, timeout=120)
        assert time.monotonic() - started < 60
    finally:
        s3.server.resume()
    line = one_error_line(done)
    assert "s3://" in line and s3.bucket in line and "?" not in line, line


def test_an_object_gone_from_the_store_is_one_line_naming_it(s3: S3, tmp_path: Path) -> None:
    data = tmp_path / "data"
    big_topic(data, 20_000)
    run("backup", data, s3.uri())
    gone = next(key for key in s3.objects("backup/big-0/") if key.endswith("00000000000000000000.log"))
    os.unlink(s3.server.data / s3.bucket / gone)
    done = run("consume", s3.uri(), "--topic", "big", "--from-beginning", code=1)
    line = one_error_line(done)
    assert gone in line and "no such object" in line, line


@pytest.mark.parametrize(
    "args",
    [
        ["produce", "URI", "--topic", "t"],
        ["topics", "create", "URI", "--topic", "n"],
        ["topics", "delete", "URI", "--topic", "t"],
        ["topics", "alter", "URI", "--topic", "t", "--partitions", "3"],
        ["delete-records", "URI", "--topic", "t", "--partition", "0", "--offset", "1"],
        ["clean", "URI"],
        ["check", "URI", "--repair"],
    ],
)
def test_the_commands_that_change_a_data_dir_refuse_a_bucket(s3: S3, tmp_path: Path, args: list[str]) -> None:
    data = tmp_path / "data"
    produce(data, "t", ["a", "b"])
    run("backup", data, s3.uri())
    before = s3.objects()
    done = subprocess.run(
        [SEGLOGFS, *[s3.uri() if a == "URI" else a for a in args]],
        input="x\n",
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2, done.stderr
    assert "a backup in object storage" in one_error_line(done)
    assert s3.objects() == before


def test_no_local_copy_is_left_behind(s3: S3, tmp_path: Path) -> None:
    data = tmp_path / "data"
    produce(data, "t", ["a", "b"])
    run("backup", data, s3.uri())
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    environment = {**os.environ, "TMPDIR": str(scratch)}
    for args in (["consume", s3.uri(), "--topic", "t", "--from-beginning"], ["topics", "list", s3.uri()]):
        done = subprocess.run([SEGLOGFS, *args], cwd=REPO, capture_output=True, text=True, env=environment, check=False)
        assert done.returncode == 0, done.stderr
    follower = subprocess.Popen(
        [SEGLOGFS, "consume", s3.uri(), "--topic", "t", "--follow"], cwd=REPO, env=environment, stderr=subprocess.PIPE
    )
    time.sleep(1.5)
    assert list(scratch.iterdir())  # (its copy, while it runs)
    follower.terminate()
    _, stderr = follower.communicate(timeout=30)
    assert follower.returncode == 0, stderr
    assert list(scratch.iterdir()) == []
    killed = subprocess.Popen(
        [SEGLOGFS, "consume", s3.uri(), "--topic", "t", "--follow"], cwd=REPO, env=environment, stderr=subprocess.PIPE
    )
    time.sleep(1.5)
    left = list(scratch.iterdir())
    killed.kill()
    killed.communicate(timeout=30)
    assert [path.name for path in scratch.iterdir()] == [path.name for path in left] != []  # (kill -9: no exit handler)
    done = subprocess.run(
        [SEGLOGFS, "topics", "list", s3.uri()], cwd=REPO, capture_output=True, text=True, env=environment, check=False
    )
    assert done.returncode == 0, done.stderr
    assert list(scratch.iterdir()) == []  # (the next reader removed what the killed one left)


def test_a_segment_a_newer_run_removed_stays_readable_to_whoever_holds_it(s3: S3, tmp_path: Path) -> None:
    data = tmp_path / "data"
    big_topic(data, 20_000)
    run("backup", data, s3.uri())
    first = data / "big-0" / "00000000000000000000.log"
    expected = list(FileRecords(first, writable=False).iter_headers(0))
    with LocalCopy.open(s3.uri()) as copy:
        held_path = copy.directory / "big-0" / first.name
        status = held_path.stat()
        held = FileRecords.open_for_reading(held_path, (status.st_dev, status.st_ino))
        held.hold_open()  # (a reader in the middle of it, as a view's holder is)
        try:
            assert next(iter(held.iter_headers(0))) == expected[0]
            run("delete-records", data, "--topic", "big", "--partition", "0", "--offset", "15000")
            run("backup", data, s3.uri())
            assert copy.refresh()
            assert not held_path.exists()  # (removed from the copy, as retention removes it)
            late = [h for h in expected if h.position > 600_000]
            assert list(held.iter_headers(late[0].position)) == late  # (fetched after the run removed it)
            run("backup", data, s3.uri())
            produce(data, "big", ["more"])
            run("backup", data, s3.uri())
            assert copy.refresh()
            with pytest.raises(OSError, match="no longer in the backup's copy"):
                list(held.iter_headers(expected[3].position))  # (two runs later: gone)
        finally:
            held.let_close()
            held.close()


def test_a_full_disk_under_the_local_copy_is_one_line_and_leaves_nothing(
    s3: S3, tmp_path: Path, small_tmpfs: Path
) -> None:
    data = tmp_path / "data"
    big_topic(data)  # (12 MiB, on a 4 MiB file system)
    run("backup", data, s3.uri())
    environment = {**os.environ, "TMPDIR": str(small_tmpfs)}
    done = subprocess.run(
        [SEGLOGFS, "consume", s3.uri(), "--topic", "big", "--from-beginning"],
        cwd=REPO,
        capture_output=True,
        env=environment,
        check=False,
        timeout=120,
    )
    assert done.returncode == 1
    lines = done.stderr.decode().splitlines()
    assert len(lines) == 1 and "no room for what is fetched from the store" in lines[0] and "TMPDIR" in lines[0]
    printed = done.stdout.decode().splitlines()
    assert printed == [f"{n:08d} " + "v" * 190 for n in range(len(printed))]  # (in order, none twice)
    assert list(small_tmpfs.iterdir()) == []


def test_a_file_a_reader_reads_itself_keeps_its_bytes_past_the_cache_bound(
    s3: S3, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`dump` and the metadata log's reader read a `.log` themselves, past the segment file: the
    placeholder they read is pinned, so reads of other segments never punch holes in it."""
    data = tmp_path / "data"
    big_topic(data)
    run("backup", data, s3.uri())
    monkeypatch.setattr("seglogfs.engine.fetched_files.BUDGET", FetchBudget(256 << 10))
    logs = sorted((data / "big-0").glob("*.log"))
    with LocalCopy.open(s3.uri()) as copy:
        pinned = copy.materialize(f"big-0/{logs[0].name}")
        for other in logs[1:]:  # (11 MiB of other segments through a 256 KiB bound)
            local = copy.directory / "big-0" / other.name
            status = local.stat()
            records = FileRecords.open_for_reading(local, (status.st_dev, status.st_ino))
            try:
                headers = list(records.iter_headers())  # (read through 64 KiB chunks, given back past the bound)
                assert sum(header.size_in_bytes for header in headers) == other.stat().st_size
            finally:
                records.close()
        assert pinned.read_bytes() == logs[0].read_bytes()


def test_a_refresh_with_no_newer_run_fetches_no_catalogue(
    s3: S3, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Spark task and a follower refresh often: one LIST each, the catalogue only when newer."""
    data = tmp_path / "data"
    produce(data, "t", ["a"])
    run("backup", data, s3.uri())
    with LocalCopy.open(s3.uri()) as copy:
        read: list[int] = []
        original = local_copy.read_catalogue
        monkeypatch.setattr(local_copy, "read_catalogue", lambda store, run: read.append(run) or original(store, run))
        assert not copy.refresh() and not copy.refresh()
        assert read == []
        produce(data, "t", ["b"])
        run("backup", data, s3.uri())
        assert copy.refresh()
        assert len(read) == 1
