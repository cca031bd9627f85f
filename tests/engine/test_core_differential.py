"""One decoding of Kafka's records, everywhere: every entry point of the compiled core that reads a
records section accepts and refuses exactly what the Python decoder (`decode_records`, after
`check_batch`) accepts and refuses, and gives the same records, for mutated real batches.

The batches are built by the engine (keys, values and headers drawn; uncompressed and compressed;
CreateTime and LogAppendTime; record counts on both sides of the eight records where the
renderers switch from record-at-a-time decoding to the core), then damaged in their uncompressed
records section — bytes flipped, inserted or cut, a field's varint replaced by an extreme value or
an overlong encoding (with the record's length made to match, or left lying), the record count
made to lie, the base offset and time pushed to int64's ends — and framed again with their CRC
recomputed, so that the damage reaches the decoders rather than the CRC check.

Each case goes through: `record_columns` (`_core.record_fields`, and `gather` and
`json_text_sizes` over its columns), the section renderers (`render_text_section`,
`render_json_section`, at a drawn `min_offset`), the range renderers (`render_text_range`,
`render_json_range`, from a file), and the batch renderers built on them (`render`,
`render_indexed`, `measure`). Each gives the records the Python decoder gives, or refuses
(ValueError; the range renderers None) where it refuses. `scripts/dev fuzz` runs the same cases
against a build of the core with AddressSanitizer and UndefinedBehaviorSanitizer, for a bounded
time (SEGLOGFS_FUZZ_SECONDS), and has the cases each entry point ran written to
SEGLOGFS_FUZZ_COUNTS.
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
import tempfile
import time
from collections import Counter
from collections.abc import Iterator

import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from seglogfs.engine import _core
from seglogfs.engine.record import varint
from seglogfs.engine.record.builder import build_batch, rebuild_batch
from seglogfs.engine.record.columns import record_columns
from seglogfs.engine.record.compression import CompressionType
from seglogfs.engine.record.records import (
    BATCH_OVERHEAD_BYTES,
    BatchHeader,
    Record,
    TimestampType,
    check_batch,
    decode_records,
    records_section,
)
from seglogfs.engine.text.console_formats import TextFormat
from seglogfs.engine.text.json_records import record_to_json
from seglogfs.engine.text.renderers import _SMALL_BATCH_RECORDS, JsonLinesRenderer, TextRenderer

INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1
EXTREMES = [INT64_MIN, -(1 << 31) - 1, -(1 << 31), -2, -1, 0, 1, 7, (1 << 31) - 1, 1 << 31, INT64_MAX]
PARTITION = 3
TOPIC = "t"

cases_run: Counter[str] = Counter()  # entry point -> cases it ran


# -- the cases ------------------------------------------------------------------------------------
def _varint_bytes(value: int, size: int | None) -> bytes:
    """`value` zig-zag encoded (64-bit), in `size` bytes (None: as few as it takes): padded with
    continuation bytes, or cut (its high bits lost) when it needs more."""
    if size is None:
        return varint.encode(value)
    zigzag = ((value << 1) ^ (value >> 63)) & ((1 << 64) - 1)
    out = bytearray((zigzag >> (7 * i)) & 0x7F | 0x80 for i in range(size - 1))
    out.append((zigzag >> (7 * (size - 1))) & 0x7F)
    return bytes(out)


def _fields(section: bytes) -> Iterator[tuple[int, int, int, int]]:
    """(record start, field start, field end, record body start) of every varint field of a
    records section, each record's own length first, up to where it is no longer intact."""
    try:
        yield from _intact_fields(section)
    except (ValueError, IndexError):
        return


def _intact_fields(section: bytes) -> Iterator[tuple[int, int, int, int]]:
    position = 0
    while position < len(section):
        start = position
        length, body = varint.decode(section, position)
        yield start, start, body, body
        end = body + length
        if not body < end <= len(section):  # (no longer intact: a walk on would not end)
            return
        at = body + 1  # attributes
        fields = []
        for _ in range(2):  # timestamp delta, offset delta
            _, after = varint.decode(section, at)
            fields.append((at, after))
            at = after
        for _ in range(2):  # key, value
            blob, after = varint.decode(section, at)
            fields.append((at, after))
            at = after + max(blob, 0)
        count, after = varint.decode(section, at)
        fields.append((at, after))
        at = after
        for _ in range(count):
            for blob_field in range(2):
                blob, after = varint.decode(section, at)
                fields.append((at, after))
                at = after + (max(blob, 0) if blob_field or blob >= 0 else 0)
        for field_start, field_end in fields:
            yield start, field_start, field_end, body
        position = end


