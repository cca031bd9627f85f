"""The compiled core's range renderers (`TextRenderer.render_range`, `JsonLinesRenderer.render_range`):
the batches of a file's byte range, read by the core itself and rendered in one call, are the very
bytes the batch-at-a-time renderers give, for any console-consumer options, LogAppendTime
batches, control batches (nothing), null keys and values, bytes that are not UTF-8 and records
with headers (text: not shown; in batches small enough to be decoded record by record, left to
that path, which checks them). Anything the range does not render whole gives None, never other
bytes: a compressed or damaged batch, JSON Lines of a record with headers, a size that is not the
rendering's, a range that does not start and end at batches, a file cut short, a bad descriptor.
Without a size (`consume`'s calls), the same bytes or None, whatever size they take: up to the
widest a header allows (every byte escaped to six, every decimal twenty characters wide)."""

from __future__ import annotations

import functools
import os
import struct
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from seglogfs.engine import _core
from seglogfs.engine.record.builder import ProducerState, build_batch
from seglogfs.engine.record.compression import CompressionType
from seglogfs.engine.record.records import BatchHeader, TimestampType
from seglogfs.engine.text.console_formats import TextFormat
from seglogfs.engine.text.renderers import _SMALL_BATCH_RECORDS, JsonLinesRenderer, TextRenderer
from tests.conftest import refused_when_uncached
from tests.engine.test_core_text import formats

blobs = st.one_of(st.none(), st.binary(max_size=40), st.text(max_size=20).map(str.encode))
batches = st.lists(
    st.tuples(
        st.lists(st.tuples(blobs, blobs), min_size=1, max_size=30),
        st.sampled_from([TimestampType.CREATE_TIME, TimestampType.LOG_APPEND_TIME]),
        st.sampled_from(["data", "data", "data", "control", "headers"]),
    ),
    min_size=1,
    max_size=8,
)


def _file(tmp: Path, spec: list) -> tuple[Path, list[bytearray]]:
    """The batches of `spec` one after the other in a file, offsets following on."""
    built, offset = [], 0
    for records, timestamp_type, kind in spec:
        if kind == "control":
            batch = build_batch(
                [b"\x00\x00\x00\x00\x00\x00"],
                keys=[b"\x00\x00\x00\x00"],
                timestamps=1_763_800_000_000,
                base_offset=offset,
                is_control=True,
                producer=ProducerState(7, 0, -1, is_transactional=True),
            )
            offset += 1
        else:
            batch = build_batch(
                [value for _, value in records],
                keys=[key for key, _ in records],
                headers=[[("h", b"v")] for _ in records] if kind == "headers" else None,
                timestamps=[1_763_800_000_000 + 7 * i for i in range(len(records))],
                base_offset=offset,
                timestamp_type=timestamp_type,
            )
            offset += len(records)
        built.append(batch)
    path = tmp / "00000000000000000000.log"
    path.write_bytes(b"".join(built))
    return path, built


def _rendered(renderer, built: list[bytearray]) -> bytes:
    return b"".join(renderer.render_indexed(BatchHeader.parse(b), memoryview(b)).data for b in built)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(formats, batches, st.integers(0, 9), st.data())
def test_a_range_renders_what_its_batches_render_one_by_one(tmp_path: Path, fmt, spec, partition, data) -> None:
    path, built = _file(tmp_path, spec)
    first = data.draw(st.integers(0, len(built) - 1))
    last = data.draw(st.integers(first + 1, len(built)))
    start = sum(len(b) for b in built[:first])
    end = start + sum(len(b) for b in built[first:last])
    some = built[first:last]
    fd = os.open(path, os.O_RDONLY)
    try:
        text = TextRenderer(fmt, partition)
        want = _rendered(text, some)
        has_headers = any(kind == "headers" for _, _, kind in spec[first:last])
        small_with_headers = any(
            kind == "headers" and len(records) <= _SMALL_BATCH_RECORDS for records, _, kind in spec[first:last]
        )
        assert text.render_range(fd, start, end, len(want)) == (None if small_with_headers else want)
        assert text.render_range(fd, start, end) == (None if small_with_headers else want)
        jsonl = JsonLinesRenderer('topic "ü"', partition)
        want = _rendered(jsonl, some)
        assert jsonl.render_range(fd, start, end, len(want)) == (None if has_headers else want)
        assert jsonl.render_range(fd, start, end) == (None if has_headers else want)
    finally:
        os.close(fd)


