"""`kafka.isolation.level=read_committed` in the Spark source, batch and streaming, on the
transactional corpus of tests/cli/test_transactions.py (kafka-python's builder, hand-made
markers): the rows are exactly the committed records below the last stable offset, as the test's
own model computes them and as `consume --isolation-level read_committed` prints them."""

from __future__ import annotations

from pathlib import Path

import pytest

from seglogfs.engine import BrokerConfig, DataDir
from tests.cli.test_transactions import COMMIT, Model, build_corpus
from tests.cli.test_transactions import consume as consume_values
from tests.conftest import NOW_MS
from tests.pipeline.test_streaming import Batches, run_available_now


def read(spark, data: Path, **options: str) -> list[bytes]:
    reader = spark.read.format("seglog").option("path", str(data)).option("subscribe", "txn")
    for key, value in options.items():
        reader = reader.option(key, value)
    return [bytes(row.value) for row in reader.load().orderBy("offset").collect()]


def append(data: Path, batch: bytes) -> None:
    with DataDir.open(BrokerConfig.load(log_dirs=[data]), now_ms=NOW_MS) as data_dir:
        data_dir.partition("txn", 0).append_batches(batch, assign_offsets=True, now_ms=NOW_MS)


def test_a_batch_read_committed_holds_exactly_the_committed_records(spark, tmp_path: Path) -> None:
    data = tmp_path / "data"
    model = build_corpus(data)
    committed = read(spark, data, **{"kafka.isolation.level": "read_committed"})
    assert committed == model.committed() == consume_values(data, "--isolation-level", "read_committed")
    assert read(spark, data) == model.all_values  # read_uncommitted, the default
    assert read(spark, data, **{"kafka.isolation.level": "read_uncommitted"}) == model.all_values
    # An explicit end past the last stable offset: data not readable yet, as Spark would fail to
    # fetch it; cut to what is committed with failOnDataLoss=false.
    options = {"kafka.isolation.level": "read_committed", "endingOffsets": '{"txn":{"0":19}}'}
    with pytest.raises(Exception, match="last stable offset"):
        read(spark, data, **options)
    assert read(spark, data, failOnDataLoss="false", **options) == model.committed()


def test_a_bad_isolation_level_is_refused(spark, tmp_path: Path) -> None:
    data = tmp_path / "data"
    build_corpus(data)
    with pytest.raises(Exception, match=r"kafka\.isolation\.level must be read_uncommitted or read_committed"):
        read(spark, data, **{"kafka.isolation.level": "serializable"})


def test_a_stream_read_committed_sees_a_transaction_when_it_commits(spark, tmp_path: Path) -> None:
    data = tmp_path / "data"
    model: Model = build_corpus(data)
    checkpoint, sink = tmp_path / "checkpoint", Batches()
    options = {"subscribe": "txn", "startingOffsets": "earliest", "kafka.isolation.level": "read_committed"}
    run_available_now(spark, data, checkpoint, sink, **options)
    assert [value for *_, value in sink.rows()] == model.committed()  # up to p3's open transaction
    seen = len(sink.rows())
    append(data, model.marker(3, COMMIT))
    run_available_now(spark, data, checkpoint, sink, **options)
    assert [value for *_, value in sink.rows()][seen:] == [b"p3-e-0", b"plain-3", b"p1-f-0"]
    assert [value for *_, value in sink.rows()] == model.committed()
