"""`seglogfs dump` against kafka-dump-log's line formats (Kafka 4.0's DumpLogSegments), field by
field, on real broker files: `__consumer_offsets` with --offsets-decoder, `__cluster_metadata`
(and its KRaft snapshots) with --cluster-metadata-decoder, control batches, `.snapshot` and
`.txnindex` files. Each check names the line format it follows."""

from __future__ import annotations

import json
import re
import struct
from pathlib import Path

import crc32c

from seglogfs.engine.records import ProducerState, build_batch
from tests.cli.support import run
from tests.conftest import kafka_fixtures

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
    # Records not decoded here print Kafka's skip line in place of the payload.
    assert all(p.startswith((' payload: {"type":"', " payload: Error at ")) or "LeaderChange" in p
               for p in payloads)  # fmt: skip


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
    # OptionalLong… lastTimestamp: T " then "firstSequence: F lastSequence: L lastOffset: O offsetDelta: D
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


def test_producer_snapshot_with_a_bad_crc(tmp_path: Path) -> None:
    entry = struct.pack(">qhiqiqiq", 7, 1, 4, 40, 2, 1000, 3, 38)
    body = struct.pack(">i", 1) + entry
    path = tmp_path / "00000000000000000041.snapshot"
    path.write_bytes(struct.pack(">hI", 1, crc32c.crc32c(body)) + body)
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
