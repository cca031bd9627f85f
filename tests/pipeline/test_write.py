"""`df.write.format("seglog")`: staged by the tasks, appended at commit, nothing before.

Written rows read back as they went in (null keys, binary values, headers with null values,
explicit partitions), keyed rows land where Kafka's partitioner puts them, the data dir stays
valid (`seglogfs check`) and its batches parse with kafka-python; a failed job leaves no record
and no staging file; what cannot be written is refused before any work. Two jobs writing one topic
at once lose nothing; a job killed outright (kill -9 of its whole application) leaves nothing
visible, and the next job removes its staging.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import pytest
from kafka.record.default_records import DefaultRecordBatch

from seglogfs.engine import BrokerConfig, DataDir
from seglogfs.engine.partitioner import partition_for_key
from seglogfs.engine.record.builder import build_batch
from seglogfs.pipeline.staging import STAGING_SUFFIX, Region, _boot_id, _start_time, staged_batches_in_pieces
from tests.conftest import assert_log_dir_valid, copy_fixture
from tests.fs.conftest import Mount, check_mount_log
from tests.pipeline.conftest import read_table

HEADERS = "array<struct<key:string,value:binary>>"


def new_data_dir(path: Path, topics: dict[str, int]) -> Path:
    config = BrokerConfig.load(overrides=["log.segment.bytes=20000"], log_dirs=[path])
    with DataDir.open(config, now_ms=int(time.time() * 1000)) as data_dir:
        for topic, partitions in topics.items():
            data_dir.create_topic(topic, partitions, now_ms=int(time.time() * 1000))
    return path


def log_ends(path: Path) -> dict[tuple[str, int], int]:
    config = BrokerConfig.load(log_dirs=[path])
    with DataDir.open(config, read_only=True, now_ms=int(time.time() * 1000)) as data_dir:
        return {(log.topic, log.partition): log.log_end_offset for log in data_dir.partitions()}


def staging_left(path: Path) -> list[Path]:
    return [p for p in path.parent.iterdir() if p.name.endswith(STAGING_SUFFIX)] + list(path.glob("**/*.batches"))


def parse_every_batch(path: Path) -> int:
    """Records in the data dir as kafka-python's DefaultRecordBatch decodes them (CRCs checked)."""
    records = 0
    for log in path.glob("*/*.log"):
        data = log.read_bytes()
        position = 0
        while position < len(data):
            size = int.from_bytes(data[position + 8 : position + 12], "big") + 12
            batch = DefaultRecordBatch(data[position : position + size])
            assert batch.validate_crc()
            records += sum(1 for _ in batch)
            position += size
    return records


def rows_for(count: int) -> list[tuple]:
    rows = []
    for i in range(count):
        key = None if i % 4 == 0 else f"key-{i % 37}".encode()
        value = None if i % 97 == 5 else bytes([i % 256, 0, 255, (i * 7) % 256]) * (i % 9)
        headers = None if i % 5 == 0 else [] if i % 5 == 1 else [("trace", b"\x00\x01%d" % i), ("empty", None)]
        topic = "orders" if i % 3 else "audit"
        partition = 1 if i % 11 == 0 else None
        rows.append((key, value, headers, topic, partition))
    return rows


def test_written_rows_read_back_as_they_went_in(spark, tmp_path: Path) -> None:
    path = new_data_dir(tmp_path / "data", {"orders": 3})
    rows = rows_for(3000)
    frame = spark.createDataFrame(
        rows, f"key binary, value binary, headers {HEADERS}, topic string, partition int"
    ).repartition(4)
    before = int(time.time() * 1000)
    frame.write.format("seglog").option("path", str(path)).option("override.num.partitions", "2").mode("append").save()
    after = int(time.time() * 1000)
    table = read_table(spark, path, subscribe="orders,audit", includeHeaders="true")
    got = table.to_pylist()
    assert Counter(
        (r["key"], r["value"], tuple((h["key"], h["value"]) for h in r["headers"] or ()), r["topic"]) for r in got
    ) == Counter((k, v, tuple(h or ()), t) for k, v, h, t, _ in rows)
    partitions = {"orders": 3, "audit": 2}  # audit was created by the job with num.partitions
    for row in got:
        key, topic = row["key"], row["topic"]
        if key is not None and row["partition"] != 1:
            assert row["partition"] == partition_for_key(key, partitions[topic])
        assert 0 <= row["partition"] < partitions[topic]
        assert before <= int(row["timestamp"].timestamp() * 1000) <= after
        assert row["timestampType"] == 0
    explicit = Counter((k, v, t) for k, v, _, t, p in rows if p == 1)
    on_one = Counter((r["key"], r["value"], r["topic"]) for r in got if r["partition"] == 1)
    assert not explicit - on_one  # every row sent to partition 1 is there
    offsets = Counter((r["topic"], r["partition"]) for r in got)
    assert log_ends(path) == dict(offsets)  # offsets 0..n-1 in each partition, nothing else
    assert parse_every_batch(path) == len(rows)
    assert_log_dir_valid(path)
    assert not staging_left(path)


