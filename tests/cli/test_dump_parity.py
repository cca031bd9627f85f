"""`seglogfs dump` against kafka-dump-log's line formats (Kafka 4.0's DumpLogSegments), field by
field, on real broker files: `__consumer_offsets` with --offsets-decoder, `__cluster_metadata`
(and its KRaft snapshots) with --cluster-metadata-decoder, control batches, `.snapshot` and
`.txnindex` files. Each check names the line format it follows."""

from __future__ import annotations

import base64
import json
import re
import struct
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import cramjam
import crc32c
import pytest

from seglogfs.engine.record.builder import ProducerState, build_batch
from seglogfs.engine.record.records import decode_records, iter_batch_headers
from seglogfs.mount_tools.dump_records import java_utf8
from tests.cli.support import run
from tests.conftest import kafka_fixtures
from tests.engine.test_metadata_log import compact_string, uvarint

# A record line (printRecordMetadata): "| offset: O <TimestampType>: T keySize: K valueSize: V
# sequence: S headerKeys: [k,...]" for every v2 record, control records included; then for a
# control record what it holds; then, when printing data and not a control record,
# " key: K" (if any) and " payload: P" (if any).
RECORD = re.compile(
    r"\| offset: (\d+) (CreateTime|LogAppendTime): (-?\d+) keySize: (-?\d+) valueSize: (-?\d+) "
    r"sequence: (-?\d+) headerKeys: \[([^\]]*)\](.*)"
)
# A batch line (printBatchLevel), v2: "baseOffset: … isvalid: true".
BATCH = re.compile(
    r"baseOffset: (\d+) lastOffset: (\d+) count: (\d+) baseSequence: (-?\d+) lastSequence: (-?\d+) "
    r"producerId: (-?\d+) producerEpoch: (-?\d+) partitionLeaderEpoch: (-?\d+) isTransactional: (true|false) "
    r"isControl: (true|false) deleteHorizonMs: OptionalLong(?:\.empty|\[\d+\]) position: (\d+) "
    r"(CreateTime|LogAppendTime): (-?\d+) size: (\d+) magic: 2 compresscodec: (\w+) crc: (\d+) isvalid: true"
)


def dump(*args: str) -> list[str]:
    return run("dump", *args).stdout.splitlines()


def test_offsets_decoder_prints_coordinator_records_as_json() -> None:
    # OffsetsMessageParser (CoordinatorRecordMessageParser): key `{"type":"<record type>","data":{…}}`,
    # value `{"version":"<value version>","data":{…}}` (type and version as JSON strings), field
    # names camelCase in schema order, fields outside the version left out, `<DELETE>` for a
    # tombstone; a consumer group's member subscription/assignment as their own JSON.
    log = kafka_fixtures() / "experts-kafka-data" / "__consumer_offsets-0" / "00000000000000000000.log"
    lines = dump("--offsets-decoder", str(log))
    assert lines[:2] == [f"Dumping {log}", "Log starting offset: 0"]
    assert BATCH.fullmatch(lines[2])
    first = RECORD.fullmatch(lines[3])
    assert first is not None
    key_text, payload_text = re.fullmatch(r" key: (\{.*\}) payload: (\{.*\})", first.group(8)).groups()  # type: ignore[union-attr]
    assert json.loads(key_text) == {"type": "2", "data": {"group": "sensor-group"}}
    value = json.loads(payload_text)
    assert value["version"] == "3" and list(value["data"]) == [
        "protocolType", "generation", "protocol", "leader", "currentStateTimestamp", "members",
    ]  # fmt: skip
    member = value["data"]["members"][0]
    assert list(member) == [
        "memberId", "groupInstanceId", "clientId", "clientHost", "rebalanceTimeout", "sessionTimeout",
        "subscription", "assignment",
    ]  # fmt: skip
    assert member["assignment"] == {"assignedPartitions": [{"topic": "sensor-data-topic", "partitions": [0]}],
                                    "userData": None}  # fmt: skip
    commit = RECORD.fullmatch(lines[5])
    assert commit is not None and commit.group(8) == (
        ' key: {"type":"1","data":{"group":"sensor-group","topic":"sensor-data-topic","partition":0}}'
        ' payload: {"version":"3","data":{"offset":0,"leaderEpoch":-1,"metadata":"","commitTimestamp":1728489496640}}'
    )
    # Every record decodes against its own bytes: key and value sizes as the record line says.
    for line in lines:
        match = RECORD.fullmatch(line)
        if match is not None:
            assert " key: {" in match.group(8) and ("payload: {" in match.group(8) or "<DELETE>" in match.group(8))
    tombstones = [line for line in lines if line.endswith(" payload: <DELETE>")]
    assert all("valueSize: -1" in line for line in tombstones)


