"""Large appends have their blocks allocated before they are written where the file system
delays allocation (ext4, on a loop-mounted image here): the segment's size is never changed by
it, a full disk fails the append as before (ENOSPC naming the segment, nothing kept of it,
nothing left allocated past the end), and elsewhere (tmpfs) nothing is allocated ahead."""

from __future__ import annotations

import errno
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from seglogfs.engine import _core
from seglogfs.engine.log import file_records as file_records_module
from tests.conftest import NOW_MS, make_log, unmount
from tests.engine.test_log import reopen


def loop_mounted(tmp_path: Path, kind: str) -> Iterator[Path]:
    """A 16 MiB file system of `kind` on a loop device, unmounted after the test."""
    image, where = tmp_path / f"{kind}.img", tmp_path / kind
    with open(image, "wb") as handle:
        handle.truncate(16 << 20)
    subprocess.run([f"mkfs.{kind}", "-q", "-F", str(image)], check=True)
    where.mkdir()
    subprocess.run(["mount", "-o", "loop", str(image), str(where)], check=True)
    try:
        yield where
    finally:
        unmount(where)


@pytest.fixture
def small_ext4(tmp_path: Path) -> Iterator[Path]:
    yield from loop_mounted(tmp_path, "ext4")


@pytest.fixture
def small_ext2(tmp_path: Path) -> Iterator[Path]:
    yield from loop_mounted(tmp_path, "ext2")


@pytest.fixture
def allocations(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The lengths the segment asks allocated ahead, each asked of the real call."""
    asked: list[int] = []

    def allocate_ahead(fd: int, offset: int, length: int) -> int:
        asked.append(length)
        return _core.allocate_ahead(fd, offset, length)

    monkeypatch.setattr(file_records_module, "_core", _Spy(allocate_ahead))
    return asked


class _Spy:
    """The core, with `allocate_ahead` counted."""

    def __init__(self, allocate_ahead: object) -> None:
        self.allocate_ahead = allocate_ahead

    def __getattr__(self, name: str) -> object:
        return getattr(_core, name)


def allocated_past_end(path: Path) -> int:
    """Bytes allocated to the file beyond its data's blocks: a few blocks of its extent tree,
    or the blocks of an append allocated and never written."""
    status, block = os.stat(path), os.statvfs(path).f_bsize
    return status.st_blocks * 512 - -(-status.st_size // block) * block


TREE_BYTES = 16 * 1024  # (its extent tree's blocks: far below an append's 330 KB)


def test_a_full_ext4_fails_the_large_append_and_keeps_nothing_of_it(small_ext4: Path, allocations: list[int]) -> None:
    log = make_log(small_ext4 / "t-0", segment_bytes=2**31 - 1)
    try:
        segment = log.active_segment.log_path
        values = [os.urandom(100)] * 3000  # (a batch of about 330 KB)
        log.append_records([b"small"], now_ms=NOW_MS)
        assert allocations == []  # (a small append: the call would cost more than it saves)
        appended = 1
        with pytest.raises(OSError) as raised:
            while True:
                log.append_records(values, now_ms=NOW_MS)
                appended += len(values)
                assert allocated_past_end(segment) < TREE_BYTES  # the file's size is the data's
        assert raised.value.errno == errno.ENOSPC and str(segment) in str(raised.value)
        assert len(allocations) > 30 and all(length >= 128 * 1024 for length in allocations)
        assert log.log_end_offset == appended
        assert allocated_past_end(segment) < TREE_BYTES  # what the failed append allocated is freed
        log = reopen(log, clean=False, recovery_point=0)
        assert log.log_end_offset == appended
        assert sum(1 for _ in log.records(0)) == appended
    finally:
        log.close()


def test_recovery_frees_what_a_crash_left_allocated_past_the_end(small_ext4: Path) -> None:
    """A kill between a large append's allocation and its write leaves blocks allocated past
    the segment's end: recovery cuts the segment at its valid end, which frees them."""
    log = make_log(small_ext4 / "t-0")
    try:
        log.append_records([os.urandom(100)] * 3000, now_ms=NOW_MS)
        segment = log.active_segment.log_path
        with open(segment, "rb+") as handle:  # (as the crash left it)
            assert _core.allocate_ahead(handle.fileno(), segment.stat().st_size, 4 << 20) == 0
        assert allocated_past_end(segment) >= 4 << 20
        os.utime(segment, ns=(NOW_MS * 1_000_000, NOW_MS * 1_000_000))
        log = reopen(log, clean=False, recovery_point=0)
        assert allocated_past_end(segment) < TREE_BYTES
        assert log.log_end_offset == 3000
        # (retention goes by the modification time where records carry no timestamps)
        assert segment.stat().st_mtime_ns == NOW_MS * 1_000_000
    finally:
        log.close()


def test_ext2_which_shares_ext4s_magic_number_is_asked_once(small_ext2: Path, allocations: list[int]) -> None:
    log = make_log(small_ext2 / "t-0")
    try:
        for _ in range(3):
            log.append_records([os.urandom(100)] * 3000, now_ms=NOW_MS)
        assert len(allocations) == 1 and log.log_end_offset == 9000
    finally:
        log.close()


def test_elsewhere_nothing_is_allocated_ahead(small_tmpfs: Path, allocations: list[int]) -> None:
    log = make_log(small_tmpfs / "t-0")
    try:
        log.append_records([os.urandom(100)] * 3000, now_ms=NOW_MS)
        assert allocations == [] and log.log_end_offset == 3000
    finally:
        log.close()
