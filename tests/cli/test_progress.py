"""Progress on stderr (mount_tools.progress): a line redrawn in place on a terminal and erased at
the end, nothing off a terminal for a short run, plain lines for a long one; stdout the same
either way. The CLI runs as a real process with its stderr on a pseudo-terminal; the timing rules
run in-process on an injected clock."""

from __future__ import annotations

import fcntl
import io
import json
import logging
import os
import re
import shutil
import struct
import subprocess
import sys
import termios
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from seglogfs.mount_tools.progress import Progress, format_bytes, format_duration
from tests.conftest import REPO

SEGLOGFS = [sys.executable, "-m", "seglogfs.mount_tools.cli"]
ERASE = b"\r\x1b[K"
COLUMNS = 120
LINES = 40_000  # about 3.5 MB: several chunks of produce's 1 MiB reads, several 1 MB segments
SMALL_SEGMENTS = ("--override", "log.segment.bytes=1000000")


@dataclass
class Run:
    returncode: int
    stdout: bytes
    stderr: bytes  # what the terminal (or the pipe) received


def run(*args: str, stdin: Path | bytes = b"", terminal: bool) -> Run:
    """`seglogfs ARGS` with stdin from a file (a regular file: its size is known) or a pipe, and
    stderr on a pseudo-terminal of COLUMNS columns (`terminal`) or a pipe."""
    master = slave = -1
    if terminal:
        master, slave = os.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, COLUMNS, 0, 0))
    received = bytearray()

    def read_terminal() -> None:
        while True:
            try:
                data = os.read(master, 65536)
            except OSError:  # EIO: every copy of the slave side is closed (the process ended)
                return
            if not data:
                return
            received.extend(data)

    with open(stdin, "rb") if isinstance(stdin, Path) else open(os.devnull, "rb") as file:
        process = subprocess.Popen(
            [*SEGLOGFS, *args],
            stdin=file if isinstance(stdin, Path) else subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=slave if terminal else subprocess.PIPE,
            cwd=REPO,
            env={key: value for key, value in os.environ.items() if key != "SEGLOGFS_DEBUG"},
        )
    reader = None
    if terminal:
        os.close(slave)
        reader = threading.Thread(target=read_terminal)
        reader.start()
    try:
        out, err = process.communicate(None if isinstance(stdin, Path) else stdin, timeout=60)
    finally:
        process.kill()
        process.wait()
        if reader is not None:
            reader.join(timeout=10)
            os.close(master)
    return Run(process.returncode, out, bytes(received) if terminal else err)


def drawn_lines(stderr: bytes) -> list[str]:
    """The lines drawn in place: every write is `\\r`, the line, erase to its end; the last one
    erases the line and draws nothing. Fails on anything else (a newline, a line left behind)."""
    assert stderr.endswith(ERASE), stderr[-200:]
    assert b"\n" not in stderr, stderr[-200:]
    parts = stderr[: -len(ERASE)].split(b"\r")
    assert parts[0] == b"", stderr[:200]
    lines = []
    for part in parts[1:]:
        assert part.endswith(b"\x1b[K"), part
        line = part[: -len(b"\x1b[K")].decode()
        assert 0 < len(line) < COLUMNS, line
        lines.append(line)
    assert lines, "no progress line was drawn"
    return lines


@pytest.fixture(scope="module")
def input_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("input") / "lines.txt"
    path.write_bytes(b"".join(b"record %06d %s\n" % (i, b"x" * 70) for i in range(LINES)))
    return path


@pytest.fixture(scope="module")
def produced(tmp_path_factory: pytest.TempPathFactory, input_file: Path) -> dict[str, tuple[Path, Run]]:
    """The same input produced with stderr on a terminal and on a pipe: data dir and run of each."""
    out = {}
    for name, terminal in (("terminal", True), ("pipe", False)):
        data = tmp_path_factory.mktemp(f"produced-{name}")
        out[name] = data, run("produce", str(data), "--topic", "t", "--partition", "0", *SMALL_SEGMENTS,
                              stdin=input_file, terminal=terminal)  # fmt: skip
    return out


@pytest.fixture
def data(produced: dict[str, tuple[Path, Run]], tmp_path: Path) -> Path:
    """A copy of a data dir of several segments (tests that change it get their own)."""
    copy = tmp_path / "data"
    shutil.copytree(produced["pipe"][0], copy)
    return copy