def test_cluster_metadata_decoder_and_control_records() -> None:
    # ClusterMetadataLogMessageParser: no key; payload `{"type":"<MetadataRecordType>","version":N,
    # "data":{…}}` (version a JSON number). A control record (printControlRecord): LeaderChange as
    # " LeaderChange: {json}", no key or payload after it even with the decoder.
    log = kafka_fixtures() / "ne-streaming-d95be01" / "__cluster_metadata-0" / "00000000000000000000.log"
    lines = dump("--cluster-metadata-decoder", str(log))
    control = RECORD.fullmatch(lines[3])
    assert control is not None and control.group(6) == "-1" and control.group(7) == ""
    assert (
        control.group(8)
        == ' LeaderChange: {"version":0,"leaderId":1,"voters":[{"voterId":1}],"grantingVoters":[{"voterId":1}]}'
    )
    payloads = [RECORD.fullmatch(line).group(8) for line in lines if line.startswith("| ")]  # type: ignore[union-attr]
    feature = next(p for p in payloads if "FEATURE_LEVEL_RECORD" in p)
    assert json.loads(feature.removeprefix(" payload: ")) == {
        "type": "FEATURE_LEVEL_RECORD", "version": 0, "data": {"name": "metadata.version", "featureLevel": 21},
    }  # fmt: skip
    topic = next(p for p in payloads if "TOPIC_RECORD" in p and "REMOVE" not in p)
    assert re.fullmatch(
        r' payload: \{"type":"TOPIC_RECORD","version":0,"data":\{"name":"[^"]+","topicId":"[A-Za-z0-9_-]{22}"\}\}',
        topic,
    )
    # Every record type decodes: no `Error at N, skipping.` line.
    assert all(p.startswith(' payload: {"type":"') or "LeaderChange" in p for p in payloads)


def test_kraft_snapshot_header_footer_and_skip_record_metadata() -> None:
    # A KRaft snapshot (.checkpoint): "Snapshot end offset: N, epoch: E", a SnapshotHeader control
    # record " SnapshotHeader {json}", the records, a " SnapshotFooter {json}" control record.
    snapshot = (
        kafka_fixtures() / "flink-on-prem-cp760" / "__cluster_metadata-0" / "00000000000000007752-0000000001.checkpoint"
    )
    lines = dump("--deep-iteration", str(snapshot))
    assert lines[1] == "Snapshot end offset: 7752, epoch: 1"
    header = RECORD.fullmatch(lines[3])
    assert header is not None and re.fullmatch(
        r' SnapshotHeader \{"version":0,"lastContainedLogTimestamp":\d+\}', header.group(8)
    )
    assert RECORD.fullmatch(lines[-1]).group(8) == ' SnapshotFooter {"version":0}'  # type: ignore[union-attr]
    # --skip-record-metadata: "| payload: …" (prefix "| " when the metadata is left out); control
    # records print an empty line.
    skipped = dump("--cluster-metadata-decoder", "--skip-record-metadata", str(snapshot))
    assert skipped[3] == "" and skipped[5].startswith('| payload: {"type":"FEATURE_LEVEL_RECORD"')


def test_max_bytes_reads_only_the_batches_within() -> None:
    # --max-bytes N: FileRecords.slice(0, N): the whole batches within N bytes; no "invalid bytes"
    # line then.
    log = kafka_fixtures() / "experts-kafka-data" / "__consumer_offsets-0" / "00000000000000000000.log"
    lines = dump("--max-bytes", "503", str(log))
    assert [BATCH.fullmatch(line).group(11) for line in lines[2:]] == ["0", "371"]  # type: ignore[union-attr]


def test_transaction_markers(tmp_path: Path) -> None:
    # An end transaction marker: " endTxnMarker: COMMIT coordinatorEpoch: N" after the record
    # metadata (sequence -1, no header keys), never a key or payload, even with --print-data-log.
    # The broker fixtures hold none, so a transaction is written here: a transactional batch, then
    # its COMMIT marker (control key: version 0, type 1; value: version 0, coordinatorEpoch).
    producer = ProducerState(producer_id=42, producer_epoch=3, base_sequence=0, is_transactional=True)
    data = build_batch([b"v"], keys=[b"k"], timestamps=1000, producer=producer)
    marker = ProducerState(producer_id=42, producer_epoch=3, is_transactional=True)
    data += build_batch(
        [struct.pack(">hi", 0, 17)], keys=[struct.pack(">hh", 0, 1)], timestamps=1001, base_offset=1,
        producer=marker, is_control=True,
    )  # fmt: skip
    log = tmp_path / "00000000000000000000.log"
    log.write_bytes(bytes(data))
    lines = dump("--print-data-log", str(log))
    assert RECORD.fullmatch(lines[3]).group(8) == " key: k payload: v"  # type: ignore[union-attr]
    assert BATCH.fullmatch(lines[4]).group(9, 10) == ("true", "true")  # type: ignore[union-attr]
    assert lines[5] == (
        "| offset: 1 CreateTime: 1001 keySize: 4 valueSize: 6 sequence: -1 headerKeys: [] "
        "endTxnMarker: COMMIT coordinatorEpoch: 17"
    )


