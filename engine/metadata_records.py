"""KRaft metadata records as kafka-dump-log's `--cluster-metadata-decoder` prints them: the
record's type, version and fields as JSON (Kafka's MetadataJsonConverters).

The framing (frame version, api key, version, then the fields in Kafka's flexible encoding) is
`engine.metadata_log`'s; this module adds the schemas of the records it prints in full:

    TopicRecord (2) v0              Name string, TopicId uuid
    ConfigRecord (4) v0             ResourceType int8, ResourceName string, Name string,
                                    Value nullable string
    RemoveTopicRecord (9) v0        TopicId uuid
    FeatureLevelRecord (12) v0      Name string, FeatureLevel int16
    ProducerIdsRecord (15) v0       BrokerId int32, BrokerEpoch int64, NextProducerId int64
    NoOpRecord (20) v0              no fields
    ZkMigrationStateRecord (21) v0  ZkMigrationState int8
    EndTransactionRecord (24) v0    no fields

Other record types (brokers, partitions, ACLs, quotas, …) are named but not decoded here:
`describe_metadata_record` raises ValueError for them, which the dump prints as Kafka prints a
record it cannot read.
"""

from __future__ import annotations

from seglogfs.engine.messages import Field, Reader, Schema, decode, json_ready, to_json
from seglogfs.engine.metadata_log import CONFIG_RECORD, FRAME_VERSION, REMOVE_TOPIC_RECORD, TOPIC_RECORD

# The names of the types in the broker data this was checked against; others print as `type N`.
METADATA_RECORD_TYPE_NAMES = {
    0: "REGISTER_BROKER_RECORD",
    1: "UNREGISTER_BROKER_RECORD",
    2: "TOPIC_RECORD",
    3: "PARTITION_RECORD",
    4: "CONFIG_RECORD",
    5: "PARTITION_CHANGE_RECORD",
    9: "REMOVE_TOPIC_RECORD",
    12: "FEATURE_LEVEL_RECORD",
    15: "PRODUCER_IDS_RECORD",
    17: "BROKER_REGISTRATION_CHANGE_RECORD",
    20: "NO_OP_RECORD",
    21: "ZK_MIGRATION_STATE_RECORD",
    23: "BEGIN_TRANSACTION_RECORD",
    24: "END_TRANSACTION_RECORD",
}
_SCHEMAS = {
    TOPIC_RECORD: Schema("TopicRecord", (Field("Name", "string"), Field("TopicId", "uuid")), flexible_from=0),
    CONFIG_RECORD: Schema(
        "ConfigRecord",
        (
            Field("ResourceType", "int8"),
            Field("ResourceName", "string"),
            Field("Name", "string"),
            Field("Value", "string", nullable=(0, 0x7FFF)),
        ),
        flexible_from=0,
    ),
    REMOVE_TOPIC_RECORD: Schema("RemoveTopicRecord", (Field("TopicId", "uuid"),), flexible_from=0),
    12: Schema("FeatureLevelRecord", (Field("Name", "string"), Field("FeatureLevel", "int16")), flexible_from=0),
    15: Schema(
        "ProducerIdsRecord",
        (Field("BrokerId", "int32"), Field("BrokerEpoch", "int64"), Field("NextProducerId", "int64")),
        flexible_from=0,
    ),
    20: Schema("NoOpRecord", (), flexible_from=0),
    21: Schema("ZkMigrationStateRecord", (Field("ZkMigrationState", "int8"),), flexible_from=0),
    24: Schema("EndTransactionRecord", (), flexible_from=0),
}


def describe_metadata_record(value: bytes) -> str:
    """`{"type":"TOPIC_RECORD","version":0,"data":{…}}` for a metadata record's value; ValueError
    for a frame, type or version this module does not decode."""
    reader = Reader(value)
    frame_version = reader.unsigned_varint()
    if frame_version != FRAME_VERSION:
        raise ValueError(f"Could not deserialize metadata record due to unknown frame version {frame_version}")
    api_key = reader.unsigned_varint()
    version = reader.unsigned_varint()
    schema = _SCHEMAS.get(api_key)
    if schema is None or version != 0:
        name = METADATA_RECORD_TYPE_NAMES.get(api_key, f"type {api_key}")
        raise ValueError(f"{name} version {version} is not decoded here")
    data = decode(value, schema, version, reader.position)
    return to_json({"type": METADATA_RECORD_TYPE_NAMES[api_key], "version": version, "data": json_ready(data, schema)})
