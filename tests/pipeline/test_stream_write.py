"""`writeStream.format("seglog")`: each micro-batch is appended exactly once.

With real Spark: a query copying one topic to another through the seglog source and sink, run
again after appends, then made to replay its last micro-batch (its commit record removed from
the checkpoint, as a crash between the sink's commit and Spark's record leaves it): the copy holds
every record once. Without Spark, the commit itself: a commit that fails (an injected ENOSPC) or
is killed (SIGKILL) between or inside its partitions' appends is finished by the next commit of
the stream — the replay of the same batch — and every record is there once.
"""

from __future__ import annotations

import errno
import json
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pytest

from seglogfs.engine import BrokerConfig, DataDir, PartitionLog
from seglogfs.pipeline import stream_writing
from seglogfs.pipeline.options import OptionError
from seglogfs.pipeline.stream_writing import (
    Ledger,
    commit_micro_batch,
    plan_stream_write,
    stream_identity,
)
from seglogfs.pipeline.task_writer import write_task
from seglogfs.pipeline.writing import Columns, parse_write_options
from tests.conftest import assert_log_dir_valid
from tests.pipeline.test_streaming import append, finish, new_data_dir, stream
from tests.pipeline.test_write import REPOSITORY, log_ends

TOPIC = "copy"


def values(path: Path, topic: str = TOPIC) -> Counter:
    config = BrokerConfig.load(log_dirs=[path])
    with DataDir.open(config, read_only=True, now_ms=int(time.time() * 1000)) as data_dir:
        found: Counter = Counter()
        for partition in data_dir.topics().get(topic, []):
            log = data_dir.partition(topic, partition)
            found.update(record.value for record in log.records(log.log_start_offset))
        return found


def copy_available_now(spark, source: Path, target: Path, checkpoint: Path) -> None:
    finish(
        stream(spark, source, subscribe="events", startingOffsets="earliest", maxOffsetsPerTrigger="25")
        .selectExpr("key", "value")
        .writeStream.format("seglog")
        .option("path", str(target))
        .option("topic", TOPIC)
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )


def expected_values(counts: dict[int, int]) -> Counter:
    return Counter(f"events-{p}-{i}".encode() for p, count in counts.items() for i in range(count))


def test_a_streaming_copy_appends_each_micro_batch_once_even_when_replayed(spark, tmp_path: Path) -> None:
    source = new_data_dir(tmp_path / "source", {"events": 2})
    target = new_data_dir(tmp_path / "target", {TOPIC: 3})
    checkpoint = tmp_path / "checkpoint"
    for partition in (0, 1):
        append(source, "events", partition, 30)
    copy_available_now(spark, source, target, checkpoint)
    assert values(target) == expected_values({0: 30, 1: 30})
    for partition in (0, 1):
        append(source, "events", partition, 10)
    copy_available_now(spark, source, target, checkpoint)
    assert values(target) == expected_values({0: 40, 1: 40})
    ends = log_ends(target)
    # A crash after the sink's commit, before Spark's own record of it: Spark runs the batch again.
    last = max((p for p in (checkpoint / "commits").iterdir() if p.name.isdigit()), key=lambda p: int(p.name))
    last.unlink()
    (last.parent / f".{last.name}.crc").unlink(missing_ok=True)
    copy_available_now(spark, source, target, checkpoint)
    assert (checkpoint / "commits" / last.name).exists()  # the batch ran again and was committed
    assert log_ends(target) == ends
    assert values(target) == expected_values({0: 40, 1: 40})
    assert not list(target.parent.glob(".target.seglogfs-staging/streams/*/*.batches"))
    assert_log_dir_valid(target)


def test_a_streaming_write_needs_its_query_known(tmp_path: Path) -> None:
    with pytest.raises(OptionError, match="checkpointLocation"):
        stream_identity({"path": str(tmp_path)})
    assert stream_identity({"checkpointLocation": "/x/cp"}) == "checkpoint:/x/cp"
    assert stream_identity({"queryName": "q"}) == "query:q"
    (tmp_path / "mnt" / ".logdir").mkdir(parents=True)  # what marks a seglogfs mount point
    raw = {"path": str(tmp_path / "mnt"), "topic": TOPIC, "checkpointLocation": str(tmp_path / "cp")}
    with pytest.raises(OptionError, match="is a seglogfs mount: streaming writes go to a data dir"):
        plan_stream_write(parse_write_options(raw), Columns(), stream_identity(raw), 0)


# -- the commit, without Spark --------------------------------------------------------------------------
def staged_batch(plan, rows: list[tuple[bytes, bytes]], tasks: int = 2) -> list:
    """One micro-batch's rows staged by `tasks` tasks (as the executors would)."""
    messages = []
    for task in range(tasks):
        part = rows[task::tasks]
        batch = pa.record_batch(
            [pa.array([k for k, _ in part], pa.binary()), pa.array([v for _, v in part], pa.binary())],
            names=["key", "value"],
        )
        messages.append(write_task(plan, [batch]))
    return messages


