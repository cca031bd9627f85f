"""Topic configs of a broker's data dir (engine.datadir with engine.config's layers): the KRaft
metadata log, Kafka's internal topics, `__cluster_metadata`, configs that cannot be known, and the
data dir's tables under concurrent topic creation and config changes."""

from __future__ import annotations

import json
import logging
import threading
from pathlib import Path

import pytest

from seglogfs.engine import BrokerConfig, DataDir
from seglogfs.engine.config import METADATA_TOPIC
from seglogfs.engine.errors import ConfigError, InvalidRecordError
from seglogfs.engine.internal_topics.metadata_log import METADATA_PARTITION_DIR
from tests.conftest import NOW_MS, assert_log_dir_valid, broker_config, copy_fixture, kafka_fixtures
from tests.engine.test_metadata_log import config_record, frame, topic_record, write_log

DAY_MS = 86_400_000
FAR_FUTURE_MS = NOW_MS + 3650 * DAY_MS  # every fixture record is older than any retention.ms here
UNKNOWN_WARNING = r"retention and compaction are off for \d+ topics whose broker configs are unknown"


def policies(data_dir: DataDir) -> dict[str, tuple[str, ...]]:
    return {topic: data_dir.topic_config(topic).cleanup_policy for topic in data_dir.topics()}


def unknown_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING and "are unknown" in r.getMessage()]


# -- a KRaft broker's dir -------------------------------------------------------------------------
def test_kraft_dir_takes_its_topic_configs_from_the_metadata_log(caplog: pytest.LogCaptureFixture) -> None:
    config = BrokerConfig.load(log_dirs=[kafka_fixtures() / "flink-on-prem-cp760"])
    with DataDir.open(config, read_only=True, now_ms=NOW_MS) as data_dir:
        policy = policies(data_dir)
        assert data_dir.unknown_config_topics() == {}
        for topic in ("__consumer_offsets", "_schemas", "connect-configs", "connect-offsets", "connect-status"):
            assert policy[topic] == ("compact",), topic
        assert policy[METADATA_TOPIC] == ()  # never deleted or compacted
        assert policy["orders"] == ("delete",)  # no ConfigRecord: the broker default
        offsets = data_dir.topic_config("__consumer_offsets")
        assert offsets.segment_bytes == 104_857_600 and offsets.compression_type == "producer"
        monitoring = data_dir.topic_config("_confluent-monitoring")
        assert monitoring.retention_ms == 259_200_000 and monitoring.message_timestamp_type == "LogAppendTime"
        assert data_dir.partition(METADATA_TOPIC, 0).config.as_properties()["cleanup.policy"] == ""
    assert unknown_warnings(caplog) == []


def test_seglogfs_overrides_win_over_the_metadata_log(tmp_path: Path) -> None:
    copy = copy_fixture("flink-on-prem-cp760", tmp_path)
    config = BrokerConfig.load(overrides=["log.retention.ms=1000", "log.segment.bytes=2048"], log_dirs=[copy])
    with DataDir.open(config, now_ms=NOW_MS) as data_dir:
        # broker level (server.properties, --override) < the topic's ConfigRecords
        assert data_dir.topic_config("_confluent-monitoring").retention_ms == 259_200_000
        assert data_dir.topic_config("orders").retention_ms == 1000
        assert data_dir.topic_config("__consumer_offsets").segment_bytes == 104_857_600
        # the topic's ConfigRecords < its seglogfs overrides
        data_dir.set_topic_overrides("_schemas", {"cleanup.policy": "delete", "retention.ms": "5"})
        schemas = data_dir.partition("_schemas", 0).config
        assert schemas.cleanup_policy == ("delete",) and schemas.retention_ms == 5
        assert data_dir.topic_overrides("_schemas") == {"cleanup.policy": "delete", "retention.ms": "5"}
        data_dir.set_topic_overrides("_schemas", {})
        assert data_dir.partition("_schemas", 0).config.cleanup_policy == ("compact",)


