"""Topics removed through a writable mount with real tools (`rmdir`, `rm -r`), as `topics delete`
removes them; what the mount refuses to remove or rename (internal topics, topics a broker's
KRaft metadata log names, partitions, `mv`), each with one line from the tool and one in the
mount's log; and what a follower holding the topic's records and a writer holding its append
file see when it goes."""

from __future__ import annotations

import errno
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from seglogfs.engine import BrokerConfig, DataDir
from tests.conftest import NOW_MS, REPO, kafka_fixtures
from tests.fs.conftest import REFUSED, Mount


def tool(*command: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(part) for part in command], capture_output=True, text=True, timeout=60, check=False)


def seglogfs(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "seglogfs.mount_tools.cli", *(str(arg) for arg in args)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def make_data_dir(data: Path) -> Path:
    """Topic `t` (two partitions, records in both, an override) and topic `u`."""
    with DataDir.open(BrokerConfig.load(log_dirs=[data]), now_ms=NOW_MS) as data_dir:
        data_dir.create_topic("t", 2, {"retention.ms": "7200000"}, now_ms=NOW_MS)
        data_dir.create_topic("u", 1, now_ms=NOW_MS)
        for partition in (0, 1):
            data_dir.partition("t", partition).append_records([b"one", b"two"], now_ms=NOW_MS)
        data_dir.partition("u", 0).append_records([b"kept"], now_ms=NOW_MS)
    return data


def listing(data: Path) -> list[str]:
    return sorted(str(path.relative_to(data)) for path in data.rglob("*"))


def root_files(data: Path) -> dict[str, str]:
    """The data dir's root files a deletion rewrites (checkpoints, overrides)."""
    names = ("recovery-point-offset-checkpoint", "log-start-offset-checkpoint", "replication-offset-checkpoint")
    return {name: (data / name).read_text() for name in (*names, ".seglogfs-topic-configs.json")}


def log_lines(m: Mount, pattern: str) -> list[str]:
    return [line for line in m.output().splitlines() if re.search(pattern, line)]


@pytest.mark.parametrize("remove", [["rmdir"], ["rm", "-r"]], ids=["rmdir", "rm -r"])
def test_a_topic_removed_through_the_mount_is_deleted_as_topics_delete_deletes_it(
    mount, tmp_path: Path, remove: list[str]
) -> None:
    """`rmdir M/t` and `rm -r M/t` (which first unlinks every file and removes every directory
    below the topic: each answered as done, nothing changed) exit 0 and print nothing; the data
    dir is then what `seglogfs topics delete` leaves (partition dirs renamed `-delete` and
    removed, the override and the checkpoint entries gone), and the topic can be made again."""
    data = make_data_dir(tmp_path / "data")
    by_the_cli = tmp_path / "by-the-cli"
    shutil.copytree(data, by_the_cli)
    deleted = seglogfs("topics", by_the_cli, "delete", "--topic", "t")
    assert deleted.returncode == 0, deleted.stderr

    m: Mount = mount(data)
    (m.path / "t/temporary").write_text("retention.ms=1\n")  # (a save of config under way goes too)
    assert (m.path / "t/1/records").read_bytes() == b"one\ntwo\n"  # (views looked at: nodes to supersede)
    done = tool(*remove, m.path / "t")
    assert (done.returncode, done.stdout, done.stderr) == (0, "", "")
    assert sorted(os.listdir(m.path)) == [".logdir", "u"]
    assert not (m.path / "t").exists()
    [line] = log_lines(m, r"deleted topic t\b")
    assert "partition dirs t-0, t-1 renamed -delete and removed" in line
    assert not any(path.name.startswith("t-") for path in data.iterdir())
    assert not any(name.startswith("t-") for name in os.listdir(m.path / ".logdir"))
    assert "u-0" in os.listdir(m.path / ".logdir")
    assert (m.path / "u/0/records").read_bytes() == b"kept\n"

    os.mkdir(m.path / "t")  # a new topic of the name: new files, nothing of the old one
    assert (m.path / "t/0/records").read_bytes() == b""
    assert (m.path / "t/config").read_bytes() == b""
    with open(m.path / "t/0/append", "ab") as append:
        append.write(b"new\n")
    assert (m.path / "t/0/records").read_bytes() == b"new\n"
    done = tool(*remove, m.path / "t")
    assert (done.returncode, done.stdout, done.stderr) == (0, "", "")
    m.stop()
    assert listing(data) == listing(by_the_cli)
    assert root_files(data) == root_files(by_the_cli)


@pytest.mark.expect_warnings(REFUSED)
def test_what_cannot_be_removed_or_renamed_is_refused_with_one_line_each(mount, tmp_path: Path) -> None:
    """A partition (`rmdir`, `rm -r`: Kafka cannot take partitions away) and `mv` of a topic or
    a partition (Kafka cannot rename them): EPERM, one line from the tool, one line in the
    mount's log saying why, and nothing changed."""
    data = make_data_dir(tmp_path / "data")
    m: Mount = mount(data)
    before = listing(data)
    held = os.open(m.path / "t/1/read_committed", os.O_RDONLY)  # (the kernel keeps its inode)
    cases = [
        (["rmdir", m.path / "t/0"], "rmdir t/0: Kafka numbers a topic's partitions from 0 and cannot take one away"),
        (["rm", "-r", m.path / "t/1"], "rmdir t/1: Kafka numbers a topic's partitions from 0 and cannot take one"),
        (["rm", "-r", m.path / "t/0/by-offset"], r"rmdir t/0/by-offset: Operation not permitted"),
        (["mv", m.path / "t", m.path / "v"], "rename t to v: Kafka cannot rename a topic"),
        (["mv", m.path / "t/0", m.path / "t/5"], "rename t/0 to t/5: Kafka cannot rename a partition"),
    ]
    refused_each_in_one_line(m, cases)
    assert listing(data) == before
    assert sorted(os.listdir(m.path / "t")) == ["0", "1", "append", "append.jsonl", "config"]
    assert (m.path / "t/0/records").read_bytes() == b"one\ntwo\n"
    assert sorted(os.listdir(m.path / "t/0/by-offset")) == ["0", "0.jsonl"]
    # (rm -r t/1 removed its directories as far as the kernel knows, and the mount answered done:
    # they are new directories at the next lookup, not dead ones)
    assert sorted(os.listdir(m.path / "t/1/read_committed/by-offset")) == ["0", "0.jsonl"]
    assert (m.path / "t/1/read_committed/records").read_bytes() == b"one\ntwo\n"
    os.close(held)


@pytest.mark.expect_warnings(REFUSED)
def test_internal_topics_and_topics_of_the_brokers_metadata_are_not_removed(mount, tmp_path: Path) -> None:
    """A KRaft broker's data dir mounted writable: its `__consumer_offsets` (internal to Kafka)
    and its topic (named by the metadata log: a broker would make it again) are refused, one
    line from `rmdir` or `rm -r` each and one line in the log saying why; nothing on disk
    changes."""
    data = tmp_path / "broker"
    shutil.copytree(kafka_fixtures() / "ne-streaming-d95be01", data)
    m: Mount = mount(data)
    before = listing(data)
    cases = [
        (["rmdir", m.path / "__consumer_offsets"], "internal to Kafka"),
        (["rm", "-r", m.path / "__consumer_offsets"], "internal to Kafka"),
        (["rmdir", m.path / "__cluster_metadata"], "internal to Kafka"),
        (["rmdir", m.path / "your-kafka-topic"], "the broker's KRaft metadata log names the topic"),
        (["rm", "-r", m.path / "your-kafka-topic"], "the broker's KRaft metadata log names the topic"),
    ]
    refused_each_in_one_line(m, cases)
    assert listing(data) == before
    assert sorted(os.listdir(m.path)) == [".logdir", "__cluster_metadata", "__consumer_offsets", "your-kafka-topic"]
    assert os.listdir(m.path / "your-kafka-topic/0/by-offset")  # (as readable as before)


def test_a_read_only_mount_removes_nothing(mount, tmp_path: Path) -> None:
    data = make_data_dir(tmp_path / "data")
    before = listing(data)
    m: Mount = mount(data, "-o", "ro")
    with pytest.raises(OSError) as refused:
        os.rmdir(m.path / "t")
    assert refused.value.errno == errno.EROFS
    done = tool("rm", "-r", m.path / "t")
    assert done.returncode == 1 and "Read-only file system" in done.stderr
    assert listing(data) == before
    assert (m.path / "t/0/records").read_bytes() == b"one\ntwo\n"


def refused_each_in_one_line(m: Mount, cases: list[tuple[list, str]]) -> None:
    """Each command fails with one EPERM line of its own and one line in the mount's log that
    gives the reason."""
    for command, reason in cases:
        said = len(m.output().splitlines())
        done = tool(*command)
        assert done.returncode == 1, command
        assert done.stderr.count("\n") == 1 and "Operation not permitted" in done.stderr, (command, done.stderr)
        new = [line for line in m.output().splitlines()[said:] if re.search(r"WARNING|ERROR", line)]
        assert len(new) == 1 and reason in new[0] and new[0].endswith("(EPERM)"), (command, new)


def wait_for(condition, what: str, seconds: float = 30) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


@pytest.mark.expect_warnings(r"write t/0/append: topic t was deleted: No such file or directory \(ENOENT\)$")
def test_a_follower_keeps_what_it_holds_and_a_writer_is_told(mount, tmp_path: Path) -> None:
    """`tail -f` holds `t/0/records` and a writer holds `t/0/append` while the topic is removed:
    the mount stays up and says so in one line, tail keeps running on what it holds (its
    descriptor still reads and stats the whole file), the writer's next write is ENOENT, and a
    topic made again under the name is another file."""
    data = make_data_dir(tmp_path / "data")
    m: Mount = mount(data)
    out = tmp_path / "tail.out"
    with open(out, "wb") as sink:
        follower = subprocess.Popen(
            ["tail", "-n", "+1", "-f", str(m.path / "t/0/records")], stdout=sink, stderr=subprocess.PIPE
        )
    try:
        writer = os.open(m.path / "t/0/append", os.O_WRONLY | os.O_APPEND)
        held = os.open(m.path / "t/0/records", os.O_RDONLY)
        try:
            os.write(writer, b"three\n")
            wait_for(lambda: out.read_bytes() == b"one\ntwo\nthree\n", "tail -f printed the records")
            os.rmdir(m.path / "t")
            assert not (m.path / "t").exists() and not any(data.glob("t-*"))
            [line] = log_lines(m, r"deleted topic t\b")
            assert line.endswith("2 open views of it keep what they hold and grow no more")  # (tail's, ours)
            with pytest.raises(OSError) as refused:
                os.write(writer, b"four\n")
            assert refused.value.errno == errno.ENOENT
            assert os.pread(held, 100, 0) == b"one\ntwo\nthree\n"
            assert os.fstat(held).st_size == len(b"one\ntwo\nthree\n")
            os.mkdir(m.path / "t")
            with open(m.path / "t/0/append", "ab") as append:
                append.write(b"other\n")
            assert (m.path / "t/0/records").read_bytes() == b"other\n"
            assert os.pread(held, 100, 0) == b"one\ntwo\nthree\n"
        finally:
            os.close(writer)
            os.close(held)
        time.sleep(1.5)  # (tail -f looks at its file every second: it has looked since)
        assert follower.poll() is None, "tail -f ended"
        assert out.read_bytes() == b"one\ntwo\nthree\n"
    finally:
        follower.terminate()
        _, err = follower.communicate(timeout=30)
    assert err == b""
    assert not re.search(r"ERROR|Traceback", m.output())


@pytest.mark.expect_warnings(
    r"write t/(0/)?append: topic t was deleted: No such file or directory \(ENOENT\)$",
    r"write t/(0/)?append: .*segment is closed \(EIO\)$",  # (a write racing the deletion itself)
)
def test_topics_removed_while_writers_append_and_the_background_work_runs(mount, tmp_path: Path) -> None:
    """Writers append in a loop (one descriptor held, one open per line) while `rm -r` removes
    the topic, and retention, flushes, compaction and checkpoints run every few milliseconds:
    each removal exits 0 and prints nothing, the writers stop at an error, the data dir holds
    nothing of the topic, and the mount logs no error."""
    m: Mount = mount(
        tmp_path / "data",
        "-o",
        "parse.key,log.retention.check.interval.ms=20,log.flush.scheduler.interval.ms=10,flush.ms=5,"
        "log.cleaner.backoff.ms=20,log.flush.offset.checkpoint.interval.ms=15,log.segment.bytes=2000",
    )
    topic = m.path / "t"
    for _ in range(5):
        os.mkdir(topic)
        (topic / "config").write_text("cleanup.policy=compact,delete\n")
        writers = [
            subprocess.Popen(
                ["bash", "-c", f"exec 3>>{topic}/append; while printf 'k%d\\tv\\n' $RANDOM >&3; do :; done"]
            ),
            subprocess.Popen(
                ["bash", "-c", f"while printf 'k%d\\tv\\n' $RANDOM >> {topic}/0/append; do :; done"],
                stderr=subprocess.PIPE,
            ),
        ]
        wait_for(lambda: (topic / "0/records").stat().st_size > 200, "the writers appended")
        done = tool("rm", "-r", topic)
        assert (done.returncode, done.stderr) == (0, "")
        for writer in writers:
            writer.wait(timeout=60)  # (its loop ends at a refused write or open)
            if writer.stderr is not None:
                writer.stderr.close()
        assert not any(path.name.startswith("t-") for path in (tmp_path / "data").iterdir())
    assert len(log_lines(m, r"deleted topic t\b")) == 5
    assert not re.search(r"ERROR|Traceback", m.output())
