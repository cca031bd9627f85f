"""Shared test fixtures: temporary data dirs, configs, the broker fixtures, a strict log check."""

from __future__ import annotations

import ctypes
import logging
import mmap
import os
import random
import re
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from seglogfs.engine import BrokerConfig, DataDir, PartitionLog
from seglogfs.engine.check import check_log_dirs
from seglogfs.engine.config import apply_topic_overrides

REPO = Path(__file__).resolve().parent.parent
KAFKA_FIXTURES = REPO / "tests" / "fixtures" / "kafka"
NOW_MS = 1_763_800_000_000  # 2025-11-22T08:26:40Z: a fixed "now" for deterministic tests


# The test files that take longest (Spark's, a wheel's install, the README's walkthrough, the
# broker fixtures' mounts) run first: the workers then end together, not one of them on a long
# test begun last while the others are done.
LONG_FIRST = (
    "tests/fs/test_follow_stable.py::test_followers_through_a_live_loop",  # (two minutes, mostly waiting)
    "tests/pipeline/",
    "tests/test_packaging.py",
    "tests/test_readme.py",
    "tests/fs/test_fixture_mounts.py",
    "tests/fs/test_broker_dir_after_mount.py",
)


# Tests that share what is costly to start run in one worker process each: a Kafka broker and the
# interop modules' topics and compiled producers; a Spark JVM and the pipeline modules' data; an S3
# server (s3proxy) for the object-storage tests; the
# modules whose fixtures are built once a process (the broker fixtures decoded by kafka-python,
# the hostile and damaged data dirs, ...). Spread over every worker, each built them again.
# scripts/dev runs the workers with `--dist loadscope`, whose scopes `pytest_xdist_make_scheduler`
# below makes these groups (handed out first, biggest first) and every other test (one at a time).
SHARED_WORKER = {
    "tests/interop/": "kafka",
    "tests/pipeline/": "spark",
    "tests/objectstore/": "s3",
    "tests/engine/test_fixtures.py": "fixtures",
    "tests/cli/test_hostile_data_dir.py": "hostile",
    "tests/cli/test_repair_set_aside.py": "repair",
    "tests/cli/test_backup_incomplete.py": "backup-incomplete",
    "tests/cli/test_progress.py": "progress",
    "tests/fs/test_permissions.py": "permissions",
}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    def rank(item: pytest.Item) -> int:
        return next((n for n, prefix in enumerate(LONG_FIRST) if item.nodeid.startswith(prefix)), len(LONG_FIRST))

    items.sort(key=rank)  # (stable: each file's order stays)


@pytest.hookimpl(optionalhook=True)  # (xdist's hook: unknown where xdist is not loaded)
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object | None:
    """Under `--dist loadscope`: the scopes are SHARED_WORKER's groups, and each other test a scope
    of its own. (xdist's own `xdist_group` marks do not group under pytest 9: xdist renames a
    test's node id by an attribute pytest 9 no longer reads.)"""
    if config.getvalue("dist") != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class SharedWorkerScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return next((group for prefix, group in SHARED_WORKER.items() if nodeid.startswith(prefix)), nodeid)

    return SharedWorkerScheduling(config, log)


# Seconds of tests (setup, call and teardown) by part of the suite, summed over the workers:
# printed at the end of a run (where the time goes; the interop part is one worker's).
_SECONDS_BY_PART: dict[str, float] = {}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    parts = report.nodeid.split("/")
    part = parts[1] if len(parts) > 2 else parts[-1].split("::")[0]
    _SECONDS_BY_PART[part] = _SECONDS_BY_PART.get(part, 0.0) + report.duration


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if _SECONDS_BY_PART:
        parts = sorted(_SECONDS_BY_PART.items(), key=lambda item: -item[1])
        terminalreporter.write_line(
            "seconds of tests by part: " + ", ".join(f"{part} {seconds:.0f}" for part, seconds in parts)
        )


