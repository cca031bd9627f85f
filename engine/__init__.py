"""seglogfs's storage engine: Apache Kafka's log layer, byte-compatible with its on-disk format.

Synchronous, free of FUSE, trio and Spark, so that the mount, the CLI and a Spark executor all
use it unchanged. Time comes in as `now_ms` arguments. The public API:

* `BrokerConfig`, `LogConfig` — Kafka's settings, names, defaults and precedence;
* `DataDir` — one broker's log dirs: topics, partitions, lock, checkpoints, clean shutdown;
* `PartitionLog` — one partition: append (or adopt a staged file of batches as a segment), read,
  offset for timestamp, roll, flush, truncate;
* `Record`, `BatchHeader`, `build_batch`, `decode_records` — the v2 record batch codec;
* `EngineError` and its subclasses.
"""

from seglogfs.engine.compression import CompressionType
from seglogfs.engine.config import BrokerConfig, LogConfig
from seglogfs.engine.datadir import DataDir
from seglogfs.engine.errors import (
    ConfigError,
    CorruptIndexError,
    CorruptRecordError,
    EngineError,
    InvalidRecordError,
    InvalidTopicError,
    LogDirLockedError,
    OffsetOutOfRangeError,
    ReadOnlyError,
    RecordTooLargeError,
    TimestampParseError,
    TopicExistsError,
    UnknownTopicOrPartitionError,
)
from seglogfs.engine.log import AppendInfo, PartitionLog
from seglogfs.engine.records import BatchHeader, Record, TimestampType, build_batch, decode_records
from seglogfs.engine.segment import TimestampAndOffset

__all__ = [
    "AppendInfo",
    "BatchHeader",
    "BrokerConfig",
    "CompressionType",
    "ConfigError",
    "CorruptIndexError",
    "CorruptRecordError",
    "DataDir",
    "EngineError",
    "InvalidRecordError",
    "InvalidTopicError",
    "LogConfig",
    "LogDirLockedError",
    "OffsetOutOfRangeError",
    "PartitionLog",
    "ReadOnlyError",
    "Record",
    "RecordTooLargeError",
    "TimestampAndOffset",
    "TimestampParseError",
    "TimestampType",
    "TopicExistsError",
    "UnknownTopicOrPartitionError",
    "build_batch",
    "decode_records",
]
