"""The micro-batch offset arithmetic of `seglogfs.pipeline.streaming`, without Spark."""

from __future__ import annotations

import pytest

from seglogfs.pipeline.options import Latest, OptionError
from seglogfs.pipeline.streaming import (
    Admission,
    Available,
    from_json,
    parse_stream_options,
    rate_limit,
    source_metrics,
    to_json,
)


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


def test_min_and_max_offsets_per_trigger_and_max_trigger_delay_parse_as_spark_reads_them(tmp_path) -> None:
    base = {"path": str(tmp_path), "subscribe": "t"}
    assert parse_stream_options(base).max_trigger_delay_ms == 15 * 60 * 1000
    for text, ms in (("30s", 30_000), ("2m", 120_000), ("500ms", 500), ("250", 250), ("1h", 3_600_000)):
        assert parse_stream_options({**base, "maxTriggerDelay": text}).max_trigger_delay_ms == ms
    with pytest.raises(OptionError, match="maxTriggerDelay must be a time"):
        parse_stream_options({**base, "maxTriggerDelay": "soon"})
    with pytest.raises(OptionError, match=r"minOffsetPerTrigger\(9\) is higher than the maxOffsetsPerTrigger\(8\)"):
        parse_stream_options({**base, "minOffsetsPerTrigger": "9", "maxOffsetsPerTrigger": "8"})


def test_admission_holds_back_below_the_minimum_until_the_delay_passes(tmp_path) -> None:
    options = parse_stream_options(
        {"path": str(tmp_path), "subscribe": "t", "minOffsetsPerTrigger": "10", "maxTriggerDelay": "5s"}
    )
    admission = Admission(options)
    start = {("t", 0): 0}
    few = Available(begin={("t", 0): 0}, latest={("t", 0): 4})
    assert admission.end(start, few, now_ms=1_000_000) == {("t", 0): 4}  # the first trigger takes a batch
    start = {("t", 0): 4}
    few = Available(begin={("t", 0): 4}, latest={("t", 0): 9})
    assert admission.end(start, few, now_ms=1_004_999) == start  # 5 < 10, within the delay
    assert admission.end(start, few, now_ms=1_004_999, hold_back=False) == {("t", 0): 9}  # AvailableNow
    enough = Available(begin={("t", 0): 4}, latest={("t", 0): 14})
    assert admission.end(start, enough, now_ms=1_005_000 - 1) == {("t", 0): 14}  # 10 records
    start = {("t", 0): 14}
    few = Available(begin={("t", 0): 14}, latest={("t", 0): 15})
    assert admission.end(start, few, now_ms=1_009_998) == start
    assert admission.end(start, few, now_ms=1_009_999) == {("t", 0): 15}  # 5 s after the last batch


def test_source_metrics_are_spark_kafka_metrics_of_a_progress() -> None:
    source = {"endOffset": '{"t":{"0":2,"1":4}}', "latestOffset": '{"t":{"0":10,"1":15}}'}
    assert source_metrics(source) == {
        "minOffsetsBehindLatest": "8",
        "maxOffsetsBehindLatest": "11",
        "avgOffsetsBehindLatest": "9.5",
    }
    as_json = {"endOffset": {"t": {"0": 10}}, "latestOffset": {"t": {"0": 10}}}
    assert source_metrics(as_json)["avgOffsetsBehindLatest"] == "0.0"
    assert source_metrics({"endOffset": None, "latestOffset": None}) == {}
