"""A small data dir with what Spark's Kafka semantics have to get right, and a model of its
records to compute the expected rows from: several topics and partitions, many small segments,
timestamps that do not rise with offsets, a partition whose log start offset was raised, a
transaction marker (a control batch), a LogAppendTime topic, keys and headers, and an internal
topic that `subscribe`/`subscribePattern` never show."""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa

from seglogfs.engine import BrokerConfig, DataDir, build_batch
from seglogfs.engine.record.builder import ProducerState

T0 = 1_700_000_000_000
NOW_MS = T0 + 10_000_000
TopicPartition = tuple[str, int]


@dataclass
class SampleRecord:
    offset: int
    timestamp: int
    control: bool = False
    key: bytes | None = None
    value: bytes | None = None
    headers: tuple = ()


@dataclass
class Sample:
    path: Path
    records: dict[TopicPartition, list[SampleRecord]] = field(default_factory=dict)
    log_start: dict[TopicPartition, int] = field(default_factory=dict)
    log_end: dict[TopicPartition, int] = field(default_factory=dict)

    def partitions(self, *topics: str) -> list[TopicPartition]:
        return sorted(tp for tp in self.records if not topics or tp[0] in topics)

    def rows(self, tp: TopicPartition, lo: int, hi: int) -> set[tuple[str, int, int]]:
        """User records (no control records) of offsets [lo, hi) within the log."""
        return {
            (tp[0], tp[1], r.offset)
            for r in self.records[tp]
            if not r.control and lo <= r.offset < hi and r.offset >= self.log_start[tp]
        }

    def first_at(self, tp: TopicPartition, timestamp: int) -> int | None:
        """Kafka's ListOffsets by time: the first offset (control records count) at or above the
        log start whose timestamp is ≥ `timestamp`."""
        hits = [r.offset for r in self.records[tp] if r.timestamp >= timestamp and r.offset >= self.log_start[tp]]
        return min(hits) if hits else None


def build_sample(path: Path, seed: int = 7) -> Sample:
    rng = random.Random(seed)
    config = BrokerConfig.load(
        overrides=["log.segment.bytes=6000", "log.index.interval.bytes=300", "num.partitions=3"], log_dirs=[path]
    )
    sample = Sample(path)
    with DataDir.open(config, now_ms=NOW_MS) as data_dir:
        data_dir.create_topic("alpha", 3, now_ms=NOW_MS)
        data_dir.create_topic("beta", 1, now_ms=NOW_MS)
        data_dir.create_topic("gamma", 2, {"message.timestamp.type": "LogAppendTime"}, now_ms=NOW_MS)
        data_dir.create_topic("__consumer_offsets", 1, now_ms=NOW_MS)
        for partition in range(3):
            tp = ("alpha", partition)
            log = data_dir.partition(*tp)
            records = sample.records.setdefault(tp, [])
            i = 0
            while i < 400:
                if tp == ("alpha", 2) and i >= 200 and not any(r.control for r in records):  # a marker amid them
                    marker = build_batch(
                        [b"\x00\x00\x00\x00\x00\x00"],
                        keys=[b"\x00\x00\x00\x01"],
                        timestamps=T0 + i * 1000,
                        is_control=True,
                        producer=ProducerState(producer_id=9, producer_epoch=0, is_transactional=True),
                    )
                    info = log.append_batches(bytes(marker), assign_offsets=True, now_ms=NOW_MS)
                    records.append(SampleRecord(info.first_offset, T0 + i * 1000, control=True))
                n = rng.randint(1, 15)
                stamps = [T0 + (i + j) * 1000 + rng.randint(-2500, 2500) for j in range(n)]
                values = [rng.randbytes(rng.randint(0, 60)) for _ in range(n)]
                keys = [None if rng.random() < 0.3 else f"key-{rng.randint(0, 9)}".encode() for _ in range(n)]
                headers = [[("h", rng.randbytes(3)), ("n", None)] if rng.random() < 0.2 else [] for _ in range(n)]
                info = log.append_records(values, keys=keys, headers=headers, timestamps=stamps, now_ms=NOW_MS)
                for j in range(n):
                    records.append(
                        SampleRecord(info.first_offset + j, stamps[j], False, keys[j], values[j], tuple(headers[j]))
                    )
                i += n
        data_dir.partition("alpha", 1).delete_records(57, now_ms=NOW_MS)
        log = data_dir.partition("beta", 0)
        info = log.append_records(
            [b"b%d" % i for i in range(100)], timestamps=[T0 + i * 500 for i in range(100)], now_ms=NOW_MS
        )
        sample.records[("beta", 0)] = [SampleRecord(info.first_offset + i, T0 + i * 500) for i in range(100)]
        for partition in range(2):
            log = data_dir.partition("gamma", partition)
            records = sample.records.setdefault(("gamma", partition), [])
            for k in range(10):
                appended_at = T0 + k * 5000
                info = log.append_records([b"g"] * 4, timestamps=[T0] * 4, now_ms=appended_at)
                records.extend(SampleRecord(info.first_offset + j, appended_at) for j in range(4))
        log = data_dir.partition("__consumer_offsets", 0)
        info = log.append_records([b"o"] * 5, keys=[b"k"] * 5, timestamps=T0, now_ms=NOW_MS)
        sample.records[("__consumer_offsets", 0)] = [SampleRecord(info.first_offset + j, T0) for j in range(5)]
        for log in data_dir.partitions():
            tp = (log.topic, log.partition)
            sample.log_start[tp] = log.log_start_offset
            sample.log_end[tp] = log.log_end_offset
    return sample


def offsets_of(table: pa.Table) -> set[tuple[str, int, int]]:
    return set(
        zip(
            table.column("topic").to_pylist(),
            table.column("partition").to_pylist(),
            table.column("offset").to_pylist(),
            strict=True,
        )
    )


def expected(sample: Sample, bounds: dict[tuple[str, int], tuple[int, int]]) -> set[tuple[str, int, int]]:
    rows: set[tuple[str, int, int]] = set()
    for tp, (lo, hi) in bounds.items():
        rows |= sample.rows(tp, lo, hi)
    return rows


def whole(sample: Sample, *tps: tuple[str, int]) -> dict[tuple[str, int], tuple[int, int]]:
    return {tp: (sample.log_start[tp], sample.log_end[tp]) for tp in tps}
