"""A broker's dir after a writable open: `.kafka_cleanshutdown` keeps the broker epoch a Kafka
3.7+ broker wrote into it (Kafka's LogManagerTest clean-shutdown cases), and appends carry the
partition's leader epoch from its `leader-epoch-checkpoint`, which follows truncation and the log
start as Kafka's LeaderEpochFileCache does (LeaderEpochFileCacheTest)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from seglogfs.engine import BrokerConfig, DataDir, PartitionLog
from seglogfs.engine.log.checkpoint import (
    CLEAN_SHUTDOWN_FILE,
    LEADER_EPOCH_CHECKPOINT,
    format_clean_shutdown,
    read_broker_epoch,
    read_leader_epochs,
    write_leader_epochs,
)
from seglogfs.engine.record.builder import build_batch
from seglogfs.mount_tools.cli import main as cli_main
from tests.conftest import NOW_MS, assert_log_dir_valid, broker_config, copy_fixture, make_log
from tests.engine.test_log import reopen


# -- the clean-shutdown file ------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("found", "left"),
    [
        ('{"version":0,"brokerEpoch":6439}', '{"version":0,"brokerEpoch":6439}'),  # Kafka 3.7+, KRaft
        ('{"version":0,"brokerEpoch":-1}', '{"version":0,"brokerEpoch":-1}'),  # Kafka 3.7+, ZooKeeper mode
        ('{"brokerEpoch":7,"version":0,"more":[1]}\n', '{"version":0,"brokerEpoch":7}'),  # read as Kafka reads it
        ("", ""),  # Kafka before 3.7
        ('{"version":0}', ""),  # no epoch in it: Kafka finds none
        ("not json", ""),
        (None, ""),  # no clean stop: recovered, then marked clean with no epoch
    ],
    ids=["kraft-epoch", "zk-epoch", "other-order", "empty", "no-epoch", "not-json", "absent"],
)
def test_the_clean_shutdown_file_keeps_the_broker_epoch_it_had(log_dir: Path, found: str | None, left: str) -> None:
    config = broker_config(log_dir)
    with DataDir.open(config, now_ms=NOW_MS) as data_dir:
        data_dir.create_topic("t", now_ms=NOW_MS)
    marker = log_dir / CLEAN_SHUTDOWN_FILE
    marker.unlink()
    if found is not None:
        marker.write_text(found)
    with DataDir.open(config, now_ms=NOW_MS) as data_dir:
        assert not marker.exists()  # in use: a crash now is no clean stop
        data_dir.partition("t", 0).append_records([b"x"], now_ms=NOW_MS)
    assert marker.read_text() == left
    assert marker.stat().st_mode & 0o777 == 0o644
    assert not [p.name for p in log_dir.iterdir() if p.name.endswith(".tmp")]
    assert_log_dir_valid(log_dir)
    if left:  # a broker reads it back: the same epoch
        assert read_broker_epoch(marker) == json.loads(left)["brokerEpoch"]


def test_each_log_dir_keeps_its_own_broker_epoch(tmp_path: Path) -> None:
    dirs = [tmp_path / "a", tmp_path / "b"]
    config = BrokerConfig.load(log_dirs=dirs)
    with DataDir.open(config, now_ms=NOW_MS) as data_dir:
        data_dir.create_topic("t", partitions=2, now_ms=NOW_MS)
    (dirs[0] / CLEAN_SHUTDOWN_FILE).write_text(format_clean_shutdown(12))
    (dirs[1] / CLEAN_SHUTDOWN_FILE).write_text(format_clean_shutdown(13))
    with DataDir.open(config, now_ms=NOW_MS):
        pass
    assert (dirs[0] / CLEAN_SHUTDOWN_FILE).read_text() == '{"version":0,"brokerEpoch":12}'
    assert (dirs[1] / CLEAN_SHUTDOWN_FILE).read_text() == '{"version":0,"brokerEpoch":13}'


def test_a_clean_shutdown_file_that_is_a_link_is_neither_read_nor_written_through(
    log_dir: Path, tmp_path: Path
) -> None:
    config = broker_config(log_dir)
    with DataDir.open(config, now_ms=NOW_MS) as data_dir:
        data_dir.create_topic("t", now_ms=NOW_MS)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.write_text('{"version":0,"brokerEpoch":99}')
    marker = log_dir / CLEAN_SHUTDOWN_FILE
    marker.unlink()
    marker.symlink_to(elsewhere)
    assert read_broker_epoch(marker) is None
    with DataDir.open(config, now_ms=NOW_MS):
        pass
    assert not marker.is_symlink() and marker.read_text() == ""  # the link's epoch was never read
    assert elsewhere.read_text() == '{"version":0,"brokerEpoch":99}'
    os.mkfifo(marker.with_name("fifo"))
    assert read_broker_epoch(marker.with_name("fifo")) is None  # (not waited on)


# -- leader epochs ----------------------------------------------------------------------------------
@pytest.fixture
def part_dir(log_dir: Path) -> Path:
    return log_dir / "t-0"


def epochs_of(log: PartitionLog) -> list[int]:
    """Each batch's partitionLeaderEpoch, from the first."""
    return [header.partition_leader_epoch for _segment, header in log.batch_headers(log.log_start_offset)]


