"""The mount's tree model without a mount: nodes, names, attributes, handles and refusals, as
the FUSE adapter sees them (fs.tree; no pyfuse3, no trio)."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from seglogfs.engine import DataDir
from seglogfs.engine.errors import ConfigError, CorruptRecordError, InvalidRecordError, RecordTooLargeError
from seglogfs.engine.text.console_formats import LineFormat
from seglogfs.fs.node import Handle, Node, Refused
from seglogfs.fs.permissions import Caller
from seglogfs.fs.tree import MountOptions, Tree
from seglogfs.fs.view_file import ViewFile
from tests.conftest import NOW_MS, broker_config


@pytest.fixture
def data_dir(log_dir: Path) -> Iterator[DataDir]:
    opened = DataDir.open(broker_config(log_dir, num_partitions=2), now_ms=NOW_MS)
    opened.create_topic("t", 1, now_ms=NOW_MS)
    opened.partition("t", 0).append_records([b"one", b"two", b"three"], now_ms=NOW_MS)
    yield opened
    opened.close()


def tree_of(data_dir: DataDir, **options: object) -> Tree:
    return Tree(data_dir, MountOptions(**options), clock=lambda: NOW_MS)  # type: ignore[arg-type]


def walk(tree: Tree, path: str) -> Node:
    node: Node = tree.root
    for name in filter(None, path.split("/")):
        node = tree.lookup(node, name)
    return node


def read_all(handle: Handle) -> bytes:
    return bytes(handle.read(0, 1 << 20))


def refused(errno_value: int, action: object) -> str:
    with pytest.raises(Refused) as raised:
        action()  # type: ignore[operator]
    assert raised.value.errno == errno_value
    return str(raised.value)


def test_names_and_kinds(data_dir: DataDir) -> None:
    tree = tree_of(data_dir)
    assert [name for name, _ in tree.root.children()] == [".logdir", "t"]
    assert [name for name, _ in walk(tree, "t").children()] == ["append", "append.jsonl", "config", "0"]
    assert [name for name, _ in walk(tree, "t/0").children()] == [
        "append",
        "append.jsonl",
        "append.batches",
        "records",
        "records.jsonl",
        "by-offset",
        "by-time",
        "read_committed",
        "read_uncommitted",
        "status",
    ]
    assert [name for name, _ in walk(tree, "t/0/by-offset").children()] == ["0", "0.jsonl"]
    assert walk(tree, "t/0").attributes().is_dir
    records = walk(tree, "t/0/records")
    assert isinstance(records, ViewFile) and records.path == "t/0/records"
    assert walk(tree, "t/0/records") is records  # one node, one inode, per name
    assert stat.S_IMODE(records.attributes().mode) == 0o444


def test_views_read_what_the_partition_holds(data_dir: DataDir) -> None:
    tree = tree_of(data_dir)
    records = walk(tree, "t/0/records")
    assert records.attributes().size == len(b"one\ntwo\nthree\n")
    assert read_all(records.open(os.O_RDONLY)) == b"one\ntwo\nthree\n"
    assert read_all(walk(tree, "t/0/by-offset/1").open(os.O_RDONLY)) == b"two\nthree\n"
    assert read_all(walk(tree, "t/0/by-time/0").open(os.O_RDONLY)) == b"one\ntwo\nthree\n"
    jsonl = read_all(walk(tree, "t/0/by-offset/2.jsonl").open(os.O_RDONLY))
    assert jsonl.startswith(b'{"topic":"t","partition":0,"offset":2,')


@pytest.mark.parametrize(
    ("path", "number", "said"),
    [
        ("t/0/by-offset/abc", errno.ENOENT, "t/0/by-offset/abc: not an offset"),
        ("t/0/by-offset/²", errno.ENOENT, "not an offset"),  # a digit to str.isdigit, not an offset
        ("t/0/by-offset/-1", errno.ENOENT, "not an offset"),
        ("t/0/by-offset/4", errno.ENOENT, "outside the log (0..3)"),
        ("t/0/by-time/soon", errno.ENOENT, "t/0/by-time/soon: timestamp 'soon'"),
        ("t/0/by-time/99999999999999999999", errno.ENOENT, "out of range"),  # past int64: was EIO
        ("t/0/by-time/²", errno.ENOENT, "neither epoch milliseconds nor ISO-8601"),  # was EIO
        ("t/7", errno.ENOENT, "lookup t/7"),
        ("t/²", errno.ENOENT, "lookup t/²"),
        ("nope", errno.ENOENT, "lookup nope"),
        ("t/0/status/x", errno.ENOTDIR, "list t/0/status"),
    ],
)
def test_lookups_refused(data_dir: DataDir, path: str, number: int, said: str) -> None:
    assert said in refused(number, lambda: walk(tree_of(data_dir), path))


def test_files_refuse_what_they_do_not_do(data_dir: DataDir) -> None:
    tree = tree_of(data_dir)
    assert "read t/0/append: append files are write-only" in refused(
        errno.EACCES, lambda: walk(tree, "t/0/append").open(os.O_RDONLY)
    )
    for path in ("t/0/records", "t/0/status", "t/0/by-offset/0"):
        node = walk(tree, path)
        assert f"write {path}: read-only file" in refused(errno.EACCES, lambda: node.open(os.O_WRONLY))  # noqa: B023
    assert "truncate t/0/records" in refused(errno.EPERM, lambda: walk(tree, "t/0/records").truncate(0))
    assert "truncate t/0/append" in refused(errno.EINVAL, lambda: walk(tree, "t/0/append").truncate(5))
    walk(tree, "t/0/append").truncate(0)  # `>` truncates first: fine, the file is always empty
    assert "mkdir t/new: topics only at the top" in refused(errno.EPERM, lambda: walk(tree, "t").mkdir("new"))
    assert "open t: Is a directory" in refused(errno.EISDIR, lambda: walk(tree, "t").open(os.O_RDONLY))


def test_read_only_tree(data_dir: DataDir) -> None:
    tree = tree_of(data_dir, read_only=True)
    refused(errno.EROFS, lambda: walk(tree, "t/0/append").open(os.O_WRONLY))
    refused(errno.EROFS, lambda: walk(tree, "t/config").open(os.O_WRONLY))
    refused(errno.EROFS, lambda: tree.root.mkdir("u"))
    assert stat.S_IMODE(walk(tree, "t").attributes().mode) == 0o555


def test_append_lines_partial_lines_and_growth(data_dir: DataDir) -> None:
    tree = tree_of(data_dir)
    records = walk(tree, "t/0/records")
    handle = walk(tree, "t/0/append").open(os.O_WRONLY)
    assert not handle.seekable
    changes = handle.write(0, b"four\nfi")
    assert changes.inodes == [records.inode]  # the kernel is told the view grew
    assert data_dir.partition("t", 0).log_end_offset == 4
    handle.write(0, b"ve")
    assert data_dir.partition("t", 0).log_end_offset == 4  # the partial line waits
    handle.flush()
    assert read_all(records.open(os.O_RDONLY)).endswith(b"four\nfive\n")


def test_a_quick_append_on_the_loop_appends_at_the_time_it_was_judged_at(data_dir: DataDir, monkeypatch) -> None:
    """`echo x >> append` is appended on the event loop when it is only a page-cache write. The
    clock is read once: read again for the append, a second later it made `flush.ms` (1 s) due,
    and the loop fsynced."""
    log = data_dir.partition("t", 0)
    log.flush()
    log.maybe_flush(NOW_MS)  # the last flush now, nothing unflushed
    clock = [NOW_MS + 999]
    tree = Tree(data_dir, MountOptions(), clock=lambda: clock[0])
    handle = walk(tree, "t/0/append").open(os.O_WRONLY)
    judge = log.quick_append

    @contextlib.contextmanager
    def judged_then_a_millisecond_passes(*args: int) -> Iterator[bool]:
        with judge(*args) as quick:
            clock[0] += 1
            yield quick

    monkeypatch.setattr(log, "quick_append", judged_then_a_millisecond_passes)
    fsyncs: list[int] = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (fsyncs.append(fd), real_fsync(fd))[1])
    assert handle.write_now(0, b"hello\n") is not None  # served on the loop
    assert fsyncs == []
    assert [r.value for r in log.records(3)] == [b"hello"]


def test_a_bad_line_fails_its_whole_write(data_dir: DataDir) -> None:
    tree = tree_of(data_dir)
    handle = walk(tree, "t/0/append.jsonl").open(os.O_WRONLY)
    handle.write(0, b'{"value":"pending')
    with pytest.raises(InvalidRecordError, match=r"t/0/append\.jsonl line 2"):
        handle.write(0, b'"}\nnot json\n')
    assert data_dir.partition("t", 0).log_end_offset == 3  # nothing of the write stored
    handle.write(0, b'"}\n')  # the partial line from before is still there
    assert [r.value for r in data_dir.partition("t", 0).records(3)] == [b"pending"]


def test_a_partial_line_is_capped_at_max_message_bytes(log_dir: Path) -> None:
    # 300 MiB without a newline used to be buffered whole (and copied on every write).
    with DataDir.open(broker_config(log_dir, message_max_bytes=1000), now_ms=NOW_MS) as data_dir:
        data_dir.create_topic("t", 1, now_ms=NOW_MS)
        handle = walk(tree_of(data_dir), "t/0/append").open(os.O_WRONLY)
        handle.write(0, b"x" * 600)
        with pytest.raises(RecordTooLargeError, match="more than 1000 bytes without a newline"):
            handle.write(0, b"x" * 600)
        # Nothing of the refused line is stored: not the 600 bytes before, nor its rest.
        with pytest.raises(RecordTooLargeError, match="the rest of a line"):
            handle.write(0, b"x" * 10)
        handle.write(0, b"xx\nnext\n")
        assert [r.value for r in data_dir.partition("t", 0).records(0)] == [b"next"]


def test_a_write_to_a_topic_is_stored_in_every_partition_or_none(log_dir: Path, monkeypatch) -> None:
    """A write whose lines go to several partitions: a record one of them refuses, or a full disk
    at the append to the second, leaves nothing stored in any (a write appears whole or fails
    whole); the same write again, once it can be, is stored whole."""
    from seglogfs.engine.partitioner import partition_for_key

    with DataDir.open(broker_config(log_dir, message_max_bytes=1000), now_ms=NOW_MS) as data_dir:
        data_dir.create_topic("k", 3, now_ms=NOW_MS)
        keys = {partition_for_key(key, 3): key for key in (b"a", b"b", b"c", b"d", b"e", b"f")}
        first, second = sorted(keys)[:2]
        logs = [data_dir.partition("k", p) for p in range(3)]
        handle = walk(tree_of(data_dir, line_format=LineFormat(parse_key=True)), "k/append").open(os.O_WRONLY)

        with pytest.raises(RecordTooLargeError):
            handle.write(0, keys[first] + b"\tsmall\n" + keys[second] + b"\t" + b"x" * 2000 + b"\n")
        assert [log.log_end_offset for log in logs] == [0, 0, 0]

        def full(data: bytes, now_ms: int) -> None:
            raise OSError(errno.ENOSPC, "No space left on device")

        write = keys[first] + b"\tone\n" + keys[second] + b"\ttwo\n"
        monkeypatch.setattr(logs[second], "append_encoded", full)
        with pytest.raises(OSError, match="No space"):
            handle.write(0, write)
        assert [log.log_end_offset for log in logs] == [0, 0, 0]
        monkeypatch.undo()
        handle.write(0, write)
        assert [r.value for r in logs[first].records(0)] == [b"one"]
        assert [r.value for r in logs[second].records(0)] == [b"two"]


def test_topic_append_places_keys_like_kafka(data_dir: DataDir) -> None:
    data_dir.create_topic("k", 3, now_ms=NOW_MS)
    tree = tree_of(data_dir, line_format=LineFormat(parse_key=True))
    append = walk(tree, "k/append")
    append.open(os.O_WRONLY).write(0, b"a\t1\nb\t2\nc\t3\n")
    homes = {r.key: p for p in range(3) for r in data_dir.partition("k", p).records(0)}
    from seglogfs.engine.partitioner import partition_for_key

    assert homes == {key: partition_for_key(key, 3) for key in (b"a", b"b", b"c")}


def test_config_file_table(data_dir: DataDir) -> None:
    """The model's side of the shell idioms (the mount test runs them with a real shell)."""
    tree = tree_of(data_dir)
    config = walk(tree, "t/config")

    def content() -> bytes:
        return read_all(config.open(os.O_RDONLY))

    handle = config.open(os.O_WRONLY | os.O_TRUNC)  # printf 'retention.ms=1\n' > config
    handle.flush()  # the shell closes the first descriptor before writing: nothing applied
    handle.write(0, b"retention.ms=1\n")
    handle.flush()
    handle.release()
    assert content() == b"retention.ms=1\n"
    assert config.attributes().size == len(b"retention.ms=1\n")

    handle = config.open(os.O_WRONLY | os.O_TRUNC)  # printf 'bogus=1\n' > config
    handle.flush()
    with pytest.raises(ConfigError, match="t/config: unknown topic config 'bogus'"):
        handle.write(0, b"bogus=1\n")
    handle.flush()
    handle.release()
    assert content() == b"retention.ms=1\n"

    for flags in (os.O_WRONLY, os.O_RDWR, os.O_WRONLY | os.O_APPEND):  # touch, exec 3<>, >> without output
        handle = config.open(flags)
        handle.flush()
        handle.release()
        assert content() == b"retention.ms=1\n", flags
    handle = config.open(os.O_RDWR)
    assert handle.read(0, 100) == b"retention.ms=1\n"  # reading through O_RDWR

    handle = config.open(os.O_WRONLY | os.O_APPEND)  # >>
    handle.write(len(b"retention.ms=1\n"), b"segment.ms=5000")  # the last line without newline
    handle.flush()
    handle.release()
    assert content() == b"retention.ms=1\nsegment.ms=5000\n"

    handle = config.open(os.O_WRONLY | os.O_APPEND)  # written, then fsync'd: applied and stored before the close
    handle.write(len(content()), b"segment.bytes=4096\n")
    handle.fsync()
    assert content() == b"retention.ms=1\nsegment.bytes=4096\nsegment.ms=5000\n"
    handle.release()

    handle = config.open(os.O_WRONLY | os.O_TRUNC)  # : > config
    handle.flush()
    assert content() == b"retention.ms=1\nsegment.bytes=4096\nsegment.ms=5000\n"
    handle.release()
    assert content() == b""


