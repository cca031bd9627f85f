"""`seglogfs groups list|describe` (kafka-consumer-groups) on real `__consumer_offsets`
partitions and on a data dir written here, checked against a decoding written in this test
(struct-level: batch header, varint records, the key and value schemas), not the engine's."""

from __future__ import annotations

import json
import struct
import subprocess
from pathlib import Path

import pytest

from seglogfs.engine import BrokerConfig, DataDir
from tests.cli.support import SEGLOGFS, one_error_line, run
from tests.conftest import NOW_MS, REPO, kafka_fixtures

BROKER_DIRS = ("experts-kafka-data", "flink-on-prem-cp760", "ne-streaming-d95be01")


# -- an independent decoding of the offsets topic --------------------------------------------------
def varint(buf: bytes, pos: int) -> tuple[int, int]:
    """A zig-zag varint (record fields)."""
    shift = raw = 0
    while True:
        byte = buf[pos]
        pos += 1
        raw |= (byte & 0x7F) << shift
        if byte < 0x80:
            return (raw >> 1) ^ -(raw & 1), pos
        shift += 7


def records(path: Path) -> list[tuple[int, bool, int, int, bytes | None, bytes | None]]:
    """(offset, is_control, is_transactional, producer_id, key, value) of every record of a
    `.log` file of uncompressed v2 batches."""
    data = path.read_bytes()
    out = []
    pos = 0
    while pos + 61 <= len(data):
        base_offset, length = struct.unpack_from(">qi", data, pos)
        attributes = struct.unpack_from(">h", data, pos + 21)[0]
        producer_id = struct.unpack_from(">q", data, pos + 43)[0]
        count = struct.unpack_from(">i", data, pos + 57)[0]
        assert attributes & 0x07 == 0, "the fixtures' offsets batches are uncompressed"
        cursor = pos + 61
        for _ in range(count):
            _length, cursor = varint(data, cursor)
            cursor += 1  # attributes
            _ts, cursor = varint(data, cursor)
            delta, cursor = varint(data, cursor)
            fields = []
            for _field in range(2):
                size, cursor = varint(data, cursor)
                fields.append(None if size < 0 else data[cursor : cursor + size])
                cursor += max(size, 0)
            headers, cursor = varint(data, cursor)
            assert headers == 0
            out.append((base_offset + delta, bool(attributes & 0x20), bool(attributes & 0x10), producer_id, *fields))
        pos += 12 + length
    return out


def short_string(buf: bytes, pos: int) -> tuple[str, int]:
    size = struct.unpack_from(">h", buf, pos)[0]
    return buf[pos + 2 : pos + 2 + size].decode(), pos + 2 + size


def expected_offsets(data_dir: Path) -> dict[str, dict[tuple[str, int], int]]:
    """group → (topic, partition) → committed offset, latest record wins, tombstones delete;
    offset values v0-v3 (non-flexible: the offset is the int64 after the version)."""
    groups: dict[str, dict[tuple[str, int], int]] = {}
    metadata: dict[str, bool] = {}
    for partition_dir in sorted(data_dir.glob("__consumer_offsets-*")):
        for log in sorted(partition_dir.glob("*.log")):
            for _offset, control, _txn, _pid, key, value in records(log):
                if control or key is None:
                    continue
                kind = struct.unpack_from(">h", key)[0]
                group, pos = short_string(key, 2)
                if kind == 2:
                    metadata[group] = value is not None
                    continue
                topic, pos = short_string(key, pos)
                partition = struct.unpack_from(">i", key, pos)[0]
                offsets = groups.setdefault(group, {})
                if value is None:
                    offsets.pop((topic, partition), None)
                else:
                    assert struct.unpack_from(">h", value)[0] <= 3
                    offsets[(topic, partition)] = struct.unpack_from(">q", value, 2)[0]
    names = {g for g, o in groups.items() if o} | {g for g, present in metadata.items() if present}
    return {g: groups.get(g, {}) for g in sorted(names)}


# -- the fixtures ----------------------------------------------------------------------------------
@pytest.mark.parametrize("name", BROKER_DIRS)
def test_broker_groups_match_an_independent_decoding(name: str) -> None:
    data_dir = kafka_fixtures() / name
    expected = expected_offsets(data_dir)
    assert expected, "every fixture here has consumer groups"
    listed = run("groups", "list", str(data_dir))
    assert listed.stdout.splitlines() == list(expected) and listed.stderr == ""
    document = json.loads(run("groups", "describe", str(data_dir), "--json").stdout)
    got = {
        g["group"]: {
            (o["topic"], o["partition"]): o["currentOffset"] for o in g["offsets"] if o["currentOffset"] is not None
        }
        for g in document["groups"]
    }
    assert got == expected


