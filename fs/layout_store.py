"""Where a segment's rendering lies (`SegmentLayout`: its marks and size in one view format) and
the store that keeps sealed segments' layouts on disk between mounts (`LayoutStore`). See
fs.views for how a partition's layout is made of them.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import logging
import os
import re
import struct
import threading
import zlib
from array import array
from dataclasses import dataclass, field
from pathlib import Path

from seglogfs.engine.errors import CorruptRecordError
from seglogfs.engine.log.file_records import batch_header_at
from seglogfs.engine.log.log import PartitionLog
from seglogfs.engine.log.segment import LogSegment

logger = logging.getLogger(__name__)

UNUSED_LAYOUT_DAYS = 30  # a partition's stored layouts unused this long are removed at a mount


_SERIALS = itertools.count()


@dataclass
class SegmentLayout:
    """Where a segment's rendering lies: marks (view position, file position and base offset of
    the batch there), rendered size, and how far into the file it has been rendered. `sealed`:
    measured to the end of a segment that no longer grows."""

    segment: LogSegment
    scanned_to: int = 0
    size: int = 0
    marks_view: array = field(default_factory=lambda: array("q", [0]))
    marks_file: array = field(default_factory=lambda: array("q", [0]))
    marks_offset: array = field(default_factory=lambda: array("q", [-1]))
    since_mark: int = 0
    sealed: bool = False
    last_batch: tuple[int, int] = (-1, 0)  # (position, CRC) of the last batch measured
    # Damaged batches the measure found, by the mark of the page each has to itself, whose one
    # byte reads as the damage (the records before and after it are served).
    damage: dict[int, CorruptRecordError] = field(default_factory=dict)
    # Tells this measure's pages from those of an earlier measure of the same segment (cut back
    # and appended to again: the same positions may hold other batches now).
    serial: int = field(default_factory=lambda: next(_SERIALS))
    # The offset after the last batch measured (-1: not known, a layout loaded from the store).
    end_offset: int = -1
    # A held layout's segment laid out from a batch inside it (`Layout._append_only`): its
    # first offset laid out; -1 for a segment laid out from its start.
    from_offset: int = -1

    @property
    def first_offset(self) -> int:
        """The offset the segment's rendering starts at (for a look-up by offset)."""
        return self.from_offset if self.from_offset >= 0 else self.segment.base_offset

    @property
    def complete_pages(self) -> int:
        """How many of its pages are complete: all of a sealed segment's; a segment that still
        grows has one incomplete page, its last."""
        return len(self.marks_view) if self.sealed else len(self.marks_view) - 1

    def page_bounds(self, mark: int) -> tuple[int, int]:
        """The file positions of the batches between mark `mark` and the next."""
        end = self.marks_file[mark + 1] if mark + 1 < len(self.marks_file) else self.scanned_to
        return self.marks_file[mark], end

    def check_page(self, mark: int) -> None:
        """CorruptRecordError when the page at `mark` is a damaged batch's."""
        error = self.damage.get(mark)
        if error is not None:
            raise CorruptRecordError(error.path, error.position, error.reason)

    def view_bounds(self, mark: int) -> tuple[int, int]:
        """Where the page at mark `mark` lies in the segment's rendering."""
        end = self.marks_view[mark + 1] if mark + 1 < len(self.marks_view) else self.size
        return self.marks_view[mark], end


_LAYOUT_DIRECTORY = re.compile(r".+-[0-9]+\.[0-9a-f]{24}")  # see LayoutStore.directory


_LAYOUT_FILE = re.compile(r"\.?[0-9]{20}\.layout(\.[0-9]+\.[0-9]+)?")  # see LayoutStore._path and save


