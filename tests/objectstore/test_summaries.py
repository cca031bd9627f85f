"""What a backup's summaries of its segments save a reader of the bucket: opening the copy
(each partition's log end), finding offsets by time through the indexes, and a read_committed
look at a partition without transactions fetch no segment bytes; a partition with a transaction
has only the segments that hold it fetched, and its last stable offset is the data dir's. The
active segment's summary follows it as it grows across runs; a catalogue without summaries (an
older seglogfs's) is read by scanning, with the same answers."""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
import time
from pathlib import Path

import pytest

from seglogfs.engine import BrokerConfig, DataDir
from seglogfs.engine.fetched_files import BUDGET
from seglogfs.engine.log.transactions import TransactionTracker
from seglogfs.engine.object_store import ObjectStoreError, open_object_store
from seglogfs.engine.stored.catalogue import CATALOGUE_MAX_BYTES, catalogue_key, catalogue_runs
from seglogfs.engine.stored.local_copy import LocalCopy, Partitions
from seglogfs.pipeline.options import parse_read_options
from seglogfs.pipeline.reading import ReadSpec, read_slice
from tests.cli.support import one_error_line
from tests.conftest import REPO
from tests.engine.test_segment_summary import T0, scanned, transactional_log
from tests.objectstore.conftest import S3
from tests.objectstore.test_backup import produce, run


def record_times(data: Path) -> list[int]:
    """Timestamps to look offsets up by: every 97th record's, and one past the last."""
    config = BrokerConfig.load(None, [], log_dirs=[data])
    with DataDir.open(config, read_only=True, now_ms=int(time.time() * 1000)) as data_dir:
        stamps = [
            record.timestamp
            for topic, partitions in data_dir.topics().items()
            for partition in partitions
            for record in data_dir.partition(topic, partition).records(0)
        ]
    return sorted({*stamps[::97], max(stamps) + 1, T0})


def answers(log_dirs: list[Path], times: list[int]) -> dict[str, object]:
    """What planning asks of each partition: its log end, lower bounds of offsets by time from
    the indexes, and its last stable offset."""
    config = BrokerConfig.load(None, [], log_dirs=log_dirs)
    out: dict[str, object] = {}
    with DataDir.open(config, read_only=True, now_ms=int(time.time() * 1000)) as data_dir:
        for topic, partitions in sorted(data_dir.topics().items()):
            for partition in partitions:
                log = data_dir.partition(topic, partition)
                out[f"{topic}-{partition}"] = {
                    "end": log.log_end_offset,
                    "bounds": [log.offset_for_timestamp_bound(t) for t in times],
                    "stable": TransactionTracker().catch_up(log),
                }
    return out


def test_opening_a_backups_copy_and_planning_on_it_fetch_no_segment_bytes(s3: S3, tmp_path: Path) -> None:
    data = tmp_path / "data"
    produce(data, "plain", [f"{n:06d} " + "v" * 300 for n in range(20_000)], "--override", "log.segment.bytes=1048576")
    run("backup", data, s3.uri())
    assert len(list(data.glob("plain-0/*.log"))) >= 5
    times = record_times(data)
    before = BUDGET.fetched_bytes
    with LocalCopy.open(s3.uri()) as copy:
        stored = answers(copy.log_dirs, times)
        assert BUDGET.fetched_bytes == before, f"{BUDGET.fetched_bytes - before} segment bytes fetched"
    assert stored == answers([data], times)
    assert stored["plain-0"]["end"] == 20_000  # type: ignore[index]


def test_a_read_committed_look_fetches_only_the_segments_that_hold_a_transaction(s3: S3, tmp_path: Path) -> None:
    partition = transactional_log(tmp_path / "data")
    run("backup", partition.parent, s3.uri())
    with_transactions = [p for p in sorted(partition.glob("*.log")) if scanned(p).transactional]
    assert 0 < len(with_transactions) < len(list(partition.glob("*.log"))) / 2
    before = BUDGET.fetched_bytes
    with LocalCopy.open(s3.uri()) as copy:
        config = BrokerConfig.load(None, [], log_dirs=copy.log_dirs)
        with DataDir.open(config, read_only=True, now_ms=T0) as data_dir:
            tracker = TransactionTracker()
            stable = tracker.catch_up(data_dir.partition("t", 0))
        fetched = BUDGET.fetched_bytes - before
    assert fetched <= sum(p.stat().st_size for p in with_transactions) + (64 << 10), fetched
    local = TransactionTracker()
    config = BrokerConfig.load(None, [], log_dirs=[partition.parent])
    with DataDir.open(config, read_only=True, now_ms=T0) as data_dir:
        assert stable == local.catch_up(data_dir.partition("t", 0))
    assert tracker.aborted == local.aborted and len(local.aborted) == 1