def kafka_fixtures() -> Path:
    """The real broker data dirs; their absence is an error, never a skip."""
    if not (KAFKA_FIXTURES / "INDEX_EXACT.txt").exists():
        raise RuntimeError(f"broker fixtures not found at {KAFKA_FIXTURES} (they are part of the repository)")
    return KAFKA_FIXTURES


def copy_fixture(name: str, tmp_path: Path) -> Path:
    """A writable copy of a broker fixture data dir (the originals are never touched)."""
    copy = tmp_path / name
    shutil.copytree(kafka_fixtures() / name, copy)
    for path in [copy, *copy.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    return copy


def make_log(directory: Path, **topic_overrides: object) -> PartitionLog:
    """A new partition log at `directory` (topic `t`, partition 0; its data dir the parent) with
    topic overrides as keyword arguments: Kafka's names, underscores for dots (`segment_bytes=1024`)
    or as they are (`**{"segment.bytes": "1024"}`)."""
    overrides = {key.replace("_", "."): str(value) for key, value in topic_overrides.items()}
    config = apply_topic_overrides(BrokerConfig.load(log_dirs=[directory.parent]).topic_defaults, overrides)
    return PartitionLog.create(directory, "t", 0, config, topic_id="AAAAAAAAAAAAAAAAAAAAAA", now_ms=NOW_MS)


def broker_config(log_dir: Path, **overrides: object) -> BrokerConfig:
    """A BrokerConfig for `log_dir` with broker-level overrides given as keyword arguments,
    underscores for dots: `broker_config(d, log_segment_bytes=1024)`."""
    items = [f"{key.replace('_', '.')}={value}" for key, value in overrides.items()]
    return BrokerConfig.load(overrides=items, log_dirs=[log_dir])


def assert_log_dir_valid(log_dir: Path) -> None:
    """What `seglogfs check` reports must be nothing."""
    report = check_log_dirs([log_dir])
    assert report.clean, "\n".join(str(p) for p in report.problems)


@pytest.fixture
def log_dir(tmp_path: Path) -> Path:
    path = tmp_path / "logs"
    path.mkdir()
    return path


@pytest.fixture
def data_dir(log_dir: Path) -> Iterator[DataDir]:
    """A writable data dir with small segments; checked for validity after the test."""
    opened = DataDir.open(broker_config(log_dir, log_segment_bytes=4096, log_index_interval_bytes=128), now_ms=NOW_MS)
    yield opened
    opened.close()
    assert_log_dir_valid(log_dir)


# Ports for the servers the suite starts (brokers, the S3 server). Not the kernel's pick from
# port 0: that comes from the ephemeral range, where any outgoing connection (a Spark executor's,
# a client's) may take it between the probe and the server's bind, and the server then fails to
# start. Below that range only listeners take ports, and each xdist worker has a stripe of its
# own, handing out each port once.
_PORT_STRIPE = 1500
_ports_given: set[int] = set()


def listen_port() -> int:
    """A loopback port no other server of the suite holds or will be given."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    index = int(worker[2:]) if worker[2:].isdigit() else 0
    low = 20000 + (index % 8) * _PORT_STRIPE
    candidates = list(range(low, low + _PORT_STRIPE))
    random.shuffle(candidates)
    for port in candidates:
        if port in _ports_given:
            continue
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
        _ports_given.add(port)
        return port
    raise AssertionError(f"no free loopback port in {low}-{low + _PORT_STRIPE - 1}")


# A command run as a terminal's foreground job, which Ctrl-C reaches: a harness that started
# the tests from a non-interactive shell's `&` has SIGINT ignored, and children inherit that.
AS_FOREGROUND = ["env", "--default-signal=INT"]


@pytest.fixture
def small_tmpfs(tmp_path: Path) -> Iterator[Path]:
    """A 4 MiB tmpfs (another file system than `tmp_path`'s), unmounted after the test."""
    where = tmp_path / "tmpfs"
    where.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(where)], check=True)
    try:
        yield where
    finally:
        unmount(where)


