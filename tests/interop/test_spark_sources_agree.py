"""Spark's Kafka source beside `format("seglog")`: the same topics, read through a live broker by
Spark's own `kafka` source (spark-sql-kafka) and from that broker's log dir by `seglog`, give the
same rows, every column, for each option and combination the option tests cover; the same
failure where Spark's source fails a query; and, for a stream with `maxOffsetsPerTrigger` over
data appended between triggers, the same micro-batches.

The topics are written once, by Kafka's Java client (SparkSourcesData.java): keys and values
(some null), headers (repeated keys, empty and null values), batches uncompressed and zstd,
timestamps that do not rise with offsets, a LogAppendTime topic, a topic whose oldest segments
the broker deleted under retention, and transactions committed and aborted between a plain
producer's records. Where the two sources differ on purpose, KNOWN names the difference."""

from __future__ import annotations

import itertools
import json
import logging
import re
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.interop.conftest import CLASSPATHS, NEWEST, Broker
from tests.pipeline.conftest import SPARK_WORKER_START, kafka_source_jars, metrics, spark  # noqa: F401 (fixtures)

pytestmark = pytest.mark.flaky(reruns=1, only_rerun=[SPARK_WORKER_START])

PROGRAM = Path(__file__).with_name("SparkSourcesData.java")
TOPICS = ("sk-alpha", "sk-beta", "sk-gamma", "sk-retained", "sk-txn")
RETENTION_BYTES = 6000
SECOND = 1000
LATE = 10**9  # ms after T0: no record's timestamp reaches it

# Where the two sources differ, by case: what Spark's Kafka source does, and why seglog does not
# (the README's Spark section says so too).
KNOWN = {
    # Spark's Kafka source reads nothing from a partition that does not exist, and says nothing;
    # seglog refuses the query, naming the partition (a typo in `assign` is not an empty topic).
    "assign a partition that does not exist": "Kafka's source: 0 rows; seglog: refused, no such partition",
    # Spark's Kafka source leaves Kafka's own topics out of every subscription, even a partition
    # `assign` names, and says nothing; seglog reads a partition of one that `assign` names (the
    # way to read the transaction log or consumer offsets with Spark), and only through `assign`.
    "assign Kafka's transaction log": "Kafka's source: 0 rows; seglog: the partition's records",
}


@dataclass
class Facts:
    """What a case needs to know of the data: T0, and what only the broker knew as it wrote."""

    t0: int
    log_dir: Path
    bootstrap: str
    retained_start: int = 0  # the log start offset of sk-retained after retention
    marker: int = 0  # the offset of a transaction marker in sk-txn-0
    gamma_middle: int = 0  # a LogAppendTime timestamp in the middle of sk-gamma-0


@dataclass(frozen=True)
class Case:
    name: str
    options: Callable[[Facts], dict[str, str]]
    # Options for Spark's Kafka source only: it waits for offsets past the log end as for
    # records on their way (kafkaConsumer.pollTimeoutMs, 2 min by default), seglog does not.
    kafka_only: dict[str, str] = field(default_factory=dict)
    tasks: bool = False  # compare the number of tasks too (minPartitions)


def offsets(topic: str, values: dict[int, int]) -> str:
    return json.dumps({topic: {str(p): v for p, v in values.items()}})


def fixed(**options: str) -> Callable[[Facts], dict[str, str]]:
    return lambda facts: options


ALL = ",".join(TOPICS)
COMMITTED = {"kafka.isolation.level": "read_committed"}
UNCOMMITTED = {"kafka.isolation.level": "read_uncommitted"}
SHORT_POLL = {"kafkaConsumer.pollTimeoutMs": "5000"}