def test_producer_snapshots_match_their_bytes() -> None:
    # dumpProducerIdSnapshot: "producerId: P producerEpoch: E coordinatorEpoch: C currentTxnFirstOffset:
    # OptionalLong… lastTimestamp: T" then " firstSequence: F lastSequence: L lastOffset: O offsetDelta: D
    # timestamp: T" (the entry's batch), one line per producer.
    snapshots = sorted(kafka_fixtures().glob("*/*/*.snapshot"))
    assert snapshots
    output = "\n".join(dump(*map(str, snapshots)))
    for path, part in zip(snapshots, output.split("Dumping ")[1:], strict=True):
        data = path.read_bytes()
        version, crc, count = struct.unpack_from(">hIi", data)
        assert version == 1 and crc == crc32c.crc32c(data[6:])
        lines = [line for line in part.splitlines()[1:] if line]
        assert len(lines) == count
        for i, line in enumerate(lines):
            pid, epoch, last_seq, last_offset, delta, ts, coord, txn = struct.unpack_from(
                ">qhiqiqiq", data, 10 + 46 * i
            )
            txn_text = "OptionalLong.empty" if txn < 0 else f"OptionalLong[{txn}]"
            assert line == (
                f"producerId: {pid} producerEpoch: {epoch} coordinatorEpoch: {coord} currentTxnFirstOffset: {txn_text} "
                f"lastTimestamp: {ts} firstSequence: {last_seq - delta} lastSequence: {last_seq} "
                f"lastOffset: {last_offset} offsetDelta: {delta} timestamp: {ts}"
            )


def write_snapshot(path: Path, entry: tuple[int, ...]) -> Path:
    """A producer snapshot of one entry: producer id, epoch, last sequence, last offset, offset
    delta, timestamp, coordinator epoch, current transaction's first offset."""
    body = struct.pack(">i", 1) + struct.pack(">qhiqiqiq", *entry)
    path.write_bytes(struct.pack(">hI", 1, crc32c.crc32c(body)) + body)
    return path


def test_a_producer_snapshot_entry_without_a_batch_shows_its_last_timestamp(tmp_path: Path) -> None:
    # An entry whose batch the snapshot does not remember (lastOffset -1: a transactional
    # producer's whose batches were removed) still has its last timestamp; Kafka 4 prints it, and
    # no batch fields after it (and no space).
    path = write_snapshot(tmp_path / "00000000000000000021.snapshot", (2, 3, -1, -1, 0, 1795863032654, 0, -1))
    assert dump(str(path))[1] == (
        "producerId: 2 producerEpoch: 3 coordinatorEpoch: 0 currentTxnFirstOffset: OptionalLong.empty "
        "lastTimestamp: 1795863032654"
    )


def test_producer_snapshot_with_a_bad_crc(tmp_path: Path) -> None:
    path = write_snapshot(tmp_path / "00000000000000000041.snapshot", (7, 1, 4, 40, 2, 1000, 3, 38))
    body = path.read_bytes()[6:]
    assert dump(str(path))[1] == (
        "producerId: 7 producerEpoch: 1 coordinatorEpoch: 3 currentTxnFirstOffset: OptionalLong[38] "
        "lastTimestamp: 1000 firstSequence: 2 lastSequence: 4 lastOffset: 40 offsetDelta: 2 timestamp: 1000"
    )
    path.write_bytes(struct.pack(">hI", 1, 12345) + body)
    result = run("dump", str(path), code=1)
    assert result.stderr.startswith("Snapshot is corrupt (CRC is no longer valid). Stored crc: 12345.")


def test_transaction_index(tmp_path: Path) -> None:
    # dumpTxnIndex: "version: V producerId: P firstOffset: F lastOffset: L lastStableOffset: S",
    # one 34-byte AbortedTxn entry a line.
    path = tmp_path / "00000000000000000000.txnindex"
    path.write_bytes(struct.pack(">hqqqq", 0, 5, 10, 20, 10) + struct.pack(">hqqqq", 0, 6, 21, 30, 25))
    assert dump(str(path))[1:] == [
        "version: 0 producerId: 5 firstOffset: 10 lastOffset: 20 lastStableOffset: 10",
        "version: 0 producerId: 6 firstOffset: 21 lastOffset: 30 lastStableOffset: 25",
    ]
    path.write_bytes(path.read_bytes()[:40])
    result = run("dump", str(path), code=1)
    assert "not a multiple of the 34-byte entry size" in result.stderr


# -- KRaft metadata records: every type, against decodings written here -------------------------
class Wire:
    """Kafka's flexible-versions primitives, read by hand: unsigned varints, compact strings and
    arrays (length + 1, 0 = null), big-endian fixed-size integers, 16-byte uuids."""

    def __init__(self, data: bytes) -> None:
        self.data, self.pos = data, 0

    def uvarint(self) -> int:
        value = shift = 0
        while True:
            byte = self.data[self.pos]
            self.pos += 1
            value |= (byte & 0x7F) << shift
            if byte < 0x80:
                return value
            shift += 7

    def fixed(self, fmt: str) -> Any:
        (value,) = struct.unpack_from(fmt, self.data, self.pos)
        self.pos += struct.calcsize(fmt)
        return value

    def string(self) -> str | None:
        size = self.uvarint() - 1
        if size < 0:
            return None
        self.pos += size
        return self.data[self.pos - size : self.pos].decode()

    def uuid(self) -> str:  # Kafka's Uuid.toString: URL-safe base64, no padding
        self.pos += 16
        return base64.urlsafe_b64encode(self.data[self.pos - 16 : self.pos]).rstrip(b"=").decode()

    def array(self, item: Callable[[], Any]) -> list[Any] | None:
        count = self.uvarint() - 1
        return None if count < 0 else [item() for _ in range(count)]

    def tagged(self) -> dict[int, Wire]:
        fields = {}
        for _ in range(self.uvarint()):
            tag, size = self.uvarint(), self.uvarint()
            fields[tag] = Wire(self.data[self.pos : self.pos + size])
            self.pos += size
        return fields