class LayoutStore:
    """Measured layouts of segments, kept on disk between mounts (derived data: deleting the
    directory only costs a measure).

    One directory per partition and format (named by a hash of the partition dir's real path and
    the format), one file per segment, `<base offset>.layout`, little-endian:

        magic "SLVL" · version u32 · log file inode u64 · base offset u64 · mark_bytes u64
        · measured to (file position) u64 · rendered size u64 · last batch position i64 · its
        CRC u32 · marks u32 · marks_view, marks_file, marks_offset (i64 each) · CRC-32 of
        everything before, u32

    A layout is used only for the same file (inode) still holding, at the same position, the
    batch it was measured up to (same CRC): a segment rewritten by compaction, or truncated by
    recovery, is measured again. A segment that grew since (the active one) is measured from
    where its layout ends. Files are written to a temporary name and renamed, so a crash leaves
    either the old file or the new. A partition's directory is touched when a mount uses it; a
    mount starting removes those unused for `UNUSED_LAYOUT_DAYS` (`prune`). Thread-safe."""

    _HEADER = struct.Struct("<4sIQQQQQqII")
    _MAGIC = b"SLVL"
    _VERSION = 2

    def __init__(self, root: Path) -> None:
        self.root = root
        self._warned = False  # an unwritable cache is said once, not once per segment

    def directory(self, log: PartitionLog, format_key: str) -> Path:
        name = f"{os.path.realpath(log.directory)}\0{format_key}".encode("utf-8", "surrogateescape")
        return self.root / f"{log.topic}-{log.partition}.{hashlib.sha256(name).hexdigest()[:24]}"

    @staticmethod
    def _inode(segment: LogSegment) -> int | None:
        try:
            return os.lstat(segment.log_path).st_ino
        except OSError:
            return None

    @staticmethod
    def _path(directory: Path, segment: LogSegment) -> Path:
        return directory / f"{segment.base_offset:020d}.layout"

    def load(self, directory: Path, segment: LogSegment, mark_bytes: int) -> SegmentLayout | None:
        """The stored layout of a segment, or None (none stored, or stale, or damaged). Sealed
        when the file ends where the layout does; the caller decides whether it may grow."""
        path = self._path(directory, segment)
        try:
            data = path.read_bytes()
        except OSError:
            return None
        head = self._HEADER.size
        if len(data) < head + 4 or zlib.crc32(data[:-4]) != int.from_bytes(data[-4:], "little"):
            return None
        magic, version, inode, base_offset, marks_every, scanned_to, rendered, last_position, last_crc, count = (
            self._HEADER.unpack_from(data)
        )
        if (
            (magic, version) != (self._MAGIC, self._VERSION)
            or base_offset != segment.base_offset
            or marks_every != mark_bytes
            or len(data) != head + 24 * count + 4
            or inode != self._inode(segment)
            or segment.size < scanned_to
        ):
            return None
        if last_position >= 0 and not self._holds_batch(segment, last_position, last_crc, scanned_to):
            return None
        arrays = []
        for i in range(3):
            column = array("q")
            column.frombytes(data[head + 8 * count * i : head + 8 * count * (i + 1)])
            arrays.append(column)
        return SegmentLayout(
            segment,
            scanned_to,
            rendered,
            arrays[0],
            arrays[1],
            arrays[2],
            since_mark=rendered - arrays[0][-1],
            sealed=segment.size == scanned_to,
            last_batch=(last_position, last_crc),
        )

    @staticmethod
    def _holds_batch(segment: LogSegment, position: int, crc: int, next_position: int) -> bool:
        """Whether the segment file has a batch with this CRC at `position`, ending at
        `next_position` (read through a descriptor of its own: the segment's stays unopened)."""
        header = batch_header_at(segment.log_path, position)
        return header is not None and header.crc == crc and header.next_position == next_position

    def save(self, directory: Path, layout: SegmentLayout, mark_bytes: int) -> None:
        """Keep a segment's layout; a failure is logged and otherwise ignored."""
        segment = layout.segment
        inode = self._inode(segment)
        if inode is None:
            return
        count = len(layout.marks_view)
        data = bytearray(
            self._HEADER.pack(
                self._MAGIC,
                self._VERSION,
                inode,
                segment.base_offset,
                mark_bytes,
                layout.scanned_to,
                layout.size,
                *layout.last_batch,
                count,
            )
        )
        for column in (layout.marks_view, layout.marks_file, layout.marks_offset):
            data += column.tobytes()
        data += zlib.crc32(data).to_bytes(4, "little")
        path = self._path(directory, segment)
        temporary = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}")
        try:
            directory.mkdir(parents=True, exist_ok=True)
            temporary.write_bytes(data)
            os.replace(temporary, path)
        except OSError as error:
            log = logger.debug if self._warned else logger.warning
            self._warned = True
            log(
                "cannot keep the view layout of %s in %s: %s (views work; they are measured again next mount)",
                segment.log_path,
                directory,
                error,
            )
            temporary.unlink(missing_ok=True)

    def discard(self, directory: Path, segment: LogSegment) -> None:
        """Forget a segment that left the log (removed by retention, replaced by compaction)."""
        self._path(directory, segment).unlink(missing_ok=True)

    @staticmethod
    def touch(directory: Path) -> None:
        """Note that a partition's layouts are in use (their directory's mtime: see `prune`)."""
        with contextlib.suppress(OSError):  # not stored yet, or an unwritable cache
            os.utime(directory)

    def prune(self, now_s: float, unused_days: float = UNUSED_LAYOUT_DAYS) -> int:
        """Remove the layouts of partitions no mount has used for `unused_days` (data dirs gone
        or moved leave theirs behind); how many partitions' layouts went. Only what the store
        made goes: a directory named as `directory` names them holding nothing but layout
        files (`-o view.cache=` may name a directory that holds other things too)."""
        removed = 0
        try:
            entries = list(os.scandir(self.root))
        except OSError:
            return 0
        for entry in entries:
            try:
                if (
                    _LAYOUT_DIRECTORY.fullmatch(entry.name)
                    and entry.is_dir(follow_symlinks=False)
                    and entry.stat(follow_symlinks=False).st_mtime < now_s - unused_days * 86400
                ):
                    removed += self._remove_layouts(Path(entry.path))
            except OSError as error:
                logger.debug("pruning the view cache: %s: %s", entry.path, error)
        return removed

    @staticmethod
    def _remove_layouts(directory: Path) -> int:
        """Remove a partition's layout directory if it holds only layout files: 1 if it went."""
        files = list(directory.iterdir())
        if not all(_LAYOUT_FILE.fullmatch(path.name) and path.is_file() for path in files):
            logger.warning("view cache: %s holds files it did not make: left alone", directory)
            return 0
        for path in files:
            path.unlink()
        directory.rmdir()
        return 1
