"""`<topic>/<p>/append.batches`: encoded record batches, appended at the close of each open, all of
them or none. Real tools on a real mount: `cat >` (O_TRUNC, FUSE's split writes), Python
writes and fsync; the unhappy paths answer the close with an errno, append nothing of that open
and leave the mount up: a cut batch, a bad CRC, a batch over max.message.bytes, over 64 MiB in
one open, a full disk."""

from __future__ import annotations

import errno
import os
import stat
import subprocess
from pathlib import Path

import pytest
from kafka.record.default_records import DefaultRecordBatch

from seglogfs.engine.check import check_log_dirs
from seglogfs.engine.record.builder import build_batch
from seglogfs.fs.append_file import BATCHES_PER_OPEN_BYTES
from tests.conftest import NOW_MS
from tests.fs.conftest import REFUSED, Mount
from tests.fs.test_faults import fill, small_disk  # noqa: F401 (a fixture)


def batches(first: int, count: int, per_batch: int = 10, size: int = 20) -> bytes:
    """`count` records from value number `first`, `per_batch` to a batch, base offsets all 0 (the
    append assigns them)."""
    out = b""
    for start in range(first, first + count, per_batch):
        values = [b"v%06d-" % i + b"x" * size for i in range(start, min(start + per_batch, first + count))]
        out += build_batch(values, keys=[b"k%d" % (i % 3) for i in range(len(values))], timestamps=NOW_MS)
    return out


def records(m: Mount, topic: str = "t", partition: int = 0) -> list[bytes]:
    return (m.path / topic / str(partition) / "records").read_bytes().splitlines()


def expected(first: int, count: int, size: int = 20) -> list[bytes]:
    return [b"v%06d-" % i + b"x" * size for i in range(first, first + count)]


def close_error(path: Path, data: bytes) -> int:
    """The errno the write or the close of one open writing `data` fails with."""
    fd = os.open(path, os.O_WRONLY)
    view = memoryview(data)
    try:
        while view:  # as `cat` writes: the rest after a short write
            view = view[os.write(fd, view) :]
    except OSError as error:
        try:
            os.close(fd)
        except OSError as closing:
            assert closing.errno == error.errno
        return error.errno
    try:
        os.close(fd)
    except OSError as error:
        return error.errno
    raise AssertionError(f"writing {len(data)} bytes to {path} did not fail")


@pytest.mark.expect_warnings(REFUSED)
def test_batches_are_appended_at_close_with_offsets_assigned(mount, tmp_path: Path) -> None:
    m: Mount = mount(tmp_path / "data")
    (m.path / "t").mkdir()
    target = m.path / "t" / "0" / "append.batches"
    assert "append.batches" in os.listdir(m.path / "t" / "0")
    staged = tmp_path / "staged.batches"
    staged.write_bytes(batches(0, 3000, per_batch=100, size=200))  # 680 kB: many FUSE writes
    subprocess.run(f"cat {staged} > {target}", shell=True, check=True)
    assert records(m) == expected(0, 3000, size=200)
    with open(target, "ab") as handle:
        handle.write(batches(3000, 25))
        os.fsync(handle.fileno())
    assert records(m)[3000:] == expected(3000, 25)
    # The log holds the batches as written, offsets from the log end (the CRC does not cover them).
    log = (tmp_path / "data" / "t-0" / "00000000000000000000.log").read_bytes()
    tail = log[-len(batches(3000, 25)) :]
    bases = []
    while tail:
        size = int.from_bytes(tail[8:12], "big") + 12
        batch = DefaultRecordBatch(tail[:size])
        assert batch.validate_crc()
        bases.append(batch.base_offset)
        tail = tail[size:]
    assert bases == [3000, 3010, 3020]
    assert os.stat(target).st_size == 0
    with pytest.raises(PermissionError):
        target.read_bytes()


@pytest.mark.expect_warnings(REFUSED)
def test_bad_input_appends_nothing_of_its_open_and_the_mount_stays_up(mount, tmp_path: Path) -> None:
    m: Mount = mount(tmp_path / "data", "-o", "message.max.bytes=5000")
    (m.path / "t").mkdir()
    target = m.path / "t" / "0" / "append.batches"
    good = batches(0, 20)
    target.write_bytes(good)
    cut = good + batches(20, 10)[:-7]
    bad_crc = bytearray(good + batches(20, 10))
    bad_crc[-3] ^= 0xFF
    too_large = good + batches(20, 100, per_batch=100, size=100)
    assert close_error(target, cut) == errno.EINVAL
    assert close_error(target, bytes(bad_crc)) == errno.EINVAL
    assert close_error(target, too_large) == errno.EFBIG
    assert close_error(target, os.urandom(4000)) == errno.EINVAL
    assert close_error(target, b"\0" * (BATCHES_PER_OPEN_BYTES + 1)) == errno.EFBIG
    assert records(m) == expected(0, 20)
    assert m.process.poll() is None
    target.write_bytes(batches(20, 5))
    assert records(m) == expected(0, 25)
    log = m.output()
    assert "incomplete record batch" in log and "over max.message.bytes=5000" in log and "64 MiB" in log


@pytest.mark.expect_warnings(r"t/0/append.batches: .*No space left on device")
def test_a_full_disk_appends_nothing_of_the_open(mount, small_disk: Path) -> None:  # noqa: F811
    m: Mount = mount(small_disk / "data")
    (m.path / "t").mkdir()
    target = m.path / "t" / "0" / "append.batches"
    target.write_bytes(batches(0, 100))
    filler = fill(small_disk)
    assert close_error(target, batches(100, 4000, per_batch=100, size=100)) == errno.ENOSPC
    assert records(m) == expected(0, 100)
    assert m.process.poll() is None
    filler.unlink()
    target.write_bytes(batches(100, 50))
    assert records(m) == expected(0, 150)
    m.stop()  # before the disk goes
    assert check_log_dirs([small_disk / "data"]).clean


@pytest.mark.expect_warnings(REFUSED)
def test_a_read_only_mount_refuses_batches(mount, tmp_path: Path) -> None:
    data = tmp_path / "data"
    first: Mount = mount(data)
    (first.path / "t").mkdir()
    first.stop()
    m: Mount = mount(data, "-o", "ro")
    target = m.path / "t" / "0" / "append.batches"
    assert stat.S_IMODE(target.stat().st_mode) == 0  # nothing may open it
    with pytest.raises(OSError) as refused:
        os.open(target, os.O_WRONLY)
    assert refused.value.errno in (errno.EROFS, errno.EACCES)
    assert records(m) == []