def _int32s(wire: Wire) -> list[int] | None:
    return wire.array(lambda: wire.fixed(">i"))


def _endpoints_and_features(wire: Wire, out: dict[str, Any]) -> None:
    def endpoint() -> dict[str, Any]:
        item = {"name": wire.string(), "host": wire.string(), "port": wire.fixed(">H"),
                "securityProtocol": wire.fixed(">h")}  # fmt: skip
        assert wire.tagged() == {}
        return item

    def feature() -> dict[str, Any]:
        item = {"name": wire.string(), "minSupportedVersion": wire.fixed(">h"), "maxSupportedVersion": wire.fixed(">h")}
        assert wire.tagged() == {}
        return item

    out["endPoints"] = wire.array(endpoint)
    out["features"] = wire.array(feature)


def expected_metadata_json(value: bytes) -> tuple[int, dict[str, Any]]:
    """(api key, what MetadataJsonConverters print) for the record types of the broker fixtures,
    decoded field by field as Kafka's `common/metadata/*.json` lays them out. A tagged field is
    printed only when it differs from its default (JsonConverter's non-default check)."""
    wire = Wire(value)
    assert wire.uvarint() == 1  # frame version
    api_key, version = wire.uvarint(), wire.uvarint()
    names = {0: "REGISTER_BROKER_RECORD", 2: "TOPIC_RECORD", 3: "PARTITION_RECORD", 4: "CONFIG_RECORD",
             5: "PARTITION_CHANGE_RECORD", 12: "FEATURE_LEVEL_RECORD", 15: "PRODUCER_IDS_RECORD",
             17: "BROKER_REGISTRATION_CHANGE_RECORD", 20: "NO_OP_RECORD", 21: "ZK_MIGRATION_STATE_RECORD",
             23: "BEGIN_TRANSACTION_RECORD", 24: "END_TRANSACTION_RECORD",
             27: "REGISTER_CONTROLLER_RECORD"}  # fmt: skip
    data: dict[str, Any] = {}
    tagged: dict[int, Wire]
    if api_key == 0:  # RegisterBrokerRecord v0-3
        data["brokerId"] = wire.fixed(">i")
        if version >= 2:
            data["isMigratingZkBroker"] = wire.fixed(">?")
        data["incarnationId"], data["brokerEpoch"] = wire.uuid(), wire.fixed(">q")
        _endpoints_and_features(wire, data)
        data["rack"], data["fenced"] = wire.string(), wire.fixed(">?")
        if version >= 1:
            data["inControlledShutdown"] = wire.fixed(">?")
        tagged = wire.tagged()
        if 0 in tagged:
            log_dirs = tagged[0].array(tagged[0].uuid)
            if log_dirs:  # default: empty
                data["logDirs"] = log_dirs
    elif api_key == 2:  # TopicRecord
        data = {"name": wire.string(), "topicId": wire.uuid()}
        tagged = wire.tagged()
    elif api_key == 3:  # PartitionRecord v0-2
        data = {"partitionId": wire.fixed(">i"), "topicId": wire.uuid()}
        for name in ("replicas", "isr", "removingReplicas", "addingReplicas"):
            data[name] = _int32s(wire)
        data["leader"] = wire.fixed(">i")
        leader_epoch, partition_epoch = wire.fixed(">i"), wire.fixed(">i")
        directories = wire.array(wire.uuid) if version >= 1 else None
        tagged = wire.tagged()
        if 0 in tagged and (state := tagged[0].fixed(">b")) != 0:
            data["leaderRecoveryState"] = state
        data["leaderEpoch"], data["partitionEpoch"] = leader_epoch, partition_epoch
        if version >= 1:
            data["directories"] = directories
    elif api_key == 4:  # ConfigRecord
        data = {"resourceType": wire.fixed(">b"), "resourceName": wire.string(), "name": wire.string(),
                "value": wire.string()}  # fmt: skip
        tagged = wire.tagged()
    elif api_key == 5:  # PartitionChangeRecord v0-2: everything but the ids is tagged
        data = {"partitionId": wire.fixed(">i"), "topicId": wire.uuid()}
        tagged = wire.tagged()
        for tag, name, read, default in (
            (0, "isr", _int32s, None), (1, "leader", lambda w: w.fixed(">i"), -2), (2, "replicas", _int32s, None),
            (3, "removingReplicas", _int32s, None), (4, "addingReplicas", _int32s, None),
            (5, "leaderRecoveryState", lambda w: w.fixed(">b"), -1),
            (8, "directories", lambda w: w.array(w.uuid), None),
        ):  # fmt: skip
            if tag in tagged and (field := read(tagged[tag])) != default:
                data[name] = field
    elif api_key == 12:  # FeatureLevelRecord
        data = {"name": wire.string(), "featureLevel": wire.fixed(">h")}
        tagged = wire.tagged()
    elif api_key == 15:  # ProducerIdsRecord
        data = {"brokerId": wire.fixed(">i"), "brokerEpoch": wire.fixed(">q"), "nextProducerId": wire.fixed(">q")}
        tagged = wire.tagged()
    elif api_key == 17:  # BrokerRegistrationChangeRecord v0-2: Fenced (tag 0), InControlledShutdown (tag 1)
        data = {"brokerId": wire.fixed(">i"), "brokerEpoch": wire.fixed(">q")}
        tagged = wire.tagged()
        for tag, name in ((0, "fenced"), (1, "inControlledShutdown")):
            if tag in tagged and (field := tagged[tag].fixed(">b")) != 0:
                data[name] = field
    elif api_key == 21:  # ZkMigrationStateRecord
        data = {"zkMigrationState": wire.fixed(">b")}
        tagged = wire.tagged()
    elif api_key == 23:  # BeginTransactionRecord: Name, tag 0, null by default
        tagged = wire.tagged()
        if 0 in tagged and (name := tagged[0].string()) is not None:
            data["name"] = name
    elif api_key == 27:  # RegisterControllerRecord
        data = {"controllerId": wire.fixed(">i"), "incarnationId": wire.uuid(), "zkMigrationReady": wire.fixed(">?")}
        _endpoints_and_features(wire, data)
        tagged = wire.tagged()
    else:  # NoOpRecord (20), EndTransactionRecord (24): no fields
        assert api_key in (20, 24)
        tagged = wire.tagged()
    assert wire.pos == len(value)
    return api_key, {"type": names[api_key], "version": version, "data": data}


