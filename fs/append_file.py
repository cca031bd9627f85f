"""`append` and `append.jsonl`: write-only files whose lines become records
(kafka-console-producer's rules, engine.producer). A partition's append files write to it; a
topic's place each record by Kafka's default partitioner.

Lines of one `write()` become one record batch per partition and appear whole or fail whole; a
trailing partial line waits for its newline or for the close. The file is always empty.

`append.batches` takes encoded record batches instead of lines (what the Spark writer sends
through a mount), all those of one open appended at its close.
"""

from __future__ import annotations

import errno
import os
import stat
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING

from seglogfs.engine.errors import CorruptRecordError, InvalidRecordError, UnknownTopicOrPartitionError
from seglogfs.engine.partitioner import RoundRobin
from seglogfs.engine.producer import BATCHES_PER_APPEND_BYTES, LineSplitter, Producer
from seglogfs.fs.node import IO_BLOCK_BYTES, Attributes, Changes, Handle, Node, PartitionNode, Refused, log_access
from seglogfs.fs.permissions import Access, shared_access

if TYPE_CHECKING:
    from seglogfs.engine.log.log import PartitionLog
    from seglogfs.fs.tree import Tree


QUICK_WRITE_BYTES = 4096  # a write at most this long may be appended on the loop (AppendHandle.write_now)


class WriteOnlyFile(Node):
    """What the append files share: write-only (writable by whoever may write the partitions'
    files, fs.permissions; no mode bits on a read-only mount), always empty (`>` truncates to
    0: nothing to do), opened on the loop (dictionary look-ups, no disk)."""

    def attributes(self) -> Attributes:
        return self.shown(
            stat.S_IFREG, self.access().writing(), mtime_ns=self.tree.mounted_ns, block_bytes=IO_BLOCK_BYTES
        )

    def access(self) -> Access:
        """Who may write where the file appends."""
        raise NotImplementedError

    def refuse_reads_and_read_only(self, flags: int) -> None:
        """EACCES for an open that reads, EROFS on a read-only mount."""
        if flags & os.O_ACCMODE == os.O_RDONLY:
            raise Refused(errno.EACCES, f"read {self.path}: append files are write-only")
        if self.tree.read_only:
            raise Refused(errno.EROFS, f"write {self.path}")

    def open_now(self, flags: int) -> Handle | None:
        return self.open(flags)

    def truncate(self, size: int) -> None:
        if size != 0:
            super().truncate(size)


class AppendFile(WriteOnlyFile):
    """`<topic>/append[.jsonl]` (partition None) or `<topic>/<p>/append[.jsonl]`."""

    def __init__(
        self,
        tree: Tree,
        inode: int,
        key: tuple[object, ...],
        path: str,
        *,
        topic: str,
        partition: int | None,
        jsonl: bool,
    ) -> None:
        super().__init__(tree, inode, key, path)
        self.topic = topic
        self.partition = partition
        self.jsonl = jsonl
        self.round_robin = RoundRobin()  # unkeyed records: each write to the next partition

    def access(self) -> Access:
        """A partition's append files: its files'; a topic's: what all its partitions' share
        (it writes to any of them)."""
        data_dir = self.tree.data_dir
        if self.partition is not None:
            return log_access(data_dir.partition(self.topic, self.partition))
        partitions = data_dir.topics().get(self.topic, [])
        return shared_access([log_access(data_dir.partition(self.topic, p)) for p in partitions])

    def open(self, flags: int) -> Handle:
        self.refuse_reads_and_read_only(flags)
        data_dir = self.tree.data_dir
        if self.partition is not None:
            logs = [data_dir.partition(self.topic, self.partition)]
            if logs[0].offline_reason is not None:
                raise Refused(errno.EIO, f"write {self.path}: the partition is offline ({logs[0].offline_reason})")
        else:
            logs = [data_dir.partition(self.topic, p) for p in data_dir.topics().get(self.topic, [])]
        line_format = None if self.jsonl else self.tree.options.line_format
        return AppendHandle(self, Producer(logs, line_format, self.round_robin))


def refuse_deleted(node: Node, logs: Sequence[PartitionLog]) -> None:
    """ENOENT for a write through a descriptor opened before its topic was deleted (rmdir:
    Tree.delete_topic), as Kafka answers a producer of a deleted topic: the partitions it holds
    are closed and gone. (A write that races the deletion fails on the closed log, EIO.)"""
    for log in logs:
        try:
            current = node.tree.data_dir.partition(log.topic, log.partition)
        except UnknownTopicOrPartitionError:
            current = None
        if current is not log:
            raise Refused(errno.ENOENT, f"write {node.path}: topic {log.topic} was deleted")


