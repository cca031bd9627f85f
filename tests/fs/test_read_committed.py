"""read_committed views: `-o isolation.level=read_committed` and a partition's `read_committed/`
(and `read_uncommitted/`) show what `consume --isolation-level` prints — no records of aborted
transactions, nothing at or past the last stable offset — and grow as transactions end: through
the mount's `append.batches`, and under a read-only mount, by another process. Real mounts,
`cat` and `tail -f`, on the corpus of tests/cli/test_transactions.py (kafka-python's builder,
hand-made markers)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from seglogfs.engine import BrokerConfig, DataDir
from tests.cli.test_transactions import ABORT, COMMIT, Model, build_corpus
from tests.conftest import NOW_MS, REPO
from tests.fs.conftest import Mount

SEGLOGFS = [sys.executable, "-m", "seglogfs.mount_tools.cli"]
# The corpus's timestamps are NOW_MS, long past: a writable mount's retention would delete it.
KEEP = ("-o", "log.retention.ms=-1")
PRINT = ("print.offset", "print.key")  # views and consume alike: offsets show what was skipped


def consume(data: Path, level: str, *extra: str) -> bytes:
    """`seglogfs consume` of partition txn-0 at an isolation level (from the log start unless
    `extra` says where), with the views' text properties."""
    start = () if "--offset" in extra else ("--from-beginning",)
    properties = [x for name in PRINT for x in ("--property", f"{name}=true")]
    arguments = ["--topic", "txn", "--partition", "0", *start, *extra, *properties, "--isolation-level", level]
    done = subprocess.run(
        [*SEGLOGFS, "consume", str(data), *arguments],
        cwd=REPO,
        check=True,
        capture_output=True,
    )
    return done.stdout


def check_views(directory: Path, data: Path, level: str, consumed: dict[tuple[str, ...], bytes]) -> None:
    """Every view of a directory of views equals `consume` at `level` (printed once per data
    dir and arguments: `consumed`): `records`, `records.jsonl`, `by-offset/N[.jsonl]` from
    offsets in and around transactions; and each view's size is what a read gives."""

    def expected(*extra: str) -> bytes:
        if (level, *extra) not in consumed:
            consumed[level, *extra] = consume(data, level, *extra)
        return consumed[level, *extra]

    assert (directory / "records").read_bytes() == expected()
    assert (directory / "records.jsonl").read_bytes() == expected("--format", "jsonl")
    # 3: inside a batch; 4: an aborted transaction's first; 9: its ABORT marker; 15: the open
    # transaction (the last stable offset); 17: the log end.
    for offset in (0, 3, 4, 9, 11, 15, 17):
        by_offset = directory / "by-offset" / str(offset)
        assert by_offset.read_bytes() == expected("--offset", str(offset)), offset
        jsonl = directory / "by-offset" / f"{offset}.jsonl"
        assert jsonl.read_bytes() == expected("--offset", str(offset), "--format", "jsonl"), offset
    for name in ("records", "records.jsonl", "by-offset/4", "by-offset/15.jsonl"):
        assert (directory / name).stat().st_size == len((directory / name).read_bytes()), name


def mount_options(*options: str) -> tuple[str, ...]:
    return ("-o", ",".join((*PRINT, *options)))


