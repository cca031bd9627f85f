"""The planner and the task reader without Spark: offsets fixed at planning, whole batches
only, segment files that change under a planned query, splitting, and the column builders
checked against plain Python."""

from __future__ import annotations

import datetime as dt
import itertools
import os
import random
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from kafka.partitioner.default import murmur2 as kafka_python_murmur2
from pyspark.sql.datasource import EqualTo, GreaterThan, GreaterThanOrEqual, In, LessThan, LessThanOrEqual, Not

from seglogfs.engine import BrokerConfig, DataDir
from seglogfs.pipeline.filters import push_filters
from seglogfs.pipeline.options import Earliest, Latest, Location, parse_engine_settings, parse_read_options
from seglogfs.pipeline.partitioning import partitions_for_keys
from seglogfs.pipeline.planning import (
    Constraints,
    DataLossError,
    OffsetRange,
    group_slices,
    narrow_ranges,
    plan_slices,
    resolve_ranges,
)
from seglogfs.pipeline.reading import ReadSpec, binary_column, read_slice
from tests.pipeline.sample import NOW_MS, T0, Sample, build_sample


@pytest.fixture
def sample(tmp_path: Path) -> Sample:
    return build_sample(tmp_path / "data")


def open_read_only(path: Path) -> DataDir:
    return DataDir.open(BrokerConfig.load(log_dirs=[path]), read_only=True, now_ms=NOW_MS)


def plan(path: Path, topics: list[tuple[str, int]], *, min_partitions: int | None = None, fail: bool = True):
    with open_read_only(path) as data_dir:
        ranges = resolve_ranges(data_dir, topics, Earliest(), Latest(), fail_on_data_loss=fail)
        return plan_slices(data_dir, ranges, min_partitions=min_partitions)


def read_offsets(path: Path, slices, *, fail: bool = True) -> list[tuple[str, int, int]]:
    spec = ReadSpec(Location((path,)), parse_engine_settings({}), fail_on_data_loss=fail)
    out = []
    for piece in slices:
        for batch in read_slice(piece, spec):
            out.extend(
                zip(
                    batch.column("topic").to_pylist(),
                    batch.column("partition").to_pylist(),
                    batch.column("offset").to_pylist(),
                    strict=True,
                )
            )
    return out


def test_offsets_are_fixed_when_planned_and_only_whole_batches_are_read(sample: Sample) -> None:
    slices = plan(sample.path, [("beta", 0)])
    config = BrokerConfig.load(log_dirs=[sample.path])
    with DataDir.open(config, now_ms=NOW_MS) as data_dir:  # a writer, after planning
        data_dir.partition("beta", 0).append_records([b"late"] * 10, now_ms=NOW_MS)
    assert read_offsets(sample.path, slices) == sorted(sample.rows(("beta", 0), 0, 100))
    # A batch being written (half of it on disk) is not read, and not counted in the log end.
    active = sample.path / "beta-0" / "00000000000000000000.log"
    tail = active.read_bytes()[-200:]
    with open(active, "ab") as log:
        log.write(tail[:100])
    fresh = plan(sample.path, [("beta", 0)])
    assert [o for _, _, o in read_offsets(sample.path, fresh)] == list(range(110))


def test_a_segment_file_replaced_after_planning_is_read_through_the_log(sample: Sample, tmp_path: Path) -> None:
    slices = plan(sample.path, [("alpha", 0)])
    first = sample.path / "alpha-0" / "00000000000000000000.log"
    copy = tmp_path / "copy.log"
    shutil.copyfile(first, copy)
    os.replace(copy, first)  # same bytes, another file: what a compaction swap leaves
    assert read_offsets(sample.path, slices) == sorted(sample.rows(("alpha", 0), 0, 10**9))


def test_offsets_deleted_while_a_query_runs_are_data_loss(sample: Sample) -> None:
    slices = plan(sample.path, [("alpha", 0)])
    config = BrokerConfig.load(log_dirs=[sample.path])
    with DataDir.open(config, now_ms=NOW_MS) as data_dir:
        data_dir.partition("alpha", 0).delete_records(300, now_ms=NOW_MS)
        data_dir.partition("alpha", 0).delete_pending(NOW_MS, all_of_them=True)
    with pytest.raises(DataLossError, match="deleted while the query ran"):
        read_offsets(sample.path, slices)
    # The segments wholly below the new log start are gone: skipped. The one holding offset 300
    # is the file planning saw: read whole, as it was when the query was planned.
    kept = next(piece for piece in slices if piece.from_offset <= 300 < piece.until_offset)
    assert kept.from_offset < 300
    assert read_offsets(sample.path, slices, fail=False) == sorted(sample.rows(("alpha", 0), kept.from_offset, 10**9))


