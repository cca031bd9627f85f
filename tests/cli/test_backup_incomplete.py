"""A backup that did not complete says so: its exit status (a reader of `-v` gone with `| head -1`
included), `check` and `consume` of it, and the next backup into it, which completes it and
removes what the cut-short run left. Real `seglogfs` processes; the data dir has enough files
(100 partitions of a topic with a long name) that `-v` writes more than a pipe holds, so a
reader that stops reading stops the backup mid-way, deterministically."""

from __future__ import annotations

import fcntl
import json
import os
import signal
import subprocess
from pathlib import Path

import pytest

from tests.cli.support import SEGLOGFS, run
from tests.conftest import AS_FOREGROUND, REPO

MANIFEST = ".seglogfs-backup.json"
TOPIC = "t" * 200  # each `-v` line of a file in its partition dirs is about 250 bytes
PARTITIONS = 100  # about 500 files: 120 KB of `-v` lines, more than a pipe's 64 KiB


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("source") / "data"
    run("topics", "create", str(directory), "--topic", TOPIC, "--partitions", str(PARTITIONS))
    run("produce", str(directory), "--topic", TOPIC, stdin=b"".join(b"record-%d\n" % i for i in range(300)))
    return directory


def manifest(backup: Path) -> dict[str, object]:
    document: dict[str, object] = json.loads((backup / MANIFEST).read_text())
    return document


def leftovers(backup: Path) -> list[Path]:
    return sorted(backup.rglob("*.seglogfs-tmp"))


def assert_said_incomplete(backup: Path, data: Path) -> None:
    """`check` exits 4 with one line naming the backup as incomplete; `consume` says it too."""
    checked = run("check", str(backup), code=4)
    said = checked.stderr.splitlines()
    assert said == [
        f"seglogfs: {backup}: an incomplete backup: the backup into it started "
        f"{said[0].split('started ', 1)[1].split(' ', 1)[0]} did not complete (cut short or failed), so its files "
        f"are not a consistent copy; seglogfs backup {data} {backup} completes it"
    ], checked.stderr
    assert checked.stdout.rstrip().endswith("but an incomplete backup (see above)"), checked.stdout
    assert "clean" not in checked.stdout
    document = json.loads(run("check", str(backup), "--json", code=4).stdout)
    assert document["clean"] is False and document["incompleteBackup"] == said[0].removeprefix("seglogfs: ")
    consumed = run("consume", str(backup), "--topic", TOPIC, "--from-beginning", "--timeout-ms", "0", code=None)
    assert consumed.stderr.splitlines()[0] == said[0], consumed.stderr
    assert "did not complete" in run("restore", str(backup), str(backup.parent / "restored"), code=1).stderr


def assert_completed_by_the_next_backup(backup: Path, data: Path) -> None:
    run("backup", str(data), str(backup))
    assert manifest(backup)["complete"] is True
    assert not leftovers(backup)
    assert run("check", str(backup)).stdout.rstrip().endswith(": clean")
    assert run("check", str(backup)).stderr == ""
    assert sorted(p.name for p in backup.iterdir()) == sorted(
        [*(p.name for p in data.iterdir() if p.name not in (".lock", ".kafka_cleanshutdown")), ".lock", MANIFEST]
    )


def into_head(command: str, source: Path, target: Path) -> subprocess.CompletedProcess[str]:
    """`seglogfs COMMAND SOURCE TARGET -v | head -1` through a real shell pipe (head prints the
    first line and exits; the command's next write fails), with the command's exit status."""
    return subprocess.run(
        ["bash", "-c", f'"$0" {command} "$1" "$2" -v | head -1; exit "${{PIPESTATUS[0]}}"', SEGLOGFS, source, target],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
        check=False,
    )