def checkpoint_of(log: PartitionLog) -> list[tuple[int, int]]:
    return read_leader_epochs(log.directory / LEADER_EPOCH_CHECKPOINT)


def broker_log(part_dir: Path, entries: list[tuple[int, int]] | None, *, records: int = 3, **overrides: object):
    """A partition of `records` one-record batches (epoch 0) whose checkpoint then says
    `entries` (None: no checkpoint), reopened as a broker would have left it."""
    log = make_log(part_dir, **overrides)
    for i in range(records):
        log.append_records([b"old-%d" % i], now_ms=NOW_MS)
    path = part_dir / LEADER_EPOCH_CHECKPOINT
    if entries is None:
        path.unlink()
    else:
        write_leader_epochs(path, entries)
    return reopen(log, clean=True)


@pytest.mark.parametrize("how", ["records", "batches", "encoded", "adopted", "log-append-time"])
def test_every_append_carries_the_newest_leader_epoch_of_the_checkpoint(
    part_dir: Path, tmp_path: Path, how: str
) -> None:
    overrides = {"message_timestamp_type": "LogAppendTime"} if how == "log-append-time" else {}
    log = broker_log(part_dir, [(0, 0), (4, 3)], **overrides)
    batch = build_batch([b"new"], timestamps=NOW_MS)
    if how in ("records", "log-append-time"):
        log.append_records([b"new"], now_ms=NOW_MS)
    elif how == "batches":
        log.append_batches(batch, assign_offsets=True, now_ms=NOW_MS)
    elif how == "encoded":
        log.append_encoded(log.encode_records([b"new"], timestamps=NOW_MS), NOW_MS)
    else:
        staged = part_dir.parent / "staged"
        staged.write_bytes(batch)
        log.adopt_batches(staged, now_ms=NOW_MS)
    assert epochs_of(log) == [0, 0, 0, 4]
    assert checkpoint_of(log) == [(0, 0), (4, 3)]  # the epoch starts at 3 already: unchanged
    log.close()
    assert_log_dir_valid(part_dir.parent)


def test_dump_of_an_appended_batch_shows_the_partitions_leader_epoch(tmp_path: Path, capsys) -> None:
    """Kafka 3.7's KRaft dir: sensor-data-0's checkpoint says epoch 4 from offset 3."""
    data = copy_fixture("experts-kafka-data", tmp_path)
    with DataDir.open(BrokerConfig.load(log_dirs=[data]), now_ms=NOW_MS) as data_dir:
        info = data_dir.partition("sensor-data", 0).append_records([b"appended"], now_ms=NOW_MS)
    assert info.first_offset == 3
    logs = sorted((data / "sensor-data-0").glob("*.log"))
    assert cli_main(["dump", str(logs[-1])]) == 0
    out = capsys.readouterr().out
    line = next(line for line in out.splitlines() if line.startswith("baseOffset: 3 "))
    assert " partitionLeaderEpoch: 4 " in line
    assert read_leader_epochs(data / "sensor-data-0" / LEADER_EPOCH_CHECKPOINT) == [(0, 0), (4, 3)]


