"""A topic deleted while the scheduler's passes run in another thread (a mount's `rmdir` beside
its background work): the two take turns on the data dir's maintenance lock, so no pass meets a
partition closed and renamed under it (it took the partition offline, with a traceback)."""

from __future__ import annotations

import threading
from pathlib import Path

from seglogfs.engine import BrokerConfig, DataDir
from seglogfs.engine.scheduler import Scheduler
from tests.conftest import NOW_MS, assert_log_dir_valid


def test_topics_deleted_beside_the_schedulers_passes(log_dir: Path) -> None:
    config = BrokerConfig.load(
        overrides=[
            "log.segment.bytes=300",
            "log.flush.interval.messages=1",
            "log.cleaner.backoff.ms=1",
            "log.retention.check.interval.ms=1",
            "log.flush.offset.checkpoint.interval.ms=1",
            "log.flush.scheduler.interval.ms=1",
        ],
        log_dirs=[log_dir],
    )
    with DataDir.open(config, now_ms=NOW_MS) as data_dir:
        scheduler = Scheduler(data_dir, NOW_MS)
        stop = threading.Event()
        reports = []

        def passes() -> None:
            now = NOW_MS
            while not stop.is_set():
                now += 10
                reports.append(scheduler.run_due(now))

        background = threading.Thread(target=passes)
        background.start()
        try:
            for round_ in range(12):
                topic = f"t{round_}"
                data_dir.create_topic(topic, 3, {"cleanup.policy": "compact"}, now_ms=NOW_MS)
                for log in data_dir.partition_for_append(topic, None, now_ms=NOW_MS):
                    for n in range(20):
                        log.append_records([b"value %d" % n], keys=[b"key %d" % (n % 3)], now_ms=NOW_MS)
                data_dir.delete_topic(topic)
        finally:
            stop.set()
            background.join()
        assert not any(report.offline or report.failed for report in reports)
        assert list(data_dir.partitions()) == []
    assert_log_dir_valid(log_dir)
