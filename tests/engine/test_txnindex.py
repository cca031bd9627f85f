"""The transaction index (`.txnindex`) as Kafka writes it: an entry (producer, first offset,
ABORT marker's offset, last stable offset) per aborted transaction, in the segment that holds
the marker, written as the marker is appended, and kept through retention, truncation,
compaction, a kill -9 and recovery.

The corpora are built with kafka-python's record builder and hand-made markers (the builders of
tests/cli/test_transactions.py). The expected entries come from a model of the events appended
(`expected_entries`), independent of the engine's tracker: a transaction begins at its producer's
first data batch after its previous marker; the last stable offset is the first offset of the
earliest transaction of another producer still open, else the marker's offset + 1.
"""

from __future__ import annotations

import os
import random
import re
import signal
import struct
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from kafka.record.default_records import DefaultRecordBatchBuilder

from seglogfs.engine import DataDir
from seglogfs.engine.check import check_log_dirs
from seglogfs.engine.errors import CorruptRecordError
from seglogfs.engine.log.log import PartitionLog
from seglogfs.engine.log.segment import LogSegment
from seglogfs.engine.log.transaction_index import AbortedTxn, TransactionIndexBuilder, read_transaction_index
from tests.cli.support import run
from tests.cli.test_transactions import ABORT, COMMIT, control_batch, data_batch
from tests.conftest import NOW_MS, REPO, broker_config

TOPIC = "txn"


@dataclass(frozen=True)
class Event:
    """One batch of a corpus: plain data (producer -1), transactional data, or a marker."""

    producer_id: int
    kind: str  # "data", "abort" or "commit"
    count: int  # offsets it takes
    keys: tuple[bytes, ...] = ()

    def batch(self) -> bytes:
        if self.kind == "abort":
            return control_batch(self.producer_id, ABORT)
        if self.kind == "commit":
            return control_batch(self.producer_id, COMMIT)
        if self.keys:
            return keyed_batch(self.keys, self.producer_id)
        return data_batch([b"v%d" % i for i in range(self.count)], self.producer_id)


def keyed_batch(keys: tuple[bytes, ...], producer_id: int = -1) -> bytes:
    """A batch of keyed records (a compacted topic refuses records without a key)."""
    builder = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=0,
        is_transactional=producer_id >= 0,
        producer_id=producer_id,
        producer_epoch=0 if producer_id >= 0 else -1,
        base_sequence=0 if producer_id >= 0 else -1,
        batch_size=1 << 20,
    )
    for i, key in enumerate(keys):
        builder.append(i, timestamp=NOW_MS + i, key=key, value=b"value-of-" + key, headers=[])
    return bytes(builder.build())


def random_corpus(seed: int, batches: int, *, keyed: bool = False) -> list[Event]:
    """Producers 1..4 interleaved with plain data: transactions that span several batches,
    commits, aborts, markers of producers with no open transaction."""
    rng = random.Random(seed)
    events = []
    for _ in range(batches):
        producer = rng.choice([-1, 1, 2, 3, 4])
        roll = rng.random()
        if producer >= 0 and roll < 0.25:
            events.append(Event(producer, "abort" if rng.random() < 0.6 else "commit", 1))
            continue
        count = rng.randint(1, 5)
        keys = tuple(b"k%d" % rng.randrange(8) for _ in range(count)) if keyed else ()
        events.append(Event(producer, "data", count, keys))
    return events


def with_offsets(events: list[Event], start: int = 0) -> list[tuple[int, Event]]:
    """(base offset, event) as the log assigns offsets: one after another from `start`."""
    placed, offset = [], start
    for event in events:
        placed.append((offset, event))
        offset += event.count
    return placed


def expected_entries(placed: list[tuple[int, Event]]) -> list[AbortedTxn]:
    """The model: every aborted non-empty transaction's entry, in marker order."""
    first_open: dict[int, int] = {}
    entries = []
    for offset, event in placed:
        if event.producer_id < 0:
            continue
        if event.kind == "data":
            first_open.setdefault(event.producer_id, offset)
            continue
        first = first_open.pop(event.producer_id, None)
        if event.kind == "abort" and first is not None:
            stable = min(first_open.values(), default=offset + 1)
            entries.append(AbortedTxn(0, event.producer_id, first, offset, stable))
    return entries


