"""Real mounts for the filesystem tests: `seglogfs mount -f` in a subprocess, always unmounted
(and the process gone) after the test, even when it fails."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.conftest import REPO

FUSERMOUNT = shutil.which("fusermount3") or "fusermount"
REFUSED = r"\(E[A-Z]+\)$"  # a request the mount turned down, as its log says it: for expect_warnings


class Mount:
    def __init__(self, data: Path | str, mountpoint: Path, options: list[str]) -> None:
        self.data = data
        self.path = mountpoint
        self.log = mountpoint.parent / f"{mountpoint.name}.log"
        self._log_file = open(self.log, "wb")  # noqa: SIM115 (closed in stop)
        self.process = subprocess.Popen(
            [sys.executable, "-m", "seglogfs.mount_tools.cli", "mount", str(data), str(mountpoint), "-f", *options],
            cwd=REPO,
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 30
        while not os.path.ismount(mountpoint):
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"mount failed: {self.log.read_text()}")
            time.sleep(0.02)

    def stop(self) -> None:
        # Whatever state it is in (a mount whose process died answers "Transport endpoint is
        # not connected" and is no mount point to os.path.ismount): lazily unmounted.
        subprocess.run([FUSERMOUNT, "-u", "-z", str(self.path)], check=False, capture_output=True)
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=30)
        self._log_file.close()

    def requests(self) -> dict[str, int]:
        """The filesystem's request counters now (it logs them on SIGUSR1)."""
        marker = self.output().count("requests ")
        self.process.send_signal(signal.SIGUSR1)
        deadline = time.monotonic() + 10
        while self.output().count("requests ") == marker:
            assert time.monotonic() < deadline, "the mount did not report its requests"
            time.sleep(0.01)
        line = self.output().rsplit("requests ", 1)[1].splitlines()[0]
        return json.loads(line)

    def output(self) -> str:
        return self.log.read_text(errors="replace")


def check_mount_log(mount: Mount, expected: list[str]) -> None:
    """A mount that ended must have exited 0 and logged no WARNING, ERROR or traceback that the
    test did not expect (`@pytest.mark.expect_warnings(pattern, ...)`)."""
    status = mount.process.returncode
    said = mount.output()
    unexpected = [
        line
        for line in said.splitlines()
        if re.search(r"\b(WARNING|ERROR|CRITICAL)\b|Traceback", line)
        and not any(re.search(pattern, line) for pattern in expected)
    ]
    assert status == 0, f"the mount exited with {status}:\n{said}"
    assert not unexpected, "the mount logged what the test did not expect:\n" + "\n".join(unexpected)


@pytest.fixture
def mount(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Callable[..., Mount]]:
    """`mount(data_dir, *options)` mounts (the data dir is created if need be; or a backup in
    object storage, by URI) and returns the Mount; every mount made is unmounted after the test.
    Layouts are kept in the test's own directory unless the options say where (`view.cache=`)."""
    made: list[Mount] = []

    def make(data: Path | str | None = None, *options: str) -> Mount:
        data = data or tmp_path / "data"
        if isinstance(data, Path):
            data.mkdir(parents=True, exist_ok=True)
        mountpoint = tmp_path / f"mnt{len(made)}"
        mountpoint.mkdir()
        if not any("view.cache=" in option for option in options):
            options = (*options, "-o", f"view.cache={tmp_path / 'view-cache'}")
        made.append(Mount(data, mountpoint, list(options)))
        return made[-1]

    yield make
    for each in made:
        each.stop()
    expected = [pattern for marker in request.node.iter_markers("expect_warnings") for pattern in marker.args]
    for each in made:
        check_mount_log(each, expected)
