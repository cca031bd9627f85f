"""Data dirs written by real Kafka brokers, mounted read-only: every partition's records.jsonl
equals kafka-python's decoding of the broker's files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.engine.test_fixtures import (
    DATA_DIRS,
    _expected_json,
    _is_partition_dir,
    _topic_partition,
    assert_same_sequence,
    expected_user_records,
)
from tests.fs.conftest import Mount


@pytest.mark.parametrize("data_dir", DATA_DIRS, ids=[d.name for d in DATA_DIRS])
def test_broker_data_dir_mounted_read_only(mount, data_dir: Path) -> None:
    m: Mount = mount(data_dir, "-o", "ro")
    partitions = [p for p in sorted(data_dir.iterdir()) if _is_partition_dir(p)]
    assert partitions
    for partition_dir in partitions:
        topic, partition = _topic_partition(partition_dir)
        _start, _end, expected = expected_user_records(partition_dir)
        view = m.path / topic / str(partition) / "records.jsonl"
        data = view.read_bytes()
        assert view.stat().st_size == len(data)
        actual = [json.loads(line) for line in data.split(b"\n")[:-1]]
        assert_same_sequence(
            [_expected_json(r, topic, partition) for r in expected], actual, f"{view} against kafka-python"
        )
    with pytest.raises(OSError):  # read-only: nothing can be appended
        (m.path / topic / str(partition) / "append").write_bytes(b"x\n")
