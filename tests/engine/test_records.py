"""The v2 batch codec against kafka-python's record classes, the independent oracle."""

from __future__ import annotations

import random
import struct
import threading

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder

from seglogfs.engine import _core
from seglogfs.engine.errors import RecordTooLargeError
from seglogfs.engine.record import varint
from seglogfs.engine.record.builder import ProducerState, build_batch, encode_batches, set_log_append_time
from seglogfs.engine.record.compression import CompressionType, compress, decompress
from seglogfs.engine.record.records import (
    BATCH_OVERHEAD_BYTES,
    BatchHeader,
    ControlType,
    TimestampType,
    check_batch,
    control_type,
    decode_records,
)

CODECS = list(CompressionType)


def kafka_python_records(batch: bytes) -> tuple[DefaultRecordBatch, list[tuple]]:
    parsed = DefaultRecordBatch(bytearray(batch))
    assert parsed.validate_crc()  # kafka-python checks the CRC only before iterating
    return parsed, [(r.offset, r.timestamp, r.key, r.value, [tuple(h) for h in r.headers]) for r in parsed]


@pytest.mark.parametrize("codec", CODECS, ids=lambda c: c.config_name)
def test_batches_parse_with_kafka_python_with_valid_crc(codec: CompressionType) -> None:
    values = [b"first", None, b"x" * 5000, "ünïcode".encode(), b""]
    keys = [b"k1", None, b"k3", b"", b"k5"]
    headers = [[("trace", b"abc")], [], [("a", None), ("b", b"")], [], [("h", b"\x00\xff")]]
    timestamps = [1_700_000_000_000, 1_700_000_000_500, 1_699_999_999_000, 1_700_000_001_000, 1_700_000_000_000]
    batch = build_batch(values, keys=keys, headers=headers, timestamps=timestamps, base_offset=1234, compression=codec)
    parsed, records = kafka_python_records(batch)
    assert parsed.compression_type == int(codec)
    assert parsed.base_offset == 1234 and parsed.last_offset == 1238
    assert parsed.max_timestamp == max(timestamps)
    assert records == [
        (1234 + i, timestamps[i], keys[i], values[i], [tuple(h) for h in headers[i]]) for i in range(len(values))
    ]


@pytest.mark.parametrize("codec", CODECS, ids=lambda c: c.config_name)
def test_engine_decodes_what_kafka_python_encodes(codec: CompressionType) -> None:
    builder = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=int(codec),
        is_transactional=False,
        producer_id=7,
        producer_epoch=1,
        base_sequence=10,
        batch_size=1 << 20,
    )
    expected = []
    for i in range(50):
        key = None if i % 7 == 0 else f"key-{i}".encode()
        value = None if i % 11 == 0 else f"value-{i}".encode() * (i % 5 + 1)
        headers = [("n", str(i).encode())] if i % 3 == 0 else []
        builder.append(i, timestamp=1_700_000_000_000 + i, key=key, value=value, headers=headers)
        expected.append((i, 1_700_000_000_000 + i, key, value, tuple(headers)))
    batch = bytes(builder.build())
    header = BatchHeader.parse(batch)
    assert check_batch(header, batch) is None
    assert header.producer_id == 7 and header.producer_epoch == 1 and header.base_sequence == 10
    assert header.last_sequence == 59
    decoded = decode_records(header, batch)
    assert [(r.offset, r.timestamp, r.key, r.value, r.headers) for r in decoded] == expected


def test_uniform_and_ragged_paths_agree() -> None:
    # Fixed-size values take the table path; one longer value forces the per-record path.
    uniform = [b"abcd"] * 300
    ragged = [b"abcd"] * 299 + [b"abcde"]
    for values in (uniform, ragged):
        batch = build_batch(values, timestamps=5)
        _parsed, records = kafka_python_records(batch)
        assert [r[3] for r in records] == values


