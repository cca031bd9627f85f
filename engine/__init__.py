"""seglogfs's storage engine: Apache Kafka's log layer, byte-compatible with its on-disk format.

Synchronous, free of FUSE, trio and Spark, so that the mount, the CLI and a Spark executor all
use it unchanged. Time comes in as `now_ms` arguments. The public API:

* `BrokerConfig`, `LogConfig` — Kafka's settings, names, defaults and precedence;
* `DataDir` — one broker's log dirs: topics, partitions, lock, checkpoints, clean shutdown;
* `PartitionLog` — one partition: append (or adopt a staged file of batches as a segment), read,
  offset for timestamp, roll, flush, truncate;
* `Record`, `BatchHeader`, `build_batch`, `decode_records` — the v2 record batch codec;
* `EngineError` and its subclasses.

Its folders are its layers, each importing only those below it (an import contract checks it):
`record/` (the record format), `log/` (one partition's log), `cleaner/` and `internal_topics/`
(compaction; Kafka's own topics), then `datadir.py` and the tools over it (`check`, `scheduler`,
`status`, `producer`, `mirror`); `config.py` and `text/` sit between the log and the record format, and
`files.py` and `errors.py` under everything. The names above are loaded when first used, so a
process that needs one layer does not load them all.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
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
    from seglogfs.engine.log.log import AppendInfo, PartitionLog
    from seglogfs.engine.log.segment import TimestampAndOffset
    from seglogfs.engine.record.builder import build_batch
    from seglogfs.engine.record.compression import CompressionType
    from seglogfs.engine.record.records import BatchHeader, Record, TimestampType, decode_records

_WHERE = {
    "AppendInfo": "log.log",
    "BatchHeader": "record.records",
    "BrokerConfig": "config",
    "CompressionType": "record.compression",
    "ConfigError": "errors",
    "CorruptIndexError": "errors",
    "CorruptRecordError": "errors",
    "DataDir": "datadir",
    "EngineError": "errors",
    "InvalidRecordError": "errors",
    "InvalidTopicError": "errors",
    "LogConfig": "config",
    "LogDirLockedError": "errors",
    "OffsetOutOfRangeError": "errors",
    "PartitionLog": "log.log",
    "ReadOnlyError": "errors",
    "Record": "record.records",
    "RecordTooLargeError": "errors",
    "TimestampAndOffset": "log.segment",
    "TimestampParseError": "errors",
    "TimestampType": "record.records",
    "TopicExistsError": "errors",
    "UnknownTopicOrPartitionError": "errors",
    "build_batch": "record.builder",
    "decode_records": "record.records",
}
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


def __getattr__(name: str) -> Any:
    """A public name, from its module on first use (PEP 562)."""
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{_WHERE[name]}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_WHERE})
