"""The data dir the compaction crash tests start from (shared by the test and its subprocess)."""

from __future__ import annotations

from pathlib import Path

from seglogfs.engine import BrokerConfig, DataDir

TOPIC = "compacted"
KEYS = 12


def crash_config(log_dir: Path) -> BrokerConfig:
    # Several groups per pass, several segments per group.
    return BrokerConfig.load(
        overrides=[
            "log.segment.bytes=3000",
            "log.index.interval.bytes=100",
            "log.cleaner.dedupe.buffer.size=640",  # 37 slots: room for every key
        ],
        log_dirs=[log_dir],
    )


def make_compacted_dir(log_dir: Path, now_ms: int) -> dict[int, tuple[bytes, bytes | None]]:
    """Write KEYS keys × many versions (a tombstone now and then) into a compacted topic;
    returns offset → (key, value) of everything written."""
    written: dict[int, tuple[bytes, bytes | None]] = {}
    with DataDir.open(crash_config(log_dir), now_ms=now_ms) as data_dir:
        data_dir.create_topic(TOPIC, 1, {"cleanup.policy": "compact"}, now_ms=now_ms)
        log = data_dir.partition(TOPIC, 0)
        for i in range(90):
            if i % 10 == 9:
                log.roll(now_ms)  # segments of ~700 bytes: about four to a cleaned group
            key = b"key-%d" % (i * 7 % KEYS)
            value = None if i % 29 == 0 else b"value-%d" % i
            offset = log.append_records([value], keys=[key], timestamps=[now_ms], now_ms=now_ms).first_offset
            written[offset] = (key, value)
    return written
