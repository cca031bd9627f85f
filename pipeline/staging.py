"""A write job's staging: its dir, its owner, the sweep of killed jobs' leftovers, and what
its tasks staged (`Region`, `Staged`) read back in order.

Staging lives *beside* the log dir (`<parent>/.<logdir>.seglogfs-staging/`, or the option
`stagingDir`), not inside it: a Kafka broker refuses to load a log dir holding a directory whose
name is not `<topic>-<partition>`, and a crashed job's leftovers must not do that.

A job killed outright (kill -9 of the application, a lost driver host) never aborts: its staging
dir stays, and nothing of it is visible. Each job dir names its owner (`owner.json`: the Spark
application's JVM — host, boot, pid and the pid's start time), and every job's planning removes
the job dirs whose owner is gone (`sweep_dead_jobs`). While a job commits, its dir holds
`committing` (the committing process's pid): another job's planning that finds the data dir's lock
held by that process waits for it (`commitLockTimeoutMs`), where a lock held by anything else (a
mount, a broker) is refused.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from seglogfs.engine.record.records import (
    iter_batch_headers,
)

STAGING_SUFFIX = ".seglogfs-staging"


_APPEND_CHUNK_BYTES = 64 << 20  # staged batches handed to one append_batches call


OWNER_FILE = "owner.json"


COMMITTING_FILE = "committing"


_UNOWNED_GRACE_S = 600  # a job dir without its owner file yet (made a moment ago) is left this long


def _boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def _start_time(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (/proc/<pid>/stat field 22): with the
    pid, it names one process (a pid is reused, not with the same start time)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat[stat.rindex(")") + 2 :].split()[19]


def _parent(pid: int) -> int:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0
    return int(stat[stat.rindex(")") + 2 :].split()[1])


def _application_pid() -> int:
    """The Spark application's JVM: the nearest ancestor named `java` (the driver's Python workers
    are its children, or its daemon's); this process when there is none (called outside Spark)."""
    pid = os.getpid()
    while pid > 1:
        try:
            if Path(f"/proc/{pid}/comm").read_text().strip() == "java":
                return pid
        except OSError:
            break
        pid = _parent(pid)
    return os.getpid()


@dataclass(frozen=True)
class Owner:
    """The process a job belongs to, as `owner.json` records it."""

    host: str
    boot_id: str
    pid: int
    started: str

    @classmethod
    def current(cls) -> Owner:
        pid = _application_pid()
        return cls(socket.gethostname(), _boot_id(), pid, _start_time(pid) or "")

    def gone(self) -> bool:
        """Whether the owner has certainly ended: this host, and a reboot since or its pid no
        longer that process. (Jobs of other hosts are never judged.)"""
        if self.host != socket.gethostname():
            return False
        if self.boot_id != _boot_id():
            return True
        return _start_time(self.pid) != self.started


def write_owner(job_dir: Path) -> None:
    owner = Owner.current()
    temporary = job_dir / f".{OWNER_FILE}.tmp"
    temporary.write_text(json.dumps(owner.__dict__))
    temporary.rename(job_dir / OWNER_FILE)


def _read_owner(job_dir: Path) -> Owner | None:
    try:
        return Owner(**json.loads((job_dir / OWNER_FILE).read_text()))
    except (OSError, ValueError, TypeError):
        return None


def sweep_dead_jobs(staging_root: Path) -> list[Path]:
    """Remove the job dirs of `staging_root` whose owner is gone (killed jobs' leftovers);
    returns them."""
    removed: list[Path] = []
    try:
        jobs = [path for path in staging_root.iterdir() if path.name.startswith("job-")]
    except OSError:
        return removed
    for job_dir in jobs:
        owner = _read_owner(job_dir)
        if owner is None:
            try:
                dead = time.time() - job_dir.stat().st_mtime > _UNOWNED_GRACE_S
            except OSError:
                continue
        else:
            dead = owner.gone()
        if dead:
            shutil.rmtree(job_dir, ignore_errors=True)
            removed.append(job_dir)
    return removed


def committing_pids(staging_root: Path) -> set[int]:
    pids = set()
    for marker in staging_root.glob(f"job-*/{COMMITTING_FILE}"):
        with contextlib.suppress(OSError, ValueError):
            pids.add(int(marker.read_text()))
    return pids


@dataclass(frozen=True, slots=True)
class Region:
    """Bytes [position, position + length) of the staging file `file`: whole batches of one
    partition."""

    topic: str
    partition: int
    position: int
    length: int
    records: int
    file: str


@dataclass
class Staged:
    """What one task staged (its commit message's content): its regions, in the order written,
    in staging files named after the task."""

    task: str
    regions: list[Region] = field(default_factory=list)
    records: int = 0

    @property
    def files(self) -> set[str]:
        return {region.file for region in self.regions}


def staged_chunks(job_dir: Path, regions: Sequence[tuple[str, Region]]) -> Iterator[bytes]:
    """The staged bytes of `regions` (file, region), in order, in chunks of whole batches (of
    about `_APPEND_CHUNK_BYTES`; a region larger than that alone)."""
    parts: list[bytes] = []
    size = 0
    for name, region in regions:
        with open(job_dir / name, "rb") as staged:
            data = os.pread(staged.fileno(), region.length, region.position)
        if len(data) != region.length:
            raise OSError(f"{job_dir / name}: staged batches cut short ({len(data)} of {region.length} bytes)")
        if parts and size + len(data) > _APPEND_CHUNK_BYTES:
            yield parts[0] if len(parts) == 1 else b"".join(parts)
            parts, size = [], 0
        parts.append(data)
        size += len(data)
    if parts:
        yield parts[0] if len(parts) == 1 else b"".join(parts)


def regions_by_partition(staged: Iterable[Staged | None]) -> dict[tuple[str, int], list[tuple[str, Region]]]:
    """The tasks' staged regions per partition, (file, region) in task order."""
    by_partition: dict[tuple[str, int], list[tuple[str, Region]]] = {}
    for message in staged:
        if message is None:
            raise RuntimeError("a task of the write job sent no commit message")
        for region in message.regions:
            if region.length:
                by_partition.setdefault((region.topic, region.partition), []).append((region.file, region))
    return by_partition


def staged_batches_in_pieces(job_dir: Path, regions: Sequence[tuple[str, Region]], limit: int) -> Iterator[bytes]:
    """The staged batches of `regions`, in order, in pieces of whole batches of at most `limit`
    bytes (a batch over it, which max.message.bytes forbids anyway, alone)."""
    piece = bytearray()
    for data in staged_chunks(job_dir, regions):
        for header in iter_batch_headers(data):
            if piece and len(piece) + header.size_in_bytes > limit:
                yield bytes(piece)
                piece = bytearray()
            piece += data[header.position : header.next_position]
    if piece:
        yield bytes(piece)
