"""Work ahead of the caller in worker threads, for long sequential reads (`consume` of a
partition); a short read costs a thread start for nothing.

* `read_ahead`: while the caller checks and renders batches, the ones after them are read in a
  worker thread (`os.pread` releases the GIL, so the two run on two cores).
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
from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:
    from concurrent.futures import Future

T = TypeVar("T")
R = TypeVar("R")

GROUP_BYTES = 2 << 20  # items are handed over in groups of about this many bytes (a hand-over costs microseconds)
DEPTH = 3  # groups read ahead at most: the memory it takes is about DEPTH × GROUP_BYTES
_PUT_POLL_S = 0.05  # how often a reader waiting for room looks whether it was stopped


class _End:
    """The source is exhausted (`error` None) or raised `error`."""

    def __init__(self, error: BaseException | None = None) -> None:
        self.error = error


def _groups(source: Iterator[T], size_of: Callable[[T], int], group_bytes: int, end: _End) -> Iterator[list[T]]:
    """`source`'s items in groups of about `group_bytes` (by `size_of`). An error of the source
    ends them, after the group it cut short, and is kept in `end`."""
    group: list[T] = []
    weight = 0
    while True:
        try:
            item = next(source)
        except StopIteration:
            break
        except BaseException as error:  # (raised where the items are taken, after them)
            end.error = error
            break
        group.append(item)
        weight += size_of(item)
        if weight >= group_bytes:
            yield group
            group, weight = [], 0
    if group:
        yield group


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
        end = _End()
        try:
            for group in _groups(source, size_of, group_bytes, end):
                if not hand(group):
                    return
            hand(end)
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

    # (imported here: most commands that import this module never map ahead, and every start of
    # `seglogfs` would pay for concurrent.futures)
    from concurrent.futures import ThreadPoolExecutor  # noqa: PLC0415

    end = _End()  # the source's error, raised once the items before it are out
    pending: collections.deque[Future[tuple[list[R], Exception | None]]] = collections.deque()
    pool = ThreadPoolExecutor(workers, thread_name_prefix="map-ahead")
    try:
        grouped = _groups(source, size_of, group_bytes, end)
        pending.extend(pool.submit(apply, group) for group in itertools.islice(grouped, 2 * workers))
        while pending:
            done, error = pending.popleft().result()
            pending.extend(pool.submit(apply, group) for group in itertools.islice(grouped, 1))
            yield from done
            if error is not None:
                raise error
        if end.error is not None:
            raise end.error
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