def metadata_files() -> list[Path]:
    root = kafka_fixtures()
    return sorted(root.glob("*/__cluster_metadata-0/*.log")) + sorted(root.glob("*/__cluster_metadata-0/*.checkpoint"))


def raw_values(path: Path) -> dict[int, bytes]:
    """Offset → value of every record of a metadata log or snapshot's data batches."""
    data = path.read_bytes()
    return {
        record.offset: bytes(record.value or b"")
        for header in iter_batch_headers(data)
        if not header.is_control
        for record in decode_records(header, data[header.position : header.next_position])
    }


def test_every_cluster_metadata_record_decodes_as_kafka_prints_it() -> None:
    # ClusterMetadataLogMessageParser: `payload: {"type":"<MetadataRecordType>","version":N,"data":{…}}`,
    # compact (Jackson's ObjectNode.toString), camelCase field names in schema order, uuids as
    # Uuid.toString, tagged fields only when not their default. Every record of every fixture's
    # metadata log and KRaft snapshot: none prints `Error at N, skipping.`, and each payload is
    # exactly the JSON of the decoding above.
    files = metadata_files()
    assert {path.suffix for path in files} == {".log", ".checkpoint"}
    seen: dict[int, set[int]] = {}
    for path in files:
        values = raw_values(path)
        lines = dump("--cluster-metadata-decoder", str(path))
        assert not [line for line in lines if "Error at" in line]
        printed = {}
        for line in lines:
            match = RECORD.fullmatch(line)
            if match is not None and match.group(8).startswith(" payload: "):
                printed[int(match.group(1))] = match.group(8).removeprefix(" payload: ")
        assert printed.keys() == values.keys()
        for offset, value in values.items():
            api_key, expected = expected_metadata_json(value)
            assert printed[offset] == json.dumps(expected, separators=(",", ":")), (path, offset)
            seen.setdefault(api_key, set()).add(expected["version"])
    # The fixtures hold these types and versions (brokers from Kafka 3.3 to 3.7 and Confluent 7.6).
    assert seen == {0: {2, 3}, 2: {0}, 3: {0, 1}, 4: {0}, 5: {0, 1}, 12: {0}, 15: {0}, 17: {0, 1}, 20: {0},
                    21: {0}, 23: {0}, 24: {0}, 27: {0}}  # fmt: skip


def _tags(*fields: tuple[int, bytes]) -> bytes:
    return uvarint(len(fields)) + b"".join(uvarint(tag) + uvarint(len(body)) + body for tag, body in fields)


