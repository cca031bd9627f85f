"""A writer for the concurrency tests: appends numbered lines to an append file until told to
stop (SIGTERM) or the time is up, and prints the last line number each write acknowledged.

Usage: python -m tests.fs.line_writer APPEND_FILE WRITER_ID SECONDS
Lines are `w<id>-<n>`; each write() carries 1-3 lines; after every write that returned, it
prints `acked <n>` (flushed), so a reader knows which lines the filesystem accepted.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import sys
import time


def main() -> None:
    path, writer, seconds = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
    stop = False

    def on_term(*_: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_term)
    rng = random.Random(writer)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND)
    deadline = time.monotonic() + seconds
    n = 0
    try:
        while not stop and time.monotonic() < deadline:
            count = rng.randint(1, 3)
            data = b"".join(b"w%d-%d\n" % (writer, n + i) for i in range(1, count + 1))
            try:
                os.write(fd, data)
            except OSError as error:
                print(f"error {error.errno}", flush=True)
                return
            n += count
            print(f"acked {n}", flush=True)
            time.sleep(rng.random() * 0.01)
    finally:
        with contextlib.suppress(OSError):  # the mount may be gone
            os.close(fd)


if __name__ == "__main__":
    main()
