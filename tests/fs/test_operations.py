"""The adapter's one error table, without a mount: what reaches the caller as which errno, and
what the log says."""

from __future__ import annotations

import errno
import logging

import pyfuse3
import pytest

from seglogfs.engine.errors import ConfigError, CorruptRecordError, RecordTooLargeError
from seglogfs.fs.node import NoEntry, Refused
from seglogfs.fs.operations import _errors


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