def written_entries(partition_dir: Path) -> dict[int, list[AbortedTxn]]:
    """Base offset → entries of every `.txnindex` in the partition dir."""
    return {
        int(path.name.split(".")[0]): read_transaction_index(path) for path in sorted(partition_dir.glob("*.txnindex"))
    }


def by_segment(entries: list[AbortedTxn], bases: list[int]) -> dict[int, list[AbortedTxn]]:
    """The model's entries filed under the segment that holds each marker."""
    filed: dict[int, list[AbortedTxn]] = {}
    for entry in entries:
        base = max(b for b in bases if b <= entry.last_offset)
        filed.setdefault(base, []).append(entry)
    return filed


def rebuilt_from_log(partition_dir: Path) -> list[AbortedTxn]:
    """The entries a read of the log alone gives (engine.log.transaction_index's builder)."""
    builder = TransactionIndexBuilder()
    entries = []
    for base in segment_bases(partition_dir):
        segment = LogSegment(
            partition_dir, base, index_interval_bytes=4096, max_index_bytes=1 << 20, writable=False, created_ms=0
        )
        for header, batch in segment.iter_batches(0):
            marker = builder.add(header, batch)
            if marker is not None and marker.rebuilt is not None:
                entries.append(marker.rebuilt)
        segment.close_handlers()
    return entries


def segment_bases(partition_dir: Path) -> list[int]:
    return sorted(int(p.name.split(".")[0]) for p in partition_dir.glob("*.log"))


def assert_clean(log_dir: Path) -> None:
    report = check_log_dirs([log_dir])
    assert report.clean, "\n".join(str(p) for p in report.problems)


def open_dir(log_dir: Path, **overrides: object) -> DataDir:
    settings: dict[str, object] = {"log_segment_bytes": 700, "log_index_interval_bytes": 64}
    settings.update(overrides)
    return DataDir.open(broker_config(log_dir, **settings), now_ms=NOW_MS)


def append_in_chunks(log: PartitionLog, events: list[Event], seed: int) -> None:
    """The events appended through `append_batches`, a random number of batches per call."""
    rng = random.Random(seed)
    slot = 0
    while slot < len(events):
        take = rng.randint(1, 6)
        data = b"".join(event.batch() for event in events[slot : slot + take])
        log.append_batches(data, assign_offsets=True, now_ms=NOW_MS)
        slot += take


@pytest.fixture
def log_dir(tmp_path: Path) -> Path:
    return tmp_path / "logs"


def test_the_corpus_of_test_transactions_gets_kafkas_entries(log_dir: Path) -> None:
    """The corpus of tests/cli/test_transactions.py, one batch per append across small segments."""
    events = [
        Event(-1, "data", 2),
        Event(1, "data", 2),
        Event(2, "data", 1),
        Event(1, "data", 1),
        Event(2, "data", 1),
        Event(1, "commit", 1),
        Event(-1, "data", 1),
        Event(2, "abort", 1),
        Event(1, "data", 2),
        Event(1, "abort", 1),
        Event(2, "data", 1),
        Event(2, "commit", 1),
        Event(3, "data", 1),
        Event(-1, "data", 1),
        Event(1, "data", 1),
        Event(1, "commit", 1),
    ]
    with open_dir(log_dir, log_segment_bytes=300) as data_dir:
        log = data_dir.partition_for_append(TOPIC, 0, now_ms=NOW_MS)[0]
        for event in events:
            log.append_batches(event.batch(), assign_offsets=True, now_ms=NOW_MS)
    partition_dir = log_dir / f"{TOPIC}-0"
    model = expected_entries(with_offsets(events))
    # Producer 2's transaction 4..9 aborted while producer 1's (from 1) had committed: stable
    # at 10; producer 1's 10..12 aborted with nothing else open: stable at 13.
    assert model == [AbortedTxn(0, 2, 4, 9, 10), AbortedTxn(0, 1, 10, 12, 13)]
    assert len(segment_bases(partition_dir)) > 2
    assert written_entries(partition_dir) == by_segment(model, segment_bases(partition_dir))
    assert rebuilt_from_log(partition_dir) == model
    assert_clean(log_dir)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_appends_write_every_entry_across_segments(log_dir: Path, seed: int) -> None:
    events = random_corpus(seed, 300)
    with open_dir(log_dir) as data_dir:
        log = data_dir.partition_for_append(TOPIC, 0, now_ms=NOW_MS)[0]
        append_in_chunks(log, events, seed)
        end = log.log_end_offset
    partition_dir = log_dir / f"{TOPIC}-0"
    bases = segment_bases(partition_dir)
    model = expected_entries(with_offsets(events))
    assert end == sum(event.count for event in events)
    assert len(bases) > 10 and len(model) > 10
    files = written_entries(partition_dir)
    assert files == by_segment(model, bases)
    assert rebuilt_from_log(partition_dir) == model
    assert all(entries for entries in files.values())  # a file only where there are entries
    assert_clean(log_dir)
    # A later process continues from the log: its first transactional append reads the open
    # transactions back, and the entries go on as one process would have written them.
    more = random_corpus(seed + 100, 100)
    with open_dir(log_dir) as data_dir:
        append_in_chunks(data_dir.partition(TOPIC, 0), more, seed)
    model = expected_entries(with_offsets(events + more))
    assert written_entries(partition_dir) == by_segment(model, segment_bases(partition_dir))
    assert_clean(log_dir)