CASES = [
    # -- which partitions
    Case("subscribe every topic, with headers", fixed(subscribe=ALL, includeHeaders="true")),
    Case("subscribe two topics", fixed(subscribe="sk-alpha,sk-beta")),
    Case("subscribePattern", fixed(subscribePattern="^sk-(alpha|gamma)$", includeHeaders="true")),
    Case("subscribePattern found inside a name", fixed(subscribePattern="^sk-alph")),
    Case("assign", fixed(assign=json.dumps({"sk-alpha": [2], "sk-gamma": [0]}))),
    Case("subscribe a topic that does not exist", fixed(subscribe="sk-nope")),
    Case("assign a partition that does not exist", fixed(assign=json.dumps({"sk-beta": [3]}))),
    # Kafka's own topics: sk-txn's producers wrote the transaction log
    Case("assign Kafka's transaction log", fixed(assign='{"__transaction_state":[0]}', includeHeaders="true")),
    Case("subscribe Kafka's transaction log", fixed(subscribe="__transaction_state")),
    Case("subscribePattern over Kafka's own topics", fixed(subscribePattern="^__")),
    # -- offsets
    Case(
        "offsets JSON with -2 and -1",
        fixed(
            subscribe="sk-alpha",
            startingOffsets=offsets("sk-alpha", {0: 17, 1: -2, 2: 100}),
            endingOffsets=offsets("sk-alpha", {0: 130, 1: 140, 2: -1}),
        ),
    ),
    Case(
        "a range over a transaction marker",
        lambda f: {
            "assign": '{"sk-txn":[0]}',
            "startingOffsets": offsets("sk-txn", {0: f.marker - 1}),
            "endingOffsets": offsets("sk-txn", {0: f.marker + 2}),
        },
    ),
    Case(
        "start offsets must name every partition",
        fixed(subscribe="sk-alpha", startingOffsets=offsets("sk-alpha", {0: 5})),
    ),
    Case(
        "start after end",
        fixed(
            subscribe="sk-beta",
            startingOffsets=offsets("sk-beta", {0: 60}),
            endingOffsets=offsets("sk-beta", {0: 50}),
        ),
    ),
    Case("startingOffsets latest", fixed(subscribe="sk-beta", startingOffsets="latest")),
    Case("endingOffsets earliest", fixed(subscribe="sk-beta", endingOffsets="earliest")),
    Case("start offset -1", fixed(subscribe="sk-beta", startingOffsets=offsets("sk-beta", {0: -1}))),
    Case("end offset -2", fixed(subscribe="sk-beta", endingOffsets=offsets("sk-beta", {0: -2}))),
    # -- failOnDataLoss
    Case("start below the log start", fixed(subscribe="sk-retained", startingOffsets=offsets("sk-retained", {0: 3}))),
    Case(
        "start below the log start, failOnDataLoss=false",
        fixed(subscribe="sk-retained", startingOffsets=offsets("sk-retained", {0: 3}), failOnDataLoss="false"),
    ),
    Case(
        "equal start and end below the log start",
        fixed(
            subscribe="sk-retained",
            startingOffsets=offsets("sk-retained", {0: 3}),
            endingOffsets=offsets("sk-retained", {0: 3}),
        ),
    ),
    Case(
        "end past the log end",
        fixed(subscribe="sk-beta", endingOffsets=offsets("sk-beta", {0: 150})),
        kafka_only=SHORT_POLL,
    ),
    Case(
        "end past the log end, failOnDataLoss=false",
        fixed(subscribe="sk-beta", endingOffsets=offsets("sk-beta", {0: 150}), failOnDataLoss="false"),
        kafka_only=SHORT_POLL,
    ),
    # -- isolation levels
    Case("read_uncommitted", fixed(subscribe="sk-txn", includeHeaders="true", **UNCOMMITTED)),
    Case("read_committed", fixed(subscribe="sk-txn", includeHeaders="true", **COMMITTED)),
    Case(
        "read_committed over a range",
        lambda f: {
            "assign": '{"sk-txn":[0,1]}',
            "startingOffsets": offsets("sk-txn", {0: 2, 1: -2}),
            "endingOffsets": offsets("sk-txn", {0: f.marker + 6, 1: -1}),
            **COMMITTED,
        },
    ),
    # -- timestamps
    Case(
        "startingTimestamp and endingTimestamp",
        lambda f: {
            "subscribe": "sk-alpha",
            "startingTimestamp": str(f.t0 + 120 * SECOND),
            "endingTimestamp": str(f.t0 + 233 * SECOND),
        },
    ),
    Case(
        "timestamps per partition, an end no record reaches",
        lambda f: {
            "subscribe": "sk-alpha",
            "startingOffsetsByTimestamp": offsets("sk-alpha", {0: f.t0 + 50 * SECOND, 1: f.t0, 2: f.t0 + 290 * SECOND}),
            "endingOffsetsByTimestamp": offsets(
                "sk-alpha", {0: f.t0 + 60 * SECOND, 1: f.t0 + 100 * SECOND, 2: f.t0 + LATE}
            ),
        },
    ),
    Case("a start time no record reaches", lambda f: {"subscribe": "sk-beta", "startingTimestamp": str(f.t0 + LATE)}),
    Case(
        "a start time no record reaches, strategy latest",
        lambda f: {
            "subscribe": "sk-beta",
            "startingTimestamp": str(f.t0 + LATE),
            "startingOffsetsByTimestampStrategy": "latest",
        },
    ),
    Case(
        "a start time per partition no record reaches",
        lambda f: {"subscribe": "sk-beta", "startingOffsetsByTimestamp": offsets("sk-beta", {0: f.t0 + LATE})},
    ),
    Case(
        "a start time per partition no record reaches, strategy latest",
        lambda f: {
            "subscribe": "sk-alpha",
            "startingOffsetsByTimestamp": offsets("sk-alpha", {0: f.t0 + LATE, 1: f.t0, 2: f.t0 + 200 * SECOND}),
            "startingOffsetsByTimestampStrategy": "latest",
        },
    ),
    Case("startingTimestamp not a number", fixed(subscribe="sk-beta", startingTimestamp="soon")),
    Case(
        "LogAppendTime by timestamp",
        lambda f: {"subscribe": "sk-gamma", "startingTimestamp": str(f.gamma_middle)},
    ),
    Case(
        "read_committed by timestamp",
        lambda f: {"subscribe": "sk-txn", "startingTimestamp": str(f.t0 + 8 * SECOND), **COMMITTED},
    ),
    # -- precedence
    Case(
        "startingTimestamp over offsets by timestamp over offsets",
        lambda f: {
            "subscribe": "sk-beta",
            "startingTimestamp": str(f.t0 + 10 * 500),
            "startingOffsetsByTimestamp": offsets("sk-beta", {0: f.t0 + 40 * 500}),
            "startingOffsets": offsets("sk-beta", {0: 70}),
        },
    ),
    Case(
        "offsets by timestamp over offsets, at both ends",
        lambda f: {
            "subscribe": "sk-beta",
            "startingOffsetsByTimestamp": offsets("sk-beta", {0: f.t0 + 20 * 500}),
            "startingOffsets": offsets("sk-beta", {0: 70}),
            "endingOffsetsByTimestamp": offsets("sk-beta", {0: f.t0 + 40 * 500}),
            "endingOffsets": offsets("sk-beta", {0: 90}),
        },
    ),
    Case(
        "endingTimestamp over the others",
        lambda f: {
            "subscribe": "sk-beta",
            "endingTimestamp": str(f.t0 + 10 * 500),
            "endingOffsetsByTimestamp": offsets("sk-beta", {0: f.t0 + 40 * 500}),
            "endingOffsets": offsets("sk-beta", {0: 70}),
        },
    ),
    Case(
        "start by time, end by offset",
        lambda f: {
            "subscribe": "sk-alpha",
            "startingTimestamp": str(f.t0 + 200 * SECOND),
            "endingOffsets": offsets("sk-alpha", {0: 120, 1: -1, 2: 130}),
        },
    ),
    # -- splitting
    Case("minPartitions", fixed(subscribe="sk-alpha,sk-beta", minPartitions="7"), tasks=True),
    Case("minPartitions 0", fixed(subscribe="sk-beta", minPartitions="0")),
    # -- the options themselves
    Case("no subscription", fixed()),
    Case("subscribe and assign", fixed(subscribe="sk-beta", assign='{"sk-beta":[0]}')),
]

