"""KRaft metadata records as kafka-dump-log's `--cluster-metadata-decoder` prints them: the
record's type, version and fields as JSON (Kafka's MetadataRecordSerde, then its generated
MetadataJsonConverters).

The framing (frame version, api key, version, then the fields in Kafka's flexible encoding) is
`engine.internal_topics.metadata_log`'s. This module holds the schemas of every record type in Kafka's
`common/metadata/*.json`, each in all its versions (all flexible from version 0; `tag N` is a
tagged field, shown in the JSON only when it differs from its default, as the converters do):

    RegisterBrokerRecord (0) v0-4      BrokerId int32, IsMigratingZkBroker bool (v2+),
                                       IncarnationId uuid, BrokerEpoch int64,
                                       EndPoints [Name string, Host string, Port uint16,
                                       SecurityProtocol int16], Features [Name string,
                                       MinSupportedVersion int16, MaxSupportedVersion int16],
                                       Rack nullable string, Fenced bool,
                                       InControlledShutdown bool (v1+), LogDirs [uuid] (v3+, tag 0),
                                       CordonedLogDirs nullable [uuid] (v4+, tag 1; Kafka 4.x)
    UnregisterBrokerRecord (1) v0      BrokerId int32, BrokerEpoch int64
    TopicRecord (2) v0                 Name string, TopicId uuid
    PartitionRecord (3) v0-2           PartitionId int32, TopicId uuid, Replicas [int32],
                                       Isr [int32], RemovingReplicas [int32],
                                       AddingReplicas [int32], Leader int32,
                                       LeaderRecoveryState int8 (tag 0, default 0),
                                       LeaderEpoch int32, PartitionEpoch int32,
                                       Directories [uuid] (v1+), EligibleLeaderReplicas and
                                       LastKnownElr nullable [int32] (v2+, tags 1 and 2)
    ConfigRecord (4) v0                ResourceType int8, ResourceName string, Name string,
                                       Value nullable string
    PartitionChangeRecord (5) v0-2     PartitionId int32, TopicId uuid, then tagged: Isr (0),
                                       Leader (1, default -2), Replicas (2), RemovingReplicas
                                       (3), AddingReplicas (4), LeaderRecoveryState (5, default
                                       -1), Directories [uuid] (8, v1+), EligibleLeaderReplicas
                                       (6, v2+), LastKnownElr (7, v2+); the arrays nullable
                                       [int32], null by default
    FenceBrokerRecord (7) v0           Id int32, Epoch int64
    UnfenceBrokerRecord (8) v0         Id int32, Epoch int64
    RemoveTopicRecord (9) v0           TopicId uuid
    DelegationTokenRecord (10) v0      Owner string, Requester string, Renewers [string],
                                       IssueTimestamp int64, MaxTimestamp int64,
                                       ExpirationTimestamp int64, TokenId string
    UserScramCredentialRecord (11) v0  Name string, Mechanism int8, Salt bytes, StoredKey bytes,
                                       ServerKey bytes, Iterations int32
    FeatureLevelRecord (12) v0         Name string, FeatureLevel int16
    ClientQuotaRecord (14) v0          Entity [EntityType string, EntityName nullable string],
                                       Key string, Value float64, Remove bool
    ProducerIdsRecord (15) v0          BrokerId int32, BrokerEpoch int64, NextProducerId int64
    BrokerRegistrationChangeRecord (17) v0-3
                                       BrokerId int32, BrokerEpoch int64, then tagged: Fenced
                                       int8 (0), InControlledShutdown int8 (1, v1+), LogDirs
                                       [uuid] (2, v2+), CordonedLogDirs nullable [uuid] (3, v3+)
    AccessControlEntryRecord (18) v0   Id uuid, ResourceType int8, ResourceName string,
                                       PatternType int8, Principal string, Host string,
                                       Operation int8, PermissionType int8
    RemoveAccessControlEntryRecord (19) v0
                                       Id uuid
    NoOpRecord (20) v0                 no fields
    ZkMigrationStateRecord (21) v0     ZkMigrationState int8
    RemoveUserScramCredentialRecord (22) v0
                                       Name string, Mechanism int8
    BeginTransactionRecord (23) v0     Name nullable string (tag 0, default null)
    EndTransactionRecord (24) v0       no fields
    AbortTransactionRecord (25) v0     Reason nullable string (tag 0, default null)
    RemoveDelegationTokenRecord (26) v0
                                       TokenId string
    RegisterControllerRecord (27) v0   ControllerId int32, IncarnationId uuid,
                                       ZkMigrationReady bool, EndPoints and Features as
                                       RegisterBrokerRecord's
    ClearElrRecord (28) v0             TopicName nullable string (null: every topic)

`describe_metadata_record` raises ValueError with the message Kafka's serde gives for what it
cannot read (an unknown frame version or api key, a version the type does not have, fields that
do not fit), which the dump prints as Kafka prints a record it cannot read.
"""

