"""The engine's crash scenarios, run through the real engine API on the power-cut passthrough,
and the check of what a power cut left.

A scenario's workload runs in a child process (`run_workload`):

    python -m tests.powercut.scenarios SCENARIO LOG_DIR JOURNAL SEED ROUND

It writes, in JOURNAL (a file outside the mount, one JSON object a line, appended after the
fact), what the engine promised:

    {"open": E, "round": R}   the data dir opened (after recovery) with log end E
    {"ack": E, "round": R}    `flush()` returned with log end E: every record below E is durable
    {"floor": F}              about to raise the log start to F (retention, delete-records): the
                              records below F may go, and may come back after a crash
    {"done": R}               the workload closed the data dir cleanly

Records are functions of their offset, so the check needs nothing but the journal: value
`value_for(offset, round)` (the round that wrote it: a record the second round rewrote after
recovery cut it must not come back with the first round's value), key `key_for(offset)`, and on
compacted topics a tombstone where `is_tombstone(offset)`.

After the cut, `check_recovered` opens the backing log dir normally (no FUSE), which recovers it,
and checks: the data dir opens; nothing unreadable or invalid is read (every record is one that
was written, at its offset, by the round that last wrote there); offsets run without gaps from
the log start (compacted topics: increasing); the log end is at or above every acknowledged end;
every acknowledged record at or above the last floor survives (compacted topics: the last
acknowledged record of each key, or a later one of that key); an append continues at the log end
and reads back; after the close `check_log_dirs` finds nothing.
"""

from __future__ import annotations

import json
import os
import random
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from seglogfs.engine import BrokerConfig, DataDir, EngineError, PartitionLog
from seglogfs.engine.check import check_log_dirs

NOW_MS = 1_763_800_000_000
TOPIC = "pc"
LOG_DIR_NAME = "logs"

# Small files: segments of a few KiB and index files of 4 KiB, so that a workload of a second
# rolls, deletes and compacts many times. Flushes only when the workload asks (and at rolls): the
# engine's own time-based flush (flush.ms) would otherwise sync at nearly every append of a
# workload whose clock ticks a second per call, and leave no unsynced data to lose.
BROKER = [
    "log.flush.interval.ms=9223372036854775807",
    "log.segment.bytes=2500",
    "log.index.interval.bytes=200",
    "log.index.size.max.bytes=4096",
    "log.cleaner.dedupe.buffer.size=65536",
]


def value_for(offset: int, round_: int) -> bytes:
    return b"r%d-o%08d-" % (round_, offset) + b"x" * (offset % 61)


def key_for(offset: int) -> bytes:
    return b"k%02d" % (offset * 7 % 13)


def is_tombstone(offset: int) -> bool:
    return offset % 17 == 5


class Journal:
    """The side file of promises (see the module docstring)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def write(self, **entry: int) -> None:
        with open(self.path, "a", encoding="utf-8") as handle:
            handle.write(json.dumps(entry) + "\n")

    @staticmethod
    def read(path: Path) -> list[dict[str, int]]:
        if not path.exists():
            return []
        # Only whole lines count: a kill may land in the middle of one.
        return [json.loads(line) for line in path.read_text(encoding="utf-8").split("\n")[:-1]]


@dataclass
class Workload:
    """One run of a scenario in the child: the data dir, the partition, the journal, the clock."""

    scenario: Scenario
    log_dir: Path
    journal: Journal
    rng: random.Random
    round_: int
    now_ms: int
    data_dir: DataDir | None = None
    log: PartitionLog | None = None

    def tick(self) -> int:
        self.now_ms += 1000
        return self.now_ms

    def open(self, *, create: bool) -> PartitionLog:
        self.data_dir = DataDir.open(self.scenario.config(self.log_dir), now_ms=self.now_ms)
        if create:
            self.data_dir.create_topic(TOPIC, 1, self.scenario.topic, now_ms=self.now_ms)
        self.log = self.data_dir.partition(TOPIC, 0)
        self.journal.write(open=self.log.log_end_offset, round=self.round_)
        return self.log

    def append(self, count: int) -> None:
        log = self.log
        assert log is not None
        start = log.log_end_offset
        offsets = range(start, start + count)
        compact = self.scenario.compacted
        values = [None if compact and is_tombstone(o) else value_for(o, self.round_) for o in offsets]
        info = log.append_records(values, keys=[key_for(o) for o in offsets], now_ms=self.tick())
        assert info.first_offset == start, (info, start)

    def flush_and_ack(self) -> None:
        assert self.log is not None
        self.log.flush()
        self.journal.write(ack=self.log.log_end_offset, round=self.round_)

    def floor(self, offset: int) -> None:
        self.journal.write(floor=offset)

    def close(self) -> None:
        assert self.data_dir is not None
        self.data_dir.close()
        self.journal.write(done=self.round_)


def _produce(w: Workload, step: Callable[[Workload, int], None], *, roll_p: float = 0.12) -> None:
    """The loop every scenario shares: appends, sometimes a roll, mostly a flush and its
    acknowledgement, sometimes a checkpoint; `step` adds the scenario's own work."""
    assert w.log is not None and w.data_dir is not None
    for n in range(w.scenario.steps):
        w.append(w.rng.randint(1, 12))
        if w.rng.random() < roll_p:
            w.log.roll(w.tick())
        if w.rng.random() < 0.75:
            w.flush_and_ack()
        if w.rng.random() < 0.15:
            w.data_dir.checkpoint()
        step(w, n)