def test_views_equal_consume_at_each_isolation_level(mount, tmp_path: Path) -> None:
    """A writable mount and a read-only mount of the same data dir, each with and without the
    mount option: a partition's own views at the mount's level, `read_committed/` and
    `read_uncommitted/` at theirs."""
    data = tmp_path / "data"
    model = build_corpus(data)
    committed = consume(data, "read_committed")
    assert [line.rsplit(b"\t", 1)[1] for line in committed.splitlines()] == model.committed()
    assert consume(data, "read_uncommitted").count(b"\n") == len(model.all_values)

    consumed: dict[tuple[str, ...], bytes] = {}  # (the data dir does not change)
    writable: Mount = mount(data, *KEEP, *mount_options())
    read_only: Mount = mount(data, *mount_options("ro", "isolation.level=read_committed"))
    for m, own in ((writable, "read_uncommitted"), (read_only, "read_committed")):
        partition = m.path / "txn" / "0"
        assert sorted(os.listdir(partition / "read_committed")) == ["by-offset", "by-time", "records", "records.jsonl"]
        check_views(partition, data, own, consumed)
        check_views(partition / "read_committed", data, "read_committed", consumed)
        check_views(partition / "read_uncommitted", data, "read_uncommitted", consumed)
    writable.stop()
    read_only.stop()

    # The other way round: the option on a writable mount, none on a read-only one.
    writable = mount(data, *KEEP, *mount_options("isolation.level=read_committed"))
    read_only = mount(data, *mount_options("ro"))
    check_views(writable.path / "txn" / "0", data, "read_committed", consumed)
    check_views(read_only.path / "txn" / "0", data, "read_uncommitted", consumed)
    check_views(read_only.path / "txn" / "0" / "read_committed", data, "read_committed", consumed)


def wait_for(condition, what: str, timeout: float = 2.0) -> float:
    """Seconds until `condition()` held; fails after `timeout`."""
    start = time.monotonic()
    while not condition():
        assert time.monotonic() - start < timeout, f"not within {timeout} s: {what}"
        time.sleep(0.05)
    return time.monotonic() - start


class Follower:
    """`tail -n +1 -f` of a view, into a file."""

    def __init__(self, view: Path, out: Path) -> None:
        self.view, self.out = view, out
        with open(out, "wb") as sink:
            self.process = subprocess.Popen(["tail", "-n", "+1", "-f", str(view)], stdout=sink)

    def values(self) -> list[bytes]:
        return [line.rsplit(b"\t", 1)[-1] for line in self.out.read_bytes().splitlines()]

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=10)


def follow_transactions(view: Path, data: Path, model: Model, append, tmp_path: Path) -> None:
    """`tail -f` of a read_committed `records` while transactions end (`append(batches)` lands
    them): a commit shows its transaction's records (and what waited behind it) within 2 s, an
    abort never; the size is exact at every step; at the end it equals `consume`."""
    follower = Follower(view, tmp_path / "tail.out")
    try:
        wait_for(lambda: follower.values() == model.committed(), "the records below the last stable offset")

        # An aborted transaction: nothing of it, ever.
        append(model.data([b"p4-g-0", b"p4-g-1"], 4) + model.data([b"p4-g-2"], 4))
        append(model.marker(4, ABORT))
        # The open transaction commits: its records, and those that waited behind it, show.
        append(model.marker(3, COMMIT))
        latency = wait_for(lambda: follower.values()[-3:] == [b"p3-e-0", b"plain-3", b"p1-f-0"], "p3's commit")
        assert latency < 2.0

        # A new transaction holds back the records after it until its marker lands.
        append(model.data([b"p5-h-0"], 5))
        append(model.data([b"plain-5"]))
        time.sleep(1.0)  # several looks of a read-only mount: nothing may show meanwhile
        assert follower.values() == model.committed()
        assert b"plain-5" not in view.read_bytes()
        assert view.stat().st_size == len(view.read_bytes())
        append(model.marker(5, COMMIT))
        wait_for(lambda: follower.values()[-2:] == [b"p5-h-0", b"plain-5"], "p5's commit")

        # An aborted transaction after a committed one, and a record after both.
        append(model.data([b"p6-i-0"], 6) + model.marker(6, ABORT) + model.data([b"plain-6"]))
        wait_for(lambda: follower.values()[-1:] == [b"plain-6"], "plain-6")
        assert follower.values() == model.committed()
        assert not any(value.startswith((b"p4-", b"p6-")) for value in follower.values())
        assert view.stat().st_size == len(view.read_bytes()) == len(follower.out.read_bytes())
        assert view.read_bytes() == consume(data, "read_committed")
        assert (view.parent / "records.jsonl").read_bytes() == consume(data, "read_committed", "--format", "jsonl")
    finally:
        follower.stop()


