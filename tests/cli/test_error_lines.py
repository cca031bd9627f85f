"""Every line the CLI prints about an error or a warning starts with `seglogfs:` and is one line:
the engine's warnings included, and a lock holder's command line that holds a newline or a
terminal's escape sequence (another user's process: bytes nobody checked)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

from tests.cli.support import one_error_line, run
from tests.conftest import REPO
from tests.fs.conftest import Mount

FIXTURES = REPO / "tests" / "fixtures" / "kafka"
HOSTILE_ARGUMENT = "first line\nseglogfs: a line it did not write\x1b[2J\x07"


def test_the_engines_warnings_are_said_as_the_cli_says_errors(tmp_path: Path) -> None:
    """A ZooKeeper-mode broker's dir opened for writing: the engine warns that retention and
    compaction stay off (it printed the bare message, as Python's last resort does)."""
    data = tmp_path / "zk"
    shutil.copytree(FIXTURES / "spooldir-cp512", data)
    (data / ".lock").unlink(missing_ok=True)
    done = run("clean", str(data))
    said = done.stderr.splitlines()
    assert said and all(line.startswith("seglogfs: ") for line in said), done.stderr
    assert any("retention and compaction are off" in line for line in said), done.stderr


def test_a_lock_holders_command_line_is_one_line_with_its_control_characters_escaped(tmp_path: Path) -> None:
    data = tmp_path / "data"
    run("topics", "create", str(data), "--topic", "t")
    code = (
        "import sys\nfrom seglogfs.engine import BrokerConfig, DataDir\n"
        f"d = DataDir.open(BrokerConfig.load(log_dirs=[{str(data)!r}]), now_ms=0)\n"
        "print('ready', flush=True)\nsys.stdin.read()\nd.close()\n"
    )
    holder = subprocess.Popen(
        [sys.executable, "-c", code, HOSTILE_ARGUMENT], cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == b"ready\n"
        line = one_error_line(run("produce", str(data), "--topic", "t", stdin=b"x\n", code=3))
    finally:
        assert holder.stdin is not None and holder.stdout is not None
        holder.stdin.close()
        holder.wait(timeout=30)
        holder.stdout.close()
    assert f"data dir is in use by process {holder.pid} (" in line
    assert line.endswith(
        " first line\\nseglogfs: a line it did not write\\x1b[2J\\x07)" + f" (lock file {data / '.lock'})"
    ), line
    assert "\x1b" not in line and "\x07" not in line


def test_a_foreground_mount_whose_close_fails_on_a_full_disk_exits_1_saying_why(
    small_tmpfs: Path, tmp_path: Path
) -> None:
    """Its lines all start with `seglogfs:` (its log's, `seglogfs MNT:`), the last one says what
    could not be written (without Python's `[Errno 28]`), and both the mount's process and
    `seglogfs umount` exit 1."""
    mountpoint = tmp_path / "mnt"
    mountpoint.mkdir()
    mount = Mount(small_tmpfs / "data", mountpoint, ["-o", "view.cache=none"])
    try:
        (mountpoint / "t").mkdir()
        with open(mountpoint / "t" / "0" / "append", "ab") as handle:  # (the close has checkpoints to write)
            handle.write(b"one\n")
        subprocess.run(
            ["dd", "if=/dev/zero", f"of={small_tmpfs / 'filler'}", "bs=64k"], capture_output=True, check=False
        )
        umount = run("umount", str(mountpoint), code=1)
    finally:
        mount.stop()
    assert mount.process.returncode == 1, mount.output()
    said = mount.output().splitlines()
    # (the CLI's lines, and the mount's log lines, which name the mount point)
    assert said and all(line.startswith(("seglogfs: ", f"seglogfs {mountpoint}: ")) for line in said), said
    # (what failed first: the partition's close or the checkpoints, each a line in the log)
    assert re.fullmatch(
        r"seglogfs: (closing t-0|writing checkpoints): [^\[\]]*No space left on device.*; "
        "the next open recovers as after a crash",
        said[-1],
    ), said
    assert not any("[Errno" in line for line in said), said
    assert one_error_line(umount).startswith(f"seglogfs: {mountpoint}: the mount's process {mount.process.pid} exited")


def test_a_reply_the_kernel_no_longer_waits_for_is_not_an_error(tmp_path: Path) -> None:
    """pyfuse3's ERROR for a reply refused with ENOENT (a release still in flight when the file
    system is unmounted, a request whose process was killed) is a DEBUG line of the mount's log;
    a reply refused for another reason stays an ERROR."""
    log = tmp_path / "mount.log"
    script = (
        "import logging; from pathlib import Path; from seglogfs.mount_tools.mounting import set_up_logging;"
        f"set_up_logging(Path('/mnt/x'), foreground=False, file=Path({str(log)!r}));"
        "fuse = logging.getLogger('pyfuse3');"
        "fuse.error('fuse_release(): fuse_reply_* failed with %s', 'No such file or directory');"
        "fuse.error('fuse_read(): fuse_reply_* failed with %s', 'Invalid argument')"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    lines = log.read_text().splitlines()
    assert len(lines) == 1 and "ERROR pyfuse3: fuse_read(): fuse_reply_* failed with Invalid argument" in lines[0]
