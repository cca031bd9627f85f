"""Batches whose CRC holds but whose header or records lie, as a damaged or hostile data dir holds
them: each command answers with an engine error naming the file and the batch's position (or, for
`check`, a problem naming them), quickly and in bounded memory, never `internal error` and never
records with wrapped offsets.

- A record count of 0x7fffffff over a few records: `consume` (text and JSON Lines), `topics
  describe`, `check` and `dump` answer in under 2 s of CPU and 200 MB of RSS (the count asked for
  32 GiB of columns; a read of the records past the section's end was an IndexError).
- A base offset near int64's end: the records' offsets (base + delta) are past int64; `consume`
  printed them wrapped to negative numbers and exited 0.
- `check --repair` of a dir holding a lying count: no `internal error` (it ended with one on
  every run: the time index's rebuild read the records past the section).
"""

from __future__ import annotations

import struct
import subprocess
from pathlib import Path

import pytest

from seglogfs.engine.record.builder import build_batch
from seglogfs.engine.record.compression import CompressionType
from seglogfs.engine.record.records import compute_crc
from tests.cli.support import SEGLOGFS
from tests.conftest import NOW_MS, REPO, run_measured

SEGMENT = "00000000000000000000.log"


GOOD = build_batch([b"good-%d" % i for i in range(3)], timestamps=NOW_MS)
AT = len(GOOD)  # where the lying batch starts


def _data_dir(
    tmp_path: Path, records: int, mutate, *, good: bool = True, compression: CompressionType = CompressionType.NONE
) -> Path:
    """A data dir whose topic t's one segment holds a good batch (unless not `good`), then (at
    `AT`, or 0) a batch of `records` records changed by `mutate` (its CRC recomputed)."""
    partition = tmp_path / "data" / "t-0"
    partition.mkdir(parents=True)
    lying = build_batch(
        [b"v%d" % i for i in range(records)], timestamps=NOW_MS, base_offset=3 if good else 0, compression=compression
    )
    mutate(lying)
    struct.pack_into(">I", lying, 17, compute_crc(lying))
    (partition / SEGMENT).write_bytes((bytes(GOOD) if good else b"") + bytes(lying))
    return tmp_path / "data"


def _lying_count(batch: bytearray) -> None:
    struct.pack_into(">i", batch, 57, 0x7FFFFFFF)


def _run_accounted(*args: str) -> tuple[subprocess.CompletedProcess[str], float, int]:
    """`seglogfs ARGS`, with its CPU time (user + system, seconds) and peak RSS (bytes), its own
    (measured by GNU time)."""
    result = run_measured([SEGLOGFS, *args])
    done = subprocess.CompletedProcess([SEGLOGFS, *args], result.returncode, result.stdout, result.stderr)
    return done, result.cpu_seconds, result.max_rss_bytes


@pytest.mark.parametrize("records", [3, 20])
@pytest.mark.parametrize(
    "command",
    [
        ("consume", "{data}", "--topic", "t", "--from-beginning"),
        ("consume", "{data}", "--topic", "t", "--from-beginning", "--format", "jsonl"),
        ("topics", "describe", "{data}", "--topic", "t"),
        ("check", "{data}"),
        ("dump", "--print-data-log", "{segment}"),
    ],
    ids=["consume", "consume-jsonl", "topics-describe", "check", "dump"],
)
def test_a_record_count_of_0x7fffffff_is_a_clear_error_in_bounded_time_and_memory(
    tmp_path: Path, records: int, command: tuple[str, ...]
) -> None:
    data = _data_dir(tmp_path, records, _lying_count)
    segment = data / "t-0" / SEGMENT
    args = [part.format(data=data, segment=segment) for part in command]
    done, cpu_seconds, rss_bytes = _run_accounted(*args)
    assert "internal error" not in done.stderr and "Traceback" not in done.stderr, done.stderr
    assert cpu_seconds < 2, cpu_seconds
    assert rss_bytes < 200 << 20, rss_bytes
    if command[0] == "topics":  # (describe reads batch headers only: the log end is the lying batch's)
        assert done.returncode == 0, done.stderr
        return
    if command[0] == "check":
        assert done.returncode == 4, done.stdout + done.stderr
        problem = f"{segment}: invalid batch at position {AT}: undecodable records: a record count of 2147483647"
        assert problem in done.stdout, done.stdout
        return
    assert done.returncode == 1, done.stdout + done.stderr
    line = done.stderr.strip()
    assert str(segment) in line and f"position {AT}" in line and "record count of 2147483647" in line, line
    if command[0] == "consume":  # the good batch before it was printed first
        assert "good-2" in done.stdout


def test_offsets_past_int64_end_consume_naming_the_file_and_position(tmp_path: Path) -> None:
    """Records whose offsets (base + delta) pass int64's end: an error naming the batch, not
    negative offsets and exit 0, whichever path renders them (a batch over and under eight
    records, text and JSON Lines)."""
    for records in (3, 20):
        data = _data_dir(
            tmp_path / str(records), records, lambda batch: struct.pack_into(">q", batch, 0, (1 << 63) - 2)
        )
        segment = data / "t-0" / SEGMENT
        for fmt in ("text", "jsonl"):
            done = subprocess.run(
                [SEGLOGFS, "consume", str(data), "--topic", "t", "--offset", "0", "--format", fmt,
                 "--property", "print.offset=true"],
                cwd=REPO, capture_output=True, text=True, timeout=60, check=False,
            )  # fmt: skip
            assert done.returncode == 1, done.stdout + done.stderr
            assert "-922337203685477" not in done.stdout
            line = done.stderr.strip()
            assert f"{segment}: corrupt record batch at position {AT}" in line and "past int64" in line, line


def test_check_repair_of_a_lying_count_is_no_internal_error(tmp_path: Path) -> None:
    """`check --repair` of a batch whose record count lies (CRC valid): never `internal error`
    (exit 70, on every run: the dir could not be repaired); the first run sets the batch aside
    and names it, the next finds only what is set aside."""
    data = _data_dir(tmp_path, 3, lambda batch: struct.pack_into(">i", batch, 57, 4), good=False)
    statuses = []
    for _ in range(2):
        done = subprocess.run(
            [SEGLOGFS, "check", str(data), "--repair"],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.returncode != 70 and "internal error" not in done.stderr, done.stderr
        assert "Traceback" not in done.stderr
        assert f"set aside in {data}.seglogfs-set-aside" in done.stdout, done.stdout + done.stderr
        statuses.append(done.returncode)
    assert statuses == [7, 7]  # (set aside, nothing else wrong)


def test_check_repair_sets_a_count_too_large_for_its_batch_aside(tmp_path: Path) -> None:
    """A record count that the batch's own bytes cannot hold (uncompressed, CRC valid), which every
    reader refuses: recovery cuts there, so `check --repair` sets the batch aside, says where, and
    `check` afterwards finds no problem (only what is set aside)."""
    data = _data_dir(tmp_path, 3, _lying_count)
    segment = data / "t-0" / SEGMENT
    repaired = subprocess.run(
        [SEGLOGFS, "check", str(data), "--repair"], cwd=REPO, capture_output=True, text=True, timeout=60, check=False
    )
    said = repaired.stdout + repaired.stderr
    assert "internal error" not in said and "set aside" in said, said
    assert segment.read_bytes() == bytes(GOOD)
    again = subprocess.run(
        [SEGLOGFS, "check", str(data)], cwd=REPO, capture_output=True, text=True, timeout=60, check=False
    )
    assert again.returncode == 7 and ": no problems, but 88 bytes" in again.stdout, again.stdout + again.stderr
