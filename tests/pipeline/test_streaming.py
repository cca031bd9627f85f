"""`spark.readStream.format("seglog")`: micro-batches see every record appended exactly once, in
offset order per partition, new topics and partitions included; a restarted query resumes at its
checkpoint; `maxOffsetsPerTrigger` cuts micro-batches, `minOffsetsPerTrigger` and
`maxTriggerDelay` hold them back; a query's progress shows the log end offsets and Spark's Kafka
metrics; `failOnDataLoss` on offsets deleted before they were read. Real local Spark: most
queries run `availableNow` (deterministic: each run ends
when it has read what was there when it started) with appends between runs; two run on a
processing-time trigger while a mount's append files or `seglogfs produce` processes append."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path

import pytest

from seglogfs.engine import BrokerConfig, DataDir
from seglogfs.pipeline import source_metrics
from tests.conftest import REPO
from tests.fs.conftest import Mount, check_mount_log

DEADLINE_S = 180  # a guard against a hang: a Spark query on a loaded two-core worker can take a minute
SEGLOGFS = [sys.executable, "-m", "seglogfs.mount_tools.cli"]


def now_ms() -> int:
    return int(time.time() * 1000)


def new_data_dir(path: Path, topics: dict[str, int]) -> Path:
    config = BrokerConfig.load(overrides=["log.segment.bytes=2000"], log_dirs=[path])
    with DataDir.open(config, now_ms=now_ms()) as data_dir:
        for topic, partitions in topics.items():
            data_dir.create_topic(topic, partitions, now_ms=now_ms())
    return path


def append(path: Path, topic: str, partition: int, count: int, partitions: int = 1) -> None:
    """`count` records to `topic`-`partition` (the topic created with `partitions` if new),
    through the engine; the data dir is closed after, its lock free."""
    config = BrokerConfig.load(overrides=["log.segment.bytes=2000"], log_dirs=[path])
    with DataDir.open(config, now_ms=now_ms()) as data_dir:
        if topic not in data_dir.topics():
            data_dir.create_topic(topic, partitions, now_ms=now_ms())
        log = next(p for p in data_dir.partition_for_append(topic, None, now_ms=now_ms()) if p.partition == partition)
        start = log.log_end_offset
        log.append_records([f"{topic}-{partition}-{start + i}".encode() for i in range(count)], now_ms=now_ms())


def delete_below(path: Path, topic: str, partition: int, offset: int) -> None:
    config = BrokerConfig.load(log_dirs=[path])
    with DataDir.open(config, now_ms=now_ms()) as data_dir:
        data_dir.partition(topic, partition).delete_records(offset, now_ms())


class Batches:
    """A foreachBatch sink: each micro-batch's rows (topic, partition, offset, value) in the order
    Spark collected them."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.batches: list[tuple[int, list[tuple[str, int, int, bytes]]]] = []
        self.arrived: list[float] = []  # time.monotonic() as each micro-batch came

    def __call__(self, frame, batch_id: int) -> None:
        rows = [(r.topic, r.partition, r.offset, bytes(r.value)) for r in frame.collect()]
        with self.lock:
            self.batches.append((batch_id, rows))
            self.arrived.append(time.monotonic())

    def rows(self) -> list[tuple[str, int, int, bytes]]:
        with self.lock:
            return [row for _, rows in self.batches for row in rows]

    def sizes(self) -> list[int]:
        with self.lock:
            return [len(rows) for _, rows in self.batches if rows]

    def by_partition(self) -> dict[tuple[str, int], list[int]]:
        out: dict[tuple[str, int], list[int]] = defaultdict(list)
        for topic, partition, offset, value in self.rows():
            assert value == f"{topic}-{partition}-{offset}".encode()
            out[(topic, partition)].append(offset)
        return dict(out)


def stream(spark, path: Path, **options: str):
    reader = spark.readStream.format("seglog").option("path", str(path))
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load()


def run_available_now(spark, path: Path, checkpoint: Path, sink: Batches, **options: str) -> None:
    finish(
        stream(spark, path, **options)
        .writeStream.foreachBatch(sink)
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )


def finish(query) -> None:
    """Wait for an availableNow query to end; its failure raised here."""
    try:
        assert query.awaitTermination(DEADLINE_S), "an availableNow query did not finish in time"
    finally:
        query.stop()
    if query.exception() is not None:
        raise query.exception()


