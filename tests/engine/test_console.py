"""The batch renderers (`consume` and the views use them) against record-at-a-time rendering."""

from __future__ import annotations

import base64
import json

from hypothesis import given, settings
from hypothesis import strategies as st

from seglogfs.engine.record.builder import build_batch
from seglogfs.engine.record.records import BatchHeader, CompressionType, TimestampType, decode_records
from seglogfs.engine.text.console_formats import TextFormat
from seglogfs.engine.text.json_records import record_from_json, record_to_json
from seglogfs.engine.text.renderers import JsonLinesRenderer, TextRenderer

NOW_MS = 1_763_800_000_000

records_strategy = st.lists(
    st.tuples(
        st.one_of(st.none(), st.binary(max_size=12), st.text(max_size=8).map(str.encode)),
        st.one_of(st.none(), st.binary(max_size=200), st.text(max_size=30).map(str.encode)),
        st.integers(-(2**33), 2**33),
    ),
    min_size=1,
    max_size=80,
)
formats = st.builds(
    TextFormat,
    print_timestamp=st.booleans(),
    print_partition=st.booleans(),
    print_offset=st.booleans(),
    print_headers=st.booleans(),
    print_key=st.booleans(),
    print_value=st.booleans(),
    key_separator=st.sampled_from([b"\t", b":", b" | "]),
    line_separator=st.sampled_from([b"\n", b"\r\n", b"--"]),
    null_literal=st.sampled_from([b"null", b""]),
)


def make_batch(records, *, codec: str, gap: int, log_append_time: bool, with_headers: bool) -> bytes:
    return bytes(
        build_batch(
            [value for _, value, _ in records],
            keys=[key for key, _, _ in records],
            headers=[(("h", b"x"),) if with_headers and i % 3 == 0 else () for i in range(len(records))],
            timestamps=[NOW_MS + delta for _, _, delta in records],
            base_offset=5000,
            compression=CompressionType[codec.upper()],
            timestamp_type=TimestampType.LOG_APPEND_TIME if log_append_time else TimestampType.CREATE_TIME,
            offset_deltas=[i * (gap + 1) for i in range(len(records))],
        )
    )


@settings(max_examples=200, deadline=None)
@given(
    records_strategy,
    formats,
    st.sampled_from(["none", "gzip", "zstd"]),
    st.integers(0, 2),
    st.booleans(),
    st.booleans(),
    st.integers(0, 200),
)
def test_batch_rendering_equals_record_rendering(
    records, text_format: TextFormat, codec: str, gap: int, log_append_time: bool, with_headers: bool, skip: int
) -> None:
    batch = make_batch(records, codec=codec, gap=gap, log_append_time=log_append_time, with_headers=with_headers)
    header = BatchHeader.parse(batch)
    decoded = decode_records(header, batch)
    min_offset = header.base_offset + skip
    chosen = [r for r in decoded if r.offset >= min_offset]

    text = TextRenderer(text_format, 7)
    expected_lines = [text_format.render(r, 7) for r in chosen]
    assert text.lines(header, batch, min_offset) == expected_lines
    assert text.render(header, batch, min_offset) == b"".join(expected_lines)
    assert text.measure(header, batch) == sum(len(text_format.render(r, 7)) for r in decoded)
    indexed = text.render_indexed(header, batch)
    assert indexed.data == text.render(header, batch)
    assert indexed.bytes_from(min_offset) == len(b"".join(expected_lines))

    jsonl = JsonLinesRenderer("t.1", 7)
    expected_json = [record_to_json(r, "t.1", 7) for r in chosen]
    assert jsonl.lines(header, batch, min_offset) == expected_json
    rendered = jsonl.render(header, batch, min_offset)
    assert rendered == "".join(line + "\n" for line in expected_json).encode()
    assert jsonl.measure(header, batch) == len(jsonl.render(header, batch))
    indexed = jsonl.render_indexed(header, batch)
    assert indexed.data == jsonl.render(header, batch)
    assert indexed.bytes_from(min_offset) == len(rendered)
    for line, record in zip(rendered.splitlines(), chosen, strict=True):
        assert json.loads(line)["offset"] == record.offset


def test_control_batches_render_nothing() -> None:
    batch = bytes(
        build_batch([b"\x00\x00\x00\x00\x00\x00"], keys=[b"\x00\x00\x00\x00"], timestamps=NOW_MS, is_control=True)
    )
    header = BatchHeader.parse(batch)
    assert TextRenderer(TextFormat(), 0).render(header, batch) == b""
    assert TextRenderer(TextFormat(print_headers=True), 0).lines(header, batch) == []
    assert JsonLinesRenderer("t", 0).render(header, batch) == b""


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.binary(max_size=12), st.one_of(st.none(), st.binary(max_size=12))), max_size=4))
def test_header_keys_of_any_bytes_render_as_json_and_read_back(headers: list[tuple[bytes, bytes | None]]) -> None:
    """A header key is bytes on disk (any client may write any): a JSON string when it is
    UTF-8, else {"base64": ...}; a JSON line read back (`append.jsonl`, `produce --format
    jsonl`) gives the same bytes."""
    held = tuple((key.decode("utf-8", "surrogateescape"), value) for key, value in headers)  # as records hold them
    batch = build_batch([b"v"], headers=[held], timestamps=NOW_MS)
    (record,) = decode_records(BatchHeader.parse(batch), batch)
    line = record_to_json(record, "t", 0)
    document = json.loads(line)  # (valid JSON: it encodes as UTF-8)
    line.encode("utf-8")
    for (key, _), rendered in zip(headers, document["headers"], strict=True):
        try:
            assert rendered["key"] == key.decode("utf-8")
        except UnicodeDecodeError:
            assert rendered["key"] == {"base64": base64.b64encode(key).decode()}
    again = record_from_json(line, "line 1")
    assert [(k.encode("utf-8", "surrogateescape"), v) for k, v in again.headers] == headers
