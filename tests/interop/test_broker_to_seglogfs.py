"""Broker -> seglogfs: a live Kafka broker writes, seglogfs reads its log dir.

Kafka's own console producer writes a topic per codec (none, gzip, snappy, lz4, zstd; lz4's
with LogAppendTime) with keys, null keys and values, and headers; then what `seglogfs consume`
reads of the broker's log dir, the broker running, equals what Kafka's console consumer reads
through the broker: offsets, keys, values, headers, timestamps and their types, line for line.
And a read-only mount of the live dir followed with `tail -f`, and `seglogfs consume --follow`,
while the producer writes, see every record once, in order."""

from __future__ import annotations

import hashlib
import re
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from tests.cli.support import SEGLOGFS, run
from tests.fs.conftest import Mount
from tests.interop.conftest import Broker

CODECS = ("none", "gzip", "snappy", "lz4", "zstd")
COUNT = 400  # per topic: several batches and, at 8 KiB segments, several segments
PRINT_ALL = [
    "print.timestamp=true",
    "print.partition=true",
    "print.offset=true",
    "print.headers=true",
    "print.key=true",
    "print.value=true",
    "key.separator=|",
    "headers.separator=;",
    "null.literal=<null>",
]

# The console producer reads lines of headers, key and value separated by tabs (`<null>` a null).
READ_HEADERS_KEY_VALUE = [
    *("--reader-property", "parse.key=true"),
    *("--reader-property", "parse.headers=true"),
    *("--reader-property", "key.separator=\t"),
    *("--reader-property", "headers.delimiter=\t"),
    *("--reader-property", "null.marker=<null>"),
]


def lines_for(topic: str) -> list[str]:
    """Console-producer input: headers, key, value, separated by tabs; a null key or value now
    and then (`<null>`), an empty header value, a repeated header key. The first header names
    the topic (for telling the topics apart in the console consumer's output)."""
    out = []
    for i in range(COUNT):
        headers = f"topic:{topic},h1:{i},h2:,h1:again" if i % 4 else f"topic:{topic}"
        key = "<null>" if i % 11 == 0 else f"key-{i % 9}"
        noise = hashlib.sha256(b"%d" % i).hexdigest()[: i % 64]  # (so that every codec's segments roll)
        value = "<null>" if i % 29 == 7 else f"{topic}-value-{i}-{noise}"
        out.append(f"{headers}\t{key}\t{value}")
    return out


def console_consumer(broker: Broker, pattern: str, count: int) -> dict[str, list[str]]:
    """Kafka's console consumer through the broker, every topic matching `pattern` in one run,
    by topic (a record's first header names it)."""
    args = ["--bootstrap-server", broker.bootstrap, "--include", pattern, "--from-beginning"]
    args += ["--max-messages", str(count), "--timeout-ms", "60000"]
    for setting in PRINT_ALL:
        args += ["--formatter-property", setting]
    done = broker.kafka.run("console-consumer", *args, timeout=180)
    by_topic: dict[str, list[str]] = {}
    for line in done.stdout.splitlines():
        assert "topic:" in line, f"a line of Kafka's console consumer without the header naming its topic: {line!r}"
        topic = re.search(r"topic:([\w-]+)", line).group(1)  # type: ignore[union-attr]
        by_topic.setdefault(topic, []).append(line)
    return by_topic


