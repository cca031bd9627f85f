"""Views against a straight rendering of the partition: size and every byte range."""

from __future__ import annotations

import random
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from engine import BrokerConfig, PartitionLog
from engine.config import apply_topic_overrides
from engine.console import TextFormat, record_to_json
from fs.views import Layout, View, jsonl_renderer, text_renderer
from tests.conftest import NOW_MS


def make_log(directory: Path, **overrides: str) -> PartitionLog:
    base = BrokerConfig.load(log_dirs=[directory.parent]).topic_defaults
    config = apply_topic_overrides(base, {"segment.bytes": "2000", **overrides})
    return PartitionLog.create(directory, "t", 0, config, topic_id="AAAAAAAAAAAAAAAAAAAAAA", now_ms=NOW_MS)


def expected_text(log: PartitionLog, start: int, text_format: TextFormat) -> bytes:
    return b"".join(text_format.render(r, 0) for r in log.records(start))


def expected_jsonl(log: PartitionLog, start: int) -> bytes:
    return b"".join(record_to_json(r, "t", 0).encode() + b"\n" for r in log.records(start))


@settings(max_examples=25, deadline=None)
@given(
    st.lists(st.lists(st.binary(max_size=120), min_size=1, max_size=20), min_size=0, max_size=25),
    st.integers(0, 200),
    st.integers(1, 4096),
    st.randoms(use_true_random=False),
)
def test_view_bytes_equal_a_full_rendering(tmp_path_factory, batches, start, mark_bytes, rng: random.Random) -> None:
    root = tmp_path_factory.mktemp("logs")
    log = make_log(root / "t-0")
    text_format = TextFormat(print_offset=True, print_key=True)
    # Views from different offsets share one layout per format, as the mount's do.
    text_layout = Layout(log, text_renderer(text_format, 0), mark_bytes=mark_bytes)
    jsonl_layout = Layout(log, jsonl_renderer("t", 0), mark_bytes=mark_bytes)
    text, jsonl = View(text_layout, start), View(jsonl_layout, start)
    whole = View(text_layout, 0)
    for values in batches:
        log.append_records(values, keys=[b"k"] * len(values), now_ms=NOW_MS)
        if rng.random() < 0.5:  # look in between appends too: views grow incrementally
            for view, expected in ((text, expected_text(log, start, text_format)), (jsonl, expected_jsonl(log, start))):
                assert view.size() == len(expected)
    checks = [
        (text, expected_text(log, start, text_format)),
        (jsonl, expected_jsonl(log, start)),
        (whole, expected_text(log, 0, text_format)),
    ]
    for view, expected in checks:
        assert view.size() == len(expected)
        assert view.read(0, len(expected) + 10) == expected
        for _ in range(20):
            position = rng.randrange(len(expected) + 5)
            length = rng.randrange(1, 3000)
            assert view.read(position, length) == expected[position : position + length]
    log.close()
