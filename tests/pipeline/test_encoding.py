"""The Spark writer's column-wise encoder makes, byte for byte, the batches the engine's
`encode_batches` makes of the same records: null keys and values, empty values, varints of one
to three bytes (offset deltas past 63 and 8191, lengths past 63), batch targets and maxima that
split and halve, every codec, Arrow arrays that are slices of larger ones; and a record too large
for any batch is refused alike."""

from __future__ import annotations

import random

import pyarrow as pa
import pytest

from seglogfs.engine.errors import RecordTooLargeError
from seglogfs.engine.record.builder import encode_batches
from seglogfs.engine.record.compression import CompressionType
from seglogfs.pipeline.encoding import encode_columns


def both(values: list, keys: list | None, **options) -> tuple[object, object]:
    try:
        expected: object = [
            bytes(b)
            for b in encode_batches(values[1:], keys=None if keys is None else keys[1:], headers=None, **options)
        ]
    except RecordTooLargeError as error:
        expected = str(error)
    value_array = pa.array(values, pa.binary()).slice(1)
    key_array = None if keys is None else pa.array(keys, pa.binary()).slice(1)
    try:
        got: object = [
            bytes(b)
            for b in encode_columns(
                value_array,
                key_array,
                timestamp=options["timestamps"],
                max_batch_bytes=options["max_batch_bytes"],
                target_batch_bytes=options["target_batch_bytes"],
                compression=options["compression"],
                where=options["where"],
            )
        ]
    except RecordTooLargeError as error:
        got = str(error)
    return expected, got


@pytest.mark.parametrize("seed", range(24))
def test_the_column_encoder_makes_the_engines_bytes(seed: int) -> None:
    rng = random.Random(seed)
    n = rng.choice([2, 6, 70, 300, 9000])
    values = [None if rng.random() < 0.05 else rng.randbytes(rng.choice([0, 1, 10, 70, 200])) for _ in range(n)]
    keys = None
    if rng.random() < 0.7:
        keys = [None if rng.random() < 0.2 else b"k%d" % rng.randrange(10 ** rng.randrange(1, 9)) for _ in range(n)]
    options = {
        "timestamps": 1_763_800_000_000 + seed,
        "max_batch_bytes": rng.choice([1000, 1 << 20]),
        "target_batch_bytes": rng.choice([300, 5000, 1 << 20]),
        "compression": list(CompressionType)[seed % len(CompressionType)],
        "where": "t-0",
    }
    expected, got = both(values, keys, **options)
    assert got == expected


def test_a_record_too_large_for_any_batch_is_refused_alike() -> None:
    options = {
        "timestamps": 0,
        "max_batch_bytes": 500,
        "target_batch_bytes": 500,
        "compression": CompressionType.NONE,
        "where": "t-3",
    }
    expected, got = both([b"", b"a" * 10, b"b" * 600, b"c"], None, **options)
    assert isinstance(expected, str) and "t-3: record 1 makes a batch of" in expected
    assert got == expected