def test_min_partitions_cuts_at_batch_starts_and_covers_each_range(sample: Sample) -> None:
    whole = plan(sample.path, [("alpha", 0), ("beta", 0)])
    split = plan(sample.path, [("alpha", 0), ("beta", 0)], min_partitions=30)
    assert len(whole) == 5 and len(split) >= 30
    for piece in split:
        assert piece.start_position < piece.end_position and piece.from_offset < piece.until_offset
    by_segment: dict[tuple[str, int, int], list] = {}
    for piece in split:
        by_segment.setdefault((piece.topic, piece.partition, piece.base_offset), []).append(piece)
    for original in whole:
        parts = by_segment[(original.topic, original.partition, original.base_offset)]
        assert parts[0].start_position == original.start_position and parts[-1].end_position == original.end_position
        assert parts[0].from_offset == original.from_offset and parts[-1].until_offset == original.until_offset
        for before, after in itertools.pairwise(parts):
            assert before.end_position == after.start_position and before.until_offset == after.from_offset
    assert read_offsets(sample.path, split) == read_offsets(sample.path, whole)


def test_tasks_read_consecutive_slices_of_one_partition_up_to_a_size(sample: Sample) -> None:
    whole = plan(sample.path, [("alpha", 0), ("alpha", 1), ("beta", 0)])
    tasks = group_slices(whole, None)
    assert [tuple((p.topic, p.partition) for p in task) for task in tasks] == [
        (("alpha", 0),) * 4,
        (("alpha", 1),) * 4,
        (("beta", 0),),
    ]
    assert [piece for task in tasks for piece in task] == whole
    largest = max(piece.size_bytes for piece in whole)
    small = group_slices(whole, None, task_bytes=largest * 2)
    assert all(sum(p.size_bytes for p in task) <= largest * 2 for task in small) and len(small) > len(tasks)
    assert [piece for task in small for piece in task] == whole
    assert group_slices(whole, 3) == [(piece,) for piece in whole]  # minPartitions: as planned


def test_narrowing_by_time_starts_at_the_first_record_reaching_the_bound(sample: Sample) -> None:
    bound = T0 + 250_000
    with open_read_only(sample.path) as data_dir:
        ranges = resolve_ranges(data_dir, [("alpha", 0), ("alpha", 2)], Earliest(), Latest())
        narrowed = narrow_ranges(data_dir, ranges, Constraints(timestamp_lo_ms=bound))
    assert [(r.topic, r.partition, r.from_offset) for r in narrowed] == [
        ("alpha", 0, sample.first_at(("alpha", 0), bound)),
        ("alpha", 2, sample.first_at(("alpha", 2), bound)),
    ]
    in_list = narrow_ranges(
        open_read_only(sample.path),
        [OffsetRange("alpha", 0, 0, 403)],
        Constraints(offsets_in=frozenset({3, 5, 900, 350})),
    )
    assert [(r.from_offset, r.until_offset) for r in in_list] == [(3, 6), (350, 351)]


def test_filters_become_exact_bounds() -> None:
    at = dt.datetime(2023, 11, 14, 22, 13, 20, 500, tzinfo=dt.UTC)  # 1_700_000_000_000 ms + 500 µs
    ms = 1_700_000_000_000
    constraints, rest = push_filters(
        [
            GreaterThanOrEqual(("timestamp",), at),
            LessThanOrEqual(("timestamp",), at + dt.timedelta(seconds=1)),
            GreaterThan(("offset",), 9),
            LessThan(("offset",), 20),
            In(("partition",), [0, 2, None]),
            EqualTo(("topic",), "t"),
            Not(EqualTo(("partition",), 1)),
            EqualTo(("offset",), 1.5),
            EqualTo(("key",), b"k"),
        ]
    )
    assert constraints == Constraints(
        topics=frozenset({"t"}),
        partitions=frozenset({0, 2}),
        offset_lo=10,
        offset_hi=20,
        timestamp_lo_ms=ms + 1,  # ≥ x.0005 s: the next whole millisecond
        timestamp_hi_ms=ms + 1001,  # ≤ x+1.0005 s: up to and with x+1.000
    )
    assert [type(f).__name__ for f in rest] == ["Not", "EqualTo", "EqualTo"]