def test_string_columns_and_the_topic_option(spark, tmp_path: Path) -> None:
    path = tmp_path / "fresh"  # a data dir that does not exist yet: the commit makes it
    frame = spark.createDataFrame([("k", "välue"), (None, "x"), ("k", "")], "key string, value string")
    frame.write.format("seglog").option("path", str(path)).option("topic", "text").mode("append").save()
    table = read_table(spark, path, subscribe="text")
    assert Counter((r["key"], r["value"]) for r in table.to_pylist()) == Counter(
        [(b"k", "välue".encode()), (None, b"x"), (b"k", b"")]
    )
    second = spark.createDataFrame([("again",)], "value string")
    second.write.format("seglog").option("path", str(path)).option("topic", "text").mode("append").save()
    assert read_table(spark, path, subscribe="text").num_rows == 4
    assert_log_dir_valid(path)


def test_a_failed_job_leaves_nothing(spark, tmp_path: Path) -> None:
    path = new_data_dir(tmp_path / "data", {"orders": 2})
    first = spark.createDataFrame([(b"kept",)], "value binary")
    first.write.format("seglog").option("path", str(path)).option("topic", "orders").mode("append").save()
    ends = log_ends(path)
    # Many small rows in some tasks, one too large for max.message.bytes in another.
    rows = [(b"k%d" % i, b"x" * (5000 if i == 2999 else 10)) for i in range(3000)]
    frame = spark.createDataFrame(rows, "key binary, value binary").repartition(3)
    with pytest.raises(Exception, match=r"over max\.message\.bytes=2000"):
        (
            frame.write.format("seglog")
            .option("path", str(path))
            .option("topic", "orders")
            .option("override.message.max.bytes", "2000")
            .mode("append")
            .save()
        )
    assert log_ends(path) == ends
    assert read_table(spark, path, subscribe="orders").column("value").to_pylist() == [b"kept"]
    assert not staging_left(path)
    with pytest.raises(Exception, match="Null topic present in the data"):
        spark.createDataFrame([(b"v", None)], "value binary, topic string").write.format("seglog").option(
            "path", str(path)
        ).mode("append").save()
    assert log_ends(path) == ends
    assert not staging_left(path)


def test_what_cannot_be_written_is_refused_before_any_work(spark, tmp_path: Path) -> None:
    path = new_data_dir(tmp_path / "data", {"orders": 1})
    frame = spark.createDataFrame([(b"v",)], "value binary")

    def write(data_frame, target: Path, mode: str = "append", **options: str) -> None:
        writer = data_frame.write.format("seglog").option("path", str(target)).mode(mode)
        for key, value in options.items():
            writer = writer.option(key, value)
        writer.save()

    with pytest.raises(Exception, match="only appends"):
        write(frame, path, "overwrite", topic="orders")
    with pytest.raises(Exception, match="topic option required"):
        write(frame, path)
    with pytest.raises(Exception, match="Required attribute 'value' not found"):
        write(spark.createDataFrame([(b"v",)], "payload binary"), path, topic="orders")
    with pytest.raises(Exception, match="value attribute type must be a string or binary"):
        write(spark.createDataFrame([(1,)], "value int"), path, topic="orders")
    with pytest.raises(Exception, match="partition attribute type must be an int"):
        write(spark.createDataFrame([(b"v", "0")], "value binary, partition string"), path, topic="orders")
    with pytest.raises(Exception, match="there is no partition 3"):
        write(spark.createDataFrame([(b"v", 3)], "value binary, partition int"), path, topic="orders")
    mount = tmp_path / "mnt"
    (mount / ".logdir").mkdir(parents=True)
    with pytest.raises(Exception, match=r"unknown topic 'orders' on the mount .*: create it first \(mkdir"):
        write(frame, mount, topic="orders")
    config = BrokerConfig.load(log_dirs=[path])
    with DataDir.open(config, now_ms=int(time.time() * 1000)), pytest.raises(Exception, match="data dir is in use by"):
        write(frame, path, topic="orders")
    assert log_ends(path) == {("orders", 0): 0}
    assert not staging_left(path)


