"""Spark's Kafka source options, alone and combined, against a model of the records.

Each query's rows are compared with what Spark's Kafka source semantics select, computed here
from the records the sample appended: start inclusive, end exclusive; -2/-1 for the log start
and end offsets; timestamps resolved to the first offset whose record (control records count,
as in Kafka's ListOffsets) is at or after them; `startingOffsetsByTimestampStrategy`; the
precedence `startingTimestamp` > `startingOffsetsByTimestamp` > `startingOffsets` (and the same
for the end); `failOnDataLoss`; and the refusals Spark makes for batch queries.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.pipeline.conftest import read_table
from tests.pipeline.sample import T0, Sample, build_sample, expected, offsets_of, whole

ALPHA = [("alpha", 0), ("alpha", 1), ("alpha", 2)]


@pytest.fixture(scope="module")
def sample(tmp_path_factory: pytest.TempPathFactory) -> Sample:
    return build_sample(tmp_path_factory.mktemp("options") / "data")


def query(spark, sample: Sample, **options: str) -> set[tuple[str, int, int]]:
    return offsets_of(read_table(spark, sample.path, **options))


def offsets_json(values: dict[tuple[str, int], int]) -> str:
    document: dict[str, dict[str, int]] = {}
    for (topic, partition), value in values.items():
        document.setdefault(topic, {})[str(partition)] = value
    return json.dumps(document)


# -- which partitions --------------------------------------------------------------------------------
def test_default_reads_every_record_of_the_subscribed_topics_with_their_columns(spark, sample: Sample) -> None:
    table = read_table(spark, sample.path, subscribe="alpha,beta")
    assert offsets_of(table) == expected(sample, whole(sample, *ALPHA, ("beta", 0)))
    by_offset = {(r["topic"], r["partition"], r["offset"]): r for r in table.to_pylist()}
    for tp in ALPHA:
        for record in sample.records[tp]:
            if record.control or record.offset < sample.log_start[tp]:
                continue
            row = by_offset[(*tp, record.offset)]
            assert (row["key"], row["value"], row["timestampType"]) == (record.key, record.value, 0)
            assert int(row["timestamp"].timestamp() * 1000) == record.timestamp


def test_subscribe_pattern_is_found_in_names_and_leaves_internal_topics_out(spark, sample: Sample) -> None:
    # Found anywhere in a name, as Spark's Kafka source finds it (Regex.findFirstIn)
    assert query(spark, sample, subscribePattern="^a.*") == expected(sample, whole(sample, *ALPHA))
    assert query(spark, sample, subscribePattern="alph") == expected(sample, whole(sample, *ALPHA))
    assert query(spark, sample, subscribePattern="^alph$") == set()
    everything = query(spark, sample, subscribePattern=".*")
    assert {topic for topic, _, _ in everything} == {"alpha", "beta", "gamma"}
    assert query(spark, sample, subscribe="__consumer_offsets") == set()


def test_assign_reads_the_named_partitions_internal_ones_too(spark, sample: Sample) -> None:
    rows = query(spark, sample, assign=json.dumps({"alpha": [2], "__consumer_offsets": [0]}))
    assert rows == expected(sample, whole(sample, ("alpha", 2), ("__consumer_offsets", 0)))


def test_log_append_time_topic_reports_the_append_time(spark, sample: Sample) -> None:
    table = read_table(spark, sample.path, subscribe="gamma")
    stamps = {(r["partition"], r["offset"]): int(r["timestamp"].timestamp() * 1000) for r in table.to_pylist()}
    assert set(table.column("timestampType").to_pylist()) == {1}
    for partition in (0, 1):
        for record in sample.records[("gamma", partition)]:
            assert stamps[(partition, record.offset)] == record.timestamp


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({}, "one of the options assign, subscribe or subscribePattern"),
        ({"subscribe": "alpha", "assign": '{"alpha":[0]}'}, "only one of"),
        ({"subscribe": "nope"}, "no such topic: nope"),
        ({"assign": '{"alpha":[7]}'}, "no such partition: alpha-7"),
        ({"subscribe": "alpha", "startingOffsets": "latest"}, "can't be latest for batch"),
        ({"subscribe": "alpha", "endingOffsets": "earliest"}, "can't be earliest for batch"),
        ({"subscribe": "beta", "startingOffsets": '{"beta":{"0":-1}}'}, r"beta-0 can't be latest \(-1\)"),
        ({"subscribe": "beta", "endingOffsets": '{"beta":{"0":-2}}'}, r"beta-0 can't be earliest \(-2\)"),
        ({"subscribe": "alpha", "startingOffsets": '{"alpha":{"0":5}}'}, "must name every partition read"),
        ({"subscribe": "beta", "startingTimestamp": "soon"}, "expected a single long value"),
        ({"subscribe": "beta", "minPartitions": "0"}, "minPartitions must be a positive integer"),
        (
            {"subscribe": "beta", "startingOffsets": '{"beta":{"0":60}}', "endingOffsets": '{"beta":{"0":50}}'},
            "Beginning offset 60 is after the ending offset 50",
        ),
    ],
)
def test_refused_options(spark, sample: Sample, options: dict[str, str], message: str) -> None:
    with pytest.raises(Exception, match=message):
        read_table(spark, sample.path, **options)


# -- offsets -----------------------------------------------------------------------------------------
def test_specific_offsets_start_inclusive_end_exclusive_with_minus_two_and_minus_one(spark, sample: Sample) -> None:
    start = {("alpha", 0): 17, ("alpha", 1): -2, ("alpha", 2): 150}
    end = {("alpha", 0): 230, ("alpha", 1): 300, ("alpha", 2): -1}
    rows = query(spark, sample, subscribe="alpha", startingOffsets=offsets_json(start), endingOffsets=offsets_json(end))
    assert rows == expected(
        sample,
        {("alpha", 0): (17, 230), ("alpha", 1): (57, 300), ("alpha", 2): (150, sample.log_end[("alpha", 2)])},
    )


def test_a_range_over_a_control_batch_skips_only_its_marker(spark, sample: Sample) -> None:
    marker = next(r.offset for r in sample.records[("alpha", 2)] if r.control)
    rows = query(
        spark,
        sample,
        assign='{"alpha":[2]}',
        startingOffsets=offsets_json({("alpha", 2): marker - 1}),
        endingOffsets=offsets_json({("alpha", 2): marker + 2}),
    )
    assert rows == {("alpha", 2, marker - 1), ("alpha", 2, marker + 1)}


def test_start_below_the_log_start_is_data_loss(spark, sample: Sample) -> None:
    options = {"assign": '{"alpha":[1]}', "startingOffsets": offsets_json({("alpha", 1): 10})}
    with pytest.raises(Exception, match=r"offsets \[10, 409\) were asked for, but the log holds \[57, 409\)"):
        read_table(spark, sample.path, **options)
    rows = query(spark, sample, failOnDataLoss="false", **options)
    assert rows == expected(sample, whole(sample, ("alpha", 1)))


def test_end_past_the_log_end_is_data_loss(spark, sample: Sample) -> None:
    options = {"assign": '{"beta":[0]}', "endingOffsets": offsets_json({("beta", 0): 150})}
    with pytest.raises(Exception, match="failOnDataLoss"):
        read_table(spark, sample.path, **options)
    assert query(spark, sample, failOnDataLoss="FALSE", **options) == expected(sample, whole(sample, ("beta", 0)))


def test_equal_start_and_end_read_nothing_even_below_the_log_start(spark, sample: Sample) -> None:
    options = {
        "assign": '{"alpha":[1]}',
        "startingOffsets": offsets_json({("alpha", 1): 3}),
        "endingOffsets": offsets_json({("alpha", 1): 3}),
    }
    assert query(spark, sample, **options) == set()


# -- timestamps --------------------------------------------------------------------------------------
def test_global_timestamps_start_and_end_at_the_first_record_reaching_them(spark, sample: Sample) -> None:
    start, end = T0 + 120_000, T0 + 333_000
    rows = query(spark, sample, subscribe="alpha", startingTimestamp=str(start), endingTimestamp=str(end))
    bounds = {tp: (sample.first_at(tp, start), sample.first_at(tp, end)) for tp in ALPHA}
    assert all(lo is not None and hi is not None for lo, hi in bounds.values())
    assert rows == expected(sample, bounds)  # type: ignore[arg-type]
    # Timestamps do not rise with offsets: the range holds older records and misses newer ones.
    stamps = {(tp, r.offset): r.timestamp for tp in ALPHA for r in sample.records[tp]}
    assert any(stamps[((t, p), o)] < start for t, p, o in rows)


def test_timestamps_per_partition(spark, sample: Sample) -> None:
    starts = {("alpha", 0): T0 + 50_000, ("alpha", 1): T0, ("alpha", 2): T0 + 390_000}
    ends = {("alpha", 0): T0 + 60_000, ("alpha", 1): T0 + 100_000, ("alpha", 2): T0 + 10**9}
    rows = query(
        spark,
        sample,
        subscribe="alpha",
        startingOffsetsByTimestamp=offsets_json(starts),
        endingOffsetsByTimestamp=offsets_json(ends),
    )
    bounds = {}
    for tp in ALPHA:
        lo = sample.first_at(tp, starts[tp])
        hi = sample.first_at(tp, ends[tp])
        bounds[tp] = (lo, sample.log_end[tp] if hi is None else hi)  # an end no record reaches: latest
    assert rows == expected(sample, bounds)  # type: ignore[arg-type]


def test_a_start_time_no_record_reaches_fails_unless_the_strategy_is_latest(spark, sample: Sample) -> None:
    late = str(T0 + 10**9)
    with pytest.raises(Exception, match="No offset matched from request of topic-partition"):
        read_table(spark, sample.path, subscribe="beta", startingTimestamp=late)
    assert (
        query(spark, sample, subscribe="beta", startingTimestamp=late, startingOffsetsByTimestampStrategy="latest")
        == set()
    )
    by_partition = f'{{"beta":{{"0":{late}}}}}'
    with pytest.raises(Exception, match="No offset matched"):
        read_table(spark, sample.path, subscribe="beta", startingOffsetsByTimestamp=by_partition)


def test_log_append_time_topic_by_timestamp(spark, sample: Sample) -> None:
    start = T0 + 12_000  # between the third and fourth appends
    rows = query(spark, sample, subscribe="gamma", startingTimestamp=str(start))
    assert rows == expected(
        sample,
        {tp: (sample.first_at(tp, start), sample.log_end[tp]) for tp in (("gamma", 0), ("gamma", 1))},  # type: ignore[misc]
    )
    assert len(rows) == 2 * 4 * 7


# -- precedence --------------------------------------------------------------------------------------
def test_starting_timestamp_wins_over_offsets_by_timestamp_which_wins_over_offsets(spark, sample: Sample) -> None:
    tp = ("beta", 0)
    by_ts = f'{{"beta":{{"0":{T0 + 40 * 500}}}}}'
    by_offset = '{"beta":{"0":70}}'
    all_three = query(
        spark,
        sample,
        subscribe="beta",
        startingTimestamp=str(T0 + 10 * 500),
        startingOffsetsByTimestamp=by_ts,
        startingOffsets=by_offset,
    )
    assert all_three == sample.rows(tp, 10, 100)
    two = query(spark, sample, subscribe="beta", startingOffsetsByTimestamp=by_ts, startingOffsets=by_offset)
    assert two == sample.rows(tp, 40, 100)
    assert query(spark, sample, subscribe="beta", startingOffsets=by_offset) == sample.rows(tp, 70, 100)


def test_ending_timestamp_wins_over_offsets_by_timestamp_which_wins_over_offsets(spark, sample: Sample) -> None:
    tp = ("beta", 0)
    by_ts = f'{{"beta":{{"0":{T0 + 40 * 500}}}}}'
    by_offset = '{"beta":{"0":70}}'
    all_three = query(
        spark,
        sample,
        subscribe="beta",
        endingTimestamp=str(T0 + 10 * 500),
        endingOffsetsByTimestamp=by_ts,
        endingOffsets=by_offset,
    )
    assert all_three == sample.rows(tp, 0, 10)
    assert query(
        spark, sample, subscribe="beta", endingOffsetsByTimestamp=by_ts, endingOffsets=by_offset
    ) == sample.rows(tp, 0, 40)


def test_mixed_start_by_time_and_end_by_offset(spark, sample: Sample) -> None:
    start = T0 + 200_000
    end = {("alpha", 0): 380, ("alpha", 1): -1, ("alpha", 2): 390}
    rows = query(spark, sample, subscribe="alpha", startingTimestamp=str(start), endingOffsets=offsets_json(end))
    bounds = {tp: (sample.first_at(tp, start), sample.log_end[tp] if end[tp] == -1 else end[tp]) for tp in ALPHA}
    assert rows == expected(sample, bounds)  # type: ignore[arg-type]


# -- splitting -----------------------------------------------------------------------------------------
def test_min_partitions_splits_ranges_and_reads_the_same_rows(spark, sample: Sample) -> None:
    def frame(**options: str):
        reader = spark.read.format("seglog").option("path", str(sample.path)).option("subscribe", "alpha,beta")
        for key, value in options.items():
            reader = reader.option(key, value)
        return reader.load()

    plain = frame()
    split = frame(minPartitions="40")
    assert plain.rdd.getNumPartitions() == 4  # a task per partition (its 4 or 1 segments), as Kafka's source
    assert split.rdd.getNumPartitions() >= 40
    assert (
        offsets_of(split.toArrow())
        == offsets_of(plain.toArrow())
        == expected(sample, whole(sample, *ALPHA, ("beta", 0)))
    )


def test_a_path_of_several_log_dirs(spark, sample: Sample, tmp_path: Path) -> None:
    first, second = tmp_path / "first", tmp_path / "second"
    shutil.copytree(sample.path, first)
    second.mkdir()
    shutil.move(str(first / "beta-0"), second / "beta-0")
    both = read_table(spark, f"{first},{second}", subscribe="alpha,beta")
    assert offsets_of(both) == expected(sample, whole(sample, *ALPHA, ("beta", 0)))


def test_a_mount_point_is_read_through_its_logdir_mirror(spark, sample: Sample, tmp_path: Path) -> None:
    mount_point = tmp_path / "mnt"
    mount_point.mkdir()
    log = tmp_path / "mount.log"
    with open(log, "wb") as output:
        mount = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "seglogfs.mount_tools.cli",
                "mount",
                str(sample.path),
                str(mount_point),
                "-f",
                "-o",
                f"ro,view.cache={tmp_path / 'view-cache'}",
            ],
            stdout=output,
            stderr=subprocess.STDOUT,
        )
        try:
            deadline = time.monotonic() + 30
            while not os.path.ismount(mount_point):
                assert mount.poll() is None and time.monotonic() < deadline, log.read_text()
                time.sleep(0.02)
            table = read_table(spark, mount_point, subscribe="alpha,beta", includeHeaders="true")
            direct = read_table(spark, sample.path, subscribe="alpha,beta", includeHeaders="true")
            key = ["topic", "partition", "offset"]
            assert table.sort_by([(k, "ascending") for k in key]).equals(
                direct.sort_by([(k, "ascending") for k in key])
            )
            assert offsets_of(table) == expected(sample, whole(sample, *ALPHA, ("beta", 0)))
        finally:
            subprocess.run([shutil.which("fusermount3") or "fusermount", "-u", "-z", str(mount_point)], check=False)
            mount.wait(timeout=30)
    said = log.read_text(errors="replace")
    assert mount.returncode == 0 and not re.search(r"\b(WARNING|ERROR|CRITICAL)\b|Traceback", said), said
