"""A hypothesis state machine: append / roll / retention / compaction / delete-records /
crash-and-reopen / clean reopen / read, against an in-memory model of what the logs must hold:
one partition of a `delete` topic and one of a `compact` topic.

Invariants after every step: offsets never change (each surviving record keeps the offset, key
and value it was given), retention never removes a record at or above the log start offset it
reports, compaction keeps every key's latest value (a latest tombstone may go once its horizon
has passed), the log end offset only moves forward (or back to the last flush after a crash), and
the data dir passes `seglogfs check` whenever it is closed.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from seglogfs.engine import BrokerConfig, DataDir
from seglogfs.engine.check import check_log_dirs
from tests.conftest import NOW_MS

pytestmark = pytest.mark.expect_warnings(r"cut \d+ bytes after the last valid batch")

SETTINGS = [
    "log.segment.bytes=600",
    "log.index.interval.bytes=64",
    "log.retention.bytes=-1",
    "log.retention.ms=100000",
    "log.segment.delete.delay.ms=0",
    "log.cleaner.dedupe.buffer.size=200",  # 11 slots, room for 9 keys: passes often stop early
]
COMPACTED = {"cleanup.policy": "compact", "min.cleanable.dirty.ratio": "0.01", "delete.retention.ms": "60000"}
KEYS = [b"k%d" % i for i in range(12)]


class LogMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.root = Path(tempfile.mkdtemp(prefix="seglogfs-machine-"))
        self.config = BrokerConfig.load(overrides=SETTINGS, log_dirs=[self.root])
        self.now = NOW_MS
        self.data_dir = DataDir.open(self.config, now_ms=self.now)
        self.log = self.data_dir.partition_for_append("m", 0, now_ms=self.now)[0]
        self.data_dir.create_topic("c", 1, COMPACTED, now_ms=self.now)
        self.clog = self.data_dir.partition("c", 0)
        self.cmodel: dict[int, tuple[bytes, bytes | None]] = {}  # the compacted log: offset → (key, value)
        self.cflushed_end = 0
        self.model: dict[int, bytes] = {}  # offset → value of every record written and not yet lost
        self.stamps: dict[int, int] = {}  # offset → record timestamp
        self.deleted_below = 0  # the highest delete-records offset asked for
        self.flushed_end = 0  # every offset below this survives a crash
        self.start = 0

    def teardown(self) -> None:
        try:
            self.data_dir.close()
            report = check_log_dirs([self.root])
            assert report.clean, [str(p) for p in report.problems]
        finally:
            shutil.rmtree(self.root, ignore_errors=True)

    @rule(
        count=st.integers(min_value=1, max_value=12),
        size=st.integers(min_value=0, max_value=80),
        age_ms=st.integers(min_value=0, max_value=200_000),
    )
    def append(self, count: int, size: int, age_ms: int) -> None:
        end = self.log.log_end_offset
        values = [b"%d:" % (end + i) + b"x" * size for i in range(count)]
        info = self.log.append_records(values, timestamps=[self.now - age_ms] * count, now_ms=self.now)
        assert info.first_offset == end
        for i, value in enumerate(values):
            self.model[end + i] = value
            self.stamps[end + i] = self.now - age_ms

    @rule(
        keys=st.lists(st.sampled_from(KEYS), min_size=1, max_size=8),
        tombstone=st.integers(min_value=-1, max_value=7),
        size=st.integers(min_value=0, max_value=60),
    )
    def append_keyed(self, keys: list[bytes], tombstone: int, size: int) -> None:
        end = self.clog.log_end_offset
        values: list[bytes | None] = [b"%d:" % (end + i) + b"y" * size for i in range(len(keys))]
        if 0 <= tombstone < len(keys):
            values[tombstone] = None
        info = self.clog.append_records(values, keys=keys, timestamps=[self.now] * len(keys), now_ms=self.now)
        assert info.first_offset == end
        for i, (key, value) in enumerate(zip(keys, values, strict=True)):
            self.cmodel[end + i] = (key, value)

    @rule()
    def flush(self) -> None:
        self.log.flush()
        self.clog.flush()
        self.flushed_end = self.log.log_end_offset
        self.cflushed_end = self.clog.log_end_offset

    @rule()
    def roll(self) -> None:
        self.log.roll(self.now)
        self.clog.roll(self.now)
        self.flushed_end = max(self.flushed_end, self.log.active_segment.base_offset)
        self.cflushed_end = max(self.cflushed_end, self.clog.active_segment.base_offset)

    @rule(step_ms=st.integers(min_value=0, max_value=40_000))
    def compact(self, step_ms: int) -> None:
        self.now += step_ms
        report = self.data_dir.compact(self.now)
        assert not report.failed
        self._compacted()

    def _compacted(self) -> None:
        """Check what compaction kept against the model, then take it as the new model."""
        got = {r.offset: (r.key, r.value) for r in self.clog.records(self.clog.log_start_offset)}
        assert all(self.cmodel.get(offset) == record for offset, record in got.items()), "a record changed"
        latest: dict[bytes, int] = {}
        for offset, (key, _) in sorted(self.cmodel.items()):
            if offset >= self.clog.log_start_offset:
                latest[key] = offset
        lost = [o for o in latest.values() if o not in got and self.cmodel[o][1] is not None]
        assert not lost, f"latest values lost at offsets {lost}"
        active = self.clog.active_segment.base_offset
        assert all(o in got for o in self.cmodel if o >= active), "the active segment was cleaned"
        self.cmodel = {o: self.cmodel[o] for o in got}

    @rule(step_ms=st.integers(min_value=0, max_value=150_000))
    def retention(self, step_ms: int) -> None:
        self.now += step_ms
        self.data_dir.clean(self.now)
        self._compacted()
        lost = [o for o in self.model if o < self.log.log_start_offset]
        # Time retention goes by each segment's largest timestamp: a record younger than
        # retention.ms keeps its segment, so it can only go below an explicit delete-records.
        retention_ms = self.log.config.retention_ms
        assert all(o < self.deleted_below or self.now - self.stamps[o] > retention_ms for o in lost), lost
        self._forget_below(self.log.log_start_offset)

    @precondition(lambda self: self.log.log_end_offset > self.log.log_start_offset)
    @rule(data=st.data())
    def delete_records(self, data: st.DataObject) -> None:
        offset = data.draw(st.integers(min_value=self.log.log_start_offset, max_value=self.log.log_end_offset))
        assert self.log.delete_records(offset, self.now) >= offset
        self.deleted_below = max(self.deleted_below, offset)
        self._forget_below(self.log.log_start_offset)

    @rule()
    def clean_reopen(self) -> None:
        self.data_dir.close()
        assert check_log_dirs([self.root]).clean
        self.data_dir = DataDir.open(self.config, now_ms=self.now)
        self.log = self.data_dir.partition("m", 0)
        self.clog = self.data_dir.partition("c", 0)
        self.flushed_end = self.log.log_end_offset
        self.cflushed_end = self.clog.log_end_offset

    @rule()
    def crash_and_reopen(self) -> None:
        # What a SIGKILL leaves: files as they are, no clean-shutdown marker, locks released.
        self.data_dir.checkpoint()
        for segment in [*self.log.segments, *self.clog.segments]:
            segment.release_handles()
        self.data_dir._release_locks()
        self.data_dir = DataDir.open(self.config, now_ms=self.now)
        self.log = self.data_dir.partition("m", 0)
        end = self.log.log_end_offset
        assert end >= self.flushed_end, f"lost flushed records: end {end} < {self.flushed_end}"
        for offset in [o for o in self.model if o >= end]:
            del self.model[offset]
        self.flushed_end = end
        self.clog = self.data_dir.partition("c", 0)
        cend = self.clog.log_end_offset
        assert cend >= self.cflushed_end, f"lost flushed keyed records: end {cend} < {self.cflushed_end}"
        self.cmodel = {o: r for o, r in self.cmodel.items() if o < cend}
        self.cflushed_end = cend

    def _forget_below(self, start: int) -> None:
        assert start >= self.start, "the log start offset went backwards"
        self.start = start
        for offset in [o for o in self.model if o < start]:
            del self.model[offset]

    @invariant()
    def reads_match_the_model(self) -> None:
        records = list(self.log.records(self.log.log_start_offset))
        got = {r.offset: r.value for r in records}
        expected = {o: v for o, v in self.model.items() if o >= self.log.log_start_offset}
        assert got == expected
        assert self.log.log_start_offset <= self.log.log_end_offset
        keyed = {r.offset: (r.key, r.value) for r in self.clog.records(self.clog.log_start_offset)}
        assert keyed == {o: r for o, r in self.cmodel.items() if o >= self.clog.log_start_offset}


LogMachine.TestCase.settings = settings(max_examples=40, stateful_step_count=25, deadline=None)
test_log_state_machine = LogMachine.TestCase