from __future__ import annotations

from dataclasses import dataclass

from seglogfs.engine.internal_topics.metadata_log import CONFIG_RECORD, FRAME_VERSION, REMOVE_TOPIC_RECORD, TOPIC_RECORD
from seglogfs.engine.record.messages import Field, Reader, Schema, decode_struct, json_ready, since, to_json

_NULLABLE = since(0)


@dataclass(frozen=True)
class MetadataRecordType:
    """One of Kafka's MetadataRecordType values: the name it prints, the schema, the highest
    version (`validVersions` "0-N")."""

    name: str
    schema: Schema
    highest_version: int = 0


def _schema(name: str, *fields: Field) -> Schema:
    return Schema(name, fields, flexible_from=0)


def _endpoint(name: str) -> Schema:
    return _schema(
        name,
        Field("Name", "string"),
        Field("Host", "string"),
        Field("Port", "uint16"),
        Field("SecurityProtocol", "int16"),
    )


def _feature(name: str) -> Schema:
    return _schema(
        name, Field("Name", "string"), Field("MinSupportedVersion", "int16"), Field("MaxSupportedVersion", "int16")
    )


def _broker_ids(name: str, tag: int, versions: tuple[int, int] = since(0)) -> Field:
    """A PartitionChangeRecord replica list: tagged, nullable, null ("did not change") by default."""
    return Field(name, "[]int32", versions, nullable=versions, tag=tag, default=None)


