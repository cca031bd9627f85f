"""Bad input through the mount: the right errno, a log line naming what and where, nothing
stored lost, the mount still serving. One table, one mount."""

from __future__ import annotations

import errno
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from seglogfs.engine import BrokerConfig, DataDir
from tests.conftest import NOW_MS
from tests.fs.conftest import REFUSED, Mount


def write(path: Path, data: bytes) -> None:
    with open(path, "ab", buffering=0) as handle:
        handle.write(data)


def write_parts(path: Path, *sizes: int) -> None:
    """Writes of `sizes` bytes without a newline through one descriptor."""
    with open(path, "ab", buffering=0) as handle:
        for size in sizes:
            handle.write(b"y" * size)


def write_parts_then(path: Path, size: int, last: bytes) -> None:
    """A write of `size` bytes without a newline, then `last`, through one descriptor."""
    with open(path, "ab", buffering=0) as handle:
        handle.write(b"y" * size)
        handle.write(last)


def seek_append(path: Path) -> None:
    with open(path, "ab", buffering=0) as handle:
        os.lseek(handle.fileno(), 5, os.SEEK_SET)


def open_for_writing(path: Path) -> None:
    os.close(os.open(path, os.O_WRONLY))


CASES: list[tuple[str, Callable[[Path], object], int, str]] = [
    ("write to the text view", lambda m: open_for_writing(m / "t/0/records"), errno.EACCES, "t/0/records"),
    ("write to the JSON view", lambda m: open_for_writing(m / "t/0/records.jsonl"), errno.EACCES, "records.jsonl"),
    ("write to status", lambda m: open_for_writing(m / "t/0/status"), errno.EACCES, "t/0/status"),
    ("config with an unknown setting", lambda m: (m / "t/config").write_bytes(b"x.y=1\n"), errno.EINVAL, "x.y"),
    ("write to a by-offset view", lambda m: open_for_writing(m / "t/0/by-offset/0"), errno.EACCES, "by-offset/0"),
    ("read an append file", lambda m: (m / "t/0/append").read_bytes(), errno.EACCES, "write-only"),
    ("rename a view", lambda m: os.rename(m / "t/0/records", m / "t/0/x"), errno.EPERM, "rename t/0/records"),
    ("rename a topic", lambda m: os.rename(m / "t", m / "u"), errno.EPERM, "rename t to u: Kafka cannot rename"),
    ("unlink a view", lambda m: os.unlink(m / "t/0/records"), errno.EPERM, "unlink t/0/records"),
    ("unlink an append file", lambda m: os.unlink(m / "t/0/append"), errno.EPERM, "unlink t/0/append"),
    ("unlink config", lambda m: os.unlink(m / "t/config"), errno.EPERM, "unlink t/config: a topic dir holds append"),
    ("rename config", lambda m: os.rename(m / "t/config", m / "t/x"), errno.EPERM, "rename t/config to t/x: a topic"),
    ("rmdir a partition", lambda m: os.rmdir(m / "t/0"), errno.EPERM, "rmdir t/0: Kafka numbers"),
    ("rmdir .logdir", lambda m: os.rmdir(m / ".logdir"), errno.EPERM, "rmdir .logdir: the data dir's mirror"),
    ("rmdir a view's directory", lambda m: os.rmdir(m / "t/0/by-offset"), errno.EPERM, "rmdir t/0/by-offset"),
    ("truncate a view", lambda m: os.truncate(m / "t/0/records", 0), errno.EPERM, "truncate t/0/records"),
    ("truncate an append file to 5", lambda m: os.truncate(m / "t/0/append", 5), errno.EINVAL, "truncate t/0/append"),
    ("seek in an append file", lambda m: seek_append(m / "t/0/append"), errno.ESPIPE, ""),
    ("line over max.message.bytes", lambda m: write(m / "t/0/append", b"x" * 5000 + b"\n"), errno.EFBIG, "t/0/append"),
    ("partial line past max.message.bytes", lambda m: write_parts(m / "t/0/append", 1500), errno.EFBIG, "newline"),
    # (nothing of a refused line is stored at the close: not the part written before it was refused)
    ("partial line grown past max.message.bytes", lambda m: write_parts(m / "t/0/append", 600, 600), errno.EFBIG, ""),
    (
        "a write ending a partial line too long for a record",
        lambda m: write_parts_then(m / "t/0/append", 600, b"y" * 600 + b"\n"),
        errno.EFBIG,
        "t/0/append",
    ),
    ("topic name with a space", lambda m: os.mkdir(m / "bad name"), errno.EINVAL, "mkdir bad name"),
    ("topic name of 250 characters", lambda m: os.mkdir(m / ("x" * 250)), errno.EINVAL, "mkdir xxx"),
    ("topic name '..'", lambda m: os.mkdir(m / "t" / ".."), errno.EEXIST, ""),
    ("existing topic", lambda m: os.mkdir(m / "t"), errno.EEXIST, ""),  # the kernel answers this one
    ("mkdir inside a topic", lambda m: os.mkdir(m / "t/new"), errno.EPERM, "mkdir t/new"),
    ("create a file at the top", lambda m: (m / "file").write_bytes(b"x"), errno.EPERM, "create file"),
    ("create a file in a partition", lambda m: (m / "t/0/x").write_bytes(b"x"), errno.EPERM, "create t/0/x"),
    ("symlink in a partition", lambda m: os.symlink("records", m / "t/0/link"), errno.EPERM, "symlink t/0/link"),
    ("hard link of a view", lambda m: os.link(m / "t/0/records", m / "t/0/l"), errno.EPERM, "link t/0/records"),
    ("non-numeric by-offset", lambda m: (m / "t/0/by-offset/abc").stat(), errno.ENOENT, "by-offset/abc: not an"),
    ("negative by-offset", lambda m: (m / "t/0/by-offset/-1").stat(), errno.ENOENT, "by-offset/-1: not an"),
    ("by-offset past the end", lambda m: (m / "t/0/by-offset/99").stat(), errno.ENOENT, "outside the log"),
    ("unparseable by-time", lambda m: (m / "t/0/by-time/soon").stat(), errno.ENOENT, "by-time/soon"),
    ("malformed JSON line", lambda m: write(m / "t/0/append.jsonl", b'{"value": \n'), errno.EINVAL, "line 1"),
    ("bad base64 in JSON", lambda m: write(m / "t/0/append.jsonl", b'{"value":{"base64":"!!"}}\n'), errno.EINVAL, ""),
    ("JSON that is not an object", lambda m: write(m / "t/0/append.jsonl", b"[1,2]\n"), errno.EINVAL, "line 1"),
    (
        "a bad line fails its whole write",
        lambda m: write(m / "t/0/append.jsonl", b'{"value":"ok"}\nnope\n'),
        errno.EINVAL,
        "line 2",
    ),
    ("unkeyed record to a compacted topic", lambda m: write(m / "c/0/append", b"v\n"), errno.EINVAL, "no key"),
    ("a partition that does not exist", lambda m: (m / "t/7/records").stat(), errno.ENOENT, ""),
    ("a topic that does not exist", lambda m: (m / "nope/0/records").stat(), errno.ENOENT, ""),
]


