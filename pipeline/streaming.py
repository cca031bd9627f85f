"""Micro-batch offsets for `spark.readStream.format("seglog")`, as Spark's KafkaMicroBatchStream
computes them. Nothing here imports pyspark (`source.SeglogStreamReader` binds it).

An offset is a JSON-able dict `{"topic": {"partition": offset}}` (partition as a string, as in
Spark's Kafka source offsets). A query starts at `startingOffsets`/timestamps resolved as a batch
read resolves them (default `latest`); each micro-batch ends at the log end offsets of the
partitions the subscription matches then, cut by `maxOffsetsPerTrigger` (shared in proportion
to what each partition has to read, Spark's `rateLimit`) and, under `Trigger.AvailableNow`, by
the log ends seen when the query started. A partition that appears meanwhile (a new topic
matching `subscribePattern`, or more partitions) is read from its log start. Offsets gone by
the time a micro-batch is planned (retention, deleted records or partitions) are data loss: an
error with `failOnDataLoss`, else the range is cut to what exists.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from seglogfs.engine import DataDir
from seglogfs.pipeline.options import (
    INTERNAL_TOPICS,
    EngineSettings,
    Latest,
    Location,
    OffsetLimit,
    OptionError,
    Subscription,
    TopicPartition,
    lowered,
    parse_bool,
    parse_engine_settings,
    parse_limit,
    parse_location,
    parse_positive,
    parse_read_committed,
    parse_subscription,
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


@dataclass(frozen=True)
class StreamOptions:
    """A streaming read's options, checked."""

    location: Location
    engine: EngineSettings
    subscription: Subscription
    starting: OffsetLimit
    starting_strategy: Literal["error", "latest"] = "error"
    fail_on_data_loss: bool = True
    min_partitions: int | None = None
    include_headers: bool = False
    max_offsets_per_trigger: int | None = None
    read_committed: bool = False  # kafka.isolation.level=read_committed


def parse_stream_options(raw: Mapping[str, str]) -> StreamOptions:
    """Check a streaming read's options; OptionError names the first problem. The ending
    options have no meaning for a stream (Spark refuses them too)."""
    options = lowered(raw)
    for name in ("endingOffsets", "endingTimestamp", "endingOffsetsByTimestamp"):
        if name.lower() in options:
            raise OptionError(f"{name} option not valid for streaming queries")
    starting = parse_limit(options, "startingTimestamp", "startingOffsetsByTimestamp", "startingOffsets", Latest())
    strategy = options.get("startingoffsetsbytimestampstrategy", "error").strip().lower()
    if strategy not in ("error", "latest"):
        raise OptionError(f"startingOffsetsByTimestampStrategy must be error or latest, not {strategy!r}")
    if "minoffsetspertrigger" in options or "maxtriggerdelay" in options:
        raise OptionError("minOffsetsPerTrigger and maxTriggerDelay are not supported by seglog")
    return StreamOptions(
        location=parse_location(options),
        engine=parse_engine_settings(options),
        subscription=parse_subscription(options),
        starting=starting,
        starting_strategy="latest" if strategy == "latest" else "error",
        fail_on_data_loss=parse_bool(options, "failOnDataLoss", True),
        min_partitions=parse_positive(options, "minPartitions"),
        include_headers=parse_bool(options, "includeHeaders", False),
        max_offsets_per_trigger=parse_positive(options, "maxOffsetsPerTrigger"),
        read_committed=parse_read_committed(options),
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


def next_offsets(
    options: StreamOptions,
    data_dir: DataDir,
    start: Offsets,
    *,
    max_rows: int | None,
    target: Offsets | None = None,
    stable: StableOffsets | None = None,
) -> dict[TopicPartition, int]:
    """The end of the next micro-batch: the log ends now (within `target` under AvailableNow),
    at most `max_rows` records past `start` (shared as Spark shares them)."""
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
    if max_rows is not None:
        latest = rate_limit(begin, latest, max_rows)
    # (a log end below `start`, the log truncated, is data loss that `micro_batch_ranges` reports)
    return latest


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
