"""Transactions: a corpus of transactional batches built with kafka-python's record builder and
hand-made control batches (commit and abort markers), read with `consume --isolation-level`.

read_committed must show exactly the records of committed transactions and non-transactional
records below the last stable offset (the first offset of the earliest open transaction), and
read_uncommitted (the default, as in Kafka) every data record; control records never. The
expected records are computed here from the batches as they were built, by a model independent
of the engine's tracker.
"""

from __future__ import annotations

import os
import re
import struct
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import crc32c
import pytest
from kafka.record.default_records import DefaultRecordBatchBuilder

from seglogfs.engine import BrokerConfig, DataDir
from seglogfs.engine.log.transactions import TransactionTracker
from tests.cli.support import run
from tests.conftest import NOW_MS, REPO

ABORT, COMMIT = 0, 1
_CONTROL_BIT = 0x20
_ATTRIBUTES_AT, _CRC_AT = 21, 17  # v2 batch header: crc at 17, attributes at 21 (CRC covers 21..end)


def data_batch(values: list[bytes], producer_id: int = -1, *, compression: int = 0) -> bytes:
    """A v2 batch from kafka-python's builder: transactional when it has a producer id."""
    builder = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=compression,
        is_transactional=producer_id >= 0,
        producer_id=producer_id,
        producer_epoch=0 if producer_id >= 0 else -1,
        base_sequence=0 if producer_id >= 0 else -1,
        batch_size=1 << 20,
    )
    for i, value in enumerate(values):
        builder.append(i, timestamp=NOW_MS + i, key=None, value=value, headers=[])
    return bytes(builder.build())


def control_batch(producer_id: int, kind: int, coordinator_epoch: int = 7) -> bytes:
    """A transaction marker as a broker writes it: one record, key (version 0, type), value an
    EndTxnMarker (version 0, coordinator epoch); attributes transactional and control. Built with
    kafka-python's builder, then the control bit set and the CRC-32C made again by hand."""
    builder = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=0,
        is_transactional=True,
        producer_id=producer_id,
        producer_epoch=0,
        base_sequence=-1,
        batch_size=1 << 20,
    )
    builder.append(
        0, timestamp=NOW_MS, key=struct.pack(">hh", 0, kind), value=struct.pack(">hi", 0, coordinator_epoch), headers=[]
    )
    batch = bytearray(builder.build())
    attributes = struct.unpack_from(">h", batch, _ATTRIBUTES_AT)[0] | _CONTROL_BIT
    struct.pack_into(">h", batch, _ATTRIBUTES_AT, attributes)
    struct.pack_into(">I", batch, _CRC_AT, crc32c.crc32c(bytes(batch[_ATTRIBUTES_AT:])))
    return bytes(batch)


@dataclass
class Model:
    """What each isolation level must show, kept as the corpus is built (offsets as the log
    assigns them: one after another from 0)."""

    next_offset: int = 0
    all_values: list[bytes] = field(default_factory=list)
    pending: dict[int, list[tuple[int, bytes]]] = field(default_factory=dict)  # producer → its open txn's records
    first_open: dict[int, int] = field(default_factory=dict)  # producer → first offset of its open txn
    settled: list[tuple[int, bytes]] = field(default_factory=list)  # (offset, value) visible once below the LSO

    def data(self, values: list[bytes], producer_id: int = -1) -> bytes:
        records = list(zip(range(self.next_offset, self.next_offset + len(values)), values, strict=True))
        self.all_values += values
        if producer_id < 0:
            self.settled += records
        else:
            self.first_open.setdefault(producer_id, self.next_offset)
            self.pending.setdefault(producer_id, []).extend(records)
        self.next_offset += len(values)
        return data_batch(values, producer_id)

    def marker(self, producer_id: int, kind: int) -> bytes:
        records = self.pending.pop(producer_id, [])
        self.first_open.pop(producer_id, None)
        if kind == COMMIT:
            self.settled += records
        self.next_offset += 1
        return control_batch(producer_id, kind)

    def committed(self) -> list[bytes]:
        stable = min(self.first_open.values(), default=self.next_offset)
        return [value for offset, value in sorted(self.settled) if offset < stable]


