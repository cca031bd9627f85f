"""`PartitionLog.adopt_batches`: a file of staged v2 batches made a segment by a rename.

What it must match is `append_batches(assign_offsets=True)` into a freshly rolled segment: the same
`.log`, `.index` and `.timeindex` bytes, the same checks and errors; and a refusal changes nothing,
the file included (its length, its place).
"""

from __future__ import annotations

import errno
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from seglogfs.engine import CorruptRecordError, InvalidRecordError, PartitionLog, RecordTooLargeError
from seglogfs.engine.record.builder import build_batch
from seglogfs.engine.record.compression import CompressionType
from seglogfs.engine.record.records import TimestampType, iter_batch_headers
from tests.conftest import NOW_MS, make_log
from tests.engine.test_log import reopen, values_of


def staged_batches(count: int, *, per_batch: int = 7, keyed: bool = True) -> bytes:
    """`count` batches as a producer stages them: offsets from 0, timestamps rising."""
    batches = []
    for b in range(count):
        values = [b"value-%d-%d" % (b, i) * (1 + i % 3) for i in range(per_batch)]
        keys = [b"key-%d" % i for i in range(per_batch)] if keyed else None
        codec = CompressionType.GZIP if b % 5 == 4 else CompressionType.NONE
        batches.append(
            build_batch(
                values, keys=keys, timestamps=[NOW_MS + b * 10 + i for i in range(per_batch)], compression=codec
            )
        )
    return b"".join(batches)


def segment_files(log: PartitionLog, base: int) -> tuple[bytes, bytes, bytes]:
    name = f"{base:020d}"
    return tuple((log.directory / f"{name}.{suffix}").read_bytes() for suffix in ("log", "index", "timeindex"))