def test_a_truncation_removes_the_entries_past_the_log_end_and_the_epoch_stays(part_dir: Path) -> None:
    log = broker_log(part_dir, [(0, 0), (4, 3)], records=5)
    log.truncate_to(4, NOW_MS)
    assert checkpoint_of(log) == [(0, 0), (4, 3)]
    log.truncate_to(2, NOW_MS)
    assert checkpoint_of(log) == [(0, 0)]  # (Kafka's truncateFromEnd)
    log.append_records([b"new"], now_ms=NOW_MS)  # still the leader of epoch 4: it starts at 2 now
    assert epochs_of(log) == [0, 0, 4]
    assert checkpoint_of(log) == [(0, 0), (4, 2)]
    log.truncate_to(0, NOW_MS)
    assert checkpoint_of(log) == []
    log.close()


def test_a_log_cut_below_its_first_segment_starts_with_no_entries(part_dir: Path) -> None:
    log = broker_log(part_dir, [(0, 0), (4, 3)], records=5)
    log.delete_records(5, NOW_MS)
    log.roll(NOW_MS)
    log.truncate_to(2, NOW_MS)  # below the first segment's base: the log starts empty at 2
    assert (log.log_start_offset, log.log_end_offset) == (2, 2)
    assert checkpoint_of(log) == []
    log.append_records([b"new"], now_ms=NOW_MS)
    assert checkpoint_of(log) == [(4, 2)]
    log.close()


def test_a_log_start_moved_up_moves_the_first_entry_with_it(part_dir: Path) -> None:
    # Kafka's truncateFromStart: entries at or below the new start give way to the last of them.
    log = broker_log(part_dir, [(0, 0), (2, 2), (4, 3)], records=6, segment_bytes=150)
    log.delete_records(1, NOW_MS)
    assert checkpoint_of(log) == [(0, 1), (2, 2), (4, 3)]
    log.delete_records(4, NOW_MS)
    assert checkpoint_of(log) == [(4, 4)]
    log.close()


def test_retention_moves_the_first_entry_to_the_new_log_start(part_dir: Path) -> None:
    log = broker_log(part_dir, [(0, 0), (4, 3)], records=6, segment_bytes=150, retention_bytes=150)
    assert len(log.segments) > 2
    log.delete_old_segments(NOW_MS)
    start = log.log_start_offset
    assert 0 < start <= 5
    assert checkpoint_of(log) == ([(0, start), (4, 3)] if start < 3 else [(4, start)])
    log.close()


@pytest.mark.parametrize("found", [None, "", "0\n0\n"], ids=["absent", "empty", "no-entries"])
def test_a_partition_without_leader_epochs_appends_in_epoch_0_and_records_it(part_dir: Path, found) -> None:
    """Kafka assigns the leader's epoch at its first append in it: entry 0 from that offset."""
    log = broker_log(part_dir, None)
    if found is not None:
        (part_dir / LEADER_EPOCH_CHECKPOINT).write_text(found)
    log.append_records([b"new"], now_ms=NOW_MS)
    assert epochs_of(log) == [0, 0, 0, 0]
    assert checkpoint_of(log) == [(0, 3)]
    log.close()


def test_a_partition_that_is_only_read_writes_no_leader_epochs(part_dir: Path) -> None:
    log = broker_log(part_dir, None)
    log.delete_old_segments(NOW_MS)
    assert not (part_dir / LEADER_EPOCH_CHECKPOINT).exists()
    log.close()
    assert not (part_dir / LEADER_EPOCH_CHECKPOINT).exists()


@pytest.mark.expect_warnings("malformed checkpoint header; appends are in leader epoch 0")
def test_an_unreadable_checkpoint_is_replaced_at_the_first_append(part_dir: Path) -> None:
    log = broker_log(part_dir, None)
    (part_dir / LEADER_EPOCH_CHECKPOINT).write_text("0\nx\n")
    log.append_records([b"new"], now_ms=NOW_MS)
    assert epochs_of(log)[-1] == 0
    assert checkpoint_of(log) == [(0, 3)]
    log.close()


@pytest.mark.expect_warnings("leader-epoch-checkpoint: a symbolic link where a regular file belongs")
def test_a_leader_epoch_checkpoint_that_is_a_link_is_replaced_not_followed(part_dir: Path, tmp_path: Path) -> None:
    log = broker_log(part_dir, None)
    elsewhere = tmp_path / "elsewhere"
    write_leader_epochs(elsewhere, [(9, 0)])
    before = elsewhere.read_bytes()
    (part_dir / LEADER_EPOCH_CHECKPOINT).symlink_to(elsewhere)
    log.append_records([b"new"], now_ms=NOW_MS)
    assert epochs_of(log)[-1] == 0  # the link's epoch 9 was never read
    assert not (part_dir / LEADER_EPOCH_CHECKPOINT).is_symlink()
    assert checkpoint_of(log) == [(0, 3)]
    assert elsewhere.read_bytes() == before
    log.close()


