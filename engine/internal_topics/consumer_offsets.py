"""Consumer groups as the group coordinator stores them: the `__consumer_offsets` topic.

Each record's key starts with an int16 record type (Kafka calls it the key version), which says
what the key and the value are (Kafka's GroupCoordinatorRecordSerde; schemas OffsetCommitKey,
OffsetCommitValue, GroupMetadataKey, GroupMetadataValue):

    key type 0, 1  OffsetCommitKey     group string, topic string, partition int32
    key type 2     GroupMetadataKey    group string

    value (int16 version first)
    OffsetCommitValue v0-v4   offset int64, leaderEpoch int32 (v3+), metadata string,
                              commitTimestamp int64, expireTimestamp int64 (v1 only);
                              v4+ flexible (compact strings, tagged fields)
    GroupMetadataValue v0-v4  protocolType string, generation int32, protocol nullable string,
                              leader nullable string, currentStateTimestamp int64 (v2+),
                              members [MemberMetadata]; v4+ flexible
      MemberMetadata          memberId string, groupInstanceId nullable string (v3+),
                              clientId string, clientHost string, rebalanceTimeout int32 (v1+),
                              sessionTimeout int32, subscription bytes, assignment bytes

A member's subscription and assignment are, for protocol type `consumer`, the consumer
protocol's own messages (an int16 version, then ConsumerProtocolSubscription: topics [string],
userData nullable bytes, ownedPartitions [topic, partitions [int32]] (v1+), generationId int32
(v2+), rackId nullable string (v3+); ConsumerProtocolAssignment: assignedPartitions [topic,
partitions [int32]], userData nullable bytes). Non-flexible in every version.

Replay, as the coordinator loads a partition (GroupMetadataManager / CoordinatorLoader): every
batch of every `__consumer_offsets-N` partition of a data dir opened read-only
(`PartitionLog.batches`, compacted segments included), in offset order; the latest record of a
key wins; a null value (tombstone) removes the key's offset or the
group's metadata. Offsets committed inside a transaction (a transactional batch) take effect
when the producer's COMMIT marker comes, and are dropped at its ABORT marker.

What an operator gets on bad data:
  * a key whose record type is not one of the above (the KIP-848 consumer and share group
    records, types 3 and up, or an unknown type): skipped, with a warning naming the file and
    offset, as Kafka's loader skips ("Unknown message key ... Ignoring it");
  * a key or value of a known type that does not decode (too short, bad string, unknown value
    version): ConsumerOffsetsError naming the file and offset; nothing is guessed;
  * a batch that fails its CRC: the engine's CorruptRecordError naming the file and position;
  * an incomplete batch at the end of a partition (a broker writing): not read, as every
    read-only reader leaves it.

Reading changes nothing and takes no lock. Not thread-safe per call (each call reads afresh).
"""

from __future__ import annotations

import struct
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from seglogfs.engine.errors import EngineError
from seglogfs.engine.log.log import PartitionLog
from seglogfs.engine.record.messages import Field, Schema, decode, since
from seglogfs.engine.record.records import (
    BatchHeader,
    ControlType,
    control_type,
    decode_records,
)

OFFSET_COMMIT_KEY_TYPES = (0, 1)
GROUP_METADATA_KEY_TYPE = 2
CONSUMER_PROTOCOL_TYPE = "consumer"