def test_metadata_record_types_the_fixtures_lack(tmp_path: Path) -> None:
    # The other record types of Kafka's common/metadata, built here byte by byte (frame version 1,
    # api key, version, fields, tagged fields) and printed as MetadataJsonConverters print them:
    # int64 as numbers, bytes as standard base64 (Jackson's BinaryNode), float64 as Java's
    # Double.toString (1.0E7), a tagged field present in the bytes but equal to its default left
    # out (PartitionChangeRecord's Leader -2), an unknown api key as the serde's error.
    acl_id, topic_id = bytes(range(16)), bytes(range(16, 32))
    i32, i64 = (lambda v: struct.pack(">i", v)), (lambda v: struct.pack(">q", v))
    ids = "AAECAwQFBgcICQoLDA0ODw"  # Uuid.toString of bytes 0..15
    cases = [
        (1, 0, i32(3) + i64(9) + _tags(), {"brokerId": 3, "brokerEpoch": 9}),
        (7, 0, i32(3) + i64(9) + _tags(), {"id": 3, "epoch": 9}),
        (8, 0, i32(3) + i64(10) + _tags(), {"id": 3, "epoch": 10}),
        (9, 0, topic_id + _tags(), {"topicId": "EBESExQVFhcYGRobHB0eHw"}),
        (10, 0, compact_string("User:a") + compact_string("User:b") + b"\x03" + compact_string("User:c")
         + compact_string("User:d") + i64(1) + i64(2) + i64(3) + compact_string("tok") + _tags(),
         {"owner": "User:a", "requester": "User:b", "renewers": ["User:c", "User:d"], "issueTimestamp": 1,
          "maxTimestamp": 2, "expirationTimestamp": 3, "tokenId": "tok"}),
        (11, 0, compact_string("alice") + b"\x01" + b"\x03ab" + b"\x01" + b"\x02\xff" + i32(4096) + _tags(),
         {"name": "alice", "mechanism": 1, "salt": "YWI=", "storedKey": "", "serverKey": "/w==", "iterations": 4096}),
        (14, 0, b"\x02" + compact_string("user") + compact_string(None) + _tags() + compact_string("producer_byte_rate")
         + struct.pack(">d", 1e7) + b"\x00" + _tags(),
         {"entity": [{"entityType": "user", "entityName": None}], "key": "producer_byte_rate", "value": 1e7,
          "remove": False}),
        (18, 0, acl_id + b"\x02" + compact_string("orders") + b"\x03" + compact_string("User:*") + compact_string("*")
         + b"\x03\x03" + _tags(),
         {"id": ids, "resourceType": 2, "resourceName": "orders", "patternType": 3, "principal": "User:*",
          "host": "*", "operation": 3, "permissionType": 3}),
        (19, 0, acl_id + _tags(), {"id": ids}),
        (22, 0, compact_string("alice") + b"\x02" + _tags(), {"name": "alice", "mechanism": 2}),
        (25, 0, _tags((0, compact_string("timed out"))), {"reason": "timed out"}),
        (25, 0, _tags(), {}),
        (26, 0, compact_string("tok") + _tags(), {"tokenId": "tok"}),
        (5, 2, i32(1) + topic_id + _tags((0, b"\x02" + i32(4)), (1, i32(-2)), (6, b"\x01"), (8, b"\x00")),
         {"partitionId": 1, "topicId": "EBESExQVFhcYGRobHB0eHw", "isr": [4], "eligibleLeaderReplicas": []}),
        (17, 2, i32(1) + i64(5) + _tags((0, b"\x00"), (2, b"\x02" + acl_id)),
         {"brokerId": 1, "brokerEpoch": 5, "logDirs": [ids]}),
    ]  # fmt: skip
    values = [b"\x01" + uvarint(key) + uvarint(version) + body for key, version, body, _ in cases]
    values.append(b"\x01\x63\x00")  # api key 99
    log = tmp_path / "00000000000000000000.log"
    log.write_bytes(bytes(build_batch(values, timestamps=1000)))
    payloads = [line.split(" payload: ", 1)[1] for line in dump("--cluster-metadata-decoder", str(log))[3:]]
    for (key, version, _body, data), payload in zip(cases, payloads, strict=False):
        document = json.loads(payload)
        assert (document["version"], document["data"]) == (version, data), key
        assert document["type"] == {
            1: "UNREGISTER_BROKER_RECORD", 5: "PARTITION_CHANGE_RECORD", 7: "FENCE_BROKER_RECORD",
            8: "UNFENCE_BROKER_RECORD", 9: "REMOVE_TOPIC_RECORD", 10: "DELEGATION_TOKEN_RECORD",
            11: "USER_SCRAM_CREDENTIAL_RECORD", 14: "CLIENT_QUOTA_RECORD", 17: "BROKER_REGISTRATION_CHANGE_RECORD",
            18: "ACCESS_CONTROL_ENTRY_RECORD", 19: "REMOVE_ACCESS_CONTROL_ENTRY_RECORD",
            22: "REMOVE_USER_SCRAM_CREDENTIAL_RECORD", 25: "ABORT_TRANSACTION_RECORD",
            26: "REMOVE_DELEGATION_TOKEN_RECORD",
        }[key]  # fmt: skip
    assert '"value":1.0E7,' in payloads[6]
    # Tagged fields in schema order; Leader -2 and Directories null (their defaults) left out.
    assert payloads[13] == (
        '{"type":"PARTITION_CHANGE_RECORD","version":2,"data":{"partitionId":1,"topicId":"EBESExQVFhcYGRobHB0eHw",'
        '"isr":[4],"eligibleLeaderReplicas":[]}}'
    )
    assert payloads[-1] == (
        "Error at 15, skipping. org.apache.kafka.common.errors.UnsupportedVersionException: Unknown metadata id 99"
    )


# -- legacy messages (magic 0 and 1) -------------------------------------------------------------
def legacy_entries(data: bytes) -> list[tuple[int, int, bytes]]:
    """(offset, position, whole entry) of each message of a message set: offset int64, size int32,
    then `size` bytes (crc uint32, magic, attributes, [timestamp int64], key and value with int32
    lengths)."""
    entries, position = [], 0
    while position < len(data):
        offset, size = struct.unpack_from(">qi", data, position)
        entries.append((offset, position, data[position : position + 12 + size]))
        position += 12 + size
    return entries


