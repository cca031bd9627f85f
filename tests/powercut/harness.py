"""Running power cuts: the passthrough process, the workload process, the cut, the check.

One *cut* of a scenario (`run_case`): lay out the backing dir (`scenarios.prepare`), mount the
passthrough over it with a cut point (operation number K, or none: the workload runs to its
end), start the workload on the mount, wait until the passthrough froze at K (or the workload
ended), SIGKILL the workload, cut the power (`cut` on the control socket: unmount, rewrite the
backing dir to the crash state), then check the backing dir with a normal open
(`scenarios.check_recovered`). Scenarios with two rounds mount the crashed dir again and cut a
second time before the check.

Cut points are drawn uniformly from the operations a whole run of the same workload makes
(`calibrate`: one uncut run, itself checked like any cut), from a seed, so a failing case
reproduces from its (scenario, workload seed, cut seed).
"""

from __future__ import annotations

import json
import os
import random
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from tests.powercut.scenarios import LOG_DIR_NAME, Journal, Scenario, check_recovered, prepare, scenario_named

REPO = Path(__file__).resolve().parents[2]
FUSERMOUNT = shutil.which("fusermount3") or "fusermount"
START_TIMEOUT_S = 30.0
RUN_TIMEOUT_S = 120.0


def mounted(path: Path) -> bool:
    """Whether `path` is a mount point, from the mount table: no stat of the path, which would
    hang on a frozen passthrough."""
    target = os.path.abspath(path)
    with open("/proc/self/mounts", encoding="utf-8") as mounts:
        for line in mounts:
            fields = line.split()
            if len(fields) > 1 and fields[1].encode().decode("unicode_escape") == target:
                return True
    return False


class HarnessError(Exception):
    """The harness itself failed (a process that would not start or stop): not a finding."""


class Passthrough:
    """The passthrough process (`python -m tests.powercut.passthrough`), mounted on return."""

    def __init__(
        self,
        backing: Path,
        mountpoint: Path,
        log_path: Path,
        *,
        mode: int,
        seed: int,
        cut_at_op: int | None,
        durability: str,
    ) -> None:
        self.mountpoint = mountpoint
        self.log_path = log_path
        # A Unix socket path must stay under 108 bytes: pytest's tmp dirs can be longer.
        self._socket_dir = Path(tempfile.mkdtemp(prefix="pc-"))
        self.control = self._socket_dir / "ctl"
        command = [sys.executable, "-m", "tests.powercut.passthrough", str(backing), str(mountpoint), str(self.control)]
        command += ["--mode", str(mode), "--seed", str(seed), "--durability", durability]
        if cut_at_op is not None:
            command += ["--cut-at-op", str(cut_at_op)]
        if os.environ.get("SEGLOGFS_POWERCUT_DEBUG"):
            command.append("--debug")  # every operation in the passthrough's log
        self._log = open(log_path, "ab")  # noqa: SIM115 (closed in stop)
        self.process = subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, stderr=self._log)
        self.summary: dict[str, object] | None = None
        assert self.process.stdout is not None
        ready, _, _ = select.select([self.process.stdout], [], [], START_TIMEOUT_S)
        line = self.process.stdout.readline() if ready else b""
        if line != b"ready\n":
            self.stop()
            raise HarnessError(f"the passthrough did not mount: {line!r}\n{self.log()}")

    def _ask(self, command: str, timeout_s: float) -> socket.socket:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(timeout_s)
        sock.connect(str(self.control))
        sock.sendall(command.encode() + b"\n")
        return sock

    @staticmethod
    def _answer(sock: socket.socket) -> str:
        data = b""
        while not data.endswith(b"\n"):
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
        sock.close()
        return data.decode()

    def wait_frozen_or_exit(self, child: subprocess.Popen[bytes], timeout_s: float) -> bool:
        """Wait until the passthrough froze at its cut point (True) or the child ended (False)."""
        sock = self._ask("wait", timeout_s)
        pidfd = os.pidfd_open(child.pid)
        try:
            ready, _, _ = select.select([sock, pidfd], [], [], timeout_s)
        finally:
            os.close(pidfd)
        if sock in ready:
            answer = self._answer(sock)
            if not answer.startswith("frozen"):
                raise HarnessError(f"unexpected answer to wait: {answer!r}")
            return True
        sock.close()
        if not ready:
            raise HarnessError(f"neither a freeze nor the end of the workload after {timeout_s} s")
        return False

    def cut(self) -> dict[str, object]:
        """Cut the power: the passthrough unmounts, writes the crash state and exits."""
        answer = self._answer(self._ask("cut", RUN_TIMEOUT_S))
        if not answer:
            raise HarnessError(f"no answer to cut\n{self.log()}")
        self.summary = json.loads(answer)
        self.process.wait(timeout=START_TIMEOUT_S)
        return self.summary

    def stop(self) -> None:
        """Unmount if still mounted and end the process, whatever state it is in."""
        if self.process.poll() is None:
            subprocess.run([FUSERMOUNT, "-u", "-z", str(self.mountpoint)], check=False, capture_output=True)
            try:
                self.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                # Frozen handlers never return by themselves: SIGTERM unmounts without a cut.
                self.process.send_signal(signal.SIGTERM)
                try:
                    self.process.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    self.process.kill()
                    self.process.wait(timeout=10)
        if self.process.stdout is not None:
            self.process.stdout.close()
        self._log.close()
        shutil.rmtree(self._socket_dir, ignore_errors=True)

    def log(self) -> str:
        if not self._log.closed:
            self._log.flush()
        return self.log_path.read_text(errors="replace")

    def exit_problems(self) -> list[str]:
        """The process must have exited 0 after a cut, with no error in its log."""
        problems = []
        if self.process.returncode != 0:
            problems.append(f"passthrough exited with {self.process.returncode}")
        text = self.log()
        if any(word in text for word in (" ERROR ", " CRITICAL ", "Traceback")):
            problems.append(f"passthrough log has errors:\n{text[-3000:]}")
        return problems


