"""The adapter without a mount: its one error table (what reaches the caller as which errno,
and what the log says), and when a read makes the kernel forget a file's size."""

from __future__ import annotations

import errno
import logging
from typing import Any, cast

import pyfuse3
import pytest
import trio

from seglogfs.engine.errors import ConfigError, CorruptRecordError, RecordTooLargeError
from seglogfs.fs.node import Changes, Handle, Node, NoEntry, Refused
from seglogfs.fs.operations import Operations, _errors


def raised(error: BaseException) -> int:
    with pytest.raises(pyfuse3.FUSEError) as caught, _errors("read t/0/records"):
        raise error
    return caught.value.errno


@pytest.mark.expect_warnings(r"\(E[A-Z]+\)$", "unexpected error")
@pytest.mark.parametrize(
    ("error", "number"),
    [
        (Refused(errno.EPERM, "rename t"), errno.EPERM),
        (NoEntry("lookup t/9"), errno.ENOENT),
        (ConfigError("t/config line 1: unknown topic config 'x'"), errno.EINVAL),
        (RecordTooLargeError("t-0: a batch over max.message.bytes"), errno.EFBIG),
        (CorruptRecordError("/d/t-0/0.log", 12, "bad CRC"), errno.EIO),
        (OSError(errno.ENOSPC, "No space left on device"), errno.ENOSPC),
        (OSError(errno.EISDIR, "Is a directory"), errno.EIO),  # the storage failed: EIO to the reader
        (OSError(errno.ENOENT, "a segment file gone"), errno.EIO),
        (RuntimeError("a bug"), errno.EIO),
    ],
)
def test_errors_map_to_errno(error: BaseException, number: int) -> None:
    assert raised(error) == number


@pytest.mark.expect_warnings("unexpected error")
def test_an_unexpected_error_is_logged_with_its_traceback(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.ERROR):
        assert raised(RuntimeError("a bug in a handler")) == errno.EIO
    (record,) = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert "read t/0/records: unexpected error (EIO)" in record.getMessage()
    assert record.exc_info is not None and "a bug in a handler" in caplog.text


def test_a_name_not_there_is_no_warning(caplog: pytest.LogCaptureFixture) -> None:
    raised(NoEntry("lookup t/9"))  # a shell probes names all the time: not worth a warning
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


class _GrowingFile(Handle):
    """An open file whose content the test grows: read on the loop, as a view's cached pages are."""

    def __init__(self) -> None:
        super().__init__(Node(cast(Any, None), 7, ("file",), "t/0/records"))
        self.content = b""

    def read_now(self, position: int, length: int) -> bytes:
        return self.content[position : position + length]

    def grown_size(self) -> int:
        return len(self.content)


def test_a_read_past_the_size_the_kernel_was_last_made_to_forget_makes_it_forget_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Before a read returns bytes the kernel's cached size may not reach, the kernel forgets the
    inode's attributes: once per growth, not per read; an empty read past the end (a follower
    at the end) returns nothing and moves nothing; an append's own invalidation starts over."""
    forgotten: list[int] = []
    monkeypatch.setattr(pyfuse3, "invalidate_inode", lambda inode, attr_only=False: forgotten.append(inode))
    operations = Operations(cast(Any, None))
    handle = operations._handles[1] = _GrowingFile()

    async def read(position: int) -> bytes:
        return bytes(await operations.read(1, position, 100))

    async def session() -> None:
        handle.content = b"one\n"
        assert await read(0) == b"one\n" and forgotten == [7]
        assert await read(0) == b"one\n" and await read(1000) == b"" and forgotten == [7]
        handle.content += b"two\n"
        assert await read(4) == b"two\n" and forgotten == [7, 7]
        assert await read(0) == b"one\ntwo\n" and forgotten == [7, 7]
        await operations._tell_kernel(Changes(inodes=[7]))  # (not open here: queued, not sent)
        assert await read(0) == b"one\ntwo\n" and forgotten == [7, 7, 7]

    trio.run(session)