def expected(counts: dict[tuple[str, int], int]) -> dict[tuple[str, int], list[int]]:
    return {tp: list(range(count)) for tp, count in counts.items() if count}


def test_a_query_sees_every_append_once_in_order(spark, tmp_path: Path) -> None:
    """Started before anything was appended, then run again after each round of appends (new
    partitions of a new topic matching the pattern included), the runs and the appends taking
    turns (appends during a run: the tests at the end)."""
    path = new_data_dir(tmp_path / "data", {"events": 2})
    checkpoint = tmp_path / "checkpoint"
    sink = Batches()
    options = {"subscribePattern": "ev.*", "startingOffsets": "earliest"}
    run_available_now(spark, path, checkpoint, sink, **options)
    assert sink.rows() == []
    counts = {("events", 0): 30, ("events", 1): 30}
    for partition in (0, 1):
        append(path, "events", partition, 30)
    run_available_now(spark, path, checkpoint, sink, **options)
    assert sink.by_partition() == expected(counts)
    append(path, "events", 0, 25)  # more, and a new topic matching the pattern
    append(path, "evx", 0, 7, partitions=2)
    append(path, "evx", 1, 3, partitions=2)
    append(path, "other", 0, 5)  # does not match
    counts.update({("events", 0): 55, ("evx", 0): 7, ("evx", 1): 3})
    run_available_now(spark, path, checkpoint, sink, **options)
    assert sink.by_partition() == expected(counts)  # each once, in offset order per partition


def test_a_restarted_query_resumes_at_its_checkpoint(spark, tmp_path: Path) -> None:
    path = new_data_dir(tmp_path / "data", {"orders": 2})
    checkpoint = tmp_path / "checkpoint"
    append(path, "orders", 0, 10)  # before the first run: `latest` (the default) skips these
    sink = Batches()
    run_available_now(spark, path, checkpoint, sink, subscribe="orders")
    assert sink.rows() == []
    append(path, "orders", 0, 12)
    append(path, "orders", 1, 4)
    run_available_now(spark, path, checkpoint, sink, subscribe="orders")
    assert sink.by_partition() == {("orders", 0): list(range(10, 22)), ("orders", 1): list(range(4))}
    run_available_now(spark, path, checkpoint, sink, subscribe="orders")  # nothing new: nothing again
    append(path, "orders", 1, 6)
    run_available_now(spark, path, checkpoint, sink, subscribe="orders")
    assert sink.by_partition() == {("orders", 0): list(range(10, 22)), ("orders", 1): list(range(10))}


def test_max_offsets_per_trigger_cuts_micro_batches(spark, tmp_path: Path) -> None:
    path = new_data_dir(tmp_path / "data", {"clicks": 1})
    append(path, "clicks", 0, 12)
    sink = Batches()
    options = {"subscribe": "clicks", "startingOffsets": "earliest", "maxOffsetsPerTrigger": "5"}
    run_available_now(spark, path, tmp_path / "checkpoint", sink, **options)
    assert sink.sizes() == [5, 5, 2]
    assert sink.by_partition() == {("clicks", 0): list(range(12))}


def log_end_offsets(path: Path, topic: str) -> dict[str, dict[str, int]]:
    """The log end offsets of `topic` as the offsets of Spark's Kafka source are written."""
    with DataDir.open(BrokerConfig.load(log_dirs=[path]), now_ms=now_ms()) as data_dir:
        return {topic: {str(p): data_dir.partition(topic, p).log_end_offset for p in data_dir.topics()[topic]}}