def test_option_precedence_and_defaults() -> None:
    options = parse_read_options(
        {
            "path": "/nowhere",
            "subscribe": "t",
            "STARTINGOFFSETS": "earliest",
            "startingOffsetsByTimestamp": '{"t":{"0":5}}',
            "startingTimestamp": "7",
            "endingOffsetsByTimestamp": '{"t":{"0":9}}',
            "endingOffsets": "latest",
        }
    )
    assert options.starting == type(options.starting)(7)  # the global timestamp wins
    assert dict(options.ending.timestamps) == {("t", 0): 9}  # type: ignore[union-attr]
    assert options.fail_on_data_loss and options.starting_strategy == "error" and options.min_partitions is None


def test_vectorised_partitioner_is_kafkas() -> None:
    rng = random.Random(5)
    keys = [None if rng.random() < 0.1 else rng.randbytes(rng.randint(0, 50)) for _ in range(4000)]
    array = pa.array(keys, pa.binary()).slice(3)
    for partitions in (1, 3, 12):
        expected = [-1 if k is None else (kafka_python_murmur2(k) & 0x7FFFFFFF) % partitions for k in keys[3:]]
        assert partitions_for_keys(array, partitions).tolist() == expected


def test_binary_column_is_the_slices_it_names() -> None:
    rng = random.Random(3)
    pieces, expected = [], []
    for _ in range(4):
        buffer = rng.randbytes(5000)
        starts = np.array([rng.randint(0, 4900) for _ in range(500)], np.int64)
        lengths = np.array([rng.choice([-1, 0, 1, 12, 13, 40, 99]) for _ in range(500)], np.int64)
        pieces.append((buffer, starts, lengths))
        expected += [
            None if n < 0 else buffer[s : s + n] for s, n in zip(starts.tolist(), lengths.tolist(), strict=True)
        ]
    column = binary_column(pieces)
    assert column.type == pa.binary() and column.to_pylist() == expected
    column.validate(full=True)
    assert binary_column([]).to_pylist() == []
    with pytest.raises(ValueError, match="outside the section"):
        binary_column([(b"short", np.array([3], np.int64), np.array([4], np.int64))])


def test_arrow_schemas_are_what_spark_expects_of_a_python_data_source() -> None:
    from pyspark.sql.pandas.types import to_arrow_schema

    from seglogfs.pipeline.reading import ARROW_SCHEMA, ARROW_SCHEMA_WITH_HEADERS
    from seglogfs.pipeline.source import spark_schema

    # (Spark's check, records_to_arrow_batches: the declared schema converted with timezone UTC)
    assert to_arrow_schema(spark_schema(False), timezone="UTC").equals(ARROW_SCHEMA)
    assert to_arrow_schema(spark_schema(True), timezone="UTC").equals(ARROW_SCHEMA_WITH_HEADERS)


def test_a_damaged_batch_length_in_a_sealed_segment_fails_the_read(tmp_path: Path) -> None:
    """A slice of a sealed segment whose batch has a length field no batch can have: the read
    fails naming the file and position (the task's error), rather than ending the slice there
    and leaving out the records after it."""
    from seglogfs.engine.errors import CorruptRecordError
    from tests.engine.test_log import damage_batch_length

    path = tmp_path / "data"
    config = BrokerConfig.load(overrides=["log.segment.bytes=3000"], log_dirs=[path])
    with DataDir.open(config, now_ms=NOW_MS) as data_dir:
        data_dir.create_topic("t", 1, now_ms=NOW_MS)
        for n in range(60):
            data_dir.partition("t", 0).append_records([b"record-%d-" % n + b"x" * 100], now_ms=NOW_MS)
    slices = plan(path, [("t", 0)])
    assert len(slices) > 2 and slices[0].sealed and not slices[-1].sealed
    first = path / "t-0" / "00000000000000000000.log"
    position = damage_batch_length(first, 3, 10)
    with pytest.raises(CorruptRecordError, match=rf"{first.name}: .* at position {position}: a batch is cut short"):
        read_offsets(path, slices[:1])
    # Planned after the damage: a sealed segment's slice ends at its file's end, not at the
    # damage (where its batch headers stop), and the read says so.
    replanned = plan(path, [("t", 0)])
    assert replanned[0].end_position == first.stat().st_size
    with pytest.raises(CorruptRecordError, match=rf"at position {position}: a batch is cut short"):
        read_offsets(path, replanned[:1])
