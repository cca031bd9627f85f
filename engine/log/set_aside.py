"""What recovery and `check --repair` remove from a log, kept beside the log dir.

Kafka's LogLoader, finding a batch it cannot trust after an unclean stop, truncates the log to the
last valid offset and deletes every segment after it. seglogfs leaves the live log exactly as
Kafka would, but moves what it removes — a segment's damaged or torn tail, the segments after it —
to a place next to the log dir, never inside it (a broker refuses a directory it does not know in
a log dir), byte for byte, until an operator has looked at it and removes it (`rm -r`):

    <log dir's real path>.seglogfs-set-aside/
        20261127T214500.123Z/                 one run: an open that recovered, or a repair (UTC)
            <topic>-<partition>/
                set-aside.json                what is here and where it came from (below)
                00000000000000000080.log      a tail: the bytes of 00000000000000000060.log from
                                              the cut on, named by the offset the live log now
                                              ends at (a segment that would start there), so
                                              that `seglogfs dump` reads it
                00000000000000000100.log      a segment removed whole, with its index files
                00000000000000000100.index …

A tail whose name a segment removed whole takes as well (a tail holding no batch: only garbage
after a segment's last batch) is kept in `tail/` below the partition's directory.

`set-aside.json`: `{"pieces": [{"source", "position", "startOffset", "file", "bytes", "records",
"firstOffset", "lastOffset", "damagedBytes", "wholeSegment"}]}` — `source` the file's name in the
partition dir, `position` where in it the piece began, `startOffset` the offset the piece would
start at, `file` its name here (relative to the partition's directory), `records` and the first
and last offsets those of the batches in it that pass their CRC check, `damagedBytes` the bytes
in no such batch. It is replaced (written, fsynced, renamed) after each piece, so it lists what
is there even after a crash between two pieces.

Order, so that nothing is lost whatever fails (engine.log.loader): the tail is copied and fsynced
(with its directories) first, the one step that needs room; then the segments after it are
renamed (on another file system: copied, fsynced, unlinked), the last first; only then is the
live segment cut. Any failure (no space, a read-only or unwritable parent, something not a
directory of the data dir's owner where the place belongs) raises `SetAsideError` before the cut:
the repair or recovery stops there, the log is as it was but for segments already moved (which
the error counts), and the segments left still follow the damaged one without a gap, so the next
attempt takes up the work.

Ownership and mode: the place and each run's directories take the log dir's owner, group and
mode; a tail takes its segment's; a moved file keeps its own. What the data dir keeps from some
users, the place keeps from them too; a place found there already must be a directory (not a
link) owned by the data dir's owner or root.

Not thread-safe: one per partition load, which holds the partition.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import stat
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from seglogfs.engine.errors import EngineError
from seglogfs.engine.files import is_directory, open_regular, read_regular, write_all
from seglogfs.engine.log.checkpoint import fsync_dir, write_atomically
from seglogfs.engine.log.naming import INDEX_SUFFIX, LOG_SUFFIX, TIME_INDEX_SUFFIX, TXN_INDEX_SUFFIX
from seglogfs.engine.log.segment import LogSegment
from seglogfs.engine.record.records import check_batch

logger = logging.getLogger(__name__)

PLACE_SUFFIX = ".seglogfs-set-aside"
MANIFEST = "set-aside.json"
_COPY_CHUNK_BYTES = 1 << 20
_MANIFEST_LIMIT_BYTES = 16 << 20


class SetAsideError(EngineError):
    """What recovery or repair had to remove could not be kept: the log was not cut (segments
    after the damage already moved, the last first, are in the place, `done`)."""

    def __init__(self, path: str | os.PathLike[str], what: str, reason: str, done: int = 0) -> None:
        self.path = os.fspath(path)
        outcome = (
            "nothing was cut or removed"
            if not done
            else f"the log was not cut ({done} segments after the damage are set aside already)"
        )
        super().__init__(f"{self.path}: cannot set aside {what}: {reason}; {outcome}")


@dataclass(frozen=True)
class SetAsidePiece:
    """One piece kept: a segment's tail, or a segment removed whole."""

    place: Path  # the partition's directory in its run
    source: str  # the file's name in the partition dir
    position: int  # where in the source the piece began (0: a whole segment)
    start_offset: int  # the offset it would start at: a tail's the live log's end after the cut
    file: str  # its name below `place`
    bytes: int
    records: int  # in the batches that pass their CRC check
    first_offset: int | None
    last_offset: int | None
    damaged_bytes: int  # in no such batch
    whole_segment: bool

    @property
    def path(self) -> Path:
        return self.place / self.file

    def describe(self) -> str:
        """`offsets 80 to 99, 10 records in intact batches (422 bytes, 211 of them damaged): the
        tail from position 0 of 00000000000000000080.log`; a tail without a whole batch: `from
        offset 3, no intact batch (11 bytes, all damaged): the tail from position 77 of …`."""
        what = "segment" if self.whole_segment else f"the tail from position {self.position} of"
        if self.last_offset is None:
            intact = f"from offset {self.start_offset}, no intact batch ({self.bytes} bytes, all damaged)"
            return f"{intact}: {what} {self.source}"
        damaged = f", {self.damaged_bytes} of them damaged" if self.damaged_bytes else ""
        return (
            f"offsets {self.start_offset} to {self.last_offset}, {self.records} records in intact batches "
            f"({self.bytes} bytes{damaged}): {what} {self.source}"
        )

    def to_json(self) -> dict[str, object]:
        return {
            "source": self.source,
            "position": self.position,
            "startOffset": self.start_offset,
            "file": self.file,
            "bytes": self.bytes,
            "records": self.records,
            "firstOffset": self.first_offset,
            "lastOffset": self.last_offset,
            "damagedBytes": self.damaged_bytes,
            "wholeSegment": self.whole_segment,
        }