@pytest.fixture
def two_dirs(tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    yield (tmp_path / "a" / "t-0", tmp_path / "b" / "t-0")


def test_an_adopted_file_is_the_segment_append_batches_would_have_written(
    two_dirs: tuple[Path, Path], tmp_path: Path
) -> None:
    adopted_dir, appended_dir = two_dirs
    adopted_dir.parent.mkdir()
    appended_dir.parent.mkdir()
    data = staged_batches(40)
    adopted = make_log(adopted_dir, index_interval_bytes=300)
    appended = make_log(appended_dir, index_interval_bytes=300)
    for log in (adopted, appended):
        log.append_records([b"before-1", b"before-2"], now_ms=NOW_MS)
    staged = tmp_path / "a" / "staged.batches"
    staged.write_bytes(data)

    info = adopted.adopt_batches(staged, now_ms=NOW_MS)
    appended.roll(NOW_MS)
    expected = appended.append_batches(data, assign_offsets=True, now_ms=NOW_MS)

    assert not staged.exists()
    assert info == expected
    assert (info.first_offset, info.last_offset, info.records) == (2, 281, 280)
    assert [s.base_offset for s in adopted.segments] == [0, 2]
    assert adopted.log_end_offset == appended.log_end_offset == 282
    assert values_of(adopted) == values_of(appended)
    for timestamp in (NOW_MS, NOW_MS + 205, NOW_MS + 396):
        assert adopted.offset_for_timestamp(timestamp) == appended.offset_for_timestamp(timestamp)
    adopted.append_records([b"after"], now_ms=NOW_MS)  # the adopted segment is the active one
    appended.append_records([b"after"], now_ms=NOW_MS)
    assert [s.base_offset for s in adopted.segments] == [0, 2]
    adopted.close()
    appended.close()
    assert segment_files(adopted, 2) == segment_files(appended, 2)
    assert len(segment_files(adopted, 2)[1]) > 8 * 5  # several offset index entries
    again = reopen(adopted, clean=False, recovery_point=0)  # a crash before any flush: recovered whole
    assert again.log_end_offset == 283 and values_of(again)[-1] == b"after"
    again.close()


def test_adoption_stamps_log_append_time_where_the_topic_asks(tmp_path: Path) -> None:
    log = make_log(tmp_path / "t-0", message_timestamp_type="LogAppendTime")
    staged = tmp_path / "staged.batches"
    staged.write_bytes(staged_batches(3))
    log.adopt_batches(staged, now_ms=NOW_MS + 99_999)
    headers = [h for s in log.segments for h in s.iter_headers()]
    assert len(headers) == 3
    assert all(
        h.timestamp_type is TimestampType.LOG_APPEND_TIME and h.max_timestamp == NOW_MS + 99_999 for h in headers
    )
    assert all(record.timestamp == NOW_MS + 99_999 for record in log.records(0))
    log.close()


def _corrupt_middle(data: bytes) -> bytes:
    headers = list(iter_batch_headers(data))
    middle = headers[len(headers) // 2]
    spoiled = bytearray(data)
    spoiled[middle.next_position - 1] ^= 0xFF
    return bytes(spoiled)


@pytest.mark.parametrize(
    ("case", "overrides", "error", "message"),
    [
        ("bad CRC in the middle", {}, CorruptRecordError, "CRC"),
        ("cut last batch", {}, CorruptRecordError, "incomplete record batch"),
        ("empty file", {}, CorruptRecordError, "incomplete record batch"),
        ("garbage", {}, CorruptRecordError, "incomplete record batch"),
        ("unkeyed on a compacted topic", {"cleanup_policy": "compact"}, InvalidRecordError, "no key"),
        ("a batch over max.message.bytes", {"max_message_bytes": 200}, RecordTooLargeError, "max.message.bytes=200"),
        ("the file over segment.bytes", {"segment_bytes": 2000}, RecordTooLargeError, "segment.bytes=2000"),
    ],
)
def test_a_refused_file_changes_nothing(
    tmp_path: Path, case: str, overrides: dict[str, object], error: type[Exception], message: str
) -> None:
    log = make_log(tmp_path / "t-0", **overrides)
    log.append_records([b"a"], keys=[b"k"], now_ms=NOW_MS)
    data = staged_batches(20, keyed=case != "unkeyed on a compacted topic")
    data = {
        "bad CRC in the middle": _corrupt_middle(data),
        "cut last batch": data[:-5],
        "empty file": b"",
        "garbage": b"\x00\x01garbage" * 100,
    }.get(case, data)
    staged = tmp_path / "staged.batches"
    staged.write_bytes(data)
    segments = [(s.base_offset, s.size) for s in log.segments]
    with pytest.raises(error, match=message) as raised:
        log.adopt_batches(staged, now_ms=NOW_MS)
    if error is CorruptRecordError:
        assert str(staged) in str(raised.value)  # the error names the file
    assert staged.stat().st_size == len(data)
    assert [(s.base_offset, s.size) for s in log.segments] == segments
    assert log.log_end_offset == 1
    assert sorted(p.name for p in log.directory.iterdir() if p.suffix == ".log") == [f"{0:020d}.log"]
    log.append_records([b"b"], keys=[b"k"], now_ms=NOW_MS)
    assert values_of(log) == [b"a", b"b"]
    log.close()


def test_a_file_on_ansmall_tmpfs_is_refused_with_exdev(tmp_path: Path, small_tmpfs: Path) -> None:
    log = make_log(tmp_path / "t-0")
    log.append_records([b"a"], now_ms=NOW_MS)
    staged = small_tmpfs / "staged.batches"
    data = staged_batches(5)
    staged.write_bytes(data)
    with pytest.raises(OSError) as raised:
        log.adopt_batches(staged, now_ms=NOW_MS)
    assert raised.value.errno == errno.EXDEV
    assert staged.stat().st_size == len(data)
    assert log.log_end_offset == 1
    log.append_batches(staged.read_bytes(), assign_offsets=True, now_ms=NOW_MS)  # the copy still works
    assert log.log_end_offset == 36 and values_of(log)[1] == b"value-0-0"
    log.close()
    assert [p.name for p in log.directory.glob("*.log")] and all(
        os.stat(p).st_size for p in log.directory.glob("*.log")
    )


def test_a_crash_between_the_unlink_and_the_rename_loses_nothing_appended_before(tmp_path: Path) -> None:
    """Adoption unlinks the rolled, empty `.log` before renaming the staged file to its name: a
    crash in between leaves that segment's index files without a `.log`, which loading removes;
    the staged file is still in its place for the job's next attempt."""
    log = make_log(tmp_path / "t-0")
    log.append_records([b"kept"], now_ms=NOW_MS)
    staged = tmp_path / "staged.batches"
    staged.write_bytes(staged_batches(3))
    segment = log.roll(NOW_MS)  # what adopt_batches does first
    log.flush()
    segment.log_path.unlink()  # ... and the crash comes before the rename
    directory, config = log.directory, log.config
    for each in log.segments:
        each.close_handlers()
    again = PartitionLog.open(directory, "t", 0, config, writable=True, clean_shutdown=False, now_ms=NOW_MS)
    assert values_of(again) == [b"kept"]
    assert not list(directory.glob(f"{1:020d}.*"))  # the orphaned index files removed
    assert staged.exists()
    again.adopt_batches(staged, now_ms=NOW_MS)  # the next attempt
    assert values_of(again)[:2] == [b"kept", b"value-0-0"] and again.log_end_offset == 22
    again.close()