# -- jobs side by side, jobs killed ---------------------------------------------------------------------
REPOSITORY = Path(__file__).resolve().parents[2]


def test_two_concurrent_jobs_lose_nothing(spark, tmp_path: Path) -> None:
    """Two jobs of one application writing one topic at once: both commit (the second waits for
    the first's lock), every row of both is there once, the offsets dense."""
    path = new_data_dir(tmp_path / "data", {"orders": 3})
    errors: list[BaseException] = []

    def job(name: str) -> None:
        try:  # the data source is the session's: the JVM thread must know its session
            spark._jvm.SparkSession.setActiveSession(spark._jsparkSession)
            frame = spark.range(0, 20_000, numPartitions=3).selectExpr(
                f"concat('{name}-', cast(id % 50 as string)) as key", f"concat('{name}-', cast(id as string)) as value"
            )
            frame.write.format("seglog").option("path", str(path)).option("topic", "orders").mode("append").save()
        except BaseException as error:  # reported below
            errors.append(error)

    threads = [threading.Thread(target=job, args=(name,)) for name in ("a", "b")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, [str(error)[:3000] for error in errors]
    table = read_table(spark, path, subscribe="orders")
    values = Counter(table.column("value").to_pylist())
    assert values == Counter(f"{name}-{i}".encode() for name in ("a", "b") for i in range(20_000))
    for partition, end in log_ends(path).items():
        offsets = sorted(r["offset"] for r in table.to_pylist() if r["partition"] == partition[1])
        assert offsets == list(range(end))
    assert not staging_left(path)
    assert_log_dir_valid(path)


def _wait_for(condition, what: str, job: subprocess.Popen | None = None, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if job is not None and job.poll() is not None:
            raise AssertionError(f"the job ended ({job.returncode}) before {what}")
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def _group_gone(group: int) -> bool:
    try:
        os.killpg(group, 0)
    except ProcessLookupError:
        return True
    return False


def test_a_job_killed_mid_write_leaves_nothing_visible_and_the_next_job_removes_its_staging(
    spark, tmp_path: Path
) -> None:
    path = new_data_dir(tmp_path / "data", {"orders": 2})
    spark.createDataFrame([(b"kept",)], "value binary").write.format("seglog").option("path", str(path)).option(
        "topic", "orders"
    ).mode("append").save()
    ends = log_ends(path)
    staging_root = path.parent / f".{path.name}{STAGING_SUFFIX}"
    output = tmp_path / "job.out"
    with open(output, "wb") as sink:
        job = subprocess.Popen(
            [sys.executable, "-m", "tests.pipeline.slow_write_job", str(path), "orders", "400000"],
            cwd=REPOSITORY,
            stdout=sink,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        _wait_for(
            lambda: any(f.stat().st_size for f in staging_root.glob("job-*/*.batches")),
            f"staged bytes (job output: {output})",
            job,
        )
    finally:
        os.killpg(job.pid, signal.SIGKILL)
        job.wait()
        _wait_for(lambda: _group_gone(job.pid), "the killed job's JVM and Python workers to end")
    leftovers = list(staging_root.glob("job-*"))
    assert len(leftovers) == 1 and (leftovers[0] / "owner.json").exists()
    assert log_ends(path) == ends
    assert read_table(spark, path, subscribe="orders").column("value").to_pylist() == [b"kept"]
    assert_log_dir_valid(path)
    spark.createDataFrame([(b"next",)], "value binary").write.format("seglog").option("path", str(path)).option(
        "topic", "orders"
    ).mode("append").save()
    assert not staging_left(path)
    assert sorted(read_table(spark, path, subscribe="orders").column("value").to_pylist()) == [b"kept", b"next"]


def test_planning_waits_for_another_jobs_commit_and_refuses_any_other_holder(spark, tmp_path: Path) -> None:
    """A lock held by a committing job (its `committing` marker names the holder) is waited for; a
    lock held by anything else is refused at once."""
    path = new_data_dir(tmp_path / "data", {"orders": 1})
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time\n"
            "from seglogfs.engine import BrokerConfig, DataDir\n"
            f"with DataDir.open(BrokerConfig.load(log_dirs=[{str(path)!r}]), now_ms=int(time.time() * 1000)):\n"
            "    print('held', flush=True); time.sleep(float(sys.argv[1]))",
            "4",
        ],
        cwd=REPOSITORY,
        stdout=subprocess.PIPE,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == b"held\n"
        frame = spark.createDataFrame([(b"v",)], "value binary")
        with pytest.raises(Exception, match=rf"data dir is in use by process {holder.pid}"):
            frame.write.format("seglog").option("path", str(path)).option("topic", "orders").mode("append").save()
        committing = path.parent / f".{path.name}{STAGING_SUFFIX}" / "job-other"
        committing.mkdir(parents=True)
        (committing / "owner.json").write_text(
            json.dumps(
                {
                    "host": socket.gethostname(),
                    "boot_id": _boot_id(),
                    "pid": holder.pid,
                    "started": _start_time(holder.pid),
                }
            )
        )
        (committing / "committing").write_text(str(holder.pid))
        frame.write.format("seglog").option("path", str(path)).option("topic", "orders").option(
            "commitLockTimeoutMs", "60000"
        ).mode("append").save()
        assert holder.wait(timeout=60) == 0
    finally:
        holder.kill()
        holder.wait()
    assert log_ends(path) == {("orders", 0): 1}
    assert committing.exists()  # its owner ended after this job planned: the next job sweeps it
    frame.write.format("seglog").option("path", str(path)).option("topic", "orders").mode("append").save()
    assert not staging_left(path)


# -- through a mount ----------------------------------------------------------------------------------
def test_a_write_through_a_mount_equals_a_write_to_a_data_dir(spark, tmp_path: Path) -> None:
    rows = [  # null keys with a partition of their own: round-robin starts at random
        (key, value, headers, i % 3 if key is None and partition is None else partition)
        for i, (key, value, headers, _topic, partition) in enumerate(rows_for(2000))
    ]
    frame = spark.createDataFrame(rows, f"key binary, value binary, headers {HEADERS}, partition int").repartition(3)
    direct = new_data_dir(tmp_path / "direct", {"orders": 3})
    frame.write.format("seglog").option("path", str(direct)).option("topic", "orders").mode("append").save()
    mounted = new_data_dir(tmp_path / "mounted", {"orders": 3})
    (tmp_path / "mnt").mkdir()
    m = Mount(mounted, tmp_path / "mnt", [])
    try:
        frame.write.format("seglog").option("path", str(m.path)).option("topic", "orders").mode("append").save()
        through = read_table(spark, m.path, subscribe="orders", includeHeaders="true")
        with pytest.raises(Exception, match=r"unknown topic 'other' on the mount"):
            frame.write.format("seglog").option("path", str(m.path)).option("topic", "other").mode("append").save()
    finally:
        m.stop()
    check_mount_log(m, [])
    expected = read_table(spark, direct, subscribe="orders", includeHeaders="true")

    def content(table) -> Counter:
        return Counter(
            (r["partition"], r["key"], r["value"], tuple(tuple(h.items()) for h in r["headers"] or ()))
            for r in table.to_pylist()
        )

    assert content(through) == content(expected)
    assert log_ends(mounted) == log_ends(direct)
    assert not staging_left(mounted) and not list(tmp_path.glob(".mnt*"))
    assert_log_dir_valid(mounted)


def test_staged_batches_go_through_a_mount_in_pieces_of_whole_batches(tmp_path: Path) -> None:
    job = tmp_path / "job"
    job.mkdir()
    batches = [build_batch([b"v" * size], timestamps=0) for size in (10, 300, 20, 500, 30, 40)]
    (job / "task.batches").write_bytes(b"".join(batches))
    regions = [("task.batches", Region("t", 0, 0, sum(map(len, batches[:3])), 3, "task.batches"))]
    second = Region("t", 0, regions[0][1].length, sum(map(len, batches[3:])), 3, "task.batches")
    regions.append(("task.batches", second))
    pieces = list(staged_batches_in_pieces(job, regions, 450))
    assert b"".join(pieces) == b"".join(batches)
    assert [len(p) for p in pieces] == [
        len(batches[0]) + len(batches[1]),
        len(batches[2]),
        len(batches[3]),
        len(batches[4]) + len(batches[5]),
    ]


def test_a_write_through_a_mounted_broker_data_dir(spark, tmp_path: Path) -> None:
    """A KRaft broker's data dir mounted writable (`__consumer_offsets` holds only its partition
    26 there): the job writes to its topic through the mount, the rest untouched."""
    data = copy_fixture("ne-streaming-d95be01", tmp_path)
    (tmp_path / "mnt").mkdir()
    m = Mount(data, tmp_path / "mnt", [])
    try:
        before = read_table(spark, m.path, subscribe="your-kafka-topic").num_rows
        frame = spark.range(0, 3000).selectExpr("cast(id % 7 as string) as key", "concat('written-', id) as value")
        frame.write.format("seglog").option("path", str(m.path)).option("topic", "your-kafka-topic").mode(
            "append"
        ).save()
        after = read_table(spark, m.path, subscribe="your-kafka-topic")
    finally:
        m.stop()
    check_mount_log(m, [])
    assert after.num_rows == before + 3000
    assert sum(1 for v in after.column("value").to_pylist() if v.startswith(b"written-")) == 3000
    assert_log_dir_valid(data)


def _stage_and_commit(path: Path, staging: Path | None, values: list[bytes]) -> tuple[dict, dict[int, int]]:
    """A job of two tasks (values alternating between them, keyed to spread over the topic's two
    partitions) staged and committed without Spark; returns what the commit appended and the
    staged files' inodes."""
    import pyarrow as pa

    from seglogfs.pipeline.commit import commit_staged
    from seglogfs.pipeline.task_writer import write_task
    from seglogfs.pipeline.writing import Columns, parse_write_options, plan_write

    raw = {"path": str(path), "topic": "bulk", "override.log.segment.bytes": "20000"}
    if staging is not None:
        raw["stagingDir"] = str(staging)
    plan = plan_write(parse_write_options(raw), Columns(key=True), int(time.time() * 1000))
    staged = []
    for task in (0, 1):
        mine = values[task::2]
        keys = [b"k%d" % i for i in range(len(mine))]
        chunks = [
            pa.RecordBatch.from_arrays([pa.array(keys[i : i + 500]), pa.array(mine[i : i + 500])], ["key", "value"])
            for i in range(0, len(mine), 500)
        ]
        staged.append(write_task(plan, chunks))
    inodes = {os.stat(Path(plan.job_dir) / name).st_ino: 0 for message in staged for name in message.files}
    return commit_staged(plan, staged), inodes


def test_a_commit_renames_large_staging_files_into_segments_and_copies_across_filesystems(tmp_path: Path) -> None:
    values = [b"%06d" % i * (1 + i % 50) for i in range(8000)]
    expected = Counter(values)
    renamed = new_data_dir(tmp_path / "renamed", {"bulk": 2})  # segment.bytes=20000: staged files cut to it
    appended, inodes = _stage_and_commit(renamed, None, values)
    assert sum(appended.values()) == len(values)
    segments = {p.stat().st_ino for p in renamed.glob("bulk-*/*.log")}
    assert len(inodes) > 10 and len(segments & set(inodes)) >= len(inodes) // 2  # the files themselves
    copied = new_data_dir(tmp_path / "copied", {"bulk": 2})
    other = tmp_path / "tmpfs"
    other.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(other)], check=True)
    try:
        appended_too, staged_inodes = _stage_and_commit(copied, other / "staging", values)
        assert not list(other.glob("staging/*/*"))  # the staging is gone after the commit
    finally:
        subprocess.run(["umount", str(other)], check=True)
    assert appended_too == appended
    assert not {p.stat().st_ino for p in copied.glob("bulk-*/*.log")} & set(staged_inodes)
    for path in (renamed, copied):
        config = BrokerConfig.load(log_dirs=[path])
        with DataDir.open(config, read_only=True, now_ms=int(time.time() * 1000)) as data_dir:
            got = Counter(record.value for log in data_dir.partitions() for record in log.records(0))
        assert got == expected
        assert log_ends(path) == {("bulk", p): n for (_, p), n in appended.items()}
        assert parse_every_batch(path) == len(values)
        assert_log_dir_valid(path)
        assert not staging_left(path)