METADATA_RECORD_TYPES = {
    0: MetadataRecordType(
        "REGISTER_BROKER_RECORD",
        _schema(
            "RegisterBrokerRecord",
            Field("BrokerId", "int32"),
            Field("IsMigratingZkBroker", "bool", since(2)),
            Field("IncarnationId", "uuid"),
            Field("BrokerEpoch", "int64"),
            Field("EndPoints", _endpoint("BrokerEndpoint"), array=True),
            Field("Features", _feature("BrokerFeature"), array=True),
            Field("Rack", "string", nullable=_NULLABLE),
            Field("Fenced", "bool"),
            Field("InControlledShutdown", "bool", since(1)),
            Field("LogDirs", "[]uuid", since(3), tag=0, default=[]),
            Field("CordonedLogDirs", "[]uuid", since(4), nullable=since(4), tag=1, default=None),
        ),
        highest_version=4,
    ),
    1: MetadataRecordType(
        "UNREGISTER_BROKER_RECORD",
        _schema("UnregisterBrokerRecord", Field("BrokerId", "int32"), Field("BrokerEpoch", "int64")),
    ),
    TOPIC_RECORD: MetadataRecordType(
        "TOPIC_RECORD", _schema("TopicRecord", Field("Name", "string"), Field("TopicId", "uuid"))
    ),
    3: MetadataRecordType(
        "PARTITION_RECORD",
        _schema(
            "PartitionRecord",
            Field("PartitionId", "int32"),
            Field("TopicId", "uuid"),
            Field("Replicas", "[]int32"),
            Field("Isr", "[]int32"),
            Field("RemovingReplicas", "[]int32"),
            Field("AddingReplicas", "[]int32"),
            Field("Leader", "int32"),
            Field("LeaderRecoveryState", "int8", tag=0, default=0),
            Field("LeaderEpoch", "int32"),
            Field("PartitionEpoch", "int32"),
            Field("Directories", "[]uuid", since(1)),
            Field("EligibleLeaderReplicas", "[]int32", since(2), nullable=since(2), tag=1, default=None),
            Field("LastKnownElr", "[]int32", since(2), nullable=since(2), tag=2, default=None),
        ),
        highest_version=2,
    ),
    CONFIG_RECORD: MetadataRecordType(
        "CONFIG_RECORD",
        _schema(
            "ConfigRecord",
            Field("ResourceType", "int8"),
            Field("ResourceName", "string"),
            Field("Name", "string"),
            Field("Value", "string", nullable=_NULLABLE),
        ),
    ),
    5: MetadataRecordType(
        "PARTITION_CHANGE_RECORD",
        _schema(
            "PartitionChangeRecord",
            Field("PartitionId", "int32"),
            Field("TopicId", "uuid"),
            _broker_ids("Isr", 0),
            Field("Leader", "int32", tag=1, default=-2),
            _broker_ids("Replicas", 2),
            _broker_ids("RemovingReplicas", 3),
            _broker_ids("AddingReplicas", 4),
            Field("LeaderRecoveryState", "int8", tag=5, default=-1),
            Field("Directories", "[]uuid", since(1), nullable=since(1), tag=8, default=None),
            _broker_ids("EligibleLeaderReplicas", 6, since(2)),
            _broker_ids("LastKnownElr", 7, since(2)),
        ),
        highest_version=2,
    ),
    7: MetadataRecordType(
        "FENCE_BROKER_RECORD", _schema("FenceBrokerRecord", Field("Id", "int32"), Field("Epoch", "int64"))
    ),
    8: MetadataRecordType(
        "UNFENCE_BROKER_RECORD", _schema("UnfenceBrokerRecord", Field("Id", "int32"), Field("Epoch", "int64"))
    ),
    REMOVE_TOPIC_RECORD: MetadataRecordType(
        "REMOVE_TOPIC_RECORD", _schema("RemoveTopicRecord", Field("TopicId", "uuid"))
    ),
    10: MetadataRecordType(
        "DELEGATION_TOKEN_RECORD",
        _schema(
            "DelegationTokenRecord",
            Field("Owner", "string"),
            Field("Requester", "string"),
            Field("Renewers", "[]string"),
            Field("IssueTimestamp", "int64"),
            Field("MaxTimestamp", "int64"),
            Field("ExpirationTimestamp", "int64"),
            Field("TokenId", "string"),
        ),
    ),
    11: MetadataRecordType(
        "USER_SCRAM_CREDENTIAL_RECORD",
        _schema(
            "UserScramCredentialRecord",
            Field("Name", "string"),
            Field("Mechanism", "int8"),
            Field("Salt", "bytes"),
            Field("StoredKey", "bytes"),
            Field("ServerKey", "bytes"),
            Field("Iterations", "int32"),
        ),
    ),
    12: MetadataRecordType(
        "FEATURE_LEVEL_RECORD", _schema("FeatureLevelRecord", Field("Name", "string"), Field("FeatureLevel", "int16"))
    ),
    14: MetadataRecordType(
        "CLIENT_QUOTA_RECORD",
        _schema(
            "ClientQuotaRecord",
            Field(
                "Entity",
                _schema("EntityData", Field("EntityType", "string"), Field("EntityName", "string", nullable=_NULLABLE)),
                array=True,
            ),
            Field("Key", "string"),
            Field("Value", "float64"),
            Field("Remove", "bool"),
        ),
    ),
    15: MetadataRecordType(
        "PRODUCER_IDS_RECORD",
        _schema(
            "ProducerIdsRecord",
            Field("BrokerId", "int32"),
            Field("BrokerEpoch", "int64"),
            Field("NextProducerId", "int64"),
        ),
    ),
    17: MetadataRecordType(
        "BROKER_REGISTRATION_CHANGE_RECORD",
        _schema(
            "BrokerRegistrationChangeRecord",
            Field("BrokerId", "int32"),
            Field("BrokerEpoch", "int64"),
            Field("Fenced", "int8", tag=0, default=0),
            Field("InControlledShutdown", "int8", since(1), tag=1, default=0),
            Field("LogDirs", "[]uuid", since(2), tag=2, default=[]),
            Field("CordonedLogDirs", "[]uuid", since(3), nullable=since(3), tag=3, default=None),
        ),
        highest_version=3,
    ),
    18: MetadataRecordType(
        "ACCESS_CONTROL_ENTRY_RECORD",
        _schema(
            "AccessControlEntryRecord",
            Field("Id", "uuid"),
            Field("ResourceType", "int8"),
            Field("ResourceName", "string"),
            Field("PatternType", "int8"),
            Field("Principal", "string"),
            Field("Host", "string"),
            Field("Operation", "int8"),
            Field("PermissionType", "int8"),
        ),
    ),
    19: MetadataRecordType(
        "REMOVE_ACCESS_CONTROL_ENTRY_RECORD", _schema("RemoveAccessControlEntryRecord", Field("Id", "uuid"))
    ),
    20: MetadataRecordType("NO_OP_RECORD", _schema("NoOpRecord")),
    21: MetadataRecordType(
        "ZK_MIGRATION_STATE_RECORD", _schema("ZkMigrationStateRecord", Field("ZkMigrationState", "int8"))
    ),
    22: MetadataRecordType(
        "REMOVE_USER_SCRAM_CREDENTIAL_RECORD",
        _schema("RemoveUserScramCredentialRecord", Field("Name", "string"), Field("Mechanism", "int8")),
    ),
    23: MetadataRecordType(
        "BEGIN_TRANSACTION_RECORD",
        _schema("BeginTransactionRecord", Field("Name", "string", nullable=_NULLABLE, tag=0, default=None)),
    ),
    24: MetadataRecordType("END_TRANSACTION_RECORD", _schema("EndTransactionRecord")),
    25: MetadataRecordType(
        "ABORT_TRANSACTION_RECORD",
        _schema("AbortTransactionRecord", Field("Reason", "string", nullable=_NULLABLE, tag=0, default=None)),
    ),
    26: MetadataRecordType(
        "REMOVE_DELEGATION_TOKEN_RECORD", _schema("RemoveDelegationTokenRecord", Field("TokenId", "string"))
    ),
    27: MetadataRecordType(
        "REGISTER_CONTROLLER_RECORD",
        _schema(
            "RegisterControllerRecord",
            Field("ControllerId", "int32"),
            Field("IncarnationId", "uuid"),
            Field("ZkMigrationReady", "bool"),
            Field("EndPoints", _endpoint("ControllerEndpoint"), array=True),
            Field("Features", _feature("ControllerFeature"), array=True),
        ),
    ),
    28: MetadataRecordType(
        "CLEAR_ELR_RECORD", _schema("ClearElrRecord", Field("TopicName", "string", nullable=_NULLABLE))
    ),
}


