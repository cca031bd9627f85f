"""What recovery and repair cut from a log is kept beside the log dir, byte for byte
(engine.log.set_aside), and the log left behind is the one Kafka's LogLoader leaves."""

from __future__ import annotations

import json
import os
import shutil
import stat
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from seglogfs.engine import BrokerConfig, DataDir, PartitionLog
from seglogfs.engine.check import check_log_dirs, plan_repair
from seglogfs.engine.log.checkpoint import CLEAN_SHUTDOWN_FILE
from seglogfs.engine.log.set_aside import MANIFEST, SetAsideError, find_set_aside, place_for
from tests.conftest import NOW_MS

pytestmark = pytest.mark.expect_warnings(r"cut \d+ bytes after the last valid batch")


def fill(log_dir: Path, batches: int, per_batch: int = 5, segment_bytes: int = 700) -> dict[str, bytes]:
    """Partition t-0 of `batches` batches in segments of about `segment_bytes`, closed cleanly;
    returns its `.log` files' bytes by name."""
    config = BrokerConfig.load(overrides=[f"log.segment.bytes={segment_bytes}"], log_dirs=[log_dir])
    with DataDir.open(config, now_ms=NOW_MS) as data_dir:
        log = data_dir.partition_for_append("t", 0, now_ms=NOW_MS)[0]
        for number in range(batches):
            log.append_records([b"b%d-r%d" % (number, i) for i in range(per_batch)], now_ms=NOW_MS)
    return logs_of(log_dir)


def logs_of(log_dir: Path) -> dict[str, bytes]:
    return {path.name: path.read_bytes() for path in sorted((log_dir / "t-0").glob("*.log"))}


def repair(log_dir: Path) -> list:
    config = BrokerConfig.load(log_dirs=[log_dir])
    with DataDir.open(config, recover_all=True, now_ms=NOW_MS) as data_dir:
        return list(data_dir.partition("t", 0).set_aside)


def test_a_torn_tail_after_an_unclean_stop_is_kept_and_reported(log_dir: Path) -> None:
    before = fill(log_dir, 4)
    [(name, content)] = [item for item in before.items() if item[0] == max(before)]
    torn = b"\x00\x00\x00\x00\x00\x00\x00\x63\x00\x00\x01\x00garbage"
    with open(log_dir / "t-0" / name, "ab") as segment:
        segment.write(torn)
    (log_dir / CLEAN_SHUTDOWN_FILE).unlink(missing_ok=True)  # (a crash leaves none)

    config = BrokerConfig.load(log_dirs=[log_dir])
    with DataDir.open(config, now_ms=NOW_MS) as data_dir:
        log = data_dir.partition("t", 0)
        [piece] = log.set_aside
        assert log.log_end_offset == 20
    assert piece.path.read_bytes() == torn
    assert piece.path.name == "00000000000000000020.log" and piece.position == len(content)
    assert (log_dir / "t-0" / name).read_bytes() == content
    report = check_log_dirs([log_dir])
    assert report.clean  # the log dir is as Kafka leaves it …
    [run] = report.set_aside  # … and what was cut is reported until it is removed
    assert run.place == piece.place and run.pieces == [piece]
    shutil.rmtree(place_for(log_dir))
    assert check_log_dirs([log_dir]).set_aside == []


def test_the_place_is_as_private_as_the_log_dir(log_dir: Path) -> None:
    fill(log_dir, 2)
    os.chmod(log_dir, 0o700)
    segment = log_dir / "t-0" / "00000000000000000000.log"
    os.chmod(segment, 0o600)
    with open(segment, "ab") as handle:
        handle.write(b"\x01" * 20)
    [piece] = repair(log_dir)
    for directory in (place_for(log_dir), piece.place.parent, piece.place):
        assert stat.S_IMODE(os.stat(directory).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(piece.path).st_mode) == 0o600


def test_a_place_another_user_made_beforehand_is_refused(log_dir: Path) -> None:
    """A parent writable by others (/tmp) lets a user make the place first: it is not used, and
    nothing is cut."""
    fill(log_dir, 2)
    segment = log_dir / "t-0" / "00000000000000000000.log"
    with open(segment, "ab") as handle:
        handle.write(b"\x01" * 20)
    content = segment.read_bytes()
    place_for(log_dir).mkdir()
    os.chown(place_for(log_dir), 4242, 4242)
    with pytest.raises(SetAsideError, match=r"owned by uid 4242, not by the data dir's owner .* nothing was cut"):
        repair(log_dir)
    assert segment.read_bytes() == content
    os.chown(place_for(log_dir), 0, 0)
    repair(log_dir)
    assert len(segment.read_bytes()) == len(content) - 20


