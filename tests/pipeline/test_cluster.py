"""The data source on `local-cluster[2,1,1024]`: two executor JVMs besides the driver, each with
its own Python workers, so the reader, its slices and the writer travel by pickle to other
processes, as on a cluster (sharing the data dir's path, as a cluster's shared file system does;
or sharing nothing but an object store: a backup read from the bucket).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cli.support import SEGLOGFS
from tests.conftest import REPO
from tests.objectstore.conftest import S3
from tests.pipeline.conftest import kafka_source_jars, read_table, stop_shared_session
from tests.pipeline.jvm import TEST_JVM_OPTIONS
from tests.pipeline.sample import T0, Sample, build_sample, expected, offsets_of, whole


@pytest.fixture(scope="module")
def cluster() -> Iterator[object]:
    from pyspark.sql import SparkSession

    from seglogfs.pipeline import register

    os.environ["PYSPARK_PYTHON"] = sys.executable
    stop_shared_session()  # (one SparkContext per process: getOrCreate would return the local[2] one)
    session = (
        SparkSession.builder.master("local-cluster[2,1,1024]")
        .appName("seglogfs-pipeline-cluster")
        .config("spark.ui.enabled", "false")
        .config("spark.driver.extraJavaOptions", TEST_JVM_OPTIONS)
        .config("spark.executor.extraJavaOptions", TEST_JVM_OPTIONS)
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.pyspark.python", sys.executable)
        # (The process's JVM starts with the first session's jars: Spark's Kafka source too, for
        # the shared session the tests after this one take.)
        .config("spark.jars", ",".join(kafka_source_jars()))
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    register(session)
    yield session
    session.stop()


@pytest.fixture(scope="module")
def sample(tmp_path_factory: pytest.TempPathFactory) -> Sample:
    return build_sample(tmp_path_factory.mktemp("cluster") / "data")


def test_reads_pushdown_and_writes_across_executor_processes(cluster, sample: Sample, tmp_path: Path) -> None:
    pids = set(cluster.sparkContext.parallelize(range(8), 8).map(lambda _: os.getppid()).collect())
    assert len(pids) == 2 and os.getpid() not in pids  # Python workers of two executor JVMs
    alpha = [("alpha", 0), ("alpha", 1), ("alpha", 2)]
    table = read_table(cluster, sample.path, subscribe="alpha", minPartitions="8")
    assert offsets_of(table) == expected(sample, whole(sample, *alpha))
    bound = T0 + 300_000
    late = (
        cluster.read.format("seglog")
        .option("path", str(sample.path))
        .option("subscribe", "alpha")
        .load()
        .where(f"timestamp >= timestamp_millis({bound})")
        .toArrow()
    )
    assert offsets_of(late) == {
        (topic, partition, r.offset)
        for topic, partition in alpha
        for r in sample.records[(topic, partition)]
        if not r.control and r.timestamp >= bound and r.offset >= sample.log_start[(topic, partition)]
    }
    target = tmp_path / "written"
    frame = cluster.createDataFrame([(r["key"], r["value"]) for r in table.to_pylist()], "key binary, value binary")
    frame.repartition(4).write.format("seglog").option("path", str(target)).option("topic", "copy").mode(
        "append"
    ).save()
    copy = read_table(cluster, target, subscribe="copy")
    assert Counter(zip(copy.column("key").to_pylist(), copy.column("value").to_pylist(), strict=True)) == Counter(
        zip(table.column("key").to_pylist(), table.column("value").to_pylist(), strict=True)
    )


def test_executors_read_a_bucket_after_the_data_dir_is_gone(cluster, s3: S3, tmp_path: Path) -> None:
    """A data dir backed up to object storage and then removed: only the S3 server can serve it,
    and the executors (no path in common with the driver) read it, a start by timestamp too."""
    sample = build_sample(tmp_path / "data")
    done = subprocess.run(
        [SEGLOGFS, "backup", str(sample.path), s3.uri()], cwd=REPO, capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr
    shutil.rmtree(sample.path)
    alpha = [("alpha", 0), ("alpha", 1), ("alpha", 2)]
    table = read_table(cluster, s3.uri_with_keys(), subscribe="alpha", minPartitions="8", includeHeaders="true")
    assert offsets_of(table) == expected(sample, whole(sample, *alpha))
    bound = T0 + 300_000
    late = read_table(cluster, s3.uri_with_keys(), subscribe="alpha", startingTimestamp=str(bound))
    assert offsets_of(late) == expected(
        sample, {tp: (sample.first_at(tp, bound) or sample.log_end[tp], sample.log_end[tp]) for tp in alpha}
    )
    assert 0 < late.num_rows < table.num_rows
