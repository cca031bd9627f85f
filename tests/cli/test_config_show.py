"""`seglogfs config show`: every effective value and where it comes from, run as a real process."""

from __future__ import annotations

import re
from pathlib import Path

from seglogfs.engine import BrokerConfig, DataDir
from seglogfs.engine.internal_topics.metadata_log import METADATA_PARTITION_DIR
from tests.cli.support import one_error_line, run, run_json
from tests.conftest import NOW_MS
from tests.engine.test_metadata_log import config_record, topic_record, write_log


def shown(*args: str) -> dict[str, tuple[str, str, str]]:
    """name → (value, source, detail) as `config show --json` gives them."""
    document = run_json("config", "show", *args)
    return {e["name"]: (e["value"], e["source"], e["detail"]) for e in document["configs"]}


def test_each_layer_is_named(tmp_path: Path) -> None:
    data = tmp_path / "data"
    properties = tmp_path / "server.properties"
    properties.write_text("# a broker's file\nlog.retention.hours=2\nnum.partitions=3\nlog.segment.bytes=5000\n")
    run("topics", str(data), "create", "--topic", "t", "--config", "segment.ms=60000")
    common = ["-c", str(properties), "--override", "log.segment.bytes=70000", "--override", "log.cleaner.enable=false"]

    broker = shown(str(data), *common)
    assert broker["log.dirs"] == (str(data), "DATADIR", "")
    assert broker["num.partitions"] == ("3", "server.properties", f"{properties}:3 num.partitions=3")
    # the precise name Kafka's precedence reads, and the name that set it
    assert broker["log.retention.ms"] == ("7200000", "server.properties", f"{properties}:2 log.retention.hours=2")
    assert broker["log.segment.bytes"] == ("70000", "--override", "log.segment.bytes=70000")
    assert broker["log.cleaner.enable"] == ("false", "--override", "log.cleaner.enable=false")
    assert broker["log.roll.ms"] == ("604800000", "default", "")
    assert broker["log.cleanup.policy"] == ("delete", "default", "")

    topic = shown(str(data), "--topic", "t", *common)
    assert set(topic) == set(BrokerConfig.load().topic_defaults.as_properties())
    assert topic["segment.ms"] == ("60000", "topic-override", str(data / ".seglogfs-topic-configs.json"))
    assert topic["retention.ms"][:2] == ("7200000", "server.properties")
    assert topic["segment.bytes"][:2] == ("70000", "--override")
    assert topic["max.message.bytes"] == ("1048588", "default", "")

    # The values are the engine's own.
    config = BrokerConfig.load(properties, common[3::2], log_dirs=[data])
    with DataDir.open(config, read_only=True, now_ms=NOW_MS) as data_dir:
        effective = data_dir.topic_config("t").as_properties()
    assert {name: entry[0] for name, entry in topic.items()} == effective

    text = run("config", "show", str(data), "--topic", "t", *common).stdout.splitlines()
    assert len(text) == len(topic)
    assert re.fullmatch(r"segment\.ms=60000 +topic-override \(.*\.seglogfs-topic-configs\.json\)", text[1]), text[1]
    assert re.fullmatch(r"retention\.bytes=-1 +default", text[8]), text[8]


def test_a_kraft_brokers_metadata_log(tmp_path: Path) -> None:
    """Dynamic broker configs (cluster default, then this broker's) over server.properties and
    under --override; topic configs from ConfigRecords; cleanup off for `__cluster_metadata`."""
    data = tmp_path / "broker"
    metadata = data / METADATA_PARTITION_DIR
    metadata.mkdir(parents=True)
    (data / "meta.properties").write_text("version=1\nnode.id=3\n")
    write_log(
        metadata / "00000000000000000000.log",
        [
            topic_record("t", bytes(16)),
            config_record("t", "max.message.bytes", "2000"),
            config_record("", "log.retention.ms", "5000", 4),  # cluster-wide default
            config_record("", "log.segment.bytes", "9000", 4),
            config_record("3", "log.segment.bytes", "4096", 4),  # this broker
            config_record("7", "log.index.interval.bytes", "8", 4),  # another broker
            config_record("", "log.roll.ms", "77777", 4),  # loses to --override log.roll.hours
        ],
    )
    (data / "t-0").mkdir()
    properties = tmp_path / "server.properties"
    properties.write_text("log.retention.ms=1\nlog.segment.bytes=1024\nlog.index.interval.bytes=64\n")
    args = [str(data), "-c", str(properties), "--override", "log.roll.hours=2"]

    broker = shown(*args)
    assert broker["log.retention.ms"] == (
        "5000", "metadata-log", f"{metadata}: dynamic cluster default config log.retention.ms=5000"
    )  # fmt: skip
    assert broker["log.segment.bytes"] == (
        "4096",
        "metadata-log",
        f"{metadata}: dynamic broker 3 config log.segment.bytes=4096",
    )
    assert broker["log.index.interval.bytes"][:2] == ("64", "server.properties")
    assert broker["log.roll.ms"] == ("7200000", "--override", "log.roll.hours=2")

    topic = shown(*args, "--topic", "t")
    assert topic["max.message.bytes"] == ("2000", "metadata-log", f"{metadata}: topic config max.message.bytes=2000")
    assert topic["retention.ms"][:2] == ("5000", "metadata-log")
    assert topic["cleanup.policy"] == ("delete", "default", "")

    cluster = shown(*args, "--topic", "__cluster_metadata")
    assert cluster["cleanup.policy"][:2] == ("", "cleanup-off")
    assert "Kafka trims its metadata log with snapshots" in cluster["cleanup.policy"][2]