def test_the_active_segments_summary_follows_it_across_runs(s3: S3, tmp_path: Path) -> None:
    data = tmp_path / "data"
    store = open_object_store(s3.uri())
    for round_ in range(3):
        produce(data, "grow", [f"{round_}-{n}" for n in range(500)])
        run("backup", data, s3.uri())
        catalogue = json.loads(store.read_whole(catalogue_key(catalogue_runs(store)[-1]), CATALOGUE_MAX_BYTES))
        for path, entry in catalogue["files"].items():
            if path.endswith(".log"):
                local = data / path
                expected = scanned(local)
                assert entry["size"] == expected.size and len(entry["pieces"]) == round_ + 1
                assert entry["segment"] == {
                    "nextOffset": expected.next_offset,
                    "maxTimestamp": expected.max_timestamp,
                    "maxTimestampOffset": expected.max_timestamp_offset,
                    "transactional": False,
                }
    times = record_times(data)
    with LocalCopy.open(s3.uri()) as copy:
        assert answers(copy.log_dirs, times) == answers([data], times)


def test_a_catalogue_without_summaries_is_read_by_scanning(s3: S3, tmp_path: Path) -> None:
    data = tmp_path / "data"
    produce(data, "old", [f"{n}" for n in range(3000)], "--override", "log.segment.bytes=8192")
    run("backup", data, s3.uri())
    store = open_object_store(s3.uri())
    key = catalogue_key(catalogue_runs(store)[-1])
    catalogue = json.loads(store.read_whole(key, CATALOGUE_MAX_BYTES))
    for entry in catalogue["files"].values():
        entry.pop("segment", None)
    store.put(key, json.dumps(catalogue).encode())
    before = BUDGET.fetched_bytes
    times = record_times(data)
    with LocalCopy.open(s3.uri()) as copy:
        assert answers(copy.log_dirs, times) == answers([data], times)
        assert BUDGET.fetched_bytes > before  # (scanned: the tails were fetched)


PLANNER = """
import pickle, sys, time
from seglogfs.pipeline.options import parse_read_options
from seglogfs.pipeline.planning import open_read_only, plan_slices, resolve_ranges
options = parse_read_options({"path": sys.argv[1], "subscribe": "plain"})
with open_read_only(options.location, options.engine, int(time.time() * 1000)) as data_dir:
    ranges = resolve_ranges(data_dir, [("plain", 0)], options.starting, options.ending)
    slices = plan_slices(data_dir, ranges)
    with open(sys.argv[2], "wb") as out:
        pickle.dump(slices, out)
    print("planned", flush=True)
    sys.stdin.read()  # (alive, its copy with it, until the reader is done)
"""


