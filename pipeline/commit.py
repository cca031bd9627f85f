"""A write job's commit (on the driver, after every task succeeded).

The data dir is opened writable (taking its lock), and each partition's staged files, in task
order, are appended with offsets from the log end and Kafka's checks (CRC, size, keys on
compacted topics), partitions in parallel (a thread each, up to the CPUs). A staging file of at
least an eighth of `segment.bytes` (or 64 MiB) becomes a segment as it is: checked, its offsets
written in place, renamed into the partition's directory (`PartitionLog.adopt_batches`) — the
bulk of a large job is never copied. Smaller ones, and all of them when the staging dir is on
another filesystem, are copied (`PartitionLog.append_batches`). A partition is all or nothing: a
failure cuts it back to where it was (`truncate_to`). The data dir is closed (flushed,
checkpointed) and the staging removed. `abort_staged` removes the staging of a failed job:
nothing of it is visible.

Through a mount (`path` a seglogfs mount point), the commit writes each partition's staged
batches to the mount's `<topic>/<p>/append.batches`, which appends what one open wrote at its
close, whole or not at all: a partition's part of a job up to 64 MiB is all or nothing, a larger
one is appended in such pieces. The mount holds the data dir's lock and serialises the appends
with everything else written through it.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import time
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from seglogfs.engine import (
    DataDir,
    LogDirLockedError,
    PartitionLog,
    UnknownTopicOrPartitionError,
)
from seglogfs.engine.producer import BATCHES_PER_APPEND_BYTES
from seglogfs.pipeline.staging import (
    COMMITTING_FILE,
    Region,
    Staged,
    regions_by_partition,
    staged_batches_in_pieces,
    staged_chunks,
)
from seglogfs.pipeline.writing import WritePlan

_ADOPT_MIN_BYTES = 64 << 20  # a staging file this large (or an eighth of segment.bytes) becomes a segment


def open_writable(plan: WritePlan) -> DataDir:
    """The data dir opened for writing; its lock is retried for `commitLockTimeoutMs` (another
    job's commit holds it for a moment)."""
    broker = plan.options.engine.broker_config(plan.options.location.log_dirs)
    deadline = time.monotonic() + plan.options.commit_lock_timeout_ms / 1000
    while True:
        try:
            return DataDir.open(broker, now_ms=int(time.time() * 1000))
        except LogDirLockedError:
            if time.monotonic() >= deadline:
                raise
            time.sleep(0.2)


def _adoptable(job_dir: Path, region: Region, segment_bytes: int) -> bool:
    """Whether a staged region is best made a segment as it is: a whole staging file, at most
    `segment.bytes`, and large enough not to leave a small segment behind (an eighth of
    `segment.bytes`, or 64 MiB)."""
    if region.position or region.length < min(segment_bytes // 8, _ADOPT_MIN_BYTES) or region.length > segment_bytes:
        return False
    try:
        return os.stat(job_dir / region.file).st_size == region.length
    except OSError:
        return False


def _copy_staged(log: PartitionLog, job_dir: Path, regions: Sequence[tuple[str, Region]]) -> None:
    for chunk in staged_chunks(job_dir, regions):
        log.append_batches(chunk, assign_offsets=True, now_ms=int(time.time() * 1000))


def _append_partition(data_dir: DataDir, job_dir: Path, topic: str, partition: int, regions: list) -> int:
    """One partition's staged batches appended, all or nothing (cut back on any failure). A
    large staging file becomes a segment by a rename (`PartitionLog.adopt_batches`); the rest is
    copied (`append_batches`), as is everything when the staging dir is on another filesystem."""
    log = data_dir.partition(topic, partition)
    log_end = log.log_end_offset
    rename = True
    try:
        copied: list[tuple[str, Region]] = []  # regions to copy, in order, before the next adoption
        for name, region in regions:
            if not (rename and _adoptable(job_dir, region, log.config.segment_bytes)):
                copied.append((name, region))
                continue
            _copy_staged(log, job_dir, copied)
            copied = []
            try:
                log.adopt_batches(job_dir / name, now_ms=int(time.time() * 1000))
            except OSError as error:
                if error.errno != errno.EXDEV:
                    raise
                rename = False
                copied.append((name, region))
        _copy_staged(log, job_dir, copied)
    except BaseException:
        if log.log_end_offset > log_end:
            log.truncate_to(log_end, int(time.time() * 1000))
        raise
    return sum(region.records for _, region in regions)


def commit_staged(plan: WritePlan, staged: Iterable[Staged | None]) -> dict[tuple[str, int], int]:
    """Append every partition's staged batches (see the module docstring), partitions in
    parallel (a thread each, up to the CPUs: reads, CRCs and writes release the GIL); returns
    the records appended per partition. Raises the first failure once every partition is done:
    a partition that failed is cut back, the others stay appended."""
    job_dir = Path(plan.job_dir)
    by_partition = regions_by_partition(staged)
    if plan.options.location.mount_point is not None:
        try:
            return _commit_through_mount(plan.options.location.mount_point, job_dir, by_partition)
        finally:
            abort_staged(plan)
    appended: dict[tuple[str, int], int] = {}
    try:
        (job_dir / COMMITTING_FILE).write_text(str(os.getpid()))
        with open_writable(plan) as data_dir:  # (a failure to close never hides the commit's error)
            create_topics(plan, data_dir, {topic for topic, _ in by_partition})
            workers = max(1, min(len(by_partition), os.cpu_count() or 1))
            with ThreadPoolExecutor(workers, thread_name_prefix="seglog-commit") as pool:
                futures = {
                    key: pool.submit(_append_partition, data_dir, job_dir, key[0], key[1], regions)
                    for key, regions in by_partition.items()
                }
            failures = [future.exception() for future in futures.values() if future.exception() is not None]
            if failures:
                raise failures[0]  # type: ignore[misc]
            appended = {key: future.result() for key, future in futures.items()}
    finally:
        abort_staged(plan)
    return appended


def _commit_through_mount(
    mount: Path, job_dir: Path, by_partition: Mapping[tuple[str, int], Sequence[tuple[str, Region]]]
) -> dict[tuple[str, int], int]:
    """Each partition's staged batches written to `<mount>/<topic>/<p>/append.batches`, each
    piece of up to 64 MiB in one open appended whole or not at all (a partition under 64 MiB:
    all or nothing); fsync makes them durable and reports the append's error."""
    appended: dict[tuple[str, int], int] = {}
    for (topic, partition), regions in by_partition.items():
        target = mount / topic / str(partition) / "append.batches"
        for piece in staged_batches_in_pieces(job_dir, regions, BATCHES_PER_APPEND_BYTES):
            fd = os.open(target, os.O_WRONLY | os.O_CLOEXEC)
            try:
                view = memoryview(piece)
                while view:
                    view = view[os.write(fd, view) :]
                os.fsync(fd)
            except OSError as error:
                raise OSError(error.errno, f"appending to {target}: {error.strerror}") from None
            finally:
                with contextlib.suppress(OSError):  # (fsync reported the append's error)
                    os.close(fd)
        appended[(topic, partition)] = sum(region.records for _, region in regions)
    return appended


def create_topics(plan: WritePlan, data_dir: DataDir, topics: set[str]) -> None:
    """Create the topics the job wrote that the data dir does not have (auto.create.topics.enable),
    with the partition count the tasks used; a topic made meanwhile must have that count."""
    existing = data_dir.topics()
    for topic in sorted(topics):
        target = plan.target(topic)
        if topic not in existing:
            data_dir.create_topic(topic, target.partitions, now_ms=int(time.time() * 1000))
        elif len(existing[topic]) != target.partitions and not target.exists:
            raise UnknownTopicOrPartitionError(
                f"topic {topic!r} was created with {len(existing[topic])} partitions while the job wrote for "
                f"{target.partitions}; nothing of the job was appended to it"
            )


def abort_staged(plan: WritePlan) -> None:
    """Remove the job's staging dir (and the staging root once empty)."""
    job_dir = Path(plan.job_dir)
    shutil.rmtree(job_dir, ignore_errors=True)
    with contextlib.suppress(OSError):
        os.rmdir(job_dir.parent)