def _nothing(w: Workload, n: int) -> None:
    pass


def _append_roll(w: Workload) -> None:
    w.open(create=False)
    _produce(w, _nothing)
    w.close()


def _create_topic(w: Workload) -> None:
    w.open(create=True)
    _produce(w, _nothing, roll_p=0.0)
    w.close()


def _append_roll_new_topic(w: Workload) -> None:
    w.open(create=True)
    _produce(w, _nothing)
    w.close()


def _flush_without_fsync(w: Workload) -> None:
    # A deliberately broken engine, for the harness's own test: flush() fsyncs no `.log` file.
    from seglogfs.engine.log.segment import LogSegment

    def flush(segment: LogSegment) -> None:
        pass

    LogSegment.flush = flush  # type: ignore[method-assign]
    _append_roll(w)


def _retention_step(w: Workload, n: int) -> None:
    log, data_dir = w.log, w.data_dir
    assert log is not None and data_dir is not None
    if n % 4 != 3:
        return
    now_ms = w.tick()
    # The same decision the engine is about to take: where the log start may go.
    decision = log.retention_due(now_ms)
    if decision:
        bases = [segment.base_offset for segment in log.segments]
        slot = bases.index(decision.segments[-1].base_offset)
        w.floor(bases[slot + 1] if slot + 1 < len(bases) else log.log_end_offset)
    data_dir.delete_old_segments(now_ms)


def _retention(w: Workload) -> None:
    w.open(create=False)
    _produce(w, _retention_step)
    w.close()


def _delete_records_step(w: Workload, n: int) -> None:
    log, data_dir = w.log, w.data_dir
    assert log is not None and data_dir is not None
    if w.rng.random() < 0.2:
        # Up to the high watermark, which may be above what was flushed.
        target = w.rng.randint(log.log_start_offset, log.high_watermark)
        w.floor(target)
        log.delete_records(target, w.tick())
        if w.rng.random() < 0.5:
            data_dir.checkpoint()


def _delete_records(w: Workload) -> None:
    w.open(create=False)
    _produce(w, _delete_records_step)
    w.close()


def _compaction_step(w: Workload, n: int) -> None:
    assert w.data_dir is not None
    if n % 5 == 4:
        report = w.data_dir.clean(w.tick())
        assert not report.failed, report.failed


def _compaction(w: Workload) -> None:
    w.open(create=False)
    _produce(w, _compaction_step, roll_p=0.25)
    w.close()


def _recover_twice(w: Workload) -> None:
    # Round 2 opens what round 1's cut left, through the mount: recovery's own changes are
    # subject to the next cut.
    w.open(create=False)
    _produce(w, _delete_records_step)
    w.close()


def _start_past_flush(w: Workload) -> None:
    log = w.open(create=False)
    if w.round_ == 1:
        # Flushed records, then unflushed ones, the log start raised into those and
        # checkpointed: a power cut now leaves a log that ends below its start (the loader
        # replaces it with an empty segment at the start).
        for _ in range(3):
            w.append(10)
            w.flush_and_ack()
        w.append(20)
        target = log.log_end_offset - 5
        w.floor(target)
        log.delete_records(target, w.tick())
        assert w.data_dir is not None
        w.data_dir.checkpoint()
        os._exit(0)  # killed here, before any other flush
    _produce(w, _nothing, roll_p=0.0)
    w.close()


