"""Control records: what a control batch's records hold, as Kafka's ControlRecordType and
ControlRecordUtils read them.

A control record's key is int16 version (0), int16 type; its value depends on the type:

    type 0 ABORT, 1 COMMIT   EndTxnMarker: int16 version (0), int32 coordinatorEpoch
    type 2 LEADER_CHANGE     LeaderChangeMessage (flexible): Version int16, LeaderId int32,
                             Voters [VoterId int32], GrantingVoters [VoterId int32]
    type 3 SNAPSHOT_HEADER   SnapshotHeaderRecord (flexible): Version int16,
                             LastContainedLogTimestamp int64
    type 4 SNAPSHOT_FOOTER   SnapshotFooterRecord (flexible): Version int16
    type 5 KRAFT_VERSION     KRaftVersionRecord (flexible): Version int16, KRaftVersion int16
    type 6 KRAFT_VOTERS      VotersRecord (flexible): Version int16, Voters [VoterId int32,
                             VoterDirectoryId uuid, Endpoints [Name string, Host string,
                             Port uint16], KRaftVersionFeature {MinSupportedVersion int16,
                             MaxSupportedVersion int16}]

`describe_control_record` gives the text kafka-dump-log prints after a control record's
metadata (DumpLogSegments' printControlRecord), ValueError when the value does not decode.
"""

from __future__ import annotations

import struct

from seglogfs.engine.record.messages import Field, Schema, decode, json_ready, to_json

CONTROL_TYPE_NAMES = {
    0: "ABORT",
    1: "COMMIT",
    2: "LEADER_CHANGE",
    3: "SNAPSHOT_HEADER",
    4: "SNAPSHOT_FOOTER",
    5: "KRAFT_VERSION",
    6: "KRAFT_VOTERS",
}
_VOTER = Schema("Voter", (Field("VoterId", "int32"),), flexible_from=0)
LEADER_CHANGE_MESSAGE = Schema(
    "LeaderChangeMessage",
    (
        Field("Version", "int16"),
        Field("LeaderId", "int32"),
        Field("Voters", _VOTER, array=True),
        Field("GrantingVoters", _VOTER, array=True),
    ),
    flexible_from=0,
)
SNAPSHOT_HEADER_RECORD = Schema(
    "SnapshotHeaderRecord", (Field("Version", "int16"), Field("LastContainedLogTimestamp", "int64")), flexible_from=0
)
SNAPSHOT_FOOTER_RECORD = Schema("SnapshotFooterRecord", (Field("Version", "int16"),), flexible_from=0)
KRAFT_VERSION_RECORD = Schema(
    "KRaftVersionRecord", (Field("Version", "int16"), Field("KRaftVersion", "int16")), flexible_from=0
)
_ENDPOINT = Schema(
    "Endpoint", (Field("Name", "string"), Field("Host", "string"), Field("Port", "uint16")), flexible_from=0
)
_KRAFT_VERSION_FEATURE = Schema(
    "KRaftVersionFeature",
    (Field("MinSupportedVersion", "int16"), Field("MaxSupportedVersion", "int16")),
    flexible_from=0,
)
_VOTERS_VOTER = Schema(
    "Voter",
    (
        Field("VoterId", "int32"),
        Field("VoterDirectoryId", "uuid"),
        Field("Endpoints", _ENDPOINT, array=True),
        Field("KRaftVersionFeature", _KRAFT_VERSION_FEATURE),
    ),
    flexible_from=0,
)
VOTERS_RECORD = Schema(
    "VotersRecord", (Field("Version", "int16"), Field("Voters", _VOTERS_VOTER, array=True)), flexible_from=0
)

# type → (the label kafka-dump-log prints before the JSON, the schema)
_JSON_TYPES = {
    2: (" LeaderChange: ", LEADER_CHANGE_MESSAGE),
    3: (" SnapshotHeader ", SNAPSHOT_HEADER_RECORD),
    4: (" SnapshotFooter ", SNAPSHOT_FOOTER_RECORD),
    5: (" KRaftVersion ", KRAFT_VERSION_RECORD),
    6: (" KRaftVoters ", VOTERS_RECORD),
}


def control_record_type(key: bytes | None) -> int:
    """The type id in a control record's key; ValueError for a key shorter than 4 bytes."""
    if key is None or len(key) < 4:
        raise ValueError(f"control record key of {0 if key is None else len(key)} bytes (expected 4)")
    return int(struct.unpack_from(">h", key, 2)[0])


def describe_control_record(key: bytes | None, value: bytes | None) -> str:
    """What kafka-dump-log prints for a control record: ` endTxnMarker: COMMIT
    coordinatorEpoch: N`, ` LeaderChange: {json}`, ` SnapshotHeader {json}`, ` SnapshotFooter
    {json}`, ` KRaftVersion {json}`, ` KRaftVoters {json}`, else ` controlType: UNKNOWN(N)`."""
    kind = control_record_type(key)
    raw = bytes(value or b"")
    if kind in (0, 1):
        if len(raw) < 6:
            raise ValueError(f"end transaction marker value of {len(raw)} bytes (expected 6)")
        _version, coordinator_epoch = struct.unpack_from(">hi", raw)
        return f" endTxnMarker: {CONTROL_TYPE_NAMES[kind]} coordinatorEpoch: {coordinator_epoch}"
    if kind in _JSON_TYPES:
        label, schema = _JSON_TYPES[kind]
        return label + to_json(json_ready(decode(raw, schema, 0), schema))
    return f" controlType: UNKNOWN({kind})"