def legacy_fields(entry: bytes) -> tuple[int, int, int, int, bytes | None, bytes | None]:
    """(crc, magic, attributes, timestamp (-1 for magic 0), key, value) of one entry."""
    crc, magic, attributes = struct.unpack_from(">Ibb", entry, 12)
    position = 18
    timestamp = -1
    if magic == 1:
        (timestamp,) = struct.unpack_from(">q", entry, position)
        position += 8
    fields: list[bytes | None] = []
    for _ in range(2):
        (length,) = struct.unpack_from(">i", entry, position)
        position += 4
        fields.append(None if length < 0 else entry[position : position + length])
        position += max(length, 0)
    return crc, magic, attributes, timestamp, fields[0], fields[1]


def inflate(codec: int, value: bytes) -> bytes:
    if codec == 1:  # gzip
        return zlib.decompress(value, 31)
    assert codec == 2 and value.startswith(b"\x82SNAPPY\x00")  # xerial framing: 16-byte header, then
    out, position = b"", 16  # (int32 length, raw snappy block) chunks
    while position < len(value):
        (length,) = struct.unpack_from(">i", value, position)
        out += bytes(cramjam.snappy.decompress_raw(value[position + 4 : position + 4 + length]))
        position += 4 + length
    return out


def expected_legacy_lines(data: bytes) -> list[str]:
    """What DumpLogSegments prints for a message set with --print-data-log, magic < 2
    (printBatchLevel: "offset: <last offset> position: <bytes before> <TimestampType>: <timestamp>
    size: <entry size> magic: M compresscodec: <codec> crc: <CRC-32> isvalid: true"; per record
    "| offset: O <wrapper's TimestampType>: T keySize: K valueSize: V isValid: true crc: C"
    (Kafka 4's line; Kafka 3 ended it with a stray "}"), then " key: K" and " payload: P"). A magic 1 wrapper's inner
    offsets are relative to its offset (the last is the wrapper's)."""
    codecs = {0: "none", 1: "gzip", 2: "snappy", 3: "lz4"}
    lines = []
    for offset, position, entry in legacy_entries(data):
        crc, magic, attributes, timestamp, _key, value = legacy_fields(entry)
        assert zlib.crc32(entry[16:]) == crc
        kind = "NoTimestampType" if magic == 0 else ("LogAppendTime" if attributes & 8 else "CreateTime")
        lines.append(
            f"offset: {offset} position: {position} {kind}: {timestamp} size: {len(entry)} magic: {magic} "
            f"compresscodec: {codecs[attributes & 7]} crc: {crc} isvalid: true"
        )
        inner = [(offset, entry)]
        if attributes & 7:
            inner = [(at, message) for at, _, message in legacy_entries(inflate(attributes & 7, value or b""))]
        if magic == 1 and attributes & 7:
            inner = [(offset - inner[-1][0] + relative, inner_entry) for relative, inner_entry in inner]
        for record_offset, record_entry in inner:
            inner_crc, _, _, record_timestamp, key, record_value = legacy_fields(record_entry)
            assert zlib.crc32(record_entry[16:]) == inner_crc
            if attributes & 8:
                record_timestamp = timestamp
            line = (
                f"| offset: {record_offset} {kind}: {record_timestamp} keySize: {-1 if key is None else len(key)} "
                f"valueSize: {-1 if record_value is None else len(record_value)} isValid: true crc: {inner_crc}"
            )
            line += "" if key is None else f" key: {key.decode()}"
            line += "" if record_value is None else f" payload: {record_value.decode()}"
            lines.append(line)
    return lines


def test_legacy_magic0_segments() -> None:
    # kafkalite's magic 0 partitions: plain messages, and gzip and snappy wrappers of 254 messages.
    for name in ("numbers-0", "hamlet-none-0", "hamlet-gzip-0", "hamlet-snappy-0"):
        log = kafka_fixtures() / "kafkalite-magic0" / name / "00000000000000000000.log"
        lines = dump("--print-data-log", str(log))
        assert lines[:2] == [f"Dumping {log}", "Log starting offset: 0"]
        assert lines[2:] == expected_legacy_lines(log.read_bytes()), name
    # Shallow: only the message lines; a wrapper's offset is its last inner message's.
    gzip_log = kafka_fixtures() / "kafkalite-magic0" / "hamlet-gzip-0" / "00000000000000000000.log"
    shallow = dump(str(gzip_log))[2:]
    assert shallow[0].startswith("offset: 253 position: 0 NoTimestampType: -1 size: 6290 magic: 0 compresscodec: gzip ")
    assert all(line.startswith("offset: ") for line in shallow)


def test_legacy_and_v2_mixed(tmp_path: Path) -> None:
    # kafka-go's captured record set: magic 1 messages (plain and gzip wrappers), then v2 batches,
    # then magic 1 again, as a broker upgraded in place keeps them; each printed in its own format.
    source = kafka_fixtures() / "kafka-go-fetch-fixtures" / "v1-v1c-v2-v2c-v2b-v2b-v2b-v2bc-v1b-v1bc.p0.records"
    log = tmp_path / "00000000000000000000.log"
    data = source.read_bytes()
    log.write_bytes(data)
    lines = dump("--print-data-log", str(log))[2:]
    legacy_lines = [line for line in lines if not line.startswith("baseOffset: ") and "sequence: " not in line]
    # The legacy parts: the first four messages (bytes 0..355) and the last three (from 1375).
    expected = expected_legacy_lines(data[:356])
    tail = expected_legacy_lines(data[1375:])
    tail = [re.sub(r"position: (\d+)", lambda m: f"position: {int(m.group(1)) + 1375}", line) for line in tail]
    assert legacy_lines == expected + tail
    assert lines[5] == (
        "| offset: 2 CreateTime: 1633286831051 keySize: 5 valueSize: 33 isValid: true crc: 2125748918 key: alpha "
        'payload: {"count":0,"filler":"aaaaaaaaaa"}'
    )
    batches = [BATCH.fullmatch(line) for line in lines if line.startswith("baseOffset: ")]
    assert [(m.group(1), m.group(11)) for m in batches if m] == [
        ("4", "356"), ("5", "462"), ("6", "568"), ("7", "686"), ("8", "804"), ("10", "957"), ("12", "1094"),
        ("14", "1244"),
    ]  # fmt: skip
    assert lines[-3].startswith("offset: 19 position: 1517 CreateTime: 1633374040837 size: 130 magic: 1 ")