def test_forgotten_nodes(data_dir: DataDir) -> None:
    tree = tree_of(data_dir)
    view = walk(tree, "t/0/by-offset/1")
    records = walk(tree, "t/0/records")
    again = walk(tree, "t/0/by-offset/1")  # a second lookup, before the kernel forgets the first
    assert again is view
    tree.forget(view.inode, 1)
    assert tree.get(view.inode) is view  # the kernel still holds one lookup of it
    tree.forget(view.inode, 1)
    tree.forget(records.inode, 1)
    assert tree.get(view.inode) is None  # by-offset views are made again when looked up
    assert tree.get(records.inode) is records  # fixed entries keep their inode
    assert walk(tree, "t/0/by-offset/1").inode != view.inode


def test_records_after_retention_is_a_new_file(data_dir: DataDir) -> None:
    tree = tree_of(data_dir)
    log = data_dir.partition("t", 0)
    records = walk(tree, "t/0/records")
    held = records.open(os.O_RDONLY)
    log.roll(NOW_MS)
    log.append_records([b"four"], now_ms=NOW_MS)
    assert records.attributes().size == len(b"one\ntwo\nthree\nfour\n")  # a follower saw it grow
    log.delete_records(3, NOW_MS)
    log.delete_old_segments(NOW_MS)
    partition = walk(tree, "t/0")
    assert tree.after_background_work().entries == [(partition.inode, "records")]
    fresh = walk(tree, "t/0/records")
    assert fresh.inode != records.inode
    assert read_all(fresh.open(os.O_RDONLY)) == b"four\n"
    # The holder's file keeps its size and positions: a follower reads on where it was.
    assert records.attributes().size == len(b"one\ntwo\nthree\nfour\n")
    assert held.read(len(b"one\ntwo\nthree\n"), 100) == b"four\n"