def test_tail_f_of_a_read_committed_view_as_markers_land_through_the_mount(mount, tmp_path: Path) -> None:
    data = tmp_path / "data"
    model = build_corpus(data)
    m: Mount = mount(data, *KEEP, *mount_options())
    target = m.path / "txn" / "0" / "append.batches"

    def append(batches: bytes) -> None:
        with open(target, "ab") as handle:
            handle.write(batches)

    waiting = m.path / "txn" / "0" / "read_committed" / "by-offset" / "15"  # the open transaction's first
    assert waiting.read_bytes() == b""
    follow_transactions(m.path / "txn" / "0" / "read_committed" / "records", data, model, append, tmp_path)
    assert waiting.read_bytes() == consume(data, "read_committed", "--offset", "15")
    assert waiting.read_bytes().startswith(b"Offset:15\tnull\tp3-e-0\n")
    assert (m.path / "txn" / "0" / "records").read_bytes() == consume(data, "read_uncommitted")


def test_tail_f_under_a_read_only_mount_as_another_process_ends_transactions(mount, tmp_path: Path) -> None:
    data = tmp_path / "data"
    model = build_corpus(data)
    m: Mount = mount(data, *mount_options("ro", "isolation.level=read_committed"))
    with DataDir.open(BrokerConfig.load(log_dirs=[data]), now_ms=NOW_MS) as data_dir:
        log = data_dir.partition("txn", 0)

        def append(batches: bytes) -> None:
            log.append_batches(batches, assign_offsets=True, now_ms=NOW_MS)

        follow_transactions(m.path / "txn" / "0" / "records", data, model, append, tmp_path)
    assert (m.path / "txn" / "0" / "read_uncommitted" / "records").read_bytes() == consume(data, "read_uncommitted")


def test_a_bad_isolation_level_is_refused_in_one_line(tmp_path: Path) -> None:
    (tmp_path / "mnt").mkdir()
    command = [*SEGLOGFS, "mount", str(tmp_path / "data"), str(tmp_path / "mnt"), "-f"]
    done = subprocess.run(
        [*command, "-o", "isolation.level=serializable"], cwd=REPO, capture_output=True, timeout=60, check=False
    )
    lines = done.stderr.decode().strip().splitlines()
    assert done.returncode == 1 and len(lines) == 1, done
    assert "-o isolation.level=serializable" in lines[0] and "read_committed" in lines[0], lines
    assert not os.path.ismount(tmp_path / "mnt")


def test_status_shows_what_read_committed_views_go_by(mount, tmp_path: Path) -> None:
    """Once a read_committed view has been looked at, the partition's `status` shows its last
    stable offset, the transactions still open and how many were aborted; it moves when the
    open transaction commits."""
    data = tmp_path / "data"
    model: Model = build_corpus(data)
    m: Mount = mount(data, *KEEP)
    status = m.path / "txn" / "0" / "status"
    assert "readCommitted" not in json.loads(status.read_bytes())  # no read_committed view used yet
    (m.path / "txn" / "0" / "read_committed" / "records").read_bytes()
    state = json.loads(status.read_bytes())["readCommitted"]
    assert state == {
        "lastStableOffset": 15,
        "openTransactions": [{"producerId": 3, "firstOffset": 15}],
        "abortedTransactions": 2,
    }
    with open(m.path / "txn" / "0" / "append.batches", "ab") as append:
        append.write(model.marker(3, COMMIT))
    (m.path / "txn" / "0" / "read_committed" / "records").read_bytes()
    state = json.loads(status.read_bytes())["readCommitted"]
    assert state == {"lastStableOffset": model.next_offset, "openTransactions": [], "abortedTransactions": 2}