def place_for(log_dir: Path) -> Path:
    """The set-aside place of a log dir: beside its real path (`/var/lib/kafka` is often a link to
    the disk that holds the data, where a rename of a segment stays a rename)."""
    real = Path(os.path.realpath(log_dir))
    return real.with_name(real.name + PLACE_SUFFIX)


@dataclass(frozen=True)
class BatchCount:
    """What the batches of a byte range hold (`count_batches`)."""

    records: int
    first_offset: int | None
    last_offset: int | None
    valid_bytes: int


def _count_kept(directory: Path, base_offset: int) -> BatchCount:
    """`count_batches` of a segment just set aside (its copy in `directory`), read-only."""
    copy = LogSegment(
        directory, base_offset, index_interval_bytes=4096, max_index_bytes=1 << 20, writable=False, created_ms=0
    )
    try:
        return count_batches(copy, 0)
    finally:
        copy.close_handlers()


def count_batches(segment: LogSegment, position: int, end: int | None = None) -> BatchCount:
    """The records and offsets of the batches of `segment` from `position` (to `end`) that
    pass their CRC check; a batch that fails it is passed over when its length can be trusted,
    and the scan ends at a length that cannot be. A record count is believed only as far as the
    batch's offsets reach."""
    records = valid = 0
    first = last = None
    for header, batch in segment.iter_batches(position, end):
        if check_batch(header, batch) is not None:
            continue
        valid += header.size_in_bytes
        if first is None:
            first = header.base_offset
        last = header.last_offset
        if not header.is_control:
            records += max(0, min(header.records_count, header.last_offset - header.base_offset + 1))
    return BatchCount(records, first, last, valid)