def test_large_offset_and_timestamp_deltas_use_long_varints() -> None:
    timestamps = [0, 2**40, 2**20]
    batch = build_batch([b"a", b"b", b"c"], timestamps=timestamps, offset_deltas=[0, 5, 2**30])
    _parsed, records = kafka_python_records(batch)
    assert [(r[0], r[1]) for r in records] == [(0, 0), (5, 2**40), (2**30, 2**20)]


def test_producer_and_transaction_fields() -> None:
    producer = ProducerState(producer_id=42, producer_epoch=3, base_sequence=100, is_transactional=True)
    batch = build_batch([b"a", b"b"], timestamps=1, producer=producer, partition_leader_epoch=9)
    parsed = DefaultRecordBatch(bytearray(batch))
    assert (parsed.producer_id, parsed.producer_epoch, parsed.base_sequence) == (42, 3, 100)
    assert parsed.is_transactional and not parsed.is_control_batch
    header = BatchHeader.parse(batch)
    assert header.partition_leader_epoch == 9 and header.is_transactional


def test_control_batches_hold_no_user_records() -> None:
    key = struct.pack(">hh", 0, ControlType.COMMIT)
    value = struct.pack(">hi", 0, 5)
    batch = build_batch(
        [value], keys=[key], timestamps=1, is_control=True, producer=ProducerState(1, 0, -1, is_transactional=True)
    )
    header = BatchHeader.parse(batch)
    assert header.is_control and check_batch(header, batch) is None
    assert decode_records(header, batch) == []
    (marker,) = decode_records(header, batch, include_control=True)
    assert control_type(marker) is ControlType.COMMIT
    assert DefaultRecordBatch(bytearray(batch)).is_control_batch


def test_log_append_time_stamps_every_record_with_the_batch_time() -> None:
    batch = bytearray(build_batch([b"a", b"b"], timestamps=[10, 20]))
    set_log_append_time(batch, 99_000)
    header = BatchHeader.parse(batch)
    assert check_batch(header, batch) is None
    assert header.timestamp_type is TimestampType.LOG_APPEND_TIME
    assert [r.timestamp for r in decode_records(header, batch)] == [99_000, 99_000]
    assert DefaultRecordBatch(batch).validate_crc()


@pytest.mark.parametrize(
    ("position", "reason"),
    [(16, "unsupported magic"), (17, "CRC-32C mismatch"), (30, "CRC-32C mismatch"), (70, "CRC-32C mismatch")],
)
def test_check_batch_names_the_damage(position: int, reason: str) -> None:
    batch = bytearray(build_batch([b"payload-bytes"] * 3, timestamps=1))
    batch[position] ^= 0x01
    header = BatchHeader.parse(batch)
    found = check_batch(header, batch)
    assert found is not None and reason in found


def test_check_batch_detects_a_short_batch() -> None:
    batch = build_batch([b"payload"], timestamps=1)
    header = BatchHeader.parse(batch)
    assert "cut short" in (check_batch(header, batch[:-1]) or "")


@given(st.integers(min_value=-(2**63), max_value=2**63 - 1))
def test_varint_round_trip(value: int) -> None:
    encoded = varint.encode(value)
    assert varint.decode(encoded, 0) == (value, len(encoded))
    table, sizes = varint.encode_many(__import__("numpy").array([value], dtype="int64"))
    assert bytes(table[0, : sizes[0]]) == encoded


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(st.one_of(st.none(), st.binary(max_size=40)), st.one_of(st.none(), st.binary(max_size=300))),
        min_size=1,
        max_size=40,
    ),
    st.sampled_from(CODECS),
)
def test_random_batches_round_trip_through_kafka_python(pairs: list, codec: CompressionType) -> None:
    keys = [k for k, _ in pairs]
    values = [v for _, v in pairs]
    batch = build_batch(values, keys=keys, timestamps=list(range(len(pairs))), compression=codec, base_offset=3)
    _parsed, records = kafka_python_records(batch)
    assert [(r[2], r[3]) for r in records] == pairs
    header = BatchHeader.parse(batch)
    assert [(r.key, r.value) for r in decode_records(header, batch)] == pairs


