"""`seglogfs topics create|list|describe|alter|delete` (kafka-topics), run as a real process."""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

from seglogfs.engine.log.checkpoint import read_offset_checkpoint, read_partition_metadata
from tests.cli.support import Holder, one_error_line, run, run_json
from tests.conftest import assert_log_dir_valid, kafka_fixtures

TOPIC_LINE = re.compile(
    r"Topic: (\S+)\tTopicId: ([A-Za-z0-9_-]{22})\tPartitionCount: (\d+)\tReplicationFactor: 1\tConfigs: (\S*)"
)
PARTITION_LINE = re.compile(
    r"\tTopic: (\S+)\tPartition: (\d+)\tLeader: (\d+)\tReplicas: \3\tIsr: \3"
    r"\tLogStartOffset: (\d+)\tLogEndOffset: (\d+)\tSize: (\d+)"
)


def topic_ids(data: Path, topic: str) -> set[str | None]:
    return {read_partition_metadata(p / "partition.metadata") for p in data.glob(f"{topic}-*")}


def test_create_list_describe(tmp_path: Path) -> None:
    data = tmp_path / "data"  # made by create, as a broker makes its log dirs
    created = run(
        "topics", str(data), "create", "--topic", "orders", "--partitions", "3", "--config", "retention.ms=3600000",
        "--config", "cleanup.policy=delete,compact",
    )  # fmt: skip
    assert created.stdout == "Created topic orders.\n" and created.stderr == ""
    run("topics", "create", str(data), "--topic", "a.b_c-1")  # the other order, num.partitions
    keyed = ["--property", "parse.key=true"]  # a compacted topic takes keyed records only
    run("produce", str(data), "--topic", "orders", "--partition", "1", *keyed, stdin=b"k\tone\nk\ttwo\n")

    assert run("topics", str(data), "list").stdout == "a.b_c-1\norders\n"
    assert run("topics", str(data), "list", "--topic", "ord.*").stdout == "orders\n"

    lines = run("topics", str(data), "describe", "--topic", "orders").stdout.splitlines()
    head = TOPIC_LINE.fullmatch(lines[0])
    assert head is not None, lines[0]
    assert head.group(1, 3, 4) == ("orders", "3", "cleanup.policy=compact,delete,retention.ms=3600000")
    assert topic_ids(data, "orders") == {head.group(2)}
    partitions = [PARTITION_LINE.fullmatch(line) for line in lines[1:]]
    assert all(partitions) and len(partitions) == 3, lines
    assert [m.group(1, 2, 3, 4, 5) for m in partitions if m] == [
        ("orders", "0", "0", "0", "0"),
        ("orders", "1", "0", "0", "2"),
        ("orders", "2", "0", "0", "0"),
    ]

    document = run_json("topics", str(data), "describe")
    assert [t["topic"] for t in document["topics"]] == ["a.b_c-1", "orders"]
    orders = document["topics"][1]
    assert orders["topicId"] == head.group(2) and orders["partitionCount"] == 3 and orders["replicationFactor"] == 1
    assert orders["configs"] == {"cleanup.policy": "compact,delete", "retention.ms": "3600000"}
    second = orders["partitions"][1]
    assert {k: second[k] for k in ("partition", "leader", "replicas", "isr", "logStartOffset", "logEndOffset")} == {
        "partition": 1, "leader": 0, "replicas": [0], "isr": [0], "logStartOffset": 0, "logEndOffset": 2,
    }  # fmt: skip
    assert second["sizeInBytes"] > 0 and second["segments"] == 1 and second["offline"] is None
    assert_log_dir_valid(data)


def test_create_refusals_change_nothing(tmp_path: Path) -> None:
    data = tmp_path / "data"
    refused = [
        (["--topic", "../evil"], 1, "topic name '../evil' has characters other than"),
        (["--topic", "x" * 250], 1, "topic name is 250 characters long (at most 249)"),
        (["--topic", "t", "--config", "retention.everything=1"], 1, "unknown topic config 'retention.everything'"),
        (["--topic", "t", "--config", "segment.bytes=big"], 1, "invalid value 'big' for segment.bytes"),
        (["--topic", "t", "--config", "segment.bytes"], 2, "--config 'segment.bytes': expected key=value"),
        (["--topic", "t", "--replication-factor", "3"], 1, "replication factor 3"),
        (["--topic", "t", "--partitions", "two"], 2, "argument --partitions: invalid int value: 'two'"),
    ]
    for args, code, message in refused:
        result = run("topics", str(data), "create", *args, code=code)
        assert message in one_error_line(result), args
    assert not data.exists()  # refused before the data dir was made

    run("topics", str(data), "create", "--topic", "t", "--partitions", "0", code=1)
    run("topics", str(data), "create", "--topic", "t")
    exists = run("topics", str(data), "create", "--topic", "t", "--partitions", "4", code=1)
    assert "topic 't' exists already" in one_error_line(exists)
    assert run("topics", str(data), "create", "--topic", "t", "--if-not-exists").stdout == ""
    assert run("topics", str(data), "describe", "--json").stdout.count('"partition":') == 1


