"""Running the installed `seglogfs` entry point in tests, and a process that holds a data dir."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.conftest import REPO

SEGLOGFS = str(Path(sys.executable).with_name("seglogfs"))  # the console script beside the venv's python


def run(*args: str, stdin: bytes = b"", code: int | None = 0) -> subprocess.CompletedProcess[str]:
    """`seglogfs ARGS`; its exit status must be `code` (None: any)."""
    done = subprocess.run([SEGLOGFS, *args], input=stdin, capture_output=True, cwd=REPO, timeout=60, check=False)
    result = subprocess.CompletedProcess(done.args, done.returncode, done.stdout.decode(), done.stderr.decode())
    if code is not None and result.returncode != code:
        raise AssertionError(
            f"seglogfs {' '.join(args)} exited {result.returncode}, not {code}:\n{result.stdout}{result.stderr}"
        )
    return result


def run_json(*args: str) -> Any:
    return json.loads(run(*args, "--json").stdout)


def one_error_line(result: subprocess.CompletedProcess[str]) -> str:
    """The single line a refused command prints on stderr (and nothing else: no usage, no traceback)."""
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("seglogfs") and "Traceback" not in result.stderr
    return lines[0]


class Holder:
    """Another process holding the data dir open for writing (a mount or a broker would)."""

    def __init__(self, data: Path) -> None:
        self.data = data

    def __enter__(self) -> int:
        code = (
            "import sys\nfrom seglogfs.engine import BrokerConfig, DataDir\n"
            f"d = DataDir.open(BrokerConfig.load(log_dirs=[{str(self.data)!r}]), now_ms=0)\n"
            "print('ready', flush=True)\nsys.stdin.read()\nd.close()\n"
        )
        self.process = subprocess.Popen(
            [sys.executable, "-c", code], cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE
        )
        assert self.process.stdout is not None and self.process.stdout.readline() == b"ready\n"
        return self.process.pid

    def __exit__(self, *exc: object) -> None:
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.close()
        self.process.wait(timeout=30)
        self.process.stdout.close()
