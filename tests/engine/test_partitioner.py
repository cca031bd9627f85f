"""The default partitioner's murmur2 (the compiled core) against Kafka's own vectors and
kafka-python's implementation of Kafka's `Utils.murmur2`."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st
from kafka.partitioner.default import murmur2 as kafka_python_murmur2

from seglogfs.engine.partitioner import murmur2, murmur2_many, partition_for_key

# Kafka's UtilsTest.testMurmur2: key → hash.
KAFKA_VECTORS = {
    b"21": -973932308,
    b"foobar": -790332482,
    b"a-little-bit-long-string": -985981536,
    b"a-little-bit-longer-string": -1486304829,
    b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8": -58897971,
    b"abc": 479470107,
}


def signed(value: int) -> int:
    return value - (1 << 32) if value & 0x80000000 else value


def test_kafkas_vectors() -> None:
    for key, hashed in KAFKA_VECTORS.items():
        assert murmur2(key) == hashed
        assert signed(kafka_python_murmur2(key)) == hashed  # (the oracle below agrees with Kafka)


@given(st.lists(st.binary(max_size=80), max_size=60), st.integers(1, 500))
def test_one_key_and_a_column_of_keys_hash_as_kafka_python(keys: list[bytes], partitions: int) -> None:
    data = np.frombuffer(b"".join(keys), np.uint8)
    lengths = np.array([len(k) for k in keys], np.int64)
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64) if keys else np.zeros(0, np.int64)
    expected = [signed(kafka_python_murmur2(k)) for k in keys]
    assert murmur2_many(data, starts, lengths).tolist() == expected
    assert [murmur2(k) for k in keys] == expected
    assert [partition_for_key(k, partitions) for k in keys] == [(h & 0x7FFFFFFF) % partitions for h in expected]


def test_a_blob_outside_the_data_is_refused() -> None:
    import pytest

    with pytest.raises(ValueError, match="outside the data"):
        murmur2_many(b"abc", np.array([2], np.int64), np.array([5], np.int64))
    with pytest.raises(ValueError, match="outside the data"):
        murmur2_many(b"abc", np.array([0], np.int64), np.array([-1], np.int64))
