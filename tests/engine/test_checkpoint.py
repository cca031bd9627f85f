"""Kafka's checkpoint files (cases H 112–113, 120) and partition.metadata."""

from __future__ import annotations

from pathlib import Path

import pytest

from seglogfs.engine.log.checkpoint import (
    CheckpointError,
    read_offset_checkpoint,
    read_partition_metadata,
    write_offset_checkpoint,
    write_partition_metadata,
)


def test_offset_checkpoint_round_trips_and_is_replaced_whole(tmp_path: Path) -> None:
    # Case 112.
    path = tmp_path / "recovery-point-offset-checkpoint"
    write_offset_checkpoint(path, {("orders", 0): 12, ("orders", 1): 98, ("a-b.c", 3): 0})
    assert path.read_text().splitlines() == ["0", "3", "a-b.c 3 0", "orders 0 12", "orders 1 98"]
    assert read_offset_checkpoint(path) == {("orders", 0): 12, ("orders", 1): 98, ("a-b.c", 3): 0}
    write_offset_checkpoint(path, {("x", 0): 1})
    assert read_offset_checkpoint(path) == {("x", 0): 1}
    write_offset_checkpoint(path, {})
    assert read_offset_checkpoint(path) == {}
    assert not path.with_name(path.name + ".tmp").exists()


def test_a_missing_or_brand_new_empty_file_reads_as_empty(tmp_path: Path) -> None:
    assert read_offset_checkpoint(tmp_path / "absent") == {}
    (tmp_path / "empty").write_text("")
    assert read_offset_checkpoint(tmp_path / "empty") == {}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("1\n0\n", "unrecognised checkpoint version 1"),  # case 113: version + 1
        ("0\n2\nt 0 1\n", "expected 2 entries of 3 fields, found 1 lines"),
        ("0\nx\n", "malformed checkpoint header"),
        ("0\n1\nt zero 1\n", "malformed entry t zero 1"),
    ],
)
def test_unreadable_checkpoints_name_the_file_and_the_fault(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "log-start-offset-checkpoint"
    path.write_text(text)
    with pytest.raises(CheckpointError, match=message) as raised:
        read_offset_checkpoint(path)
    assert str(path) in str(raised.value)


def test_partition_metadata_round_trips(tmp_path: Path) -> None:
    path = tmp_path / "partition.metadata"
    assert read_partition_metadata(path) is None
    write_partition_metadata(path, "rq7bQkSnSg2mz1TfJq-9Bw")
    assert path.read_text() == "version: 0\ntopic_id: rq7bQkSnSg2mz1TfJq-9Bw\n"
    assert read_partition_metadata(path) == "rq7bQkSnSg2mz1TfJq-9Bw"