@settings(max_examples=80, deadline=None)
@given(
    st.lists(st.one_of(st.none(), st.binary(max_size=200), st.binary(max_size=200).map(bytearray)), max_size=300),
    st.integers(-(2**62), 2**62),
)
def test_values_alone_encode_as_records_with_every_field_given(values: list, delta: int) -> None:
    """Values with one timestamp delta (an int) and nothing else, the core's loop for a
    producer's batch, encode to the bytes of the general loop given each field: null keys, no
    headers, the delta listed for each record, offset deltas 0..n-1."""
    n = len(values)
    assert _core.encode_records(values, None, None, delta, None) == _core.encode_records(
        values, [None] * n, [b"\x00"] * n, [delta] * n, list(range(n))
    )
    assert _core.encode_records(values, None, None, delta, None, 61)[61:] == _core.encode_records(
        values, None, None, [delta] * n, None
    )


def general_and_value_batches(values: list, **options: object) -> tuple[object, object]:
    """encode_batches of `values` by the general path (a tuple: sized by numpy, sliced, encoded
    by build_batch) and by the core's value runs (a list), or the error each raised."""
    made = []
    for each in (tuple(values), values):
        try:
            made.append([bytes(b) for b in encode_batches(each, keys=None, headers=None, where="t-0", **options)])
        except RecordTooLargeError as error:
            made.append(str(error))
    return made[0], made[1]


@settings(max_examples=120, deadline=None)
@given(
    st.lists(st.one_of(st.none(), st.binary(max_size=300), st.binary(max_size=300).map(bytearray)), min_size=1),
    st.sampled_from([0, 40, 100, 700, 5000, 1 << 20]),
    st.sampled_from([None, 30, 300, 2000]),
    st.integers(0, 2**40),
    st.booleans(),
)
def test_a_producers_values_batch_as_the_general_path_batches_them(
    values: list, most: int, target: int | None, base_offset: int, transactional: bool
) -> None:
    """A list of values alone (what producers and the append files send) takes the core's value
    runs: the same batches, byte for byte, as the general path makes of the same records —
    grouped by estimated size up to the target, a record too large refused by the same words."""
    producer = ProducerState(7, 1, 0, is_transactional=True) if transactional else ProducerState()
    general, runs = general_and_value_batches(
        values,
        timestamps=1_763_800_000_000,
        max_batch_bytes=most,
        target_batch_bytes=target,
        base_offset=base_offset,
        producer=producer,
        partition_leader_epoch=3,
    )
    assert runs == general


def test_a_run_whose_estimate_falls_short_is_halved_as_the_general_path_halves_it() -> None:
    """Values of 8 KiB or more past offset delta 8191 take 13 bytes of varints, one more than
    the estimate: a run that fills the limit by estimate comes out over it and is halved."""
    values = [b"v" * 8200] * 8300
    estimated = BATCH_OVERHEAD_BYTES + 8300 * (8200 + 12)
    general, runs = general_and_value_batches(values, timestamps=5, max_batch_bytes=estimated)
    assert isinstance(runs, list) and len(runs) == 2 and runs == general


def test_values_alone_must_be_bytes_or_none() -> None:
    with pytest.raises(TypeError, match="value 1 is str, not bytes or None"):
        _core.encode_records([b"a", "b"], None, None, 0, None)


