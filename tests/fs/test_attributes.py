"""What `stat`, `du` and the mount's log say: `status`'s size as it is when read, no disk blocks
for what the mount renders (views, `status`, `config`) while `.logdir`'s files count theirs, and
every log line naming its mount."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

from seglogfs.engine import BrokerConfig, DataDir
from tests.conftest import NOW_MS
from tests.fs.conftest import Mount


def make_data_dir(data: Path, records: int = 3) -> Path:
    with DataDir.open(BrokerConfig.load(log_dirs=[data]), now_ms=NOW_MS) as data_dir:
        data_dir.create_topic("t", 1, {"retention.ms": "-1"}, now_ms=NOW_MS)
        values = [b"value %06d " % n + b"x" * 200 for n in range(records)]
        data_dir.partition("t", 0).append_records(values, now_ms=NOW_MS)
    return data


def test_status_is_the_size_it_reads_after_a_read_committed_view_is_used(mount, tmp_path: Path) -> None:
    """`status` gains `readCommitted` once a read_committed view has been used, and its offsets
    change with every append: its stat is taken afresh each time (it held the size of its
    first stat for an hour: 1219 bytes against the 1336 read)."""
    m: Mount = mount(make_data_dir(tmp_path / "data"))
    status = m.path / "t/0/status"
    status.stat()  # (the kernel holds this one; a read of the file would make it ask again)
    (m.path / "t/0/read_committed/records").read_bytes()
    size = status.stat().st_size
    content = status.read_bytes()
    assert b"readCommitted" in content and size == len(content)
    with open(m.path / "t/0/append", "ab") as append:
        append.write(b"x\n" * 2000)
    size = status.stat().st_size
    assert size == len(status.read_bytes())


def test_what_the_mount_renders_takes_no_blocks_and_logdir_takes_the_data_dirs(mount, tmp_path: Path) -> None:
    """`du` of a mount counts the data once, in `.logdir` (it counted every view: 320 MB for 17 MB
    of data): views, `status` and `config` have no blocks, as /proc's files have none."""
    data = make_data_dir(tmp_path / "data", records=4000)
    m: Mount = mount(data)
    (m.path / "t/config").write_bytes(b"retention.ms=-1\n")
    for name in ("t/0/records", "t/0/records.jsonl", "t/0/by-offset/0", "t/0/read_committed/records", "t/0/status"):
        status = (m.path / name).stat()
        assert status.st_size > 0 and status.st_blocks == 0, name
    assert (m.path / "t/config").stat().st_blocks == 0
    segment = m.path / ".logdir/t-0/00000000000000000000.log"
    assert segment.stat().st_blocks == (segment.stat().st_size + 511) // 512 > 0
    du = subprocess.run(["du", "-s", "--block-size=1", str(m.path / "t")], capture_output=True, text=True, check=True)
    assert int(du.stdout.split()[0]) == 0
    du = subprocess.run(["du", "-s", "--block-size=1", str(m.path)], capture_output=True, text=True, check=True)
    assert int(du.stdout.split()[0]) < 2 * sum(path.stat().st_size for path in (data / "t-0").iterdir())


def test_each_line_of_a_foreground_mounts_log_names_its_mount(mount, tmp_path: Path) -> None:
    """Several mounts in the foreground log to one terminal (or journal): each line says which."""
    data = make_data_dir(tmp_path / "data")
    first: Mount = mount(data, "-o", "ro")
    second: Mount = mount(data, "-o", "ro")
    for m in (first, second):
        (m.path / "t/0/records").read_bytes()
        os.kill(m.process.pid, signal.SIGUSR1)  # (the request counts, logged)
    for m in (first, second):
        m.stop()
        lines = m.output().splitlines()
        assert any("requests" in line for line in lines)
        assert all(f"{m.path}:" in line for line in lines), lines