class _PendingHandle(Handle):
    """What the append files' handles share: what is written waits in the handle (a partial
    line, or a close's batches) until `flush` appends it, at the close at the latest; `fsync`
    flushes, then makes the partitions durable. Thread-safe: processes sharing a descriptor write
    through one handle, under its lock."""

    seekable = False
    writable = True

    def __init__(self, node: Node) -> None:
        super().__init__(node)
        self._lock = threading.Lock()

    def _nothing_waits(self) -> bool:
        """Whether a flush has nothing to do. Holds: the handle's lock."""
        raise NotImplementedError

    def _logs(self) -> Sequence[PartitionLog]:
        raise NotImplementedError

    def flush_now(self) -> Changes | None:
        """Done on the loop when nothing waits (`echo x >> append`); not while a write holds
        the handle (the loop does not wait for it)."""
        if not self._lock.acquire(blocking=False):
            return None
        try:
            return Changes() if self._nothing_waits() else None
        finally:
            self._lock.release()

    def release_now(self) -> Changes | None:
        return Changes()  # the last flush did the work

    def fsync(self) -> Changes:
        changes = self.flush()
        for log in self._logs():
            log.flush()
        return changes


class AppendHandle(_PendingHandle):
    """An append file open for writing: its partial line and producer are kept under the
    handle's lock (`cmd >> append` in a script's subshells shares one); appends to a partition
    are serialised by the partition's."""

    def __init__(self, node: AppendFile, producer: Producer) -> None:
        super().__init__(node)
        self.producer = producer
        max_line_bytes = max(log.config.max_message_bytes for log in producer.logs)
        self.lines = LineSplitter(max_line_bytes, node.path)
        self.jsonl = node.jsonl

    def write(self, position: int, data: bytes) -> Changes:
        with self._lock:
            now_ms = self.node.tree.clock()
            return self.lines.feed(data, lambda lines: self._send(lines, now_ms))

    def write_now(self, position: int, data: bytes) -> Changes | None:
        """A small write of plain lines (`echo x >> append`) on the loop, when every partition
        it may go to takes it as a write to the page cache now (Producer.try_send_now): a worker
        thread's round trip costs several times the append. Not for JSON Lines, whose records
        carry their own timestamps (which may roll)."""
        if self.jsonl or len(data) > QUICK_WRITE_BYTES or not self._lock.acquire(blocking=False):
            return None
        try:
            # (appended at the time the quick append was judged at: a later one could make a
            # flush or a roll due, on the loop)
            now_ms = self.node.tree.clock()
            return self.producer.try_send_now(self.lines, data, now_ms, lambda lines: self._send(lines, now_ms))
        finally:
            self._lock.release()

    def flush(self) -> Changes:
        # A trailing partial line is a record once the file is closed.
        with self._lock:
            return self._send(self.lines.finish(), self.node.tree.clock())

    def _nothing_waits(self) -> bool:
        return not self.lines.pending_bytes

    def _logs(self) -> Sequence[PartitionLog]:
        return self.producer.logs

    def _send(self, lines: list[bytes], now_ms: int) -> Changes:
        if not lines:
            return Changes()
        refuse_deleted(self.node, self.producer.logs)
        produced = self.producer.send(lines, now_ms, self.node.path)
        return self.node.tree.grown(produced.logs)


# -- append.batches ---------------------------------------------------------------------------------------
BATCHES_PER_OPEN_BYTES = BATCHES_PER_APPEND_BYTES  # what one open of append.batches may take before its close


class BatchesFile(WriteOnlyFile, PartitionNode):
    """`<topic>/<p>/append.batches`: Kafka v2 record batches as a producer sends them (a Produce
    request's record set), appended with offsets assigned from the log end as a broker does.

    The batches written through one open are appended together when it is closed (or fsync'd):
    all of them, or — when any is incomplete, fails its CRC or breaks a limit
    (`max.message.bytes`, a compacted topic's keys) — none; the close (or fsync) fails then. One
    open takes at most 64 MiB."""

    def access(self) -> Access:
        return self.partition_access()

    def open(self, flags: int) -> Handle:
        self.refuse_reads_and_read_only(flags)
        self.check_online("write")
        return BatchesHandle(self, self.log)


class BatchesHandle(_PendingHandle):
    """An open `append.batches`: what is written waits in memory for the close."""

    def __init__(self, node: BatchesFile, log: PartitionLog) -> None:
        super().__init__(node)
        self.log = log
        self._pending = bytearray()
        self._too_much = False  # over the limit: every later write and close fail, nothing is appended

    def _refuse_too_much(self) -> Refused:
        return Refused(
            errno.EFBIG,
            f"write {self.node.path}: over {BATCHES_PER_OPEN_BYTES >> 20} MiB of batches in one open "
            "(nothing of this open is appended: close it and write less per open)",
        )

    def write(self, position: int, data: bytes) -> Changes:
        with self._lock:
            if self._too_much or len(self._pending) + len(data) > BATCHES_PER_OPEN_BYTES:
                self._too_much = True
                self._pending.clear()
                raise self._refuse_too_much()
            self._pending += data
        return Changes()

    def flush(self) -> Changes:
        with self._lock:
            if self._too_much:
                raise self._refuse_too_much()
            if not self._pending:
                return Changes()
            data = bytes(self._pending)
            self._pending.clear()
        refuse_deleted(self.node, [self.log])
        try:
            self.log.append_batches(data, assign_offsets=True, now_ms=self.node.tree.clock())
        except CorruptRecordError as error:  # what was written, not what is stored
            raise InvalidRecordError(str(error)) from None  # (the log line names the file)
        return self.node.tree.grown([self.log])

    def _nothing_waits(self) -> bool:
        return not self._pending and not self._too_much

    def _logs(self) -> Sequence[PartitionLog]:
        return [self.log]