def test_a_task_beside_a_live_planner_on_its_host_reads_the_objects_not_its_placeholders(
    s3: S3, tmp_path: Path
) -> None:
    """Planning fetched none of the segments (their summaries said all it asked), so its
    placeholders, at the paths the slices name, are holes: a task on the same host must read
    the slices' objects, as a task on another host does."""
    data = tmp_path / "data"
    produce(data, "plain", [f"{n:06d} " + "v" * 300 for n in range(8000)], "--override", "log.segment.bytes=1048576")
    run("backup", data, s3.uri())
    planner = subprocess.Popen(
        [sys.executable, "-c", PLANNER, s3.uri(), tmp_path / "slices"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        cwd=REPO,
    )
    try:
        assert planner.stdout is not None and planner.stdout.readline() == b"planned\n"
        slices = pickle.loads((tmp_path / "slices").read_bytes())
        assert len(slices) >= 2 and all(piece.stored for piece in slices)
        assert all(Path(piece.directory).is_dir() for piece in slices)  # (the planner's copy, on this host)
        spec = ReadSpec.of(parse_read_options({"path": s3.uri(), "subscribe": "plain"}))
        values = [
            value for piece in slices for batch in read_slice(piece, spec) for value in batch["value"].to_pylist()
        ]
    finally:
        planner.communicate(b"", timeout=60)
    assert planner.returncode == 0
    assert values == [f"{n:06d} ".encode() + b"v" * 300 for n in range(8000)]


def test_a_summary_that_does_not_fit_its_segment_makes_the_catalogue_unreadable(s3: S3, tmp_path: Path) -> None:
    """A summary stands for the log end: one that cannot be the segment's (an end below its base
    offset) is refused, with one line naming the catalogue, not taken."""
    data = tmp_path / "data"
    produce(data, "t", [f"{n:06d} " + "v" * 300 for n in range(4000)], "--override", "log.segment.bytes=65536")
    run("backup", data, s3.uri())
    store = open_object_store(s3.uri())
    key = catalogue_key(catalogue_runs(store)[-1])
    catalogue = json.loads(store.read_whole(key, CATALOGUE_MAX_BYTES))
    path = max(p for p in catalogue["files"] if p.endswith(".log"))
    assert int(Path(path).stem) > 0
    catalogue["files"][path]["segment"]["nextOffset"] = 1
    store.put(key, json.dumps(catalogue).encode())
    line = one_error_line(run("topics", "describe", s3.uri(), code=1))
    assert key in line and path in line and "does not fit its offsets" in line, line


def test_a_copy_lays_out_and_fetches_only_the_partitions_wanted(
    s3: S3, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A query's copy of a backup (a Spark task's, its planning's) fetches the files of the
    partitions its subscription reads and of no other; wanting more lays those out too, and a
    newer run keeps to what is wanted (a new topic the subscription does not name stays out)."""
    data = tmp_path / "data"
    for topic in ("orders", "payments", "audit"):
        produce(data, topic, [f"{topic}-{n}" for n in range(300)], "--override", "log.segment.bytes=2048")
    run("backup", data, s3.uri())
    fetched: list[str] = []
    original = LocalCopy._fetch_whole
    monkeypatch.setattr(
        LocalCopy, "_fetch_whole", lambda self, path, stored: fetched.append(path) or original(self, path, stored)
    )
    with LocalCopy.open(s3.uri(), Partitions(topics=frozenset({"orders"}))) as copy:
        assert sorted(p.name for p in copy.directory.iterdir() if p.is_dir()) == ["orders-0"]
        assert fetched and all("/" not in path or path.startswith("orders-0/") for path in fetched), fetched
        config = BrokerConfig.load(None, [], log_dirs=copy.log_dirs)
        with DataDir.open(config, read_only=True, now_ms=T0) as data_dir:
            assert data_dir.topics() == {"orders": [0]}
            assert [r.value for r in data_dir.partition("orders", 0).records(0)] == [
                f"orders-{n}".encode() for n in range(300)
            ]
        fetched.clear()
        copy.want(Partitions(patterns=frozenset({"^pay"})))
        assert fetched and all(path.startswith("payments-0/") for path in fetched), fetched
        copy.want(Partitions(topics=frozenset({"orders"})))  # (had already: nothing fetched)
        fetched.clear()
        produce(data, "refunds", ["r"])
        produce(data, "payments", ["more"])
        run("backup", data, s3.uri())
        assert copy.refresh()
        assert sorted(p.name for p in copy.directory.iterdir() if p.is_dir()) == ["orders-0", "payments-0"]
        assert not any(path.startswith(("refunds-0/", "audit-0/")) for path in fetched), fetched
        with DataDir.open(config, read_only=True, now_ms=T0) as data_dir:
            assert data_dir.partition("payments", 0).log_end_offset == 301


def test_a_want_the_store_failed_is_fetched_again_by_the_next(
    s3: S3, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = tmp_path / "data"
    for topic in ("orders", "payments"):
        produce(data, topic, [f"{topic}-{n}" for n in range(100)], "--override", "log.segment.bytes=1024")
    run("backup", data, s3.uri())
    with LocalCopy.open(s3.uri(), Partitions(topics=frozenset({"orders"}))) as copy:
        original = LocalCopy._fetch_whole

        def failing(self: LocalCopy, path: str, stored: object) -> None:
            if path.endswith(".timeindex"):
                raise ObjectStoreError(f"{path}: the store failed")
            original(self, path, stored)  # type: ignore[arg-type]

        monkeypatch.setattr(LocalCopy, "_fetch_whole", failing)
        payments = Partitions(topics=frozenset({"payments"}))
        with pytest.raises(ObjectStoreError):
            copy.want(payments)
        monkeypatch.setattr(LocalCopy, "_fetch_whole", original)
        copy.want(payments)
        config = BrokerConfig.load(None, [], log_dirs=copy.log_dirs)
        with DataDir.open(config, read_only=True, now_ms=T0) as data_dir:
            assert [r.value for r in data_dir.partition("payments", 0).records(0)] == [
                f"payments-{n}".encode() for n in range(100)
            ]
        local = sorted(p.name for p in (data / "payments-0").iterdir())
        assert sorted(p.name for p in (copy.directory / "payments-0").iterdir()) == local