@pytest.mark.parametrize("codec", CODECS, ids=lambda c: c.config_name)
def test_segments_written_by_the_engine_parse_and_index_by_kafkas_rules(tmp_path, codec: CompressionType) -> None:
    """Whole `.log` files the engine writes parse with kafka-python, and the indexes written on
    append are exactly those a single pass over the log rebuilds (Kafka's rules, as for the
    broker segments of INDEX_EXACT.txt)."""
    from kafka.record.memory_records import MemoryRecords

    from seglogfs.engine import BrokerConfig, PartitionLog
    from seglogfs.engine.log.loader import segment_for
    from tests.conftest import NOW_MS

    log_dir = tmp_path / "logs"
    log_dir.mkdir()
    config = BrokerConfig.load(
        overrides=["log.index.interval.bytes=300", "log.segment.bytes=3000"], log_dirs=[log_dir]
    ).topic_defaults
    log = PartitionLog.create(log_dir / "t-0", "t", 0, config, topic_id="AAAAAAAAAAAAAAAAAAAAAA", now_ms=NOW_MS)
    expected = []
    for i in range(120):
        values = [None if (i + j) % 9 == 0 else b"v%d-%d" % (i, j) * (j + 1) for j in range(i % 4 + 1)]
        keys = [None if j % 2 else b"key-%d" % j for j in range(len(values))]
        headers = [[("n", b"%d" % j), ("nothing", None)] if j % 3 == 0 else [] for j in range(len(values))]
        stamps = [NOW_MS + 7 * i - 3 * j for j in range(len(values))]  # not monotonic inside a batch
        log.append_records(values, keys=keys, headers=headers, timestamps=stamps, now_ms=NOW_MS, compression=codec)
        expected += [
            (k, v, [tuple(h) for h in hs], t) for k, v, hs, t in zip(keys, values, headers, stamps, strict=True)
        ]
    segments = [(s.log_path, s.base_offset) for s in log.segments]
    log.close()
    assert len(segments) > 2
    decoded = []
    for path, base in segments:
        records = MemoryRecords(path.read_bytes())
        while (batch := records.next_batch()) is not None:
            assert batch.validate_crc() and batch.compression_type == int(codec)
            decoded += [(r.key, r.value, [tuple(h) for h in r.headers], r.timestamp) for r in batch]
        written = {suffix: path.with_suffix(suffix).read_bytes() for suffix in (".index", ".timeindex")}
        rebuilt_dir = tmp_path / f"rebuilt-{base}"
        rebuilt_dir.mkdir()
        (rebuilt_dir / path.name).write_bytes(path.read_bytes())
        segment = segment_for(rebuilt_dir, base, config, writable=True, now_ms=NOW_MS)
        segment.recover()
        segment.close()
        for suffix, data in written.items():
            assert (rebuilt_dir / path.name).with_suffix(suffix).read_bytes() == data, f"{path.name} {suffix}"
    assert decoded == expected


def test_blob_lengths_are_len_and_zero_for_none() -> None:
    """The core's lengths of an append's values (what the batch split weighs) are len() of each,
    0 for a null; an item with no length is a TypeError, not a wrong size."""
    blobs = [b"", b"abc", None, bytearray(b"12345"), memoryview(b"xy"), b"\x00" * 70_000]
    out = np.full(len(blobs), -7, np.int64)
    _core.blob_lengths(blobs, out)
    assert out.tolist() == [0, 3, 0, 5, 2, 70_000]
    with pytest.raises(TypeError):
        _core.blob_lengths([b"a", 5], np.empty(2, np.int64))
    with pytest.raises(ValueError, match="fewer int64"):
        _core.blob_lengths([b"a", b"b"], np.empty(1, np.int64))


@pytest.mark.parametrize("codec", list(CompressionType))
def test_codecs_compress_and_decompress_on_many_threads_at_once(codec: CompressionType) -> None:
    """Views measure, `consume` renders and the mount appends on several threads at once: each
    codec gives every thread its own right bytes (a zstd compressor or decompressor shared
    between threads mixed their frames up)."""
    rng = random.Random(int(codec))
    inputs = [bytes(rng.randrange(256) for _ in range(rng.randrange(1, 5000))) * 20 for _ in range(8)]
    frames = [compress(codec, data) for data in inputs]
    start = threading.Barrier(4)
    problems: list[str] = []

    def work(worker: int) -> None:
        start.wait()
        for round_ in range(150):
            n = (worker + round_) % len(inputs)
            try:
                if (
                    decompress(codec, frames[n]) != inputs[n]
                    or decompress(codec, compress(codec, inputs[n])) != inputs[n]
                ):
                    problems.append(f"thread {worker}, round {round_}: item {n} came back wrong")
            except Exception as error:
                problems.append(f"thread {worker}, round {round_}: item {n}: {error!r}")

    threads = [threading.Thread(target=work, args=(worker,)) for worker in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert problems == []
