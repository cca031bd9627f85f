"""A partition's leader epochs: Kafka's LeaderEpochFileCache over its `leader-epoch-checkpoint`.

The checkpoint (engine.log.checkpoint) lists `epoch start_offset` entries, epochs and start offsets
both rising: the first offset written in each leader epoch. A broker answers its followers'
OffsetsForLeaderEpoch requests from it, and stamps each batch it appends as leader with its
current epoch (the batch header's `partitionLeaderEpoch`).

seglogfs appends as the partition's leader in the epoch of the newest entry the checkpoint had
(the epoch the broker last led or followed in), so that a broker reading the dir finds appended
batches in an epoch its cache knows. A partition with no entries (no checkpoint, an empty one as
a broker creates before it leads, or one that cannot be read) appends in epoch 0, as seglogfs
always did, and gets the entry `0 <first offset appended>` at its first append, as a Kafka leader
assigns its epoch's start offset when it first appends in it. The entries follow the log as
Kafka's do: a truncation removes those at or past the new log end; a log start offset moved up
(retention, delete-records) drops the entries wholly below it and moves the last of them to it;
a log cut below its first segment starts with none. The current epoch never goes down with them.

Writes: only when the entries come to differ from the file's, atomically
(engine.log.checkpoint.write_atomically: never through a link). Kafka writes an entry before the
batch that needs it, and so does `assign`: a crash between the two leaves an entry at the log
end, which does no harm (the next open drops it in memory, as Kafka's loader does, and from the
file at the next change; or the next append in the epoch starts there).

Not thread-safe: its partition's lock guards it; it is read from the disk at the first use.
"""

from __future__ import annotations

import logging
from pathlib import Path

from seglogfs.engine.log.checkpoint import (
    LEADER_EPOCH_CHECKPOINT,
    CheckpointError,
    read_leader_epochs,
    write_leader_epochs,
)

logger = logging.getLogger(__name__)

DEFAULT_LEADER_EPOCH = 0  # a partition whose checkpoint names none (seglogfs's single replica)


class LeaderEpochCache:
    """The (epoch, start offset) entries of one partition and its current leader epoch."""

    def __init__(self, path: Path, entries: list[tuple[int, int]]) -> None:
        self.path = path
        self._entries = entries
        self._on_disk = list(entries)  # what the file holds: a change back to it writes nothing
        # The epoch appends are stamped with: the newest entry's when read, or a later assign's.
        self.leader_epoch = entries[-1][0] if entries else DEFAULT_LEADER_EPOCH

    @classmethod
    def load(cls, directory: Path, *, log_start_offset: int, log_end_offset: int) -> LeaderEpochCache:
        """The partition's checkpoint, its entries brought in line with the log as Kafka's
        LogLoader does (none at or past the log end, the first moved up to the log start), in
        memory only. A checkpoint that cannot be read counts as none, with a WARNING: the next
        change replaces it."""
        path = directory / LEADER_EPOCH_CHECKPOINT
        try:
            entries = read_leader_epochs(path)
        except CheckpointError as error:
            logger.warning(
                "%s; appends are in leader epoch %d and the file is written anew", error, DEFAULT_LEADER_EPOCH
            )
            entries = []
        cache = cls(path, entries)  # (one that cannot be read: no entries on disk, replaced at the first change)
        cache._truncate_from_end(log_end_offset)
        cache._truncate_from_start(log_start_offset)
        return cache

    @property
    def entries(self) -> list[tuple[int, int]]:
        return list(self._entries)

    def assign(self, epoch: int, start_offset: int) -> None:
        """Record that `epoch` starts at `start_offset` (an append's first offset), unless the
        newest entry is already `epoch` from at or below it (Kafka's isUpdateNeeded); entries it
        contradicts (a later or equal epoch, a start at or past it) go first."""
        entries = self._entries
        if entries and entries[-1][0] == epoch and start_offset >= entries[-1][1]:
            return
        while entries and (entries[-1][0] >= epoch or entries[-1][1] >= start_offset):
            entries.pop()
        entries.append((epoch, start_offset))
        self.leader_epoch = max(self.leader_epoch, epoch)
        self._write()

    def truncate_from_end(self, end_offset: int) -> None:
        """The log was cut back to `end_offset`: entries starting at or past it go."""
        self._truncate_from_end(end_offset)
        self._write()  # (what the load dropped in memory only goes now too)

    def truncate_from_start(self, start_offset: int) -> None:
        """The log start moved up to `start_offset`: the entries starting at or below it give way
        to the last of them, moved to start there (Kafka's truncateFromStart)."""
        self._truncate_from_start(start_offset)
        self._write()

    def clear(self) -> None:
        """The log starts anew (cut below its first segment): no entries left."""
        self._entries.clear()
        self._write()

    def _truncate_from_end(self, end_offset: int) -> None:
        entries = self._entries
        while entries and entries[-1][1] >= end_offset:
            entries.pop()

    def _truncate_from_start(self, start_offset: int) -> None:
        below = [entry for entry in self._entries if entry[1] <= start_offset]
        if below:
            self._entries[: len(below)] = [(below[-1][0], start_offset)]

    def _write(self) -> None:
        if self._entries != self._on_disk:
            write_leader_epochs(self.path, self._entries)
            self._on_disk = list(self._entries)