def test_cluster_metadata_is_never_cleaned_whatever_is_set(tmp_path: Path) -> None:
    copy = copy_fixture("experts-kafka-data", tmp_path)
    before = {p.name: p.read_bytes() for p in (copy / METADATA_PARTITION_DIR).iterdir()}
    config = BrokerConfig.load(overrides=["log.cleanup.policy=compact,delete", "log.retention.ms=1"], log_dirs=[copy])
    with DataDir.open(config, now_ms=NOW_MS) as data_dir:
        with pytest.raises(ConfigError, match="__cluster_metadata is Kafka's metadata log"):
            data_dir.set_topic_overrides(METADATA_TOPIC, {"cleanup.policy": "delete"})
        data_dir.set_topic_overrides(METADATA_TOPIC, {"retention.ms": "1", "retention.bytes": "1"})
        assert data_dir.partition(METADATA_TOPIC, 0).config.cleanup_policy == ()
        report = data_dir.clean(FAR_FUTURE_MS)
        assert all(log.topic != METADATA_TOPIC for log, _ in report.retention)
        assert all(result.topic != METADATA_TOPIC for result in report.compaction)
    after = {p.name: p.read_bytes() for p in (copy / METADATA_PARTITION_DIR).iterdir()}
    assert {name: data for name, data in after.items() if name.endswith(".log")} == {
        name: data for name, data in before.items() if name.endswith(".log")
    }


def test_dynamic_broker_configs_sit_between_server_properties_and_override(tmp_path: Path) -> None:
    log_dir = tmp_path / "logs"
    directory = log_dir / METADATA_PARTITION_DIR
    directory.mkdir(parents=True)
    (log_dir / "meta.properties").write_text("version=1\nnode.id=3\n")
    write_log(
        directory / "00000000000000000000.log",
        [
            topic_record("t", bytes(16)),
            config_record("", "log.retention.ms", "5000", 4),  # cluster-wide default
            config_record("3", "log.segment.bytes", "4096", 4),  # this broker
            config_record("7", "log.segment.bytes", "8192", 4),  # another broker
            config_record("", "min.insync.replicas", "2", 4),  # sets no topic default
        ],
    )
    (log_dir / "t-0").mkdir()
    properties = tmp_path / "server.properties"
    properties.write_text("log.retention.ms=1\nlog.segment.bytes=1024\nlog.index.interval.bytes=64\n")
    with DataDir.open(BrokerConfig.load(properties, log_dirs=[log_dir]), read_only=True, now_ms=NOW_MS) as data_dir:
        config = data_dir.topic_config("t")
        assert (config.retention_ms, config.segment_bytes, config.index_interval_bytes) == (5000, 4096, 64)
    overridden = BrokerConfig.load(properties, ["log.segment.bytes=2048"], log_dirs=[log_dir])
    with DataDir.open(overridden, read_only=True, now_ms=NOW_MS) as data_dir:
        assert data_dir.topic_config("t").segment_bytes == 2048
    # --override log.retention.hours beats the dynamic log.retention.ms, the more precise name.
    properties.write_text("log.segment.bytes=1024\n")
    overridden = BrokerConfig.load(properties, ["log.retention.hours=2"], log_dirs=[log_dir])
    with DataDir.open(overridden, read_only=True, now_ms=NOW_MS) as data_dir:
        assert data_dir.topic_config("t").retention_ms == 2 * 3_600_000


