"""A mount over a data dir a crash left with a torn tail: the tail is set aside by the mount's
open, which says so in one WARNING line naming the place, and serves the records before it."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.cli.support import run
from tests.fs.conftest import Mount


@pytest.mark.expect_warnings(r"cut 16 bytes after the last valid batch at position \d+ \(unclean stop\); set aside in ")
def test_a_torn_tail_is_set_aside_at_mount_with_one_warning(tmp_path: Path, mount: Callable[..., Mount]) -> None:
    data = tmp_path / "data"
    run("produce", str(data), "--topic", "t", "--partition", "0", stdin=b"one\ntwo\nthree\n")
    segment = data / "t-0" / "00000000000000000000.log"
    whole = segment.read_bytes()
    with open(segment, "ab") as handle:
        handle.write(b"\x00" * 8 + b"\x00\x00\x01\x00torn")  # a batch header cut short by a crash
    (data / ".kafka_cleanshutdown").unlink()

    mounted = mount(data)
    assert (mounted.path / "t" / "0" / "records").read_bytes() == b"one\ntwo\nthree\n"
    mounted.stop()
    warnings = [line for line in mounted.output().splitlines() if re.search(r"\b(WARNING|ERROR)\b", line)]
    assert len(warnings) == 1, warnings
    [kept] = data.parent.glob("data.seglogfs-set-aside/*/t-0/00000000000000000003.log")
    assert str(kept.parent) in warnings[0]
    assert kept.read_bytes() == b"\x00" * 8 + b"\x00\x00\x01\x00torn"
    assert segment.read_bytes() == whole
    assert "are set aside in" in run("check", str(data), code=7).stdout
