"""Filters offered to the source: the same rows as Spark filtering a read that is offered none.

Every query runs twice, with the option `pushFilters=false` and without; rows must be identical.
The source pushes none of the filters it is offered (Spark 4.3 answers a DataFrame's later
queries from the plan made with one query's pushed filters: see `source.PushdownSeglogReader`),
so a filtered query reads what an unfiltered one reads (`ReadMetrics`).
"""

from __future__ import annotations

import pytest

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
    cached = spark.createDataFrame(table).cache()
    yield cached, metrics.bytes()
    cached.unpersist()  # (the session outlives the module)


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
    assert pushed_bytes == full_bytes
