"""Pushed-down filters: the same rows as Spark filtering an unpushed read, with fewer bytes read.

Every query runs twice, with the option `pushFilters=false` (Spark filters what the source
returns) and without (the source narrows its plan through the indexes and checks the rest per
record); rows must be identical. The tasks' byte counts (`ReadMetrics`) show what was read.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from seglogfs.engine.naming import parse_segment_file_name
from tests.pipeline.conftest import ReadMetrics
from tests.pipeline.sample import T0, Sample, build_sample


@pytest.fixture(scope="module")
def sample(tmp_path_factory: pytest.TempPathFactory) -> Sample:
    return build_sample(tmp_path_factory.mktemp("pushdown") / "data")


def frame(spark, sample: Sample, *, pushed: bool):
    return (
        spark.read.format("seglog")
        .option("path", str(sample.path))
        .option("subscribe", "alpha,beta,gamma")
        .option("includeHeaders", "true")
        .option("pushFilters", str(pushed).lower())
        .load()
    )


def collect(data_frame) -> list[dict]:
    return sorted(data_frame.toArrow().to_pylist(), key=lambda r: (r["topic"], r["partition"], r["offset"]))


@pytest.fixture(scope="module")
def unpushed(spark, sample: Sample, metrics: ReadMetrics):
    """The whole sample read once without pushdown, kept in Spark's memory (what Spark filters
    an unpushed read into is then one cheap query per condition), and the bytes it took."""
    metrics.clear()
    table = frame(spark, sample, pushed=False).toArrow()
    return spark.createDataFrame(table).cache(), metrics.bytes()


def run(spark, sample: Sample, metrics: ReadMetrics, condition: str) -> tuple[list[dict], int, list[dict]]:
    metrics.clear()
    rows = collect(frame(spark, sample, pushed=True).where(condition))
    return rows, metrics.bytes(), metrics.entries()


def millis(offset_ms: int) -> str:
    return f"timestamp_millis({T0 + offset_ms})"


NARROWING = [
    f"timestamp >= {millis(300_000)}",
    f"timestamp > {millis(150_000)} and timestamp < {millis(152_000)}",
    f"timestamp >= timestamp_micros({(T0 + 200_000) * 1000 + 1})",  # a bound between two milliseconds
    "offset between 100 and 120",
    "offset in (5, 77, 301, 100000)",
    "offset > 390",
    "partition = 1",
    "partition in (0, 2) and offset < 50",
    "partition >= 1 and topic = 'alpha'",
    "topic = 'beta'",
    "topic in ('beta', 'gamma') and offset >= 30",
    f"timestamp >= {millis(330_000)} and key is not null",  # one pushed, one left to Spark
    f"topic = 'gamma' and timestamp >= {millis(31_000)}",  # LogAppendTime
]
CHECKED_PER_RECORD = [
    f"timestamp <= {millis(3_000)}",
    f"timestamp = {millis(20_000)}",
    "not (partition = 1)",  # not pushed
    "offset = 3 or partition = 2",  # not pushed
]


@pytest.mark.parametrize("condition", NARROWING + CHECKED_PER_RECORD)
def test_pushed_filters_give_the_rows_spark_gives(
    spark, sample: Sample, metrics: ReadMetrics, unpushed, condition: str
) -> None:
    everything, full_bytes = unpushed
    pushed, pushed_bytes, _ = run(spark, sample, metrics, condition)
    assert pushed == collect(everything.where(condition))
    assert pushed_bytes <= full_bytes
    if condition in NARROWING:
        assert pushed_bytes < full_bytes, f"{condition}: {pushed_bytes} bytes read, as many as without pushdown"


def _segment_max_timestamps(sample: Sample) -> dict[tuple[str, int, int], int]:
    """(topic, partition, base offset) → the largest record timestamp of the segment."""
    out = {}
    for (topic, partition), records in sample.records.items():
        directory = Path(sample.path) / f"{topic}-{partition}"
        bases = sorted(
            parsed[0]
            for f in directory.iterdir()
            if (parsed := parse_segment_file_name(f.name)) and parsed[1] == ".log"
        )
        for i, base in enumerate(bases):
            end = bases[i + 1] if i + 1 < len(bases) else None
            stamps = [r.timestamp for r in records if r.offset >= base and (end is None or r.offset < end)]
            out[(topic, partition, base)] = max(stamps, default=-1)
    return out


def test_a_lower_time_bound_reads_only_the_segments_that_can_hold_such_records(
    spark, sample: Sample, metrics: ReadMetrics, unpushed
) -> None:
    bound = T0 + 330_000
    condition = f"timestamp >= {millis(330_000)}"
    everything, full_bytes = unpushed
    pushed, pushed_bytes, entries = run(spark, sample, metrics, condition)
    assert pushed == collect(everything.where(condition)) and pushed
    maxima = _segment_max_timestamps(sample)
    holding = {key for key, largest in maxima.items() if largest >= bound and key[0] in ("alpha", "beta", "gamma")}
    read = {(e["topic"], e["partition"], e["base_offset"]) for e in entries}
    assert read == holding
    assert len(maxima) - 1 > len(read)  # (less __consumer_offsets, not subscribed)
    assert pushed_bytes < full_bytes / 2
