"""Names in a log dir: what is a partition dir and what is not."""

from __future__ import annotations

from pathlib import Path

import pytest

from seglogfs.engine import DataDir
from seglogfs.engine.errors import InvalidTopicError
from seglogfs.engine.log.naming import colliding_topic, parse_partition_dir
from tests.conftest import NOW_MS, broker_config


@pytest.mark.parametrize(
    ("name", "parsed"),
    [
        ("orders-3", ("orders", 3)),
        ("my-topic-10", ("my-topic", 10)),
        ("t-²", None),  # a digit to str.isdigit, not a partition number
        ("t-٣", None),
        ("t-", None),
        ("-1", None),
        ("t-1.abc-delete", None),
    ],
)
def test_parse_partition_dir(name: str, parsed: tuple[str, int] | None) -> None:
    assert parse_partition_dir(name) == parsed


def test_a_stray_directory_does_not_stop_the_data_dir(log_dir: Path) -> None:
    (log_dir / "t-²").mkdir()  # made DataDir.open fail with ValueError
    with DataDir.open(broker_config(log_dir), now_ms=NOW_MS) as data_dir:
        data_dir.create_topic("t", 1, now_ms=NOW_MS)
        assert data_dir.topics() == {"t": [0]}


def test_kafkas_collision_rule() -> None:
    """Names that differ only by '.' against '_' at the same places collide (one metric name);
    a name never collides with itself, and '-' is no collision character."""
    assert colliding_topic("a_b", ["a.b", "ab", "a-b"]) == "a.b"
    assert colliding_topic("a.b_c", ["a_b.c", "a_b_c"]) == "a_b.c"  # the first by name
    assert colliding_topic("a.b", ["a.b"]) is None
    assert colliding_topic("a-b", ["a_b", "a.b"]) is None
    assert colliding_topic("ab", ["a.b"]) is None


def test_colliding_names_are_refused_at_creation(log_dir: Path) -> None:
    with DataDir.open(broker_config(log_dir), now_ms=NOW_MS) as data_dir:
        data_dir.create_topic("metrics.cpu", 1, now_ms=NOW_MS)
        said = r"^Topic 'metrics_cpu' collides with existing topic: metrics\.cpu$"
        with pytest.raises(InvalidTopicError, match=said):
            data_dir.create_topic("metrics_cpu", 1, now_ms=NOW_MS)
        with pytest.raises(InvalidTopicError, match="collides"):
            data_dir.partition_for_append("metrics_cpu", None, now_ms=NOW_MS)  # produce's auto-create
        assert data_dir.topics() == {"metrics.cpu": [0]}
