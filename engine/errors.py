"""The engine's errors: one root, precise subclasses, each saying what and where.

Callers map these to their own world in one place (errno in the mount, an exit code in the CLI);
the engine never does. Every message is one line that names the file, offset or setting at fault.
"""

from __future__ import annotations

import os


class EngineError(Exception):
    """Root of every error the engine raises on purpose."""


class ConfigError(EngineError):
    """A setting has a bad name or value; the message names the key and where it came from."""


class InvalidTopicError(EngineError):
    """A topic name Kafka would refuse (empty, `.`/`..`, too long, or a character outside
    `[a-zA-Z0-9._-]`)."""


class UnknownTopicOrPartitionError(EngineError):
    """The topic or partition does not exist in the data dir."""


class TopicExistsError(EngineError):
    """A topic of that name exists already."""


class CorruptRecordError(EngineError):
    """Bytes in a `.log` file that do not form a valid record batch (bad CRC, length, magic,
    offsets). `path` and `position` say where."""

    def __init__(self, path: str | os.PathLike[str], position: int, reason: str) -> None:
        self.path = os.fspath(path)
        self.position = position
        self.reason = reason
        super().__init__(f"{self.path}: corrupt record batch at position {position}: {reason}")


class UnsafeFileError(EngineError):
    """Where a regular file belongs in a data dir (a segment, an index, a checkpoint, a config),
    something else is: a symbolic link, a FIFO, a socket, a device, a directory, or a file far
    larger than such a file can be. It is neither followed nor opened; its partition is offline."""

    def __init__(self, path: str | os.PathLike[str], what: str, belongs: str = "a regular file") -> None:
        self.path = os.fspath(path)
        self.what = what
        super().__init__(f"{self.path}: {what} where {belongs} belongs: refused")


class UnsupportedFormatError(EngineError):
    """Intact data this engine cannot read: a legacy message (magic 0 or 1) whose CRC-32 holds
    but whose content does not decode (an unknown codec, a wrapper in a framing no reader
    knows). Never treated as damage: nothing is cut or rewritten."""


class CorruptIndexError(EngineError):
    """An index file whose size or entries break the index invariants."""

    def __init__(self, path: str | os.PathLike[str], reason: str) -> None:
        self.path = os.fspath(path)
        self.reason = reason
        super().__init__(f"{self.path}: corrupt index: {reason}")


class InvalidOffsetError(EngineError):
    """An index append whose offset does not increase (Kafka's InvalidOffsetException)."""


class IndexFullError(EngineError):
    """An append to an index that has no free slot left."""


class OffsetOutOfRangeError(EngineError):
    """A read or look-up at an offset outside [log start offset, log end offset]."""

    def __init__(self, what: str, offset: int, log_start_offset: int, log_end_offset: int) -> None:
        self.offset = offset
        self.log_start_offset = log_start_offset
        self.log_end_offset = log_end_offset
        super().__init__(
            f"{what}: offset {offset} is out of range "
            f"(log start offset {log_start_offset}, log end offset {log_end_offset})"
        )


class OffsetOverflowError(EngineError):
    """An offset that cannot be stored relative to its segment's base offset (int32)."""


class InvalidRecordError(EngineError):
    """A record or batch the log refuses: out-of-order offsets, a null key on a compacted topic,
    a timestamp or field that does not fit."""


class RecordTooLargeError(EngineError):
    """A batch larger than `max.message.bytes` or `segment.bytes`."""


class UnsupportedCompressionError(EngineError):
    """A compression codec id outside 0..4, or a codec whose library is missing."""


class LogDirLockedError(EngineError):
    """Another process holds the data dir's `.lock`."""


class ReadOnlyError(EngineError):
    """A write to a data dir that was opened read-only."""


class LogOfflineError(EngineError):
    """A partition whose storage failed was taken offline (Kafka's offline log dir): it takes
    no appends and serves no reads until the data dir is opened again."""


class TimestampParseError(EngineError):
    """A timestamp that is neither epoch milliseconds nor ISO-8601."""
