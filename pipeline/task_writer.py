"""A write job's tasks (in the executors, in parallel): each task places its rows in partitions
as Kafka's producer does (the `partition` column; else murmur2 of the key, vectorised; a null key
goes round-robin), encodes them into v2 batches (the compiled core, at most `max.message.bytes`
each — and `segment.bytes`, which a log's batch cannot pass either — CreateTime now, the topic's
codec) and appends them to its staging files, one per partition written and another each time one
would pass the topic's `segment.bytes` (`<staging>/<job>/<task>.<n>.batches`); its commit message
(`Staged`) lists which files hold which partition's batches.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import random
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import numpy as np
import pyarrow as pa

from seglogfs.engine import (
    InvalidRecordError,
    UnknownTopicOrPartitionError,
)
from seglogfs.engine.record.builder import ESTIMATED_RECORD_VARINTS, encode_batches
from seglogfs.engine.record.records import BATCH_OVERHEAD_BYTES, Header
from seglogfs.pipeline.encoding import encode_columns
from seglogfs.pipeline.partitioning import binary_parts, partitions_for_keys
from seglogfs.pipeline.staging import Region, Staged
from seglogfs.pipeline.writing import TopicTarget, WritePlan


def _as_binary(column: pa.Array) -> pa.Array:
    """A key or value column as Arrow `binary` (strings are their UTF-8 bytes, as Spark's Kafka
    sink writes them)."""
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    return column if column.type == pa.binary() else column.cast(pa.binary())


def _header_pairs(row: Sequence[Mapping[str, object]] | None) -> list[Header]:
    if not row:
        return []
    pairs: list[Header] = []
    for entry in row:
        key, value = entry.get("key"), entry.get("value")
        if not isinstance(key, str):
            raise InvalidRecordError("a record header has a null key")
        pairs.append((key, bytes(value) if isinstance(value, bytes | bytearray) else None))
    return pairs


class TaskWriter:
    """One task's rows → its staging files: one per partition written (and another each time one
    reaches the topic's `segment.bytes`), so that the commit can make a large one a segment as
    it is. Not thread-safe (one per task)."""

    def __init__(self, plan: WritePlan, name: str) -> None:
        self.plan = plan
        self.name = name
        self.staged = Staged(name)
        self._regions: dict[tuple[str, int], list[Region]] = {}  # each partition's, one per staging file
        self._files = 0
        self._round_robin: dict[str, int] = {}
        self._now_ms = int(time.time() * 1000)

    def add(self, batch: pa.RecordBatch) -> None:
        """Encode and stage one Arrow batch of the DataFrame."""
        if batch.num_rows == 0:
            return
        if self.plan.options.topic is not None:
            self._add_topic(self.plan.options.topic, batch)
            return
        topics = batch.column("topic")
        if topics.null_count:
            raise InvalidRecordError(
                "Null topic present in the data. Use the topic option for setting a default topic."
            )
        encoded = topics.dictionary_encode()
        indices = encoded.indices.to_numpy()
        names = encoded.dictionary.to_pylist()
        if len(names) == 1:
            self._add_topic(names[0], batch)
            return
        for slot, name in enumerate(names):
            self._add_topic(name, batch.take(pa.array(np.flatnonzero(indices == slot))))

    def _partitions(self, topic: str, target: TopicTarget, batch: pa.RecordBatch, keys: pa.Array | None) -> np.ndarray:
        n = batch.num_rows
        chosen = np.full(n, -1, np.int64)
        if self.plan.columns.partition:
            given = batch.column("partition")
            explicit = given.fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int64)
            bad = (explicit >= target.partitions) | ((explicit < 0) & given.is_valid().to_numpy(zero_copy_only=False))
            if bad.any():
                wrong = int(explicit[np.flatnonzero(bad)[0]])
                raise UnknownTopicOrPartitionError(
                    f"topic {topic!r} has {target.partitions} partitions: there is no partition {wrong}"
                )
            chosen = explicit
        if keys is not None and (chosen < 0).any():
            by_key = partitions_for_keys(keys, target.partitions)
            chosen = np.where(chosen < 0, by_key, chosen)
        rest = np.flatnonzero(chosen < 0)
        if len(rest):  # null keys: round-robin from a random partition, per topic, per task
            start = self._round_robin.get(topic, random.randrange(target.partitions))
            chosen[rest] = (start + np.arange(len(rest))) % target.partitions
            self._round_robin[topic] = (start + len(rest)) % target.partitions
        return chosen

    def _add_topic(self, topic: str, batch: pa.RecordBatch) -> None:
        target = self.plan.target(topic)
        values = _as_binary(batch.column("value"))
        keys = _as_binary(batch.column("key")) if self.plan.columns.key else None
        if target.compact and (keys is None or keys.null_count):
            raise InvalidRecordError(f"topic {topic!r} is compacted (cleanup.policy=compact): every record needs a key")
        chosen = self._partitions(topic, target, batch, keys)
        headers = batch.column("headers") if self.plan.columns.headers else None
        for partition in np.unique(chosen).tolist():
            rows = (
                None if len(chosen) and (chosen == partition).all() else pa.array(np.flatnonzero(chosen == partition))
            )
            self._encode(
                topic,
                partition,
                target,
                values if rows is None else values.take(rows),
                keys=None if keys is None else keys if rows is None else keys.take(rows),
                headers=None if headers is None else headers if rows is None else headers.take(rows),
            )

    def _encode(
        self,
        topic: str,
        partition: int,
        target: TopicTarget,
        values: pa.Array,
        *,
        keys: pa.Array | None,
        headers: pa.Array | None,
    ) -> None:
        n = len(values)
        codec = self.plan.options.compression or target.compression
        header_list = None
        if headers is not None and headers.null_count < n:
            header_list = [_header_pairs(row) for row in headers.to_pylist()]
            if not any(header_list):
                header_list = None
        if header_list is None:  # column-wise, no Python object per record
            batches = encode_columns(
                values,
                keys,
                timestamp=self._now_ms,
                max_batch_bytes=target.batch_limit,
                target_batch_bytes=self.plan.options.batch_bytes,
                compression=codec,
                where=f"{topic}-{partition}",
            )
        else:
            sizes = np.maximum(binary_parts(values)[2], 0) * values.is_valid().to_numpy(zero_copy_only=False)
            sizes = sizes + ESTIMATED_RECORD_VARINTS
            key_list = None
            if keys is not None and keys.null_count < n:
                key_list = keys.to_pylist()
                sizes = sizes + np.maximum(binary_parts(keys)[2], 0)
            sizes = sizes + np.fromiter(
                (sum(len(k) + len(v or b"") + 8 for k, v in h) for h in header_list), np.int64, n
            )
            batches = encode_batches(
                values.to_pylist(),
                keys=key_list,
                headers=header_list,
                timestamps=self._now_ms,
                max_batch_bytes=target.batch_limit,
                target_batch_bytes=self.plan.options.batch_bytes,
                where=f"{topic}-{partition}",
                compression=codec,
                sizes=sizes,
            )
        self._stage(topic, partition, target.segment_bytes, batches)

    def _stage(self, topic: str, partition: int, segment_bytes: int, batches: Sequence[bytes | bytearray]) -> None:
        """Append `batches` to the partition's staging file, starting another file where one
        would pass `segment_bytes`; the partition's last region grows, or a new one starts."""
        regions = self._regions.setdefault((topic, partition), [])
        fd = -1
        try:
            for batch in batches:
                last = regions[-1] if regions else None
                if last is None or (last.length and last.length + len(batch) > segment_bytes):
                    last = Region(topic, partition, 0, 0, 0, f"{self.name}.{self._files}.batches")
                    self._files += 1
                    regions.append(last)
                    if fd >= 0:
                        os.close(fd)
                        fd = -1
                if fd < 0:
                    path = Path(self.plan.job_dir) / last.file
                    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644)
                view = memoryview(batch)
                while view:
                    view = view[os.write(fd, view) :]
                records = int.from_bytes(batch[BATCH_OVERHEAD_BYTES - 4 : BATCH_OVERHEAD_BYTES], "big")
                regions[-1] = dataclasses.replace(last, length=last.length + len(batch), records=last.records + records)
                self.staged.records += records
        finally:
            if fd >= 0:
                os.close(fd)

    def finish(self) -> Staged:
        self.staged.regions = [region for regions in self._regions.values() for region in regions]
        return self.staged

    def abandon(self) -> None:
        for regions in self._regions.values():
            for region in regions:
                with contextlib.suppress(OSError):
                    (Path(self.plan.job_dir) / region.file).unlink()


def write_task(plan: WritePlan, batches: Iterable[pa.RecordBatch]) -> Staged:
    """A task's whole part of a write: every Arrow batch staged, its file closed."""
    writer = TaskWriter(plan, f"task-{uuid.uuid4().hex}")
    try:
        for batch in batches:
            writer.add(batch)
    except BaseException:
        writer.abandon()
        raise
    return writer.finish()