@pytest.mark.expect_warnings("t-0 is offline")
def test_an_offline_partition_answers_eio_and_its_status_says_why(data_dir: DataDir) -> None:
    data_dir.create_topic("u", 1, now_ms=NOW_MS)
    tree = tree_of(data_dir)
    walk(tree, "t/0/records").attributes()  # looked up before: its view is there
    data_dir.partition("t", 0).take_offline("flush failed: [Errno 5] Input/output error")
    said = refused(errno.EIO, lambda: walk(tree, "t/0/records").open(os.O_RDONLY))
    assert "open t/0/records: the partition is offline (flush failed: [Errno 5]" in said
    refused(errno.EIO, lambda: walk(tree, "t/0/append").open(os.O_WRONLY))
    status = json.loads(read_all(walk(tree, "t/0/status").open(os.O_RDONLY)))
    assert status["offline"] == "flush failed: [Errno 5] Input/output error"
    walk(tree, "u/0/append").open(os.O_WRONLY).write(0, b"fine\n")  # the rest serves
    assert read_all(walk(tree, "u/0/records").open(os.O_RDONLY)) == b"fine\n"


@pytest.mark.expect_warnings("its views answer EIO there")
def test_a_damaged_batch_reads_as_eio_and_the_status_says_where(data_dir: DataDir) -> None:
    """A batch damaged under the views (its CRC no longer holds): the views read as EIO where
    it is (the records after it are served), and the partition's `status` names the file and
    position under `views`."""
    log = data_dir.partition("t", 0)
    log.roll(NOW_MS)
    log.append_records([b"four"], now_ms=NOW_MS)
    tree = tree_of(data_dir)
    damaged = log.segments[0].log_path
    content = damaged.read_bytes()
    damaged.write_bytes(content[:-1] + bytes([content[-1] ^ 0x01]))  # the last byte of its only batch
    records = walk(tree, "t/0/records")
    assert records.attributes().size == 1 + len(b"four\n")
    with pytest.raises(CorruptRecordError, match="corrupt record batch at position 0: CRC-32C mismatch"):
        records.open(os.O_RDONLY).read(0, 100)  # (the mount's EIO, with this in its log)
    assert read_all(walk(tree, "t/0/by-offset/3").open(os.O_RDONLY)) == b"four\n"
    status = json.loads(read_all(walk(tree, "t/0/status").open(os.O_RDONLY)))
    assert "CRC-32C mismatch" in status["views"]["text"]["error"] and str(damaged) in status["views"]["text"]["error"]