def test_seglogfs_reads_of_a_live_broker_dir_what_kafkas_consumer_reads(kafka_broker: Broker) -> None:
    broker = kafka_broker
    producers = []
    for codec in CODECS:
        topic = f"codec-{codec}"
        # (lz4's topic stamps LogAppendTime: the broker's time, and the type each tool prints)
        timestamps = "LogAppendTime" if codec == "lz4" else "CreateTime"
        broker.create_topic(topic, internal_segment_bytes="8192", message_timestamp_type=timestamps)
        command = broker.kafka.command(
            "console-producer",
            "--bootstrap-server",
            broker.bootstrap,
            "--topic",
            topic,
            "--compression-codec",
            codec,
            "--command-property",
            "linger.ms=5",
            "--command-property",
            "batch.size=4096",  # (a batch over the topic's segment size is refused)
            *READ_HEADERS_KEY_VALUE,
        )
        producer = subprocess.Popen(command, stdin=subprocess.PIPE, stderr=subprocess.PIPE)
        producers.append((topic, producer))
    for topic, producer in producers:
        _, stderr = producer.communicate("".join(f"{x}\n" for x in lines_for(topic)).encode(), timeout=180)
        # (It exits 0 when the broker refused some of its records: it logs them.)
        refused = producer.returncode != 0 or b"] ERROR " in stderr
        assert not refused, f"the console producer of {topic}: {stderr.decode()[-3000:]}"
    kafka_read = console_consumer(broker, "codec-.*", COUNT * len(CODECS))
    for codec in CODECS:
        topic = f"codec-{codec}"
        segments = list((broker.log_dir / f"{topic}-0").glob("*.log"))
        assert len(segments) > 1, f"{topic}: the broker rolled no segment"
        args = ["consume", str(broker.log_dir), "--topic", topic, "--from-beginning"]
        for setting in PRINT_ALL:
            args += ["--property", setting]
        ours = run(*args).stdout.splitlines()
        assert len(kafka_read[topic]) == COUNT
        assert ours == kafka_read[topic], f"{topic}: seglogfs and Kafka's console consumer differ"


def wait_for_lines(path: Path, count: int, timeout: float = 120) -> list[str]:
    deadline = time.monotonic() + timeout
    while True:
        lines = path.read_text(errors="replace").splitlines()
        if len(lines) >= count or time.monotonic() > deadline:
            return lines
        time.sleep(0.05)


def test_a_mount_of_a_live_broker_dir_follows_the_producer(
    kafka_broker: Broker, mount: Callable[..., Mount], tmp_path: Path
) -> None:
    broker = kafka_broker
    broker.create_topic("followed", internal_segment_bytes="16384")
    m = mount(broker.log_dir, "-o", "ro")
    records = m.path / "followed" / "0" / "records"
    deadline = time.monotonic() + 60
    while not records.exists():  # the mount sees the topic at its next look at the dir
        assert time.monotonic() < deadline, "the mount never showed the broker's new topic"
        time.sleep(0.05)
    tailed, followed = tmp_path / "tail.out", tmp_path / "consume.out"
    with open(tailed, "wb") as tail_out, open(followed, "wb") as consume_out:
        tail = subprocess.Popen(["tail", "-f", "-n", "+1", str(records)], stdout=tail_out)
        consume = subprocess.Popen(
            [SEGLOGFS, "consume", str(broker.log_dir), "--topic", "followed", "--from-beginning", "--follow"],
            stdout=consume_out,
        )
    producer = subprocess.Popen(
        broker.kafka.command(
            "console-producer",
            "--bootstrap-server",
            broker.bootstrap,
            "--topic",
            "followed",
            "--command-property",
            "linger.ms=0",
        ),
        stdin=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        assert producer.stdin is not None
        expected = [f"followed-{i}-" + "f" * (i % 70) for i in range(600)]
        # In rounds: each round written, then awaited by both followers, so that they follow
        # a log that grows (and rolls segments) while they read.
        for start in range(0, len(expected), 100):
            producer.stdin.write("".join(f"{x}\n" for x in expected[start : start + 100]).encode())
            producer.stdin.flush()
            wait_for_lines(tailed, start + 100)
            wait_for_lines(followed, start + 100)
        producer.stdin.close()
        assert producer.wait(timeout=120) == 0, producer.stderr.read() if producer.stderr else ""
    finally:
        for process in (tail, consume):
            process.send_signal(signal.SIGTERM)
            process.wait(timeout=30)
        if producer.poll() is None:
            producer.kill()
            producer.wait(timeout=30)
        if producer.stderr is not None:
            producer.stderr.close()
    assert tailed.read_text().splitlines() == expected
    assert followed.read_text().splitlines() == expected
    assert len(list((broker.log_dir / "followed-0").glob("*.log"))) > 1, "the broker rolled no segment"