@dataclass(frozen=True)
class Scenario:
    name: str
    doc: str
    run: Callable[[Workload], None]
    prepare: str = "topic"  # "topic": a closed data dir with the topic; "log_dir": an empty log dir; "nothing"
    topic: dict[str, str] = field(default_factory=dict)
    broker: tuple[str, ...] = ()
    compacted: bool = False
    rounds: int = 1
    steps: int = 40
    uncut_rounds: tuple[int, ...] = ()  # rounds that run to their own end (a kill of their own)

    def config(self, log_dir: Path) -> BrokerConfig:
        return BrokerConfig.load(overrides=[*BROKER, *self.broker], log_dirs=[log_dir])


SCENARIOS = {
    s.name: s
    for s in (
        Scenario("append_roll", "appends, flushes, rolls and checkpoints on an existing topic", _append_roll),
        Scenario(
            "create_topic",
            "the topic is created through the mount, then appends and flushes (no roll: a new "
            "topic's first segment takes them all)",
            _create_topic,
            "log_dir",
            broker=("log.segment.bytes=1048576",),
        ),
        Scenario(
            "new_log_dir",
            "DataDir.open makes the log dir itself, creates the topic, appends, flushes and rolls",
            _append_roll_new_topic,
            "nothing",
        ),
        Scenario(
            "retention",
            "retention.bytes deletes old segments (.deleted renames, file.delete.delay.ms=0 unlinks)",
            _retention,
            topic={"retention.bytes": "5000", "file.delete.delay.ms": "0"},
        ),
        Scenario(
            "delete_records", "delete-records raises the log start, with and without checkpoints", _delete_records
        ),
        Scenario(
            "compaction",
            "a compacted topic cleaned every few steps: .cleaned → .swap → live, .deleted unlinked",
            _compaction,
            topic={"cleanup.policy": "compact", "min.cleanable.dirty.ratio": "0.01", "file.delete.delay.ms": "0"},
            compacted=True,
        ),
        Scenario(
            "start_past_flush",
            "delete-records above the flushed end, checkpointed, then killed; the second round "
            "opens a log that ends below its start, appends and flushes (one segment, no roll)",
            _start_past_flush,
            broker=("log.segment.bytes=1048576",),
            rounds=2,
            uncut_rounds=(1,),
        ),
        Scenario(
            "recover_twice",
            "two cuts: the second round recovers the first cut's state through the mount, then "
            "appends, rolls and deletes records",
            _recover_twice,
            rounds=2,
            steps=25,
        ),
    )
}


# Not part of the runs: a broken engine that the harness must catch (its own test).
CONTROLS = {
    s.name: s
    for s in (Scenario("flush_without_fsync", "append_roll with a flush that fsyncs nothing", _flush_without_fsync),)
}


def scenario_named(name: str) -> Scenario:
    return SCENARIOS.get(name) or CONTROLS[name]


def prepare(scenario: Scenario, backing: Path) -> Path:
    """Lay out the backing dir before the mount (all of it durable); returns the log dir."""
    log_dir = backing / LOG_DIR_NAME
    if scenario.prepare == "nothing":
        return log_dir
    log_dir.mkdir()
    if scenario.prepare == "topic":
        with DataDir.open(scenario.config(log_dir), now_ms=NOW_MS) as data_dir:
            data_dir.create_topic(TOPIC, 1, scenario.topic, now_ms=NOW_MS)
    return log_dir


def run_workload(name: str, log_dir: Path, journal: Path, seed: int, round_: int) -> None:
    scenario = scenario_named(name)
    workload = Workload(
        scenario, log_dir, Journal(journal), random.Random(seed * 10 + round_), round_, NOW_MS + round_ * 10**8
    )
    scenario.run(workload)


# -- the check ------------------------------------------------------------------------------------


