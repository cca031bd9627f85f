"""Micro-batch offsets for `spark.readStream.format("seglog")`, as Spark's KafkaMicroBatchStream
computes them. Nothing here imports pyspark (`source.SeglogStreamReader` binds it).

An offset is a JSON-able dict `{"topic": {"partition": offset}}` (partition as a string, as in
Spark's Kafka source offsets). A query starts at `startingOffsets`/timestamps resolved as a batch
read resolves them (default `latest`); each micro-batch ends at the log end offsets of the
partitions the subscription matches then, cut by `maxOffsetsPerTrigger` (shared in proportion
to what each partition has to read, Spark's `rateLimit`) and, under `Trigger.AvailableNow`, by
the log ends seen when the query started; `minOffsetsPerTrigger` holds a micro-batch back until
that many records are there or `maxTriggerDelay` has passed since the last (`Admission`). A
partition that appears meanwhile (a new topic matching `subscribePattern`, or more partitions)
is read from its log start. Offsets gone by the time a micro-batch is planned (retention,
deleted records or partitions) are data loss: an error with `failOnDataLoss`, else the range is
cut to what exists. The source's metrics in a query's progress are Spark's Kafka source's
(`source_metrics`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from seglogfs.engine import DataDir
from seglogfs.pipeline.options import (
    INTERNAL_TOPICS,
    Latest,
    OptionError,
    SourceOptions,
    Subscription,
    TopicPartition,
    lowered,
    parse_limit,
    parse_positive,
    parse_source_options,
)
from seglogfs.pipeline.planning import (
    _DATA_LOSS_HINT,
    DataLossError,
    OffsetRange,
    StableOffsets,
    latest_offsets,
    resolve_limit,
)

StreamOffset = dict[str, dict[str, int]]
Offsets = Mapping[TopicPartition, int]


@dataclass(frozen=True, kw_only=True)
class StreamOptions(SourceOptions):
    """A streaming read's options, checked."""

    max_offsets_per_trigger: int | None = None
    min_offsets_per_trigger: int | None = None
    max_trigger_delay_ms: int = 15 * 60 * 1000  # Spark's DEFAULT_MAX_TRIGGER_DELAY, "15m"


# Spark's JavaUtils.timeStringAsMs: a number and a unit (none: milliseconds).
_DURATION = re.compile(r"(-?[0-9]+)([a-z]+)?")
_DURATION_UNITS_MS = {"us": 0.001, "ms": 1, "s": 1000, "m": 60_000, "min": 60_000, "h": 3_600_000, "d": 86_400_000}


def parse_duration_ms(name: str, text: str) -> int:
    """A time option as Spark reads `maxTriggerDelay` (`15m`, `30s`, `500ms`, `500`)."""
    match = _DURATION.fullmatch(text.strip().lower())
    unit = match.group(2) or "ms" if match else None
    if match is None or unit not in _DURATION_UNITS_MS or int(match.group(1)) < 0:
        raise OptionError(f"{name} must be a time such as 15m, 30s or 500ms, not {text!r}")
    return int(int(match.group(1)) * _DURATION_UNITS_MS[unit])


def parse_stream_options(raw: Mapping[str, str]) -> StreamOptions:
    """Check a streaming read's options; OptionError names the first problem. The ending
    options have no meaning for a stream (Spark refuses them too)."""
    options = lowered(raw)
    for name in ("endingOffsets", "endingTimestamp", "endingOffsetsByTimestamp"):
        if name.lower() in options:
            raise OptionError(f"{name} option not valid for streaming queries")
    starting = parse_limit(options, "startingTimestamp", "startingOffsetsByTimestamp", "startingOffsets", Latest())
    max_rows = parse_positive(options, "maxOffsetsPerTrigger")
    min_rows = parse_positive(options, "minOffsetsPerTrigger")
    if min_rows is not None and max_rows is not None and min_rows > max_rows:
        # (Spark's KafkaSourceProvider.validateStreamOptions, in its words)
        raise OptionError(
            f"The value of minOffsetPerTrigger({min_rows}) is higher than the maxOffsetsPerTrigger({max_rows})."
        )
    delay = options.get("maxtriggerdelay")
    return StreamOptions(
        **parse_source_options(options, starting),
        max_offsets_per_trigger=max_rows,
        min_offsets_per_trigger=min_rows,
        max_trigger_delay_ms=StreamOptions.max_trigger_delay_ms
        if delay is None
        else parse_duration_ms("maxTriggerDelay", delay),
    )


