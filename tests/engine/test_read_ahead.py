"""engine.read_ahead: the source's items in order, its error after the items before it, and an
early close that stops the worker thread and closes the source in it."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from seglogfs.engine.read_ahead import read_ahead


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


def test_closing_early_stops_the_reader_and_closes_the_source_in_it() -> None:
    """The reader is blocked on a full hand-over queue when the caller stops (`| head`): the
    close returns once the reader has let go of the source."""
    closed: list[str] = []
    before = threading.active_count()
    items = read_ahead(numbers(1_000_000, closed), len, group_bytes=10, depth=1)
    assert next(items) == b"0"
    items.close()
    assert closed == ["read-ahead"]
    assert threading.active_count() == before


def test_an_exception_in_the_caller_stops_the_reader() -> None:
    closed: list[str] = []
    before = threading.active_count()
    with pytest.raises(KeyboardInterrupt):
        for item in read_ahead(numbers(1_000_000, closed), len, group_bytes=10, depth=1):
            if item == b"20":
                raise KeyboardInterrupt
    assert closed == ["read-ahead"]
    assert threading.active_count() == before
