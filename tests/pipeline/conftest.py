"""Spark for the pipeline tests: one local[2] SparkSession per test process (started by the
first test that asks for it, stopped at the end of the run), with `format("seglog")` registered,
executors running this interpreter, and the tasks' byte counts written to a directory the tests
read (`ReadMetrics`).

One session, not one per module: a new session's first query starts new Python workers, which
took 9-12 CPU-s against 1 for the next query (and xdist hands each worker a share of every
module's tests, so per-module sessions were started about three times per module). A test that
changes the session's state puts it back (a conf it set, a temporary view, a cached frame, a
streaming query). A test that needs another master (test_cluster) stops this session first with
`stop_shared_session`; the next test that asks for `spark` starts it again."""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import pyarrow as pa
import pytest

from seglogfs.pipeline.reading import METRICS_ENV, METRICS_FILE
from tests.conftest import REPO
from tests.objectstore.conftest import s3, s3_server  # noqa: F401 (fixtures: an S3 server for reads from a bucket)
from tests.pipeline.jvm import TEST_JVM_OPTIONS

# Spark gives a Python worker it starts (a source's planning, a stream's offsets) a fixed 10 s
# to connect back, with no setting to change it; on a loaded two-core machine (three test
# workers, their mounts and JVMs) a start took longer. A Spark test that fails with exactly
# that runs once more; any other failure, or that one twice, fails it.
SPARK_WORKER_START = r"Python worker failed to connect back"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.nodeid.startswith("tests/pipeline/"):
            item.add_marker(pytest.mark.flaky(reruns=1, only_rerun=[SPARK_WORKER_START]))


# Spark's Kafka source (spark-sql-kafka, resolved by scripts/dev setup), for the interop test that
# reads the same topics through it and through `format("seglog")`. pyspark starts one JVM per
# process and keeps it across sessions, so every session here starts with it: whichever module
# a test worker runs first starts the JVM. Only the jars pyspark does not bring itself (its own
# Scala, Hadoop and compression jars are newer).
KAFKA_SOURCE_CLASSPATH = REPO / "build" / "interop" / "spark-sql-kafka-4.2.0.classpath"
KAFKA_SOURCE_JARS = ("spark-sql-kafka-", "spark-token-provider-kafka-", "kafka-clients-", "commons-pool2-")


def kafka_source_jars() -> list[str]:
    if not KAFKA_SOURCE_CLASSPATH.is_file():
        return []
    jars = KAFKA_SOURCE_CLASSPATH.read_text().strip().split(":")
    return [jar for jar in jars if Path(jar).name.startswith(KAFKA_SOURCE_JARS)]


class ReadMetrics:
    """What the tasks of the last queries read: one entry per slice (see pipeline.reading)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def clear(self) -> None:
        (self.directory / METRICS_FILE).unlink(missing_ok=True)

    def entries(self) -> list[dict]:
        path = self.directory / METRICS_FILE
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text().splitlines()]

    def bytes(self) -> int:
        return sum(entry["bytes"] for entry in self.entries())


@pytest.fixture(scope="session")
def metrics(tmp_path_factory: pytest.TempPathFactory) -> ReadMetrics:
    """One directory for the whole run: pyspark keeps its JVM (and the environment it started
    with) across the sessions of successive modules."""
    return ReadMetrics(tmp_path_factory.mktemp("read-metrics"))


def _shared_session(metrics: ReadMetrics) -> object:
    from pyspark.sql import SparkSession

    from seglogfs.pipeline import register

    active = SparkSession.getActiveSession()
    if active is not None and active.sparkContext.master == "local[2]":
        return active
    # The executors' Python workers inherit the environment the JVM starts with.
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    os.environ[METRICS_ENV] = str(metrics.directory)
    session = (
        SparkSession.builder.master("local[2]")
        .appName("seglogfs-pipeline-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.driver.extraJavaOptions", TEST_JVM_OPTIONS)
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.session.timeZone", "UTC")
        .config(f"spark.executorEnv.{METRICS_ENV}", str(metrics.directory))
        # Python workers on a Unix socket (the README's advice for short queries); the cluster
        # test keeps Spark's default, TCP on loopback.
        .config("spark.python.unix.domain.socket.enabled", "true")
        .config("spark.jars", ",".join(kafka_source_jars()))
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    register(session)
    return session


def stop_shared_session() -> None:
    """Stop the local[2] session if one runs (for a test that starts Spark with another master)."""
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is not None:
        active.stop()


def pytest_sessionfinish(session: pytest.Session) -> None:
    """The shared session stops at the end of the run (in each xdist worker), if one was started."""
    if "pyspark.sql" in sys.modules:
        stop_shared_session()


@pytest.fixture(scope="module")
def spark(metrics: ReadMetrics) -> object:
    return _shared_session(metrics)


def read_table(spark, path: Path | str, **options: str) -> pa.Table:
    """`spark.read.format("seglog")` with `options`, collected as an Arrow table."""
    reader = spark.read.format("seglog").option("path", str(path))
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load().toArrow()


def copy_tree(source: Path, target: Path) -> Path:
    shutil.copytree(source, target)
    return target
