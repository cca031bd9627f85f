"""The one cache of rendered pages (fs.page_cache.PAGES): a page is kept once, however it was
rendered — whole by the core (alone, or in a run rendered ahead of a reader) or batch by batch
(what a look-up of an offset needs) — and every reader takes it from there: a page a look-up
rendered batch by batch is not rendered again by the core for a sequential reader, nor asked
ahead; a rendering whole never replaces one batch by batch; a page rendered for other bounds
(the growing segment's last page, grown since) is not the page; the bytes kept stay within the
cache's bound, the least recently used going first."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from seglogfs.engine.text.console_formats import TextFormat
from seglogfs.engine.text.renderers import RenderedBatch, TextRenderer
from seglogfs.fs import page_cache
from seglogfs.fs.page_cache import PageCache, RenderedSpan
from seglogfs.fs.views import Layout, View
from tests.fs.test_views import (
    RangeCountingRenderer,
    expected_text,
    many_batches,
    read_as_the_mount_does,
    small_ahead,  # noqa: F401 (a fixture)
    views_log,
)


def batch_page(text: bytes) -> page_cache.Page:
    rendered = RenderedBatch(text, np.array([0]), np.array([len(text)]))
    return [(None, rendered)]  # type: ignore[list-item]  # (no header is looked at here)


class FileRangeRenderer(RangeCountingRenderer):
    """`RangeCountingRenderer`, also noting the file (inode) of each range the core renders."""

    def __init__(self, renderer) -> None:
        super().__init__(renderer)
        self.files: list[tuple[int, int, int]] = []

    def render_range(self, fd, start, end, size, *, nowait=False):
        self.files.append((os.fstat(fd).st_ino, start, end))
        return super().render_range(fd, start, end, size, nowait=nowait)


def test_a_page_is_kept_once_and_a_batch_by_batch_rendering_is_never_replaced_by_a_whole_one() -> None:
    cache = PageCache(1 << 20)
    key, bounds = ("layout", "segment", 0, 3), (100, 200)
    whole = RenderedSpan(b"abcdef", 0, 6, 6, 3)
    cache.put(key, bounds, whole)
    assert cache.get(key, bounds) is whole and cache.holds(key)
    assert cache.batches(key, bounds) is None  # (the look-up of an offset renders it batch by batch)
    batches = batch_page(b"abcdef")
    cache.put(key, bounds, batches)
    assert cache.get(key, bounds) is batches
    cache.put(key, bounds, RenderedSpan(b"abcdef", 0, 6, 6, 3))  # (a run rendered ahead, late)
    assert cache.get(key, bounds) is batches
    assert cache.get(key, (100, 250)) is None  # (the page grew since: not this rendering)
    grown = batch_page(b"abcdefgh")
    cache.put(key, (100, 250), grown)
    assert cache.get(key, (100, 250)) is grown and cache.get(key, bounds) is None


def test_the_bytes_kept_stay_within_the_bound_least_recently_used_first() -> None:
    cache = PageCache(10_000)
    spans = {mark: RenderedSpan(bytes(3000), 0, 3000, 3000, mark) for mark in range(5)}
    for mark in range(3):
        cache.put(("l", "s", 0, mark), (mark, mark + 1), spans[mark])
    assert cache.get(("l", "s", 0, 0), (0, 1)) is spans[0]  # (used: the last to go now)
    cache.put(("l", "s", 0, 3), (3, 4), spans[3])
    assert not cache.holds(("l", "s", 0, 1))
    assert all(cache.holds(("l", "s", 0, mark)) for mark in (0, 2, 3))
    cache.put(("l", "s", 0, 4), (4, 5), batch_page(bytes(5000)))
    assert cache.holds(("l", "s", 0, 4)) and sum(cache.holds(("l", "s", 0, m)) for m in range(4)) <= 1


@pytest.mark.usefixtures("small_ahead")
def test_pages_a_look_up_rendered_are_what_a_sequential_reader_reads(tmp_path: Path) -> None:
    """The first segment's pages rendered batch by batch (as finding an offset in them does):
    a reader of the whole view reads them from the cache, and the core renders none of them,
    neither ahead of the reader nor for it."""
    log = views_log(tmp_path / "t-0", **{"segment.bytes": "20000"})
    many_batches(log)
    renderer = FileRangeRenderer(TextRenderer(TextFormat(), 0))
    layout = Layout(log, renderer, mark_bytes=512)
    view = View(layout, 0)
    view.size()
    first = layout._published[0][0]
    for mark in range(first.complete_pages):
        layout.pages.page(first, mark)
    rendered_one_by_one = renderer.batches
    assert rendered_one_by_one > 0
    assert read_as_the_mount_does(view, 1000) == expected_text(log, 0, TextFormat())
    assert renderer.files  # (the other segments: whole, by the core)
    first_file = os.stat(first.segment.log_path).st_ino
    assert [f for f in renderer.files if f[0] == first_file] == []
    log.close()
