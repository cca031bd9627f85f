"""Reading ahead in a worker thread: while the caller renders batches, the ones after them are
read and checked (`os.pread` and CRC-32C release the GIL, so the two run on two cores). For long
sequential reads (`consume` of a partition); a short read costs a thread start for nothing.

The items come in the source's order, as they would without the thread; an error the source
raises comes after the items before it, as it would. Closing the iterator early (`| head`, a
message limit, Ctrl-C) stops the thread and closes the source in it (its segment leases let go)
before `close` returns.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Generator, Iterator
from typing import TypeVar

T = TypeVar("T")

GROUP_BYTES = 2 << 20  # items are handed over in groups of about this many bytes (a hand-over costs microseconds)
DEPTH = 3  # groups read ahead at most: the memory it takes is about DEPTH × GROUP_BYTES
_PUT_POLL_S = 0.05  # how often a reader waiting for room looks whether it was stopped


class _End:
    """The source is exhausted (`error` None) or raised `error`."""

    def __init__(self, error: BaseException | None = None) -> None:
        self.error = error


def read_ahead(
    source: Iterator[T], size_of: Callable[[T], int], *, group_bytes: int = GROUP_BYTES, depth: int = DEPTH
) -> Generator[T, None, None]:
    """`source`'s items, read by a worker thread up to `depth` groups of `group_bytes` (by
    `size_of`) ahead of the caller."""
    handed: queue.Queue[list[T] | _End] = queue.Queue(depth)
    stopped = threading.Event()

    def hand(item: list[T] | _End) -> bool:
        while not stopped.is_set():
            try:
                handed.put(item, timeout=_PUT_POLL_S)
                return True
            except queue.Full:
                continue
        return False

    def read() -> None:
        group: list[T] = []
        weight = 0
        try:
            for item in source:
                group.append(item)
                weight += size_of(item)
                if weight >= group_bytes:
                    if not hand(group):
                        return
                    group, weight = [], 0
            if group and not hand(group):
                return
            hand(_End())
        except BaseException as error:  # handed to the caller, raised there
            hand(_End(error))
        finally:
            close = getattr(source, "close", None)
            if close is not None:
                close()

    reader = threading.Thread(target=read, name="read-ahead", daemon=True)
    reader.start()
    try:
        while True:
            got = handed.get()
            if isinstance(got, _End):
                if got.error is not None:
                    raise got.error
                return
            yield from got
    finally:
        stopped.set()
        reader.join()
