"""`seglogfs clean` on copies of real brokers' data dirs, run as a real process: a broker's topic
configs decide what goes, `__cluster_metadata` loses nothing, a compacted topic keeps the latest
value of every key, a ZooKeeper-mode dir loses nothing until a policy is set, and `--dry-run`
prints what a pass would do without changing a byte."""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

from seglogfs.engine import BrokerConfig, DataDir
from seglogfs.engine.config import METADATA_TOPIC
from tests.cli.test_cli import run
from tests.conftest import NOW_MS, assert_log_dir_valid, copy_fixture

BROKER_DIRS = [
    "flink-on-prem-cp760",
    "experts-kafka-data",
    "ne-streaming-d95be01",
    "spooldir-cp512",
    "bigdata-sensor-suhu",
]
ZOOKEEPER_DIRS = {"spooldir-cp512", "bigdata-sensor-suhu"}
SIXTY_DAYS_MS = 60 * 86_400_000
Row = tuple[int, int, bytes | None, bytes | None]  # offset, timestamp, key, value


@dataclass
class Partition:
    policy: tuple[str, ...]
    rows: list[Row]


def file_hashes(directory: Path) -> dict[str, str]:
    """Every file's bytes (and every dir's presence), by path: what "no byte changed" means."""
    out = {}
    for path in sorted(directory.rglob("*")):
        relative = str(path.relative_to(directory))
        out[relative] = hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else "dir"
    return out


def read_partitions(directory: Path) -> dict[tuple[str, int], Partition]:
    """Every partition's user records and effective cleanup policy, read-only."""
    with DataDir.open(BrokerConfig.load(log_dirs=[directory]), read_only=True, now_ms=NOW_MS) as data_dir:
        return {
            (log.topic, log.partition): Partition(
                log.config.cleanup_policy,
                [
                    (r.offset, r.timestamp, bytes(r.key) if r.key is not None else None, r.value and bytes(r.value))
                    for r in log.records(log.log_start_offset)
                ],
            )
            for log in data_dir.partitions()
        }


def latest_time_ms(partitions: dict[tuple[str, int], Partition]) -> int:
    return max(row[1] for partition in partitions.values() for row in partition.rows)


def latest_by_key(rows: list[Row]) -> dict[bytes, Row]:
    latest: dict[bytes, Row] = {}
    for row in rows:
        if row[2] is not None:
            latest[row[2]] = row
    return latest


def assert_cleaned_as_kafka_would(before: dict[tuple[str, int], Partition], after_dir: Path) -> None:
    after = read_partitions(after_dir)
    assert after.keys() == before.keys()
    for key, old in before.items():
        new = after[key].rows
        where = f"{key[0]}-{key[1]}"
        assert set(new) <= set(old.rows), f"{where}: records that were not there before"
        if key[0] == METADATA_TOPIC or not old.policy:
            assert new == old.rows, f"{where}: cleanup is off, yet records went"
        elif old.policy == ("compact",):
            kept = set(new)
            for record_key, row in latest_by_key(old.rows).items():
                if row[3] is not None:  # a tombstone may go after delete.retention.ms
                    assert row in kept, f"{where}: the latest value of key {record_key!r} is gone"


