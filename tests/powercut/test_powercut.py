"""Simulated power cuts under the engine's crash scenarios (see tests/powercut/scenarios.py).

For each scenario: one uncut run (the workload closes the data dir, then the power goes), which
also counts the file-system operations the workload makes, then CUTS_PER_SCENARIO runs cut after
an operation drawn from a seed. A failure names its scenario, workload seed and cut seed, and
where each cut landed; `run_case` with the same three reproduces it. The passthrough's strict
POSIX rule applies: a new name is durable only once its directory was fsynced.

More cuts: `SEGLOGFS_POWERCUT_CUTS=20`, or `python -m bench.powercut_bench --cuts 200`.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.powercut.harness import CaseResult, calibrate, mounted, run_case
from tests.powercut.scenarios import SCENARIOS

# What recovery says when it repairs a torn tail on purpose (mode 2 keeps part of a write).
pytestmark = pytest.mark.expect_warnings(
    r"cut \d+ bytes after the last valid batch", r"removed, it followed a damaged segment"
)

WORKLOAD_SEED = 1
CUTS_PER_SCENARIO = int(os.environ.get("SEGLOGFS_POWERCUT_CUTS", "5"))
_calibrations: dict[str, CaseResult] = {}


def _calibration(name: str, tmp_path_factory: pytest.TempPathFactory) -> CaseResult:
    """The uncut run of a scenario, made once per session (its operations are where cuts go)."""
    if name not in _calibrations:
        _calibrations[name] = calibrate(name, tmp_path_factory.mktemp(f"{name}-uncut"), workload_seed=WORKLOAD_SEED)
    return _calibrations[name]


def _assert_unmounted(result: CaseResult, workdir: Path) -> None:
    assert not mounted(workdir / "mnt"), f"{workdir / 'mnt'} is still mounted after {result.describe()}"


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_power_cut_after_a_clean_close_keeps_everything(name: str, tmp_path_factory: pytest.TempPathFactory) -> None:
    result = _calibration(name, tmp_path_factory)
    assert result.cuts and all(cut.workload_finished for cut in result.cuts), result.describe()
    assert not result.problems, result.describe()


@pytest.mark.parametrize(
    ("name", "cut_seed"), [(name, seed) for name in sorted(SCENARIOS) for seed in range(1, CUTS_PER_SCENARIO + 1)]
)
def test_power_cut_keeps_what_was_acknowledged(
    name: str, cut_seed: int, tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    calibration = _calibration(name, tmp_path_factory)
    workdir = tmp_path / "case"
    result = run_case(
        name, workdir, workload_seed=WORKLOAD_SEED, cut_seed=cut_seed, calibration=calibration.kinds_per_round
    )
    _assert_unmounted(result, workdir)
    assert not result.problems, result.describe()


def test_the_harness_catches_a_flush_that_does_not_fsync(tmp_path: Path) -> None:
    """The control: an engine whose flush() syncs nothing loses acknowledged records, and the
    harness must say so (three cuts in the first half of the workload)."""
    calibration = calibrate("flush_without_fsync", tmp_path / "uncut", workload_seed=WORKLOAD_SEED)
    kinds = calibration.kinds_per_round[0]
    found = []
    for cut_seed in range(1, 4):
        result = run_case(
            "flush_without_fsync",
            tmp_path / f"cut{cut_seed}",
            workload_seed=WORKLOAD_SEED,
            cut_seed=cut_seed,
            calibration=[kinds[: len(kinds) // 2]],
        )
        found += [p for p in result.problems if "acknowledged records are lost" in p]
    assert found, "three cuts of an engine that never fsyncs found no lost record"
