"""by-offset/N and by-time/T through the mount against the engine's look-ups, and topic-level
append through Kafka's default partitioner."""

from __future__ import annotations

import base64
import errno
import json
import os
from pathlib import Path

import pytest

from seglogfs.engine import BrokerConfig, DataDir
from seglogfs.engine.cleaner.cleaner import Cleaner
from seglogfs.engine.cleaner.cleaner_manager import log_to_clean
from tests.conftest import NOW_MS
from tests.engine.test_partitioner import KAFKA_VECTORS
from tests.fs.conftest import REFUSED, Mount


def render(records) -> bytes:
    return b"".join((b"null" if r.value is None else r.value) + b"\n" for r in records)


@pytest.fixture
def prepared(tmp_path: Path) -> Path:
    """A compacted topic with offset gaps (keys k0..k9, 300 records, timestamps NOW+i*1000)."""
    data = tmp_path / "data"
    config = BrokerConfig.load(overrides=["log.segment.bytes=2000"], log_dirs=[data])
    with DataDir.open(config, now_ms=NOW_MS) as data_dir:
        data_dir.create_topic("c", 1, {"cleanup.policy": "compact"}, now_ms=NOW_MS)
        log = data_dir.partition("c", 0)
        for i in range(300):
            log.append_records(
                [b"v%d" % i], keys=[b"k%d" % (i * 7 % 10)], timestamps=[NOW_MS + i * 1000], now_ms=NOW_MS
            )
        log.roll(NOW_MS)
        Cleaner(1 << 20).clean(log_to_clean(log, None, NOW_MS), NOW_MS)
        log.append_records([b"tail"], keys=[b"k0"], timestamps=[NOW_MS + 400_000], now_ms=NOW_MS)
    return data


def expected_from(data: Path, offset: int) -> bytes:
    with DataDir.open(BrokerConfig.load(log_dirs=[data]), read_only=True, now_ms=NOW_MS) as data_dir:
        return render(data_dir.partition("c", 0).records(offset))


@pytest.mark.expect_warnings(REFUSED)
def test_by_offset_matches_the_engine(mount, prepared: Path) -> None:
    survivors_before = expected_from(prepared, 0)
    m: Mount = mount(prepared)
    by_offset = m.path / "c" / "0" / "by-offset"
    gap = 5  # compacted away: the view starts at the next surviving offset
    for n in (0, gap, 150, 299, 300):
        assert (by_offset / str(n)).read_bytes() == expected_from(prepared, n), n
    assert (by_offset / "0").read_bytes() == survivors_before
    assert json.loads((by_offset / "300.jsonl").read_bytes().splitlines()[0])["offset"] == 300
    listed = os.listdir(by_offset)
    assert "0" in listed and "0.jsonl" in listed
    for bad in ("302", "99999", "abc", "-1", "1e3"):
        with pytest.raises(OSError) as raised:
            (by_offset / bad).stat()
        assert raised.value.errno == errno.ENOENT, bad


def test_by_offset_at_the_log_end_is_empty_and_grows(mount, prepared: Path) -> None:
    m: Mount = mount(prepared, "-o", "parse.key")  # a compacted topic takes keyed records only
    end_view = m.path / "c" / "0" / "by-offset" / "301"
    assert end_view.read_bytes() == b""
    with open(end_view, "rb") as reader:
        (m.path / "c" / "0" / "append").write_bytes(b"k1\tnew\n")
        assert os.fstat(reader.fileno()).st_size == len(b"new\n")
        assert reader.read() == b"new\n"


@pytest.mark.expect_warnings(REFUSED)
def test_by_time_matches_the_engine(mount, prepared: Path) -> None:
    m: Mount = mount(prepared)
    by_time = m.path / "c" / "0" / "by-time"
    with DataDir.open(BrokerConfig.load(log_dirs=[prepared]), read_only=True, now_ms=NOW_MS) as data_dir:
        log = data_dir.partition("c", 0)
        for t in (NOW_MS - 10**9, NOW_MS + 123_456, NOW_MS + 299_000):
            found = log.offset_for_timestamp(t)
            assert found is not None
            assert (by_time / str(t)).read_bytes() == render(log.records(found.offset)), t
        assert (by_time / str(NOW_MS + 10**9)).read_bytes() == b""  # after all data: empty
    iso = "2025-11-22T08:26:40Z"  # NOW_MS
    assert (by_time / iso).read_bytes() == (by_time / str(NOW_MS)).read_bytes()
    with pytest.raises(OSError) as raised:
        (by_time / "yesterday").stat()
    assert raised.value.errno == errno.ENOENT


def test_topic_append_uses_kafkas_partitioner(mount) -> None:
    m: Mount = mount(None, "-o", "num.partitions=3,parse.key,null.marker=NULL")
    os.mkdir(m.path / "t")
    lines = b"".join(key + b"\t" + key + b"\n" for key in KAFKA_VECTORS)
    (m.path / "t" / "append").write_bytes(lines)
    for key, hashed in KAFKA_VECTORS.items():
        partition = (hashed & 0x7FFFFFFF) % 3
        assert key + b"\n" in (m.path / "t" / str(partition) / "records").read_bytes().splitlines(keepends=True)
    # Null keys: every line of one write to one partition, the next write to the next one.
    for i in range(3):
        (m.path / "t" / "append").write_bytes(b"NULL\tnull%d-a\nNULL\tnull%d-b\n" % (i, i))
    homes = [p for p in range(3) if b"null" in (m.path / "t" / str(p) / "records").read_bytes()]
    assert len(homes) == 3


def test_append_jsonl_round_trips_binary_keys_values_and_headers(mount) -> None:
    m: Mount = mount()
    os.mkdir(m.path / "t")
    binary = bytes(range(256))
    sent = [
        {"key": {"base64": base64.b64encode(binary).decode()}, "value": "plain", "headers": []},
        {
            "key": "k",
            "value": {"base64": base64.b64encode(b"\xff\x00").decode()},
            "headers": [{"key": "h", "value": None}],
        },
        {"key": None, "value": None, "headers": [{"key": "a", "value": "b"}], "timestamp": 1234},
    ]
    (m.path / "t" / "0" / "append.jsonl").write_bytes(b"".join(json.dumps(r).encode() + b"\n" for r in sent))
    got = [json.loads(line) for line in (m.path / "t" / "0" / "records.jsonl").read_bytes().splitlines()]
    assert [{k: r[k] for k in ("key", "value", "headers")} for r in got] == [
        {k: r[k] for k in ("key", "value", "headers")} for r in sent
    ]
    assert got[2]["timestamp"] == 1234 and [r["offset"] for r in got] == [0, 1, 2]