@pytest.fixture
def prepared(tmp_path: Path) -> Path:
    data = tmp_path / "data"
    with DataDir.open(BrokerConfig.load(log_dirs=[data]), now_ms=NOW_MS) as data_dir:
        data_dir.create_topic("t", 1, now_ms=NOW_MS)
        data_dir.create_topic("c", 1, {"cleanup.policy": "compact"}, now_ms=NOW_MS)
        data_dir.partition("t", 0).append_records([b"one", b"two"], now_ms=NOW_MS)
        data_dir.partition("c", 0).append_records([b"v"], keys=[b"k"], now_ms=NOW_MS)
    return data


@pytest.mark.expect_warnings(REFUSED)
def test_bad_input_table(mount, prepared: Path) -> None:
    m: Mount = mount(prepared, "-o", "message.max.bytes=1000")
    assert len(CASES) >= 25
    before = {name: (m.path / name).read_bytes() for name in ("t/0/records", "c/0/records.jsonl")}
    failures = []
    for what, action, expected, logged in CASES:
        log_before = len(m.output())
        try:
            action(m.path)
        except OSError as error:
            got = error.errno
        else:
            got = None
        said = m.output()[log_before:]
        if got != expected:
            failures.append(f"{what}: errno {got}, expected {expected}")
        elif logged and logged not in said:
            failures.append(f"{what}: no log line with {logged!r} in {said!r}")
        # Nothing stored lost, the mount still serving.
        for name, data in before.items():
            if (m.path / name).read_bytes() != data:
                failures.append(f"{what}: {name} changed")
    assert not failures, "\n".join(failures)
    assert m.process.poll() is None
    write(m.path / "t/0/append", b"three\n")
    assert (m.path / "t/0/records").read_bytes() == b"one\ntwo\nthree\n"


def test_read_only_mount_refuses_writes(mount, prepared: Path) -> None:
    m: Mount = mount(prepared, "-o", "ro")
    for action in (lambda: write(m.path / "t/0/append", b"x\n"), lambda: os.mkdir(m.path / "new")):
        with pytest.raises(OSError) as raised:
            action()
        assert raised.value.errno == errno.EROFS
    assert (m.path / "t/0/records").read_bytes() == b"one\ntwo\n"