def unmount(where: Path) -> None:
    """Unmount a file system a test mounted; lazily when busy (a test that failed with files
    open), so that none is left behind, and then the test fails."""
    if subprocess.run(["umount", str(where)], check=False).returncode != 0:
        subprocess.run(["umount", "-l", str(where)], check=True)
        raise AssertionError(f"{where} was busy at the end of the test")


def resident_pages(fd: int) -> int:
    """How many of the file's pages the OS page cache holds now (mincore(2) over a mapping of
    it, which faults nothing in)."""
    size = os.fstat(fd).st_size
    if size == 0:
        return 0
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    address = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
    if address in (None, ctypes.c_void_p(-1).value):
        raise OSError(ctypes.get_errno(), "mmap for mincore")
    try:
        pages = (size + mmap.PAGESIZE - 1) // mmap.PAGESIZE
        vector = ctypes.create_string_buffer(pages)
        if libc.mincore(ctypes.c_void_p(address), size, vector) != 0:
            raise OSError(ctypes.get_errno(), "mincore")
        return sum(byte & 1 for byte in vector.raw[:pages])
    finally:
        libc.munmap(ctypes.c_void_p(address), size)


def drop_from_page_cache(fd: int) -> None:
    """Have the OS forget the file's bytes, and make sure it did: written back first (only clean
    pages can go), then dropped, again while any page stays (a page still in a CPU's batch of
    new pages, or brought back by read-ahead that a read which would not wait started)."""
    os.fsync(fd)
    for _ in range(100):
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        if resident_pages(fd) == 0:
            return
        time.sleep(0.01)
    raise AssertionError(f"the OS keeps {resident_pages(fd)} pages of descriptor {fd} in memory")


def refused_when_uncached(fd: int, read: Callable[[], object], expected: object, attempts: int = 200) -> None:
    """`read` (one that must not wait for the disk) of bytes dropped from the page cache raises
    BlockingIOError. A read that would not wait still starts the OS's read-ahead, and on a fast
    disk that can land before the read looks again: then the read gives the bytes, which must be
    `expected`; of `attempts` tries, one at least must be refused."""
    for _ in range(attempts):
        drop_from_page_cache(fd)
        try:
            got = read()
        except BlockingIOError:
            return
        assert got == expected
    raise AssertionError(f"{attempts} reads of bytes dropped from the page cache were never refused")


@pytest.fixture(autouse=True)
def _fail_on_unexpected_warnings(request: pytest.FixtureRequest, caplog: pytest.LogCaptureFixture) -> Iterator[None]:
    """A test fails on a WARNING (or worse) it did not expect. A test that damages data on
    purpose names the warnings it expects: `@pytest.mark.expect_warnings("cut .* bytes")`."""
    caplog.set_level(logging.WARNING)
    yield
    patterns = [p for marker in request.node.iter_markers("expect_warnings") for p in marker.args]
    unexpected = [
        r.getMessage()
        for r in caplog.get_records("call")
        if r.levelno >= logging.WARNING and not any(re.search(p, r.getMessage()) for p in patterns)
    ]
    assert not unexpected, f"unexpected log warnings: {unexpected}"


@dataclass(frozen=True)
class Measured:
    """A command's exit status, output, wall time, CPU time (user + system) and peak RSS."""

    returncode: int
    stdout: str
    stderr: str
    seconds: float
    cpu_seconds: float
    max_rss_bytes: int


def run_measured(args: list[str], *, timeout: float = 60) -> Measured:
    """`args` run by GNU time, which forks it from its own small process: the peak RSS is the
    command's own. (A child forked from pytest itself reports pytest's RSS as its peak: the copy
    it was before its exec counts, and pytest grows past 300 MB over the suite.)"""
    with tempfile.NamedTemporaryFile("r") as figures:
        start = time.monotonic()
        done = subprocess.run(
            ["/usr/bin/time", "-q", "-f", "%U %S %M", "-o", figures.name, *args],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        seconds = time.monotonic() - start
        user, system, rss_kib = figures.read().split()[-3:]
    return Measured(
        done.returncode, done.stdout, done.stderr, seconds, float(user) + float(system), int(rss_kib) * 1024
    )
