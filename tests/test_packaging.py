"""The package as others install it: a wheel built from the repository, installed into a fresh
virtualenv outside it, gives one import namespace (`seglogfs.*`, nothing at the top level) with
the engine's compiled core built in, a working `seglogfs` command, and a mount that serves
records."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from tests.conftest import REPO

FUSERMOUNT = shutil.which("fusermount3") or "fusermount"


def run(*command: str | Path, **kwargs) -> subprocess.CompletedProcess[str]:
    arguments = [str(part) for part in command]
    return subprocess.run(arguments, check=False, capture_output=True, text=True, timeout=600, **kwargs)


def test_wheel_in_a_fresh_virtualenv(tmp_path: Path) -> None:
    wheels = tmp_path / "wheels"
    built = run(sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", REPO, "-w", wheels, cwd=tmp_path)
    assert built.returncode == 0, built.stderr
    (wheel,) = wheels.glob("seglogfs-*.whl")
    venv = tmp_path / "venv"
    assert run(sys.executable, "-m", "venv", venv).returncode == 0
    python, seglogfs = venv / "bin" / "python", venv / "bin" / "seglogfs"
    installed = run(python, "-m", "pip", "install", "-q", "--disable-pip-version-check", wheel)
    assert installed.returncode == 0, installed.stderr
    elsewhere = {"cwd": tmp_path, "env": {**os.environ, "PYTHONPATH": ""}}

    # (every engine module: its folders are subpackages, and the engine loads its names lazily)
    every = (
        "import pkgutil, seglogfs.engine as engine\n"
        "names = [m.name for m in pkgutil.walk_packages(engine.__path__, 'seglogfs.engine.')]\n"
        "for name in names: __import__(name)\n"
        "print(len(names))"
    )
    imported = run(python, "-c", every, **elsewhere)
    assert imported.returncode == 0 and int(imported.stdout) > 45, (imported.stdout, imported.stderr)
    listed = run(python, "-c", "import seglogfs.engine.log.segment, seglogfs.engine.cleaner.cleaner", **elsewhere)
    assert listed.returncode == 0, listed.stderr
    core = run(python, "-c", "from seglogfs.engine import _core; print(_core.__file__)", **elsewhere)
    assert core.returncode == 0 and core.stdout.startswith(str(venv)), core  # compiled in, from the wheel
    for name in ("engine", "fs", "mount_tools", "pipeline"):
        missing = run(python, "-c", f"import {name}", **elsewhere)
        assert missing.returncode == 1 and f"No module named '{name}'" in missing.stderr, name
    top_level = {path.name for path in (venv / "lib").glob("python3*/site-packages/*")}
    assert not top_level & {"engine", "fs", "mount_tools", "pipeline", "tests", "bench"}

    helped = run(seglogfs, "--help", **elsewhere)
    assert helped.returncode == 0 and "produce" in helped.stdout

    data, mountpoint = tmp_path / "data", tmp_path / "mnt"
    mountpoint.mkdir()
    produced = run(seglogfs, "produce", data, "--topic", "t", input="one\ntwo\n", **elsewhere)
    assert produced.returncode == 0, produced.stderr
    log = tmp_path / "mount.log"
    with open(log, "wb") as output:
        mount = subprocess.Popen([seglogfs, "mount", data, mountpoint, "-f"], stdout=output, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 30
        while not os.path.ismount(mountpoint):
            assert mount.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.05)
        assert (mountpoint / "t" / "0" / "records").read_bytes() == b"one\ntwo\n"
    finally:
        run(FUSERMOUNT, "-u", "-z", mountpoint)
        status = mount.wait(timeout=30)
    said = log.read_text()
    assert status == 0, said
    assert "WARNING" not in said and "Traceback" not in said, said