def build_corpus(data: Path) -> Model:
    """Two producers interleaved, a commit, aborts, a compressed aborted transaction, a third
    producer's transaction still open, and records after it."""
    model = Model()
    batches = [
        model.data([b"plain-0", b"plain-1"]),
        model.data([b"p1-a-0", b"p1-a-1"], 1),
        model.data([b"p2-b-0"], 2),
        model.data([b"p1-a-2"], 1),
        model.data([b"p2-b-1"], 2),
        model.marker(1, COMMIT),
        model.data([b"plain-2"]),
        model.marker(2, ABORT),
        model.data([b"p1-c-0", b"p1-c-1"], 1),
        model.marker(1, ABORT),
        model.data([b"p2-d-0"], 2),
        model.marker(2, COMMIT),
        model.data([b"p3-e-0"], 3),  # never ended: the last stable offset stays here
        model.data([b"plain-3"]),
        model.data([b"p1-f-0"], 1),
        model.marker(1, COMMIT),
    ]
    config = BrokerConfig.load(log_dirs=[data])
    with DataDir.open(config, now_ms=NOW_MS) as data_dir:
        log = data_dir.partition_for_append("txn", 0, now_ms=NOW_MS)[0]
        log.append_batches(b"".join(batches), assign_offsets=True, now_ms=NOW_MS)
        assert log.log_end_offset == model.next_offset
    return model


def consume(data: Path, *extra: str) -> list[bytes]:
    result = run("consume", str(data), "--topic", "txn", "--from-beginning", *extra)
    return result.stdout.encode().splitlines()


def test_read_committed_shows_exactly_the_committed_records_below_the_last_stable_offset(tmp_path: Path) -> None:
    data = tmp_path / "data"
    model = build_corpus(data)
    assert consume(data) == model.all_values  # read_uncommitted, Kafka's default: no control records
    assert consume(data, "--isolation-level", "read_uncommitted") == model.all_values
    committed = consume(data, "--isolation-level", "read_committed")
    assert committed == model.committed()
    assert committed == [b"plain-0", b"plain-1", b"p1-a-0", b"p1-a-1", b"p1-a-2", b"plain-2", b"p2-d-0"]
    jsonl = run(
        "consume",
        str(data),
        "--topic",
        "txn",
        "--from-beginning",
        "--format",
        "jsonl",
        "--isolation-level",
        "read_committed",
    )
    assert len(jsonl.stdout.splitlines()) == len(committed)


def test_the_open_transaction_ending_releases_what_waited_behind_it(tmp_path: Path) -> None:
    data = tmp_path / "data"
    model = build_corpus(data)
    config = BrokerConfig.load(log_dirs=[data])
    with DataDir.open(config, now_ms=NOW_MS) as data_dir:
        data_dir.partition("txn", 0).append_batches(model.marker(3, COMMIT), assign_offsets=True, now_ms=NOW_MS)
    committed = consume(data, "--isolation-level", "read_committed")
    assert committed == model.committed()
    assert committed[-3:] == [b"p3-e-0", b"plain-3", b"p1-f-0"]