def test_open_transactions_behind_a_damaged_length_are_not_skipped_without_a_word(log_dir: Path) -> None:
    """A later process's first transactional append reads the open transactions back from the
    whole log: a sealed segment whose batch has a length field no batch can have is damage named
    by file and position, not the segment's end (the transactions after it were missed, and the
    last stable offset moved past one still open)."""
    events = random_corpus(7, 120)
    with open_dir(log_dir) as data_dir:
        log = data_dir.partition_for_append(TOPIC, 0, now_ms=NOW_MS)[0]
        append_in_chunks(log, events, 7)
    partition_dir = log_dir / f"{TOPIC}-0"
    sealed = partition_dir / f"{segment_bases(partition_dir)[1]:020d}.log"
    content = bytearray(sealed.read_bytes())
    length = struct.unpack_from(">i", content, 8)[0]
    position = 12 + length  # (the second batch)
    struct.pack_into(">i", content, position + 8, 10)
    sealed.write_bytes(bytes(content))
    with open_dir(log_dir) as data_dir:
        log = data_dir.partition(TOPIC, 0)
        damage = rf"{sealed.name}: .* at position {position}: a batch is cut short"
        with pytest.raises(CorruptRecordError, match=damage):
            log.append_batches(Event(1, "data", 2).batch(), assign_offsets=True, now_ms=NOW_MS)


def test_an_adopted_file_of_batches_gets_its_entries(log_dir: Path) -> None:
    """`adopt_batches` (a Spark commit's large staged file) takes the same path for markers."""
    events = random_corpus(51, 120)
    with open_dir(log_dir, log_segment_bytes=1 << 20) as data_dir:
        log = data_dir.partition_for_append(TOPIC, 0, now_ms=NOW_MS)[0]
        log.append_batches(b"".join(e.batch() for e in events[:40]), assign_offsets=True, now_ms=NOW_MS)
        staged = log_dir / "staged.batches"
        staged.write_bytes(b"".join(e.batch() for e in events[40:]))
        log.adopt_batches(staged, now_ms=NOW_MS)
        partition_dir = log.directory
    model = expected_entries(with_offsets(events))
    assert len(segment_bases(partition_dir)) == 2 and len(model) > 4
    assert written_entries(partition_dir) == by_segment(model, segment_bases(partition_dir))
    assert_clean(log_dir)


def test_dump_prints_kafkas_lines_for_a_written_txnindex(log_dir: Path) -> None:
    events = [Event(5, "data", 3), Event(6, "data", 1), Event(5, "abort", 1), Event(6, "abort", 1)]
    with open_dir(log_dir) as data_dir:
        log = data_dir.partition_for_append(TOPIC, 0, now_ms=NOW_MS)[0]
        log.append_batches(b"".join(event.batch() for event in events), assign_offsets=True, now_ms=NOW_MS)
    path = log_dir / f"{TOPIC}-0" / "00000000000000000000.txnindex"
    assert path.stat().st_size == 2 * 34
    assert run("dump", "--files", str(path)).stdout.splitlines()[1:] == [
        "version: 0 producerId: 5 firstOffset: 0 lastOffset: 4 lastStableOffset: 3",
        "version: 0 producerId: 6 firstOffset: 3 lastOffset: 5 lastStableOffset: 6",
    ]


