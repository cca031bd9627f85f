"""SIGKILL a compaction pass at every phase (offset map, `.cleaned` writes, each rename of the
swap), reopen, and check that nothing was lost, duplicated or left behind."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

from seglogfs.engine import DataDir
from tests.cli.clean_crash_setup import TOPIC, crash_config, make_compacted_dir
from tests.conftest import NOW_MS, REPO, assert_log_dir_valid

Written = dict[int, tuple[bytes, bytes | None]]


def run_crasher(log_dir: Path, phase: str, n: int) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tests.cli.clean_crasher", str(log_dir), phase, str(n), str(NOW_MS)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


Triples = set[tuple[int, bytes | None, bytes | None]]


def records_of(log_dir: Path) -> Triples:
    with DataDir.open(crash_config(log_dir), read_only=True, now_ms=NOW_MS) as data_dir:
        return {(r.offset, r.key, r.value) for r in data_dir.partition(TOPIC, 0).records(0)}


def full_pass(pristine: Path, scratch: Path, phase: str) -> tuple[int, Triples]:
    """How many calls (or renames) a whole pass makes, and the records it keeps."""
    shutil.copytree(pristine, scratch)
    done = run_crasher(scratch, phase, 0)
    assert done.returncode == 0, done.stderr
    words = done.stdout.split()
    assert words[2:] == ["cleaned", "1"], done.stdout
    kept = records_of(scratch)
    shutil.rmtree(scratch)
    return int(words[1]), kept


def assert_survived(log_dir: Path, written: Written, kept_by_the_pass: Triples, what: str) -> None:
    latest: dict[bytes, int] = {}
    for offset, (key, _) in sorted(written.items()):
        latest[key] = offset
    with DataDir.open(crash_config(log_dir), now_ms=NOW_MS) as data_dir:
        names = os.listdir(log_dir / f"{TOPIC}-0")
        assert not [n for n in names if n.endswith((".cleaned", ".swap", ".deleted"))], f"{what}: {names}"
        log = data_dir.partition(TOPIC, 0)
        assert log.log_end_offset == len(written), what
        for attempt in ("after the crash", "after a complete pass"):
            records = [(r.offset, r.key, r.value) for r in log.records(0)]
            offsets = [offset for offset, _, _ in records]
            assert offsets == sorted(set(offsets)), f"{what}, {attempt}: offsets repeat or go backwards"
            for offset, key, value in records:
                assert written[offset] == (key, value), f"{what}, {attempt}: offset {offset} changed"
            present = set(offsets)
            missing = sorted(offset for offset in latest.values() if offset not in present)
            assert not missing, f"{what}, {attempt}: latest records lost at offsets {missing}"
            if attempt == "after the crash":
                # Whatever step the pass died at, each group is either as before or as after it.
                lost = sorted(offset for offset, _, _ in kept_by_the_pass - set(records))
                assert not lost, f"{what}: records the pass keeps are gone at offsets {lost}"
            report = data_dir.compact(NOW_MS)
            assert not report.failed, f"{what}: {report.failed}"
    assert_log_dir_valid(log_dir)


def test_sigkill_at_every_phase_of_a_compaction(tmp_path: Path) -> None:
    pristine = tmp_path / "pristine"
    written = make_compacted_dir(pristine, NOW_MS)
    scratch = tmp_path / "scratch"
    passes = {phase: full_pass(pristine, scratch, phase) for phase in ("map", "write", "rename")}
    counts = {phase: count for phase, (count, _) in passes.items()}
    kept_by_the_pass = passes["rename"][1]
    assert len(kept_by_the_pass) < len(written)
    assert counts["rename"] >= 9, counts  # at least one group: 3 to .swap, 3+ to .deleted, 3 live
    trials = [("map", n) for n in (1, counts["map"])]
    trials += [("write", n) for n in range(1, counts["write"] + 1)]
    trials += [("rename", n) for n in range(1, counts["rename"] + 1)]
    for phase, n in trials:
        what = f"killed at {phase} #{n}"
        shutil.copytree(pristine, scratch)
        done = run_crasher(scratch, phase, n)
        assert done.returncode == -signal.SIGKILL, f"{what}: exit {done.returncode}: {done.stderr}"
        assert_survived(scratch, written, kept_by_the_pass, what)
        shutil.rmtree(scratch)
