"""seglogfs -> Kafka: every segment and index seglogfs wrote passes Kafka's own checks.

A data dir is written by each of seglogfs's writers: `produce`, a writable mount's `append` and
`append.batches`, `clean` (compaction and retention), `delete-records`, a Spark batch write and a
Spark stream's micro-batches, and a writer killed with SIGKILL then recovered. Then
`kafka-dump-log --deep-iteration --index-sanity-check` and `kafka-dump-log --verify-index-only`,
of each Kafka version tested, read every `.log`, `.index` and `.timeindex` of it (one run of each
for all the files): what they print is only what they print for a sound file."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from seglogfs.engine.record.builder import build_batch
from tests.cli.support import run
from tests.conftest import NOW_MS, REPO
from tests.fs.conftest import Mount
from tests.interop.conftest import AFTER_FILES, STDERR, VERSIONS, Kafka
from tests.pipeline.conftest import SPARK_WORKER_START, metrics, spark  # noqa: F401 (fixtures)
from tests.pipeline.test_streaming import finish, stream
from tests.pipeline.test_write import HEADERS

SMALL = ["--override", "log.segment.bytes=6000", "--override", "log.index.interval.bytes=256"]

# What kafka-dump-log prints of a sound file, line by line (anything else is a finding).
SOUND_LOG_LINES = re.compile(
    r"Dumping \S+\.log$"
    r"|Log starting offset: \d+$"
    r"|Starting offset: \d+$"  # (3.x)
    r"|baseOffset: \d+ lastOffset: \d+ count: \d+ .* isvalid: true$"
    r"|\| offset: \d+ .*"
)


def produce(data: Path, topic: str, lines: list[str], *options: str) -> None:
    run("produce", str(data), "--topic", topic, *SMALL, *options, stdin="".join(f"{x}\n" for x in lines).encode())


def write_everything(data: Path, tmp_path: Path, mount: Callable[..., Mount], spark: Any) -> None:  # noqa: F811
    # produce: keyed and unkeyed, several runs (several batches), small segments.
    for run_number in range(4):
        produce(
            data,
            "produced",
            [f"k{i % 5}:produced-{run_number}-{i}-" + "p" * (i % 40) for i in range(60)],
            "--property",
            "parse.key=true",
            "--property",
            "key.separator=:",
        )
    # compaction and retention by `clean`.
    for topic, config in (("compacted", "cleanup.policy=compact"), ("retained", "retention.bytes=7000")):
        run("topics", "create", str(data), "--topic", topic, "--config", config, "--config", "segment.bytes=3000")
        for round_number in range(5):
            produce(
                data,
                topic,
                [f"key{i % 6}:{topic}-{round_number}-{i}-" + "c" * 30 for i in range(25)],
                "--property",
                "parse.key=true",
                "--property",
                "key.separator=:",
            )
    run("clean", str(data))
    # delete-records: the log start offset raised into a segment.
    run("delete-records", str(data), "--topic", "produced", "--partition", "0", "--offset", "130")
    # A writable mount's appends: lines, and encoded batches.
    m = mount(data, "-o", "log.segment.bytes=6000,log.index.interval.bytes=256")
    os.mkdir(m.path / "appended")
    for i in range(40):
        with open(m.path / "appended" / "0" / "append", "a") as append:
            append.write(f"appended-{i}-" + "a" * (i * 7 % 90) + "\n")
    batches = b"".join(
        build_batch([b"batch-%d-%d" % (b, i) for i in range(8)], keys=[b"k%d" % i for i in range(8)], timestamps=NOW_MS)
        for b in range(12)
    )
    with open(m.path / "appended" / "0" / "append.batches", "wb") as append:
        append.write(batches)
    m.stop()
    # Spark: one batch write (keys, headers, two partitions) and a stream copying `produced` in
    # micro-batches of 60 (each an append of its own), on topics of small segments.
    for topic in ("sparkbatch", "sparkstream"):
        run("topics", "create", str(data), "--topic", topic, "--partitions", "2", "--config", "segment.bytes=3000")
    rows = [
        (f"k{i % 9}".encode() if i % 4 else None, b"spark-%d-" % i + b"s" * (i % 50), [("h", b"%d" % i)])
        for i in range(300)
    ]
    frame = spark.createDataFrame(rows, f"key binary, value binary, headers {HEADERS}")
    frame.write.format("seglog").option("path", str(data)).option("topic", "sparkbatch").mode("append").save()
    finish(
        stream(spark, data, subscribe="produced", startingOffsets="earliest", maxOffsetsPerTrigger="60")
        .selectExpr("key", "value")
        .writeStream.format("seglog")
        .option("path", str(data))
        .option("topic", "sparkstream")
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    # A writer killed with SIGKILL while it appends (every codec), recovered by the next open.
    writer = subprocess.Popen(
        [sys.executable, "-m", "tests.cli.crash_writer", str(data), "7"], cwd=REPO, stdout=subprocess.PIPE
    )
    assert writer.stdout is not None
    acked = 0
    for line in writer.stdout:
        if line.startswith(b"acked") and (acked := acked + 1) == 30:
            break
    writer.send_signal(signal.SIGKILL)
    writer.wait(timeout=30)
    writer.stdout.close()
    produce(data, "crash", ["after-recovery"])


def broken_copy(data: Path, where: Path) -> list[Path]:
    """A copy of one partition with a record's byte flipped (its batch's CRC fails) and an offset
    index entry naming another offset: what the checks must find, run beside the real files (a check
    that finds nothing there could not fail)."""
    source = data / "appended-0"
    copy = where / "broken-0"
    copy.mkdir(parents=True)
    for name in ("00000000000000000000.log", "00000000000000000000.index", "00000000000000000000.timeindex"):
        (copy / name).write_bytes((source / name).read_bytes())
    log = bytearray((copy / "00000000000000000000.log").read_bytes())
    log[200] ^= 0xFF
    (copy / "00000000000000000000.log").write_bytes(bytes(log))
    index = bytearray((copy / "00000000000000000000.index").read_bytes())
    last_offset = int.from_bytes(index[-8:-4], "big")
    index[-8:-4] = (last_offset - 1).to_bytes(4, "big")  # the last entry's offset, one less
    (copy / "00000000000000000000.index").write_bytes(bytes(index))
    return [copy / "00000000000000000000.log", copy / "00000000000000000000.index"]


# Known: what Kafka reports of seglogfs's files today, each matched and taken out of the findings
# (and each must still be there: when one is fixed, the test says to remove it here).
KNOWN = {
    # Kafka 4.x's DumpLogSegments (not 3.9's) starts each file's offset run at -1: every segment
    # whose first record is not offset 0 is "non-consecutive", a broker's own segments too.
    "kafka-4-first-offset": re.compile(r"Non-consecutive offsets in \S+\n  -1 is followed by \d+\n"),
}


def kafka_findings(kafka: Kafka, *dirs: Path, known: set[str] | None = None) -> list[str]:
    """What Kafka's kafka-dump-log finds wrong in the dirs' segments and indexes."""
    logs = sorted(log for data in dirs for log in data.glob("*-*/*.log"))
    indexes = sorted(
        index for data in dirs for pattern in ("*-*/*.index", "*-*/*.timeindex") for index in data.glob(pattern)
    )
    findings = []
    deep = kafka.dump_log([*logs, *indexes], "--deep-iteration", "--index-sanity-check")
    for path in logs:
        findings += [f"{path}: {line}" for line in deep[path].splitlines() if not SOUND_LOG_LINES.match(line)]
    # (An offset index with no entry, a segment shorter than log.index.interval.bytes, is one
    # Kafka writes too, and says so; of a time index with none, as a compacted segment left with
    # no record has, it says nothing.)
    empty = {
        path: f"{path} is empty.\n" if path.suffix == ".index" and path.stat().st_size == 0 else "" for path in indexes
    }
    for path in indexes:
        expected = f"Dumping {path}\n" + (empty[path] or f"{path} passed sanity check.\n")
        if deep[path] != expected:
            findings.append(f"{path}: {deep[path]!r}")
    verified = kafka.dump_log(indexes, "--verify-index-only")
    for output in (deep, verified):
        reports = output[AFTER_FILES] + output[STDERR]
        for name, pattern in KNOWN.items():
            reports, count = pattern.subn("", reports)
            if count and known is not None:
                known.add(name)
        # One finding per report: its heading line (naming the file) and the lines under it.
        findings += [f"after the files: {block}" for block in re.split(r"\n(?=\S)(?!Indexed offset)", reports) if block]
    for path in indexes:
        if verified[path] != f"Dumping {path}\n{empty[path]}":
            findings.append(f"{path} --verify-index-only: {verified[path]!r}")
    return findings


@pytest.mark.expect_warnings("recover")
@pytest.mark.flaky(reruns=1, only_rerun=[SPARK_WORKER_START])
@pytest.mark.timeout(600)  # (a Spark session's start, on a loaded machine, besides Kafka's tools)
def test_kafka_finds_nothing_wrong_in_what_seglogfs_wrote(
    kafka: dict[str, Kafka],
    tmp_path: Path,
    mount: Callable[..., Mount],
    spark: Any,  # noqa: F811 (the fixture imported above)
) -> None:
    data = tmp_path / "data"
    write_everything(data, tmp_path, mount, spark)
    logs = list(data.glob("*-*/*.log"))
    topics = {log.parent.name for log in logs}
    assert {
        "produced-0",
        "compacted-0",
        "retained-0",
        "appended-0",
        "crash-0",
        "sparkbatch-1",
        "sparkstream-0",
    } <= topics
    assert len(logs) >= 12, "the writers rolled too few segments to check much"
    broken = broken_copy(data, tmp_path / "broken")
    known: set[str] = set()
    for version in VERSIONS:
        findings = kafka_findings(kafka[version], data, tmp_path / "broken", known=known)
        wrong = [finding for finding in findings if str(tmp_path / "broken") not in finding]
        assert not wrong, f"Kafka {version}'s kafka-dump-log:\n" + "\n".join(wrong[:40])
        found = {path for path in broken if any(str(path) in finding for finding in findings)}
        assert found == set(broken), f"Kafka {version} did not find the damage done on purpose: {findings}"
    gone = set(KNOWN) - known
    assert not gone, f"Kafka no longer reports {sorted(gone)}: take it out of KNOWN"