def describe_metadata_record(value: bytes) -> str:
    """`{"type":"TOPIC_RECORD","version":0,"data":{…}}` for a metadata record's value; ValueError
    with the message of Kafka's MetadataRecordSerde for what it cannot read."""
    reader = Reader(value)
    frame_version = reader.unsigned_varint()
    if frame_version == 0:
        raise ValueError(
            "Could not deserialize metadata record with frame version 0. Note that upgrades from the preview "
            "release of KRaft in 2.8 to newer versions are not supported."
        )
    if frame_version != FRAME_VERSION:
        raise ValueError(
            f"Could not deserialize metadata record due to unknown frame version {frame_version}"
            f"(only frame version {FRAME_VERSION} is supported)"
        )
    api_key = reader.unsigned_varint()
    version = reader.unsigned_varint()
    record_type = METADATA_RECORD_TYPES.get(api_key)
    if record_type is None:
        raise ValueError(f"org.apache.kafka.common.errors.UnsupportedVersionException: Unknown metadata id {api_key}")
    if version > record_type.highest_version:
        raise ValueError(f"Failed to deserialize record with type {api_key}")
    try:
        data = decode_struct(reader, record_type.schema, version, flexible=True)
    except ValueError:
        raise ValueError(f"Failed to deserialize record with type {api_key}") from None
    if not reader.at_end():
        raise ValueError(f"Found {len(value) - reader.position} byte(s) of garbage after {api_key}")
    return to_json({"type": record_type.name, "version": version, "data": json_ready(data, record_type.schema)})
