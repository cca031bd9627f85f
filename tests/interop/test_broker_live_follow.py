"""Broker -> seglogfs, live, with Kafka's Java producers: an idempotent one and a transactional
one (commits and aborts) write three topics of the session's broker — one whose transactions
interleave with the idempotent producer's records (LogAppendTime), one compacted with the
broker's cleaner running, one under retention (retention.bytes) — in rounds. Meanwhile a
read-only mount of the broker's live log dir is followed with `tail -f` and `less +F`,
`seglogfs consume --follow` runs, and a Spark streaming query reads the dir, all at
read_committed where transactions are.

What each follower must see:
- the transactional topic: every committed record exactly once, in offset order, and no record
  of an aborted transaction; a transaction's records (and the records after its first offset)
  only once its marker lands;
- the compacted and the retained topic: compaction and retention may remove records before a
  follower reads them, so a follower's records are a subsequence of those written (read_committed),
  in offset order, none twice, each exactly as Kafka serves it, and it has every record that
  neither removed (Kafka's final read).

When the producers stop (and the cleaner and retention have nothing left to do), what seglogfs
reads — `consume`, the mount's `records`, `records.jsonl`, `by-offset/`, `by-time/` and a Spark
batch read — equals what Kafka's console consumer reads through the broker at read_committed:
offsets, keys, values, headers, timestamps and their types."""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.cli.support import SEGLOGFS, run
from tests.fs.conftest import Mount
from tests.interop.conftest import Broker, Producers
from tests.pipeline.conftest import SPARK_WORKER_START, metrics, spark  # noqa: F401 (fixtures: one Spark)

ROUNDS = 4  # rounds 0 and 2 commit their transaction, 1 and 3 abort it
DEADLINE_S = 120  # a guard against a hang, generous for a loaded two-core machine
# The console consumer's fields, as the mount's views print them too (`-o print.…`).
PRINT = {
    "print.timestamp": "true",
    "print.partition": "true",
    "print.offset": "true",
    "print.headers": "true",
    "print.key": "true",
    "key.separator": "|",
    "null.literal": "<null>",
}
CONSUME = ["--isolation-level", "read_committed"] + [f"--property={k}={v}" for k, v in PRINT.items()]
LINE = re.compile(
    r"^(?P<type>CreateTime|LogAppendTime):(?P<ts>-?\d+)\|Partition:0\|Offset:(?P<offset>\d+)\|"
    r"(?P<headers>[^|]*)\|(?P<key>[^|]*)\|(?P<value>[^|]*)$"
)


def offset_of(line: str) -> int:
    return int(parse(line)["offset"])


def value_of(line: str) -> str:
    return parse(line)["value"]


def parse(line: str) -> dict[str, str]:
    match = LINE.match(line)
    assert match, f"not a console consumer line: {line!r}"
    return match.groupdict()


def render(timestamp_type: str, timestamp: int, offset: int, headers: list[tuple[str, str | None]], key, value) -> str:
    """A record as the console consumer prints it with PRINT."""
    shown = ",".join(f"{k}:{'<null>' if v is None else v}" for k, v in headers) or "NO_HEADERS"
    fields = [f"{timestamp_type}:{timestamp}", "Partition:0", f"Offset:{offset}", shown]
    fields += ["<null>" if key is None else key, "<null>" if value is None else value]
    return "|".join(fields)


def jsonl_as_lines(text: str) -> list[str]:
    out = []
    for line in text.splitlines():
        record = json.loads(line)
        headers = [(h["key"], h["value"]) for h in record["headers"]]
        out.append(
            render(
                record["timestampType"],
                record["timestamp"],
                record["offset"],
                headers,
                record["key"],
                record["value"],
            )
        )
    return out


def spark_lines(frame) -> list[tuple[str, str]]:
    """(topic, line) for each row of a `format("seglog")` frame with headers, in its order."""
    rows = frame.selectExpr(
        "topic", "offset", "unix_millis(timestamp) AS ms", "timestampType", "key", "value", "headers"
    ).collect()
    out = []
    for row in rows:
        kind = {0: "CreateTime", 1: "LogAppendTime"}[row.timestampType]

        def text(data):
            return None if data is None else bytes(data).decode()

        headers = [(h.key, text(h.value)) for h in row.headers or ()]
        out.append((row.topic, render(kind, row.ms, row.offset, headers, text(row.key), text(row.value))))
    return out