def test_a_tail_named_like_the_next_segment_keeps_out_of_its_way(log_dir: Path) -> None:
    """Garbage after the last batch of a segment is a tail holding no batch: named by the offset
    the log ends at, the base offset of the next segment, which is removed whole after it."""
    before = fill(log_dir, 6)
    first, second = sorted(before)[:2]
    with open(log_dir / "t-0" / first, "ab") as handle:
        handle.write(b"\xff" * 30)
    pieces = repair(log_dir)
    tail = next(piece for piece in pieces if not piece.whole_segment)
    assert tail.file == f"tail/{second}" and tail.path.read_bytes() == b"\xff" * 30
    assert (tail.place / second).read_bytes() == before[second]
    assert sorted(logs_of(log_dir)) == [first]


def test_an_unreadable_manifest_still_reports_the_place(log_dir: Path) -> None:
    fill(log_dir, 2)
    with open(log_dir / "t-0" / "00000000000000000000.log", "ab") as handle:
        handle.write(b"\x01" * 20)
    [piece] = repair(log_dir)
    (piece.place / MANIFEST).write_bytes(b"\xff{")
    [run] = find_set_aside(log_dir)
    assert run.pieces == [] and run.problem is not None and MANIFEST in run.problem
    (piece.place / MANIFEST).unlink()
    piece.path.unlink()
    assert list(find_set_aside(log_dir)) == []  # emptied by the operator: nothing left to report


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    batches=st.integers(min_value=1, max_value=14),
    victim=st.integers(min_value=0),
    flip=st.integers(1, 255),
    garbage=st.booleans(),
    unindexed=st.lists(st.integers(min_value=0), max_size=2),
)
def test_the_live_log_and_what_is_set_aside_are_the_log_before_repair(
    tmp_path: Path, batches: int, victim: int, flip: int, garbage: bool, unindexed: list[int]
) -> None:
    """Whatever byte of the log is damaged (or whatever segment has garbage after its last
    batch), with or without some segments' index files: the dry run's plan is what the repair
    does, and the files left plus the pieces set aside give back every byte of every `.log`."""
    log_dir = tmp_path / "case"
    shutil.rmtree(log_dir, ignore_errors=True)
    shutil.rmtree(place_for(log_dir), ignore_errors=True)
    before = fill(log_dir, batches)
    names = sorted(before)
    if garbage:
        with open(log_dir / "t-0" / names[victim % len(names)], "ab") as handle:
            handle.write(bytes([flip]) * 17)
    else:
        at = victim % sum(len(before[name]) for name in names)
        for name in names:
            if at < len(before[name]):
                damaged = bytearray(before[name])
                damaged[at] ^= flip
                (log_dir / "t-0" / name).write_bytes(bytes(damaged))
                break
            at -= len(before[name])
    for slot in unindexed:
        (log_dir / "t-0" / names[slot % len(names)]).with_suffix(".index").unlink(missing_ok=True)
    damaged_files = logs_of(log_dir)

    planned = [piece for plan in plan_repair([log_dir]) for piece in plan.pieces]
    pieces = repair(log_dir)
    key = lambda piece: (piece.source, piece.position, piece.file, piece.bytes, piece.records)  # noqa: E731
    assert sorted(map(key, pieces)) == sorted(map(key, planned))

    after = logs_of(log_dir)
    for name in names:
        kept = sorted((piece for piece in pieces if piece.source == name), key=lambda piece: piece.position)
        # (a segment whose index was missing may lose its tail, then the rest of it whole)
        whole = [piece for piece in kept if piece.whole_segment]
        assert name not in after if whole else True
        rebuilt = b"".join(piece.path.read_bytes() for piece in whole) + after.get(name, b"")
        rebuilt += b"".join(piece.path.read_bytes() for piece in kept if not piece.whole_segment)
        assert rebuilt == damaged_files[name]
    if pieces:
        manifest = json.loads((pieces[0].place / MANIFEST).read_text())
        assert sorted((p["source"], p["bytes"]) for p in manifest["pieces"]) == sorted(
            (p.source, p.bytes) for p in pieces
        )
    assert check_log_dirs([log_dir]).clean