# -- produce --------------------------------------------------------------------------------------
def test_produce_of_a_file_on_a_terminal_shows_bytes_of_its_size_and_records_then_erases(
    produced: dict[str, tuple[Path, Run]], input_file: Path
) -> None:
    _, result = produced["terminal"]
    assert result.returncode == 0 and result.stdout == b""
    lines = drawn_lines(result.stderr)
    size = format_bytes(input_file.stat().st_size)
    first = re.fullmatch(r"produce \[[#.]{30}\] +\d+\.\d%  (\S+ \S+) of (\S+ \S+)  ([\d,]+) records.*", lines[0])
    assert first is not None, lines[0]
    assert first[2] == size and int(first[3].replace(",", "")) > 0  # counted after the first chunk
    assert all(line.startswith("produce [") and f"of {size}" in line for line in lines)


def test_produce_off_a_terminal_writes_nothing_and_stores_the_same(produced: dict[str, tuple[Path, Run]]) -> None:
    (on_terminal, shown), (on_pipe, quiet) = produced["terminal"], produced["pipe"]
    assert (quiet.returncode, quiet.stdout, quiet.stderr) == (0, b"", b"")
    consumed = [
        run("consume", str(data), "--topic", "t", "--from-beginning", terminal=False) for data in (on_terminal, on_pipe)
    ]
    assert consumed[0].stdout == consumed[1].stdout and len(consumed[0].stdout.splitlines()) == LINES
    assert shown.stdout == quiet.stdout


def test_produce_of_a_pipe_shows_bytes_and_records_without_a_bar(tmp_path: Path, input_file: Path) -> None:
    result = run("produce", str(tmp_path / "d"), "--topic", "t", "-v", stdin=input_file.read_bytes(), terminal=True)
    assert result.returncode == 0 and result.stdout == b""
    # -v's line as before, after the erased progress line (the terminal turns \n into \r\n)
    progress, said = result.stderr.split(ERASE)
    assert said == f"seglogfs: stored {LINES} records in topic t\r\n".encode()
    lines = drawn_lines(progress + ERASE)
    assert all(re.fullmatch(r"produce  \S+ \S+  [\d,]+ records(  \S+ \S+/s)?  \d+:\d\d", line) for line in lines)


# -- check and clean ------------------------------------------------------------------------------
def test_check_on_a_terminal_counts_segment_bytes_and_stdout_is_unchanged(data: Path) -> None:
    total = format_bytes(sum(path.stat().st_size for path in data.glob("*/*.log")))
    shown, quiet = (run("check", str(data), terminal=terminal) for terminal in (True, False))
    assert shown.returncode == quiet.returncode == 0
    assert shown.stdout == quiet.stdout and shown.stdout.endswith(b"bytes: clean\n")
    assert quiet.stderr == b""
    lines = drawn_lines(shown.stderr)
    assert all(line.startswith("check [") and f"of {total}" in line for line in lines)


def test_check_json_stays_pure_json_with_a_terminal_line_on_stderr(data: Path) -> None:
    shown, quiet = (run("check", str(data), "--json", terminal=terminal) for terminal in (True, False))
    assert shown.stdout == quiet.stdout and json.loads(shown.stdout)["clean"] is True
    assert quiet.stderr == b""
    drawn_lines(shown.stderr)


@pytest.mark.parametrize("dry_run", [True, False], ids=["dry-run", "pass"])
def test_clean_on_a_terminal_shows_its_phase_and_stdout_is_unchanged(data: Path, dry_run: bool) -> None:
    twin = data.with_name("twin")
    shutil.copytree(data, twin)
    args = ["--override", "log.retention.bytes=2000000", "--now", str(int(time.time() * 1000))]
    args += ["--dry-run"] if dry_run else []
    shown = run("clean", str(data), *args, "--json", terminal=True)
    quiet = run("clean", str(twin), *args, "--json", terminal=False)
    assert shown.returncode == quiet.returncode == 0 and quiet.stderr == b""
    assert shown.stdout == quiet.stdout
    assert json.loads(shown.stdout)["retention"][0]["reason"] == "retention.bytes=2000000"
    assert drawn_lines(shown.stderr)[0] == "clean: opening the data dir  0:00"


# -- the rules, on an injected clock ----------------------------------------------------------------
class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_off_a_terminal_one_plain_line_after_5_s_then_at_most_one_every_10_s() -> None:
    clock, stream = Clock(), io.StringIO()
    with Progress("produce", records=True, stream=stream, tty=False, clock=clock) as progress:
        for _ in range(49):  # 4.9 s of work: nothing
            clock.now += 0.1
            progress.advance(1_000_000, 1000)
        assert stream.getvalue() == ""
        clock.now += 0.1
        progress.advance(1_000_000, 1000)  # 5.0 s
        assert stream.getvalue() == "produce: 50,000 records, 50 MB so far\n"
        for _ in range(99):  # up to 14.9 s
            clock.now += 0.1
            progress.advance(1_000_000, 1000)
        assert stream.getvalue().count("\n") == 1
        clock.now += 0.1
        progress.advance(1_000_000, 1000)  # 15.0 s
        assert stream.getvalue().splitlines()[1] == "produce: 150,000 records, 150 MB so far"
        clock.now += 100
    assert stream.getvalue().count("\n") == 2  # no line at the end, no erase off a terminal


