"""Many simulated power cuts under the engine's crash scenarios (tests/powercut/).

    .venv/bin/python -m bench.powercut_bench [--cuts 200] [--scenario NAME ...]
        [--workload-seeds 3] [--seed 0] [--durability strict|ext4] [--keep DIR] [--json FILE]

The cuts are shared out evenly over the scenarios. For each scenario and workload seed, one uncut
run counts the workload's file-system operations (and is itself checked: a power cut after a
clean close must keep everything); each cut then lands after an operation drawn from its cut seed,
in mode 1 (only what is durable) or 2 (plus a random prefix of the rest). A scenario with two
rounds makes two cuts per case. Every case is checked as tests/powercut/scenarios.py says.

Printed: per scenario, the cases and cuts made, how many found a problem, how many recoveries
warned (torn tails cut), the first problems found with the seeds that reproduce them, and one
summary line. The exit status is 1 when a problem was found, 0 otherwise. `--keep DIR` keeps the
work dirs of failing cases there (backing dir, journal, logs of each process).
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from tests.powercut.harness import CaseResult, HarnessError, calibrate, run_case
from tests.powercut.scenarios import SCENARIOS


class _WarningCounter(logging.Handler):
    """Counts the warnings recovery logs in this process (the checks open the dirs here)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.count = 0

    def emit(self, record: logging.LogRecord) -> None:
        self.count += 1


@dataclass
class ScenarioFigures:
    name: str
    uncut: int = 0
    uncut_failed: int = 0
    cases: int = 0
    cuts: int = 0
    failed: int = 0
    harness_errors: int = 0
    recovery_warnings: int = 0
    modes: Counter[int] = field(default_factory=Counter)
    seconds: float = 0.0
    examples: list[str] = field(default_factory=list)

    def add(self, result: CaseResult, *, uncut: bool) -> None:
        if uncut:
            self.uncut += 1
            self.uncut_failed += bool(result.problems)
        else:
            self.cases += 1
            self.cuts += len(result.cuts)
            self.failed += bool(result.problems)
            self.modes.update(int(cut.summary["mode"]) for cut in result.cuts)  # type: ignore[call-overload]
        if result.problems and len(self.examples) < 3:
            self.examples.append(result.describe())


def _share(total: int, names: list[str]) -> dict[str, int]:
    base, extra = divmod(total, len(names))
    return {name: base + (slot < extra) for slot, name in enumerate(names)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cuts", type=int, default=200, help="cases to cut, shared over the scenarios")
    parser.add_argument("--scenario", action="append", choices=sorted(SCENARIOS), help="only these (repeatable)")
    parser.add_argument("--workload-seeds", type=int, default=3, help="workloads per scenario (each calibrated)")
    parser.add_argument("--seed", type=int, default=0, help="first cut seed")
    parser.add_argument("--durability", choices=("strict", "ext4"), default="strict")
    parser.add_argument("--keep", type=Path, help="keep the work dirs of failing cases here")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()

    counter = _WarningCounter()
    root = logging.getLogger()
    root.handlers[:] = [counter]  # counted, not printed
    root.setLevel(logging.WARNING)
    names = args.scenario or sorted(SCENARIOS)
    shares = _share(args.cuts, names)
    workdir_root = Path(tempfile.mkdtemp(prefix="powercut-bench-"))
    started = time.monotonic()
    figures = []
    print(f"power cuts: {args.cuts} cases over {len(names)} scenarios, durability {args.durability}", flush=True)
    try:
        for name in names:
            scenario_started = time.monotonic()
            figure = ScenarioFigures(name)
            figures.append(figure)
            calibrations: dict[int, list[str]] = {}
            for workload_seed in range(1, args.workload_seeds + 1):
                workdir = workdir_root / name / f"w{workload_seed}-uncut"
                warnings_before = counter.count
                try:
                    result = calibrate(name, workdir, workload_seed=workload_seed, durability=args.durability)
                except HarnessError as error:
                    figure.harness_errors += 1
                    print(f"  harness error in {name} uncut run: {error}", flush=True)
                    continue
                figure.recovery_warnings += counter.count - warnings_before
                figure.add(result, uncut=True)
                calibrations[workload_seed] = result.kinds_per_round
                _keep_or_remove(workdir, result, args.keep)
            seeds = sorted(calibrations)
            for slot in range(shares[name] if seeds else 0):
                workload_seed = seeds[slot % len(seeds)]
                cut_seed = args.seed + slot + 1
                workdir = workdir_root / name / f"w{workload_seed}-c{cut_seed}"
                warnings_before = counter.count
                try:
                    result = run_case(
                        name,
                        workdir,
                        workload_seed=workload_seed,
                        cut_seed=cut_seed,
                        calibration=calibrations[workload_seed],
                        durability=args.durability,
                    )
                except HarnessError as error:
                    figure.harness_errors += 1
                    print(f"  harness error in {name} w{workload_seed} c{cut_seed}: {error}", flush=True)
                    continue
                figure.recovery_warnings += counter.count - warnings_before
                figure.add(result, uncut=False)
                _keep_or_remove(workdir, result, args.keep)
            figure.seconds = time.monotonic() - scenario_started
            _print_figure(figure)
    finally:
        shutil.rmtree(workdir_root, ignore_errors=True)
    elapsed = time.monotonic() - started
    cases = sum(f.cases for f in figures)
    cuts = sum(f.cuts + f.uncut for f in figures)
    failed = sum(f.failed + f.uncut_failed for f in figures)
    bad = [f.name for f in figures if f.failed or f.uncut_failed]
    errors = sum(f.harness_errors for f in figures)
    print(
        f"summary: {cuts} power cuts ({cases} cut cases + {sum(f.uncut for f in figures)} after a clean close) "
        f"in {elapsed:.0f} s, {failed} found a problem"
        + (f" (in {', '.join(bad)})" if bad else "")
        + (f", {errors} harness errors" if errors else "")
        + f"; durability {args.durability}",
        flush=True,
    )
    if args.json:
        document = {
            "durability": args.durability,
            "seconds": elapsed,
            "scenarios": {
                f.name: {
                    "uncut": f.uncut,
                    "uncut_failed": f.uncut_failed,
                    "cases": f.cases,
                    "cuts": f.cuts,
                    "failed": f.failed,
                    "recovery_warnings": f.recovery_warnings,
                    "harness_errors": f.harness_errors,
                    "examples": f.examples,
                }
                for f in figures
            },
        }
        args.json.write_text(json.dumps(document, indent=2) + "\n")
    return 1 if failed or errors else 0


def _keep_or_remove(workdir: Path, result: CaseResult, keep: Path | None) -> None:
    if result.problems and keep is not None:
        target = keep / workdir.parent.name / workdir.name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copytree(workdir, target, dirs_exist_ok=True)
    shutil.rmtree(workdir, ignore_errors=True)


def _print_figure(f: ScenarioFigures) -> None:
    modes = ", ".join(f"mode {mode}: {count}" for mode, count in sorted(f.modes.items()))
    print(
        f"{f.name:15} {f.cases:4} cases, {f.cuts:4} cuts ({modes}): {f.failed:3} found a problem; "
        f"uncut {f.uncut} ({f.uncut_failed} failed); {f.recovery_warnings} recovery warnings; {f.seconds:.0f} s",
        flush=True,
    )
    for example in f.examples:
        print("    " + example.replace("\n", "\n    ")[:1200], flush=True)


if __name__ == "__main__":
    sys.exit(main())