def _mutate(section: bytes, mutation: tuple) -> bytes:
    kind = mutation[0]
    data = bytearray(section)
    if not data:
        return bytes(data)
    if kind == "flip":
        _, at, mask = mutation
        data[at % len(data)] ^= mask
    elif kind == "cut":
        del data[len(data) - mutation[1] % (len(data) + 1) :]
    elif kind == "insert":
        _, at, extra = mutation
        data[at % (len(data) + 1) : at % (len(data) + 1)] = extra
    elif kind == "field":
        _, which, value, size, fix_length = mutation
        fields = list(_fields(section))
        if not fields:
            return bytes(data)
        record_start, field_start, field_end, body = fields[which % len(fields)]
        new = _varint_bytes(value, size)
        data[field_start:field_end] = new
        if fix_length and field_start != record_start:  # the record's length made to match
            old_length, _ = varint.decode(section, record_start)
            data[record_start:body] = varint.encode(old_length + len(new) - (field_end - field_start))
    return bytes(data)


SPECIAL_BLOBS = [b"a", b"\xff\xfe", "é".encode(), b'"\\\n', b"\x00\x7f"]
HEADER_KEYS = ["h", "", "\udcff", "ключ"]


def _blob(rng: random.Random) -> bytes | None:
    """A key, value or header value: null, a special one (not UTF-8, escaped in JSON) or random bytes."""
    kind = rng.random()
    if kind < 0.2:
        return None
    if kind < 0.4:
        return rng.choice(SPECIAL_BLOBS)
    return rng.randbytes(rng.randrange(13))


mutations = st.one_of(
    st.tuples(st.just("flip"), st.integers(0, 1 << 16), st.integers(1, 255)),
    st.tuples(st.just("cut"), st.integers(1, 1 << 16)),
    st.tuples(st.just("insert"), st.integers(0, 1 << 16), st.binary(min_size=1, max_size=6)),
    st.tuples(
        st.just("field"),
        st.integers(0, 1 << 16),
        st.one_of(st.sampled_from(EXTREMES), st.integers(INT64_MIN, INT64_MAX)),
        st.one_of(st.none(), st.integers(1, 11)),
        st.booleans(),
    ),
)


@dataclasses.dataclass(frozen=True)
class Case:
    """A batch as damaged, and how it is read: the console format and the lowest offset shown."""

    batch: bytes
    text_format: TextFormat
    min_offset: int