def test_describe_table_is_kafka_consumer_groups_shaped() -> None:
    data_dir = kafka_fixtures() / "experts-kafka-data"
    result = run("groups", "describe", str(data_dir), "--group", "sensor-group")
    lines = result.stdout.splitlines()
    # kafka-consumer-groups --describe: an empty line, the header, one row per partition.
    assert lines[0] == ""
    assert lines[1].split() == [
        "GROUP", "TOPIC", "PARTITION", "CURRENT-OFFSET", "LOG-END-OFFSET", "LAG", "CONSUMER-ID", "HOST", "CLIENT-ID",
    ]  # fmt: skip
    # The data dir holds sensor-data-topic-0: its log end offset and the lag are known.
    end = len(records(data_dir / "sensor-data-topic-0" / "00000000000000000000.log"))
    committed = expected_offsets(data_dir)["sensor-group"][("sensor-data-topic", 0)]
    assert lines[2].split() == ["sensor-group", "sensor-data-topic", "0", str(committed), str(end),
                                str(end - committed), "-", "-", "-"]  # fmt: skip
    # Columns start where the header's do (the tool's padding).
    assert lines[2].index(str(committed)) == lines[1].index("CURRENT-OFFSET")
    assert "Consumer group 'sensor-group' has no active members." in result.stderr


def test_members_and_partitions_not_held_here() -> None:
    data_dir = kafka_fixtures() / "flink-on-prem-cp760"
    document = json.loads(run("groups", "describe", str(data_dir), "--group", "_confluent-controlcenter-7-6-0-1",
                              "--json").stdout)  # fmt: skip
    (group,) = document["groups"]
    assert group["state"] == "Stable" and group["protocolType"] == "consumer" and len(group["members"]) == 12
    rows = {(o["topic"], o["partition"]): o for o in group["offsets"]}
    metrics = rows[("_confluent-metrics", 0)]  # a topic this data dir does not hold
    assert metrics["logEndOffset"] is None and metrics["lag"] is None
    assert metrics["consumerId"].startswith("_confluent-controlcenter-7-6-0-1-") and metrics["host"] == "/172.31.0.7"
    table = run("groups", "describe", str(data_dir), "--group", "_confluent-controlcenter-7-6-0-1").stdout
    row = next(line for line in table.splitlines() if " _confluent-metrics " in line and line.split()[2] == "0")
    assert row.split()[3:6] == ["0", "-", "-"]