def test_create_and_produce_refuse_kafkas_colliding_and_internal_names(tmp_path: Path) -> None:
    """A name differing from a topic's only by '.' against '_' is refused by create and by
    produce's auto-create, with Kafka's message; Kafka's internal topics are never created."""
    data = tmp_path / "data"
    run("topics", str(data), "create", "--topic", "a.b")
    refused = run("topics", str(data), "create", "--topic", "a_b", code=1)
    assert one_error_line(refused).endswith("Topic 'a_b' collides with existing topic: a.b")
    produced = run("produce", str(data), "--topic", "a_b", stdin=b"v\n", code=1)
    assert one_error_line(produced).endswith("Topic 'a_b' collides with existing topic: a.b")
    for internal in ("__consumer_offsets", "__transaction_state", "__cluster_metadata"):
        refused = run("topics", str(data), "create", "--topic", internal, code=1)
        assert f"topic '{internal}' is internal to Kafka" in one_error_line(refused)
    assert [name for name in sorted(os.listdir(data)) if name.endswith("-0")] == ["a.b-0"]


def test_alter_adds_partitions_and_changes_configs(tmp_path: Path) -> None:
    data = tmp_path / "data"
    run("topics", str(data), "create", "--topic", "t", "--partitions", "2", "--config", "retention.ms=1000")
    before = topic_ids(data, "t")
    assert run("topics", str(data), "alter", "--topic", "t", "--partitions", "4").stdout == ""
    assert sorted(p.name for p in data.glob("t-*")) == ["t-0", "t-1", "t-2", "t-3"]
    assert topic_ids(data, "t") == before  # one topic, one id
    run("produce", str(data), "--topic", "t", "--partition", "3", stdin=b"in the new partition\n")
    assert run("consume", str(data), "--topic", "t", "--partition", "3", "--from-beginning").stdout == (
        "in the new partition\n"
    )

    for count in ("2", "4"):
        result = run("topics", str(data), "alter", "--topic", "t", "--partitions", count, code=1)
        assert f"has 4 partitions: the count can only be increased, not set to {count}" in one_error_line(result)
    refused = run("topics", str(data), "alter", "--topic", "t", "--partitions", "9", "--config", "segment.ms=0", code=1)
    assert "segment.ms=0 is below the minimum of 1" in one_error_line(refused)
    assert len(list(data.glob("t-*"))) == 4  # a refused alter changes nothing

    changed = run(
        "topics", str(data), "alter", "--topic", "t", "--config", "segment.bytes=100000", "--delete-config",
        "retention.ms",
    )  # fmt: skip
    assert changed.stdout == "Completed updating config for topic t.\n"
    stored = json.loads((data / ".seglogfs-topic-configs.json").read_text())
    assert stored["topics"] == {"t": {"segment.bytes": "100000"}}
    assert run_json("topics", str(data), "describe")["topics"][0]["configs"] == {"segment.bytes": "100000"}

    missing = run("topics", str(data), "alter", "--topic", "t", "--delete-config", "retention.ms", code=1)
    assert "has no override of it to delete (its value, 604800000, comes from default)" in one_error_line(missing)
    assert (
        "unknown topic config 'nope'"
        in run("topics", str(data), "alter", "--topic", "t", "--delete-config", "nope", code=1).stderr
    )
    nothing = run("topics", str(data), "alter", "--topic", "t", code=2)
    assert "alter needs --partitions, --config or --delete-config" in one_error_line(nothing)
    unknown = run("topics", str(data), "alter", "--topic", "u", "--partitions", "3", code=1)
    assert one_error_line(unknown) == "seglogfs: unknown topic 'u'"
    run("topics", str(data), "alter", "--topic", "u", "--partitions", "3", "--if-exists")
    assert_log_dir_valid(data)