def test_a_follower_sees_a_transaction_when_it_commits(tmp_path: Path) -> None:
    """`consume --follow --isolation-level read_committed` from the log end (the last stable
    offset for read_committed) prints the open transaction's records only once its marker lands,
    and never the records of a transaction aborted meanwhile."""
    data = tmp_path / "data"
    model = build_corpus(data)
    command = ["consume", str(data), "--topic", "txn", "--follow", "--isolation-level", "read_committed"]
    follower = subprocess.Popen(
        [sys.executable, "-m", "seglogfs.mount_tools.cli", *command],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        time.sleep(1.5)  # it started at the last stable offset, behind p3's open transaction
        config = BrokerConfig.load(log_dirs=[data])
        with DataDir.open(config, read_only=False, now_ms=NOW_MS) as data_dir:
            log = data_dir.partition("txn", 0)
            log.append_batches(model.data([b"p4-g-0"], 4) + model.marker(4, ABORT), assign_offsets=True, now_ms=NOW_MS)
            log.append_batches(model.marker(3, COMMIT), assign_offsets=True, now_ms=NOW_MS)
            log.append_batches(model.data([b"plain-4"]), assign_offsets=True, now_ms=NOW_MS)
        time.sleep(1.5)
    finally:
        follower.terminate()
        out, err = follower.communicate(timeout=30)
    assert follower.returncode == 0, err
    assert out.splitlines() == [b"p3-e-0", b"plain-3", b"p1-f-0", b"plain-4"]
    assert model.committed()[-4:] == out.splitlines()


def test_the_tracker_finds_the_aborted_and_open_transactions(tmp_path: Path) -> None:
    data = tmp_path / "data"
    model = build_corpus(data)
    config = BrokerConfig.load(log_dirs=[data])
    with DataDir.open(config, read_only=True, now_ms=NOW_MS) as data_dir:
        log = data_dir.partition("txn", 0)
        tracker = TransactionTracker()
        assert tracker.catch_up(log) == min(model.first_open.values()) == 15
        assert tracker.open_transactions == model.first_open
        assert [(t.producer_id, t.first_offset, t.last_offset) for t in tracker.aborted] == [(2, 4, 9), (1, 10, 12)]
        assert tracker.catch_up(log) == 15  # nothing new: the same answer, nothing read twice
        assert tracker.next_offset == log.log_end_offset


def test_the_tracker_reads_headers_and_markers_only(tmp_path: Path, monkeypatch) -> None:
    """The corpus followed by large plain batches: the tracker reads each batch's header and
    each transaction marker whole (what it needs), not the partition, and finds what a tracker
    fed every whole batch finds."""
    data = tmp_path / "data"
    model = build_corpus(data)
    config = BrokerConfig.load(log_dirs=[data])
    with DataDir.open(config, now_ms=NOW_MS) as data_dir:
        log = data_dir.partition("txn", 0)
        for _ in range(20):
            log.append_records([b"v" * 1000] * 100, now_ms=NOW_MS)  # about 100 KB a batch
    with DataDir.open(config, read_only=True, now_ms=NOW_MS) as data_dir:
        log = data_dir.partition("txn", 0)
        whole = TransactionTracker()
        for _, header, batch in log.batches(log.log_start_offset):
            whole.add(header, batch)
        read = 0
        real_pread = os.pread

        def counted(fd: int, length: int, position: int) -> bytes:
            nonlocal read
            got = real_pread(fd, length, position)
            read += len(got)
            return got

        monkeypatch.setattr(os, "pread", counted)
        tracker = TransactionTracker()
        assert tracker.catch_up(log) == whole.last_stable_offset(log.log_end_offset) == 15
        assert read < log.size_in_bytes() // 10
    assert tracker.open_transactions == whole.open_transactions == model.first_open
    assert tracker.aborted == whole.aborted and len(tracker.aborted) == 2


_TRANSACTIONAL_BIT, _LAST_OFFSET_DELTA_AT = 0x10, 23


@pytest.mark.parametrize(
    "damage",
    [
        "a marker's record",  # (the CRC no longer holds: every damage below is to CRC-covered bytes)
        "a marker's control bit",  # then it looks like a transaction's data
        "a marker's transactional bit",  # then it looks like no transaction's
        "a plain batch's transactional bit",  # then it opens a transaction that never ends
        "a plain batch's last offset delta",  # then the batches after it look seen already
    ],
)
def test_a_damaged_batch_the_tracking_rests_on_is_reported(tmp_path: Path, damage: str) -> None:
    """The batches the tracker acts on are read whole and checked: damage to one is an error
    naming file and position, not a transaction left open (or aborted) by mistake, which would
    hold read_committed readers back without a word."""
    from seglogfs.engine.errors import CorruptRecordError
    from seglogfs.engine.record.records import iter_batch_headers

    data = tmp_path / "data"
    build_corpus(data)
    segment = data / "txn-0" / "00000000000000000000.log"
    content = bytearray(segment.read_bytes())
    headers = list(iter_batch_headers(content))
    marker = next(h for h in headers if h.is_control)
    plain = next(h for h in headers if not h.is_transactional and h is not headers[-1])
    if damage == "a marker's record":
        damaged = marker
        content[marker.next_position - 1] ^= 0xFF
    elif damage == "a marker's control bit":
        damaged = marker
        content[marker.position + _ATTRIBUTES_AT + 1] &= ~_CONTROL_BIT
    elif damage == "a marker's transactional bit":
        damaged = marker
        content[marker.position + _ATTRIBUTES_AT + 1] &= ~_TRANSACTIONAL_BIT
    elif damage == "a plain batch's transactional bit":
        damaged = plain
        content[plain.position + _ATTRIBUTES_AT + 1] |= _TRANSACTIONAL_BIT
    else:
        damaged = plain
        struct.pack_into(">i", content, plain.position + _LAST_OFFSET_DELTA_AT, plain.last_offset_delta + 5)
    segment.write_bytes(bytes(content))
    expected = re.escape(f"{segment}: corrupt record batch at position {damaged.position}")
    with (
        DataDir.open(BrokerConfig.load(log_dirs=[data]), read_only=True, now_ms=NOW_MS) as data_dir,
        pytest.raises(CorruptRecordError, match=expected),
    ):
        TransactionTracker().catch_up(data_dir.partition("txn", 0))
