"""Every line the CLI prints about an error or a warning starts with `seglogfs:` and is one line:
the engine's warnings included, and a lock holder's command line that holds a newline or a
terminal's escape sequence (another user's process: bytes nobody checked)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from tests.cli.support import one_error_line, run
from tests.conftest import REPO

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
