"""Streaming writes (`writeStream.format("seglog")`), exactly once per micro-batch.

Spark runs a micro-batch's tasks, then the sink's commit, then records the batch in the query's
checkpoint; a failure anywhere before that record makes Spark run the batch again, with the same
batch id. Spark's Kafka sink appends such a batch twice. This sink does not:

* A query is its checkpoint: the stream's identity is the `checkpointLocation` Spark passes the
  sink (else `queryName`, under `spark.sql.streaming.checkpointLocation`). Its state lives in
  `<staging root>/streams/<digest of the identity>/`: the tasks' staged batches and
  `ledger.json` — the last committed batch id, and the commit under way, if any.
* Tasks stage as a batch write's do (`task_writer.TaskWriter`). The commit, holding the data dir's
  lock: makes the staged files durable; writes the ledger's *pending* entry (the batch id, and
  per partition its log end offset before the append and the staged regions); appends; flushes;
  then writes the batch as committed and removes the staged files.
* A commit finds a pending entry left by a commit that died (kill -9, power cut, a failed
  write): it finishes it before anything else. For each partition it walks the log from the
  recorded start and matches the batches there against the staged ones — by CRC, record count
  and size, which do not depend on the offsets the append assigned — then appends what is
  missing. So the batches of a micro-batch are all appended once, whatever instruction the
  crash hit, and records once visible stay.
* A batch id at or below the committed one is a replay: its staged batches are dropped.

A pending commit is always rolled forward, never back: consumers may have read its first
partitions already.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from seglogfs.engine import DataDir, PartitionLog
from seglogfs.engine.log.checkpoint import fsync_dir, write_atomically
from seglogfs.engine.record.records import BatchHeader, iter_batch_headers
from seglogfs.pipeline.commit import create_topics, open_writable
from seglogfs.pipeline.options import OptionError, lowered
from seglogfs.pipeline.staging import Region, Staged, regions_by_partition
from seglogfs.pipeline.writing import Columns, WriteOptions, WritePlan, plan_targets, staging_root_of

STREAMS_DIR = "streams"
APPEND_CHUNK_BYTES = 64 << 20  # staged batches handed to one append_batches call
LEDGER_FILE = "ledger.json"


def stream_identity(raw: Mapping[str, str]) -> str:
    """The query a streaming write belongs to: its checkpoint location (else its name)."""
    options = lowered(raw)
    checkpoint = options.get("checkpointlocation")
    if checkpoint:
        return "checkpoint:" + str(Path(checkpoint).expanduser().absolute())
    name = options.get("queryname")
    if name:
        return "query:" + name
    raise OptionError(
        "a streaming write to seglog needs option('checkpointLocation', ...): exactly-once is kept per query, "
        "and a query is known by its checkpoint"
    )


def plan_stream_write(options: WriteOptions, columns: Columns, identity: str, now_ms: int) -> WritePlan:
    """The plan of a streaming write: its tasks stage in the stream's own dir."""
    if options.location.mounted:
        raise OptionError(
            f"{options.location.mount_point} is a seglogfs mount: streaming writes go to a data dir (exactly-once "
            "needs the data dir's lock across a commit); batch writes go through mounts"
        )
    digest = hashlib.sha256(identity.encode()).hexdigest()[:24]
    stream_dir = staging_root_of(options) / STREAMS_DIR / digest
    plan = plan_targets(options, columns, stream_dir, now_ms)
    stream_dir.mkdir(parents=True, exist_ok=True)
    identity_file = stream_dir / "query"
    if not identity_file.exists():
        write_atomically(identity_file, identity + "\n")
    return plan


# -- the ledger ------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class PendingPartition:
    """One partition of a commit under way: where its append starts, what it appends."""

    topic: str
    partition: int
    start: int
    regions: tuple[tuple[str, Region], ...]


@dataclass(frozen=True)
class Pending:
    batch: int
    partitions: tuple[PendingPartition, ...]


@dataclass(frozen=True)
class LedgerState:
    committed: int = -1  # the last batch id whose records are all appended
    pending: Pending | None = None


def _region_json(name: str, region: Region) -> list[object]:
    return [name, region.topic, region.partition, region.position, region.length, region.records]


def _region(entry: list) -> tuple[str, Region]:
    name, topic, partition, position, length, records = entry
    return str(name), Region(str(topic), int(partition), int(position), int(length), int(records), str(name))


class Ledger:
    """`ledger.json` of one stream, replaced atomically (write, fsync, rename)."""

    def __init__(self, stream_dir: Path) -> None:
        self.path = stream_dir / LEDGER_FILE

    def read(self) -> LedgerState:
        try:
            document = json.loads(self.path.read_text())
        except FileNotFoundError:
            return LedgerState()
        except (OSError, ValueError) as error:
            raise OSError(f"{self.path}: unreadable stream ledger ({error})") from None
        pending = document.get("pending")
        return LedgerState(
            committed=int(document["committed"]),
            pending=None
            if pending is None
            else Pending(
                int(pending["batch"]),
                tuple(
                    PendingPartition(
                        str(p["topic"]), int(p["partition"]), int(p["start"]), tuple(_region(r) for r in p["regions"])
                    )
                    for p in pending["partitions"]
                ),
            ),
        )

    def write(self, state: LedgerState) -> None:
        pending = state.pending
        document = {
            "committed": state.committed,
            "pending": None
            if pending is None
            else {
                "batch": pending.batch,
                "partitions": [
                    {
                        "topic": p.topic,
                        "partition": p.partition,
                        "start": p.start,
                        "regions": [_region_json(name, region) for name, region in p.regions],
                    }
                    for p in pending.partitions
                ],
            },
        }
        write_atomically(self.path, json.dumps(document, indent=1) + "\n")