def test_a_log_without_transactions_never_scans_nor_gets_a_txnindex(
    log_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_scan(self: PartitionLog, end_offset: int) -> None:
        raise AssertionError("an append of ordinary data read the log for transactions")

    monkeypatch.setattr(PartitionLog, "_transactions_locked", no_scan)
    with open_dir(log_dir) as data_dir:
        log = data_dir.partition_for_append(TOPIC, 0, now_ms=NOW_MS)[0]
        for i in range(50):
            log.append_batches(data_batch([b"plain-%d" % i] * 3), assign_offsets=True, now_ms=NOW_MS)
            log.append_records([b"record-%d" % i], now_ms=NOW_MS)
        assert log._transactions is None
        assert len(log.segments) > 3
    assert not list((log_dir / f"{TOPIC}-0").glob("*.txnindex*"))
    assert_clean(log_dir)


def test_retention_takes_the_txnindex_with_its_segment(log_dir: Path) -> None:
    events = random_corpus(7, 300)
    with open_dir(log_dir, log_retention_bytes=4000) as data_dir:
        log = data_dir.partition_for_append(TOPIC, 0, now_ms=NOW_MS)[0]
        append_in_chunks(log, events, 7)
        partition_dir = log.directory
        before = written_entries(partition_dir)
        decision = log.delete_old_segments(NOW_MS)
        assert decision and len(decision.segments) > 5
        gone = {segment.base_offset for segment in decision.segments}
        assert any(base in before for base in gone)
        assert list(partition_dir.glob("*.txnindex.deleted"))  # renamed with its segment
        log.delete_pending(NOW_MS, all_of_them=True)
        assert not list(partition_dir.glob("*.deleted"))
        assert written_entries(partition_dir) == {b: e for b, e in before.items() if b not in gone}
        # delete-records too, then appends that continue from what is left
        log.delete_records(log.segments[3].base_offset, NOW_MS)
        log.delete_pending(NOW_MS, all_of_them=True)
        start = log.log_end_offset
        more = random_corpus(8, 80)
        append_in_chunks(log, more, 8)
    # One process throughout: the entries written after retention follow the whole history.
    model = expected_entries(with_offsets(events + more))
    bases = segment_bases(partition_dir)
    assert start > bases[0]
    assert written_entries(partition_dir) == by_segment([e for e in model if e.last_offset >= bases[0]], bases)
    assert_clean(log_dir)  # the log alone no longer shows where some of them began: tolerated


def test_truncation_cuts_the_txnindex_and_appends_go_on(log_dir: Path) -> None:
    events = random_corpus(11, 300)
    placed = with_offsets(events)
    model = expected_entries(placed)
    with open_dir(log_dir) as data_dir:
        log = data_dir.partition_for_append(TOPIC, 0, now_ms=NOW_MS)[0]
        append_in_chunks(log, events, 11)
        # Cut just before a marker in the middle, whose entry (and every later one) must go.
        middle = model[len(model) // 2]
        log.truncate_to(middle.last_offset, NOW_MS)
        partition_dir = log.directory
        kept_events = [event for offset, event in placed if offset < middle.last_offset]
        bases = segment_bases(partition_dir)
        assert written_entries(partition_dir) == by_segment(expected_entries(with_offsets(kept_events)), bases)
        more = random_corpus(12, 150)
        append_in_chunks(log, more, 12)
    model = expected_entries(with_offsets(kept_events + more))
    assert written_entries(partition_dir) == by_segment(model, segment_bases(partition_dir))
    assert_clean(log_dir)


def test_compaction_carries_the_aborted_transactions(log_dir: Path) -> None:
    events = random_corpus(21, 400, keyed=True)
    model = expected_entries(with_offsets(events))
    with open_dir(log_dir, log_cleaner_min_cleanable_ratio=0.01) as data_dir:
        data_dir.create_topic(TOPIC, 1, {"cleanup.policy": "compact"}, now_ms=NOW_MS)
        log = data_dir.partition(TOPIC, 0)
        append_in_chunks(log, events, 21)
        size_before, segments_before = log.size_in_bytes(), len(log.segments)
        # Cleaned groups of several segments (grouped up to segment.bytes).
        data_dir.set_topic_overrides(TOPIC, {"cleanup.policy": "compact", "segment.bytes": "4000"})
        report = data_dir.compact(NOW_MS)
        assert report.compaction and not report.failed
        assert log.size_in_bytes() < size_before and len(log.segments) < segments_before
        partition_dir = log.directory
        log.delete_pending(NOW_MS, all_of_them=True)
    files = written_entries(partition_dir)
    assert [entry for base in sorted(files) for entry in files[base]] == model
    assert files == by_segment(model, segment_bases(partition_dir))
    assert not list(partition_dir.glob("*.cleaned")) and not list(partition_dir.glob("*.swap"))
    # The cleaner removed batches of aborted transactions: the log alone gives less.
    assert rebuilt_from_log(partition_dir) != model
    assert_clean(log_dir)
    # Recovery of every segment (`check --repair`'s open) keeps what only the files still know.
    DataDir.open(broker_config(log_dir), recover_all=True, now_ms=NOW_MS).close()
    assert written_entries(partition_dir) == files


def test_check_finds_a_damaged_txnindex_and_repair_rewrites_it(log_dir: Path) -> None:
    events = random_corpus(31, 300)
    with open_dir(log_dir) as data_dir:
        append_in_chunks(data_dir.partition_for_append(TOPIC, 0, now_ms=NOW_MS)[0], events, 31)
    partition_dir = log_dir / f"{TOPIC}-0"
    files = written_entries(partition_dir)
    assert len(files) >= 3
    first, second, third = sorted(files)[:3]
    # An entry missing, an entry whose first offset lies past its transaction's, a torn tail.
    path = partition_dir / f"{first:020d}.txnindex"
    raw = path.read_bytes()
    path.write_bytes(raw[34:] if len(raw) > 34 else b"")
    if not path.read_bytes():
        path.unlink()
    path = partition_dir / f"{second:020d}.txnindex"
    raw = bytearray(path.read_bytes())
    struct.pack_into(">q", raw, 10, struct.unpack_from(">q", raw, 18)[0])  # first offset := the marker's
    path.write_bytes(bytes(raw))
    path = partition_dir / f"{third:020d}.txnindex"
    path.write_bytes(path.read_bytes()[:-5])
    report = check_log_dirs([log_dir])
    found = {problem.path.name: problem.message for problem in report.problems}
    assert set(found) == {f"{base:020d}.txnindex" for base in (first, second, third)}, found
    assert "no entry for the aborted transaction" in found[f"{first:020d}.txnindex"]
    assert "disagrees with the log" in found[f"{second:020d}.txnindex"]
    assert "not a multiple" in found[f"{third:020d}.txnindex"]
    assert run("check", str(log_dir), code=4).stdout.count(".txnindex") == 3
    run("check", "--repair", str(log_dir))
    assert written_entries(partition_dir) == files
    assert_clean(log_dir)


def appended_then_crashed(log_dir: Path, seed: int) -> tuple[Path, dict[int, list[AbortedTxn]], int]:
    """A corpus appended, then the data dir as a crash leaves it: no clean-shutdown mark, the
    recovery point at the last segment with `.txnindex` entries (recovery reads it again).
    The partition dir, its `.txnindex` entries and that segment's base offset."""
    with open_dir(log_dir) as data_dir:
        append_in_chunks(data_dir.partition_for_append(TOPIC, 0, now_ms=NOW_MS)[0], random_corpus(seed, 200), seed)
    partition_dir = log_dir / f"{TOPIC}-0"
    files = written_entries(partition_dir)
    last = max(files)
    (log_dir / ".kafka_cleanshutdown").unlink()
    (log_dir / "recovery-point-offset-checkpoint").write_text(f"0\n1\n{TOPIC} 0 {last}\n")
    return partition_dir, files, last


def test_recovery_rebuilds_the_txnindex_of_the_segments_it_reads(log_dir: Path) -> None:
    partition_dir, files, last = appended_then_crashed(log_dir, 41)
    (partition_dir / f"{last:020d}.txnindex").unlink()  # as a power cut may leave it
    open_dir(log_dir).close()
    assert written_entries(partition_dir) == files


@pytest.mark.expect_warnings("transaction indexes after it are rebuilt from the log that follows the damage alone")
def test_recovery_behind_a_damaged_length_names_it_and_rebuilds_from_the_log_after_it(
    log_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Recovery reads the open transactions from the first segment on: a sealed segment before
    the recovery point whose batch has an impossible length is named by file and position (not
    taken for the segment's end without a word), and the log after it is read as a log whose
    head is gone: a torn `.txnindex` is rebuilt from it, each entry's transaction seen to begin
    no earlier, and the partition stable no earlier, than it was."""
    partition_dir, files, last = appended_then_crashed(log_dir, 43)
    sealed = partition_dir / f"{segment_bases(partition_dir)[1]:020d}.log"
    content = bytearray(sealed.read_bytes())
    position = 12 + struct.unpack_from(">i", content, 8)[0]  # (the second batch)
    struct.pack_into(">i", content, position + 8, 10)
    sealed.write_bytes(bytes(content))
    torn = partition_dir / f"{last:020d}.txnindex"
    torn.write_bytes(torn.read_bytes()[:50])  # as a power cut may leave it
    open_dir(log_dir).close()
    warned = [r.getMessage() for r in caplog.records if "follows the damage" in r.getMessage()]
    assert len(warned) == 1 and re.search(rf"{sealed.name}: .* at position {position}: a batch is cut short", warned[0])
    original = {(entry.producer_id, entry.last_offset): entry for entry in files[last]}
    rebuilt = read_transaction_index(torn) if torn.exists() else []
    assert rebuilt, "nothing rebuilt"
    for entry in rebuilt:
        was = original[(entry.producer_id, entry.last_offset)]
        assert entry.first_offset >= was.first_offset and entry.last_stable_offset >= was.last_stable_offset


_KILLED_WRITER = """
import sys, time
from pathlib import Path
from seglogfs.engine import DataDir
from tests.conftest import broker_config
from tests.engine.test_txnindex import random_corpus

log_dir, seed = Path(sys.argv[1]), int(sys.argv[2])
config = broker_config(log_dir, log_segment_bytes=700, log_index_interval_bytes=64, log_flush_interval_messages=50)
data_dir = DataDir.open(config, now_ms=time.time_ns() // 1_000_000)
log = data_dir.partition_for_append("txn", 0, now_ms=time.time_ns() // 1_000_000)[0]
for number in range(1_000_000):
    for event in random_corpus(seed + number, 50):
        log.append_batches(event.batch(), assign_offsets=True, now_ms=time.time_ns() // 1_000_000)
    data_dir.checkpoint()
    print("appended", log.log_end_offset, flush=True)
"""


@pytest.mark.expect_warnings("cut .* bytes", "removed, it followed a damaged segment")
@pytest.mark.parametrize("seed", [1, 2])
def test_a_kill_mid_append_leaves_what_recovery_rebuilds(log_dir: Path, seed: int) -> None:
    writer = subprocess.Popen(
        [sys.executable, "-c", _KILLED_WRITER, str(log_dir), str(seed)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    try:
        assert writer.stdout is not None
        for _ in range(3 + seed):
            line = writer.stdout.readline()
            assert line.startswith(b"appended"), writer.stderr.read() if writer.stderr else line
        time.sleep(random.Random(seed).uniform(0.0, 0.05))
    finally:
        os.kill(writer.pid, signal.SIGKILL)
        writer.wait(timeout=30)
    with open_dir(log_dir) as data_dir:  # recovery
        end = data_dir.partition(TOPIC, 0).log_end_offset
    events: list[Event] = []
    for round_ in range(1_000_000):
        events += random_corpus(seed + round_, 50)
        if sum(event.count for event in events) >= end:
            break
    placed = [(offset, event) for offset, event in with_offsets(events) if offset < end]
    assert sum(event.count for _, event in placed) == end  # recovery keeps whole batches
    partition_dir = log_dir / f"{TOPIC}-0"
    assert written_entries(partition_dir) == by_segment(expected_entries(placed), segment_bases(partition_dir))
    assert_clean(log_dir)