OFFSET_COMMIT_KEY = Schema(
    "OffsetCommitKey", (Field("group", "string"), Field("topic", "string"), Field("partition", "int32"))
)
GROUP_METADATA_KEY = Schema("GroupMetadataKey", (Field("group", "string"),))
OFFSET_COMMIT_VALUE = Schema(
    "OffsetCommitValue",
    (
        Field("offset", "int64"),
        Field("leaderEpoch", "int32", since(3)),
        Field("metadata", "string"),
        Field("commitTimestamp", "int64"),
        Field("expireTimestamp", "int64", since(1, 1)),
    ),
    flexible_from=4,
)
OFFSET_COMMIT_VALUE_VERSIONS = range(5)
MEMBER_METADATA = Schema(
    "MemberMetadata",
    (
        Field("memberId", "string"),
        Field("groupInstanceId", "string", since(3), nullable=since(3)),
        Field("clientId", "string"),
        Field("clientHost", "string"),
        Field("rebalanceTimeout", "int32", since(1)),
        Field("sessionTimeout", "int32"),
        Field("subscription", "bytes"),
        Field("assignment", "bytes"),
    ),
)
GROUP_METADATA_VALUE = Schema(
    "GroupMetadataValue",
    (
        Field("protocolType", "string"),
        Field("generation", "int32"),
        Field("protocol", "string", nullable=since(0)),
        Field("leader", "string", nullable=since(0)),
        Field("currentStateTimestamp", "int64", since(2)),
        Field("members", MEMBER_METADATA, array=True),
    ),
    flexible_from=4,
)
GROUP_METADATA_VALUE_VERSIONS = range(5)
_TOPIC_PARTITIONS = Schema("TopicPartition", (Field("topic", "string"), Field("partitions", "[]int32")))
CONSUMER_PROTOCOL_SUBSCRIPTION = Schema(
    "ConsumerProtocolSubscription",
    (
        Field("topics", "[]string"),
        Field("userData", "bytes", nullable=since(0)),
        Field("ownedPartitions", _TOPIC_PARTITIONS, since(1), array=True),
        Field("generationId", "int32", since(2)),
        Field("rackId", "string", since(3), nullable=since(3)),
    ),
)
CONSUMER_PROTOCOL_ASSIGNMENT = Schema(
    "ConsumerProtocolAssignment",
    (Field("assignedPartitions", _TOPIC_PARTITIONS, array=True), Field("userData", "bytes", nullable=since(0))),
)
CONSUMER_PROTOCOL_VERSIONS = range(4)


class ConsumerOffsetsError(EngineError):
    """A `__consumer_offsets` record or batch that cannot be read; the message names the file
    and the offset (or position)."""


class GroupIdNotFoundError(EngineError):
    """No group of that id in the offsets topic (Kafka's GroupIdNotFoundException)."""


@dataclass(frozen=True)
class OffsetCommit:
    """A committed offset (OffsetCommitValue); `leader_epoch` -1 and `expire_timestamp` -1
    when the value's version does not hold them."""

    offset: int
    leader_epoch: int
    metadata: str
    commit_timestamp: int
    expire_timestamp: int


@dataclass(frozen=True)
class GroupMember:
    """One member of a group (MemberMetadata), with the partitions its assignment gives it
    (decoded for protocol type `consumer`, else empty)."""

    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    rebalance_timeout_ms: int
    session_timeout_ms: int
    subscription: bytes
    assignment: bytes
    assigned_partitions: tuple[tuple[str, int], ...] = ()


@dataclass(frozen=True)
class GroupMetadata:
    """A group's GroupMetadataValue: its protocol, generation, leader and members."""

    protocol_type: str
    generation: int
    protocol: str | None
    leader: str | None
    current_state_timestamp: int
    members: tuple[GroupMember, ...]


@dataclass
class ConsumerGroup:
    """A group as the coordinator would load it: its metadata (None when there is none) and
    its committed offsets by (topic, partition)."""

    group_id: str
    metadata: GroupMetadata | None = None
    offsets: dict[tuple[str, int], OffsetCommit] = field(default_factory=dict)

    @property
    def state(self) -> str:
        """Kafka's group state as a loaded group has it: `Empty` without members, else
        `Stable`."""
        return "Stable" if self.metadata is not None and self.metadata.members else "Empty"


@dataclass(frozen=True)
class GroupCoordinatorState:
    """The groups of the partitions read (by id, sorted), the offsets topic's partitions read,
    and the warnings about records skipped (one line each, naming the file and offset)."""

    groups: dict[str, ConsumerGroup]
    partitions: tuple[int, ...]
    warnings: tuple[str, ...]