# -- a ZooKeeper-mode broker's dir: configs that cannot be known -------------------------------------
@pytest.mark.expect_warnings(UNKNOWN_WARNING)
def test_zookeeper_dir_deletes_and_compacts_nothing_until_a_policy_is_set(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    copy = copy_fixture("spooldir-cp512", tmp_path)
    with DataDir.open(BrokerConfig.load(log_dirs=[copy]), now_ms=NOW_MS) as data_dir:
        warnings = unknown_warnings(caplog)
        assert len(warnings) == 1, warnings  # one per data dir
        assert "ZooKeeper-mode" in warnings[0] and "_schemas" in warnings[0] and "log.cleanup.policy" in warnings[0]
        unknown = data_dir.unknown_config_topics()
        assert "_schemas" in unknown and "docker-connect-offsets" in unknown and "test10" in unknown
        assert "__consumer_offsets" not in unknown  # Kafka's internal configs are known
        policy = policies(data_dir)
        assert policy["__consumer_offsets"] == ("compact",)
        assert all(policy[topic] == () for topic in unknown)
        sizes = {topic: data_dir.partition(topic, 0).log_end_offset for topic in unknown}
        report = data_dir.clean(FAR_FUTURE_MS)
        assert {log.topic for log, _ in report.retention} == set()
        assert all(data_dir.partition(t, 0).log_start_offset == 0 for t in unknown)
        assert {t: data_dir.partition(t, 0).log_end_offset for t in unknown} == sizes
        # The operator sets a policy for one topic: that one is managed from now on.
        data_dir.set_topic_overrides("test10", {"cleanup.policy": "delete"})
        assert "test10" not in data_dir.unknown_config_topics()
        assert [log.topic for log, _ in data_dir.clean(FAR_FUTURE_MS).retention] == ["test10"]
        # Other settings alone are not a policy.
        data_dir.set_topic_overrides("_schemas", {"segment.bytes": "1048576"})
        assert data_dir.partition("_schemas", 0).config.cleanup_policy == ()
    assert_log_dir_valid(copy)


def test_an_override_policy_makes_every_topic_managed(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    copy = copy_fixture("spooldir-cp512", tmp_path)
    config = BrokerConfig.load(overrides=["log.cleanup.policy=compact"], log_dirs=[copy])
    with DataDir.open(config, now_ms=NOW_MS) as data_dir:
        assert data_dir.unknown_config_topics() == {}
        assert set(policies(data_dir).values()) == {("compact",)}
    assert unknown_warnings(caplog) == []


def test_a_policy_in_server_properties_is_not_the_operators_word(tmp_path: Path) -> None:
    # A ZooKeeper-mode broker's server.properties often spells out the default; its compacted
    # topics (_schemas, connect-*) had their own cleanup.policy in ZooKeeper all the same.
    properties = tmp_path / "server.properties"
    properties.write_text("log.cleanup.policy=delete\n")
    config = BrokerConfig.load(properties, log_dirs=[kafka_fixtures() / "spooldir-cp512"])
    with DataDir.open(config, read_only=True, now_ms=NOW_MS) as data_dir:
        assert "_schemas" in data_dir.unknown_config_topics()
        assert data_dir.topic_config("_schemas").cleanup_policy == ()


def test_read_only_open_of_a_zookeeper_dir_does_not_warn(caplog: pytest.LogCaptureFixture) -> None:
    config = BrokerConfig.load(log_dirs=[kafka_fixtures() / "bigdata-sensor-suhu"])
    with DataDir.open(config, read_only=True, now_ms=NOW_MS) as data_dir:
        assert set(data_dir.unknown_config_topics()) == {"sensor-suhu"}
        assert data_dir.topic_config("sensor-suhu").cleanup_policy == ()
    assert unknown_warnings(caplog) == []


@pytest.mark.expect_warnings(UNKNOWN_WARNING)
def test_topics_seglogfs_creates_in_a_broker_dir_stay_managed(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    copy = copy_fixture("bigdata-sensor-suhu", tmp_path)
    with DataDir.open(BrokerConfig.load(log_dirs=[copy]), now_ms=NOW_MS) as data_dir:
        data_dir.create_topic("fresh", 2, now_ms=NOW_MS)
        data_dir.create_topic("kept", 1, {"cleanup.policy": "compact"}, now_ms=NOW_MS)
        assert set(data_dir.unknown_config_topics()) == {"sensor-suhu"}
        assert data_dir.topic_overrides("fresh") == {"cleanup.policy": "delete"}
        assert data_dir.topic_config("kept").cleanup_policy == ("compact",)
    caplog.clear()
    with DataDir.open(BrokerConfig.load(log_dirs=[copy]), now_ms=NOW_MS) as data_dir:
        assert set(data_dir.unknown_config_topics()) == {"sensor-suhu"}
        assert data_dir.topic_config("fresh").cleanup_policy == ("delete",)
    assert len(unknown_warnings(caplog)) == 1


@pytest.mark.expect_warnings(UNKNOWN_WARNING)
# (the replaced log leaves the fixture's index pointing past its end: rebuilt, with a warning)
@pytest.mark.expect_warnings(r"__cluster_metadata-0/00000000000000000000\.index: corrupt index: .* points past the end")
def test_an_unreadable_metadata_log_leaves_its_topics_alone(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    copy = copy_fixture("ne-streaming-d95be01", tmp_path)
    for path in (copy / METADATA_PARTITION_DIR).glob("*.log"):
        path.unlink()
    write_log(copy / METADATA_PARTITION_DIR / "00000000000000000000.log", [frame(2, b"\x02t", version=9)])
    with DataDir.open(BrokerConfig.load(log_dirs=[copy]), now_ms=NOW_MS) as data_dir:
        unknown = data_dir.unknown_config_topics()
        assert set(unknown) == {"your-kafka-topic"}
        assert "metadata log cannot be used" in unknown["your-kafka-topic"]
        assert data_dir.topic_config("__consumer_offsets").cleanup_policy == ("compact",)
    assert "metadata log cannot be used" in unknown_warnings(caplog)[0]


def test_a_dir_seglogfs_made_keeps_the_broker_defaults(data_dir: DataDir, caplog: pytest.LogCaptureFixture) -> None:
    data_dir.create_topic("t", 1, now_ms=NOW_MS)
    assert data_dir.topic_config("t").cleanup_policy == ("delete",)
    assert data_dir.topic_overrides("t") == {}  # nothing recorded: no broker to tell apart from
    assert not (data_dir.config.log_dirs[0] / ".seglogfs-topic-configs.json").exists()
    assert data_dir.unknown_config_topics() == {}
    assert unknown_warnings(caplog) == []


# -- the data dir's tables under concurrency ----------------------------------------------------------
# Topics created while two readers iterate the topic and partition tables and a checkpointer writes:
# each creation is a window for a reader to see a topic without all its partitions (or a table
# changing under its iteration). 20 such windows, each crossed by both readers; 40 took half as
# long again (most of it waiting on the checkpointer's and the creations' syncs).
TOPICS_CREATED = 20


def test_topic_creation_beside_readers_that_iterate(log_dir: Path) -> None:
    config = broker_config(log_dir, log_segment_bytes=4096)
    errors: list[BaseException] = []
    done = threading.Event()
    partial: list[str] = []
    with DataDir.open(config, now_ms=NOW_MS) as data_dir:
        data_dir.create_topic("compacted", 2, {"cleanup.policy": "compact"}, now_ms=NOW_MS)

        def create() -> None:
            try:
                for number in range(TOPICS_CREATED):
                    data_dir.create_topic(f"t{number}", 3, now_ms=NOW_MS)
            except BaseException as error:
                errors.append(error)
            finally:
                done.set()

        def read() -> None:
            try:
                while not done.is_set():
                    for topic, partitions in data_dir.topics().items():
                        if topic.startswith("t") and partitions != [0, 1, 2]:
                            partial.append(f"{topic}: {partitions}")
                    data_dir.log_cleaner.cleanable_logs(NOW_MS)
                    list(data_dir.partitions())
            except BaseException as error:
                errors.append(error)

        def checkpoint() -> None:  # the scheduler's work, one caller
            try:
                while not done.is_set():
                    data_dir.checkpoint()
            except BaseException as error:
                errors.append(error)

        threads = [threading.Thread(target=f) for f in (create, read, read, checkpoint)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=120)
        assert errors == []
        assert partial == []  # a topic appears with all its partitions or not at all
        assert len(data_dir.topics()) == TOPICS_CREATED + 1
    assert_log_dir_valid(log_dir)


def test_concurrent_config_changes_leave_one_whole_file(log_dir: Path) -> None:
    errors: list[BaseException] = []
    with DataDir.open(broker_config(log_dir), now_ms=NOW_MS) as data_dir:
        for topic in ("a", "b", "c", "d"):
            data_dir.create_topic(topic, 1, now_ms=NOW_MS)

        def alter(topic: str) -> None:
            try:
                for value in range(1, 30):
                    data_dir.set_topic_overrides(topic, {"retention.ms": str(value * 1000)})
            except BaseException as error:
                errors.append(error)

        threads = [threading.Thread(target=alter, args=(topic,)) for topic in ("a", "b", "c", "d")]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=120)
        assert errors == []
        saved = json.loads((log_dir / ".seglogfs-topic-configs.json").read_text())["topics"]
        assert saved == {topic: {"retention.ms": "29000"} for topic in ("a", "b", "c", "d")}
        assert all(data_dir.partition(t, 0).config.retention_ms == 29000 for t in ("a", "b", "c", "d"))
    assert [p.name for p in log_dir.iterdir() if p.name.endswith(".tmp")] == []


def test_the_metadata_log_takes_no_appends(tmp_path: Path) -> None:
    """Only a broker's controller writes `__cluster_metadata`: a record from a produce or an
    append file would corrupt the broker's metadata."""
    copy = copy_fixture("flink-on-prem-cp760", tmp_path)
    with DataDir.open(BrokerConfig.load(log_dirs=[copy]), now_ms=NOW_MS) as data_dir:
        log = data_dir.partition(METADATA_TOPIC, 0)
        end = log.log_end_offset
        with pytest.raises(InvalidRecordError, match="metadata log takes no appends"):
            log.append_records([b"x"], keys=[b"k"], now_ms=NOW_MS)
        assert log.log_end_offset == end


def test_a_topic_that_cannot_be_made_leaves_nothing_behind(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A partition that cannot be made (a full disk at the second): the partition dirs made and
    the topic's overrides are removed again, so the name is free; a partition dir a crash left
    (not loaded) is not ours: creating the topic over it is refused and it stays."""
    from seglogfs.engine.errors import TopicExistsError
    from seglogfs.engine.log.log import PartitionLog

    log_dir = tmp_path / "logs"
    with DataDir.open(broker_config(log_dir), now_ms=NOW_MS) as data_dir:
        real_create, calls = PartitionLog.create, []

        def full_at_the_second(*args, **kwargs):
            calls.append(args)
            if len(calls) == 2:
                raise OSError(28, "No space left on device")
            return real_create(*args, **kwargs)

        monkeypatch.setattr(PartitionLog, "create", full_at_the_second)
        with pytest.raises(OSError, match="No space"):
            data_dir.create_topic("t", 3, {"retention.ms": "5"}, now_ms=NOW_MS)
        monkeypatch.undo()
        assert not list(log_dir.glob("t-*"))
        assert "t" not in data_dir.topics()
        data_dir.create_topic("t", 3, now_ms=NOW_MS)
        assert data_dir.partition("t", 0).config.retention_ms != 5  # (the overrides went with it)
        (log_dir / "u-0").mkdir()
        with pytest.raises(TopicExistsError, match="u-0 exists already"):
            data_dir.create_topic("u", 1, now_ms=NOW_MS)
        assert (log_dir / "u-0").is_dir()
