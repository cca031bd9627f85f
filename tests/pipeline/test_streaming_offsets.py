"""The micro-batch offset arithmetic of `seglogfs.pipeline.streaming`, without Spark."""

from __future__ import annotations

import pytest

from seglogfs.pipeline.options import Latest, OptionError
from seglogfs.pipeline.streaming import from_json, parse_stream_options, rate_limit, to_json


def test_stream_options_default_to_latest_and_refuse_ending_offsets(tmp_path) -> None:
    options = parse_stream_options({"path": str(tmp_path), "subscribe": "t", "maxOffsetsPerTrigger": "7"})
    assert options.starting == Latest()
    assert options.max_offsets_per_trigger == 7
    with pytest.raises(OptionError, match="not valid for streaming"):
        parse_stream_options({"path": str(tmp_path), "subscribe": "t", "endingOffsets": "latest"})
    with pytest.raises(OptionError, match="maxOffsetsPerTrigger"):
        parse_stream_options({"path": str(tmp_path), "subscribe": "t", "maxOffsetsPerTrigger": "0"})


def test_offsets_round_trip_as_spark_kafka_json() -> None:
    offsets = {("a", 0): 3, ("a", 10): 5, ("b", 1): 0}
    assert to_json(offsets) == {"a": {"0": 3, "10": 5}, "b": {"1": 0}}
    assert from_json(to_json(offsets)) == offsets
    assert from_json(None) == {}


def test_rate_limit_shares_in_proportion() -> None:
    begin = {("t", 0): 0, ("t", 1): 10, ("t", 2): 5}
    latest = {("t", 0): 100, ("t", 1): 40, ("t", 2): 5, ("t", 3): 2}  # t-3 new: not in begin
    assert rate_limit(begin, latest, 13) == {("t", 0): 10, ("t", 1): 13, ("t", 2): 5, ("t", 3): 2}
    assert rate_limit({("t", 0): 0}, {("t", 0): 1000}, 1) == {("t", 0): 1}