# -- records -----------------------------------------------------------------------------------------
def key_type(key: bytes) -> int:
    """The int16 record type at the start of a key; ValueError when the key is shorter."""
    if len(key) < 2:
        raise ValueError(f"key of {len(key)} bytes has no record type")
    return int(struct.unpack_from(">h", key)[0])


def decode_key(key: bytes) -> tuple[int, dict[str, Any]] | None:
    """(record type, fields) of an OffsetCommitKey or GroupMetadataKey; None for another type.
    ValueError when a key of a known type does not decode."""
    kind = key_type(key)
    if kind in OFFSET_COMMIT_KEY_TYPES:
        return kind, decode(key, OFFSET_COMMIT_KEY, 0, 2)
    if kind == GROUP_METADATA_KEY_TYPE:
        return kind, decode(key, GROUP_METADATA_KEY, 0, 2)
    return None


def decode_value(kind: int, value: bytes) -> tuple[int, dict[str, Any]]:
    """(version, fields) of the value that goes with a key of type `kind` (0-2). ValueError
    for a version outside 0-4 or bytes that do not decode."""
    if len(value) < 2:
        raise ValueError(f"value of {len(value)} bytes has no version")
    version = int(struct.unpack_from(">h", value)[0])
    schema, versions = (
        (GROUP_METADATA_VALUE, GROUP_METADATA_VALUE_VERSIONS)
        if kind == GROUP_METADATA_KEY_TYPE
        else (OFFSET_COMMIT_VALUE, OFFSET_COMMIT_VALUE_VERSIONS)
    )
    if version not in versions:
        raise ValueError(f"{schema.name} version {version} is unknown (known: 0-{versions[-1]})")
    return version, decode(value, schema, version, 2)


def decode_consumer_protocol(raw: bytes, schema: Schema) -> tuple[int, dict[str, Any]]:
    """(version, fields) of a consumer protocol subscription or assignment; ValueError when the
    bytes do not hold one."""
    if len(raw) < 2:
        raise ValueError("consumer protocol message without a version")
    version = int(struct.unpack_from(">h", raw)[0])
    if version not in CONSUMER_PROTOCOL_VERSIONS:
        raise ValueError(f"consumer protocol version {version} is unknown")
    return version, decode(raw, schema, version, 2)


def _offset_commit(fields: dict[str, Any]) -> OffsetCommit:
    return OffsetCommit(
        fields["offset"],
        fields.get("leaderEpoch", -1),
        fields["metadata"],
        fields["commitTimestamp"],
        fields.get("expireTimestamp", -1),
    )


def _assigned(protocol_type: str, assignment: bytes) -> tuple[tuple[str, int], ...]:
    """The partitions a consumer-protocol assignment holds; none for other protocols or an
    assignment that does not decode (Kafka's tools keep the raw bytes then)."""
    if protocol_type != CONSUMER_PROTOCOL_TYPE or not assignment:
        return ()
    try:
        _version, fields = decode_consumer_protocol(assignment, CONSUMER_PROTOCOL_ASSIGNMENT)
    except ValueError:
        return ()
    return tuple((tp["topic"], p) for tp in fields["assignedPartitions"] or () for p in tp["partitions"] or ())


def _group_metadata(fields: dict[str, Any]) -> GroupMetadata:
    protocol_type = fields["protocolType"]
    members = tuple(
        GroupMember(
            m["memberId"],
            m.get("groupInstanceId"),
            m["clientId"],
            m["clientHost"],
            m.get("rebalanceTimeout", m["sessionTimeout"]),  # v0 has one timeout for both
            m["sessionTimeout"],
            m["subscription"] or b"",
            m["assignment"] or b"",
            _assigned(protocol_type, m["assignment"] or b""),
        )
        for m in fields["members"] or ()
    )
    return GroupMetadata(
        protocol_type,
        fields["generation"],
        fields["protocol"],
        fields["leader"],
        fields.get("currentStateTimestamp", -1),
        members,
    )


