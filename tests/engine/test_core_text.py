"""The compiled core's text rendering: for any console-consumer options (fields shown, separators,
null literal) a batch renders, column-wise in C, the very lines the record-at-a-time renderer
(`TextFormat.render` of each decoded record) gives, with each line's end where it is, and the
measure equals the rendering's length — for null keys and values, any bytes, negative and large
offsets and timestamps (every int64), LogAppendTime batches, and from any offset of the batch."""

from __future__ import annotations

import json

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from seglogfs.engine import _core
from seglogfs.engine.record.builder import build_batch
from seglogfs.engine.record.records import BatchHeader, TimestampType, decode_records
from seglogfs.engine.text.console_formats import TextFormat
from seglogfs.engine.text.renderers import TextRenderer

formats = st.builds(
    TextFormat,
    print_timestamp=st.booleans(),
    print_partition=st.booleans(),
    print_offset=st.booleans(),
    print_key=st.booleans(),
    print_value=st.booleans(),
    key_separator=st.sampled_from([b"\t", b" | ", b""]),
    line_separator=st.sampled_from([b"\n", b"\r\n", b"", b"<>"]),
    null_literal=st.sampled_from([b"null", b"", b"NULL!"]),
)
blobs = st.one_of(st.none(), st.binary(max_size=30))


@settings(max_examples=200, deadline=None)
@given(
    formats,
    st.lists(st.tuples(blobs, blobs), min_size=9, max_size=60),
    st.sampled_from([TimestampType.CREATE_TIME, TimestampType.LOG_APPEND_TIME]),
    st.integers(0, 2**40),
    st.sampled_from([1_763_800_000_000, -5, 0]),
    st.integers(0, 70),
    st.integers(0, 9),
)
def test_text_rendered_in_the_core_is_what_each_record_renders(
    fmt: TextFormat, records, timestamp_type, base_offset: int, base_time: int, skip: int, partition: int
) -> None:
    batch = build_batch(
        [value for _, value in records],
        keys=[key for key, _ in records],
        timestamps=[base_time + 13 * i for i in range(len(records))],
        base_offset=base_offset,
        timestamp_type=timestamp_type,
    )
    header = BatchHeader.parse(batch)
    decoded = list(decode_records(header, memoryview(batch)))
    oracle = [fmt.render(r, partition) for r in decoded]
    renderer = TextRenderer(fmt, partition)
    assert renderer.render(header, memoryview(batch)) == b"".join(oracle)
    indexed = renderer.render_indexed(header, memoryview(batch))
    ends, total = [], 0
    for line in oracle:
        total += len(line)
        ends.append(total)
    assert indexed.data == b"".join(oracle) and indexed.ends.tolist() == ends
    assert indexed.offsets.tolist() == [r.offset for r in decoded]
    assert renderer.measure(header, memoryview(batch)) == total
    start = base_offset + min(skip, len(records))
    assert renderer.lines(header, memoryview(batch), start) == [
        line for r, line in zip(decoded, oracle, strict=True) if r.offset >= start
    ]


# Every int64, and the places where a decimal gains a digit: the core's digit count is a guess
# from the bit length, corrected at the powers of ten.
_EDGES = sorted({sign * (10**k + d) for k in range(19) for d in (-1, 0, 1) for sign in (1, -1)} | {2**63 - 1, -(2**63)})
int64s = st.one_of(st.integers(-(2**63), 2**63 - 1), st.sampled_from(_EDGES))


@settings(max_examples=300, deadline=None)
@given(int64s, st.one_of(st.integers(0, 2**63 - 3), st.sampled_from([e for e in _EDGES if 0 <= e < 2**63 - 2])))
def test_offsets_and_timestamps_of_every_size_are_written_in_decimal(timestamp: int, base_offset: int) -> None:
    """The core's decimals, through both section renderers: any timestamp (a LogAppendTime
    batch shows one for every record), offsets up to the largest."""
    batch = build_batch([b"a", None], timestamps=0, base_offset=base_offset)
    section = memoryview(batch)[61:]
    offsets, ends = np.empty((2, 2), np.int64)
    label, offset_field = b"LogAppendTime:", b"Offset:"
    text, _ = _core.render_text_section(
        section, 2, base_offset, 0, timestamp, 0, label, None, True, False, True, b"\t", b"\n", b"null", offsets, ends
    )
    expected = [
        b"%s%d\t%s%d\t%s\n" % (label, timestamp, offset_field, base_offset + i, v)
        for i, v in enumerate([b"a", b"null"])
    ]
    assert text == b"".join(expected)
    assert ends.tolist() == np.cumsum([len(line) for line in expected]).tolist()
    rendered = _core.render_json_section(
        section, 2, base_offset, 0, timestamp, 0, b'{"offset":', b"LogAppendTime", offsets, ends
    )
    assert rendered is not None
    lines = rendered[0].splitlines()
    assert [json.loads(line)["offset"] for line in lines] == [base_offset, base_offset + 1]
    assert [json.loads(line)["timestamp"] for line in lines] == [timestamp, timestamp]
