"""`consume --follow`/`--timeout-ms` beside a writer, `--json` documents of `check` and `clean`,
pipes closed early, and bad command lines: real `seglogfs` processes, real shell pipes."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from seglogfs.engine import BrokerConfig, DataDir
from tests.cli.support import SEGLOGFS, one_error_line, run, run_json
from tests.conftest import AS_FOREGROUND, REPO, kafka_fixtures

SMALL_SEGMENTS = ["--override", "log.segment.bytes=300"]  # a few records a segment: the follower sees rolls


def produce(data: Path, *values: str) -> None:
    run("produce", str(data), "--topic", "t", *SMALL_SEGMENTS, stdin="".join(v + "\n" for v in values).encode())


class Follower:
    """`seglogfs consume --follow …` in the background, read line by line."""

    def __init__(self, data: Path, *args: str) -> None:
        self.process = subprocess.Popen(
            [*AS_FOREGROUND, SEGLOGFS, "consume", str(data), "--topic", "t", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=REPO,
        )

    def lines(self, count: int) -> list[str]:
        assert self.process.stdout is not None
        return [self.process.stdout.readline().decode().rstrip("\n") for _ in range(count)]

    def end(self, timeout: float = 10) -> tuple[int, str, str]:
        out, err = self.process.communicate(timeout=timeout)
        return self.process.returncode, out.decode(), err.decode()


# -- consume --follow ---------------------------------------------------------------------------------
def test_follow_prints_what_another_process_appends(log_dir: Path) -> None:
    produce(log_dir, "old-1", "old-2")
    follower = Follower(
        log_dir, "--from-beginning", "--follow", "--max-messages", "12", "--property", "print.offset=true"
    )
    try:
        assert follower.lines(2) == ["Offset:0\told-1", "Offset:1\told-2"]  # it has reached the log end
        for batch in range(5):  # five processes, each rolling segments under the follower
            produce(log_dir, f"new-{batch}-a", f"new-{batch}-b")
        code, out, err = follower.end()
    finally:
        follower.process.kill()
    assert code == 0, err
    expected = [f"Offset:{2 + 2 * b + i}\tnew-{b}-{x}" for b in range(5) for i, x in enumerate("ab")]
    assert out.splitlines() == expected
    assert err == "Processed a total of 12 messages\n"
    assert len(list(log_dir.glob("t-0/*.log"))) > 1  # it followed a roll


def test_timeout_ms_ends_the_wait(log_dir: Path) -> None:
    produce(log_dir, "a", "b")
    started = time.monotonic()
    done = run("consume", str(log_dir), "--topic", "t", "--from-beginning", "--timeout-ms", "400")
    assert time.monotonic() - started >= 0.4
    assert done.stdout == "a\nb\n" and done.stderr == "Processed a total of 2 messages\n"
    # records that come within the timeout are printed, and the wait starts again after them
    follower = Follower(log_dir, "--from-beginning", "--timeout-ms", "2000", "--format", "jsonl")
    try:
        assert len(follower.lines(2)) == 2
        # (appended in this process: a CLI's start on a loaded machine can outlast the 2 s)
        with DataDir.open(BrokerConfig.load(log_dirs=[log_dir]), now_ms=int(time.time() * 1000)) as writer:
            writer.partition("t", 0).append_records([b"c"], now_ms=int(time.time() * 1000))
        code, out, err = follower.end()
    finally:
        follower.process.kill()
    assert code == 0 and '"value":"c"' in out and err == "Processed a total of 3 messages\n"
    negative = run("consume", str(log_dir), "--topic", "t", "--timeout-ms", "-5", code=2)
    assert "--timeout-ms -5: expected a number of milliseconds" in one_error_line(negative)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_ends_a_follower_quietly(log_dir: Path, signum: int) -> None:
    produce(log_dir, "a", "b", "c")
    follower = Follower(log_dir, "--from-beginning", "--follow")
    try:
        assert follower.lines(3) == ["a", "b", "c"]
        follower.process.send_signal(signum)
        code, out, err = follower.end()
    finally:
        follower.process.kill()
    assert (code, out, err) == (0, "", "Processed a total of 3 messages\n")


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_ends_a_consumer_whose_reader_does_not_read(log_dir: Path, signum: int) -> None:
    """Held in a write to a full pipe, a consumer still ends at once on a signal (the signal is
    otherwise acted on where the consumer holds nothing: between writes, at the follower's wait)."""
    produce(log_dir, *[f"record-{n:06d} " + "x" * 200 for n in range(20_000)])  # (4 MiB: more than a pipe holds)
    follower = Follower(log_dir, "--from-beginning", "--follow")
    try:
        assert follower.lines(1) == ["record-000000 " + "x" * 200]
        time.sleep(1)  # (the pipe fills: its reader reads nothing more)
        follower.process.send_signal(signum)
        code, out, err = follower.end()
    finally:
        follower.process.kill()
    count = int(re.fullmatch(r"Processed a total of (\d+) messages\n", err).group(1))  # type: ignore[union-attr]
    assert code == 0 and 1 < count < 20_000
    numbers = [int(line[7:13]) for line in out.splitlines()[1:]]  # (the first: where the test's buffer cut it)
    assert numbers == list(range(numbers[0], numbers[0] + len(numbers))) and numbers[-1] < count


def shell(command: str, tmp_path: Path) -> tuple[str, str]:
    """`command` in bash with pipefail: (its exit status, what seglogfs wrote on stderr)."""
    err = tmp_path / "stderr"
    done = subprocess.run(
        ["bash", "-c", f"set -o pipefail; {command} 2>{err} | head -1 >/dev/null; echo $?"],
        cwd=REPO,
        capture_output=True,
        timeout=30,
        check=False,
    )
    return done.stdout.decode().strip(), err.read_text()


def test_pipes_closed_early_end_quietly(log_dir: Path, tmp_path: Path) -> None:
    produce(log_dir, "only")
    # a follower with nothing more to write still notices that `head` has gone
    assert shell(f"{SEGLOGFS} consume {log_dir} --topic t --from-beginning --follow", tmp_path) == ("0", "")
    broker = kafka_fixtures() / "flink-on-prem-cp760"
    segment = broker / "orders-0" / "00000000000000000000.log"
    for command in (
        f"{SEGLOGFS} consume {broker} --topic orders --from-beginning --format jsonl",
        f"{SEGLOGFS} dump --print-data-log {segment}",
        f"{SEGLOGFS} dump {segment.with_suffix('.index')}",
    ):
        assert shell(command, tmp_path) == ("0", ""), command


# -- --json ---------------------------------------------------------------------------------------------
def test_check_json(log_dir: Path) -> None:
    produce(log_dir, "a", "b", "c")
    document = run_json("check", str(log_dir))
    assert document["clean"] is True and document["problems"] == [] and document["repaired"] is False
    assert {k: document[k] for k in ("logDirs", "partitions", "records", "inUseBy")} == {
        "logDirs": [str(log_dir)],
        "partitions": 1,
        "records": 3,
        "inUseBy": {},
    }
    with open(log_dir / "t-0" / "00000000000000000000.log", "ab") as segment:
        segment.write(b"\x00\x00\x00\x00\x00\x00\x00\x03\x00\x00\x01")  # a torn batch header
    damaged = run("check", str(log_dir), "--json", code=4)
    problems = json.loads(damaged.stdout)["problems"]
    assert len(problems) == 1 and "11 bytes after the last whole batch" in problems[0]["message"]
    assert problems[0]["path"].endswith("00000000000000000000.log") and damaged.stderr == ""
    repaired = json.loads(run("check", str(log_dir), "--repair", "--json", code=7).stdout)
    # The torn header is kept beside the data dir: not clean while it is there.
    assert repaired["repaired"] is True and repaired["clean"] is False and repaired["problems"] == []
    assert repaired["problemsBeforeRepair"] == problems and repaired["records"] == 3
    [kept] = repaired["setAsideByRepair"]
    assert (kept["source"], kept["position"], kept["bytes"], kept["records"]) == (
        "00000000000000000000.log",
        problems and int(problems[0]["message"].rsplit("position ", 1)[1].rstrip(")")),
        11,
        0,
    )
    assert [run["records"] for run in repaired["setAside"]] == [0]


def test_clean_json_and_dry_run_json(log_dir: Path) -> None:
    produce(log_dir, *(f"record-{i:02d}" for i in range(20)))
    expire = ["--override", "log.retention.ms=1000", "--now", str(int(time.time() * 1000) + 60_000)]
    plan = run_json("clean", str(log_dir), "--dry-run", *expire)
    assert plan["dryRun"] is True and plan["compaction"] == [] and plan["failed"] == []
    [would] = plan["retention"]
    assert (would["topic"], would["partition"], would["reason"]) == ("t", 0, "retention.ms=1000")
    assert would["segments"][0] == 0 and would["logStartOffset"] == 20
    assert len(run("consume", str(log_dir), "--topic", "t", "--from-beginning").stdout.splitlines()) == 20

    done = run_json("clean", str(log_dir), *expire)
    assert done["dryRun"] is False
    [deleted] = done["retention"]
    assert deleted["segments"] == would["segments"] and deleted["logStartOffset"] == 20
    again = run_json("clean", str(log_dir), *expire)
    assert (again["retention"], again["compaction"], again["unknownConfigs"]) == ([], [], {})
    assert run("clean", str(log_dir), *expire).stdout == "nothing to delete or compact\n"


# -- bad command lines ------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["consume", "{d}", "--topic", "t", "--bogus"], "unrecognized arguments: --bogus"),
        (["consume", "{d}", "--topic", "t", "--max-messages", "x"], "argument --max-messages: invalid int value: 'x'"),
        (["consume", "{d}"], "the following arguments are required: --topic"),
        (["topics", "{d}"], "seglogfs topics: argument ACTION: invalid choice"),
        (["topics", "{d}", "rename", "--topic", "t"], "invalid choice"),
        (["topics"], "the following arguments are required: ACTION"),
        (["clean", "{d}", "--now", "soon"], "argument --now: invalid int value: 'soon'"),
        (["nonsense"], "argument COMMAND: invalid choice: 'nonsense'"),
    ],
)
def test_a_bad_command_line_is_one_line_and_exit_2(log_dir: Path, args: list[str], message: str) -> None:
    result = run(*[a.replace("{d}", str(log_dir)) for a in args], code=2)
    line = one_error_line(result)
    assert message in line and "--help" in line and result.stdout == ""