# -- committing -----------------------------------------------------------------------------------------
def _staged_headers(stream_dir: Path, regions: Iterable[tuple[str, Region]]) -> Iterator[tuple[BatchHeader, bytes]]:
    """The staged batches of `regions`, in order, with their headers."""
    for name, region in regions:
        with open(stream_dir / name, "rb") as staged:
            staged.seek(region.position)
            data = staged.read(region.length)
        if len(data) != region.length:
            raise OSError(f"{stream_dir / name}: staged batches cut short ({len(data)} of {region.length} bytes)")
        for header in iter_batch_headers(data):
            yield header, data[header.position : header.next_position]


def _same_batch(ours: BatchHeader, theirs: BatchHeader) -> bool:
    return (
        ours.crc == theirs.crc
        and ours.records_count == theirs.records_count
        and ours.size_in_bytes == theirs.size_in_bytes
    )


def _appended_already(log: PartitionLog, start: int, ours: list[BatchHeader]) -> int:
    """How many of `ours` the log holds from offset `start` on, in order."""
    matched = 0
    if start >= log.log_end_offset or not ours:
        return 0
    for _segment, header, _batch in log.batches(start):
        if matched == len(ours) or not _same_batch(ours[matched], header):
            break
        matched += 1
    return matched


def _finish(data_dir: DataDir, stream_dir: Path, pending: Pending, now_ms: int) -> None:
    """Append whatever of `pending` the logs do not hold yet, then flush them. (A partition's
    staged batches are held in memory meanwhile: a micro-batch's worth.)"""
    for part in pending.partitions:
        log = data_dir.partition(part.topic, part.partition)
        staged = list(_staged_headers(stream_dir, part.regions))
        done = _appended_already(log, part.start, [header for header, _ in staged])
        chunk = bytearray()
        for _header, batch in staged[done:]:
            chunk += batch
            if len(chunk) >= APPEND_CHUNK_BYTES:
                log.append_batches(bytes(chunk), assign_offsets=True, now_ms=now_ms)
                chunk = bytearray()
        if chunk:
            log.append_batches(bytes(chunk), assign_offsets=True, now_ms=now_ms)
        log.flush()


def _make_durable(stream_dir: Path, names: Iterable[str]) -> None:
    for name in sorted(set(names)):
        fd = os.open(stream_dir / name, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    fsync_dir(stream_dir)


def _remove_staged(stream_dir: Path, keep: set[str]) -> None:
    """Remove the stream's staged files but `keep` (those of failed task attempts included)."""
    for path in stream_dir.glob("*.batches"):
        if path.name not in keep:
            with contextlib.suppress(OSError):
                path.unlink()


def commit_micro_batch(plan: WritePlan, staged: Iterable[Staged | None], batch_id: int) -> bool:
    """Commit one micro-batch exactly once (see the module docstring). Returns False for a
    replay of a batch already committed (nothing appended)."""
    stream_dir = Path(plan.job_dir)
    ledger = Ledger(stream_dir)
    by_partition = regions_by_partition(staged)
    data_dir = open_writable(plan)
    try:
        with data_dir:  # (a failure to close never hides the commit's error)
            now_ms = int(time.time() * 1000)
            state = ledger.read()
            if state.pending is not None:
                _finish(data_dir, stream_dir, state.pending, now_ms)
                state = LedgerState(committed=max(state.committed, state.pending.batch))
                ledger.write(state)
            if batch_id <= state.committed:
                return False
            create_topics(plan, data_dir, {topic for topic, _ in by_partition})
            _make_durable(stream_dir, (name for regions in by_partition.values() for name, _ in regions))
            pending = Pending(
                batch_id,
                tuple(
                    PendingPartition(
                        topic, partition, data_dir.partition(topic, partition).log_end_offset, tuple(regions)
                    )
                    for (topic, partition), regions in by_partition.items()
                ),
            )
            ledger.write(LedgerState(state.committed, pending))
            _finish(data_dir, stream_dir, pending, now_ms)
            ledger.write(LedgerState(committed=batch_id))
            return True
    finally:
        with contextlib.suppress(OSError):
            if ledger.read().pending is None:  # else its files are needed to finish it
                _remove_staged(stream_dir, keep=set())


def abort_micro_batch(plan: WritePlan, staged: Iterable[Staged | None]) -> None:
    """Remove what the tasks of a failed micro-batch staged (a pending commit's files stay)."""
    stream_dir = Path(plan.job_dir)
    keep: set[str] = set()
    with contextlib.suppress(OSError):
        pending = Ledger(stream_dir).read().pending
        if pending is not None:
            keep = {name for part in pending.partitions for name, _ in part.regions}
    for message in staged:
        for name in set() if message is None else message.files - keep:
            with contextlib.suppress(OSError):
                (stream_dir / name).unlink()
