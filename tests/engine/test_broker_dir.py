"""A broker's dir after a writable open: `.kafka_cleanshutdown` keeps the broker epoch a Kafka
3.7+ broker wrote into it (Kafka's LogManagerTest clean-shutdown cases), and appends carry the
partition's leader epoch from its `leader-epoch-checkpoint`, which follows truncation and the log
start as Kafka's LeaderEpochFileCache does (LeaderEpochFileCacheTest)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from seglogfs.engine import BrokerConfig, DataDir
from seglogfs.engine.checkpoint import (
    CLEAN_SHUTDOWN_FILE,
    format_clean_shutdown,
    read_broker_epoch,
)
from tests.conftest import NOW_MS, assert_log_dir_valid, broker_config


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
