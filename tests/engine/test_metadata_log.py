"""The KRaft metadata log reader (engine.internal_topics.metadata_log), against the broker fixtures and hand-made
records.

The oracle for the fixtures is independent of the decoder: the topic dirs a broker made, and the
topic id it wrote into each one's `partition.metadata`, must be what the metadata log says.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from seglogfs.engine.internal_topics.metadata_log import (
    METADATA_PARTITION_DIR,
    ConfigRecord,
    MetadataLogError,
    RemoveTopicRecord,
    TopicRecord,
    decode_metadata_record,
    read_metadata_image,
    topic_id_text,
)
from seglogfs.engine.log.checkpoint import read_partition_metadata
from seglogfs.engine.log.naming import parse_partition_dir
from seglogfs.engine.record.builder import build_batch
from tests.conftest import NOW_MS, kafka_fixtures

KRAFT_DIRS = ["flink-on-prem-cp760", "experts-kafka-data", "ne-streaming-d95be01"]
ZOOKEEPER_DIRS = ["spooldir-cp512", "bigdata-sensor-suhu"]


# -- records written the way Kafka's MetadataRecordSerde writes them ----------------------------------
def uvarint(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def compact_string(text: str | None) -> bytes:
    if text is None:
        return uvarint(0)
    data = text.encode()
    return uvarint(len(data) + 1) + data


def frame(api_key: int, body: bytes, *, version: int = 0, frame_version: int = 1, tags: bytes = b"\x00") -> bytes:
    return uvarint(frame_version) + uvarint(api_key) + uvarint(version) + body + tags


def topic_record(name: str, topic_id: bytes) -> bytes:
    return frame(2, compact_string(name) + topic_id)


def config_record(name: str, key: str, value: str | None, resource_type: int = 2) -> bytes:
    return frame(4, bytes([resource_type]) + compact_string(name) + compact_string(key) + compact_string(value))


def remove_topic_record(topic_id: bytes) -> bytes:
    return frame(9, topic_id)


def noop_record() -> bytes:
    return frame(20, b"")


def write_log(path: Path, values: list[bytes], base_offset: int = 0, per_batch: int = 2) -> None:
    """`values` as record batches of `per_batch` records from `base_offset`."""
    data = bytearray()
    for start in range(0, len(values), per_batch):
        data += build_batch(values[start : start + per_batch], timestamps=NOW_MS, base_offset=base_offset + start)
    path.write_bytes(bytes(data))


def metadata_dir(tmp_path: Path) -> Path:
    directory = tmp_path / METADATA_PARTITION_DIR
    directory.mkdir()
    return directory


ID_A = uuid.UUID("6f1c2a4e-8d3b-4c5a-9e7f-0a1b2c3d4e5f").bytes  # (fixed: test ids name them)
ID_B = uuid.UUID("1d2e3f40-5a6b-4c7d-8e9f-a0b1c2d3e4f5").bytes


# -- decoding one record -----------------------------------------------------------------------------
def test_records_decode_field_by_field() -> None:
    assert decode_metadata_record(topic_record("orders", ID_A)) == TopicRecord("orders", ID_A)
    assert decode_metadata_record(config_record("orders", "retention.ms", "1000")) == ConfigRecord(
        2, "orders", "retention.ms", "1000"
    )
    assert decode_metadata_record(config_record("", "log.retention.ms", "5", 4)) == ConfigRecord(
        4, "", "log.retention.ms", "5"
    )
    assert decode_metadata_record(config_record("orders", "retention.ms", None)).value is None  # type: ignore[union-attr]
    assert decode_metadata_record(remove_topic_record(ID_A)) == RemoveTopicRecord(ID_A)
    assert decode_metadata_record(noop_record()) is None  # not a record read here


def test_tagged_fields_are_skipped() -> None:
    tags = uvarint(1) + uvarint(7) + uvarint(3) + b"xyz"
    assert decode_metadata_record(frame(2, compact_string("t") + ID_A, tags=tags)) == TopicRecord("t", ID_A)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (frame(2, compact_string("t") + ID_A, frame_version=0), "frame version 0"),
        (frame(2, compact_string("t") + ID_A, version=1), "type 2 in version 1"),
        (topic_record("t", ID_A) + b"!", "1 bytes follow"),
        (frame(2, compact_string("t") + ID_A[:5]), "runs past the end"),
        (frame(2, compact_string(None) + ID_A), "null in a string field"),
    ],
)
def test_a_record_this_reader_does_not_know_is_refused(value: bytes, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        decode_metadata_record(value)


def test_topic_ids_print_as_kafka_prints_them() -> None:
    assert topic_id_text(bytes(16)) == "AAAAAAAAAAAAAAAAAAAAAA"


# -- replaying a log --------------------------------------------------------------------------------
def test_later_config_records_win_and_null_removes_an_override(tmp_path: Path) -> None:
    directory = metadata_dir(tmp_path)
    write_log(
        directory / "00000000000000000000.log",
        [
            topic_record("orders", ID_A),
            config_record("orders", "retention.ms", "1000"),
            config_record("orders", "cleanup.policy", "compact"),
            noop_record(),
            config_record("orders", "retention.ms", "2000"),
            config_record("orders", "cleanup.policy", None),
            config_record("", "log.retention.ms", "5", 4),
        ],
    )
    image = read_metadata_image(directory)
    assert image.topics == {"orders": topic_id_text(ID_A)}
    assert image.topic_configs == {"orders": {"retention.ms": "2000"}}
    assert image.broker_configs == {"": {"log.retention.ms": "5"}}
    assert image.end_offset == 7 and image.snapshot is None


def test_remove_topic_record_drops_the_topic_and_its_configs(tmp_path: Path) -> None:
    directory = metadata_dir(tmp_path)
    write_log(
        directory / "00000000000000000000.log",
        [
            topic_record("a", ID_A),
            config_record("a", "cleanup.policy", "compact"),
            topic_record("b", ID_B),
            remove_topic_record(ID_A),
        ],
    )
    image = read_metadata_image(directory)
    assert image.topics == {"b": topic_id_text(ID_B)}
    assert image.topic_configs == {}


def test_reading_stops_at_a_torn_tail(tmp_path: Path) -> None:
    directory = metadata_dir(tmp_path)
    path = directory / "00000000000000000000.log"
    write_log(path, [topic_record("a", ID_A), config_record("a", "cleanup.policy", "compact")], per_batch=1)
    path.write_bytes(path.read_bytes()[:-5])  # the second batch is cut short
    image = read_metadata_image(directory)
    assert image.topics == {"a": topic_id_text(ID_A)} and image.topic_configs == {}
    assert image.end_offset == 1


def test_a_snapshot_then_the_log_after_it(tmp_path: Path) -> None:
    directory = metadata_dir(tmp_path)
    # The snapshot holds the state below offset 4; the log was trimmed to start at 2.
    write_log(
        directory / "00000000000000000004-0000000001.checkpoint",
        [topic_record("a", ID_A), config_record("a", "cleanup.policy", "compact")],
    )
    write_log(
        directory / "00000000000000000002.log",
        [
            config_record("a", "cleanup.policy", "delete"),  # offset 2: inside the snapshot already
            noop_record(),
            config_record("a", "retention.ms", "9"),  # offset 4: after it
            topic_record("b", ID_B),
        ],
        base_offset=2,
    )
    (directory / "00000000000000000009-0000000001.checkpoint.part").write_bytes(b"half-written")
    image = read_metadata_image(directory)
    assert image.snapshot == directory / "00000000000000000004-0000000001.checkpoint"
    assert image.topics == {"a": topic_id_text(ID_A), "b": topic_id_text(ID_B)}
    assert image.topic_configs == {"a": {"cleanup.policy": "compact", "retention.ms": "9"}}
    assert image.end_offset == 6


def test_a_log_missing_its_start_without_a_snapshot_is_refused(tmp_path: Path) -> None:
    directory = metadata_dir(tmp_path)
    write_log(directory / "00000000000000000010.log", [topic_record("a", ID_A)], base_offset=10)
    with pytest.raises(MetadataLogError, match="starts at offset 10 and no snapshot covers"):
        read_metadata_image(directory)


def test_an_undecodable_record_names_file_and_offset(tmp_path: Path) -> None:
    directory = metadata_dir(tmp_path)
    write_log(directory / "00000000000000000000.log", [noop_record(), frame(4, b"\x02", version=3)])
    with pytest.raises(MetadataLogError, match=r"00000000000000000000\.log: metadata record at offset 1"):
        read_metadata_image(directory)


# -- the broker fixtures ------------------------------------------------------------------------------
@pytest.mark.parametrize("name", KRAFT_DIRS)
def test_every_topic_dir_is_in_the_metadata_log_with_its_topic_id(name: str) -> None:
    data_dir = kafka_fixtures() / name
    image = read_metadata_image(data_dir / METADATA_PARTITION_DIR)
    checked = 0
    for partition_dir in sorted(p for p in data_dir.iterdir() if p.is_dir()):
        parsed = parse_partition_dir(partition_dir.name)
        if parsed is None or partition_dir.name == METADATA_PARTITION_DIR:
            continue
        topic = parsed[0]
        assert topic in image.topics, f"{partition_dir.name}: no TopicRecord for {topic}"
        written = read_partition_metadata(partition_dir / "partition.metadata")
        if written is not None:
            assert image.topics[topic] == written, f"{partition_dir.name}: topic id"
            checked += 1
    assert checked > 0


def test_flink_fixture_configs_are_the_brokers() -> None:
    image = read_metadata_image(kafka_fixtures() / "flink-on-prem-cp760" / METADATA_PARTITION_DIR)
    configs = image.topic_configs
    for topic in ("_schemas", "connect-configs", "connect-offsets", "connect-status", "_confluent-command"):
        assert configs[topic]["cleanup.policy"] == "compact", topic
    assert configs["__consumer_offsets"] == {
        "cleanup.policy": "compact",
        "compression.type": "producer",
        "segment.bytes": "104857600",
    }
    assert configs["_confluent-monitoring"]["retention.ms"] == "259200000"
    assert "orders" in image.topics and "orders" not in configs  # broker defaults
    assert image.broker_configs == {}


def test_the_snapshot_agrees_with_replaying_the_whole_log() -> None:
    directory = kafka_fixtures() / "flink-on-prem-cp760" / METADATA_PARTITION_DIR
    from_snapshot = read_metadata_image(directory)
    from_log = read_metadata_image(directory, use_snapshot=False)
    assert from_snapshot.snapshot is not None and from_snapshot.snapshot.name.startswith("00000000000000014926-")
    assert from_log.snapshot is None
    assert from_snapshot.topics == from_log.topics
    assert from_snapshot.topic_configs == from_log.topic_configs
    assert from_snapshot.end_offset == from_log.end_offset == 17027


@pytest.mark.parametrize("name", ZOOKEEPER_DIRS)
def test_zookeeper_mode_dirs_have_no_metadata_log(name: str) -> None:
    data_dir = kafka_fixtures() / name
    assert not (data_dir / METADATA_PARTITION_DIR).exists()
    assert "broker.id" in (data_dir / "meta.properties").read_text()