# -- the issue: a broker's data dir cleaned by the broker's settings ---------------------------------
@pytest.mark.parametrize("name", BROKER_DIRS)
def test_clean_sixty_days_on_keeps_metadata_and_the_latest_value_of_every_key(name: str, tmp_path: Path) -> None:
    copy = copy_fixture(name, tmp_path)
    before = read_partitions(copy)
    now = latest_time_ms(before) + SIXTY_DAYS_MS
    assert (METADATA_TOPIC, 0) in before or name in ZOOKEEPER_DIRS

    untouched = file_hashes(copy)
    dry = run("clean", str(copy), "--dry-run", "--now", str(now)).stdout.decode()
    assert file_hashes(copy) == untouched, "--dry-run changed the data dir"

    done = run("clean", str(copy), "--now", str(now)).stdout.decode()
    assert_cleaned_as_kafka_would(before, copy)
    assert_log_dir_valid(copy)

    # The dry run named exactly the partitions the pass then deleted from.
    would = set(re.findall(r"^(\S+): would delete", dry, re.MULTILINE))
    deleted = set(re.findall(r"^(\S+): deleted", done, re.MULTILINE))
    assert would == deleted
    assert f"{METADATA_TOPIC}-0" not in deleted
    compacted = {line.split(":")[0] for line in done.splitlines() if ": compacted offsets" in line}
    assert compacted <= set(re.findall(r"^(\S+): would compact", dry, re.MULTILINE)) | compacted
    if name in ZOOKEEPER_DIRS:
        assert "broker configs unknown (no metadata log: a ZooKeeper-mode broker's dir" in dry
        assert "broker configs unknown" in done
        assert deleted == set()
    else:
        assert "unknown" not in done


def test_clean_of_the_flink_broker_keeps_its_compacted_and_metadata_topics(tmp_path: Path) -> None:
    """The reported case: `retention.ms=604800000` took every segment of these topics."""
    copy = copy_fixture("flink-on-prem-cp760", tmp_path)
    before = read_partitions(copy)
    compacted = {topic for (topic, _), p in before.items() if p.policy == ("compact",)}
    assert {"__consumer_offsets", "_schemas", "connect-configs", "connect-offsets", "connect-status"} <= compacted
    done = run("clean", str(copy), "--now", str(latest_time_ms(before) + SIXTY_DAYS_MS)).stdout.decode()
    assert "orders-0: deleted 1 segments (0) by retention.ms=604800000" in done  # a topic with broker defaults
    after = read_partitions(copy)
    for key, partition in before.items():
        if key[0] in compacted or key[0] == METADATA_TOPIC:
            assert after[key].rows == partition.rows, key


@pytest.mark.expect_warnings("broker configs are unknown")  # the in-process open of spooldir-cp512
@pytest.mark.parametrize("name", ["flink-on-prem-cp760", "experts-kafka-data", "spooldir-cp512"])
def test_compaction_of_real_compacted_topics_keeps_the_latest_value_of_every_key(name: str, tmp_path: Path) -> None:
    """Each fixture partition is one active segment, which is never cleaned; rolled, the
    broker's compacted topics (`__consumer_offsets`, `_schemas`, `connect-*`, …) are compacted
    for real: with transactional and control batches, by the cleaner-offset-checkpoint."""
    copy = copy_fixture(name, tmp_path)
    before = read_partitions(copy)
    now = latest_time_ms(before) + SIXTY_DAYS_MS
    config = BrokerConfig.load(log_dirs=[copy])
    with DataDir.open(config, now_ms=now) as data_dir:
        for log in data_dir.partitions():
            if log.config.compact and log.active_segment.size > 0:
                log.roll(now)
    planned = run("clean", str(copy), "--dry-run", "--now", str(now)).stdout.decode()
    done = run("clean", str(copy), "--now", str(now)).stdout.decode()
    compacted = set(re.findall(r"^(\S+): compacted offsets", done, re.MULTILINE))
    assert compacted, done
    assert compacted == set(re.findall(r"^(\S+): would compact", planned, re.MULTILINE))
    assert "__consumer_offsets-" in " ".join(compacted)
    assert_cleaned_as_kafka_would(before, copy)
    assert_log_dir_valid(copy)


@pytest.mark.parametrize("name", BROKER_DIRS)
def test_dry_run_changes_no_byte_even_of_a_dir_never_opened(name: str, tmp_path: Path) -> None:
    """A first open for writing recovers, rebuilds missing indexes and rewrites checkpoints;
    `--dry-run` opens read-only and does none of it."""
    copy = copy_fixture(name, tmp_path)
    untouched = file_hashes(copy)
    result = run("clean", str(copy), "--dry-run", "--now", str(NOW_MS + 3650 * 86_400_000))
    assert file_hashes(copy) == untouched
    assert result.stdout.strip()
