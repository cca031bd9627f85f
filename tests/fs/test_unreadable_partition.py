"""One partition a mount cannot open (here legacy magic 0 data ending in a message whose CRC-32
holds but whose content no reader can decode; damage or the OS refusing it alike) does not stop
the mount: that partition answers EIO, says why in its `status` and the
mount's log, and its files are left exactly as they were; every other partition is served."""

from __future__ import annotations

import errno
import hashlib
import json
import shutil
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import pytest

from tests.conftest import kafka_fixtures
from tests.fs.conftest import Mount

LEGACY = "cannot be read: undecodable legacy message"


def undecodable_wrapper(offset: int) -> bytes:
    """A magic 0 wrapper message, CRC-32 intact, compressed with codec id 4 (no legacy codec)."""
    body = bytes([0, 4]) + struct.pack(">ii", -1, 9) + b"not zstd!"
    return struct.pack(">qiI", offset, len(body) + 4, zlib.crc32(body)) + body


def digests(directory: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(directory.iterdir())}


@pytest.mark.expect_warnings(LEGACY)
@pytest.mark.parametrize("options", [["-o", "ro"], []], ids=["read-only", "writable"])
def test_an_unreadable_legacy_partition_answers_eio_and_the_rest_is_served(
    mount, tmp_path: Path, options: list[str]
) -> None:
    data = tmp_path / "data"
    subprocess.run(
        [sys.executable, "-m", "seglogfs.mount_tools.cli", "produce", str(data), "--topic", "good"],
        input=b"a\nb\n",
        check=True,
        capture_output=True,
    )
    shutil.copytree(kafka_fixtures() / "kafkalite-magic0" / "numbers-0", data / "numbers-0")
    segment = data / "numbers-0" / "00000000000000000000.log"
    segment.chmod(0o644)
    with open(segment, "ab") as file:
        file.write(undecodable_wrapper(11394))
    before = digests(data / "numbers-0")
    m: Mount = mount(data, *options)
    assert sorted(p.name for p in m.path.iterdir() if not p.name.startswith(".")) == ["good", "numbers"]
    assert (m.path / "good" / "0" / "records").read_text() == "a\nb\n"
    for name in ("records", "records.jsonl", "by-offset/0"):
        with pytest.raises(OSError) as raised:
            (m.path / "numbers" / "0" / name).read_bytes()
        assert raised.value.errno == errno.EIO, name
    logdir = m.path / ".logdir"
    assert {"good-0", "numbers-0"} <= {p.name for p in logdir.iterdir()}
    assert "numbers 0" in (logdir / "recovery-point-offset-checkpoint").read_text()
    (logdir / "log-start-offset-checkpoint").read_text()
    status = json.loads((m.path / "numbers" / "0" / "status").read_text())
    assert LEGACY in status["offline"]
    if not options:
        with pytest.raises(OSError) as raised:
            (m.path / "numbers" / "0" / "append").write_bytes(b"x\n")
        assert raised.value.errno == errno.EIO
        (m.path / "good" / "0" / "append").write_bytes(b"c\n")
        assert (m.path / "good" / "0" / "records").read_text() == "a\nb\nc\n"
    m.stop()
    assert digests(data / "numbers-0") == before
    assert m.process.returncode == 0
    assert "numbers-0 is offline, the others are served" in m.output()