def test_unknown_broker_configs_say_why(tmp_path: Path) -> None:
    data = tmp_path / "zk"
    (data / "t-0").mkdir(parents=True)
    (data / "meta.properties").write_text("version=0\nbroker.id=1001\n")  # a ZooKeeper-mode broker's dir
    value, source, detail = shown(str(data), "--topic", "t")["cleanup.policy"]
    assert (value, source) == ("", "cleanup-off") and "ZooKeeper" in detail
    assert detail.endswith(
        "; set cleanup.policy in the topic's config, or --override log.cleanup.policy=delete|compact "
        "for all such topics"
    )
    # In text the empty policy is said as such (a blank value read as if the source were the
    # value), and the detail is one parenthesis: it names no layer as having set a policy.
    line = next(
        line
        for line in run("config", "show", str(data), "--topic", "t").stdout.splitlines()
        if line.startswith("cleanup.policy=")
    )
    assert re.fullmatch(r"cleanup\.policy=\(none\) +cleanup-off \(no metadata log: [^()]*ZooKeeper[^()]*\)", line), line
    value, source, _ = shown(str(data), "--topic", "t", "--override", "log.cleanup.policy=compact")["cleanup.policy"]
    assert (value, source) == ("compact", "--override")


def test_refusals(tmp_path: Path) -> None:
    data = tmp_path / "data"
    run("topics", str(data), "create", "--topic", "t")
    assert one_error_line(run("config", "show", str(data), "--topic", "u", code=1)) == "seglogfs: unknown topic 'u'"
    bad = run("config", "show", str(data), "--override", "log.segment.bytes=big", code=1)
    assert "--override log.segment.bytes: invalid value 'big'" in one_error_line(bad)
    assert "invalid choice: 'list'" in one_error_line(run("config", "list", str(data), code=2))


def test_a_bad_value_names_where_which_key_and_what_is_expected(tmp_path: Path) -> None:
    """As Kafka's ConfigException does (`Invalid value abc for configuration segment.bytes: Not a
    number of type INT`), never Python's words (`invalid literal for int() with base 10`)."""
    data = tmp_path / "data"
    run("topics", str(data), "create", "--topic", "t")
    properties = tmp_path / "server.properties"
    properties.write_text("num.partitions=3\nlog.segment.bytes = 12abc\n")
    assert one_error_line(run("config", "show", str(data), "-c", str(properties), code=1)) == (
        f"seglogfs: {properties}:2: invalid value '12abc' for log.segment.bytes: "
        "expected an integer from 14 to 2147483647"
    )
    said = {
        "num.partitions=abc": "--override num.partitions: invalid value 'abc' for num.partitions: "
        "expected an integer of at least 1",
        "log.retention.ms=1_000": "--override log.retention.ms: invalid value '1_000' for log.retention.ms: "
        "expected an integer of at least -1",
        "log.cleaner.min.cleanable.ratio=half": "--override log.cleaner.min.cleanable.ratio: invalid value 'half' "
        "for log.cleaner.min.cleanable.ratio: expected a number between 0 and 1",
    }
    for override, line in said.items():
        assert one_error_line(run("config", "show", str(data), "--override", override, code=1)) == f"seglogfs: {line}"
    created = run("topics", str(data), "create", "--topic", "u", "--config", "retention.ms=abc", code=1)
    assert one_error_line(created) == (
        "seglogfs: --config: invalid value 'abc' for retention.ms: expected an integer of at least -1"
    )