@pytest.fixture
def plain(tmp_path: Path) -> tuple[Path, list[bytearray], TextRenderer, bytes]:
    spec = [([(b"k%d" % i, b"value %d" % i) for i in range(20)], TimestampType.CREATE_TIME, "data")] * 3
    path, built = _file(tmp_path, spec)
    renderer = TextRenderer(TextFormat(print_key=True, print_offset=True), 0)
    return path, built, renderer, _rendered(renderer, built)


def _render(path: Path, renderer, start: int, end: int, size: int | None) -> bytes | None:
    fd = os.open(path, os.O_RDONLY)
    try:
        return renderer.render_range(fd, start, end, size)
    finally:
        os.close(fd)


def test_json_lines_of_ascii_and_other_texts_of_every_length_render_as_the_batches_do(tmp_path: Path) -> None:
    """JSON Lines of keys and values of ASCII bytes are written without being measured first:
    texts of every length up to past 64 bytes, with quotes, backslashes and control bytes at
    every place, and the same texts with a byte that is not ASCII (or not UTF-8), render as the
    batch renderers render them, with a size given (to the byte) or not."""
    texts = []
    for length in range(100):
        plain = bytes(b"abcdefghij"[i % 10] for i in range(length))
        texts.append(plain)
        for at in {0, length // 2, length - 1} if length else set():
            for odd in (b'"', b"\\", b"\n", b"\x01", b"\xc3\xa9", b"\xff"):
                texts.append(plain[:at] + odd + plain[at + 1 :])
    records = [(texts[(i * 7) % len(texts)], text) for i, text in enumerate(texts)]
    spec = [(records[i : i + 50], TimestampType.CREATE_TIME, "data") for i in range(0, len(records), 50)]
    path, built = _file(tmp_path, spec)
    renderer = JsonLinesRenderer("t", 3)
    want = _rendered(renderer, built)
    end = sum(len(b) for b in built)
    assert _render(path, renderer, 0, end, len(want)) == want
    assert _render(path, renderer, 0, end, None) == want
    assert _render(path, renderer, 0, end, len(want) - 1) is None


def test_the_range_and_size_must_be_the_renderings_exactly(plain) -> None:
    path, built, renderer, want = plain
    end = sum(len(b) for b in built)
    assert _render(path, renderer, 0, end, len(want)) == want
    assert _render(path, renderer, 0, end, len(want) - 1) is None
    assert _render(path, renderer, 0, end, len(want) + 1) is None
    assert _render(path, renderer, 0, end - 1, len(want)) is None  # ends inside a batch
    assert _render(path, renderer, 1, end, len(want)) is None  # starts inside one
    assert _render(path, renderer, 0, end + 100, len(want)) is None  # past the file's end
    assert _render(path, renderer, 0, 0, 0) == b""
    with pytest.raises(ValueError, match="bad range"):
        _render(path, renderer, 10, 5, 0)
    with pytest.raises(ValueError, match="bad range or size"):
        _render(path, renderer, 0, end, -2)


def test_without_a_size_a_range_takes_the_size_it_renders_to(plain) -> None:
    path, built, renderer, want = plain
    end = sum(len(b) for b in built)
    assert _render(path, renderer, 0, end, None) == want
    assert _render(path, renderer, len(built[0]), end, None) == _rendered(renderer, built[1:])
    assert _render(path, renderer, 0, end - 1, None) is None  # ends inside a batch
    assert _render(path, renderer, 1, end, None) is None  # starts inside one
    assert _render(path, renderer, 0, end + 100, None) is None  # past the file's end
    assert _render(path, renderer, 0, 0, None) == b""


def test_without_a_size_the_widest_renderings_fit(tmp_path: Path) -> None:
    """The block a range is rendered into without a size is sized from the batch headers alone:
    renderings at their widest still fit it whole. JSON Lines: every byte a control character
    (six bytes each: \u0001), or not UTF-8 (base64), or a null key and value, in a topic whose
    name escapes; text: null keys and values with a long null literal, long separators, every
    field shown, times and offsets of twenty characters."""
    path = tmp_path / "00000000000000000000.log"
    mixed = [
        build_batch(
            [b"\x01" * 300, None, b"\xff" * 7, b""], keys=[None, None, b"\x1f" * 50, b"\xfe"], timestamps=-(2**63)
        ),
        build_batch([None] * 40, timestamps=[-(2**63) + i for i in range(40)], base_offset=2**62),
        build_batch([b"\n"] * 9, keys=[b"\x00"] * 9, timestamps=1, timestamp_type=TimestampType.LOG_APPEND_TIME),
    ]
    escaped = [build_batch([b"\x01" * 5000], keys=[b"\x02" * 3000], timestamps=1)]  # (little else to spare)
    nulls = [build_batch([None] * 50, timestamps=-(2**63), base_offset=-(2**62))]
    wide = TextFormat(
        print_timestamp=True,
        print_partition=True,
        print_offset=True,
        print_key=True,
        key_separator=b"<" * 50,
        line_separator=b">" * 30,
        null_literal=b"~" * 200,
    )
    for renderer, built in (
        (JsonLinesRenderer("\x01" * 40, 2**31 - 1), mixed),
        (JsonLinesRenderer("t", 0), escaped),
        (TextRenderer(wide, 2**31 - 1), mixed),
        (TextRenderer(wide, 2**31 - 1), nulls),
    ):
        path.write_bytes(b"".join(built))
        want = _rendered(renderer, built)
        assert _render(path, renderer, 0, len(path.read_bytes()), None) == want


def test_a_damaged_batch_is_left_to_the_batch_renderers(plain) -> None:
    path, built, renderer, want = plain
    data = bytearray(path.read_bytes())
    data[len(built[0]) + 70] ^= 0x01  # a record byte of the second batch: its CRC no longer holds
    path.write_bytes(bytes(data))
    assert _render(path, renderer, 0, len(data), len(want)) is None
    assert _render(path, renderer, 0, len(data), None) is None
    assert _render(path, renderer, 0, len(built[0]), len(_rendered(renderer, built[:1]))) is not None
    assert _render(path, renderer, 0, len(built[0]), None) == _rendered(renderer, built[:1])


def test_compressed_batches_and_shown_headers_are_left_to_the_batch_renderers(tmp_path: Path) -> None:
    batch = build_batch([b"a", b"b"], timestamps=1, compression=CompressionType.GZIP)
    path = tmp_path / "00000000000000000000.log"
    path.write_bytes(bytes(batch))
    for renderer in (TextRenderer(TextFormat(), 0), JsonLinesRenderer("t", 0)):
        want = _rendered(renderer, [batch])
        assert _render(path, renderer, 0, len(batch), len(want)) is None
        assert _render(path, renderer, 0, len(batch), None) is None
    shown = TextRenderer(TextFormat(print_headers=True), 0)
    assert _render(path, shown, 0, len(batch), 4) is None


def test_a_bad_descriptor_gives_none(plain) -> None:
    path, built, renderer, want = plain
    fd = os.open(path, os.O_RDONLY)
    os.close(fd)
    assert renderer.render_range(fd, 0, sum(len(b) for b in built), len(want)) is None
    assert renderer.render_range(fd, 0, sum(len(b) for b in built)) is None


def test_nowait_renders_only_bytes_the_os_holds_in_memory(tmp_path: Path) -> None:
    """With `nowait` (the mount's event loop) a range is read only from the OS page cache:
    BlockingIOError for bytes only on disk, and for a range past the file's end (left to a read
    that may wait, which says so); the same bytes as a read that waits otherwise."""
    spec = [([(None, b"value %d " % i + b"x" * 200) for i in range(20)], TimestampType.CREATE_TIME, "data")] * 12
    path, built = _file(tmp_path, spec)
    text, jsonl = TextRenderer(TextFormat(), 0), JsonLinesRenderer("t", 0)
    first = next(i for i in range(len(built)) if sum(len(b) for b in built[:i]) >= 4096)  # (past the first page)
    start, end = sum(len(b) for b in built[:first]), sum(len(b) for b in built)
    want = _rendered(text, built[first:])
    fd = os.open(path, os.O_RDONLY)
    try:
        expected = {text: want, jsonl: jsonl.render_range(fd, start, end)}
        for renderer in (text, jsonl):
            nowait = functools.partial(renderer.render_range, fd, start, end, None, nowait=True)
            refused_when_uncached(fd, nowait, expected[renderer])
        os.pread(fd, end, 0)  # now they are in memory
        try:
            rendered = text.render_range(fd, start, end, len(want), nowait=True)
        except BlockingIOError:
            pytest.skip(f"{tmp_path}: the file system does not read with RWF_NOWAIT")
        assert rendered == want
        assert text.render_range(fd, start, end, None, nowait=True) == want
        assert jsonl.render_range(fd, start, end, nowait=True) == jsonl.render_range(fd, start, end)
        with pytest.raises(BlockingIOError):
            text.render_range(fd, start, end + 100, None, nowait=True)
        assert text.render_range(fd, start, end - 1, None, nowait=True) is None  # ends inside a batch
    finally:
        os.close(fd)


def test_what_the_batch_renderers_print_or_refuse_otherwise_is_left_to_them(tmp_path: Path) -> None:
    """Where the batch renderers refuse what the range cannot name, or print what it leaves to
    them, the range gives None: a time past int64 (damage, which the batch renderers name), a
    negative last offset delta or record count (check_batch refuses it), and in text, headers in
    a batch small enough to be decoded record by record."""
    renderer = TextRenderer(TextFormat(print_timestamp=True), 0)
    path = tmp_path / "00000000000000000000.log"

    def rendered(batches: list[bytearray]) -> bytes | None:
        path.write_bytes(b"".join(batches))
        size = len(_rendered(renderer, batches))
        return _render(path, renderer, 0, len(path.read_bytes()), size)

    assert rendered([build_batch([b"v"], timestamps=2**63 - 1)]) is not None
    over = build_batch([b"v", b"w"], timestamps=[2**63 - 2, 2**63 - 1])
    struct.pack_into(">q", over, 27, 2**63 - 1)  # base now the maximum: the second record's time is past it
    _fix_crc(over)
    with pytest.raises(ValueError, match="past int64"):
        _rendered(renderer, [over])
    path.write_bytes(bytes(over))
    assert _render(path, renderer, 0, len(over), None) is None
    for field in (23, 57):  # last offset delta, record count
        negative = build_batch([b"v"], timestamps=1)
        struct.pack_into(">i", negative, field, -1)
        _fix_crc(negative)
        path.write_bytes(bytes(negative))
        assert _render(path, renderer, 0, len(negative), 0) is None
    small = build_batch([b"v"], timestamps=1, headers=[[("h", b"x")]])
    assert rendered([small]) is None
    large = build_batch([b"v"] * 9, timestamps=1, headers=[[("h", b"x")]] * 9)
    assert rendered([large]) == _rendered(renderer, [large])


def _fix_crc(batch: bytearray) -> None:
    struct.pack_into(">I", batch, 17, _core.crc32c(bytes(batch[21:])))


def test_a_record_count_the_batch_cannot_hold_gives_none_not_a_huge_block(plain) -> None:
    """Without a size the block is sized from the headers: a count damaged to billions (its CRC
    made to match) is refused before any block is asked for (it asked for hundreds of GB, and
    a MemoryError ended `consume` as an internal error)."""
    path, built, renderer, _ = plain
    data = bytearray(path.read_bytes())
    struct.pack_into(">i", data, 57, 0x7F000014)
    _fix_crc_at(data, 0, len(built[0]))
    path.write_bytes(bytes(data))
    for some in (renderer, JsonLinesRenderer("t", 0)):
        assert _render(path, some, 0, len(data), None) is None


def test_stray_bytes_after_a_record_in_a_small_text_batch_are_left_to_its_decoder(tmp_path: Path) -> None:
    """A record longer than its fields (a byte after its header count, the CRC made to match: a
    faulty producer's batch) in a batch small enough to be decoded record by record: that
    decoder refuses it, so the range leaves it to it, with a size and without."""
    batch = build_batch([b"a", b"b", b"c"], timestamps=1)
    length = batch[61] >> 1  # the first record's length (a one-byte varint)
    batch[61] += 2  # one byte longer ...
    batch[62 + length : 62 + length] = b"\x00"  # ... a stray byte after its header count
    struct.pack_into(">i", batch, 8, len(batch) - 12)
    _fix_crc(batch)
    path = tmp_path / "00000000000000000000.log"
    path.write_bytes(bytes(batch))
    renderer = TextRenderer(TextFormat(), 0)
    with pytest.raises(ValueError, match="stray bytes"):
        renderer.render_some(BatchHeader.parse(batch), memoryview(batch), 0, None)
    assert _render(path, renderer, 0, len(batch), None) is None
    assert _render(path, renderer, 0, len(batch), len(b"a\nb\nc\n")) is None


def _fix_crc_at(data: bytearray, start: int, end: int) -> None:
    struct.pack_into(">I", data, start + 17, _core.crc32c(bytes(data[start + 21 : end])))


def test_offsets_and_times_at_the_edges_render_as_the_oracles_do(tmp_path: Path) -> None:
    """Offsets and timestamps across digit boundaries (9 -> 10, 999,999 -> 1,000,000), near the
    int64 limits, with gaps (a compacted batch), negative times and LogAppendTime: the
    section renderers and the range renderers, with a size and without, render what the
    record-at-a-time oracles render."""
    from seglogfs.engine.record.records import decode_records
    from seglogfs.engine.text.json_records import record_to_json

    built = [
        build_batch([b"v%d" % i for i in range(25)], timestamps=[-5 + i // 3 for i in range(25)], base_offset=0),
        build_batch([b"w"] * 30, timestamps=1_763_800_000_000, base_offset=85),
        build_batch([b"x"] * 40, timestamps=[9_999 + i for i in range(40)], base_offset=999_980),
        build_batch([b"y"] * 12, timestamps=2**63 - 1, base_offset=2**63 - 13),
        build_batch([b"z"] * 5, timestamps=7, base_offset=300, offset_deltas=[0, 2, 3, 9, 10]),
        build_batch([b"t"] * 9, timestamps=-(2**63), base_offset=990, timestamp_type=TimestampType.LOG_APPEND_TIME),
    ]
    path = tmp_path / "00000000000000000000.log"
    path.write_bytes(b"".join(built))
    every = TextFormat(print_timestamp=True, print_offset=True, print_key=True, print_partition=True)
    for renderer, oracle in (
        (TextRenderer(every, 3), lambda r: every.render(r, 3)),
        (JsonLinesRenderer("t", 3), lambda r: record_to_json(r, "t", 3).encode() + b"\n"),
    ):
        want = b"".join(oracle(r) for b in built for r in decode_records(BatchHeader.parse(b), memoryview(b)))
        assert _rendered(renderer, built) == want  # (a batch at a time: the section renderers)
        assert _render(path, renderer, 0, len(path.read_bytes()), None) == want
        assert _render(path, renderer, 0, len(path.read_bytes()), len(want)) == want