class SetAside:
    """The pieces one load of one partition sets aside. Nothing is made on disk until the first."""

    def __init__(self, partition_dir: Path, now_ms: int) -> None:
        self.partition_dir = partition_dir
        self.log_dir = partition_dir.parent
        self.now_ms = now_ms
        self.pieces: list[SetAsidePiece] = []
        self._place: Path | None = None

    @property
    def place(self) -> Path:
        """The partition's directory in this run (made on first use)."""
        if self._place is None:
            self._place = self._make_place()
        return self._place

    @property
    def root(self) -> Path:
        """The log dir's place (resolved when first needed: most loads set nothing aside)."""
        return place_for(self.log_dir)

    def _make_place(self) -> Path:
        what = f"what recovery removes from {self.partition_dir}"
        root = self.root
        try:
            owner = os.stat(self.log_dir)
            made = _make_dir(root, owner)
            _check_ours(root, owner, what)
            stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime(self.now_ms // 1000)) + f".{self.now_ms % 1000:03d}Z"
            for attempt in range(1000):
                run = root / (stamp if attempt == 0 else f"{stamp}.{attempt}")
                made = _make_dir(run, owner) or made
                _check_ours(run, owner, what)
                place = run / self.partition_dir.name
                try:
                    os.mkdir(place, stat.S_IMODE(owner.st_mode))
                except FileExistsError:
                    continue  # an earlier run in the same millisecond (a clock passed in by a test)
                _own(place, owner)
                fsync_dir(run)
                if made:
                    fsync_dir(root)
                    fsync_dir(root.parent)
                return place
            raise SetAsideError(root, what, "no free name for this run")
        except OSError as error:
            raise SetAsideError(root, what, error.strerror or str(error)) from None

    def keep_tail(self, source: Path, handle: int, position: int, size: int, next_offset: int) -> SetAsidePiece:
        """Copy bytes `position`..`size` of the open segment `source` (descriptor `handle`) into the
        place, durably, before the caller cuts them; `next_offset` names the copy."""
        place = self.place
        name = f"{next_offset:020d}{LOG_SUFFIX}"
        directory = place
        if os.path.lexists(place / name) or (name != source.name and os.path.lexists(self.partition_dir / name)):
            # A segment of that name is removed whole after it (a tail holding no batch, cut
            # from the segment before it): the tail keeps out of its way.
            directory = place / "tail"
        target = directory / name
        try:
            if directory != place:
                _make_dir(directory, os.stat(place))
            mode = stat.S_IMODE(os.fstat(handle).st_mode)
            fd = open_regular(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
            try:
                _own_fd(fd, os.fstat(handle))
                at = position
                while at < size:
                    chunk = os.pread(handle, min(_COPY_CHUNK_BYTES, size - at), at)
                    if not chunk:
                        break  # (the file is shorter than its size said: nothing more to keep)
                    write_all(fd, chunk)
                    at += len(chunk)
                os.fsync(fd)
            finally:
                os.close(fd)
            fsync_dir(directory)
            if directory != place:
                fsync_dir(place)
        except OSError as error:
            with contextlib.suppress(OSError):
                target.unlink()
            self._forget_empty(directory)
            raise SetAsideError(
                target,
                f"the {size - position} bytes of {source} from position {position}",
                error.strerror or str(error),
            ) from None
        count = _count_kept(directory, next_offset)
        return self._add(
            SetAsidePiece(
                place,
                source.name,
                position,
                next_offset,
                str(target.relative_to(place)),
                size - position,
                count.records,
                count.first_offset,
                count.last_offset,
                size - position - count.valid_bytes,
                whole_segment=False,
            )
        )

    def keep_later(self, source: Path, handle: int, position: int, size: int, next_offset: int) -> None:
        """`keep_tail` for a cut after the load (a damaged index found on first use recovers its
        segment), which no loader line reports: one WARNING line says it here."""
        piece = self.keep_tail(source, handle, position, size, next_offset)
        logger.warning(
            "%s: cut %d bytes after the last valid batch at position %d (its index was damaged); set aside in %s",
            source,
            size - position,
            position,
            piece.place,
        )

    def keep_segment(self, segment: LogSegment) -> SetAsidePiece:
        """Move a segment (a LogSegment, its handles closed here) and its index files into the
        place: its `.log` first, so that a failure before it changes nothing, and one after it
        leaves index files without a log, which the next open removes (they are rebuilt)."""
        segment.close_handlers()
        place = self.place
        base = segment.base_offset
        size = 0
        for suffix in (LOG_SUFFIX, TXN_INDEX_SUFFIX, INDEX_SUFFIX, TIME_INDEX_SUFFIX):
            source = self.partition_dir / f"{base:020d}{suffix}"
            if suffix != LOG_SUFFIX and not os.path.lexists(source):
                continue
            target = place / source.name
            try:
                moved = _move(source, target)
            except OSError as error:
                done = sum(piece.whole_segment for piece in self.pieces)
                raise SetAsideError(target, f"segment {source}", error.strerror or str(error), done) from None
            if suffix == LOG_SUFFIX:
                size = moved
        try:
            fsync_dir(place)
            fsync_dir(self.partition_dir)
        except OSError as error:
            raise SetAsideError(place, f"segment {segment.log_path}", error.strerror or str(error)) from None
        count = _count_kept(place, base)
        return self._add(
            SetAsidePiece(
                place,
                f"{base:020d}{LOG_SUFFIX}",
                0,
                base,
                f"{base:020d}{LOG_SUFFIX}",
                size,
                count.records,
                count.first_offset,
                count.last_offset,
                size - count.valid_bytes,
                whole_segment=True,
            )
        )

    def _forget_empty(self, directory: Path) -> None:
        """After a failure before the first piece: the directories made for it go again (best
        effort), so that `check` does not report an empty run."""
        if self.pieces or self._place is None:
            return
        for path in (directory, self._place, self._place.parent):
            with contextlib.suppress(OSError):
                path.rmdir()  # (only when empty)
        self._place = None

    def _add(self, piece: SetAsidePiece) -> SetAsidePiece:
        self.pieces.append(piece)
        in_order = sorted(self.pieces, key=lambda p: (p.source, p.position))
        manifest = {"pieces": [p.to_json() for p in in_order]}
        try:
            write_atomically(piece.place / MANIFEST, json.dumps(manifest, indent=1) + "\n")
        except (OSError, EngineError) as error:
            # The piece is kept, undescribed (`check` reports the place all the same); a tail
            # is not cut (the log keeps it too), a segment stays moved.
            raise SetAsideError(piece.place / MANIFEST, piece.source, str(error)) from None
        return piece


def _check_ours(path: Path, owner: os.stat_result, what: str) -> None:
    """A directory of the place found there must be a directory (not a link to one) of the data
    dir's owner or root: one another user made beforehand would be given the data's bytes."""
    found = os.lstat(path)
    if not stat.S_ISDIR(found.st_mode):
        raise SetAsideError(path, what, "not a directory (a link or a file is there)")
    if found.st_uid not in {0, owner.st_uid}:
        reason = f"owned by uid {found.st_uid}, not by the data dir's owner (uid {owner.st_uid})"
        raise SetAsideError(path, what, reason)


def _make_dir(path: Path, owner: os.stat_result) -> bool:
    """mkdir with the log dir's mode and owner; False when it was there."""
    try:
        os.mkdir(path, stat.S_IMODE(owner.st_mode))
    except FileExistsError:
        return False
    _own(path, owner)
    return True


def _own(path: Path, owner: os.stat_result) -> None:
    with contextlib.suppress(PermissionError):
        os.chown(path, owner.st_uid, owner.st_gid, follow_symlinks=False)
    os.chmod(path, stat.S_IMODE(owner.st_mode), follow_symlinks=False)  # (mkdir's mode passed the umask)


def _own_fd(fd: int, owner: os.stat_result) -> None:
    with contextlib.suppress(PermissionError):
        os.fchown(fd, owner.st_uid, owner.st_gid)
    os.fchmod(fd, stat.S_IMODE(owner.st_mode))


def _move(source: Path, target: Path) -> int:
    """Rename `source` to `target` (never over a file there); on another file system copy it,
    fsync the copy, then unlink `source`. Returns its size."""
    if os.path.lexists(target):
        raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), str(target))
    fd = open_regular(source)  # a link or a FIFO where a segment belongs is not moved
    try:
        info = os.fstat(fd)
        try:
            os.rename(source, target)
            return info.st_size
        except OSError as error:
            if error.errno != errno.EXDEV:
                raise
        out = open_regular(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, stat.S_IMODE(info.st_mode))
        try:
            _own_fd(out, info)
            at = 0
            while chunk := os.pread(fd, _COPY_CHUNK_BYTES, at):
                write_all(out, chunk)
                at += len(chunk)
            os.fsync(out)
        except BaseException:
            os.close(out)
            with contextlib.suppress(OSError):
                target.unlink()
            raise
        os.close(out)
        fsync_dir(target.parent)
        source.unlink()
        return info.st_size
    finally:
        os.close(fd)


