"""Kafka's small text files: offset checkpoints, the leader-epoch checkpoint, partition.metadata.

Offset checkpoints (`recovery-point-offset-checkpoint`, `log-start-offset-checkpoint`,
`replication-offset-checkpoint`, `cleaner-offset-checkpoint`, one of each per log dir):

    0                      version
    2                      number of entries
    orders 0 1234          topic partition offset
    orders 1 98

`leader-epoch-checkpoint` (per partition) has the same frame with `epoch start_offset` lines;
`partition.metadata` is `version: 0` and `topic_id: <base64 uuid>` lines.

`.kafka_cleanshutdown` (per log dir) says by being there that the broker stopped cleanly, so
that its next start skips recovery. Kafka 3.7 and later write into it the broker epoch the broker
stopped in, `{"version":0,"brokerEpoch":6439}` (KIP-966: at its next registration the broker
offers it back, and the controller counts the stop as clean only when the epoch is the one it
still holds), and find no epoch in a file they cannot read as that JSON, an empty one included;
earlier versions write an empty file and only ask whether it exists. So an empty file means a
clean stop to every version, and a broker epoch only to 3.7 and later.

Writes are atomic as Kafka makes them: a `.tmp` file written and fsynced, renamed over the old
one, the directory fsynced. A crash leaves the old file or the new, never a mix; a leftover
`.tmp` is ignored.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path

from seglogfs.engine.errors import EngineError, UnsafeFileError
from seglogfs.engine.files import decode_text, read_regular

CURRENT_VERSION = 0
RECOVERY_POINT_CHECKPOINT = "recovery-point-offset-checkpoint"
LOG_START_OFFSET_CHECKPOINT = "log-start-offset-checkpoint"
REPLICATION_OFFSET_CHECKPOINT = "replication-offset-checkpoint"
CLEANER_OFFSET_CHECKPOINT = "cleaner-offset-checkpoint"
LEADER_EPOCH_CHECKPOINT = "leader-epoch-checkpoint"
PARTITION_METADATA = "partition.metadata"
CLEAN_SHUTDOWN_FILE = ".kafka_cleanshutdown"

TopicPartition = tuple[str, int]
# A checkpoint line is a topic name (at most 249 characters) and two numbers: this is room for
# hundreds of thousands of partitions, and a bound on what a file there makes a reader hold.
_CHECKPOINT_MAX_BYTES = 256 << 20


class CheckpointError(EngineError):
    """A checkpoint file that cannot be read."""


def _durable_temporary(path: Path, text: str) -> str:
    """`text` written to a temporary file of this writer's own beside `path` (`<name>.<random>.tmp`,
    so two writers never share one), mode 0644, fsynced: its name. Nothing is left on failure."""
    fd, tmp = tempfile.mkstemp(prefix=f"{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            os.fchmod(handle.fileno(), 0o644)
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return tmp


def write_atomically(path: Path, text: str) -> None:
    """Replace `path` with `text` durably: a temporary file of this writer's own, fsync, rename,
    fsync of the directory. A crash leaves the old file or the new (and perhaps a temporary file,
    which nothing reads). An OSError (ENOSPC, EIO) names `path` and leaves the old file as it
    was."""
    tmp = None
    try:
        tmp = _durable_temporary(path, text)
        os.replace(tmp, path)
        tmp = None
        fsync_dir(path.parent)
    except OSError as error:
        raise OSError(error.errno, f"writing {path}: {error.strerror}") from None
    finally:
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)


def try_writing(path: Path, text: str) -> None:
    """Write `text` durably to a temporary file of this caller's own beside `path`, as
    `write_atomically` would, and remove it again: an OSError (ENOSPC on a full disk) says now,
    naming `path`, what replacing `path` would meet. `path` is left as it was."""
    try:
        os.unlink(_durable_temporary(path, text))
    except OSError as error:
        raise OSError(error.errno, f"writing {path}: {error.strerror}") from None


def fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _read_text(path: Path) -> str | None:
    """A checkpoint's text, None when there is none. Opened as every data dir file is (never
    through a link, never a FIFO: engine.files) and at most `_CHECKPOINT_MAX_BYTES`; whatever
    stands there instead, and bytes that are not UTF-8, are a CheckpointError naming the file
    (and the line), which callers treat as Kafka treats an unreadable checkpoint."""
    try:
        data = read_regular(path, _CHECKPOINT_MAX_BYTES)
    except FileNotFoundError:
        return None
    except OSError as error:
        raise CheckpointError(f"{path}: cannot read: {error.strerror}") from None
    except UnsafeFileError as error:
        raise CheckpointError(str(error)) from None
    return decode_text(path, data, CheckpointError)


def _read_frame(path: Path, fields: int) -> list[list[str]]:
    text = _read_text(path)
    if text is None:
        return []
    lines = text.splitlines()
    if not lines:
        return []  # a brand-new empty file reads as no entries (Kafka does the same)
    try:
        version = int(lines[0])
        if version != CURRENT_VERSION:
            raise CheckpointError(f"{path}: unrecognised checkpoint version {version} (expected {CURRENT_VERSION})")
        count = int(lines[1])
    except (ValueError, IndexError):
        raise CheckpointError(f"{path}: malformed checkpoint header") from None
    entries = [line.split() for line in lines[2:] if line.strip()]
    if len(entries) != count or any(len(entry) != fields for entry in entries):
        raise CheckpointError(f"{path}: expected {count} entries of {fields} fields, found {len(entries)} lines")
    return entries


def read_offset_checkpoint(path: Path) -> dict[TopicPartition, int]:
    """Entries of an offset checkpoint; {} when the file is missing or empty."""
    out = {}
    for topic, partition, offset in _read_frame(path, 3):
        try:
            out[(topic, int(partition))] = int(offset)
        except ValueError:
            raise CheckpointError(f"{path}: malformed entry {topic} {partition} {offset}") from None
    return out


def format_offset_checkpoint(offsets: Mapping[TopicPartition, int]) -> str:
    """An offset checkpoint file's text: version line, count line, `topic partition offset`."""
    lines = [str(CURRENT_VERSION), str(len(offsets))]
    lines += [f"{topic} {partition} {offset}" for (topic, partition), offset in sorted(offsets.items())]
    return "\n".join(lines) + "\n"