# -- the root checkpoints ---------------------------------------------------------------------------
ROOT_CHECKPOINTS = (
    "recovery-point-offset-checkpoint",
    "replication-offset-checkpoint",
    "log-start-offset-checkpoint",
    "cleaner-offset-checkpoint",
)


def test_the_root_checkpoints_never_name_the_metadata_log(tmp_path: Path) -> None:
    """Kafka's LogManager does not load `__cluster_metadata-0` (the raft layer keeps it)."""
    data = copy_fixture("experts-kafka-data", tmp_path)
    with DataDir.open(BrokerConfig.load(log_dirs=[data]), now_ms=NOW_MS) as data_dir:
        data_dir.partition("sensor-data", 0).append_records([b"appended"], now_ms=NOW_MS)
        assert data_dir.partition("__cluster_metadata", 0).log_end_offset > 0
    for name in ("recovery-point-offset-checkpoint", "replication-offset-checkpoint"):
        text = (data / name).read_text()
        assert "sensor-data 0 4\n" in text and "__cluster_metadata" not in text, name


def test_a_checkpoint_whose_entries_did_not_change_is_not_written_again(tmp_path: Path, log_dir: Path) -> None:
    data = copy_fixture("experts-kafka-data", tmp_path)  # an empty cleaner-offset-checkpoint, as Kafka makes it
    with DataDir.open(BrokerConfig.load(log_dirs=[data]), now_ms=NOW_MS):
        pass
    config = broker_config(log_dir)
    with DataDir.open(config, now_ms=NOW_MS) as data_dir:
        data_dir.create_topic("t", now_ms=NOW_MS)
        data_dir.partition("t", 0).append_records([b"x"], now_ms=NOW_MS)
    for where in (data, log_dir):
        files = {name: (where / name).stat() for name in ROOT_CHECKPOINTS if (where / name).exists()}
        with DataDir.open(BrokerConfig.load(log_dirs=[where]), now_ms=NOW_MS) as data_dir:
            data_dir.checkpoint()
        after = {name: (where / name).stat() for name in ROOT_CHECKPOINTS if (where / name).exists()}
        assert {name: s.st_ino for name, s in after.items()} == {name: s.st_ino for name, s in files.items()}, where
    assert (data / "cleaner-offset-checkpoint").read_bytes() == b""  # as the broker left it
    assert (log_dir / "cleaner-offset-checkpoint").read_text() == "0\n0\n"  # made, as Kafka makes it
    assert (log_dir / "recovery-point-offset-checkpoint").read_text() == "0\n1\nt 0 1\n"


@pytest.mark.expect_warnings("cut .* bytes|set aside")
def test_a_repair_that_cuts_records_leaves_no_broker_epoch(log_dir: Path) -> None:
    """The epoch tells the broker's controller that the broker's log is as it stopped with it:
    not after `check --repair` cut what damage made unreadable."""
    config = broker_config(log_dir)
    with DataDir.open(config, now_ms=NOW_MS) as data_dir:
        data_dir.create_topic("t", now_ms=NOW_MS)
        data_dir.partition("t", 0).append_records([b"x"], now_ms=NOW_MS)
    (log_dir / CLEAN_SHUTDOWN_FILE).write_text(format_clean_shutdown(6439))
    with DataDir.open(config, recover_all=True, now_ms=NOW_MS) as data_dir:
        assert data_dir.partition("t", 0).set_aside == []
    assert read_broker_epoch(log_dir / CLEAN_SHUTDOWN_FILE) == 6439  # a repair that cut nothing keeps it
    with open(log_dir / "t-0" / "00000000000000000000.log", "ab") as segment:
        segment.write(b"\x01" * 20)
    with DataDir.open(config, recover_all=True, now_ms=NOW_MS) as data_dir:
        assert data_dir.partition("t", 0).set_aside
    assert (log_dir / CLEAN_SHUTDOWN_FILE).read_text() == ""
