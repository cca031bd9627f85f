"""`format("seglog")` over a backup in object storage (`path` = `s3://bucket/prefix`, s3proxy on
loopback): the rows and every column equal the same read of the data dir backed up, for each
kind of option; a `startingTimestamp` for the last records fetches only the ranges that hold
them; a stream reads each new backup run's records once, in order; a write to a URI is refused.
(The reads across executor processes, after the data dir was removed: test_cluster.)"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pyarrow as pa
import pytest

from seglogfs.engine import BrokerConfig, DataDir
from seglogfs.pipeline.reading import FETCHES_FILE
from tests.cli.support import SEGLOGFS
from tests.conftest import REPO
from tests.objectstore.conftest import S3
from tests.pipeline.conftest import ReadMetrics, read_table
from tests.pipeline.sample import T0, Sample, build_sample
from tests.pipeline.test_streaming import Batches, append, finish, new_data_dir


def backup(data: Path, s3: S3, prefix: str = "backup") -> None:
    done = subprocess.run(
        [SEGLOGFS, "backup", str(data), s3.uri(prefix)], cwd=REPO, capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr


def ordered(table: pa.Table) -> list[dict]:
    return sorted(table.to_pylist(), key=lambda row: (row["topic"], row["partition"], row["offset"]))


def fetched(metrics: ReadMetrics) -> dict[str, int]:
    """Bytes fetched from the store since `metrics.clear_fetches()`, by planning and by tasks."""
    path = metrics.directory / FETCHES_FILE
    out = {"planning": 0, "task": 0}
    if path.exists():
        for line in path.read_text().splitlines():
            entry = json.loads(line)
            out[entry["where"]] += entry["bytes"]
    return out


@pytest.fixture(scope="module")
def sample(tmp_path_factory: pytest.TempPathFactory) -> Sample:
    return build_sample(tmp_path_factory.mktemp("stored") / "data")


OPTIONS = [
    {"subscribe": "alpha,beta,gamma", "includeHeaders": "true"},
    {"subscribePattern": "a.*|g.*"},
    {"assign": json.dumps({"alpha": [0, 2], "gamma": [1]})},
    {"subscribe": "alpha", "startingOffsets": json.dumps({"alpha": {"0": 50, "1": -2, "2": 120}})},
    {"subscribe": "alpha", "endingOffsets": json.dumps({"alpha": {"0": 80, "1": -1, "2": 130}})},
    {"subscribe": "alpha,beta", "startingTimestamp": str(T0 + 200_000), "startingOffsetsByTimestampStrategy": "latest"},
    {"subscribe": "alpha", "startingOffsetsByTimestamp": json.dumps({"alpha": {"0": T0 + 100_000, "1": T0, "2": -2}})},
    {"subscribe": "alpha", "kafka.isolation.level": "read_committed", "minPartitions": "7"},
]


def test_a_read_of_the_bucket_is_the_read_of_the_data_dir(spark, s3: S3, sample: Sample) -> None:
    backup(sample.path, s3)
    for options in OPTIONS:
        local = read_table(spark, sample.path, **options)
        stored = read_table(spark, s3.uri_with_keys(), **options)
        assert local.num_rows > 0, options
        assert ordered(stored) == ordered(local), options
    frame = spark.read.format("seglog").option("path", s3.uri_with_keys()).option("subscribe", "alpha").load()
    assert frame.where("offset >= 100").count() < frame.count()  # (one frame, several queries)
    assert frame.count() == read_table(spark, sample.path, subscribe="alpha").num_rows


def test_a_start_by_timestamp_fetches_the_ranges_that_hold_the_last_records(
    spark, s3: S3, metrics: ReadMetrics, tmp_path: Path
) -> None:
    data = tmp_path / "data"
    records = 150_000
    config = BrokerConfig.load(overrides=["log.segment.bytes=16777216"], log_dirs=[data])
    with DataDir.open(config, now_ms=T0) as data_dir:
        data_dir.create_topic("big", 2, now_ms=T0)
        for partition in (0, 1):
            log = data_dir.partition("big", partition)
            for start in range(0, records, 100):  # (batches of 21 KB, as producers send)
                log.append_records(
                    [b"%08d" % n + b"v" * 200 for n in range(start, start + 100)],
                    timestamps=[T0 + n for n in range(start, start + 100)],
                    now_ms=T0,
                )
    backup(data, s3)
    segment_bytes = sum(log.stat().st_size for log in data.glob("big-*/*.log"))
    metrics.clear()
    (metrics.directory / FETCHES_FILE).unlink(missing_ok=True)
    last = read_table(spark, s3.uri_with_keys(), subscribe="big", startingTimestamp=str(T0 + records - records // 100))
    assert last.num_rows == 2 * records // 100
    used = fetched(metrics)
    assert used["task"] + used["planning"] < 0.03 * segment_bytes, (used, segment_bytes)
    assert used["task"] > 0
    assert used["planning"] == 0  # (index objects, the catalogue and its summaries only)


def test_a_stream_reads_each_new_backup_run_once(spark, s3: S3, tmp_path: Path) -> None:
    data = new_data_dir(tmp_path / "data", {"events": 2})
    counts = {("events", 0): 0, ("events", 1): 0}
    sink = Batches()
    checkpoint = tmp_path / "checkpoint"
    for round_ in range(3):
        for partition in (0, 1):
            append(data, "events", partition, 40 + round_)
            counts[("events", partition)] += 40 + round_
        backup(data, s3)
        query = (
            spark.readStream.format("seglog")
            .option("path", s3.uri_with_keys())
            .option("subscribe", "events")
            .option("startingOffsets", "earliest")
            .load()
            .writeStream.foreachBatch(sink)
            .option("checkpointLocation", str(checkpoint))
            .trigger(availableNow=True)
            .start()
        )
        finish(query)
        assert sink.by_partition() == {tp: list(range(count)) for tp, count in counts.items()}


def test_a_write_to_a_bucket_is_refused_with_where_to_write(spark, s3: S3) -> None:
    frame = spark.createDataFrame([("t", b"v")], "topic string, value binary")
    with pytest.raises(Exception, match="object storage is read, not written"):
        frame.write.format("seglog").mode("append").option("path", s3.uri_with_keys()).save()
