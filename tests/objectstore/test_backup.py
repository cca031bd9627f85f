"""`seglogfs backup SRC s3://…` and `seglogfs restore s3://… DATADIR` against a real S3 server
(s3proxy on loopback): a restore from the bucket is what a local backup of the same moment is,
file for file (bytes, modes, mtimes); later runs upload only what changed; a run cut short
(kill -9, a stalled server) leaves the last complete run readable, and the next completes; no
secret is ever printed."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import signal
import stat
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cli.support import SEGLOGFS, one_error_line
from tests.conftest import AS_FOREGROUND, REPO, copy_fixture, kafka_fixtures
from tests.fs.test_backup_restore import SMALL_SEGMENTS, Writer, records, stats
from tests.objectstore.conftest import CREDENTIAL, S3

CATALOGUES = ".seglogfs-backup/"


def run(*args: object, code: int = 0, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [SEGLOGFS, *map(str, args)], cwd=REPO, capture_output=True, text=True, timeout=timeout, check=False
    )
    assert done.returncode == code, f"seglogfs {' '.join(map(str, args))} exited {done.returncode}:\n{done.stderr}"
    assert CREDENTIAL not in done.stdout + done.stderr
    return done


def produce(data: Path | str, topic: str, lines: list[str], *args: str) -> None:
    done = subprocess.run(
        [SEGLOGFS, "produce", str(data), "--topic", topic, *args],
        input="".join(line + "\n" for line in lines).encode(),
        capture_output=True,
        cwd=REPO,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr.decode()


def tree(directory: Path) -> dict[str, tuple[bytes, int, int]]:
    """Every file below `directory`: its bytes, mode and mtime (the backup's own files aside)."""
    out = {}
    for path in sorted(directory.rglob("*")):
        name = str(path.relative_to(directory))
        if path.is_file() and name not in (".lock", ".seglogfs-backup.json"):
            status = path.stat()
            out[name] = (path.read_bytes(), stat.S_IMODE(status.st_mode), status.st_mtime_ns)
    return out


def catalogues(s3: S3, prefix: str = "backup") -> list[str]:
    """The keys of the backup's catalogues (one a complete run kept), oldest first."""
    return sorted(key for key in s3.objects(f"{prefix}/{CATALOGUES}") if re.search(r"/\d{20}\.json$", key))


def catalogue(s3: S3, prefix: str = "backup") -> dict[str, object]:
    """The newest catalogue of the backup, as the server keeps it."""
    names = catalogues(s3, prefix)
    assert names, "no catalogue in the bucket"
    return json.loads((s3.server.data / s3.bucket / names[-1]).read_text())


@contextlib.contextmanager
def backup_under_way(data: Path, uri: str, *, held: bool = False) -> Iterator[subprocess.Popen[str]]:
    """`seglogfs backup DATA URI -v`, one upload at a time (SIGINT at its default, as in a shell's
    foreground, whatever the suite was started from), from the moment it has sent a file
    (its first line read): the test ends it as it will; after the block it is killed if it still
    runs, and its pipes are closed. `held`: its lines go into a pipe of one page, read no further
    than that first line, so that a run with more to say is held mid-way until it is ended."""
    read_end, write_end = os.pipe()
    if held:
        fcntl.fcntl(write_end, fcntl.F_SETPIPE_SZ, 4096)
    process = subprocess.Popen(
        [*AS_FOREGROUND, SEGLOGFS, "backup", str(data), uri, "-v", "--uploads", "1"],
        stdout=write_end,
        stderr=subprocess.PIPE,
        cwd=REPO,
        text=True,
    )
    os.close(write_end)
    lines = os.fdopen(read_end, "r")
    process.stdout = lines
    try:
        assert process.stderr is not None
        first = lines.readline()
        assert first.startswith("sent "), first or process.stderr.read()
        yield process
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        for stream in (lines, process.stderr):
            if stream is not None:
                stream.close()


def test_a_restore_from_the_bucket_is_the_local_backup_of_a_broker_dir(s3: S3, tmp_path: Path) -> None:
    """A broker's data dir: the objects keep Kafka's layout, a restore holds what a local backup
    holds (bytes, modes, mtimes) and passes `check`, and a second run sends nothing."""
    source = kafka_fixtures() / "flink-on-prem-cp760"
    first = run("backup", source, s3.uri(), "--stats")
    assert stats(first)["files skipped"] == 0
    objects = s3.objects("backup/")
    assert "backup/meta.properties" in objects
    assert "backup/orders-0/00000000000000000000.log" in objects
    assert "backup/__cluster_metadata-0/00000000000000000000.log" in objects
    assert catalogues(s3) == [f"backup/{CATALOGUES}00000000000000000001.json"]
    again = stats(run("backup", source, s3.uri(), "--stats"))
    assert (
        again["files sent"] == 0 and again["bytes sent"] == 0 and again["files skipped"] == stats(first)["files sent"]
    )
    run("backup", source, tmp_path / "local")
    run("restore", s3.uri(), tmp_path / "restored")
    assert tree(tmp_path / "restored") == tree(tmp_path / "local")
    assert run("check", tmp_path / "restored").stdout.rstrip().endswith(": clean")
    # The objects a run no longer names go once the run after it completes (retention's
    # deletions carried over); a reader of the run before keeps what it reads meanwhile.
    assert len(catalogues(s3)) == 2


def test_backups_of_a_data_dir_being_written_upload_what_grew(s3: S3, tmp_path: Path) -> None:
    """While `produce` writes (small segments: rolls and growth between runs), each run's restore
    holds whole batches, as many records as were visible at some moment of the run, in order;
    a grown active segment is sent as its new bytes only (a piece), and the segments retention
    removed leave the bucket."""
    writer = Writer(tmp_path / "data")
    try:
        writer.send(200)
        writer.wait_visible()
        restored_counts = []
        appended = 0
        for round_ in range(3):
            with writer.writing():
                done = run("backup", writer.data, s3.uri(), "--stats", "-v")
            appended += sum(line.startswith("appended ") for line in done.stdout.splitlines())
            target = tmp_path / f"restored-{round_}"
            run("restore", s3.uri(), target)
            got = records(target)[("t", 0)]
            assert [r.value for r in got] == [b"record-%06d %s" % (n, b"x" * (n % 50)) for n in range(len(got))], (
                "a restore holds the records in order, none missing"
            )
            restored_counts.append(len(got))
            writer.send(7)  # (the active segment grows past what the run stored)
            writer.wait_visible()
        assert restored_counts == sorted(restored_counts) and restored_counts[0] >= 200
        assert appended, "no grown segment was sent as its new bytes only"
    finally:
        writer.close()
    # Retention removes the oldest segments; the second run after it no longer keeps them.
    run("topics", writer.data, "alter", "--topic", "t", "--config", "retention.bytes=20000")
    run("clean", writer.data)
    left = {path.name for path in (writer.data / "t-0").glob("*.log")}
    for _ in range(2):
        run("backup", writer.data, s3.uri())
    stored_logs = {key.rsplit("/", 1)[1].split("~")[0] for key in s3.objects("backup/t-0/") if ".log" in key}
    assert stored_logs == left
    run("restore", s3.uri(), tmp_path / "final")
    assert records(tmp_path / "final") == records(writer.data)


def test_a_compacted_segment_goes_to_a_new_key_and_the_old_run_stays_readable(s3: S3, tmp_path: Path) -> None:
    """Compaction rewrites a segment under its name: the run after uploads it to a new key (the
    object the last run's catalogue names is never changed), and both runs restore."""
    data = tmp_path / "data"
    run(
        "topics", data, "create", "--topic", "c", "--config", "cleanup.policy=compact", "--config", "segment.bytes=2000"
    )
    keyed = ("--property", "parse.key=true", "--property", "key.separator=:")
    for start in range(0, 400, 100):  # (one batch a run: several segments)
        produce(data, "c", [f"k{i % 5}:v{i}" for i in range(start, start + 100)], *keyed)
    assert len(list((data / "c-0").glob("*.log"))) > 1
    run("backup", data, s3.uri())
    before = catalogue(s3)
    run("backup", data, tmp_path / "local-before")
    run("clean", data)
    run("backup", data, s3.uri())
    after = catalogue(s3)
    changed = [
        path
        for path, entry in after["files"].items()  # type: ignore[attr-defined]
        if path.endswith(".log") and path in before["files"] and entry != before["files"][path]  # type: ignore[index]
    ]
    assert changed, "compaction changed no stored segment"
    for path in changed:
        old_keys = {key for key, _ in before["files"][path]["pieces"]}  # type: ignore[index]
        new_keys = {key for key, _ in after["files"][path]["pieces"]}  # type: ignore[index]
        assert not old_keys & new_keys, f"{path}: the new copy was written over the old run's object"
        assert all("~2" in key for key in new_keys)
    # The run before is whole in the bucket still: its catalogue's objects, byte for byte.
    for path, entry in before["files"].items():  # type: ignore[attr-defined]
        stored = b"".join((s3.server.data / s3.bucket / "backup" / key).read_bytes() for key, _ in entry["pieces"])
        assert stored == (tmp_path / "local-before" / path).read_bytes(), path
    run("restore", s3.uri(), tmp_path / "restored")
    assert records(tmp_path / "restored") == records(data)


def test_a_backup_killed_mid_upload_leaves_the_last_complete_one_and_the_next_completes(s3: S3, tmp_path: Path) -> None:
    """kill -9 while files are being uploaded: restore still gives the last complete run, and the
    next run completes the backup and removes what the killed one left."""
    data = tmp_path / "data"
    produce(data, "t", [f"record-{n}" for n in range(300)], *SMALL_SEGMENTS)
    run("backup", data, s3.uri())
    run("backup", data, tmp_path / "local-first")
    # More data, much of it (the upload takes a while), then a run killed once it has sent a file.
    big = os.urandom(1 << 20).hex()
    for topic in ("big-a", "big-b"):
        run("topics", data, "create", "--topic", topic, "--config", "max.message.bytes=4000000")
        produce(data, topic, [big[i : i + 900_000] for i in range(0, len(big), 900_000)] * 8)
    with backup_under_way(data, s3.uri()) as process:
        process.kill()
        process.wait(timeout=30)
    assert len(catalogues(s3)) == 1
    run("restore", s3.uri(), tmp_path / "restored-first")
    assert tree(tmp_path / "restored-first") == tree(tmp_path / "local-first")
    done = run("backup", data, s3.uri(), "--stats")
    assert stats(done)["files sent"] > 0
    run("restore", s3.uri(), tmp_path / "restored")
    assert records(tmp_path / "restored") == records(data)
    named = {key for entry in catalogue(s3)["files"].values() for key, _ in entry["pieces"]}  # type: ignore[attr-defined]
    first_run = {
        key
        for entry in json.loads(
            (s3.server.data / s3.bucket / "backup" / CATALOGUES / "00000000000000000001.json").read_text()
        )["files"].values()
        for key, _ in entry["pieces"]
    }
    stray = (
        {key.removeprefix("backup/") for key in s3.objects("backup/") if not key.startswith("backup/" + CATALOGUES)}
        - named
        - first_run
    )
    assert not stray, f"objects no catalogue names were left: {sorted(stray)[:5]}"


def test_a_stalled_server_fails_the_run_naming_the_object_and_the_next_run_completes(s3: S3, tmp_path: Path) -> None:
    """The server stops answering mid-run (SIGSTOP): the run gives up after the URI's request
    timeout with one line naming the object, the last complete run stays, and once the server
    answers again the next run completes."""
    data = copy_fixture("flink-on-prem-cp760", tmp_path)
    # (and 500 files more: the run has seconds of uploads left when the server stops)
    run("topics", data, "create", "--topic", "many", "--partitions", "100")
    uri = s3.uri() + "?request_timeout=1&connect_timeout=1&retries=0"
    try:
        with backup_under_way(data, uri) as process:
            s3.server.pause()
            started = time.monotonic()
            code = process.wait(timeout=60)
            waited = time.monotonic() - started
            said = process.stderr.read()  # type: ignore[union-attr]
    finally:
        s3.server.resume()
    assert code == 1, said
    line = said.strip().splitlines()[-1]
    assert line.startswith(f"seglogfs: {s3.uri()}/"), line
    assert "still shows the last complete backup" in line and CREDENTIAL not in said
    assert waited < 30
    assert not catalogues(s3)
    restore_refused = run("restore", s3.uri(), tmp_path / "nothing", code=1)
    assert "holds no complete seglogfs backup" in one_error_line(restore_refused)
    run("backup", data, s3.uri())
    run("restore", s3.uri(), tmp_path / "restored")
    assert records(tmp_path / "restored") == records(data)


def test_refusals_are_one_line_and_never_print_a_secret(
    s3: S3, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = copy_fixture("flink-on-prem-cp760", tmp_path)
    assert "unknown option 'bogus'" in one_error_line(run("backup", data, s3.uri() + "?bogus=1", code=2))
    assert "retries='x' is not a number" in one_error_line(
        run("restore", s3.uri() + "?retries=x", tmp_path / "r", code=2)
    )
    # A prefix holding other objects is not taken for a backup.
    (s3.server.data / s3.bucket / "other").mkdir()
    (s3.server.data / s3.bucket / "other" / "file").write_text("not ours")
    assert "is no seglogfs backup" in one_error_line(run("backup", data, s3.uri("other"), code=2))
    assert "holds no complete seglogfs backup" in one_error_line(run("restore", s3.uri("none"), tmp_path / "r", code=1))
    # Wrong keys: the store's refusal, naming the place, never the keys.
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wrong-" + CREDENTIAL)
    refused = run("backup", data, s3.uri(), code=1)
    assert one_error_line(refused).startswith(f"seglogfs: {s3.uri()}")
    assert "wrong-" not in refused.stderr
    # Keys in the URI are taken, and not shown either.
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    identity = s3.server.env()["AWS_ACCESS_KEY_ID"]
    run("backup", data, f"s3://{identity}:{CREDENTIAL}@{s3.bucket}/keyed")
    run("backup", data, tmp_path / "local")
    done = run("restore", f"s3://{identity}:{CREDENTIAL}@{s3.bucket}/keyed", tmp_path / "restored", "-v")
    assert tree(tmp_path / "restored") == tree(tmp_path / "local")
    assert CREDENTIAL not in done.stdout


def test_several_log_dirs_and_a_mount_point_back_up_and_restore(s3: S3, mount, tmp_path: Path) -> None:
    """Log dirs `A,B` are stored as `0/` and `1/` and restore to as many dirs; a mount point as
    SRC is backed up through its `.logdir`, and holds what a local backup of it holds."""
    first, second = tmp_path / "d0", tmp_path / "d1"
    run("topics", "create", f"{first},{second}", "--topic", "t", "--partitions", "2")
    for partition in (0, 1):
        produce(f"{first},{second}", "t", [f"p{partition}-{n}" for n in range(50)], "--partition", str(partition))
    run("backup", f"{first},{second}", s3.uri("two"))
    assert {key.split("/")[1] for key in s3.objects("two/") if not key.startswith("two/.")} == {"0", "1"}
    refused = run("restore", s3.uri("two"), tmp_path / "one", code=2)
    assert "the backup holds 2 log dirs, DATADIR names 1" in one_error_line(refused)
    run("restore", s3.uri("two"), f"{tmp_path / 'r0'},{tmp_path / 'r1'}")
    assert run("check", f"{tmp_path / 'r0'},{tmp_path / 'r1'}").stdout.rstrip().endswith(": clean")
    both = f"{tmp_path / 'r0'},{tmp_path / 'r1'}"
    got = run("consume", both, "--topic", "t", "--from-beginning", "--property", "print.partition=true").stdout
    assert sorted(got.splitlines()) == sorted(f"Partition:{p}\tp{p}-{n}" for p in (0, 1) for n in range(50))

    # (A read-only mount shows no write bits: a local backup through it is read-only, and a
    # restore gives the owner write again. Compared: the restores of both.)
    m = mount(first, "-o", "ro")
    run("backup", m.path, s3.uri("mounted"), "--stats")
    run("backup", m.path, tmp_path / "local")
    run("restore", tmp_path / "local", tmp_path / "restored-local")
    run("restore", s3.uri("mounted"), tmp_path / "restored")
    assert tree(tmp_path / "restored") == tree(tmp_path / "restored-local")


@pytest.mark.parametrize(("how", "code"), [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_backup_stopped_by_a_signal_says_so_and_shows_the_last_complete_one(
    s3: S3, tmp_path: Path, how: signal.Signals, code: int
) -> None:
    data = copy_fixture("flink-on-prem-cp760", tmp_path)
    run("backup", data, s3.uri())
    # New: a topic of 100 partitions (500 files sent, their lines far more than the pipe holds).
    run("topics", data, "create", "--topic", "new", "--partitions", "100")
    with backup_under_way(data, s3.uri(), held=True) as process:
        process.send_signal(how)
        assert process.wait(timeout=60) == code
        said = process.stderr.read()  # type: ignore[union-attr]
    assert said == (
        f"seglogfs: {s3.uri()}: the backup was interrupted: the backup did not complete "
        f"({s3.uri()} still shows the last complete backup)\n"
    )
    assert len(catalogues(s3)) == 1


def test_a_backup_whose_reader_went_away_exits_non_zero_and_writes_no_catalogue(s3: S3, tmp_path: Path) -> None:
    data = copy_fixture("flink-on-prem-cp760", tmp_path)
    done = subprocess.run(
        f"{SEGLOGFS} backup {data} {s3.uri()} -v --uploads 1 | head -1",
        shell=True,
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
        check=False,
        executable="/bin/bash",
    )
    assert done.stdout.startswith("sent ") and done.stderr == ""
    assert not catalogues(s3)
    run("backup", data, s3.uri())
    assert len(catalogues(s3)) == 1


def test_a_restore_checks_each_file_against_the_catalogue(s3: S3, tmp_path: Path) -> None:
    """An object changed in the store (bit rot, a hand that wrote to the bucket) fails the restore
    with one line naming it; a missing object too."""
    data = copy_fixture("flink-on-prem-cp760", tmp_path)
    run("backup", data, s3.uri())
    stored = s3.server.data / s3.bucket / "backup" / "orders-0" / "00000000000000000000.log"
    content = bytearray(stored.read_bytes())
    content[100] ^= 0xFF
    stored.write_bytes(bytes(content))
    refused = run("restore", s3.uri(), tmp_path / "restored", code=1)
    line = one_error_line(refused)
    assert line.startswith(f"seglogfs: {s3.uri()}/orders-0/00000000000000000000.log: ") and "CRC-32" in line, line
    stored.unlink()
    refused = run("restore", s3.uri(), tmp_path / "restored", "--force", code=1)
    assert f"{s3.uri()}/orders-0/00000000000000000000.log" in one_error_line(refused)


def test_a_hostile_link_in_the_data_dir_is_refused_not_followed(s3: S3, tmp_path: Path) -> None:
    data = copy_fixture("flink-on-prem-cp760", tmp_path)
    secret = tmp_path / "secret"
    secret.write_text("root's secret\n")
    (data / "orders-0" / "00000000000000000099.snapshot").symlink_to(secret)
    done = run("backup", data, s3.uri(), code=1)
    assert "00000000000000000099.snapshot" in done.stderr and "not copied" in done.stderr
    assert not any("00000000000000000099" in key for key in s3.objects())
    assert "root's secret" not in "".join(
        path.read_text(errors="replace") for path in (s3.server.data / s3.bucket).rglob("*") if path.is_file()
    )
    assert catalogue(s3)["refused"]


def test_a_large_file_beside_the_segments_is_streamed_and_kept_when_unchanged(s3: S3, tmp_path: Path) -> None:
    """A KRaft snapshot of megabytes (a file other than a segment's, over the size compared byte
    for byte) is uploaded as a stream, kept by the next run while unchanged, and restores whole."""
    data = copy_fixture("flink-on-prem-cp760", tmp_path)
    snapshot = data / "__cluster_metadata-0" / "00000000000000099999-0000000001.checkpoint"
    snapshot.write_bytes(os.urandom(3 << 20))
    first = run("backup", data, s3.uri(), "-v")
    assert f"sent __cluster_metadata-0/{snapshot.name} ({3 << 20} bytes)" in first.stdout
    again = run("backup", data, s3.uri(), "-v")
    assert snapshot.name not in again.stdout
    run("restore", s3.uri(), tmp_path / "restored")
    assert (tmp_path / "restored" / "__cluster_metadata-0" / snapshot.name).read_bytes() == snapshot.read_bytes()


def test_a_catalogue_naming_objects_outside_its_prefix_is_refused(s3: S3, tmp_path: Path) -> None:
    """A catalogue is read from a store others may write: one whose pieces or paths leave the
    prefix (`..`) is refused in one line, and nothing is read or written for it."""
    data = copy_fixture("flink-on-prem-cp760", tmp_path)
    run("backup", data, s3.uri())
    path = s3.server.data / s3.bucket / "backup" / CATALOGUES / "00000000000000000001.json"
    document = json.loads(path.read_text())
    entry = document["files"]["meta.properties"]
    entry["pieces"] = [["../../elsewhere/secret", entry["size"]]]
    path.write_text(json.dumps(document))
    refused = run("restore", s3.uri(), tmp_path / "restored", code=1)
    assert "unreadable backup catalogue: bad path '../../elsewhere/secret'" in one_error_line(refused)
    entry["pieces"] = [["meta.properties", entry["size"]]]
    document["files"]["../../escaped"] = entry
    path.write_text(json.dumps(document))
    refused = run("restore", s3.uri(), tmp_path / "restored", code=1)
    assert "bad path '../../escaped'" in one_error_line(refused)
    assert not (tmp_path / "escaped").exists() and not (tmp_path / "restored").exists()


def test_what_a_killed_run_uploaded_is_not_sent_again(s3: S3, tmp_path: Path) -> None:
    """kill -9 once a large segment is uploaded: the next run keeps that object (the killed run's
    journal names it, and it is there whole) and sends the rest; the restore is the data dir."""
    data = tmp_path / "data"
    run("topics", data, "create", "--topic", "big", "--partitions", "2", "--config", "max.message.bytes=4000000")
    value = os.urandom(1 << 19).hex()
    for partition in (0, 1):
        produce(data, "big", [value] * 20, "--partition", str(partition))
    with backup_under_way(data, s3.uri()) as process:
        assert process.stdout is not None
        for line in process.stdout:
            if line.startswith("sent big-0/00000000000000000000.log "):
                break
        else:
            raise AssertionError("the backup ended before it sent big-0's segment")
        process.kill()
        process.wait(timeout=30)
    assert not catalogues(s3)
    done = run("backup", data, s3.uri(), "-v", "--stats")
    assert (
        "kept big-0/00000000000000000000.log (20973000 bytes, uploaded by a run that did not complete)" in done.stdout
    )
    assert stats(done)["bytes sent"] < 21_000_000
    run("restore", s3.uri(), tmp_path / "restored")
    assert records(tmp_path / "restored") == records(data)
    assert (
        tree(tmp_path / "restored")["big-0/00000000000000000000.log"][0]
        == (data / "big-0" / "00000000000000000000.log").read_bytes()
    )
