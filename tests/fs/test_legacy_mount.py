"""A real mount over legacy message data (magic 0 and 1, every codec, a segment of magic 1 then
v2): `records`, `records.jsonl` and `by-offset/N` read what `consume` reads, `by-time/T` finds
magic 1 timestamps, and a writable mount appends v2 after the legacy messages."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from seglogfs.engine.record.builder import build_batch
from tests.conftest import NOW_MS, kafka_fixtures
from tests.engine.test_legacy import GZIP, LZ4, NONE, SNAPPY, message_set, sample, write_segment
from tests.fs.conftest import Mount

SEGLOGFS = [sys.executable, "-m", "seglogfs.mount_tools.cli"]


def consume(data: Path, topic: str, *args: str) -> bytes:
    done = subprocess.run([*SEGLOGFS, "consume", str(data), "--topic", topic, *args], check=True, capture_output=True)
    return done.stdout


def legacy_data(tmp_path: Path) -> Path:
    """numbers (magic 0, none) and hamlet-gzip (magic 0 wrappers) from the broker fixtures, and
    `mixed`: magic 1 messages in every codec, then v2 batches, in one segment."""
    data = tmp_path / "data"
    data.mkdir()
    for name in ("numbers-0", "hamlet-gzip-0"):
        shutil.copytree(kafka_fixtures() / "kafkalite-magic0" / name, data / name)
        for path in (data / name).iterdir():
            path.chmod(0o644)
    parts, offset = [], 0
    for codec in (NONE, GZIP, SNAPPY, LZ4):
        records = sample(1, 6, offset)
        parts.append(message_set(1, codec, records, offset))
        offset += len(records)
    parts.append(bytes(build_batch([b"v2-a", None], keys=[b"k", b"k"], timestamps=NOW_MS, base_offset=offset)))
    write_segment(data, "mixed", b"".join(parts))
    return data


@pytest.mark.parametrize("options", [["-o", "ro"], []], ids=["read-only", "writable"])
def test_the_views_of_legacy_partitions_read_what_consume_reads(mount, tmp_path: Path, options: list[str]) -> None:
    data = legacy_data(tmp_path)
    expected = {
        topic: (consume(data, topic, "--from-beginning"), consume(data, topic, "--from-beginning", "--format", "jsonl"))
        for topic in ("numbers", "hamlet-gzip", "mixed")
    }
    m: Mount = mount(data, *options)
    for topic, (text, jsonl) in expected.items():
        partition = m.path / topic / "0"
        assert (partition / "records").read_bytes() == text, topic
        assert (partition / "records.jsonl").read_bytes() == jsonl, topic
        assert (partition / "records").stat().st_size == len(text)
    numbers = m.path / "numbers" / "0"
    assert (numbers / "by-offset" / "11390").read_bytes() == b"11389\n11390\n11391\n11392\n"
    tail = subprocess.run(["tail", "-n", "2", str(numbers / "records")], check=True, capture_output=True).stdout
    assert tail == b"11391\n11392\n"
    mixed = m.path / "mixed" / "0"
    assert (mixed / "by-offset" / "20").read_bytes() == consume(data, "mixed", "--offset", "20")
    first_lz4 = sample(1, 6, 18)[0][0]  # the lz4 wrapper's first record (offsets 18..23)
    assert (mixed / f"by-time/{first_lz4}").read_bytes() == consume(data, "mixed", "--offset", "18")
    if not options:
        (mixed / "append").write_bytes(b"after\n")
        assert (mixed / "records").read_bytes() == expected["mixed"][0] + b"after\n"
    m.stop()
    if not options:
        assert consume(data, "mixed", "--offset", "26") == b"after\n"