class Followers:
    """Everything that follows one topic: `tail -f` of a view and `consume --follow`, each
    writing to a file."""

    def __init__(self, topic: str, view: Path, data: Path, directory: Path, read_committed: bool) -> None:
        self.topic = topic
        self.outputs = {"tail -f": directory / f"{topic}.tail", "consume --follow": directory / f"{topic}.consume"}
        consume = [SEGLOGFS, "consume", str(data), "--topic", topic, "--from-beginning", "--follow"]
        if read_committed:
            consume += ["--isolation-level", "read_committed"]
        for key, value in PRINT.items():
            consume += ["--property", f"{key}={value}"]
        self.processes = []
        for command, path in zip(
            (["tail", "-n", "+1", "-s", "0.2", "-f", str(view)], consume), self.outputs.values(), strict=True
        ):
            with open(path, "wb") as out, open(path.with_name(path.name + ".err"), "wb") as err:
                self.processes.append(subprocess.Popen(command, stdout=out, stderr=err))

    def complaints(self) -> dict[str, str]:
        """What each said on its standard error (consume its last line: how many it printed)."""
        said = {who: path.with_name(path.name + ".err").read_text() for who, path in self.outputs.items()}
        said["consume --follow"] = re.sub(r"Processed a total of \d+ messages\n$", "", said["consume --follow"])
        return {who: text for who, text in said.items() if text}

    def lines(self) -> dict[str, list[str]]:
        """Each one's whole lines so far (not one it is writing)."""
        texts = {who: path.read_text() for who, path in self.outputs.items()}
        return {who: text[: text.rfind("\n") + 1].splitlines() for who, text in texts.items()}

    def stop(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
            process.wait(timeout=30)


def wait_for(
    condition: Callable[[], bool], what: str, timeout: float = DEADLINE_S, late: Callable[[], object] | None = None
) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"not within {timeout} s: {what}" + (f": {late()}" if late else "")
        time.sleep(0.05)


class Less:
    """`less +F` of a view in a tmux pane (a real terminal): what its screen shows."""

    def __init__(self, path: Path) -> None:
        self.tmux = ["tmux", "-L", f"seglogfs-live-{os.getpid()}"]
        subprocess.run([*self.tmux, "new-session", "-d", "-x", "240", "-y", "30", f"less +F {path}"], check=True)

    def screen(self) -> list[str]:
        shown = subprocess.run([*self.tmux, "capture-pane", "-p"], check=True, capture_output=True, text=True)
        return [line.strip() for line in shown.stdout.splitlines() if line.strip()]

    def stop(self) -> None:
        shown = subprocess.run(
            [*self.tmux, "display", "-p", "#{pane_pid}"], check=False, capture_output=True, text=True
        )
        subprocess.run([*self.tmux, "kill-server"], check=False, capture_output=True)
        if shown.stdout.strip().isdigit():  # (less gone: it closed the view before the mount ends)
            wait_for(lambda: not Path(f"/proc/{shown.stdout.strip()}").exists(), "less to end", 30)


class SparkFollower:
    """A streaming `format("seglog")` query over the live dir, every second: its rows as lines,
    by topic, in the order its micro-batches delivered them."""

    def __init__(self, session, data: Path, topics: list[str], checkpoint: Path) -> None:
        self.rows: dict[str, list[str]] = {topic: [] for topic in topics}

        def sink(frame, batch_id: int) -> None:
            for topic, line in spark_lines(frame):
                self.rows[topic].append(line)

        self.stream = (
            session.readStream.format("seglog")
            .option("path", str(data))
            .option("subscribe", ",".join(topics))
            .option("startingOffsets", "earliest")
            .option("includeHeaders", "true")
            .option("kafka.isolation.level", "read_committed")
            .option("failOnDataLoss", "false")  # (retention removes what it had not read yet)
            .load()
            .writeStream.foreachBatch(sink)
            .option("checkpointLocation", str(checkpoint))
            .trigger(processingTime="1 second")
        )
        self.query = None

    def start(self) -> None:
        """Start the query and wait for its first trigger. Spark gives the Python worker that
        plans its micro-batches a fixed 10 s to connect back (see tests/pipeline/conftest.py);
        a query that failed that way before its first trigger is started again, twice at most."""
        for attempt in range(3):
            self.query = self.stream.start()
            wait_for(lambda: self.query.lastProgress is not None or self.query.exception() is not None, "a trigger")
            error = self.query.exception()
            if error is None or SPARK_WORKER_START not in str(error) or attempt == 2:
                break
        self.check()

    def stop(self) -> None:
        if self.query is not None:
            self.query.stop()

    def check(self) -> None:
        error = self.query.exception()
        assert error is None, f"the streaming query failed: {error}"

    def caught_up(self, last: dict[str, str]) -> bool:
        self.check()
        return all(any(value_of(line) == value for line in self.rows[t][-50:]) for t, value in last.items())


def log_segments(partition_dir: Path) -> list[Path]:
    """A partition's segments (not those renamed for deletion or being swapped in), oldest first."""
    return sorted(partition_dir.glob("*.log"), key=lambda path: int(path.stem))


def cleaned_to_active_segment(log_dir: Path, topic: str) -> bool:
    """The broker's cleaner has cleaned the partition up to its active segment: nothing is left
    for it to do until more is appended (the cleaner-offset-checkpoint, `topic partition offset`
    lines after a version and a count)."""
    checkpoint = log_dir / "cleaner-offset-checkpoint"
    if not checkpoint.exists():
        return False
    offsets = {}
    for line in checkpoint.read_text().splitlines()[2:]:
        name, partition, offset = line.split()
        offsets[(name, int(partition))] = int(offset)
    segments = log_segments(log_dir / f"{topic}-0")
    return bool(segments) and offsets.get((topic, 0)) == int(segments[-1].stem)


def retention_done(partition_dir: Path, retention_bytes: int) -> bool:
    """Kafka's size-based retention has nothing more to delete: it deletes the oldest segments
    while the log is still retention.bytes or more without them (UnifiedLog's
    deleteRetentionSizeBreachedSegments)."""
    sizes = [path.stat().st_size for path in log_segments(partition_dir)]
    excess = sum(sizes) - retention_bytes
    return len(sizes) == 1 or excess < 0 or excess - sizes[0] < 0


def check_follower(who: str, lines: list[str], written: list[str], final: list[str]) -> None:
    """A follower of a topic whose records compaction or retention removes: what it printed
    is in offset order, none twice, a subsequence of the records written (read_committed), each
    line as Kafka serves it at the end where Kafka still has it, and every record Kafka still
    has is there."""
    offsets = [offset_of(line) for line in lines]
    assert offsets == sorted(set(offsets)), f"{who}: a record twice or out of order: {offsets}"
    # (Tombstones, null values, are told apart by their offsets only.)
    values = [value for value in map(value_of, lines) if value != "<null>"]
    position = {value: n for n, value in enumerate(written) if value != "<null>"}
    assert all(v in position for v in values), (
        f"{who}: a record never written (or aborted) {set(values) - set(position)}"
    )
    assert [position[v] for v in values] == sorted(position[v] for v in values), f"{who}: not in the order written"
    kept = set(lines)
    assert [line for line in final if line not in kept] == [], f"{who}: misses records Kafka still has"
    by_value = {value_of(line): line for line in final if value_of(line) != "<null>"}
    assert [line for line in lines if value_of(line) in by_value and by_value[value_of(line)] != line] == []


def kafka_reads(broker: Broker, pattern: str, count: int) -> dict[str, list[str]]:
    """Kafka's console consumer through the broker at read_committed, `count` records, by topic
    (each record's first header names its topic)."""
    args = ["--bootstrap-server", broker.bootstrap, "--include", pattern, "--from-beginning"]
    args += ["--isolation-level", "read_committed", "--max-messages", str(count), "--timeout-ms", "60000"]
    for key, value in PRINT.items():
        args += ["--formatter-property", f"{key}={value}"]
    done = broker.kafka.run("console-consumer", *args, timeout=180, check=False)
    assert f"Processed a total of {count} messages" in done.stderr, done.stderr[-3000:]
    by_topic: dict[str, list[str]] = {}
    for line in done.stdout.splitlines():
        topic = re.search(r"\|topic:([\w-]+)", line)
        assert topic, f"a line of Kafka's console consumer without the header naming its topic: {line!r}"
        by_topic.setdefault(topic.group(1), []).append(line)
    return by_topic


@pytest.fixture
def stopped() -> Iterator[list[Callable[[], None]]]:
    """Stops, in reverse order, what the test started (even when it fails)."""
    stops: list[Callable[[], None]] = []
    yield stops
    for stop in reversed(stops):
        stop()


# (What compaction and retention removed before a read-only mount looked: the mount names it.)
@pytest.mark.expect_warnings(r"-(compacted|retained)-0 \(text, read_\w+\): offsets \d+ to \d+ were removed before")
@pytest.mark.flaky(reruns=1, only_rerun=[SPARK_WORKER_START])  # (as the Spark tests: see there)
def test_followers_of_a_live_broker_dir_see_transactions_compaction_and_retention(
    kafka_broker: Broker,
    mount: Callable[..., Mount],
    spark,  # noqa: F811 (the fixture imported above)
    producer_classes: Path,
    stopped: list[Callable[[], None]],
    tmp_path: Path,
) -> None:
    broker = kafka_broker
    run_id = uuid.uuid4().hex[:8]  # (the session's broker outlives a rerun)
    txn, compacted, retained = (f"live-{run_id}-{kind}" for kind in ("txn", "compacted", "retained"))
    topics = [txn, compacted, retained]
    retention_bytes = 3000
    broker.create_topic(txn, internal_segment_bytes="1024", message_timestamp_type="LogAppendTime")
    broker.create_topic(compacted, internal_segment_bytes="2048", cleanup_policy="compact", segment_ms="100")
    broker.create_topic(retained, internal_segment_bytes="1024", retention_bytes=str(retention_bytes))

    # The streaming query first, alone: Spark gives the Python worker it starts a fixed 10 s to
    # connect back, which a start beside the producers' JVM on a loaded machine can outlast.
    streaming = SparkFollower(spark, broker.log_dir, topics, tmp_path / "checkpoint")
    stopped.append(streaming.stop)
    streaming.start()
    options = ",".join(f"{key}={value}" if value != "true" else key for key, value in PRINT.items())
    m = mount(broker.log_dir, "-o", "ro", "-o", options)
    views = {topic: m.path / topic / "0" / "read_committed" / "records" for topic in topics}
    views[retained] = m.path / retained / "0" / "records"  # (no transactions: either level)
    wait_for(lambda: all(view.exists() for view in views.values()), "the mount showing the new topics")
    followers = {t: Followers(t, views[t], broker.log_dir, tmp_path, read_committed=t != retained) for t in topics}
    for each in followers.values():
        stopped.append(each.stop)
    less = Less(views[txn])
    stopped.append(less.stop)
    producers = Producers(broker, producer_classes, f"live-{run_id}", tmp_path / "producers.err")
    stopped.append(producers.kill)

    def behind(last: dict[str, str]) -> list[str]:
        """The followers that have not printed the last record yet."""
        late = [
            f"{who} of {t}"
            for t, each in followers.items()
            for who, lines in each.lines().items()
            if not any(value_of(line) == last[t] for line in lines[-50:])
        ]
        return late + ([] if any(last[txn] in line for line in less.screen()[-3:]) else ["less +F"])

    uncommitted = m.path / txn / "0" / "read_uncommitted" / "records"
    # What a read_committed consumer reads if nothing were removed, by topic, in offset order.
    written: dict[str, list[str]] = {topic: [] for topic in topics}
    by_time_from_ms = 0
    for r in range(ROUNDS):
        commit = r % 2 == 0
        if r == 2:
            by_time_from_ms = int(time.time() * 1000)  # every record of rounds 2 and 3 is stamped at or after it
        producers.line("begin")
        in_transaction = {txn: [], compacted: []}
        for i in range(12):
            value = f"{txn}-r{r}-txn-{i}"
            producers.send("txn", txn, f"t{i % 3}", value, f"topic:{txn},round:{r},null:<null>")
            in_transaction[txn].append(value)
        for i in range(4):
            value = f"{compacted}-r{r}-txn-{i}"
            producers.send("txn", compacted, f"k{i}", value, f"topic:{compacted}")
            in_transaction[compacted].append(value)
        producers.sync()
        after: dict[str, list[str]] = {topic: [] for topic in topics}
        for i in range(6):  # (after the transaction's first offset: held back until its marker)
            value = f"{txn}-r{r}-idem-{i}"
            producers.send("idem", txn, "<null>", value, f"topic:{txn}")
            after[txn].append(value)
        for i in range(20):
            key, value = f"k{(r * 20 + i) % 7}", f"{compacted}-r{r}-idem-{i}"
            if i % 9 == 4:
                value = "<null>"  # a tombstone: the cleaner removes it once delete.retention.ms passed
            producers.send("idem", compacted, key, value, f"topic:{compacted},i:{i}")
            after[compacted].append(value)
        after[compacted].append(f"{compacted}-r{r}-last")  # (a key of its own: never compacted away)
        producers.send("idem", compacted, f"last-{r}", after[compacted][-1], f"topic:{compacted}")
        for i in range(40):
            noise = hashlib.sha256(b"%d-%d" % (r, i)).hexdigest()[: 20 + i]  # (little for gzip to squeeze)
            value = f"{retained}-r{r}-idem-{i}-{noise}"
            producers.send("idem", retained, "<null>" if i % 5 else f"r{i}", value, f"topic:{retained}")
            after[retained].append(value)
        producers.sync()
        # The transaction is open: its records, and the records after its first offset, are in
        # the log (read_uncommitted shows them) and reach no read_committed follower.
        open_end = after[txn][-1]
        wait_for(lambda end=open_end: end in uncommitted.read_text(), "the open transaction's records in the log")
        for who, lines in followers[txn].lines().items():
            assert not any(value_of(line) in in_transaction[txn] + after[txn] for line in lines), f"{who}, round {r}"
        producers.line("commit" if commit else "abort")
        producers.sync()
        for topic in topics:
            written[topic] += (in_transaction.get(topic, []) if commit else []) + after[topic]
        last = {topic: written[topic][-1] for topic in topics}

        wait_for(
            lambda last=last: not behind(last),
            f"every follower reaching the end of round {r}",
            2 * DEADLINE_S // 3,
            lambda last=last: behind(last),
        )
        wait_for(lambda last=last: streaming.caught_up(last), f"the streaming query reaching the end of round {r}")
    producers.close()

    wait_for(lambda: cleaned_to_active_segment(broker.log_dir, compacted), "the cleaner cleaning the compacted topic")
    wait_for(lambda: retention_done(broker.log_dir / f"{retained}-0", retention_bytes), "retention")
    assert len(log_segments(broker.log_dir / f"{txn}-0")) > 1, "the broker rolled no segment"
    kept = [len(written[t]) for t in topics]
    ours = {t: run("consume", str(broker.log_dir), "--topic", t, "--from-beginning", *CONSUME).stdout for t in topics}
    kafka = kafka_reads(broker, f"live-{run_id}-.*", sum(len(text.splitlines()) for text in ours.values()))
    # (Kafka read as many records as seglogfs: each topic's ends at the last record written, so
    # it read each whole, and seglogfs read no more and no fewer.)
    assert {t: value_of(kafka[t][-1]) for t in topics} == {t: written[t][-1] for t in topics}
    assert [value_of(line) for line in kafka[txn]] == written[txn], "Kafka's own read is not what was written"
    assert len(kafka[retained]) < kept[2], "retention removed nothing"
    assert len(kafka[compacted]) < kept[1], "the cleaner removed nothing"

    # The followers, now stopped: each saw what the module's docstring says.
    for each in followers.values():
        each.stop()
        assert each.complaints() == {}, each.topic
    shown = [line for line in less.screen() if LINE.match(line)]  # (its last line says it waits)
    assert len(shown) >= 20 and shown == kafka[txn][-len(shown) :], shown
    streaming.stop()
    for topic in topics:
        seen = {**followers[topic].lines(), "spark streaming": streaming.rows[topic]}
        for who, lines in seen.items():
            if topic == txn:
                assert lines == kafka[txn], f"{who} of {txn}: not every committed record once, in order"
            else:
                check_follower(f"{who} of {topic}", lines, written[topic], kafka[topic])

    # At rest: every way seglogfs reads equals Kafka's read.
    batch = spark.read.format("seglog").option("path", str(broker.log_dir)).option("subscribe", ",".join(topics))
    batch = batch.option("includeHeaders", "true").option("kafka.isolation.level", "read_committed").load()
    spark_read: dict[str, list[str]] = {topic: [] for topic in topics}
    for topic, line in spark_lines(batch.orderBy("topic", "offset")):
        spark_read[topic].append(line)
    for topic in topics:
        expected = kafka[topic]
        partition = m.path / topic / "0" / "read_committed"
        first = offset_of(expected[0])  # (retention and compaction may have removed offset 0)
        middle = offset_of(expected[len(expected) // 2]) - 1  # (may name a removed record, a marker)
        from_middle = [line for line in expected if offset_of(line) >= middle]
        from_time = [line for line in expected if int(parse(line)["ts"]) >= by_time_from_ms]
        assert from_time == expected[len(expected) - len(from_time) :], f"{topic}: Kafka's timestamps not in rounds"
        read = {
            "consume": (ours[topic].splitlines(), expected),
            "spark batch": (spark_read[topic], expected),
            "records": ((partition / "records").read_text().splitlines(), expected),
            "records.jsonl": (jsonl_as_lines((partition / "records.jsonl").read_text()), expected),
            f"by-offset/{first}": ((partition / "by-offset" / str(first)).read_text().splitlines(), expected),
            f"by-offset/{middle}.jsonl": (
                jsonl_as_lines((partition / "by-offset" / f"{middle}.jsonl").read_text()),
                from_middle,
            ),
            f"by-time/{by_time_from_ms}": (
                (partition / "by-time" / str(by_time_from_ms)).read_text().splitlines(),
                from_time,
            ),
        }
        for what, (got, want) in read.items():
            assert got == want, f"{topic}: {what} differs from Kafka's console consumer"
