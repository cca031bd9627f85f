"""A KRaft broker's metadata log (`__cluster_metadata-0`), read for what a log dir's retention and
compaction need: which topics exist and their config overrides (the part of Kafka's
MetadataImage that its LogManager gives each log).

The partition dir holds segments like any partition (`<base offset>.log`, `.index`,
`.timeindex`) and KRaft snapshots, `<end offset, 20 digits>-<epoch, 10 digits>.checkpoint`: record
batches too (a SnapshotHeaderRecord control batch, the whole metadata state as records, a
SnapshotFooterRecord control batch), holding every record below `end offset`. Each record's value
is one metadata record, as Kafka's MetadataRecordSerde (AbstractApiMessageSerde) frames it:

    frame_version  unsigned varint  1 (0 was the 2.8 preview; Kafka refuses it, so do we)
    api_key        unsigned varint  which record (below)
    version        unsigned varint  the record's schema version
    fields         Kafka's "flexible versions" encoding: a string is a compact string (unsigned
                   varint length + 1, then UTF-8; 0 is null), a uuid 16 bytes, an int8 one byte;
                   then the tagged fields (unsigned varint count, then each: unsigned varint tag,
                   unsigned varint size, bytes), which are skipped

The records read here (in every version Kafka 3.x and 4.x brokers write; the broker data in
`tests/fixtures/kafka` holds them):

    TopicRecord (2) v0         Name string, TopicId uuid
    ConfigRecord (4) v0        ResourceType int8 (2 topic, 4 broker), ResourceName string,
                               Name string, Value nullable string
    RemoveTopicRecord (9) v0   TopicId uuid

Other records (partitions, brokers, features, no-ops, …) are skipped by their api key, undecoded.
A record of one of these keys in another version is refused (its layout is unknown): the image
is then unusable, and callers must not guess configs from it.

Replay, as a broker rebuilds its image: the latest snapshot, then the log's records from the
snapshot's end offset; with no snapshot, the log from offset 0. A later ConfigRecord for the same
resource and name replaces an earlier one; a null value removes the override; a RemoveTopicRecord
removes the topic and its configs (Kafka's controller drops them with it). Only whole, CRC-checked
batches count: reading stops at the first torn or corrupt batch, where recovery would cut the
log. Control batches hold no metadata records. `.checkpoint.part` (a snapshot being written) and
`.deleted` files are ignored.

Reading changes nothing on disk and takes no lock, so it works beside a running broker (it sees
what was written when it read). The log is read whole at every open: metadata logs are small
(snapshots keep them so), megabytes for thousands of topics.
"""

from __future__ import annotations

import base64
import logging
import os
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from seglogfs.engine.config import METADATA_TOPIC
from seglogfs.engine.errors import EngineError
from seglogfs.engine.fetched_files import whole_file
from seglogfs.engine.files import open_regular
from seglogfs.engine.log.naming import segment_log_files
from seglogfs.engine.record.messages import Reader
from seglogfs.engine.record.records import (
    BATCH_OVERHEAD_BYTES,
    LOG_OVERHEAD_BYTES,
    MAGIC_OFFSET,
    BatchHeader,
    check_batch,
    decode_records,
)

logger = logging.getLogger(__name__)

METADATA_PARTITION = 0
METADATA_PARTITION_DIR = f"{METADATA_TOPIC}-{METADATA_PARTITION}"

FRAME_VERSION = 1
TOPIC_RECORD = 2
CONFIG_RECORD = 4
REMOVE_TOPIC_RECORD = 9
TOPIC_RESOURCE = 2
BROKER_RESOURCE = 4
# api key → the schema versions whose layout the decoder below knows
_KNOWN_VERSIONS = {TOPIC_RECORD: (0,), CONFIG_RECORD: (0,), REMOVE_TOPIC_RECORD: (0,)}
_SNAPSHOT_NAME = re.compile(r"(\d{20})-(\d{10})\.checkpoint")


class MetadataLogError(EngineError):
    """A metadata record that cannot be decoded; the message names the file and the offset."""


