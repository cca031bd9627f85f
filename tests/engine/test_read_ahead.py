"""engine.read_ahead: the source's items in order (`map_ahead`: their function's results, worked
out on several threads at once), an error after the items before it, and an early close that
stops the worker threads (and closes `read_ahead`'s source in its thread)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest

from seglogfs.engine.read_ahead import map_ahead, read_ahead


def ahead_threads() -> set[threading.Thread]:
    """The threads read_ahead and map_ahead start (other tests of the process may start and end
    threads of their own meanwhile, so a count of all threads proves nothing)."""
    return {thread for thread in threading.enumerate() if thread.name.startswith(("read-ahead", "map-ahead"))}


def numbers(count: int, closed: list[str], fail_at: int | None = None) -> Iterator[bytes]:
    try:
        for n in range(count):
            if n == fail_at:
                raise OSError(5, f"reading item {n}")
            yield b"%d" % n
    finally:
        closed.append(threading.current_thread().name)


def test_items_come_in_order_in_groups_of_any_size() -> None:
    for group_bytes in (1, 7, 1 << 20):
        closed: list[str] = []
        got = list(read_ahead(numbers(1000, closed), len, group_bytes=group_bytes, depth=2))
        assert got == [b"%d" % n for n in range(1000)]
        assert closed == ["read-ahead"]


def test_an_error_comes_after_the_items_before_it() -> None:
    closed: list[str] = []
    got = []
    with pytest.raises(OSError, match="reading item 500"):
        for item in read_ahead(numbers(1000, closed, fail_at=500), len, group_bytes=10, depth=2):
            got.append(item)
    assert got == [b"%d" % n for n in range(500)]
    assert closed == ["read-ahead"]


@pytest.mark.parametrize(
    "ahead", [read_ahead, lambda source, size_of, **kw: map_ahead(bytes, source, size_of, workers=2, **kw)]
)
def test_the_items_of_a_group_the_error_cut_short_come_before_it(ahead) -> None:
    """The error ends a group half full: its items are still handed over, then the error."""
    got = []
    with pytest.raises(OSError, match="reading item 500"):
        for item in ahead(numbers(1000, [], fail_at=500), len, group_bytes=1 << 20):
            got.append(item)
    assert got == [b"%d" % n for n in range(500)]


def test_closing_early_stops_the_reader_and_closes_the_source_in_it() -> None:
    """The reader is blocked on a full hand-over queue when the caller stops (`| head`): the
    close returns once the reader has let go of the source."""
    closed: list[str] = []
    before = ahead_threads()
    items = read_ahead(numbers(1_000_000, closed), len, group_bytes=10, depth=1)
    assert next(items) == b"0"
    items.close()
    assert closed == ["read-ahead"]
    assert ahead_threads() == before


def test_an_exception_in_the_caller_stops_the_reader() -> None:
    closed: list[str] = []
    before = ahead_threads()
    with pytest.raises(KeyboardInterrupt):
        for item in read_ahead(numbers(1_000_000, closed), len, group_bytes=10, depth=1):
            if item == b"20":
                raise KeyboardInterrupt
    assert closed == ["read-ahead"]
    assert ahead_threads() == before


# -- map_ahead ------------------------------------------------------------------------------------
def test_mapped_items_come_in_order_in_groups_of_any_size() -> None:
    for group_bytes, workers in ((1, 2), (7, 3), (1 << 20, 1)):
        got = list(
            map_ahead(lambda item: item + b"!", numbers(1000, []), len, workers=workers, group_bytes=group_bytes)
        )
        assert got == [b"%d!" % n for n in range(1000)]


def test_the_function_runs_on_several_threads_at_once() -> None:
    """Two items of two groups meet at a barrier: only threads working at the same time pass it."""
    meeting = threading.Barrier(2, timeout=10)

    def meet(item: bytes) -> str:
        if item in (b"0", b"1"):
            meeting.wait()
        return threading.current_thread().name

    names = list(map_ahead(meet, numbers(10, []), len, workers=2, group_bytes=1))
    assert names[0] != names[1] and all(name.startswith("map-ahead") for name in names)


def test_an_error_of_the_function_comes_after_the_items_before_it() -> None:
    def check(item: bytes) -> bytes:
        if item == b"500":
            raise ValueError("item 500 is bad")
        return item

    got = []
    with pytest.raises(ValueError, match="item 500 is bad"):
        for item in map_ahead(check, numbers(1000, []), len, workers=2, group_bytes=64):
            got.append(item)
    assert got == [b"%d" % n for n in range(500)]


def test_an_error_of_the_source_comes_after_the_items_before_it() -> None:
    closed: list[str] = []
    got = []
    with pytest.raises(OSError, match="reading item 500"):
        for item in map_ahead(bytes, numbers(1000, closed, fail_at=500), len, workers=2, group_bytes=64):
            got.append(item)
    assert got == [b"%d" % n for n in range(500)]
    assert closed == ["MainThread"]  # (the source is read in the caller's thread)


def test_closing_early_waits_for_the_workers() -> None:
    before = ahead_threads()
    started = threading.Event()

    def slow(item: bytes) -> bytes:
        started.set()
        time.sleep(0.001)
        return item

    items = map_ahead(slow, numbers(1_000_000, []), len, workers=2, group_bytes=10)
    assert next(items) == b"0"
    items.close()
    assert started.is_set() and ahead_threads() == before