def test_a_backup_whose_reader_went_away_exits_non_zero_and_is_incomplete(data: Path, tmp_path: Path) -> None:
    backup = tmp_path / "backup"
    piped = into_head("backup", data, backup)
    assert piped.returncode == 1, piped.stdout + piped.stderr
    assert piped.stdout.startswith("sent ") and piped.stdout.count("\n") == 1, piped.stdout
    assert "Traceback" not in piped.stderr and "Broken pipe" not in piped.stderr, piped.stderr
    assert manifest(backup)["complete"] is False
    assert not leftovers(backup)  # (the file being sent when the pipe closed is not kept)
    assert_said_incomplete(backup, data)
    assert_completed_by_the_next_backup(backup, data)


@pytest.mark.parametrize(
    ("how", "code"), [(signal.SIGKILL, -signal.SIGKILL), (signal.SIGTERM, 143), (signal.SIGINT, 130)]
)
def test_a_backup_killed_mid_way_is_incomplete_until_the_next_one(
    data: Path, tmp_path: Path, how: signal.Signals, code: int
) -> None:
    """The backup writes `-v` lines into a pipe of one page that is read once: it is mid-way
    (it has sent a file, and it cannot end before its lines are read) when the signal comes."""
    backup = tmp_path / "backup"
    read_end, write_end = os.pipe()
    fcntl.fcntl(write_end, fcntl.F_SETPIPE_SZ, 4096)
    process = subprocess.Popen(
        [*AS_FOREGROUND, SEGLOGFS, "backup", str(data), str(backup), "-v"],
        stdout=write_end,
        stderr=subprocess.PIPE,
        cwd=REPO,
    )
    os.close(write_end)
    try:
        with os.fdopen(read_end, "rb") as lines:
            assert lines.readline().startswith(b"sent ")
            process.send_signal(how)
            assert process.wait(timeout=60) == code
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.stderr is not None
    said = process.stderr.read().decode()
    process.stderr.close()
    if how != signal.SIGKILL:  # (a signal it can handle: one line, and the files it had staged removed)
        assert said == (
            f"seglogfs: {backup}: the backup was interrupted: the backup did not complete ({backup} is marked "
            f"incomplete until a backup into it completes)\n"
        )
        assert not leftovers(backup)
    assert manifest(backup)["complete"] is False
    assert_said_incomplete(backup, data)
    # What a kill -9 can leave (a staged copy not yet renamed into place) goes with the next backup.
    (backup / f".replication-offset-checkpoint.{process.pid}.seglogfs-tmp").write_text("0\n")
    assert_completed_by_the_next_backup(backup, data)


def test_a_restore_whose_reader_went_away_exits_non_zero(data: Path, tmp_path: Path) -> None:
    backup, restored = tmp_path / "backup", tmp_path / "restored"
    run("backup", str(data), str(backup))
    piped = into_head("restore", backup, restored)
    assert piped.returncode == 1, piped.stdout + piped.stderr
    assert "Traceback" not in piped.stderr and "Broken pipe" not in piped.stderr, piped.stderr


def test_the_log_dirs_of_an_incomplete_backup_of_several_say_so(tmp_path: Path) -> None:
    """A backup of two log dirs holds them as B/0 and B/1; `check B/0,B/1` reads the manifest
    in B."""
    first, second, backup = tmp_path / "d0", tmp_path / "d1", tmp_path / "backup"
    run("topics", "create", f"{first},{second}", "--topic", "t", "--partitions", "2")
    run("backup", f"{first},{second}", str(backup))
    assert run("check", f"{backup / '0'},{backup / '1'}").stdout.rstrip().endswith(": clean")
    (backup / MANIFEST).write_text(json.dumps({**manifest(backup), "complete": False}))  # as a cut-short run leaves it
    checked = run("check", f"{backup / '0'},{backup / '1'}", code=4)
    assert checked.stderr.startswith(f"seglogfs: {backup}: an incomplete backup: "), checked.stderr
    assert checked.stderr.rstrip().endswith(f"seglogfs backup {first},{second} {backup} completes it"), checked.stderr
