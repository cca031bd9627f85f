"""A process that opens a data dir read-only over and over, or one that writes it (opening,
appending, rolling and closing over and over), for `seconds`: run side by side by
test_races.py. Usage: python -m tests.engine.readonly_beside_writer reader|writer DIR SECONDS"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from seglogfs.engine import BrokerConfig, DataDir


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def main() -> None:
    role, path, seconds = sys.argv[1], Path(sys.argv[2]), float(sys.argv[3])
    deadline = time.monotonic() + seconds
    opens = 0
    if role == "writer":
        config = BrokerConfig.load(overrides=["log.segment.bytes=2000"], log_dirs=[path])
        while time.monotonic() < deadline:
            with DataDir.open(config, now_ms=now_ms()) as data_dir:  # a close trims the indexes
                for log in data_dir.partition_for_append("t", None, now_ms=now_ms()):
                    log.append_records([b"x" * 20] * 5, now_ms=now_ms())
            opens += 1
    else:
        config = BrokerConfig.load(log_dirs=[path])
        while time.monotonic() < deadline:
            try:
                with DataDir.open(config, read_only=True, now_ms=now_ms()) as data_dir:
                    for log in data_dir.partitions():
                        log.offset_for_timestamp(0)
                        for segment in log.segments:
                            segment.offset_index.lookup(segment.base_offset)
                opens += 1
            except Exception:
                continue
    print(f"{role} opened {opens} times")


if __name__ == "__main__":
    main()
