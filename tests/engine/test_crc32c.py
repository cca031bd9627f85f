"""The core's CRC-32C (Kafka's batch checksum) against the `crc32c` package: the check value,
every length and alignment around the folding's rounds and the three-chain rounds, long buffers
(checked with the GIL released), the three chains that machines without VPCLMULQDQ use, and the
portable loop that machines without SSE4.2 use."""

from __future__ import annotations

import os
from pathlib import Path

import crc32c as oracle
from hypothesis import given, settings
from hypothesis import strategies as st

from seglogfs.engine import _core

ROUND = 3 * 4096  # what the three chains take a round
FOLD_MIN, FOLD_ROUND = 1024, 256  # the shortest buffer the core folds, and what it folds a round


def test_the_check_value() -> None:
    assert _core.crc32c(b"123456789") == _core.crc32c_without_hardware(b"123456789") == 0xE3069283
    assert _core.crc32c(b"") == _core.crc32c_without_hardware(b"") == 0


def test_every_length_and_alignment_around_the_folding_rounds() -> None:
    """Buffers of 1 KiB and more are folded (on a machine with VPCLMULQDQ: this one, as
    `crc32c_folding` says), the tail after the last 256-byte round by the crc32 instruction."""
    flags = Path("/proc/cpuinfo").read_text().split()
    # (where the machine has the instructions, they are found: else this tests the chains twice)
    wanted = {"sse4_2", "pclmulqdq", "vpclmulqdq", "avx512f", "avx512vl"}
    assert _core.crc32c_folding() == wanted.issubset(flags)
    data = os.urandom(4 * FOLD_MIN + 64)
    lengths = [
        *range(FOLD_MIN - 8, FOLD_MIN + 300),
        *(FOLD_MIN + FOLD_ROUND * k + d for k in range(2, 12) for d in (-1, 0, 1, 15, 16, 17)),
    ]
    for start in range(0, 64, 7):
        for length in lengths:
            piece = memoryview(data)[start : start + length]
            expected = oracle.crc32c(piece)
            assert _core.crc32c(piece) == expected, (start, length)
            assert _core.crc32c_without_folding(piece) == expected, (start, length)


def test_every_length_and_alignment_around_the_rounds() -> None:
    data = os.urandom(3 * ROUND + 64)
    lengths = [*range(80), *(ROUND * k + d for k in (1, 2, 3) for d in (-9, -8, -1, 0, 1, 7, 8, 9))]
    for start in range(8):
        for length in lengths:
            piece = memoryview(data)[start : start + length]
            expected = oracle.crc32c(piece)
            assert _core.crc32c(piece) == expected, (start, length)
            assert _core.crc32c_without_hardware(piece) == expected, (start, length)


def test_long_buffers() -> None:
    for length in (64 * 1024 - 1, 64 * 1024, 1 << 20, (4 << 20) + 13):
        data = os.urandom(length)
        assert _core.crc32c(data) == _core.crc32c_without_folding(data) == oracle.crc32c(data)
        assert _core.crc32c_without_hardware(data) == oracle.crc32c(data)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=40_000), st.integers(0, 7))
def test_any_bytes(data: bytes, skip: int) -> None:
    piece = memoryview(data)[min(skip, len(data)) :]
    expected = oracle.crc32c(piece)
    assert (
        _core.crc32c(piece) == _core.crc32c_without_folding(piece) == _core.crc32c_without_hardware(piece) == expected
    )