@dataclass(frozen=True)
class SetAsideRun:
    """What `check` finds set aside for one partition in one run."""

    place: Path  # <root>/<run>/<topic>-<partition>
    pieces: list[SetAsidePiece]
    problem: str | None  # the manifest could not be read: the place is reported all the same

    @property
    def records(self) -> int:
        return sum(piece.records for piece in self.pieces)


def find_set_aside(log_dir: Path) -> Iterator[SetAsideRun]:
    """Every partition directory in the log dir's set-aside place, oldest run first. An empty
    place (or none) finds nothing: `rm -r` of the place, or of a run, clears what it held."""
    root = place_for(log_dir)
    if not os.path.lexists(root):
        return
    if not is_directory(root):
        yield SetAsideRun(root, [], "not a directory")
        return
    for run in sorted(os.listdir(root)):
        run_dir = root / run
        if not is_directory(run_dir):
            yield SetAsideRun(run_dir, [], "not a directory")
            continue
        for name in sorted(os.listdir(run_dir)):
            place = run_dir / name
            if is_directory(place) and not os.listdir(place):
                continue  # a set-aside that failed before its first piece (SetAsideError)
            yield _read_run(place)


def _read_run(place: Path) -> SetAsideRun:
    try:
        document = json.loads(read_regular(place / MANIFEST, _MANIFEST_LIMIT_BYTES).decode("utf-8"))
        pieces = [
            SetAsidePiece(
                place,
                str(item["source"]),
                int(item["position"]),
                int(item["startOffset"]),
                str(item["file"]),
                int(item["bytes"]),
                int(item["records"]),
                None if item["firstOffset"] is None else int(item["firstOffset"]),
                None if item["lastOffset"] is None else int(item["lastOffset"]),
                int(item["damagedBytes"]),
                bool(item["wholeSegment"]),
            )
            for item in document["pieces"]
        ]
        return SetAsideRun(place, pieces, None)
    except (OSError, EngineError, ValueError, KeyError, TypeError) as error:
        return SetAsideRun(place, [], f"{MANIFEST} unreadable ({error})")


__all__ = [
    "PLACE_SUFFIX",
    "SetAside",
    "SetAsideError",
    "SetAsidePiece",
    "SetAsideRun",
    "count_batches",
    "find_set_aside",
    "place_for",
]
