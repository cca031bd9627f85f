"""A data dir that others write may hold a symbolic link, a FIFO or a directory where a segment
belongs, a partition dir that is a link, or bytes that are not text in a checkpoint or a config:
every command answers at once with a line naming the path, serves the other partitions, and
never reads, follows or changes a link's target (here a root-owned 0600 file outside the data
dir, with a content no output may show)."""

from __future__ import annotations

import atexit
import functools
import hashlib
import os
import shutil
import stat
import subprocess
import tempfile
from pathlib import Path

import pytest

from tests.cli.support import SEGLOGFS, run
from tests.conftest import REPO

SECRET = "victim-content-7f3a9c-never-shown"
SEGMENT = "00000000000000000100.log"  # (after the healthy segment at 0: where a roll would put one)
ANSWER_S = 5  # each command answers within this, whatever the data dir holds


def seglogfs(*args: str, stdin: bytes = b"") -> subprocess.CompletedProcess[str]:
    """`seglogfs ARGS`, which must answer within ANSWER_S (a FIFO opened without O_NONBLOCK
    would block it forever: the timeout fails the test)."""
    done = subprocess.run([SEGLOGFS, *args], input=stdin, capture_output=True, cwd=REPO, timeout=ANSWER_S, check=False)
    output = done.stdout.decode(errors="replace") + done.stderr.decode(errors="replace")
    assert "internal error" not in output and "Traceback" not in output, output
    assert SECRET not in output, output
    return subprocess.CompletedProcess(done.args, done.returncode, done.stdout.decode(), done.stderr.decode())


