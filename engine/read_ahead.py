"""Work ahead of the caller in worker threads, for long sequential reads (`consume` of a
partition); a short read costs a thread start for nothing.

* `read_ahead`: while the caller renders batches, the ones after them are read and checked in a
  worker thread (`os.pread` and CRC-32C release the GIL, so the two run on two cores).
* `map_ahead`: a function of each item (rendering a batch: the compiled core releases the GIL
  while it walks and writes) computed by several threads, on groups of items, ahead of the
  caller.

The items come in the source's order, as they would without the threads; an error the source
or the function raises comes after the items before it, as it would. Closing the iterator early
(`| head`, a message limit, Ctrl-C) stops the threads (and closes the source in `read_ahead`'s,
its segment leases let go) before `close` returns.
"""

from __future__ import annotations

import collections
import itertools
import queue
import threading
from collections.abc import Callable, Generator, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")
R = TypeVar("R")

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


MAP_GROUP_BYTES = 1 << 20  # items are handed to a thread in groups of about this many bytes


def map_ahead(
    function: Callable[[T], R],
    source: Iterator[T],
    size_of: Callable[[T], int],
    *,
    workers: int,
    group_bytes: int = MAP_GROUP_BYTES,
) -> Generator[R, None, None]:
    """`function(item)` of each of `source`'s items, in order, computed by `workers` threads on
    groups of about `group_bytes` (by `size_of`), up to two groups a thread ahead of the caller.
    The source is read in the caller's thread."""

    def apply(group: list[T]) -> tuple[list[R], Exception | None]:
        """The function of the group's items, up to the first that raises, and its error."""
        results: list[R] = []
        try:
            for item in group:
                results.append(function(item))
        except Exception as error:
            return results, error
        return results, None

    failed: list[Exception] = []  # the source's error: raised once the items before it are out

    def groups() -> Iterator[list[T]]:
        group: list[T] = []
        weight = 0
        try:
            for item in source:
                group.append(item)
                weight += size_of(item)
                if weight >= group_bytes:
                    yield group
                    group, weight = [], 0
        except Exception as error:
            failed.append(error)
        if group:
            yield group

    pending: collections.deque[Future[tuple[list[R], Exception | None]]] = collections.deque()
    pool = ThreadPoolExecutor(workers, thread_name_prefix="map-ahead")
    try:
        grouped = groups()
        pending.extend(pool.submit(apply, group) for group in itertools.islice(grouped, 2 * workers))
        while pending:
            done, error = pending.popleft().result()
            pending.extend(pool.submit(apply, group) for group in itertools.islice(grouped, 1))
            yield from done
            if error is not None:
                raise error
        if failed:
            raise failed[0]
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