def test_progress_shows_the_log_end_offsets_and_kafka_metrics(spark, tmp_path: Path) -> None:
    """Each micro-batch's progress: `latestOffset` is the log end offsets, and `source_metrics`
    gives how far the batch's end offsets are behind them, as Spark's Kafka source reports."""
    path = new_data_dir(tmp_path / "data", {"orders": 2})
    append(path, "orders", 0, 10)
    append(path, "orders", 1, 15)
    options = {"subscribe": "orders", "startingOffsets": "earliest", "maxOffsetsPerTrigger": "7"}
    query = (
        stream(spark, path, **options)
        .writeStream.format("noop")
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    finish(query)
    sources = [progress.sources[0] for progress in query.recentProgress if progress.numInputRows]
    log_end = log_end_offsets(path, "orders")
    assert log_end == {"orders": {"0": 10, "1": 15}}
    for source in sources:
        assert json.loads(source.latestOffset) == log_end
        end = json.loads(source.endOffset)["orders"]
        behind = [log_end["orders"][p] - end[p] for p in ("0", "1")]
        assert source_metrics(source) == {
            "minOffsetsBehindLatest": str(min(behind)),
            "maxOffsetsBehindLatest": str(max(behind)),
            "avgOffsetsBehindLatest": str(sum(behind) / 2),
        }
    # 7 records of 25 shared 10:15 (Spark's rateLimit rounds each share down): 2 and 4
    assert json.loads(sources[0].endOffset) == {"orders": {"0": 2, "1": 4}}
    assert source_metrics(sources[0])["avgOffsetsBehindLatest"] == "9.5"
    assert json.loads(sources[-1].endOffset) == log_end
    assert source_metrics(json.loads(query.lastProgress.json)["sources"][0])["maxOffsetsBehindLatest"] == "0"


def start_every_200ms(spark, path: Path, checkpoint: Path, sink: Batches, **options: str):
    return (
        stream(spark, path, subscribe="events", startingOffsets="earliest", **options)
        .writeStream.foreachBatch(sink)
        .option("checkpointLocation", str(checkpoint))
        .trigger(processingTime="200 milliseconds")
        .start()
    )


def test_min_offsets_per_trigger_waits_for_records_or_max_trigger_delay(spark, tmp_path: Path) -> None:
    """The first trigger takes what is there; later ones take nothing while fewer than
    `minOffsetsPerTrigger` records wait, unless `maxTriggerDelay` has passed since the last
    micro-batch taken."""
    path = new_data_dir(tmp_path / "data", {"events": 1})
    append(path, "events", 0, 5)
    spark.conf.set("spark.sql.streaming.noDataProgressEventInterval", "0")  # a progress for every trigger
    held = Batches()
    query = start_every_200ms(spark, path, tmp_path / "held", held, minOffsetsPerTrigger="20", maxTriggerDelay="1h")
    try:
        wait_for_rows(held, 5, query)
        append(path, "events", 0, 10)
        deadline = time.monotonic() + DEADLINE_S
        while not any(  # a trigger has seen the 10 records, and taken no batch
            p.sources[0].latestOffset and json.loads(p.sources[0].latestOffset) == {"events": {"0": 15}}
            for p in query.recentProgress
        ):
            assert time.monotonic() < deadline and query.exception() is None, "no trigger saw the appends"
            time.sleep(0.05)
        assert held.sizes() == [5]
        append(path, "events", 0, 10)
        wait_for_rows(held, 25, query)
    finally:
        query.stop()
        spark.conf.unset("spark.sql.streaming.noDataProgressEventInterval")
    assert held.sizes() == [5, 20]
    assert held.by_partition() == {("events", 0): list(range(25))}

    delayed = Batches()
    query = start_every_200ms(
        spark, path, tmp_path / "delayed", delayed, minOffsetsPerTrigger="20", maxTriggerDelay="6s"
    )
    try:
        wait_for_rows(delayed, 25, query)
        append(path, "events", 0, 3)
        wait_for_rows(delayed, 28, query)
    finally:
        query.stop()
    assert delayed.sizes() == [25, 3]
    # held back until 6 s after the first micro-batch was taken (before it arrived: allow for its run)
    assert delayed.arrived[1] - delayed.arrived[0] >= 3


@pytest.mark.parametrize("option", ["endingOffsets", "endingTimestamp"])
def test_an_option_a_stream_cannot_take_fails_the_query_before_any_micro_batch(spark, tmp_path: Path, option) -> None:
    path = new_data_dir(tmp_path / "data", {"t": 1})
    value = "latest" if option == "endingOffsets" else "0"
    query = (
        stream(spark, path, subscribe="t", **{option: value})
        .writeStream.format("noop")
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .start()
    )
    with pytest.raises(Exception, match=f"OptionError: {option} option not valid for streaming queries") as failure:
        finish(query)
    assert "UnboundLocalError" not in str(failure.value)  # pyspark's own, after a streamReader() that raised
    assert query.recentProgress == []


def test_offsets_deleted_before_they_were_read(spark, tmp_path: Path) -> None:
    path = new_data_dir(tmp_path / "data", {"t": 1})
    append(path, "t", 0, 3)
    options = {"subscribe": "t", "startingOffsets": "earliest"}
    sink = Batches()
    run_available_now(spark, path, tmp_path / "strict", sink, **options)
    run_available_now(spark, path, tmp_path / "lenient", sink, **options, failOnDataLoss="false")
    append(path, "t", 0, 60)  # several segments
    delete_below(path, "t", 0, 40)
    with pytest.raises(Exception, match="failOnDataLoss"):
        run_available_now(spark, path, tmp_path / "strict", Batches(), **options)
    lenient = Batches()
    run_available_now(spark, path, tmp_path / "lenient", lenient, **options, failOnDataLoss="false")
    assert lenient.by_partition() == {("t", 0): list(range(40, 63))}


# -- appends while the query runs ---------------------------------------------------------------------
def lines(partition: int, start: int, count: int) -> bytes:
    return b"".join(b"events-%d-%d\n" % (partition, offset) for offset in range(start, start + count))


def wait_for_rows(sink: Batches, count: int, query=None) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while len(sink.rows()) < count:
        if query is not None and query.exception() is not None:
            raise query.exception()
        assert time.monotonic() < deadline, f"the query saw {len(sink.rows())} of {count} rows"
        time.sleep(0.05)


def run_while_appending(spark, path: Path, checkpoint: Path, appends, total: int) -> Batches:
    """A query (micro-batches every 200 ms) started before any append; `appends(sink)` runs once
    the query has run its first trigger; the query is stopped once it has seen `total` rows (or
    the deadline passes)."""
    sink = Batches()
    query = (
        stream(spark, path, subscribe="events", startingOffsets="earliest")
        .writeStream.foreachBatch(sink)
        .option("checkpointLocation", str(checkpoint))
        .trigger(processingTime="200 milliseconds")
        .start()
    )
    try:
        deadline = time.monotonic() + DEADLINE_S
        while query.lastProgress is None:  # the query is running before the first append
            assert time.monotonic() < deadline and query.exception() is None, "the query did not start"
            time.sleep(0.05)
        appends(sink)
        while len(sink.rows()) < total and time.monotonic() < deadline and query.exception() is None:
            time.sleep(0.2)
        query.processAllAvailable()
    finally:
        query.stop()
    if query.exception() is not None:
        raise query.exception()
    return sink


def test_a_running_query_sees_appends_through_a_mount_once(spark, tmp_path: Path) -> None:
    """Read through the mount (its `.logdir` mirror) while lines are appended to the mount's
    append files, in rounds a micro-batch apart."""
    data = new_data_dir(tmp_path / "data", {"events": 2})
    (tmp_path / "mnt").mkdir()
    m = Mount(data, tmp_path / "mnt", [])
    try:

        def appends(sink: Batches) -> None:
            for round_ in range(8):
                for partition in (0, 1):
                    with open(m.path / "events" / str(partition) / "append", "ab") as handle:
                        handle.write(lines(partition, round_ * 25, 25))
                if round_ % 2:
                    wait_for_rows(sink, (round_ + 1) * 50)

        sink = run_while_appending(spark, m.path, tmp_path / "checkpoint", appends, total=400)
    finally:
        m.stop()
    check_mount_log(m, [])
    assert sink.by_partition() == expected({("events", 0): 200, ("events", 1): 200})
    assert len([size for size in sink.sizes() if size]) > 1  # the rows came in several micro-batches


def test_a_running_query_sees_what_seglogfs_produce_appends_once(spark, tmp_path: Path) -> None:
    """Read the data dir itself while `seglogfs produce` processes append to it."""
    data = new_data_dir(tmp_path / "data", {"events": 2})

    def appends(sink: Batches) -> None:
        for round_ in range(6):
            for partition in (0, 1):
                subprocess.run(
                    [*SEGLOGFS, "produce", str(data), "--topic", "events", "--partition", str(partition)],
                    input=lines(partition, round_ * 40, 40),
                    cwd=REPO,
                    check=True,
                    capture_output=True,
                )
            if round_ % 2:
                wait_for_rows(sink, (round_ + 1) * 80)

    sink = run_while_appending(spark, data, tmp_path / "checkpoint", appends, total=480)
    assert sink.by_partition() == expected({("events", 0): 240, ("events", 1): 240})
    assert len([size for size in sink.sizes() if size]) > 1
