"""The engine's small files and partition dirs as others may leave them: a link, a FIFO, a
directory where a file belongs, bytes that are not text. Each read answers at once, names the
file (and the line), and never follows the link."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from seglogfs.engine import BrokerConfig, DataDir
from seglogfs.engine.config import read_properties
from seglogfs.engine.errors import ConfigError, LogOfflineError
from seglogfs.engine.files import decode_text
from seglogfs.engine.log.checkpoint import CheckpointError, read_offset_checkpoint, read_partition_metadata
from seglogfs.engine.log.naming import linked_partition_dirs, partition_dirs

NOW_MS = 1_700_000_000_000


def test_decode_text_names_the_line_and_column() -> None:
    with pytest.raises(ConfigError, match=r"^f: line 3, column 4: byte 0xff is not UTF-8 text$"):
        decode_text("f", b"a\nb\nxyz\xff\n", ConfigError)
    assert decode_text("f", "é\n".encode(), ConfigError) == "é\n"


@pytest.mark.parametrize("kind", ["link", "fifo", "directory"])
def test_a_checkpoint_that_is_no_regular_file_is_a_checkpoint_error_naming_it(tmp_path: Path, kind: str) -> None:
    target = tmp_path / "elsewhere"
    target.write_text("0\n1\nt 0 5\n")
    path = tmp_path / "recovery-point-offset-checkpoint"
    {"link": lambda: path.symlink_to(target), "fifo": lambda: os.mkfifo(path), "directory": path.mkdir}[kind]()
    with pytest.raises(CheckpointError, match=f"^{path}: a .* where a regular file belongs: refused$"):
        read_offset_checkpoint(path)
    with pytest.raises(CheckpointError, match=f"^{path}: "):
        read_partition_metadata(path)


def test_bad_bytes_name_the_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "meta.properties"
    path.write_bytes(b"version=1\nnode.id=\xff\n")
    with pytest.raises(ConfigError, match=f"^{path}: line 2, column 9: byte 0xff is not UTF-8 text$"):
        read_properties(path, in_data_dir=True)
    checkpoint = tmp_path / "log-start-offset-checkpoint"
    checkpoint.write_bytes(b"0\n1\n\xfe 0 1\n")
    with pytest.raises(CheckpointError, match=f"^{checkpoint}: line 3, column 1: byte 0xfe"):
        read_offset_checkpoint(checkpoint)


@pytest.mark.expect_warnings("where a partition directory belongs: refused")
def test_a_linked_partition_dir_is_listed_apart_and_opened_offline(tmp_path: Path) -> None:
    data, elsewhere = tmp_path / "data", tmp_path / "elsewhere"
    config = BrokerConfig.load(log_dirs=[data])
    with DataDir.open(config, now_ms=NOW_MS) as data_dir:
        data_dir.create_topic("t", 1, now_ms=NOW_MS)
    elsewhere.mkdir()
    (data / "t-1").symlink_to(elsewhere)
    assert [name for name, _, _ in partition_dirs(data)] == ["t-0"]
    assert linked_partition_dirs(data) == [("t-1", "t", 1)]
    with DataDir.open(config, now_ms=NOW_MS) as data_dir:
        log = data_dir.partition("t", 1)
        assert log.offline_reason == f"{data / 't-1'}: a symbolic link where a partition directory belongs: refused"
        with pytest.raises(LogOfflineError, match="t-1 is offline"):
            log.append_records([b"x"], now_ms=NOW_MS)
        data_dir.partition("t", 0).append_records([b"y"], now_ms=NOW_MS)
    assert os.listdir(elsewhere) == []


@pytest.mark.expect_warnings("a FIFO where a regular file belongs: refused")
def test_a_fifo_named_like_a_segment_takes_the_partition_offline_for_every_opener(tmp_path: Path) -> None:
    data = tmp_path / "data"
    config = BrokerConfig.load(log_dirs=[data])
    with DataDir.open(config, now_ms=NOW_MS) as data_dir:
        data_dir.create_topic("t", 2, now_ms=NOW_MS)
    os.mkfifo(data / "t-0" / "00000000000000000007.log")
    for read_only in (True, False):
        with DataDir.open(config, read_only=read_only, now_ms=NOW_MS) as data_dir:
            reason = data_dir.partition("t", 0).offline_reason
            assert reason is not None and reason.startswith(f"{data / 't-0' / '00000000000000000007.log'}: a FIFO")
            assert data_dir.partition("t", 1).offline_reason is None


@pytest.mark.expect_warnings("t-0 is offline: .* where a partition directory belongs: refused")
def test_a_readers_partition_dir_replaced_by_a_link_is_not_followed(tmp_path: Path) -> None:
    """A reader beside a writer (a read-only mount) looks at each partition's directory again:
    one replaced by a link since the open takes the partition offline, nothing behind it read."""
    data, elsewhere = tmp_path / "data", tmp_path / "elsewhere"
    config = BrokerConfig.load(log_dirs=[data])
    with DataDir.open(config, now_ms=NOW_MS) as data_dir:
        data_dir.create_topic("t", 1, now_ms=NOW_MS)
        data_dir.partition("t", 0).append_records([b"a"], now_ms=NOW_MS)
    with DataDir.open(config, read_only=True, now_ms=NOW_MS) as data_dir:
        log = data_dir.partition("t", 0)
        (data / "t-0").rename(elsewhere)
        (data / "t-0").symlink_to(elsewhere)
        assert log.refresh(NOW_MS)
        assert log.offline_reason == f"{data / 't-0'}: a symbolic link where a partition directory belongs: refused"
        with pytest.raises(LogOfflineError):
            list(log.batches(0))