def test_a_write_tells_of_records_and_open_views_only(data_dir: DataDir) -> None:
    """Any number of by-offset views may be looked up (`ls by-offset`, a script's stats): a write
    must not tell the kernel of each (write latency grew with them); they are watched while
    open, and looked up but closed their size times out within a second."""
    tree = tree_of(data_dir)
    records = walk(tree, "t/0/records")
    looked_up = [walk(tree, f"t/0/by-offset/{n}") for n in range(3)]
    assert all(view.attributes().valid_s == 1.0 for view in looked_up)
    assert records.attributes().valid_s is None  # told of every growth
    held = looked_up[1].open(os.O_RDONLY)
    append = walk(tree, "t/0/append").open(os.O_WRONLY)
    assert sorted(append.write(0, b"x\n").inodes) == sorted([records.inode, looked_up[1].inode])
    held.release()
    assert append.write(0, b"y\n").inodes == [records.inode]


def test_a_deleted_topics_nodes_are_superseded_and_its_held_views_keep_what_they_hold(data_dir: DataDir) -> None:
    """rmdir of a topic (Tree.delete_topic): the topic is gone from the data dir and the tree;
    an open view still reads and stats what it held, an open append handle is refused (ENOENT),
    and the name made again is new nodes. Refused: an unknown topic (ENOENT), a caller who may
    not write the partition's files (EACCES), a read-only tree (EROFS)."""
    tree = tree_of(data_dir)
    root = Caller(0, 0)
    records = walk(tree, "t/0/records")
    assert isinstance(records, ViewFile)
    view = records.open(os.O_RDONLY)
    append = walk(tree, "t/0/append").open(os.O_WRONLY)
    segment = data_dir.partition("t", 0).active_segment.log_path
    os.chown(segment, 5, 6)
    segment.chmod(0o644)
    said = refused(errno.EACCES, lambda: tree.root.rmdir("t", Caller(7, 6, frozenset({8}))))
    assert said == "rmdir t: the caller may not write the files of partition 0: Permission denied"
    segment.chmod(0o664)
    refused(errno.EACCES, lambda: tree.root.rmdir("t", Caller(7, 8)))  # (not of the group)
    tree.root.rmdir("t", Caller(7, 8, frozenset({6})))  # (a supplementary group may)
    assert "t" not in data_dir.topics() and not any(data_dir.config.log_dirs[0].glob("t-*"))
    refused(errno.ENOENT, lambda: tree.root.rmdir("t", root))
    refused(errno.ENOENT, lambda: tree.lookup(tree.root, "t"))
    assert read_all(view) == b"one\ntwo\nthree\n" and records.attributes().size == len(b"one\ntwo\nthree\n")
    assert "topic t was deleted" in refused(errno.ENOENT, lambda: append.write(0, b"four\n"))
    tree.root.mkdir("t")
    again = walk(tree, "t/0/records")
    assert again.inode != records.inode and read_all(again.open(os.O_RDONLY)) == b""
    view.release()
    assert "rmdir t" in refused(errno.EROFS, lambda: tree_of(data_dir, read_only=True).root.rmdir("t", root))