# A failure, by kind: how each source says it (Spark's Kafka source, seglog), tried in this order.
FAILURES = {
    "unknown topic or partition": (r"UnknownTopicOrPartitionException", r"OptionError: (subscribe|assign): no such"),
    "no offset for the timestamp": (r"No offset matched from request", r"No offset matched from request"),
    "data loss": (r"OffsetOutOfRangeException|failOnDataLoss", r"DataLossError"),
    "refused option": (
        r"IllegalArgumentException|KafkaIllegalStateException|assertion failed|requirement failed",
        r"OptionError",
    ),
}


def failure(error: Exception, side: int) -> str:
    text = f"{type(error).__name__}: {error}"
    for kind, patterns in FAILURES.items():
        if re.search(patterns[side], text):
            return kind
    causes = re.findall(r"^(?:Caused by: |\w+(?:\.\w+)*(?:Error|Exception): ).*$", text, re.MULTILINE)
    return f"unclassified failure: {text.splitlines()[0][:300]} {causes[-3:]}"


def sort_key(row: dict) -> tuple:
    return (row["topic"], row["partition"], row["offset"])


@pytest.fixture(scope="session")
def facts(session_broker: Broker) -> Facts:
    """The topics, written once per worker by Kafka's Java client, and the retention of
    sk-retained done."""
    broker = session_broker
    broker.create_topic("sk-alpha", 3, internal_segment_bytes="4096")
    broker.create_topic("sk-beta", 1)
    broker.create_topic("sk-gamma", 2, message_timestamp_type="LogAppendTime")
    broker.create_topic(
        "sk-retained", 1, internal_segment_bytes="2048", retention_bytes=str(RETENTION_BYTES), retention_ms="-1"
    )
    broker.create_topic("sk-txn", 2)
    # Timestamps in the last hour: neither retention by time nor the broker's limit on
    # timestamps ahead of its clock (message.timestamp.after.max.ms) touches them.
    t0 = (int(time.time()) - 1800) * SECOND
    kafka = broker.kafka
    command = [
        kafka.java,
        "-XX:TieredStopAtLevel=1",
        "-XX:+UseSerialGC",
        *kafka.tools_logging,
        "-cp",
        (CLASSPATHS / f"kafka-{NEWEST}.classpath").read_text().strip(),
        str(PROGRAM),
        broker.bootstrap,
        str(t0),
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, f"{PROGRAM.name} exited {done.returncode}:\n{done.stderr[-4000:]}"
    wait_for_retention(broker.log_dir / "sk-retained-0")
    return Facts(t0, broker.log_dir, broker.bootstrap)


def wait_for_retention(partition_dir: Path, timeout: float = 120) -> None:
    """Until the broker deleted what it will of sk-retained (what is left, but the first
    segment, is under retention.bytes) and the first segment left is not offset 0."""
    deadline = time.monotonic() + timeout
    while True:
        sizes = [p.stat().st_size for p in sorted(partition_dir.glob("*.log"))]
        deleted = list(partition_dir.glob("*.deleted"))
        first = min(int(p.stem) for p in partition_dir.glob("*.log"))
        if first > 0 and not deleted and sum(sizes[1:]) < RETENTION_BYTES:
            return
        assert time.monotonic() < deadline, f"the broker did not apply retention.bytes: {sizes}"
        time.sleep(0.1)


class Sources:
    """The same query through Spark's Kafka source and through seglog."""

    def __init__(self, session, facts: Facts) -> None:
        self.spark = session
        self.facts = facts

    def kafka(self, options: dict[str, str]):
        reader = self.spark.read.format("kafka").option("kafka.bootstrap.servers", self.facts.bootstrap)
        return reader.options(**options).load()

    def seglog(self, options: dict[str, str]):
        return self.spark.read.format("seglog").option("path", str(self.facts.log_dir)).options(**options).load()

    def outcome(self, case: Case) -> tuple[object, object]:
        """Per source: its rows (sorted) and, with `case.tasks`, its number of tasks; or the kind
        of its failure."""
        options = case.options(self.facts)
        results = []
        for side, frame in enumerate(
            (lambda: self.kafka({**options, **case.kafka_only}), lambda: self.seglog(options))
        ):
            try:
                df = frame()
                rows = sorted(df.toArrow().to_pylist(), key=sort_key)
                results.append((rows, df.rdd.getNumPartitions()) if case.tasks else rows)
            except Exception as error:  # (py4j's and pyspark's errors alike)
                results.append(failure(error, side))
        return results[0], results[1]


@pytest.fixture(scope="module")
def sources(spark, facts: Facts) -> Sources:  # noqa: F811 (the fixture imported above)
    if not kafka_source_jars():
        pytest.fail("Spark's Kafka source is not resolved: run scripts/dev setup")
    here = Sources(spark, facts)
    # What only the broker knew: the log start retention left, where a marker is, the broker's
    # clock on the LogAppendTime topic.
    retained = here.kafka({"subscribe": "sk-retained"}).toArrow().column("offset").to_pylist()
    facts.retained_start = min(retained)
    txn = sorted(here.kafka({"assign": '{"sk-txn":[0]}', **UNCOMMITTED}).toArrow().column("offset").to_pylist())
    facts.marker = next(a + 1 for a, b in itertools.pairwise(txn) if b != a + 1)
    gamma = sorted(here.kafka({"assign": '{"sk-gamma":[0]}'}).toArrow().to_pylist(), key=sort_key)
    facts.gamma_middle = int(gamma[len(gamma) // 2]["timestamp"].timestamp() * 1000)
    return here


def describe(outcome: object) -> str:
    if isinstance(outcome, str):
        return outcome
    rows = outcome[0] if isinstance(outcome, tuple) else outcome
    assert isinstance(rows, list)
    return f"{len(rows)} rows" + (f" in {outcome[1]} tasks" if isinstance(outcome, tuple) else "")


def first_difference(theirs: object, ours: object) -> str:
    if isinstance(theirs, list) and isinstance(ours, list):
        by_key = {sort_key(r): r for r in ours}
        for row in theirs:
            if by_key.get(sort_key(row)) != row:
                return f"\n  Kafka's: {row}\n  seglog's: {by_key.get(sort_key(row))}"
        missing = [sort_key(r) for r in ours if r not in theirs]
        return f"\n  seglog's rows Kafka's source has not: {missing[:5]}"
    return ""


@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_spark_kafka_source_and_seglog_read_the_same(sources: Sources, kafka_broker: Broker, case: Case) -> None:
    """The same rows, every column, or the same kind of failure; a known difference differs as
    KNOWN says (or comes out of it)."""
    theirs, ours = sources.outcome(case)
    if case.name in KNOWN:
        assert theirs != ours, f"the sources agree now: take {case.name!r} out of KNOWN"
        return
    assert theirs == ours, f"Kafka's source: {describe(theirs)}, seglog: {describe(ours)}" + first_difference(
        theirs, ours
    )


class Batches:
    """A stream's micro-batches, collected by foreachBatch: (batch id, rows sorted)."""

    def __init__(self) -> None:
        self.batches: list[tuple[int, list[dict]]] = []

    def __call__(self, frame, batch_id: int) -> None:
        self.batches.append((batch_id, sorted(frame.toArrow().to_pylist(), key=sort_key)))


def run_available_now(frame, checkpoint: Path, batches: Batches) -> None:
    """One run of the stream over what is there when it starts (Trigger.AvailableNow)."""
    writer = frame.writeStream.foreachBatch(batches).option("checkpointLocation", str(checkpoint))
    query = writer.trigger(availableNow=True).start()
    try:
        assert query.awaitTermination(timeout=600), "the stream did not end in 600 s"
    finally:
        query.stop()


@pytest.fixture
def quiet_kafka_client() -> Iterator[None]:
    # (kafka-python warns when its event loop was held up, as on a loaded machine: not ours)
    client_log = logging.getLogger("kafka")
    level = client_log.level
    client_log.setLevel(logging.ERROR)
    yield
    client_log.setLevel(level)


def append(facts: Facts, topic: str, counts: dict[int, int], first: int) -> None:
    """`counts[p]` records to `topic`'s partition p through the broker (a Python client: no
    JVM start), in batches of 5."""
    from kafka import KafkaProducer

    producer = KafkaProducer(bootstrap_servers=facts.bootstrap, linger_ms=1000, batch_size=1024)
    try:
        for partition, count in counts.items():
            for i in range(first, first + count):
                key = None if i % 7 == 0 else b"key-%d" % (i % 5)
                headers = [("n", b"%d" % i)] if i % 3 == 0 else []
                producer.send(
                    topic,
                    key=key,
                    value=b"stream-%d-%d" % (partition, i),
                    headers=headers,
                    partition=partition,
                    timestamp_ms=facts.t0 + i * SECOND,
                )
                if i % 5 == 4:
                    producer.flush()
        producer.flush()
    finally:
        producer.close()


def test_micro_batches_with_max_offsets_per_trigger_over_appended_data(
    sources: Sources, kafka_broker: Broker, tmp_path: Path, quiet_kafka_client: None
) -> None:
    """Two runs of an AvailableNow stream with maxOffsetsPerTrigger from one checkpoint each,
    data appended before each: every micro-batch holds the same rows through either source."""
    facts = sources.facts
    topic = f"sk-stream-{uuid.uuid4().hex[:8]}"  # (its own, should the test run again)
    kafka_broker.create_topic(topic, 2)
    options = {"subscribe": topic, "startingOffsets": "earliest", "maxOffsetsPerTrigger": "12"}
    options["includeHeaders"] = "true"
    streams = {
        "kafka": sources.spark.readStream.format("kafka").option("kafka.bootstrap.servers", facts.bootstrap),
        "seglog": sources.spark.readStream.format("seglog").option("path", str(facts.log_dir)),
    }
    collected = {name: Batches() for name in streams}
    first = 0
    for counts in ({0: 30, 1: 7}, {0: 4, 1: 21}):
        append(facts, topic, counts, first)
        first += max(counts.values())
        for name, reader in streams.items():
            run_available_now(reader.options(**options).load(), tmp_path / name, collected[name])
    theirs, ours = collected["kafka"].batches, collected["seglog"].batches
    assert sum(len(rows) for _, rows in theirs) == 30 + 7 + 4 + 21
    assert len(theirs) > 4, "maxOffsetsPerTrigger cut no micro-batch"
    assert [(i, len(rows)) for i, rows in ours] == [(i, len(rows)) for i, rows in theirs]
    assert ours == theirs


@pytest.mark.parametrize("isolation", [COMMITTED, UNCOMMITTED], ids=["read_committed", "read_uncommitted"])
def test_micro_batches_over_transactions_at_each_isolation_level(
    sources: Sources, tmp_path: Path, isolation: dict[str, str]
) -> None:
    """An AvailableNow stream with maxOffsetsPerTrigger over sk-txn (commits, aborts, their
    markers): every micro-batch holds the same rows through either source, so a trigger's range
    that ends inside a transaction or at a marker is read alike."""
    facts = sources.facts
    options = {"subscribe": "sk-txn", "startingOffsets": "earliest", "maxOffsetsPerTrigger": "9", **isolation}
    streams = {
        "kafka": sources.spark.readStream.format("kafka").option("kafka.bootstrap.servers", facts.bootstrap),
        "seglog": sources.spark.readStream.format("seglog").option("path", str(facts.log_dir)),
    }
    collected = {name: Batches() for name in streams}
    for name, reader in streams.items():
        run_available_now(reader.options(**options).load(), tmp_path / name, collected[name])
    theirs, ours = collected["kafka"].batches, collected["seglog"].batches
    assert len(theirs) > 4, "maxOffsetsPerTrigger cut no micro-batch"
    assert [(i, len(rows)) for i, rows in ours] == [(i, len(rows)) for i, rows in theirs]
    assert ours == theirs