def test_delete_removes_the_topic_its_data_and_its_configs(tmp_path: Path) -> None:
    data = tmp_path / "data"
    for topic in ("keep", "gone.1", "gone.2"):
        run("topics", str(data), "create", "--topic", topic, "--partitions", "2", "--config", "retention.ms=5000")
        run("produce", str(data), "--topic", topic, stdin=b"a\nb\nc\n")
    old_id = topic_ids(data, "gone.1")
    assert run("topics", str(data), "delete", "--topic", r"gone\..*").stdout == ""  # a regex, as in kafka-topics
    assert run("topics", str(data), "list").stdout == "keep\n"
    assert sorted(p.name for p in data.iterdir() if p.is_dir()) == ["keep-0", "keep-1"]
    assert set(json.loads((data / ".seglogfs-topic-configs.json").read_text())["topics"]) == {"keep"}
    for name in ("recovery-point-offset-checkpoint", "replication-offset-checkpoint"):
        assert {t for t, _ in read_offset_checkpoint(data / name)} == {"keep"}
    assert_log_dir_valid(data)

    unknown = run("topics", str(data), "delete", "--topic", "gone.1", code=1)
    assert one_error_line(unknown) == "seglogfs: unknown topic 'gone.1'"
    assert "no topic matches 'gone.*'" in run("topics", str(data), "delete", "--topic", "gone.*", code=1).stderr
    run("topics", str(data), "delete", "--topic", "gone.1", "--if-exists")

    # The name again: a new topic, with a new id, the broker's defaults and none of the old records.
    run("topics", str(data), "create", "--topic", "gone.1")
    assert topic_ids(data, "gone.1") != old_id
    assert run_json("topics", str(data), "describe", "--topic", "gone.1")["topics"][0]["configs"] == {}
    assert run("consume", str(data), "--topic", "gone.1", "--from-beginning").stdout == ""
    assert run("consume", str(data), "--topic", "keep", "--from-beginning").stdout.splitlines() == ["a", "b", "c"]


def test_a_locked_data_dir_is_refused_to_writers_and_read_by_readers(tmp_path: Path) -> None:
    data = tmp_path / "data"
    run("topics", str(data), "create", "--topic", "t")
    with Holder(data) as pid:
        for args in (
            ["create", "--topic", "u"],
            ["alter", "--topic", "t", "--partitions", "2"],
            ["alter", "--topic", "t", "--config", "retention.ms=1"],
            ["delete", "--topic", "t"],
        ):
            result = run("topics", str(data), *args, code=3)
            line = one_error_line(result)
            assert line.startswith(f"seglogfs: {data}: data dir is in use by process {pid}") and ".lock" in line
        assert run("topics", str(data), "list").stdout == "t\n"
        assert TOPIC_LINE.match(run("topics", str(data), "describe").stdout)
        assert "retention.ms=" in run("config", "show", str(data), "--topic", "t").stdout
    assert run("topics", str(data), "list").stdout == "t\n" and not (data / "u-0").exists()


def test_a_kafka_brokers_dir(tmp_path: Path) -> None:
    """A KRaft broker's dir: ids from its metadata, its node id as leader, no `__cluster_metadata`
    topic, and a note that the broker will bring back what is deleted."""
    fixture = kafka_fixtures() / "ne-streaming-d95be01"
    assert run("topics", str(fixture), "list").stdout == "__consumer_offsets\nyour-kafka-topic\n"
    assert run("topics", str(fixture), "list", "--exclude-internal").stdout == "your-kafka-topic\n"
    lines = run("topics", str(fixture), "describe", "--topic", "__consumer_offsets").stdout.splitlines()
    assert "\tConfigs: cleanup.policy=compact,compression.type=producer,segment.bytes=104857600" in lines[0]
    assert re.match(r"\tTopic: __consumer_offsets\tPartition: 26\tLeader: 1\tReplicas: 1\tIsr: 1\t", lines[1])
    assert (
        "__cluster_metadata" in run("topics", str(fixture), "describe", "--topic", "__cluster_metadata", code=1).stderr
    )

    copy = tmp_path / "broker"
    shutil.copytree(fixture, copy)
    result = run("topics", str(copy), "delete", "--topic", "your-kafka-topic")
    assert result.stderr.startswith("seglogfs: note: the broker's metadata log still lists topic your-kafka-topic")
    assert not (copy / "your-kafka-topic-0").exists() and (copy / "__cluster_metadata-0").exists()


def test_missing_data_dirs_are_one_line_and_stay_missing(tmp_path: Path) -> None:
    missing = tmp_path / "nothing"
    for args in (
        ["topics", str(missing), "list"],
        ["topics", str(missing), "describe"],
        ["topics", str(missing), "alter", "--topic", "t", "--partitions", "2"],
        ["topics", str(missing), "delete", "--topic", "t"],
        ["config", "show", str(missing)],
        ["check", str(missing)],
        ["clean", str(missing)],
        ["delete-records", str(missing), "--topic", "t", "--partition", "0", "--offset", "1"],
    ):
        assert one_error_line(run(*args, code=1)) == f"seglogfs: {missing}: no such data dir", args
    assert not missing.exists()