@dataclass
class Promises:
    """What the journal says must hold."""

    acked: int = 0  # highest acknowledged log end
    floor: int = 0  # highest log start announced
    opens: dict[int, int] = field(default_factory=dict)  # round → log end at open

    @classmethod
    def from_journal(cls, entries: list[dict[str, int]]) -> Promises:
        promises = cls()
        for entry in entries:
            if "ack" in entry:
                promises.acked = max(promises.acked, entry["ack"])
            elif "floor" in entry:
                promises.floor = max(promises.floor, entry["floor"])
            elif "open" in entry:
                promises.opens[entry["round"]] = entry["open"]
        return promises

    def round_at(self, offset: int) -> int:
        """The round whose value an offset must hold: the last round that opened at or below it."""
        rounds = [r for r, end in self.opens.items() if end <= offset]
        return max(rounds, default=1)


def check_recovered(scenario: Scenario, log_dir: Path, journal: list[dict[str, int]]) -> list[str]:
    """Recover the log dir with a normal writable open and return what is wrong (empty: all
    good). See the module docstring for what is checked."""
    promises = Promises.from_journal(journal)
    problems: list[str] = []
    for round_, end in sorted(promises.opens.items()):
        earlier = [e["ack"] for e in journal if "ack" in e and e["round"] < round_]
        if earlier and end < max(earlier):
            problems.append(f"round {round_} opened at log end {end}, below the acknowledged {max(earlier)}")
    config = scenario.config(log_dir)
    if not log_dir.is_dir():
        if promises.acked > 0:
            problems.append(f"the log dir is gone; records up to {promises.acked} were acknowledged")
        return problems
    try:
        with DataDir.open(config, now_ms=NOW_MS + 10**9) as data_dir:
            if TOPIC not in data_dir.topics():
                if promises.acked > 0:
                    problems.append(f"topic {TOPIC} is gone; records up to {promises.acked} were acknowledged")
                return problems
            log = data_dir.partition(TOPIC, 0)
            problems += _check_records(scenario, log, promises)
            end = log.log_end_offset
            info = log.append_records([b"after-the-cut"], keys=[b"after"], now_ms=NOW_MS + 10**9)
            if info.first_offset != end:
                problems.append(f"an append after recovery went to offset {info.first_offset}, not {end}")
            back = [(r.offset, r.value) for r in log.records(end)]
            if back != [(end, b"after-the-cut")]:
                problems.append(f"the append after recovery reads back as {back}")
    except EngineError as error:
        problems.append(f"recovery or reading failed: {error!r}")
        return problems
    report = check_log_dirs([log_dir])
    problems += [f"check: {problem}" for problem in report.problems]
    return problems


def _check_records(scenario: Scenario, log: PartitionLog, promises: Promises) -> list[str]:
    problems = []
    start, end = log.log_start_offset, log.log_end_offset
    if end < promises.acked:
        problems.append(f"log end {end} is below the acknowledged {promises.acked} (floor {promises.floor})")
    try:
        records = list(log.records(start))
    except EngineError as error:
        return [*problems, f"reading from the log start {start} failed: {error!r}"]
    present = {}
    previous = start - 1
    for record in records:
        offset = record.offset
        round_ = promises.round_at(offset)
        value = None if scenario.compacted and is_tombstone(offset) else value_for(offset, round_)
        if record.key != key_for(offset) or record.value != value:
            problems.append(f"offset {offset} holds {record.key!r}={record.value!r}, not {key_for(offset)!r}={value!r}")
        if offset <= previous:
            problems.append(f"offset {offset} comes after offset {previous}")
        previous = offset
        present[offset] = record
    if not scenario.compacted:
        missing = [o for o in range(start, end) if o not in present]
        if missing:
            problems.append(
                f"{len(missing)} offsets between the log start {start} and end {end} are missing: {missing[:5]}"
            )
        lost = [o for o in range(promises.floor, promises.acked) if o not in present]
        if lost:
            problems.append(
                f"{len(lost)} acknowledged records are lost (acknowledged up to {promises.acked}, floor "
                f"{promises.floor}, recovered {start}..{end}): first {lost[:5]}"
            )
    else:
        latest: dict[bytes, int] = {}
        for offset in range(promises.floor, promises.acked):
            latest[key_for(offset)] = offset
        for key, offset in sorted(latest.items()):
            if not any(o >= offset and key_for(o) == key for o in present):
                problems.append(f"key {key!r}: its last acknowledged record, offset {offset}, is lost")
    return problems


def main() -> None:
    name, log_dir, journal, seed, round_ = sys.argv[1:6]
    run_workload(name, Path(log_dir), Path(journal), int(seed), int(round_))


if __name__ == "__main__":
    main()
