"""The README's walkthrough, run as written: every ```console block between the walkthrough
markers is a shell session — `$ ` lines are commands (a line ending in `\\` goes on), the lines
after one are what it prints (stdout and stderr together), `…` standing for any text within a
line (times, ids). The commands run one after the other in a fresh directory, with this
install's `seglogfs` first on PATH; whatever they mount is unmounted afterwards."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
BEGIN, END = "<!-- walkthrough -->", "<!-- /walkthrough -->"
FUSERMOUNT = "fusermount3"


def sessions(text: str) -> list[tuple[str, list[str]]]:
    """(command, expected output lines) of every console block in the walkthrough."""
    walkthrough = text.split(BEGIN, 1)[1].split(END, 1)[0]
    steps: list[tuple[str, list[str]]] = []
    for block in re.findall(r"```console\n(.*?)```", walkthrough, re.S):
        lines = block.splitlines()
        i = 0
        while i < len(lines):
            if not lines[i].startswith("$ "):
                raise AssertionError(f"README walkthrough: output without a command: {lines[i]!r}")
            command = lines[i][2:]
            while command.endswith("\\"):  # (kept: bash joins the lines, in quotes too)
                i += 1
                command += "\n" + lines[i]
            i += 1
            output = []
            while i < len(lines) and not lines[i].startswith("$ "):
                output.append(lines[i])
                i += 1
            steps.append((command, output))
    return steps


def matches(expected: str, got: str) -> bool:
    pattern = ".*".join(re.escape(part) for part in expected.split("…"))
    return re.fullmatch(pattern, got) is not None


def test_the_walkthrough_parser_reads_commands_and_outputs() -> None:
    text = f"{BEGIN}\n```console\n$ echo a \\\n  b\na b\n$ true\n```\n{END}"
    assert sessions(text) == [("echo a \\\n  b", ["a b"]), ("true", [])]
    assert matches("took … s", "took 0.2 s") and not matches("took … s", "took 0.2 ms")


def test_the_readme_walkthrough_runs_as_written(tmp_path: Path) -> None:
    steps = sessions(README.read_text())
    assert len(steps) >= 10
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}", TZ="UTC")
    env.pop("COLUMNS", None)
    try:
        for command, expected in steps:
            done = subprocess.run(
                ["bash", "-c", command], check=False, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
            )
            got = (done.stdout + done.stderr).splitlines()
            where = f"README walkthrough: `{command}` (exit {done.returncode})\n" + "\n".join(got)
            assert done.returncode == 0, where
            assert len(got) == len(expected), where
            for want, line in zip(expected, got, strict=True):
                assert matches(want, line), f"{where}\nexpected: {want!r}\ngot:      {line!r}"
    finally:
        with open("/proc/mounts") as mounts:
            ours = [line.split()[1] for line in mounts if line.split()[1].startswith(str(tmp_path))]
        for point in ours:
            subprocess.run([FUSERMOUNT, "-u", "-z", point], check=False, capture_output=True)
        if ours:
            pytest.fail(f"the walkthrough left mounts behind: {ours}")