def test_a_log_opened_after_a_clean_stop_sets_nothing_aside(log_dir: Path) -> None:
    fill(log_dir, 3)
    with DataDir.open(BrokerConfig.load(log_dirs=[log_dir]), now_ms=NOW_MS) as data_dir:
        assert data_dir.partition("t", 0).set_aside == []
    assert not os.path.lexists(place_for(log_dir))


def test_partition_log_open_reports_pieces(log_dir: Path) -> None:
    fill(log_dir, 3)
    with open(log_dir / "t-0" / "00000000000000000000.log", "ab") as handle:
        handle.write(b"\x07" * 9)
    config = BrokerConfig.load(log_dirs=[log_dir]).topic_defaults
    log = PartitionLog.open(log_dir / "t-0", "t", 0, config, writable=True, clean_shutdown=False, now_ms=NOW_MS)
    try:
        [piece] = log.set_aside
        assert (piece.bytes, piece.records, piece.damaged_bytes) == (9, 0, 9)
    finally:
        log.close()


@pytest.mark.expect_warnings(
    r"cut 20 bytes after the last valid batch at position \d+ \(its index was damaged\)",
    r"00000000000000000000\.index: corrupt index: 5 bytes is not a multiple of 8; rebuilding",
)
def test_a_cut_made_when_a_damaged_index_is_first_used_is_set_aside(log_dir: Path) -> None:
    """After a clean stop nothing is scanned; a segment whose index fails its sanity check on
    first use is recovered then, and what that cuts is kept like any other cut."""
    before = fill(log_dir, 8)
    first = sorted(before)[0]
    with open(log_dir / "t-0" / first, "ab") as handle:
        handle.write(b"\x05" * 20)
    (log_dir / "t-0" / first).with_suffix(".index").write_bytes(b"\x00" * 5)  # not whole entries
    with DataDir.open(BrokerConfig.load(log_dirs=[log_dir]), now_ms=NOW_MS) as data_dir:
        log = data_dir.partition("t", 0)
        assert log.set_aside == []
        assert log.segments[0].offset_index is not None  # its first use: the index is found damaged
        [piece] = log.set_aside
        assert len(list(log.records(0))) == 40
    assert piece.path.read_bytes() == b"\x05" * 20 and piece.source == first
    assert (log_dir / "t-0" / first).read_bytes() == before[first]
    [run] = check_log_dirs([log_dir]).set_aside
    assert run.pieces == [piece]


def test_a_link_where_the_place_belongs_is_not_followed(log_dir: Path, tmp_path: Path) -> None:
    fill(log_dir, 2)
    segment = log_dir / "t-0" / "00000000000000000000.log"
    with open(segment, "ab") as handle:
        handle.write(b"\x01" * 20)
    content = segment.read_bytes()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    place_for(log_dir).symlink_to(elsewhere)
    with pytest.raises(SetAsideError, match=r"not a directory \(a link or a file is there\); nothing was cut"):
        repair(log_dir)
    assert segment.read_bytes() == content and list(elsewhere.iterdir()) == []


def test_a_base_offset_that_reaches_the_next_segment_is_cut_by_repair_and_its_plan(log_dir: Path) -> None:
    """A batch's base offset lies outside its CRC: a flipped bit there can make the last batch
    of a segment claim offsets at or past the next segment's base. Repair cuts at that batch
    (its dry-run plan says the same), and the log left is one `check` calls clean."""
    before = fill(log_dir, 13)
    first = sorted(before)[0]
    damaged = bytearray(before[first])
    headers = list(iter_batch_starts(bytes(damaged)))
    last = headers[-1]
    damaged[last + 5] ^= 1  # bit 16 of the big-endian base offset: 65,536 offsets on
    (log_dir / "t-0" / first).write_bytes(bytes(damaged))
    assert not check_log_dirs([log_dir]).clean

    planned = [piece for plan in plan_repair([log_dir]) for piece in plan.pieces]
    pieces = repair(log_dir)
    key = lambda piece: (piece.source, piece.position, piece.bytes, piece.records)  # noqa: E731
    assert sorted(map(key, pieces)) == sorted(map(key, planned))
    assert [(piece.source, piece.position) for piece in pieces if not piece.whole_segment] == [(first, last)]
    assert (log_dir / "t-0" / first).read_bytes() == before[first][:last]
    report = check_log_dirs([log_dir])
    assert not report.problems


def iter_batch_starts(log: bytes):
    """The position of each v2 batch in `log` (8-byte base offset, 4-byte length after it)."""
    position = 0
    while position + 12 <= len(log):
        yield position
        position += 12 + int.from_bytes(log[position + 8 : position + 12], "big")
