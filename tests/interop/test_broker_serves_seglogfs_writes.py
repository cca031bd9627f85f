"""seglogfs writes a stopped broker's own topics, and the broker, restarted, serves them.

A broker of its own (Kafka 4.4.0, and 3.9.2, the last of the 3.x line) has a topic and a
compacted topic written by Kafka's console producer (keys, null keys and values, headers; its
cleaner compacting); `seglogfs backup` copies its log dir while it runs, and the producer writes
on. The broker is stopped (SIGTERM: a clean shutdown). While it is down:

* `seglogfs restore --force` puts the backup back into its log dir. A restore replaces a data dir
  whole (the KRaft metadata log, checkpoints and every topic, as they were when the backup was
  taken): a topic alone cannot be put back under a metadata log that went on without it, so the
  restore comes first, and what was produced after the backup is gone, as from any restore;
* a writable mount appends to both topics (`append`, `append.jsonl` with keys and headers);
* `seglogfs clean` compacts the compacted topic and deletes the other's oldest segments
  (retention by size, given as a broker setting).

Restarted, the broker loads the dir as closed cleanly (Kafka's LogManager: "Skipping recovery ...
since clean shutdown file was found"), with no recovery of any segment and no warning about a
log, an index, a checkpoint or a snapshot; `kafka-console-consumer` through it reads exactly what
`seglogfs consume` reads (offsets, keys, values, headers, timestamps and their types); and it
takes new records at the offsets that follow."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.cli.support import run
from tests.fs.conftest import Mount
from tests.interop.conftest import VERSIONS, Broker, Kafka
from tests.interop.test_broker_to_seglogfs import PRINT_ALL, READ_HEADERS_KEY_VALUE

TOPICS = {
    "served": {"internal_segment_bytes": "4096"},
    "served-compacted": {"internal_segment_bytes": "4096", "cleanup_policy": "compact"},
}
# What Kafka logs when it does not trust what it loads (LogLoader, LogManager, UnifiedLog,
# ProducerStateManager, LeaderEpochFileCache, the offset checkpoints): none of it may appear.
DISTRUST = re.compile(
    r"Recovering unflushed segment|Recovering \d+ logs from .* since no clean shutdown|Found invalid"
    r"|[Cc]orrupt|Could not find offset index|orphaned index|Deleting all segments because"
    r"|interrupted swap|Failed to load producer snapshot|caused truncation of conflicting entries"
    r"|Error occurred while reading|Loaded stray log|[Tt]runcat"
)

# What a broker logs at a start, whatever its dir holds: KRaft's metadata log is always
# recovered from its first segment (KafkaMetadataLog opens it with recovery point 0 and
# lastShutdownClean false), the controller warns as it activates, and a node's registration with
# its own controller can come before that controller is ready (an ERROR; the node registers again).
KAFKAS_OWN = (
    r"partition=__cluster_metadata-0, .*\] Recovering unflushed segment",
    r"Performing controller activation",
    r"\] ERROR \[ControllerApis nodeId=\d+\] Unexpected error handling request "
    r"RequestHeader\(apiKey=CONTROLLER_REGISTRATION,",
)


def producer_lines(topic: str, start: int, count: int) -> list[str]:
    """Console-producer input (headers, key, value, tab-separated): a null key or value now and
    then, keys repeating (for the compacted topic), the first header naming the topic."""
    out = []
    for i in range(start, start + count):
        headers = f"topic:{topic},n:{i},empty:" if i % 3 else f"topic:{topic}"
        key = "<null>" if i % 13 == 0 and topic == "served" else f"key-{i % 17}"
        value = "<null>" if i % 23 == 4 else f"{topic}-{i}-" + "v" * (i % 90)
        out.append(f"{headers}\t{key}\t{value}")
    return out


def produce(broker: Broker, topic: str, lines: list[str]) -> None:
    done = broker.kafka.run(
        "console-producer",
        "--bootstrap-server",
        broker.bootstrap,
        "--topic",
        topic,
        "--command-property",
        "linger.ms=5",
        "--command-property",
        "batch.size=2048",
        *READ_HEADERS_KEY_VALUE,
        stdin="".join(f"{line}\n" for line in lines).encode(),
        timeout=180,
    )
    assert "] ERROR " not in done.stderr, f"the console producer of {topic}: {done.stderr[-3000:]}"


def kafka_reads(broker: Broker, topic: str, count: int) -> list[str]:
    args = ["--bootstrap-server", broker.bootstrap, "--topic", topic, "--from-beginning"]
    args += ["--max-messages", str(count), "--timeout-ms", "60000"]
    for setting in PRINT_ALL:
        args += ["--formatter-property", setting]
    return broker.kafka.run("console-consumer", *args, timeout=180).stdout.splitlines()


def seglogfs_reads(log_dir: Path, topic: str) -> list[str]:
    args = ["consume", str(log_dir), "--topic", topic, "--from-beginning"]
    for setting in PRINT_ALL:
        args += ["--property", setting]
    return run(*args).stdout.splitlines()


def segment_bytes_as(version: str, configs: dict[str, str]) -> dict[str, str]:
    """Kafka 3.x has no internal.segment.bytes: its segment.bytes goes as low as a record."""
    if version.startswith("3."):
        configs = {("segment_bytes" if name == "internal_segment_bytes" else name): v for name, v in configs.items()}
    return configs


def offset_of(line: str) -> int:
    return int(re.search(r"Offset:(\d+)", line).group(1))  # type: ignore[union-attr]


@pytest.mark.expect_warnings("recover")
@pytest.mark.parametrize("version", VERSIONS)
def test_a_restarted_broker_serves_what_seglogfs_wrote_while_it_was_stopped(
    kafka: dict[str, Kafka], tmp_path: Path, mount: Callable[..., Mount], version: str
) -> None:
    broker = Broker(kafka[version], tmp_path / "broker")
    broker.format()
    broker.start()
    try:
        for topic, configs in TOPICS.items():
            broker.create_topic(topic, **segment_bytes_as(version, configs))
        for topic in TOPICS:
            produce(broker, topic, producer_lines(topic, 0, 300))
        backup = tmp_path / "backup"
        run("backup", str(broker.log_dir), str(backup))
        produce(broker, "served", producer_lines("served", 300, 50))  # after the backup: gone by the restore
        broker.stop()
        assert (broker.log_dir / ".kafka_cleanshutdown").exists()

        run("restore", "--force", str(backup), str(broker.log_dir))
        m = mount(broker.log_dir, "-o", "parse.key")
        for i in range(40):
            with open(m.path / "served" / "0" / "append", "a") as append:
                append.write(f"key-{i % 17}\tappended-{i}-" + "a" * (i * 7 % 120) + "\n")
        # (Enough to roll several segments: the broker's cleaner may have cleaned all it had, and
        # only sealed segments are compacted.)
        with open(m.path / "served-compacted" / "0" / "append.jsonl", "a") as append:
            for i in range(240):
                record = {
                    "key": f"key-{i % 17}",
                    "value": f"appended-{i}",
                    "headers": [{"key": "topic", "value": "served-compacted"}],
                }
                append.write(json.dumps(record) + "\n")
        m.stop()
        # (the broker's own cleaner ratio: at Kafka's default, 0.5, what the mount appended after
        # the broker's cleaner had passed was not always dirty enough to be cleaned)
        settings = ["--override", "log.retention.bytes=20000", "--override", "log.cleaner.min.cleanable.ratio=0.01"]
        cleaned = run("clean", str(broker.log_dir), *settings, "--json")
        report = json.loads(cleaned.stdout)
        assert any(x["topic"] == "served" and x["segments"] for x in report["retention"]), report
        assert any(x["topic"] == "served-compacted" and x["segmentsCleaned"] for x in report["compaction"]), report

        first_line = len(broker.log_lines())
        broker.start()
        loaded = broker.log_lines()[first_line:]
        assert any(re.search(r"Skipping recovery of \d+ logs from .* since clean shutdown", x) for x in loaded), (
            "the broker did not load the dir as closed cleanly:\n" + "\n".join(loaded[-80:])
        )
        distrust = [
            x
            for x in loaded
            if (DISTRUST.search(x) or re.match(r"\[[^]]*\] (WARN|ERROR|FATAL) ", x))
            and not any(re.search(pattern, x) for pattern in KAFKAS_OWN)
        ]
        assert not distrust, "the restarted broker distrusted what it loaded:\n" + "\n".join(distrust)

        # Each topic read through the broker as seglogfs reads it; then the broker takes new
        # records at the offsets that follow (one topic: a console producer is a JVM's start).
        compacted = seglogfs_reads(broker.log_dir, "served-compacted")
        assert kafka_reads(broker, "served-compacted", len(compacted)) == compacted
        before = seglogfs_reads(broker.log_dir, "served")
        assert not any(re.search(r"\|served-3[0-4]\d-", x) for x in before), "the restore kept a later record"
        assert any("|appended-39-" in x for x in before), "the mount's appends are not there"
        produce(broker, "served", producer_lines("served", 1000, 20))
        ours = seglogfs_reads(broker.log_dir, "served")
        end = offset_of(before[-1]) + 1
        assert ours[: len(before)] == before
        assert [offset_of(x) for x in ours[len(before) :]] == list(range(end, end + 20)), "offsets after the restart"
        assert kafka_reads(broker, "served", len(ours)) == ours, "Kafka's console consumer and seglogfs differ"
    finally:
        broker.stop()
    errors = broker.errors_since(0)
    assert not errors, "the broker logged errors:\n" + "\n".join(errors)