@dataclass
class Cut:
    """One round's cut: where it landed and what the passthrough kept."""

    round_: int
    cut_at_op: int | None
    summary: dict[str, object]
    workload_finished: bool


@dataclass
class CaseResult:
    scenario: str
    workload_seed: int
    cut_seed: int
    cuts: list[Cut] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def kinds_per_round(self) -> list[str]:
        """The operations each round made up to its cut (for an uncut run: all of them), one
        letter each (passthrough.KIND_LETTERS)."""
        return [str(c.summary["kinds"]) for c in self.cuts]

    def describe(self) -> str:
        where = ", ".join(
            f"round {c.round_}: cut at {c.summary['frozen_at']}/{c.summary['ops']} ({c.summary['frozen_kind']}, "
            f"mode {c.summary['mode']}, kept {c.summary['kept_ops']}/{c.summary['pending_ops']} pending"
            f"{', torn write' if c.summary['torn'] else ''})"
            for c in self.cuts
        )
        head = f"{self.scenario} workload seed {self.workload_seed} cut seed {self.cut_seed}: {where}"
        return "\n  ".join([head, *self.problems])


def draw_cut_point(rng: random.Random, kinds: str) -> int:
    """An operation number to cut after: half the time any operation, half the time one that
    changes names or syncs (where what is durable changes: a power cut right after a sync is the
    hardest on the durability promise, one right after a rename on the recovery of a swap)."""
    marked = [n for n, kind in enumerate(kinds, start=1) if kind not in "wt"]
    if marked and rng.random() < 0.5:
        return rng.choice(marked)
    return rng.randint(1, max(len(kinds), 1))


def _run_round(
    scenario: Scenario,
    workdir: Path,
    round_: int,
    workload_seed: int,
    *,
    mode: int,
    seed: int,
    cut_at_op: int | None,
    durability: str,
) -> tuple[Cut, list[str]]:
    backing, mountpoint = workdir / "backing", workdir / "mnt"
    mountpoint.mkdir(exist_ok=True)
    journal = workdir / "journal.jsonl"
    child_log = workdir / f"workload-{round_}.log"
    problems = []
    passthrough = Passthrough(
        backing,
        mountpoint,
        workdir / f"passthrough-{round_}.log",
        mode=mode,
        seed=seed,
        cut_at_op=cut_at_op,
        durability=durability,
    )
    child = None
    try:
        with open(child_log, "wb") as output:
            child = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "tests.powercut.scenarios",
                    scenario.name,
                    str(mountpoint / LOG_DIR_NAME),
                    str(journal),
                    str(workload_seed),
                    str(round_),
                ],
                cwd=REPO,
                stdout=output,
                stderr=subprocess.STDOUT,
            )
        frozen = passthrough.wait_frozen_or_exit(child, RUN_TIMEOUT_S)
        if frozen:
            child.send_signal(signal.SIGKILL)  # it dies once the cut aborts its pending request
        summary = passthrough.cut()
        child.wait(timeout=START_TIMEOUT_S)
        if not frozen and child.returncode != 0:
            problems.append(
                f"round {round_}: the workload failed ({child.returncode}):\n{child_log.read_text()[-3000:]}"
            )
        problems += passthrough.exit_problems()
    finally:
        if child is not None and child.poll() is None:
            child.kill()
        passthrough.stop()
        if child is not None:
            child.wait(timeout=START_TIMEOUT_S)
    return Cut(round_, cut_at_op, summary, workload_finished=not frozen), problems


def run_case(
    scenario_name: str,
    workdir: Path,
    *,
    workload_seed: int,
    cut_seed: int,
    calibration: list[str] | None,
    durability: str = "strict",
) -> CaseResult:
    """Run one case: every round of the scenario cut at a point drawn from `cut_seed` among the
    operations of the calibration run's round (`draw_cut_point`; no cut when `calibration` is
    None: the workload runs to its end), then check. Mode 1 or 2 is drawn too."""
    scenario = scenario_named(scenario_name)
    started = time.monotonic()
    result = CaseResult(scenario_name, workload_seed, cut_seed)
    rng = random.Random(cut_seed)
    workdir.mkdir(parents=True, exist_ok=True)
    backing = workdir / "backing"
    backing.mkdir()
    prepare(scenario, backing)
    for round_ in range(1, scenario.rounds + 1):
        mode = rng.choice((1, 2)) if calibration else 1  # after a clean close: what is durable, only
        cut_at = None
        if calibration and round_ not in scenario.uncut_rounds:
            cut_at = draw_cut_point(rng, calibration[min(round_, len(calibration)) - 1])
        cut, problems = _run_round(
            scenario,
            workdir,
            round_,
            workload_seed,
            mode=mode,
            seed=rng.randrange(2**32),
            cut_at_op=cut_at,
            durability=durability,
        )
        result.cuts.append(cut)
        result.problems += problems
        if problems:
            break
    if not result.problems:
        journal = Journal.read(workdir / "journal.jsonl")
        result.problems += check_recovered(scenario, backing / LOG_DIR_NAME, journal)
    result.seconds = time.monotonic() - started
    return result


def calibrate(scenario_name: str, workdir: Path, *, workload_seed: int, durability: str = "strict") -> CaseResult:
    """An uncut run (the cut comes after the workload closed the data dir), checked like any
    other; its operation count is the range cut points are drawn from."""
    return run_case(
        scenario_name, workdir, workload_seed=workload_seed, cut_seed=0, calibration=None, durability=durability
    )
