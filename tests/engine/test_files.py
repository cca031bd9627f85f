"""Opening files in an untrusted data dir: links, FIFOs, sockets, devices and directories are
refused by name, without being followed, opened or waited on."""

from __future__ import annotations

import os
import socket
import stat
from pathlib import Path

import pytest

from seglogfs.engine.errors import UnsafeFileError
from seglogfs.engine.files import is_directory, is_regular, open_regular, read_regular


def test_a_regular_file_opens_blocking(tmp_path: Path) -> None:
    path = tmp_path / "00000000000000000000.log"
    path.write_bytes(b"abc")
    fd = open_regular(path)
    try:
        assert os.read(fd, 10) == b"abc"
        assert os.get_blocking(fd)
        assert os.get_inheritable(fd) is False
    finally:
        os.close(fd)


def test_a_created_file_is_regular(tmp_path: Path) -> None:
    path = tmp_path / "new.log"
    fd = open_regular(path, os.O_RDWR | os.O_CREAT)
    os.close(fd)
    assert stat.S_ISREG(os.lstat(path).st_mode)


@pytest.mark.parametrize("flags", [os.O_RDONLY, os.O_RDWR, os.O_WRONLY | os.O_APPEND, os.O_RDWR | os.O_CREAT])
def test_a_link_is_refused_and_its_target_untouched(tmp_path: Path, flags: int) -> None:
    target = tmp_path / "victim"
    target.write_bytes(b"secret")
    link = tmp_path / "00000000000000000100.log"
    link.symlink_to(target)
    with pytest.raises(UnsafeFileError, match=r"00000000000000000100\.log: a symbolic link where a regular file"):
        open_regular(link, flags)
    assert target.read_bytes() == b"secret"


def test_a_dangling_link_is_refused_even_where_creating(tmp_path: Path) -> None:
    link = tmp_path / "00000000000000000100.log"
    link.symlink_to(tmp_path / "would-be-created")
    with pytest.raises(UnsafeFileError, match="symbolic link"):
        open_regular(link, os.O_RDWR | os.O_CREAT)
    assert not (tmp_path / "would-be-created").exists()


@pytest.mark.parametrize("flags", [os.O_RDONLY, os.O_WRONLY, os.O_RDWR | os.O_CREAT])
def test_a_fifo_is_refused_without_waiting(tmp_path: Path, flags: int) -> None:
    fifo = tmp_path / "00000000000000000100.log"
    os.mkfifo(fifo)
    with pytest.raises(UnsafeFileError, match="a FIFO"):
        open_regular(fifo, flags)


@pytest.mark.parametrize("flags", [os.O_RDONLY, os.O_RDWR, os.O_RDWR | os.O_CREAT])
def test_a_directory_is_refused(tmp_path: Path, flags: int) -> None:
    directory = tmp_path / "00000000000000000100.log"
    directory.mkdir()
    with pytest.raises(UnsafeFileError, match="a directory"):
        open_regular(directory, flags)


def test_a_socket_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "s.index"
    server = socket.socket(socket.AF_UNIX)
    try:
        server.bind(str(path))
        with pytest.raises(UnsafeFileError, match="a socket"):
            open_regular(path)
    finally:
        server.close()


def test_a_device_is_refused_without_being_opened() -> None:
    with pytest.raises(UnsafeFileError, match="a character device"):
        open_regular("/dev/null")


def test_a_missing_file_is_file_not_found(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        open_regular(tmp_path / "absent")


def test_read_regular_reads_a_small_file_and_refuses_a_large_one(tmp_path: Path) -> None:
    path = tmp_path / "recovery-point-offset-checkpoint"
    path.write_bytes(b"0\n0\n")
    assert read_regular(path, limit=4) == b"0\n0\n"
    with pytest.raises(UnsafeFileError, match="a file of 4 bytes"):
        read_regular(path, limit=3)


def test_is_directory_and_is_regular_do_not_follow_links(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    (tmp_path / "f").write_bytes(b"")
    (tmp_path / "ld").symlink_to(tmp_path / "d")
    (tmp_path / "lf").symlink_to(tmp_path / "f")
    assert is_directory(tmp_path / "d") and not is_directory(tmp_path / "ld")
    assert is_regular(tmp_path / "f") and not is_regular(tmp_path / "lf")
    assert not is_directory(tmp_path / "absent") and not is_regular(tmp_path / "absent")
