"""A producer to be killed: appends numbered records, flushes, and reports each flushed offset.

Usage: python -m tests.cli.crash_writer LOGDIR SEED
Every record's value is derived from its offset (`value_for`), so a reader can tell a record that
is present but wrong from one that is missing. After each flush it prints `acked N` (N = log end
offset made durable) and flushes stdout.
"""

from __future__ import annotations

import random
import sys
import time
from pathlib import Path

from seglogfs.engine import BrokerConfig, DataDir
from seglogfs.engine.record.compression import CompressionType


def value_for(offset: int) -> bytes:
    return b"record-%08d-" % offset + b"x" * (offset % 97)


def main() -> None:
    log_dir, seed = Path(sys.argv[1]), int(sys.argv[2])
    rng = random.Random(seed)
    config = BrokerConfig.load(
        overrides=["log.segment.bytes=20000", "log.index.interval.bytes=512", "log.index.size.max.bytes=4096"],
        log_dirs=[log_dir],
    )
    data_dir = DataDir.open(config, now_ms=time.time_ns() // 1_000_000)
    log = data_dir.partition_for_append("crash", 0, now_ms=time.time_ns() // 1_000_000)[0]
    print("ready", log.log_end_offset, flush=True)
    codecs = list(CompressionType)
    while True:
        for _ in range(rng.randint(1, 4)):
            start = log.log_end_offset
            count = rng.randint(1, 40)
            log.append_records(
                [value_for(start + i) for i in range(count)],
                keys=[b"k%d" % ((start + i) % 13) for i in range(count)],
                now_ms=time.time_ns() // 1_000_000,
                compression=rng.choice(codecs),
            )
        log.flush()
        if rng.random() < 0.2:
            data_dir.checkpoint()
        print("acked", log.log_end_offset, flush=True)


if __name__ == "__main__":
    main()
