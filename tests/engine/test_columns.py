"""Batches laid out column-wise (engine.record.columns: `record_columns`) hold what the record-by-record
decoder and kafka-python's read from the same bytes. Batches are generated with runs of equal
records, mixed sizes, null keys and values, headers, timestamp deltas of every varint size and
offset gaps (as compaction leaves them)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from kafka.record.default_records import DefaultRecordBatch

from seglogfs.engine.record.builder import build_batch
from seglogfs.engine.record.columns import record_columns
from seglogfs.engine.record.records import BatchHeader, decode_records

BASE_TIMESTAMP = 1_763_800_000_000


@st.composite
def batches(draw, runs_only: bool = False) -> bytes:
    """A batch of runs: each run `length` records alike in size, or with sizes of their own
    (`runs_only`: long runs of records alike)."""
    values: list[bytes | None] = []
    keys: list[bytes | None] = []
    headers: list[list[tuple[str, bytes | None]]] = []
    for _ in range(draw(st.integers(1, 4))):
        length = draw(st.sampled_from([16, 40, 130] if runs_only else [1, 3, 16, 40, 130]))
        alike = runs_only or draw(st.booleans())
        size = draw(st.sampled_from([0, 1, 20, 63, 64, 300]))
        key_size = draw(st.sampled_from([None, 0, 5, 64]))
        with_headers = draw(st.booleans()) and draw(st.booleans())
        for i in range(length):
            value_size = size if alike else draw(st.integers(0, 100))
            values.append(None if size == 1 and not alike and i % 7 == 3 else bytes([i % 251]) * value_size)
            keys.append(None if key_size is None else bytes([65 + i % 26]) * key_size)
            headers.append([("h", b"x" * (i % 3)), ("n", None)] if with_headers else [])
    count = len(values)
    step = draw(st.sampled_from([0, 1, 100, 20_000, 5_000_000]))
    if runs_only:
        timestamps = [BASE_TIMESTAMP + i * step for i in range(count)]
    else:
        timestamps = [BASE_TIMESTAMP + (i * step if draw(st.booleans()) else 0) for i in range(count)]
    gap = draw(st.sampled_from([1, 1, 2, 70]))
    deltas = [i * gap for i in range(count)]
    return bytes(
        build_batch(
            values,
            keys=keys,
            headers=headers if any(headers) else None,
            timestamps=timestamps,
            base_offset=draw(st.sampled_from([0, 1_000_000])),
            offset_deltas=deltas,
        )
    )


def reference(batch: bytes) -> list[tuple[int, int, bytes | None, bytes | None, int]]:
    """(offset, timestamp, key, value, header count) per record, decoded one by one, and checked
    against kafka-python's reading of the same bytes."""
    header = BatchHeader.parse(batch)
    ours = [(r.offset, r.timestamp, r.key, r.value, len(r.headers)) for r in decode_records(header, memoryview(batch))]
    theirs = [(r.offset, r.timestamp, r.key, r.value, len(r.headers)) for r in DefaultRecordBatch(batch)]
    assert ours == theirs
    return ours


@settings(max_examples=150, deadline=None)
@given(batches())
def test_record_columns_read_what_the_decoder_reads(batch: bytes) -> None:
    header = BatchHeader.parse(batch)
    columns = record_columns(header, batch)
    section = columns.section

    def blob(start: int, length: int) -> bytes | None:
        return None if length < 0 else section[start : start + length]

    got = [
        (
            int(columns.offsets[i]),
            int(columns.timestamps[i]),
            blob(int(columns.key_starts[i]), int(columns.key_lengths[i])),
            blob(int(columns.value_starts[i]), int(columns.value_lengths[i])),
            int(columns.header_counts[i]),
        )
        for i in range(len(columns))
    ]
    assert got == reference(batch)
