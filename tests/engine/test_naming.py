"""Names in a log dir: what is a partition dir and what is not."""

from __future__ import annotations

from pathlib import Path

import pytest

from seglogfs.engine import DataDir
from seglogfs.engine.naming import parse_partition_dir
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
