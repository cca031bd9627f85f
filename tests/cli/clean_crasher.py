"""A compaction pass that SIGKILLs itself at a chosen moment.

Usage: python -m tests.cli.clean_crasher LOGDIR PHASE N NOW_MS
PHASE is where the kill lands:
  map     before the N-th batch of keys goes into the offset map
  write   before the N-th write to a `.cleaned` segment
  rename  right after the N-th file rename (`.cleaned` → `.swap`, old → `.deleted`, `.swap` →
          live, checkpoint files), so every step of a swap is a crash point
With N = 0 nothing is killed and the number of renames the pass made is printed.
The kill is a real SIGKILL of this process: nothing is flushed or closed after it.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path
from typing import Any

from seglogfs.engine import DataDir
from seglogfs.engine.cleaner.offset_map import OffsetMap
from seglogfs.engine.log.naming import CLEANED_SUFFIX
from seglogfs.engine.log.segment import LogSegment
from tests.cli.clean_crash_setup import crash_config


def main() -> None:
    log_dir, phase, n, now_ms = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    calls = 0

    def count_and_maybe_die() -> None:
        nonlocal calls
        calls += 1
        if calls == n:
            os.kill(os.getpid(), signal.SIGKILL)

    if phase == "map":
        original_put = OffsetMap.put

        def put(self: OffsetMap, *args: Any) -> int:
            count_and_maybe_die()
            return original_put(self, *args)

        OffsetMap.put = put  # type: ignore[method-assign]
    elif phase == "write":
        original_append = LogSegment.append

        def append(self: LogSegment, *args: Any) -> None:
            if self.file_suffix == CLEANED_SUFFIX:
                count_and_maybe_die()
            original_append(self, *args)

        LogSegment.append = append  # type: ignore[method-assign]
    elif phase == "rename":
        original_replace = os.replace

        def replace(*args: Any, **kwargs: Any) -> None:
            original_replace(*args, **kwargs)
            count_and_maybe_die()

        os.replace = replace  # type: ignore[assignment]
    else:
        raise SystemExit(f"unknown phase {phase!r}")

    data_dir = DataDir.open(crash_config(log_dir), now_ms=now_ms)
    report = data_dir.compact(now_ms)
    data_dir.close()
    print("renames" if phase == "rename" else "calls", calls, "cleaned", len(report.compaction), flush=True)


if __name__ == "__main__":
    main()