@st.composite
def cases(draw: st.DrawFn) -> Case:
    count = draw(st.sampled_from([1, 2, 3, 7, 8, 9, 10, 16, 33]))
    # The records' bytes from a seed (drawing each through hypothesis cost most of a case's time).
    rng = random.Random(draw(st.integers(0, 1 << 32)))
    with_headers = draw(st.booleans())
    batch = build_batch(
        [_blob(rng) for _ in range(count)],
        keys=[_blob(rng) for _ in range(count)],
        headers=[[(rng.choice(HEADER_KEYS), _blob(rng)) for _ in range(rng.randrange(3))] for _ in range(count)]
        if with_headers
        else None,
        timestamps=[1_763_800_000_000 + rng.randrange(-5, 6) for _ in range(count)],
        base_offset=draw(
            st.sampled_from([0, 100, INT64_MAX - 40, INT64_MAX - 5, INT64_MAX - (1 << 31), INT64_MIN + 5])
        ),
        compression=draw(st.sampled_from([CompressionType.NONE] * 4 + list(CompressionType)[1:])),
        timestamp_type=draw(st.sampled_from([TimestampType.CREATE_TIME, TimestampType.LOG_APPEND_TIME])),
        offset_deltas=draw(st.one_of(st.none(), st.just(list(range(count - 1, -1, -1))))),  # falling offsets too
    )
    header = BatchHeader.parse(batch)
    section = records_section(header, batch)
    for mutation in draw(st.lists(mutations, max_size=3)):
        section = _mutate(section, mutation)
    header = dataclasses.replace(
        header,
        base_timestamp=draw(st.sampled_from([header.base_timestamp] * 4 + [INT64_MAX, INT64_MIN, INT64_MAX - 3])),
    )
    lie = draw(st.sampled_from([0] * 4 + [1, -1, 2, (1 << 31) - 1 - count, len(section) // 7 - count]))
    damaged = rebuild_batch(header, section, max(count + lie, 0), header.max_timestamp)
    fmt = draw(
        st.builds(
            TextFormat,
            print_timestamp=st.booleans(),
            print_partition=st.booleans(),
            print_offset=st.booleans(),
            print_key=st.booleans(),
            print_value=st.booleans(),
            null_literal=st.sampled_from([b"null", b""]),
        )
    )
    min_offset = draw(st.sampled_from([INT64_MIN, header.base_offset, min(header.base_offset + count // 2, INT64_MAX)]))
    return Case(bytes(damaged), fmt, min_offset)


# -- one case through every entry point ------------------------------------------------------------
def _decoded(header: BatchHeader, batch: bytes) -> list[Record] | None:
    """The Python decoder's records, or None where it refuses the batch."""
    if check_batch(header, batch) is not None:
        return None
    try:
        return decode_records(header, batch)
    except ValueError:
        return None


def _refused(call, *args):
    """`call(*args)`, or None where it raises ValueError (what each entry point raises for a
    malformed records section)."""
    try:
        return call(*args)
    except ValueError:
        return None


def check_case(case: Case, path: str) -> None:
    batch, fmt, min_offset = case.batch, case.text_format, case.min_offset
    header = BatchHeader.parse(batch)
    records = _decoded(header, batch)
    valid = check_batch(header, batch) is None
    text, jsonl = TextRenderer(fmt, PARTITION), JsonLinesRenderer(TOPIC, PARTITION)
    kept = None if records is None else [r for r in records if r.offset >= min_offset]
    want_text = None if kept is None else b"".join(fmt.render(r, PARTITION) for r in kept)
    want_json = None if kept is None else b"".join(map(_json_line, kept))
    has_headers = records is not None and any(r.headers for r in records)

    if valid:  # the entry points that take a batch the CRC check passed
        columns = _refused(record_columns, header, batch)
        cases_run["record_fields"] += 1
        assert (columns is None) == (records is None), (columns, records)
        if columns is not None and records is not None:
            assert columns.offsets.tolist() == [r.offset for r in records]
            assert columns.consumer_timestamps().tolist() == [r.timestamp for r in records]
            assert columns.keys() == [r.key for r in records]
            assert columns.values() == [r.value for r in records]
            assert columns.header_counts.tolist() == [len(r.headers) for r in records]
            _check_blob_columns(columns, records)

        section = _refused(text._render_section, header, batch, min_offset)
        cases_run["render_text_section"] += 1
        assert (section is None) == (records is None)
        if section is not None and kept is not None:
            data, ends, offsets = section
            assert data == want_text
            assert offsets.tolist() == [r.offset for r in kept]
            assert ends.tolist() == np.cumsum([len(fmt.render(r, PARTITION)) for r in kept]).tolist()

        section = _refused(jsonl._render_section, header, batch, min_offset)
        cases_run["render_json_section"] += 1
        if records is None:
            assert section is None
        elif kept is not None and any(r.headers for r in kept):
            assert section is None  # (left to the record-at-a-time path)
        else:
            assert section is not None and section[0] == want_json
            assert section[2].tolist() == [r.offset for r in kept]

        for renderer, want in ((text, want_text), (jsonl, want_json)):
            assert _refused(renderer.render, header, batch, min_offset) == want
            indexed = _refused(renderer.render_indexed, header, batch)
            assert (indexed is None) == (records is None)
            if indexed is not None and records is not None:
                assert indexed.offsets.tolist() == [r.offset for r in records]
                measured = _refused(renderer.measure, header, batch)
                cases_run["json_text_sizes"] += renderer is jsonl
                assert measured == len(indexed.data)

    with open(path, "wb") as file:
        file.write(batch)
    fd = os.open(path, os.O_RDONLY)
    try:
        every = None if records is None else b"".join(fmt.render(r, PARTITION) for r in records)
        for size in (None, -2):
            asked = None if size is None or every is None else len(every)
            rendered = text.render_range(fd, 0, len(batch), asked)
            cases_run["render_text_range"] += 1
            if records is None:
                assert rendered is None
            else:
                assert rendered in (None, every)
                if header.stored_uncompressed and not (has_headers and len(records) <= _SMALL_BATCH_RECORDS):
                    assert rendered == every
        every = None if records is None else b"".join(map(_json_line, records))
        rendered = jsonl.render_range(fd, 0, len(batch))
        cases_run["render_json_range"] += 1
        if records is None:
            assert rendered is None
        else:
            assert rendered in (None, every)
            if header.stored_uncompressed and not has_headers:
                assert rendered == every
    finally:
        os.close(fd)


def _json_line(record: Record) -> bytes:
    return record_to_json(record, TOPIC, PARTITION).encode() + b"\n"


def _check_blob_columns(columns, records: list[Record]) -> None:
    """`gather` of the key and value columns gives the records' keys and values."""
    for starts, lengths, blobs in (
        (columns.key_starts, columns.key_lengths, [r.key for r in records]),
        (columns.value_starts, columns.value_lengths, [r.value for r in records]),
    ):
        total = sum(len(b) for b in blobs if b is not None)
        out = np.empty(max(total, 1), np.uint8)
        offsets = np.zeros(len(blobs) + 1, np.int32)
        _core.gather(columns.section, starts, lengths, out, offsets)
        cases_run["gather"] += 1
        gathered = out.tobytes()
        assert [gathered[a:b] for a, b in zip(offsets[:-1].tolist(), offsets[1:].tolist(), strict=True)] == [
            b or b"" for b in blobs
        ]


# -- the suite's run, and the sanitizers' ---------------------------------------------------------
EXAMPLES = int(os.environ.get("SEGLOGFS_FUZZ_EXAMPLES", "150"))
SECONDS = float(os.environ.get("SEGLOGFS_FUZZ_SECONDS", "0"))  # 0: one run of EXAMPLES cases


def test_every_entry_point_decodes_as_the_python_decoder(tmp_path) -> None:
    """Mutated real batches: the same records from every entry point, or a refusal from each.
    With SEGLOGFS_FUZZ_SECONDS, runs of EXAMPLES new cases each until that time is spent."""
    path = str(tmp_path / "00000000000000000000.log")
    if core := os.environ.get("SEGLOGFS_FUZZ_CORE"):  # (the sanitizers' build, not the normal one)
        assert os.path.samefile(_core.__file__, core), _core.__file__

    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        database=None if SECONDS else settings.default.database,
        # (a timed run reports a failing case as drawn: shrinking one can outlast the run)
        phases=[Phase.explicit, Phase.reuse, Phase.generate] if SECONDS else list(Phase),
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
    )
    @given(cases())
    def run(case: Case) -> None:
        check_case(case, path)

    deadline = time.monotonic() + SECONDS
    run()
    while time.monotonic() < deadline:
        run()
    if counts := os.environ.get("SEGLOGFS_FUZZ_COUNTS"):
        with open(counts, "w") as file:
            json.dump(dict(cases_run), file)


@pytest.mark.parametrize("count", [1, 8, 9, 40])
def test_a_lying_count_is_refused_everywhere_before_anything_is_sized_by_it(count: int) -> None:
    """A record count of 2^31 - 1 with the CRC made to hold: every entry point refuses it, none
    asks for memory by it (32 GiB for the section renderers' offsets and ends)."""
    batch = build_batch([b"v"] * count, timestamps=1)
    header = BatchHeader.parse(batch)
    lying = bytes(rebuild_batch(header, bytes(batch[BATCH_OVERHEAD_BYTES:]), (1 << 31) - 1, 1))
    with tempfile.TemporaryDirectory() as tmp:
        check_case(Case(lying, TextFormat(), INT64_MIN), os.path.join(tmp, "0.log"))
    header = BatchHeader.parse(lying)
    with pytest.raises(ValueError, match="record count of 2147483647 is too large"):
        decode_records(header, lying)
    # The core checks the count itself, before it sizes anything by it: one record more than
    # seven bytes a record allow.
    section = lying[BATCH_OVERHEAD_BYTES:]
    over = len(section) // 7 + 1
    offsets, ends = np.empty((2, over), np.int64)
    with pytest.raises(ValueError, match=f"record count of {over} is too large"):
        _core.render_text_section(
            section, over, 0, 1, None, INT64_MIN, None, None, True, True, True, b"\t", b"\n", b"null", offsets, ends
        )
    with pytest.raises(ValueError, match=f"record count of {over} is too large"):
        _core.render_json_section(section, over, 0, 1, None, INT64_MIN, b"{", b"CreateTime", offsets, ends)
    with pytest.raises(ValueError, match="record count too large"):
        _core.record_fields(section, over, np.empty((8, over), np.int64))


@pytest.mark.parametrize("count", [3, 9])
@pytest.mark.parametrize(
    ("base_offset", "base_timestamp", "step"),
    [
        (INT64_MAX - 1, 0, 0),  # the third record's offset is past int64
        (0, INT64_MAX, 1),  # timestamp deltas 0, 1, 2...: past the maximum
        (0, INT64_MIN, -1),  # 0, -1, -2...: past the minimum
    ],
)
def test_offsets_and_times_past_int64_are_refused_everywhere(
    tmp_path, count: int, base_offset: int, base_timestamp: int, step: int
) -> None:
    """Each sum of a base and a delta is checked, whatever the path: a record's offset or time past
    int64 is refused by every entry point, as the Python decoder refuses it (the core added them
    unchecked, and `consume` printed negative offsets)."""
    batch = build_batch([b"v"] * count, timestamps=[step * i for i in range(count)], base_offset=base_offset)
    header = dataclasses.replace(BatchHeader.parse(batch), base_timestamp=base_timestamp)
    damaged = bytes(rebuild_batch(header, bytes(batch[BATCH_OVERHEAD_BYTES:]), count, 1))
    with pytest.raises(ValueError, match="past int64"):
        decode_records(BatchHeader.parse(damaged), damaged)
    check_case(Case(damaged, TextFormat(print_timestamp=True, print_offset=True), INT64_MIN), str(tmp_path / "0.log"))
