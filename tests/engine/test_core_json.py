"""The compiled core's JSON Lines: each record's line is what `record_to_json` makes of it, and a
view's measure equals the length of its rendering, for any keys and values — UTF-8 of every
width, bytes Python's strict decoder refuses (overlong forms, surrogates, code points past
U+10FFFF, cut sequences: base64), quotes, backslashes, control characters, nulls — and for
LogAppendTime batches and topics with non-ASCII names."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from seglogfs.engine import _core
from seglogfs.engine.record.builder import build_batch
from seglogfs.engine.record.records import BatchHeader, TimestampType, decode_records
from seglogfs.engine.text.json_records import bytes_json_text, record_to_json
from seglogfs.engine.text.renderers import JsonLinesRenderer

TRICKY = [
    b"",
    b'"',
    b"\\",
    b"\x00\x01\x1f\x7f",
    b"\b\f\n\r\t",
    "é€😀".encode(),
    b"\xc0\x80",  # overlong
    b"\xe0\x80\x80",  # overlong
    b"\xed\xa0\x80",  # a surrogate
    b"\xf4\x90\x80\x80",  # past U+10FFFF
    b"\xf0\x9f\x98",  # cut
    b"\xff",
    b"plain text",
]

blobs = st.one_of(
    st.none(),
    st.binary(max_size=40),
    st.text(max_size=20).map(lambda text: text.encode("utf-8", "surrogatepass")),
    st.lists(st.sampled_from(TRICKY), max_size=4).map(b"".join),
    # Long enough for the core's eight-byte words: an escaped or multi-byte character at every
    # place in a word, several in one word, and runs of plain bytes between.
    st.lists(
        st.sampled_from([b"a", b"bcdefgh", b'"', b"\\", b"\n", b"\x01", b"\x7f", "é".encode(), "😀".encode(), b"\xff"]),
        max_size=60,
    ).map(b"".join),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(blobs, min_size=1, max_size=30))
def test_json_text_sizes_are_the_lengths_of_the_texts(items: list[bytes | None]) -> None:
    section = b"".join(item or b"" for item in items)
    lengths = np.array([-1 if item is None else len(item) for item in items], np.int64)
    starts = np.concatenate([[0], np.cumsum(np.maximum(lengths, 0))[:-1]]).astype(np.int64)
    out = np.empty(len(items), np.int64)
    _core.json_text_sizes(section, starts, lengths, out)
    assert out.tolist() == [len(bytes_json_text(item).encode()) for item in items]


@settings(max_examples=150, deadline=None)
@given(
    st.lists(st.tuples(blobs, blobs), min_size=1, max_size=20),
    st.sampled_from([TimestampType.CREATE_TIME, TimestampType.LOG_APPEND_TIME]),
    st.sampled_from(["t", "tøpic-ü"]),
    st.integers(0, 10**12),
)
def test_a_json_view_measures_what_it_renders(records, timestamp_type, topic: str, base_offset: int) -> None:
    batch = build_batch(
        [value for _, value in records],
        keys=[key for key, _ in records],
        timestamps=[1_763_800_000_000 + i * 977 for i in range(len(records))],
        base_offset=base_offset,
        timestamp_type=timestamp_type,
    )
    header = BatchHeader.parse(batch)
    renderer = JsonLinesRenderer(topic, 3)
    assert renderer.measure(header, memoryview(batch)) == len(renderer.render(header, memoryview(batch)))


@settings(max_examples=150, deadline=None)
@given(
    st.lists(st.tuples(blobs, blobs), min_size=1, max_size=30),
    st.sampled_from([TimestampType.CREATE_TIME, TimestampType.LOG_APPEND_TIME]),
    st.sampled_from(["t", "tøpic-ü", 'q"uote']),
    st.integers(0, 10**12),
    st.integers(0, 40),
    st.one_of(st.none(), st.integers(0, 40)),
)
def test_json_lines_rendered_in_the_core_are_what_each_record_renders(
    records, timestamp_type, topic: str, base_offset: int, skip: int, room: int | None
) -> None:
    batch = build_batch(
        [value for _, value in records],
        keys=[key for key, _ in records],
        timestamps=[1_763_800_000_000 - 7 * i for i in range(len(records))],
        base_offset=base_offset,
        timestamp_type=timestamp_type,
    )
    header = BatchHeader.parse(batch)
    decoded = list(decode_records(header, memoryview(batch)))
    oracle = [(record_to_json(r, topic, 3) + "\n").encode() for r in decoded]
    renderer = JsonLinesRenderer(topic, 3)
    indexed = renderer.render_indexed(header, memoryview(batch))
    assert indexed.data == b"".join(oracle)
    assert indexed.ends.tolist() == [sum(map(len, oracle[: i + 1])) for i in range(len(oracle))]
    start = base_offset + skip
    kept = [line for r, line in zip(decoded, oracle, strict=True) if r.offset >= start][:room]
    assert renderer.render_some(header, memoryview(batch), start, room) == (b"".join(kept), len(kept))


def test_a_character_to_escape_at_every_place_of_the_core_s_blocks() -> None:
    """The core copies sixteen (and eight) bytes at a time up to a byte it escapes: each escaped,
    multi-byte or plain-but-high byte at every place of two blocks, alone and two together, and
    at every place of texts of every length around the blocks, is rendered as `record_to_json`
    renders it."""
    specials = [b'"', b"\\", b"\n", b"\x00", b"\x1f", b"\x7f", "é".encode(), "😀".encode(), b"\xff"]
    values = [b"a" * place + special + b"b" * (40 - place) for special in specials for place in range(34)]
    values += [b"c" * place + b'"\\' + b"d" * (33 - place) for place in range(34)]
    # ...and in the last bytes of texts of every length around the blocks (read as the text's
    # last sixteen, those before shifted out)
    values += [
        b"e" * place + special + b"f" * (length - place - len(special))
        for special in specials
        for length in (16, 17, 23, 31, 32, 33, 47, 48)
        for place in range(length - len(special) + 1)
    ]
    batch = build_batch(values, keys=[value[::-1] for value in values], timestamps=1_763_800_000_000)
    header = BatchHeader.parse(batch)
    oracle = [(record_to_json(r, "t", 0) + "\n").encode() for r in decode_records(header, memoryview(batch))]
    renderer = JsonLinesRenderer("t", 0)
    assert renderer.render(header, memoryview(batch)) == b"".join(oracle)
    assert renderer.measure(header, memoryview(batch)) == sum(map(len, oracle))