def _string(text: str) -> bytes:
    return struct.pack(">h", len(text)) + text.encode()


def test_transaction_log_decoder(tmp_path: Path) -> None:
    # `__transaction_state` records as the coordinator writes them (no fixture holds one): key
    # int16 type 0, TransactionalId string; value TransactionLogValue v0 (non-flexible):
    # ProducerId int64, ProducerEpoch int16, TransactionTimeoutMs int32, TransactionStatus int8,
    # TransactionPartitions [Topic string, PartitionIds [int32]], TransactionLastUpdateTimestampMs
    # int64, TransactionStartTimestampMs int64. kafka-dump-log --transaction-log-decoder prints
    # ` key: {"type":"0","data":{...}} payload: {"version":"0","data":{...}}`, a tombstone's
    # payload as `<DELETE>`, field names in camelCase, the status by its state's name (4 is
    # CompleteCommit; an id no state has is printed as a string of it).
    key = struct.pack(">h", 0) + _string("tx-a")
    partitions = struct.pack(">i", 1) + _string("orders") + struct.pack(">iii", 2, 0, 3)
    value = (
        struct.pack(">hqhib", 0, 7, 2, 60000, 4) + partitions + struct.pack(">qq", 1_700_000_000_123, 1_700_000_000_001)
    )
    unknown = bytearray(value)
    unknown[16] = 9  # (TransactionStatus, after the version and three fields: 2 + 8 + 2 + 4 bytes)
    data = build_batch([value, bytes(unknown), None], keys=[key, key, key], timestamps=1000)
    log = tmp_path / "00000000000000000000.log"
    log.write_bytes(bytes(data))
    lines = dump("--transaction-log-decoder", str(log))
    record, unknown_status, tombstone = (line for line in lines if line.startswith("| offset:"))
    assert '"transactionStatus":"9",' in unknown_status
    key_text, payload_text = re.fullmatch(r".* key: (\{.*\}) payload: (.*)", record).groups()  # type: ignore[union-attr]
    assert json.loads(key_text) == {"type": "0", "data": {"transactionalId": "tx-a"}}
    assert json.loads(payload_text) == {
        "version": "0",
        "data": {
            "producerId": 7,
            "producerEpoch": 2,
            "transactionTimeoutMs": 60000,
            "transactionStatus": "CompleteCommit",
            "transactionPartitions": [{"topic": "orders", "partitionIds": [0, 3]}],
            "transactionLastUpdateTimestampMs": 1_700_000_000_123,
            "transactionStartTimestampMs": 1_700_000_000_001,
        },
    }
    assert tombstone.endswith(' key: {"type":"0","data":{"transactionalId":"tx-a"}} payload: <DELETE>')


def test_missing_and_misnamed_files_get_one_line_each(tmp_path: Path) -> None:
    misnamed = tmp_path / "mylog.log"
    misnamed.write_bytes(b"x")
    result = run("dump", str(tmp_path / "00000000000000000000.log"), str(misnamed), str(tmp_path), code=1)
    assert result.stderr.splitlines() == [
        f"seglogfs: {tmp_path / '00000000000000000000.log'}: no such file",
        f"seglogfs: {misnamed}: not a segment file name (a base offset, then .log, .index, .timeindex, .snapshot "
        "or .txnindex)",
        f"seglogfs: {tmp_path}: a directory where a regular file belongs: refused",
    ]


@pytest.mark.parametrize(
    ("data", "printed"),
    [
        # Where Java's decoder and Python's "replace" part (tests/interop compares the two tools
        # on hundreds of such values): a surrogate's first two bytes, an encoded surrogate.
        (b"\xed\xba\x69", "\ufffdi"),
        (b"\xed\xa0\x80", "\ufffd"),
        (b"\xed\xa0\x80".decode("utf-8", "replace").encode(), "\ufffd" * 3),
        # Where they agree: overlong, past U+10FFFF, a cut tail, valid text.
        (b"\xe0\x80\x80", "\ufffd" * 3),
        (b"\xf4\x90\x80\x80", "\ufffd" * 4),
        (b"ok\xf0\x9f\x98", "ok\ufffd"),
        ("naïve 😀".encode(), "naïve 😀"),
    ],
)
def test_keys_and_values_print_as_javas_decoder_reads_them(data: bytes, printed: str) -> None:
    assert java_utf8(data) == printed