def test_head_closes_the_pipe_quietly() -> None:
    data_dir = kafka_fixtures() / "flink-on-prem-cp760"
    for action in ("list", "describe"):
        done = subprocess.run(
            f"{SEGLOGFS} groups {action} {data_dir} | head -1; exit ${{PIPESTATUS[0]}}",
            shell=True, executable="/bin/bash", capture_output=True, cwd=REPO, timeout=60, check=False,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        assert b"Traceback" not in done.stderr and b"Broken pipe" not in done.stderr


# -- a data dir written here -----------------------------------------------------------------------
def offset_key(group: str, topic: str, partition: int) -> bytes:
    return struct.pack(">hh", 1, len(group)) + group.encode() + struct.pack(">h", len(topic)) + topic.encode() + \
        struct.pack(">i", partition)  # fmt: skip


def offset_value(offset: int, version: int = 3) -> bytes:
    if version == 1:  # offset, metadata, commitTimestamp, expireTimestamp
        return struct.pack(">hqhqq", 1, offset, 0, NOW_MS, -1)
    return struct.pack(">hqihq", 3, offset, 7, 0, NOW_MS)  # offset, leaderEpoch, metadata "", commitTimestamp


def group_metadata(group: str, member: str, topic: str, partitions: list[int]) -> tuple[bytes, bytes]:
    def s(text: str) -> bytes:
        return struct.pack(">h", len(text)) + text.encode()

    assignment = struct.pack(">hi", 0, 1) + s(topic) + struct.pack(">i", len(partitions)) + \
        b"".join(struct.pack(">i", p) for p in partitions) + struct.pack(">i", -1)  # fmt: skip
    subscription = struct.pack(">hi", 0, 1) + s(topic) + struct.pack(">i", -1)
    value = (
        struct.pack(">h", 3) + s("consumer") + struct.pack(">i", 4) + s("range") + s(member) + struct.pack(">q", NOW_MS)
        + struct.pack(">i", 1) + s(member) + struct.pack(">h", -1) + s("client-1") + s("/10.0.0.9")
        + struct.pack(">ii", 300000, 45000) + struct.pack(">i", len(subscription)) + subscription
        + struct.pack(">i", len(assignment)) + assignment
    )  # fmt: skip
    return struct.pack(">h", 2) + s(group), value


@pytest.fixture
def written(tmp_path: Path) -> Path:
    data = tmp_path / "data"
    config = BrokerConfig.load(log_dirs=[data])
    with DataDir.open(config, now_ms=NOW_MS) as data_dir:
        data_dir.create_topic("orders", 2, now_ms=NOW_MS)
        data_dir.partition("orders", 0).append_records([b"x"] * 10, now_ms=NOW_MS)
        offsets = data_dir.create_topic("__consumer_offsets", 2, now_ms=NOW_MS)
        meta_key, meta_value = group_metadata("billing", "member-1", "orders", [0, 1])
        offsets[0].append_records(
            [offset_value(3, 1), offset_value(4), offset_value(9), offset_value(2), None, meta_value],
            keys=[
                offset_key("billing", "orders", 0),  # v1 value, overridden below
                offset_key("billing", "orders", 1),
                offset_key("billing", "orders", 0),  # the newer commit wins
                offset_key("audit", "orders", 0),
                offset_key("audit", "orders", 0),  # a tombstone: audit's only offset goes
                meta_key,
            ],
            now_ms=NOW_MS,
        )
        offsets[1].append_records([offset_value(5)], keys=[offset_key("shipping", "orders", 1)], now_ms=NOW_MS)
    return data


def test_written_groups(written: Path) -> None:
    assert run("groups", "list", str(written)).stdout == "billing\nshipping\n"
    assert expected_offsets(written) == {
        "billing": {("orders", 0): 9, ("orders", 1): 4},
        "shipping": {("orders", 1): 5},
    }
    (billing,) = json.loads(run("groups", "describe", str(written), "--group", "billing", "--json").stdout)["groups"]
    assert billing["state"] == "Stable" and billing["generation"] == 4 and billing["protocol"] == "range"
    assert billing["members"][0]["assignment"] == [
        {"topic": "orders", "partition": 0},
        {"topic": "orders", "partition": 1},
    ]
    rows = [
        (o["partition"], o["currentOffset"], o["logEndOffset"], o["lag"], o["leaderEpoch"]) for o in billing["offsets"]
    ]
    assert rows == [(0, 9, 10, 1, 7), (1, 4, 0, -4, 7)]
    table = run("groups", "describe", str(written), "--group", "billing").stdout.splitlines()
    assert table[2].split() == ["billing", "orders", "0", "9", "10", "1", "member-1", "/10.0.0.9", "client-1"]


def test_unknown_record_types_are_skipped_with_a_warning(written: Path) -> None:
    # A KIP-848 ConsumerGroupMetadataKey (type 3): the broker's loader skips types it does not know.
    with DataDir.open(BrokerConfig.load(log_dirs=[written]), now_ms=NOW_MS) as data_dir:
        data_dir.partition("__consumer_offsets", 1).append_records(
            [b"\x00\x00whatever"], keys=[struct.pack(">h", 3) + b"\x00\x01g"], now_ms=NOW_MS
        )
    result = run("groups", "list", str(written))
    assert result.stdout == "billing\nshipping\n"
    (warning,) = result.stderr.splitlines()
    assert warning.startswith("seglogfs: warning: ") and "__consumer_offsets-1" in warning
    assert "record at offset 1" in warning and "record type 3" in warning


def test_a_damaged_record_is_one_line_naming_file_and_offset(written: Path) -> None:
    with DataDir.open(BrokerConfig.load(log_dirs=[written]), now_ms=NOW_MS) as data_dir:
        data_dir.partition("__consumer_offsets", 1).append_records(
            [struct.pack(">hq", 3, 1)],
            keys=[offset_key("shipping", "orders", 1)],
            now_ms=NOW_MS,  # value cut short
        )
    line = one_error_line(run("groups", "describe", str(written), code=1))
    assert "__consumer_offsets-1/00000000000000000000.log: record at offset 1" in line


def test_without_an_offsets_topic_and_unknown_group(tmp_path: Path, written: Path) -> None:
    bare = kafka_fixtures() / "bigdata-sensor-suhu"
    line = one_error_line(run("groups", "list", str(bare), code=1))
    assert "no __consumer_offsets partitions" in line
    line = one_error_line(run("groups", "describe", str(written), "--group", "nope", code=1))
    assert "Consumer group 'nope' does not exist." in line
    one_error_line(run("groups", "list", str(tmp_path / "missing"), code=1))
