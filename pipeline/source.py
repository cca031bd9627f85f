"""The PySpark data source `seglog`: Spark's Python data source API bound to the planner
(`planning`), the task reader (`reading`) and the writer (`writing`).

Where each part runs: Spark creates the `DataSource` from the options in a Python worker of the
driver; `reader()`, `pushFilters()` and `partitions()` run there when a query is planned (the
options and limits are checked then), and the reader is pickled to the executors, whose `read()`
gets one `PiecePartition` each and resolves its partition's limits when it runs (Spark 4.3
reuses the planned partitions for a loaded DataFrame's later queries: `planning.ReadPiece`).
Likewise `writer()` runs on the driver, the writer is pickled to the executors for `write()`, and
`commit()`/`abort()` run on the driver with the tasks' messages.
"""

from __future__ import annotations

import contextlib
import socket
import time
from collections.abc import Iterator, Sequence
from dataclasses import replace

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceReader,
    DataSourceStreamArrowWriter,
    DataSourceStreamReader,
    Filter,
    InputPartition,
    WriterCommitMessage,
)
from pyspark.sql.streaming.datasource import (  # (pyspark ≥ 4.2: admission control, AvailableNow)
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    ReadMinRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    DataType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from seglogfs.engine import DataDir, UnknownTopicOrPartitionError
from seglogfs.pipeline.commit import abort_staged, commit_staged
from seglogfs.pipeline.options import (
    TABLE_REFUSED,
    OptionError,
    ReadOptions,
    SpecificOffsets,
    SpecificTimestamps,
    check_read_option_names,
    lowered,
    parse_bool,
    parse_read_options,
)
from seglogfs.pipeline.planning import (
    DataLossError,
    NewPartitions,
    ReadPiece,
    SegmentSlice,
    StableOffsets,
    group_slices,
    latest_offsets,
    open_read_only,
    piece_range,
    plan_pieces,
    plan_slices,
    resolve_ranges,
    subscribed,
)
from seglogfs.pipeline.reading import ReadSpec, counting_fetches, read_slice
from seglogfs.pipeline.staging import Staged
from seglogfs.pipeline.stream_writing import (
    abort_micro_batch,
    commit_micro_batch,
    plan_stream_write,
    stream_identity,
)
from seglogfs.pipeline.streaming import (
    Admission,
    StreamOffset,
    StreamOptions,
    available_offsets,
    current_partitions,
    from_json,
    initial_offsets,
    micro_batch_ranges,
    parse_stream_options,
    to_json,
)
from seglogfs.pipeline.task_writer import write_task
from seglogfs.pipeline.writing import Columns, WritePlan, parse_write_options, plan_write

FORMAT_NAME = "seglog"

HEADERS_TYPE = ArrayType(StructType([StructField("key", StringType()), StructField("value", BinaryType())]))


def spark_schema(include_headers: bool) -> StructType:
    """Spark's Kafka source schema (KafkaRecordToRowConverter): every field nullable."""
    fields = [
        StructField("key", BinaryType()),
        StructField("value", BinaryType()),
        StructField("topic", StringType()),
        StructField("partition", IntegerType()),
        StructField("offset", LongType()),
        StructField("timestamp", TimestampType()),
        StructField("timestampType", IntegerType()),
    ]
    if include_headers:
        fields.append(StructField("headers", HEADERS_TYPE))
    return StructType(fields)


def _now_ms() -> int:
    return int(time.time() * 1000)


# -- reading --------------------------------------------------------------------------------------
class SlicePartition(InputPartition):
    """One task's work (its `value`): consecutive `SegmentSlice`s of one partition
    (`planning.group_slices`)."""

    def __init__(self, pieces: tuple[SegmentSlice, ...]) -> None:
        super().__init__(pieces)


def _read_task(partition: InputPartition, spec: ReadSpec) -> Iterator[pa.RecordBatch]:
    pieces = partition.value
    if not isinstance(pieces, tuple):  # Spark's stand-in when there is nothing to read
        return
    with counting_fetches("task"):
        for piece in pieces:
            yield from read_slice(piece, spec)


class PiecePartition(InputPartition):
    """One batch task's work (its `value`): a `ReadPiece`, whose limits the task resolves, or
    the `NewPartitions` of its subscription."""

    def __init__(self, piece: ReadPiece | NewPartitions) -> None:
        super().__init__(piece)


class SeglogReader(DataSourceReader):
    """Plans a batch read when Spark asks for partitions: checks the options and the limits on
    the data dir as it is, and cuts partitions for `minPartitions`; each task resolves its
    partition's limits when it runs and reads what they hold then (see `planning.ReadPiece`
    for why). Takes no filters (Spark refuses a reader that implements `pushFilters` while
    `spark.sql.python.filterPushdown.enabled` is off): see `PushdownSeglogReader`."""

    def __init__(self, options: ReadOptions) -> None:
        self.options = options
        self.spec = ReadSpec.of(options)

    def partitions(self) -> Sequence[InputPartition]:
        options = self.options
        with (
            counting_fetches("planning"),
            open_read_only(options.location, options.engine, _now_ms(), subscribed(options.subscription)) as data_dir,
        ):
            assigned = options.subscription.partitions(data_dir.topics())
            ranges = resolve_ranges(
                data_dir,
                assigned,
                options.starting,
                options.ending,
                strategy=options.starting_strategy,
                fail_on_data_loss=options.fail_on_data_loss,
                stable=StableOffsets() if options.read_committed else None,
                exact=options.location.store_uri is None,  # (a backup's segments are not fetched here)
            )
        pieces: list[ReadPiece | NewPartitions] = list(plan_pieces(ranges, options.min_partitions))
        if options.subscription.kind != "assign" and not any(
            isinstance(limit, SpecificOffsets | SpecificTimestamps) for limit in (options.starting, options.ending)
        ):  # (limits per partition name every partition read: a new one cannot be read)
            new = NewPartitions(frozenset(assigned))
            last = pieces[-1] if pieces else None
            pieces[-1:] = [replace(last, new_partitions=new) if isinstance(last, ReadPiece) else new]
        return [PiecePartition(piece) for piece in pieces]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        piece = partition.value
        if not isinstance(piece, ReadPiece | NewPartitions):  # Spark's stand-in when there is nothing to read
            return
        with counting_fetches("task"):
            yield from self._read(piece)

    def _read(self, piece: ReadPiece | NewPartitions) -> Iterator[pa.RecordBatch]:
        options = self.options
        stable = StableOffsets() if options.read_committed else None
        with open_read_only(options.location, options.engine, _now_ms(), subscribed(options.subscription)) as data_dir:
            pieces: list[ReadPiece] = [piece] if isinstance(piece, ReadPiece) else []
            new = piece if isinstance(piece, NewPartitions) else piece.new_partitions
            if new is not None:
                available = options.subscription.partitions(data_dir.topics())
                pieces.extend(ReadPiece(*tp) for tp in available if tp not in new.planned)
            ranges = []
            for each in pieces:
                try:
                    ranges.append(
                        piece_range(
                            data_dir,
                            each,
                            options.starting,
                            options.ending,
                            strategy=options.starting_strategy,
                            fail_on_data_loss=options.fail_on_data_loss,
                            stable=stable,
                        )
                    )
                except UnknownTopicOrPartitionError:
                    if options.fail_on_data_loss:
                        gone = f"{each.topic}-{each.partition}"
                        where = ",".join(str(log_dir) for log_dir in options.location.log_dirs)
                        raise DataLossError(
                            f"{gone} was deleted before the query read it, or host {socket.gethostname()} sees "
                            f"another data dir at {where} (every executor must see the driver's data dir at its path)"
                        ) from None
            slices = plan_slices(data_dir, ranges)
            if stable is not None:
                slices = stable.with_aborted(slices)
        for task in slices:
            yield from read_slice(task, self.spec)


class PushdownSeglogReader(SeglogReader):
    """A reader offered Spark's filters, which pushes none of them: Spark evaluates every
    filter itself. Spark (4.3) keeps the plan made with the pushed filters of one query for the
    loaded DataFrame and answers its next queries that push nothing from it, so a plan narrowed
    by one query's filters would answer a later query without them (`df.where("offset >= 50")`
    then `df.count()` counted 150 of 300). Being offered filters still makes Spark plan the
    query afresh."""

    def pushFilters(self, filters: list[Filter]) -> list[Filter]:
        return list(filters)


# -- streaming reads ------------------------------------------------------------------------------
class SeglogStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """`spark.readStream.format("seglog")`: offsets from `streaming`, slices from `planning`,
    tasks from `reading`. `initialOffset`, `latestOffset`, `partitions` and `commit` run in one
    long-lived Python worker of the driver (so the AvailableNow target set by
    `prepareForTriggerAvailableNow`, the admission's clock and the latest offsets stay for the
    query's run); `read` runs in the executors."""

    def __init__(self, options: StreamOptions) -> None:
        self.options = options
        self.spec = ReadSpec.of(options)
        self.target: dict[tuple[str, int], int] | None = None
        self.admission = Admission(options)
        # The log ends the last latestOffset saw: the progress's latestOffset.
        self.latest: dict[tuple[str, int], int] = {}
        # read_committed: each partition's transactions, followed for the query's run (this
        # object lives in one driver worker as long as the query).
        self.stable = StableOffsets() if options.read_committed else None

    @contextlib.contextmanager
    def _open(self) -> Iterator[DataDir]:
        with (
            counting_fetches("planning"),
            open_read_only(
                self.options.location, self.options.engine, _now_ms(), subscribed(self.options.subscription)
            ) as data_dir,
        ):
            yield data_dir

    def initialOffset(self) -> StreamOffset:
        with self._open() as data_dir:
            return to_json(initial_offsets(self.options, data_dir, self.stable))

    def getDefaultReadLimit(self) -> ReadLimit:
        """A limit other than ReadAllAvailable when the options set one: Spark gives it back to
        `latestOffset`, which applies them all (`streaming.Admission`), unless the trigger asks
        for everything (Trigger.Once). pyspark has no limit that carries maxTriggerDelay, nor a
        composite one, as Spark's Kafka source's has."""
        if self.options.max_offsets_per_trigger is not None:
            return ReadMaxRows(self.options.max_offsets_per_trigger)
        if self.options.min_offsets_per_trigger is not None:
            return ReadMinRows(self.options.min_offsets_per_trigger)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        with self._open() as data_dir:
            partitions = current_partitions(self.options.subscription, data_dir)
            self.target = dict(latest_offsets(data_dir, partitions, self.stable))

    def latestOffset(self, start: StreamOffset, limit: ReadLimit) -> StreamOffset:
        begin = from_json(start)
        with self._open() as data_dir:
            available = available_offsets(self.options, data_dir, begin, target=self.target, stable=self.stable)
        self.latest = available.latest
        if isinstance(limit, ReadAllAvailable):
            return to_json(available.latest)
        return to_json(self.admission.end(begin, available, _now_ms(), hold_back=self.target is None))

    def reportLatestOffset(self) -> StreamOffset | None:
        """The log ends the last micro-batch was planned against (under AvailableNow, its
        target): the progress's `latestOffset`, as Spark's Kafka source reports it."""
        return to_json(self.latest) if self.latest else None

    def partitions(self, start: StreamOffset, end: StreamOffset) -> Sequence[InputPartition]:
        with self._open() as data_dir:
            ranges = micro_batch_ranges(
                data_dir, from_json(start), from_json(end), fail_on_data_loss=self.options.fail_on_data_loss
            )
            slices = plan_slices(data_dir, ranges, min_partitions=self.options.min_partitions)
            if self.stable is not None:
                for topic, partition in {(piece.topic, piece.partition) for piece in slices}:
                    self.stable.last_stable_offset(data_dir.partition(topic, partition))  # read up to the end
                slices = self.stable.with_aborted(slices)
        return [SlicePartition(task) for task in group_slices(slices, self.options.min_partitions)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return _read_task(partition, self.spec)

    def commit(self, end: StreamOffset) -> None:
        """Nothing to do: a log dir keeps no consumer positions (the checkpoint holds them)."""


class RefusedStreamReader(DataSourceStreamReader):
    """A stream whose options were refused: its first call from Spark raises the refusal.
    pyspark (4.3) meets an error raised by `streamReader()` itself with an UnboundLocalError of
    its own (its clean-up stops a reader never made), printed last, after ours."""

    def __init__(self, error: OptionError) -> None:
        self.error = error

    def initialOffset(self) -> StreamOffset:
        raise self.error.with_traceback(None)

    def getDefaultReadLimit(self) -> ReadLimit:
        raise self.error.with_traceback(None)

    def latestOffset(self, start: StreamOffset, limit: ReadLimit) -> StreamOffset:
        raise self.error.with_traceback(None)

    def partitions(self, start: StreamOffset, end: StreamOffset) -> Sequence[InputPartition]:
        raise self.error.with_traceback(None)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        raise self.error.with_traceback(None)


# -- writing --------------------------------------------------------------------------------------
class StagedWrite(WriterCommitMessage):
    """A task's commit message: what it staged."""

    def __init__(self, staged: Staged) -> None:
        self.staged = staged


def _staged(messages: list[WriterCommitMessage | None]) -> list[Staged | None]:
    return [m.staged if isinstance(m, StagedWrite) else None for m in messages]


_BINARY_OR_STRING = (BinaryType, StringType)


def _type_name(data_type: DataType) -> str:
    return data_type.simpleString()


def writable_columns(schema: StructType) -> Columns:
    """The DataFrame's columns as Spark's Kafka sink checks them (KafkaWriter.validateQuery):
    `value` string or binary (required), `key` string or binary, `topic` string, `partition`
    int, `headers` array<struct<key string, value binary>>; other columns are ignored."""
    fields = {f.name: f.dataType for f in schema.fields}
    if "value" not in fields:
        raise OptionError("Required attribute 'value' not found")
    if not isinstance(fields["value"], _BINARY_OR_STRING):
        raise OptionError(f"value attribute type must be a string or binary, not {_type_name(fields['value'])}")
    if "key" in fields and not isinstance(fields["key"], _BINARY_OR_STRING):
        raise OptionError(f"key attribute type must be a string or binary, not {_type_name(fields['key'])}")
    if "topic" in fields and not isinstance(fields["topic"], StringType):
        raise OptionError(f"topic type must be a string, not {_type_name(fields['topic'])}")
    if "partition" in fields and not isinstance(fields["partition"], IntegerType):
        raise OptionError(f"partition attribute type must be an int, not {_type_name(fields['partition'])}")
    if "headers" in fields:
        headers = fields["headers"]
        element = headers.elementType if isinstance(headers, ArrayType) else None
        shape = [(f.name, type(f.dataType)) for f in element.fields] if isinstance(element, StructType) else None
        if shape != [("key", StringType), ("value", BinaryType)]:
            raise OptionError(
                f"headers attribute type must be array<struct<key:string,value:binary>>, not {_type_name(headers)}"
            )
    return Columns(
        key="key" in fields, topic="topic" in fields, partition="partition" in fields, headers="headers" in fields
    )


class SeglogWriter(DataSourceArrowWriter):
    """Stages in the tasks, appends at commit (see `writing`)."""

    def __init__(self, plan: WritePlan) -> None:
        self.plan = plan

    def write(self, iterator: Iterator[pa.RecordBatch]) -> StagedWrite:
        return StagedWrite(write_task(self.plan, iterator))

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        commit_staged(self.plan, _staged(messages))

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        abort_staged(self.plan)


class SeglogStreamWriter(DataSourceStreamArrowWriter):
    """Stages in the tasks, appends each micro-batch exactly once at commit (see `stream_writing`)."""

    def __init__(self, plan: WritePlan) -> None:
        self.plan = plan

    def write(self, iterator: Iterator[pa.RecordBatch]) -> StagedWrite:
        return StagedWrite(write_task(self.plan, iterator))

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        commit_micro_batch(self.plan, _staged(messages), batchId)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        abort_micro_batch(self.plan, _staged(messages))


# -- the data source ------------------------------------------------------------------------------
class SeglogDataSource(DataSource):
    """`spark.read.format("seglog")` / `df.write.format("seglog").mode("append")`."""

    push_filters = True  # `register(spark, filter_pushdown=False)` registers a subclass without

    @classmethod
    def name(cls) -> str:
        return FORMAT_NAME

    def schema(self) -> StructType:
        """Asked when a read is loaded: its options are checked by name then."""
        check_read_option_names(self.options)
        return spark_schema(parse_bool(lowered(self.options), "includeHeaders", False))

    def reader(self, schema: StructType) -> SeglogReader:
        if not self.options:  # a table made with CREATE TABLE … USING seglog (and a schema)
            raise OptionError(TABLE_REFUSED)
        check_read_option_names(self.options)
        options = parse_read_options(self.options)
        if schema != spark_schema(options.include_headers):
            raise OptionError("seglog does not take a user-specified schema: it has Spark's Kafka source schema")
        if self.push_filters and parse_bool(lowered(self.options), "pushFilters", True):
            return PushdownSeglogReader(options)
        return SeglogReader(options)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        """Asked when a started query sets up its source, in the query's thread: the first
        moment a Python source can tell a stream's options from a batch read's (`schema()`,
        asked at `load()`, is the same call for both), so a stream's option that a batch read
        takes (`endingOffsets`) fails the query as it initialises, before any micro-batch."""
        try:
            check_read_option_names(self.options)
            options = parse_stream_options(self.options)
            if schema != spark_schema(options.include_headers):
                raise OptionError("seglog does not take a user-specified schema: it has Spark's Kafka source schema")
        except OptionError as error:
            return RefusedStreamReader(error)
        return SeglogStreamReader(options)

    def writer(self, schema: StructType, overwrite: bool) -> SeglogWriter:
        if overwrite:
            raise OptionError("seglog only appends, as Kafka does: use mode('append')")
        options = parse_write_options(self.options)
        return SeglogWriter(plan_write(options, writable_columns(schema), int(time.time() * 1000)))

    def streamWriter(self, schema: StructType, overwrite: bool) -> SeglogStreamWriter:
        """Every output mode appends, as Spark's Kafka sink does (complete mode: the whole result
        table each trigger)."""
        options = parse_write_options(self.options)
        identity = stream_identity(self.options)
        return SeglogStreamWriter(
            plan_stream_write(options, writable_columns(schema), identity, int(time.time() * 1000))
        )


class SeglogDataSourceWithoutPushdown(SeglogDataSource):
    """`format("seglog")` for sessions where `spark.sql.python.filterPushdown.enabled` is off."""

    push_filters = False