def write_offset_checkpoint(path: Path, offsets: Mapping[TopicPartition, int]) -> None:
    write_atomically(path, format_offset_checkpoint(offsets))


def read_leader_epochs(path: Path) -> list[tuple[int, int]]:
    """(epoch, start offset) entries of a leader-epoch checkpoint."""
    try:
        return [(int(epoch), int(start)) for epoch, start in _read_frame(path, 2)]
    except ValueError:
        raise CheckpointError(f"{path}: malformed leader epoch entry") from None


def write_leader_epochs(path: Path, entries: list[tuple[int, int]]) -> None:
    lines = [str(CURRENT_VERSION), str(len(entries))] + [f"{epoch} {start}" for epoch, start in entries]
    write_atomically(path, "\n".join(lines) + "\n")


def read_broker_epoch(path: Path) -> int | None:
    """The broker epoch in a clean-shutdown file, as Kafka's CleanShutdownFileHandler.read finds
    it: a JSON object's integer `brokerEpoch` (its `version` and other fields are not looked at).
    None for anything else: no file, an empty one (Kafka before 3.7), bytes that are not that
    JSON, a link or a FIFO there (never followed or waited on). Kafka reads those as no epoch."""
    try:
        text = _read_text(path)
        document = json.loads(text) if text else None
    except (CheckpointError, ValueError):
        return None
    epoch = document.get("brokerEpoch") if isinstance(document, dict) else None
    return epoch if isinstance(epoch, int) and not isinstance(epoch, bool) else None


def format_clean_shutdown(broker_epoch: int | None) -> str:
    """A clean-shutdown file's text: Kafka 3.7's JSON (the field order Kafka writes, no newline)
    for a known broker epoch; an empty file, which Kafka of every version reads as a clean stop
    with no epoch, for none."""
    if broker_epoch is None:
        return ""
    return json.dumps({"version": CURRENT_VERSION, "brokerEpoch": broker_epoch}, separators=(",", ":"))


def write_partition_metadata(path: Path, topic_id: str) -> None:
    write_atomically(path, f"version: 0\ntopic_id: {topic_id}\n")


def read_partition_metadata(path: Path) -> str | None:
    """The topic id of a `partition.metadata` file, or None when absent; CheckpointError naming
    the file when it cannot be read (not a regular file, not UTF-8 text)."""
    text = _read_text(path)
    if text is None:
        return None
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "topic_id":
            return value.strip()
    return None
