"""Readers and the writer at once: what a reader thread sees while the partition changes
(the concurrency model in docs/DEVELOPING.md)."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

from seglogfs.engine.log.segment import LogSegment
from seglogfs.engine.record.builder import build_batch
from seglogfs.engine.record.records import iter_batch_headers
from tests.conftest import NOW_MS, REPO


def open_segment(directory: Path, base_offset: int) -> LogSegment:
    return LogSegment(
        directory, base_offset, index_interval_bytes=10, max_index_bytes=1500, writable=True, created_ms=NOW_MS
    )


def test_first_uses_of_a_segments_indexes_race_to_one_index(tmp_path: Path) -> None:
    """Indexes open lazily on whichever thread needs them first, without the partition lock:
    every thread must get the one index, whole (two opens made two objects, and the second
    open of a new segment's file zeroed what the first had written)."""
    segment = open_segment(tmp_path, 0)
    for offset in range(50):
        data = build_batch([b"value %d" % offset], timestamps=offset, base_offset=offset)
        segment.append(data, list(iter_batch_headers(data)))
    expected = [segment.offset_index.lookup(offset).position for offset in range(50)]
    segment.close()
    for _ in range(20):
        reopened = open_segment(tmp_path, 0)
        start = threading.Barrier(8)
        seen: list[tuple[int, list[int], int]] = []

        def look(segment: LogSegment = reopened, start: threading.Barrier = start, seen: list = seen) -> None:
            start.wait()
            index = segment.offset_index
            positions = [index.lookup(offset).position for offset in range(50)]
            seen.append((id(index), positions, segment.max_timestamp_so_far.timestamp))

        threads = [threading.Thread(target=look) for _ in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(10)
        assert len({index for index, _, _ in seen}) == 1
        assert all(positions == expected and timestamp == 49 for _, positions, timestamp in seen)
        reopened.close()


def test_a_read_only_open_beside_a_writer_that_trims_indexes(tmp_path: Path) -> None:
    """A reader in another process opens the data dir read-only while a writer opens, appends,
    rolls and closes it (trimming its index files): the reader must never die (it mapped an
    index file, and the writer's trim made a mapped page fault: SIGBUS, exit 135)."""
    data = tmp_path / "data"
    command = [sys.executable, "-m", "tests.engine.readonly_beside_writer"]
    first = subprocess.run([*command, "writer", str(data), "0.5"], cwd=REPO, capture_output=True, check=False)
    assert first.returncode == 0, first.stderr
    writer = subprocess.Popen([*command, "writer", str(data), "6"], cwd=REPO, stdout=subprocess.PIPE)
    reader = subprocess.run([*command, "reader", str(data), "6"], cwd=REPO, capture_output=True, check=False)
    assert writer.wait(timeout=60) == 0
    assert reader.returncode == 0, (reader.returncode, reader.stderr.decode()[-2000:])
    assert b"reader opened" in reader.stdout