@dataclass(frozen=True)
class MetadataImage:
    """What the metadata log says about topics and configs, as of `end_offset`.

    `topics`: topic name → topic id (URL-safe base64, no padding, as `partition.metadata` and
    Kafka's tools print it). `topic_configs`: topic name → its overrides, every name the broker
    stored (also names seglogfs does not know, such as `min.insync.replicas`). `broker_configs`:
    dynamic broker configs by resource name ("" for the cluster-wide default, else a node id).
    `snapshot`: the snapshot replayed first, if any. `end_offset`: the offset after the last
    record replayed."""

    topics: Mapping[str, str] = field(default_factory=dict)
    topic_configs: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    broker_configs: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    snapshot: Path | None = None
    end_offset: int = 0


@dataclass(frozen=True)
class TopicRecord:
    name: str
    topic_id: bytes


@dataclass(frozen=True)
class ConfigRecord:
    resource_type: int
    resource_name: str
    name: str
    value: str | None


@dataclass(frozen=True)
class RemoveTopicRecord:
    topic_id: bytes


MetadataRecord = TopicRecord | ConfigRecord | RemoveTopicRecord


def _string(reader: Reader) -> str:
    """A compact string that may not be null."""
    text = reader.string(flexible=True)
    if text is None:
        raise ValueError("null in a string field that cannot be null")
    return text


def _end(reader: Reader) -> None:
    """Skip the tagged fields, then insist on the end (Kafka refuses trailing bytes too)."""
    for _ in range(reader.unsigned_varint()):
        reader.unsigned_varint()  # tag
        reader.take(reader.unsigned_varint())
    if not reader.at_end():
        raise ValueError(f"{len(reader.buf) - reader.position} bytes follow the record's fields")


def decode_metadata_record(value: bytes) -> MetadataRecord | None:
    """The record a metadata log record's value holds, None for record types not read here.
    ValueError for a frame or layout this decoder does not know."""
    reader = Reader(value)
    frame_version = reader.unsigned_varint()
    if frame_version != FRAME_VERSION:
        raise ValueError(f"unknown metadata record frame version {frame_version} (expected {FRAME_VERSION})")
    api_key = reader.unsigned_varint()
    if api_key not in _KNOWN_VERSIONS:
        return None
    version = reader.unsigned_varint()
    if version not in _KNOWN_VERSIONS[api_key]:
        raise ValueError(f"metadata record type {api_key} in version {version}, which this reader does not know")
    record: MetadataRecord
    if api_key == TOPIC_RECORD:
        record = TopicRecord(_string(reader), reader.take(16))
    elif api_key == CONFIG_RECORD:
        record = ConfigRecord(reader.fixed("int8"), _string(reader), _string(reader), reader.string(flexible=True))
    else:
        record = RemoveTopicRecord(reader.take(16))
    _end(reader)
    return record


def topic_id_text(topic_id: bytes) -> str:
    """A topic id as Kafka prints it: URL-safe base64 of the 16 bytes, no padding."""
    return base64.urlsafe_b64encode(topic_id).rstrip(b"=").decode("ascii")


def _file_batches(path: Path) -> Iterator[tuple[BatchHeader, bytes]]:
    """Whole, CRC-checked v2 batches of a `.log` or snapshot file, in order, stopping quietly at
    the first incomplete, legacy or corrupt one (what recovery would cut). A link, a FIFO or a
    directory at a segment's or snapshot's name: UnsafeFileError naming it (engine.files)."""
    with os.fdopen(open_regular(path), "rb") as handle, whole_file(handle.fileno()):  # (a backup's, in a store)
        file_size = os.fstat(handle.fileno()).st_size
        position = 0
        while True:
            head = handle.read(BATCH_OVERHEAD_BYTES)
            if len(head) < BATCH_OVERHEAD_BYTES or head[MAGIC_OFFSET] != 2:
                return
            header = BatchHeader.parse(head, 0, position)
            if header.batch_length < BATCH_OVERHEAD_BYTES - LOG_OVERHEAD_BYTES or header.next_position > file_size:
                return
            batch = head + handle.read(header.size_in_bytes - BATCH_OVERHEAD_BYTES)
            if len(batch) < header.size_in_bytes:
                return
            reason = check_batch(header, batch)
            if reason is not None:
                logger.info("%s: metadata read stops at position %d: %s", path, position, reason)
                return
            yield header, batch
            position = header.next_position