class Victim:
    """A root-owned 0600 file outside the data dir: the link's target. Its content, mtime and
    access time are noted; the access time is set before the mtime, so that any read moves it
    (even under relatime), and set back after each look of the test's own."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.content = (SECRET + "\n").encode()
        path.write_bytes(self.content)
        os.chown(path, 0, 0)
        path.chmod(0o600)
        status = os.lstat(path)
        self.times = (status.st_mtime_ns - 3 * 86400 * 10**9, status.st_mtime_ns)
        os.utime(path, ns=self.times)

    def unchanged(self) -> bool:
        """Whether nothing read, wrote or replaced the file since it was made."""
        status = os.lstat(self.path)
        same = (
            stat.S_ISREG(status.st_mode)
            and (status.st_atime_ns, status.st_mtime_ns) == self.times
            and self.path.read_bytes() == self.content
        )
        os.utime(self.path, ns=self.times)  # (the read just made moves the access time)
        return same


@pytest.fixture
def hostile(tmp_path: Path) -> tuple[Path, Victim]:
    return make_hostile(tmp_path)


@functools.cache
def _healthy_data_dir() -> Path:
    """The data dir before anything hostile is put in it, made once per test process with the
    commands (seven runs, which every test that copies it would otherwise make again)."""
    data = Path(tempfile.mkdtemp(prefix="seglogfs-healthy-")) / "data"
    atexit.register(shutil.rmtree, data.parent, ignore_errors=True)
    run("topics", str(data), "create", "--topic", "good", "--partitions", "1")
    run("topics", str(data), "create", "--topic", "bad", "--partitions", "4")
    run("produce", str(data), "--topic", "good", stdin=b"g1\ng2\n")
    for partition in range(4):
        run("produce", str(data), "--topic", "bad", "--partition", str(partition), stdin=f"b{partition}\n".encode())
    return data


def make_hostile(tmp_path: Path) -> tuple[Path, Victim]:
    """A data dir: topic `good` (one partition, records g1 and g2), topic `bad` whose partition 0
    holds a link named like a segment (to the victim), 1 a FIFO, 2 a directory, 3 nothing
    wrong; each `bad` partition holds one record (b0, b1, …) in a healthy first segment."""
    data = Path(shutil.copytree(_healthy_data_dir(), tmp_path / "data", symlinks=True))
    victim = Victim(tmp_path / "victim")
    (data / "bad-0" / SEGMENT).symlink_to(victim.path)
    os.mkfifo(data / "bad-1" / SEGMENT)
    (data / "bad-2" / SEGMENT).mkdir()
    return data, victim


def refused_paths(data: Path) -> list[str]:
    return [str(data / f"bad-{partition}" / SEGMENT) for partition in range(3)]


KINDS = ("a symbolic link", "a FIFO", "a directory")


def assert_names_each(output: str, data: Path) -> None:
    for path, kind in zip(refused_paths(data), KINDS, strict=True):
        assert any(path in line and kind in line for line in output.splitlines()), (path, output)


def test_check_reports_each_and_checks_the_rest(hostile: tuple[Path, Victim]) -> None:
    data, victim = hostile
    done = seglogfs("check", str(data))
    assert done.returncode == 4, done
    assert_names_each(done.stdout, data)
    assert "3 problems" in done.stdout  # (the healthy partitions are clean)
    assert victim.unchanged()


def test_check_repair_never_cuts_a_links_target(hostile: tuple[Path, Victim]) -> None:
    data, victim = hostile
    done = seglogfs("check", str(data), "--repair")
    assert done.returncode == 4, done  # (no repair makes a link a segment: still reported)
    assert_names_each(done.stdout, data)
    assert victim.unchanged()
    assert (data / "bad-0" / SEGMENT).is_symlink() and stat_is_fifo(data / "bad-1" / SEGMENT)
    assert seglogfs("consume", str(data), "--topic", "bad", "--partition", "3", "--from-beginning").stdout == "b3\n"


def stat_is_fifo(path: Path) -> bool:
    return stat.S_ISFIFO(os.lstat(path).st_mode)


def test_produce_to_such_a_partition_is_refused_and_the_others_take_records(hostile: tuple[Path, Victim]) -> None:
    data, victim = hostile
    for partition, (path, kind) in enumerate(zip(refused_paths(data), KINDS, strict=True)):
        done = seglogfs("produce", str(data), "--topic", "bad", "--partition", str(partition), stdin=b"x\n")
        assert done.returncode == 1, done
        assert path in done.stderr.splitlines()[-1] and kind in done.stderr.splitlines()[-1], done.stderr
    assert seglogfs("produce", str(data), "--topic", "bad", "--partition", "3", stdin=b"y\n").returncode == 0
    assert seglogfs("produce", str(data), "--topic", "good", stdin=b"g3\n").returncode == 0
    assert victim.unchanged()
    consumed = seglogfs("consume", str(data), "--topic", "bad", "--partition", "3", "--from-beginning")
    assert consumed.stdout == "b3\ny\n"
    assert seglogfs("consume", str(data), "--topic", "good", "--from-beginning").stdout == "g1\ng2\ng3\n"


def test_consume_names_the_path_and_serves_the_others(hostile: tuple[Path, Victim]) -> None:
    data, victim = hostile
    for partition, path in enumerate(refused_paths(data)):
        done = seglogfs("consume", str(data), "--topic", "bad", "--partition", str(partition), "--from-beginning")
        assert done.returncode == 1, done
        assert path in done.stderr.splitlines()[-1], done.stderr
    whole = seglogfs("consume", str(data), "--topic", "bad", "--from-beginning")
    assert whole.returncode == 0 and whole.stdout == "b3\n", whole
    assert_names_each(whole.stderr, data)
    assert seglogfs("consume", str(data), "--topic", "good", "--from-beginning").stdout == "g1\ng2\n"
    assert victim.unchanged()


def test_clean_and_topics_describe_name_the_paths(hostile: tuple[Path, Victim]) -> None:
    data, victim = hostile
    cleaned = seglogfs("clean", str(data))
    assert cleaned.returncode == 0, cleaned
    assert_names_each(cleaned.stderr, data)
    described = seglogfs("topics", str(data), "describe")
    assert described.returncode == 0, described
    assert_names_each(described.stderr, data)
    assert "Topic: good\tPartition: 0" in described.stdout and "LogEndOffset: 2" in described.stdout
    assert victim.unchanged()


def test_backup_and_restore_copy_the_rest_and_never_a_links_target(
    hostile: tuple[Path, Victim], tmp_path: Path
) -> None:
    data, victim = hostile
    backup = tmp_path / "backup"
    done = seglogfs("backup", str(data), str(backup))
    assert done.returncode == 1, done
    assert_names_each(done.stderr, data)  # (the FIFO and the directory as the open refuses them)
    assert any(str(data / "bad-0" / SEGMENT) in line and "not copied" in line for line in done.stderr.splitlines())
    assert not os.path.lexists(backup / "bad-0" / SEGMENT)
    for name in ("good-0", "bad-0", "bad-1", "bad-2", "bad-3"):  # every partition's healthy segment
        assert (backup / name / "00000000000000000000.log").is_file(), name
    assert victim.unchanged()

    # A backup holding a link and a FIFO: the restore refuses both, naming them, copies the rest.
    (backup / "good-0" / SEGMENT).symlink_to(victim.path)
    os.mkfifo(backup / "bad-3" / SEGMENT)
    restored = tmp_path / "restored"
    done = seglogfs("restore", str(backup), str(restored))
    assert done.returncode == 1, done
    for path, kind in ((backup / "good-0" / SEGMENT, "a symbolic link"), (backup / "bad-3" / SEGMENT, "a FIFO")):
        assert any(str(path) in line and kind in line for line in done.stderr.splitlines()), done.stderr
        assert not os.path.lexists(restored / path.parent.name / SEGMENT)
    assert seglogfs("consume", str(restored), "--topic", "good", "--from-beginning").stdout == "g1\ng2\n"
    assert victim.unchanged()


def test_a_partition_dir_that_is_a_link_is_never_followed(tmp_path: Path) -> None:
    data = tmp_path / "data"
    run("topics", str(data), "create", "--topic", "t", "--partitions", "1")
    elsewhere = tmp_path / "elsewhere"
    run("topics", str(elsewhere), "create", "--topic", "t", "--partitions", "1")
    run("produce", str(elsewhere), "--topic", "t", stdin=b"theirs\n")
    (elsewhere / "t-0").rename(elsewhere / "t-1")
    before = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in (elsewhere / "t-1").iterdir()}
    (data / "t-1").symlink_to(elsewhere / "t-1")

    done = seglogfs("produce", str(data), "--topic", "t", "--partition", "1", stdin=b"x\n")
    assert done.returncode == 1 and str(data / "t-1") in done.stderr.splitlines()[-1], done
    assert "a symbolic link where a partition directory belongs" in done.stderr
    for _ in range(3):  # a producer choosing partitions never picks the offline one's files either
        assert seglogfs("produce", str(data), "--topic", "t", stdin=b"a\nb\nc\n").returncode == 0
    assert {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in (elsewhere / "t-1").iterdir()} == before
    ours = seglogfs("consume", str(data), "--topic", "t", "--partition", "0", "--from-beginning").stdout
    assert ours.count("\n") == 9, ours
    checked = seglogfs("check", str(data))
    assert checked.returncode == 4 and str(data / "t-1") in checked.stdout, checked
    assert "theirs" not in seglogfs("consume", str(data), "--topic", "t", "--from-beginning").stdout


BAD_BYTES = b"0\n\xff\n"


@pytest.mark.parametrize(
    "name",
    [
        "recovery-point-offset-checkpoint",
        "log-start-offset-checkpoint",
        "replication-offset-checkpoint",
        "cleaner-offset-checkpoint",
    ],
)
def test_bad_bytes_in_a_checkpoint_are_read_as_kafka_reads_them(tmp_path: Path, name: str) -> None:
    data = tmp_path / "data"
    run("produce", str(data), "--topic", "t", stdin=b"a\nb\n")
    (data / name).write_bytes(BAD_BYTES)
    checked = seglogfs("check", str(data))
    assert checked.returncode == 4 and f"{data / name}: line 2, column 1: byte 0xff is not UTF-8 text" in checked.stdout
    for args in (("consume", str(data), "--topic", "t", "--from-beginning"), ("topics", str(data), "describe")):
        done = seglogfs(*args)
        assert done.returncode == 0, done
    assert seglogfs("consume", str(data), "--topic", "t", "--from-beginning").stdout == "a\nb\n"
    produced = seglogfs("produce", str(data), "--topic", "t", stdin=b"c\n")  # a writable open: Kafka's way
    assert produced.returncode == 0, produced
    if name in ("recovery-point-offset-checkpoint", "log-start-offset-checkpoint", "cleaner-offset-checkpoint"):
        assert str(data / name) in produced.stderr and "line 2" in produced.stderr, produced.stderr  # the warning
    assert b"\xff" not in (data / name).read_bytes()  # written anew at close
    assert seglogfs("check", str(data)).returncode == 0
    assert seglogfs("consume", str(data), "--topic", "t", "--from-beginning").stdout == "a\nb\nc\n"


@pytest.mark.parametrize("name", ["meta.properties", "t-0/partition.metadata", ".seglogfs-topic-configs.json"])
def test_bad_bytes_in_a_config_or_metadata_file_name_the_file_and_line(tmp_path: Path, name: str) -> None:
    data = tmp_path / "data"
    run("produce", str(data), "--topic", "t", stdin=b"a\n")
    path = data / name
    path.write_bytes(b"# written by a broker\nx=\xff\n")
    where = f"{path}: line 2, column 3: byte 0xff is not UTF-8 text"
    checked = seglogfs("check", str(data))
    if name != ".seglogfs-topic-configs.json":  # (check reads no topic configs)
        assert checked.returncode == 4 and where in checked.stdout, checked
    for args in (
        ("topics", str(data), "describe"),
        ("consume", str(data), "--topic", "t", "--from-beginning"),
        ("clean", str(data)),
        ("check", str(data), "--repair"),
    ):
        done = seglogfs(*args)
        if done.returncode not in (0, 4):
            assert done.stderr.strip() == f"seglogfs: {where}", done
        elif args[0] == "topics" and name.endswith("partition.metadata"):
            assert where in done.stderr, done  # (the warning: the topic id comes from elsewhere)


def test_a_root_checkpoint_that_is_a_link_or_a_fifo_is_never_followed(hostile: tuple[Path, Victim]) -> None:
    data, victim = hostile
    (data / "recovery-point-offset-checkpoint").unlink()
    (data / "recovery-point-offset-checkpoint").symlink_to(victim.path)
    (data / "log-start-offset-checkpoint").unlink()
    os.mkfifo(data / "log-start-offset-checkpoint")
    done = seglogfs("produce", str(data), "--topic", "good", stdin=b"g3\n")
    assert done.returncode == 0, done
    assert f"{data / 'recovery-point-offset-checkpoint'}: a symbolic link" in done.stderr
    assert victim.unchanged()
    # Written anew by a rename over the link (the link goes, its target stays as it was).
    assert (data / "recovery-point-offset-checkpoint").is_file() and not (
        data / "recovery-point-offset-checkpoint"
    ).is_symlink()
    assert seglogfs("consume", str(data), "--topic", "good", "--from-beginning").stdout == "g1\ng2\ng3\n"


def test_dump_refuses_each_by_name_and_dumps_the_rest(hostile: tuple[Path, Victim]) -> None:
    data, victim = hostile
    healthy = data / "bad-3" / "00000000000000000000.log"
    done = seglogfs("dump", *refused_paths(data), str(healthy))
    assert done.returncode == 1, done
    for path, kind in zip(refused_paths(data), KINDS, strict=True):
        assert f"seglogfs: {path}: {kind} where a regular file belongs: refused" in done.stderr.splitlines()
    assert "baseOffset: 0 lastOffset: 0 count: 1" in done.stdout
    assert victim.unchanged()


@pytest.mark.parametrize("name", ["00000000000000000000.index", "00000000000000000000.timeindex"])
def test_a_linked_index_takes_its_partition_offline_and_is_never_written(tmp_path: Path, name: str) -> None:
    """Recovery rebuilds and resizes index files: one that is a link must never be opened."""
    data = tmp_path / "data"
    run("produce", str(data), "--topic", "t", stdin=b"a\nb\n")
    run("produce", str(data), "--topic", "u", stdin=b"c\n")
    victim = Victim(tmp_path / "victim")
    (data / "t-0" / name).unlink()
    (data / "t-0" / name).symlink_to(victim.path)
    for args in (("check", str(data), "--repair"), ("produce", str(data), "--topic", "t")):
        done = seglogfs(*args, stdin=b"x\n")
        assert done.returncode in (1, 4), done
        said = done.stdout + done.stderr
        assert f"{data / 't-0' / name}: a symbolic link where a regular file belongs: refused" in said, said
    assert seglogfs("produce", str(data), "--topic", "u", stdin=b"d\n").returncode == 0
    assert seglogfs("consume", str(data), "--topic", "u", "--from-beginning").stdout == "c\nd\n"
    assert victim.unchanged()
