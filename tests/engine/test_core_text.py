"""The compiled core's text rendering: for any console-consumer options (fields shown, separators,
null literal) a batch renders, column-wise in C, the very lines the record-at-a-time renderer
(`TextFormat.render` of each decoded record) gives, with each line's end where it is, and the
measure equals the rendering's length — for null keys and values, any bytes, negative and large
offsets and timestamps, LogAppendTime batches, and from any offset of the batch."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from seglogfs.engine.console_formats import TextFormat
from seglogfs.engine.records import BatchHeader, TimestampType, build_batch, decode_records
from seglogfs.engine.renderers import TextRenderer

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