# -- replay ------------------------------------------------------------------------------------------
class _Replay:
    """The groups being rebuilt, record by record."""

    def __init__(self) -> None:
        self.groups: dict[str, ConsumerGroup] = {}
        self.warnings: list[str] = []
        # Transactional offset commits waiting for their producer's marker, by producer id.
        self.pending: dict[int, list[tuple[str, tuple[str, int], OffsetCommit | None]]] = {}

    def group(self, group_id: str) -> ConsumerGroup:
        found = self.groups.get(group_id)
        if found is None:
            found = self.groups[group_id] = ConsumerGroup(group_id)
        return found

    def apply_batch(self, path: Path, header: BatchHeader, batch: bytes | bytearray | memoryview) -> None:
        try:
            records = decode_records(header, batch, include_control=True)
        except Exception as error:  # a codec or varint error inside a batch whose CRC held
            raise ConsumerOffsetsError(f"{path}: undecodable batch at offset {header.base_offset}: {error}") from None
        if header.is_control:
            for record in records:
                marker = control_type(record)
                commits = self.pending.pop(header.producer_id, [])
                if marker is ControlType.COMMIT:
                    for group_id, partition, commit in commits:
                        self.set_offset(group_id, partition, commit)
            return
        for record in records:
            self.apply_record(path, record.offset, record.key, record.value, header)

    def apply_record(
        self, path: Path, offset: int, key: bytes | None, value: bytes | None, header: BatchHeader
    ) -> None:
        where = f"{path}: record at offset {offset}"
        if key is None:
            raise ConsumerOffsetsError(f"{where} has no key (every offsets topic record has one)")
        try:
            decoded = decode_key(bytes(key))
            if decoded is None:
                self.warnings.append(
                    f"{where}: record type {key_type(bytes(key))} is not read here (KIP-848 consumer or share "
                    "group records, or a newer type); skipped"
                )
                return
            kind, key_fields = decoded
            value_fields = None if value is None else decode_value(kind, bytes(value))[1]
        except (ValueError, UnicodeDecodeError) as error:
            raise ConsumerOffsetsError(f"{where}: {error}") from None
        group_id = key_fields["group"]
        if kind == GROUP_METADATA_KEY_TYPE:
            group = self.group(group_id)
            group.metadata = None if value_fields is None else _group_metadata(value_fields)
            self._drop_if_gone(group)
            return
        partition = (key_fields["topic"], key_fields["partition"])
        commit = None if value_fields is None else _offset_commit(value_fields)
        if header.is_transactional:
            self.pending.setdefault(header.producer_id, []).append((group_id, partition, commit))
        else:
            self.set_offset(group_id, partition, commit)

    def set_offset(self, group_id: str, partition: tuple[str, int], commit: OffsetCommit | None) -> None:
        group = self.group(group_id)
        if commit is None:
            group.offsets.pop(partition, None)
            self._drop_if_gone(group)
        else:
            group.offsets[partition] = commit

    def _drop_if_gone(self, group: ConsumerGroup) -> None:
        if group.metadata is None and not group.offsets:
            self.groups.pop(group.group_id, None)


def read_consumer_groups(logs: Mapping[int, PartitionLog]) -> GroupCoordinatorState:
    """Replay `__consumer_offsets`, its partitions' logs by partition (see the module docstring).
    Raises ConsumerOffsetsError for records that do not decode, CorruptRecordError for damage."""
    partitions = tuple(sorted(logs))
    replay = _Replay()
    for partition in partitions:
        log = logs[partition]
        for segment, header, batch in log.batches(log.log_start_offset):
            replay.apply_batch(segment.log_path, header, batch)
        replay.pending.clear()  # an open transaction's commits are not visible yet
    groups = {group_id: replay.groups[group_id] for group_id in sorted(replay.groups)}
    return GroupCoordinatorState(groups, partitions, tuple(replay.warnings))