# -- offsets as Spark keeps them ------------------------------------------------------------------
def to_json(offsets: Offsets) -> StreamOffset:
    out: StreamOffset = {}
    for (topic, partition), offset in sorted(offsets.items()):
        out.setdefault(topic, {})[str(partition)] = int(offset)
    return out


def from_json(offset: Mapping[str, Mapping[str, int]] | None) -> dict[TopicPartition, int]:
    if not offset:
        return {}
    return {(topic, int(p)): int(o) for topic, parts in offset.items() for p, o in parts.items()}


# -- what each micro-batch reads ------------------------------------------------------------------
def current_partitions(subscription: Subscription, data_dir: DataDir) -> list[TopicPartition]:
    """The partitions the subscription matches now. Unlike a batch read, a subscribed topic that
    does not exist yet is no error (a stream picks it up when it appears)."""
    available = data_dir.topics()
    if subscription.kind == "subscribe":
        topics = [t for t in subscription.topics if t in available and t not in INTERNAL_TOPICS]
        return sorted((t, p) for t in set(topics) for p in available[t])
    return subscription.partitions(available)


def initial_offsets(
    options: StreamOptions, data_dir: DataDir, stable: StableOffsets | None = None
) -> dict[TopicPartition, int]:
    """Where a new query starts: its starting options resolved on each partition (with `stable`,
    read_committed: `latest` is the last stable offset)."""
    offsets = {}
    for topic, partition in current_partitions(options.subscription, data_dir):
        log = data_dir.partition(topic, partition)
        log_end = None if stable is None else stable.last_stable_offset(log)
        offsets[(topic, partition)] = resolve_limit(
            log, options.starting, starting=True, strategy=options.starting_strategy, log_end=log_end
        )
    return offsets