def test_plain_line_of_a_known_total_and_none_with_plain_off() -> None:
    clock, stream = Clock(), io.StringIO()
    with Progress("check", 3_300_000_000, stream=stream, tty=False, clock=clock) as progress:
        clock.now += 6
        progress.advance(1_000_000_000)
    assert stream.getvalue() == "check: 1.0 GB of 3.3 GB (30%) so far\n"
    quiet = io.StringIO()
    with Progress("check", 100, plain=False, stream=quiet, tty=False, clock=clock) as progress:
        clock.now += 60
        progress.advance(50)
    assert quiet.getvalue() == ""


def test_on_a_terminal_at_most_ten_lines_a_second_with_rate_and_eta_then_erased() -> None:
    clock, stream = Clock(), io.StringIO()  # 80 columns (a stream without a terminal's size)
    with Progress("check", 100_000_000, stream=stream, tty=True, clock=clock) as progress:
        progress.advance(10_000_000)  # the first count draws at once; room kept for rate and ETA
        assert stream.getvalue() == f"\rcheck [{'#' * 2}{'.' * 25}]  10.0%  10 MB of 100 MB\x1b[K"
        for _ in range(9):  # 0.09 s more: no redraw
            clock.now += 0.01
            progress.advance(1_000_000)
        assert stream.getvalue().count("\r") == 1
        clock.now = 1001.0  # 1 s in, 40 MB: a rate, and the time left at it
        progress.advance(21_000_000)
        assert stream.getvalue().split("\r")[-1] == (
            f"check [{'#' * 10}{'.' * 17}]  40.0%  40 MB of 100 MB  40 MB/s  ETA 0:01\x1b[K"
        )
    assert stream.getvalue().endswith("\x1b[K\r\x1b[K") and stream.getvalue().count("\r") == 3


def test_a_line_never_wider_than_the_terminal() -> None:
    progress = Progress("backing up", 10**12, records=True, tty=True, stream=io.StringIO(), clock=Clock())
    progress.advance(123_456_789_012, 1_234_567)
    assert len(progress.line(1001.0, 120)) < 120 and "[" in progress.line(1001.0, 120)
    assert len(progress.line(1001.0, 60)) == 59 and "[" not in progress.line(1001.0, 60)  # no room for a bar


def test_ticking_work_shows_its_phase_at_once_and_is_redrawn() -> None:
    drawn = threading.Event()

    class Terminal(io.StringIO):
        def write(self, text: str) -> int:
            if self.getvalue():
                drawn.set()  # a second write: the ticker redrew the line
            return super().write(text)

    terminal = Terminal()
    with Progress("clean", phase="compacting", tick=True, stream=terminal, tty=True):
        assert terminal.getvalue().startswith("\rclean: compacting  0:00\x1b[K")
        assert drawn.wait(10)
    assert terminal.getvalue().endswith("\r\x1b[K")


def test_a_warning_printed_meanwhile_erases_the_line_first(capsys: pytest.CaptureFixture[str]) -> None:
    # (Python's last-resort handler prints a CLI's warnings: no logging is set up there.)
    before = logging.lastResort
    assert before is not None
    with Progress("check", 100, tty=True, stream=sys.stderr, clock=Clock()) as progress:
        progress.advance(50)
        record = logging.LogRecord("seglogfs", logging.WARNING, __file__, 1, "a warning", None, None)
        assert logging.lastResort is not None
        logging.lastResort.handle(record)
    assert logging.lastResort is before
    err = capsys.readouterr().err
    assert err.endswith("\x1b[K\r\x1b[Ka warning\n")  # drawn, erased, the message on a line of its own


def test_backups_use_of_progress_keeps_working() -> None:
    # backup.py: `with Progress("backing up", total) as progress: ... progress.advance(item.size)`
    with Progress("backing up", 0) as progress:
        progress.advance(4096)
    assert progress.done == 4096


def test_sizes_and_durations() -> None:
    assert [format_bytes(n) for n in (0, 999, 1000, 1234, 12_345_678, 120_000_000, 3_300_000_000)] == [
        "0 B",
        "999 B",
        "1.0 kB",
        "1.2 kB",
        "12 MB",
        "120 MB",
        "3.3 GB",
    ]
    assert [format_duration(s) for s in (0, 7.9, 754, 3723)] == ["0:00", "0:07", "12:34", "1:02:03"]