def latest_snapshot(partition_dir: Path) -> tuple[int, Path] | None:
    """(end offset, path) of the newest complete KRaft snapshot in the dir, if any."""
    found = []
    with os.scandir(partition_dir) as entries:
        for entry in entries:
            match = _SNAPSHOT_NAME.fullmatch(entry.name)
            if match is not None:
                found.append((int(match.group(1)), int(match.group(2)), Path(entry.path)))
    if not found:
        return None
    end_offset, _epoch, path = max(found)
    return end_offset, path


class _Replay:
    """The image being rebuilt, record by record."""

    def __init__(self) -> None:
        self.topics: dict[str, bytes] = {}
        self.topic_configs: dict[str, dict[str, str]] = {}
        self.broker_configs: dict[str, dict[str, str]] = {}
        self.end_offset = 0

    def apply_file(self, path: Path, from_offset: int) -> None:
        for header, batch in _file_batches(path):
            if header.last_offset < from_offset:
                continue
            if header.is_control:
                self.end_offset = max(self.end_offset, header.next_offset)
                continue
            try:
                records = decode_records(header, batch)
            except Exception as error:  # a codec or varint error inside a batch whose CRC held
                raise MetadataLogError(f"{path}: undecodable batch at offset {header.base_offset}: {error}") from None
            for record in records:
                if record.offset < from_offset:
                    continue
                try:
                    decoded = decode_metadata_record(bytes(record.value or b""))
                except (ValueError, UnicodeDecodeError) as error:
                    raise MetadataLogError(f"{path}: metadata record at offset {record.offset}: {error}") from None
                if decoded is not None:
                    self.apply(decoded)
            self.end_offset = max(self.end_offset, header.next_offset)

    def apply(self, record: MetadataRecord) -> None:
        if isinstance(record, TopicRecord):
            self.topics[record.name] = record.topic_id
        elif isinstance(record, RemoveTopicRecord):
            for name, topic_id in list(self.topics.items()):
                if topic_id == record.topic_id:
                    del self.topics[name]
                    self.topic_configs.pop(name, None)
        else:
            if record.resource_type == TOPIC_RESOURCE:
                table = self.topic_configs
            elif record.resource_type == BROKER_RESOURCE:
                table = self.broker_configs
            else:
                return  # client quotas, groups, …: nothing a log uses
            configs = table.setdefault(record.resource_name, {})
            if record.value is None:
                configs.pop(record.name, None)
            else:
                configs[record.name] = record.value

    def image(self, snapshot: Path | None) -> MetadataImage:
        return MetadataImage(
            topics={name: topic_id_text(topic_id) for name, topic_id in self.topics.items()},
            topic_configs={name: dict(c) for name, c in self.topic_configs.items() if c},
            broker_configs={name: dict(c) for name, c in self.broker_configs.items() if c},
            snapshot=snapshot,
            end_offset=self.end_offset,
        )


def read_metadata_image(partition_dir: Path, *, use_snapshot: bool = True) -> MetadataImage:
    """Replay the metadata log in `partition_dir` (see the module docstring); `use_snapshot=False`
    replays the log alone, which must then start at offset 0. Raises MetadataLogError for a
    record it cannot decode, and also when the records since the cluster began are not all there
    (no snapshot, and the log starts above offset 0), since the configs set before the first
    record left are then unknown. OSError passes through. Thread-safe (reads files only)."""
    snapshot = latest_snapshot(partition_dir) if use_snapshot else None
    logs = segment_log_files(partition_dir)
    replay = _Replay()
    start = 0
    if snapshot is not None:
        start, snapshot_path = snapshot
        replay.apply_file(snapshot_path, 0)
        replay.end_offset = start
    if logs and logs[0][0] > start:
        raise MetadataLogError(
            f"{partition_dir}: the metadata log starts at offset {logs[0][0]} and no snapshot covers the "
            f"offsets below it"
            + ("" if snapshot is None else f" (the latest snapshot, {snapshot[1].name}, ends at {start})")
        )
    for index, (_base, path) in enumerate(logs):
        following = logs[index + 1][0] if index + 1 < len(logs) else None
        if following is not None and following <= start:
            continue  # wholly below the snapshot
        replay.apply_file(path, start)
    return replay.image(None if snapshot is None else snapshot[1])