def rows(batch: int, count: int) -> list[tuple[bytes, bytes]]:
    return [(b"key-%d" % (i % 7), b"batch-%d-row-%d" % (batch, i)) for i in range(count)]


def plan_for(target: Path, checkpoint: str):
    raw = {"path": str(target), "topic": TOPIC, "kafka.batch.size": "300", "checkpointLocation": checkpoint}
    return plan_stream_write(parse_write_options(raw), Columns(key=True), stream_identity(raw), int(time.time() * 1000))


@pytest.mark.parametrize("failing_call", [1, 3, 6, 9])
def test_a_commit_that_failed_midway_is_finished_by_the_replay(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, failing_call: int
) -> None:
    """The nth append of the commit fails (ENOSPC): before it, nothing, the first chunks of a
    partition, or whole partitions are appended (the three partitions take 5, 2 and 9 appends).
    The replay of the batch appends what is missing, and only that."""
    target = new_data_dir(tmp_path / "target", {TOPIC: 3})
    plan = plan_for(target, str(tmp_path / "cp"))
    assert commit_micro_batch(plan, staged_batch(plan, rows(0, 50)), 0)
    monkeypatch.setattr(stream_writing, "APPEND_CHUNK_BYTES", 400)  # several appends per partition
    real_append = PartitionLog.append_batches
    calls = []

    def failing(self, data, **kwargs):
        calls.append(len(data))
        if len(calls) == failing_call:
            raise OSError(errno.ENOSPC, "No space left on device (injected)")
        return real_append(self, data, **kwargs)

    monkeypatch.setattr(PartitionLog, "append_batches", failing)
    with pytest.raises(OSError, match="injected"):
        commit_micro_batch(plan, staged_batch(plan, rows(1, 200)), 1)
    pending = Ledger(Path(plan.job_dir)).read().pending
    assert pending is not None and pending.batch == 1
    assert sum(values(target).values()) < 250  # some of batch 1 is missing
    monkeypatch.setattr(PartitionLog, "append_batches", real_append)
    replay = staged_batch(plan, rows(1, 200), tasks=3)  # a replay need not stage alike
    assert commit_micro_batch(plan, replay, 1) is False
    assert values(target) == Counter(v for _, v in rows(0, 50) + rows(1, 200))
    assert commit_micro_batch(plan, staged_batch(plan, rows(2, 10)), 2)
    assert values(target) == Counter(v for _, v in rows(0, 50) + rows(1, 200) + rows(2, 10))
    assert Ledger(Path(plan.job_dir)).read().committed == 2
    assert not list(Path(plan.job_dir).glob("*.batches"))
    assert_log_dir_valid(target)


KILLED_COMMIT = """
import os, signal, sys, time
from pathlib import Path
from seglogfs.engine import PartitionLog
from seglogfs.pipeline import stream_writing
from tests.pipeline import test_stream_write as t

target, checkpoint, kill_at = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
plan = t.plan_for(target, checkpoint)
stream_writing.APPEND_CHUNK_BYTES = 400
real_append = PartitionLog.append_batches
calls = []

def killing(self, data, **kwargs):
    calls.append(1)
    if len(calls) == kill_at:
        os.kill(os.getpid(), signal.SIGKILL)
    return real_append(self, data, **kwargs)

PartitionLog.append_batches = killing
stream_writing.commit_micro_batch(plan, t.staged_batch(plan, t.rows(1, 200)), 1)
"""


@pytest.mark.parametrize("kill_at", [3, 9])
def test_a_commit_killed_midway_is_finished_by_the_replay(tmp_path: Path, kill_at: int) -> None:
    target = new_data_dir(tmp_path / "target", {TOPIC: 3})
    checkpoint = str(tmp_path / "cp")
    plan = plan_for(target, checkpoint)
    assert commit_micro_batch(plan, staged_batch(plan, rows(0, 50)), 0)
    killed = subprocess.run(
        [sys.executable, "-c", KILLED_COMMIT, str(target), checkpoint, str(kill_at)], cwd=REPOSITORY, check=False
    )
    assert killed.returncode == -signal.SIGKILL
    assert Ledger(Path(plan.job_dir)).read().pending is not None
    before = sum(values(target).values())
    assert 50 < before < 250
    assert commit_micro_batch(plan, staged_batch(plan, rows(1, 200)), 1) is False
    assert values(target) == Counter(v for _, v in rows(0, 50) + rows(1, 200))
    assert json.loads((Path(plan.job_dir) / "ledger.json").read_text()) == {"committed": 1, "pending": None}
    assert not list(Path(plan.job_dir).glob("*.batches"))
    assert_log_dir_valid(target)