def rate_limit(begin: Offsets, latest: Offsets, max_rows: int) -> dict[TopicPartition, int]:
    """Spark's KafkaMicroBatchStream.rateLimit: `max_rows` shared among the partitions in
    proportion to what each has to read (a share below 1 rounds up, else down)."""
    sizes = {tp: end - begin.get(tp, end) for tp, end in latest.items()}
    total = sum(size for size in sizes.values() if size > 0)
    out: dict[TopicPartition, int] = {}
    for tp, end in latest.items():
        start = begin.get(tp, end)
        size = sizes[tp]
        if size <= 0 or total <= 0:
            out[tp] = end
            continue
        share = max_rows * (size / total)
        step = int(-(-share // 1)) if share < 1 else int(share)
        out[tp] = min(end, start + step)
    return out


@dataclass(frozen=True)
class Available:
    """What the next micro-batch may read, per partition: where it begins (`start`, or the log
    start of a partition new to the query) and the log end now (within the AvailableNow
    target). `latest` is what Spark's progress shows as the source's `latestOffset`."""

    begin: dict[TopicPartition, int]
    latest: dict[TopicPartition, int]


def available_offsets(
    options: StreamOptions,
    data_dir: DataDir,
    start: Offsets,
    *,
    target: Offsets | None = None,
    stable: StableOffsets | None = None,
) -> Available:
    """The log ends of the partitions the subscription matches now (within `target` under
    AvailableNow; with `stable`, the last stable offsets) and where each micro-batch begins."""
    partitions = current_partitions(options.subscription, data_dir)
    if target is not None:
        partitions = [tp for tp in partitions if tp in target]
    latest = dict(latest_offsets(data_dir, partitions, stable))
    if target is not None:
        latest = {tp: min(end, target[tp]) for tp, end in latest.items()}
    begin: dict[TopicPartition, int] = {}
    for tp in latest:
        log_start = data_dir.partition(*tp).log_start_offset
        first = start.get(tp, log_start)  # a new partition: from its log start
        if not options.fail_on_data_loss:
            first = max(first, log_start)
        begin[tp] = first
    # (a log end below `start`, the log truncated, is data loss that `micro_batch_ranges` reports)
    return Available(begin, latest)


class Admission:
    """How much of what is available the next micro-batch takes, as Spark's
    KafkaMicroBatchStream.latestOffset(start, limit) decides with the source's default limit:
    with `minOffsetsPerTrigger`, nothing (the batch's end is its start) while fewer records than
    that are available, unless `maxTriggerDelay` has passed since the last micro-batch taken (the
    query's first trigger always takes one); then at most `maxOffsetsPerTrigger` records,
    shared as `rate_limit` shares them. Keeps the time of the last micro-batch taken: one lives
    in the driver's Python worker for the query's run (Spark's source keeps it in memory too, so
    a restarted query's first trigger takes a batch). Not thread-safe (Spark asks from one
    thread)."""

    def __init__(self, options: StreamOptions) -> None:
        self.min_rows = options.min_offsets_per_trigger
        self.max_rows = options.max_offsets_per_trigger
        self.max_delay_ms = options.max_trigger_delay_ms
        self.last_trigger_ms = 0  # Spark's lastTriggerMillis

    def end(
        self, start: Offsets, available: Available, now_ms: int, *, hold_back: bool = True
    ) -> dict[TopicPartition, int]:
        """The next micro-batch's end offsets. `hold_back=False` (under AvailableNow, which must
        reach its target without waiting for records that will not come) skips the minimum."""
        if hold_back and self.min_rows is not None and self._delay(available, now_ms):
            return {tp: start.get(tp, available.begin[tp]) for tp in available.latest}
        if self.max_rows is not None:
            return rate_limit(available.begin, available.latest, self.max_rows)
        return dict(available.latest)

    def _delay(self, available: Available, now_ms: int) -> bool:
        """Spark's delayBatch: whether to hold this trigger back."""
        assert self.min_rows is not None
        if now_ms - self.last_trigger_ms >= self.max_delay_ms:
            self.last_trigger_ms = now_ms
            return False
        new_records = sum(latest - available.begin[tp] for tp, latest in available.latest.items())
        if new_records < self.min_rows:
            return True
        self.last_trigger_ms = now_ms
        return False


def offsets_behind_latest(latest: Offsets, end: Offsets) -> dict[str, str]:
    """Spark's KafkaMicroBatchStream.metrics: the least, most and mean number of records each
    partition's `end` (a micro-batch's end offset) is behind its `latest` offset, as strings
    (empty with no partitions). A partition `end` lacks is behind by its whole latest offset."""
    behind = [offset - end.get(tp, 0) for tp, offset in latest.items()]
    if not behind:
        return {}
    return {
        "minOffsetsBehindLatest": str(min(behind)),
        "maxOffsetsBehindLatest": str(max(behind)),
        "avgOffsetsBehindLatest": repr(sum(behind) / len(behind)),  # a double, as Scala prints it
    }


def source_metrics(source: Mapping[str, Any]) -> dict[str, str]:
    """Spark's Kafka source metrics for a seglog source's progress (`query.lastProgress.sources[0]`,
    or its JSON): `offsets_behind_latest` of its `latestOffset` and `endOffset`. Spark (4.3) asks no
    Python source for metrics, so a progress's own `metrics` stay empty; the latest offset it
    shows is the one they are worked out from, as Spark's Kafka source works them out."""

    def offsets(name: str) -> dict[TopicPartition, int]:
        value = source.get(name)
        if isinstance(value, str):  # pyspark's SourceProgress holds offsets as JSON text
            value = json.loads(value)
        return from_json(value if isinstance(value, Mapping) else None)

    return offsets_behind_latest(offsets("latestOffset"), offsets("endOffset"))


def micro_batch_ranges(
    data_dir: DataDir, start: Offsets, end: Offsets, *, fail_on_data_loss: bool
) -> list[OffsetRange]:
    """The offsets [start, end) of each partition, checked against the logs now (Spark's
    planInputPartitions): offsets retention removed, a new partition not starting at 0, a
    partition gone, a log end below the range are data loss."""
    problems: list[str] = []
    for tp in sorted(set(start) - set(end)):
        problems.append(f"{tp[0]}-{tp[1]} is gone (its topic or partition was deleted)")
    ranges: list[OffsetRange] = []
    available = data_dir.topics()
    for (topic, partition), until in sorted(end.items()):
        if partition not in available.get(topic, ()):
            problems.append(f"{topic}-{partition} is gone (its topic or partition was deleted)")
            continue
        log = data_dir.partition(topic, partition)
        log_start, log_end = log.log_start_offset, log.log_end_offset
        if (topic, partition) in start:
            first = start[(topic, partition)]
        else:
            first = log_start
            if log_start != 0:
                problems.append(f"added partition {topic}-{partition} starts from {log_start} instead of 0")
        if until < first:
            problems.append(f"{topic}-{partition}: the end offset {until} is before the start offset {first}")
            continue
        if first < until and (first < log_start or until > log_end):
            problems.append(
                f"{topic}-{partition}: offsets [{first}, {until}) were asked for, "
                f"but the log holds [{log_start}, {log_end})"
            )
            first, until = max(first, log_start), min(until, log_end)
        if first < until:
            ranges.append(OffsetRange(topic, partition, first, until))
    if problems and fail_on_data_loss:
        raise DataLossError("; ".join(problems) + ". " + _DATA_LOSS_HINT)
    return ranges
