"""A read-only log's looks at its partition directory while another process writes it (a broker,
`seglogfs produce`, a writable mount): which segments are there now, and how far the last ones
have grown (`PartitionLog.refresh` publishes what a look found, under the log's lock).

A look lists the directory again only when its mtime moved since the last listing (a roll, a
retention delete, the cleaner's swap), and trusts an mtime only once it is a second old (a change
within the same clock tick would not move it). Otherwise it asks the sizes of the last segment and
of the one that was last at the previous look (it may have grown before it was sealed, however
many rolls came after it). Segments whose files are the same keep their objects; a segment whose
file was replaced (`LogSegment.replaced_on_disk`) is opened afresh. Nothing is ever followed: a
partition directory replaced by a link, or a link or a FIFO where a segment belongs, is
UnsafeFileError (the log goes offline).
"""

from __future__ import annotations

import os
import stat
import time
from pathlib import Path

from seglogfs.engine.config import LogConfig
from seglogfs.engine.errors import UnsafeFileError
from seglogfs.engine.files import describe_mode
from seglogfs.engine.log.loader import segment_for
from seglogfs.engine.log.naming import LOG_SUFFIX, parse_segment_file_name
from seglogfs.engine.log.segment import LogSegment


class FollowedDirectory:
    """What a read-only log knows of its directory between looks: when it last listed it."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._listed_at_mtime_ns: int | None = None  # the directory's mtime at the last listing

    def forget_listing(self) -> None:
        """List the directory at the next look, whatever its mtime (a segment went mid-look)."""
        self._listed_at_mtime_ns = None

    def look(self, current: list[LogSegment], config: LogConfig, now_ms: int) -> tuple[list[LogSegment], bool, bool]:
        """One look: the segments (listed again when the directory changed), whether they differ
        from `current`, and whether the last one grew. UnsafeFileError for something that must
        not be followed; FileNotFoundError when a segment's file went before its size was looked
        at (segments this look opened are closed again)."""
        segments, changed = current, False
        status = os.lstat(self.directory)  # (replaced by a link since the open: never followed)
        if not stat.S_ISDIR(status.st_mode):
            raise UnsafeFileError(self.directory, describe_mode(status.st_mode), "a partition directory")
        directory_changed = status.st_mtime_ns
        if directory_changed != self._listed_at_mtime_ns:  # a roll, a delete, a swap: list it again
            segments, changed = self._list_segments(current, config, now_ms)
            # A change within the same clock tick as the listing would not move the mtime:
            # trust an mtime only once it is a second old.
            recent = time.time_ns() - directory_changed < 1_000_000_000
            self._listed_at_mtime_ns = None if recent else directory_changed
            if not segments and current:
                # A log always has a segment: a listing that found none caught the writer
                # between its steps (a segment's files coming or going as it was opened).
                # The log stays as last seen, and the next look lists the directory again.
                segments, changed = current, False
                self._listed_at_mtime_ns = None
        grown = False
        # The last one grows; the one that was last at the previous look may have grown too
        # before it was sealed, however many rolls came after it (its last batches were
        # missed when only the one before the last was looked at again). The others were
        # sealed when first seen.
        last = segments[-1:]
        was_last = current[-1:] if current and last and current[-1] is not last[0] else []
        try:
            for segment in [s for s in was_last if s in segments] + last:
                before = segment.size
                grown = segment.refresh_size(sealed=segment is not last[0]) != before or grown
        except FileNotFoundError:
            for segment in segments:
                if segment not in current:  # (opened by this look's listing)
                    segment.close_handlers()
            raise
        return segments, changed, grown

    def _list_segments(
        self, current: list[LogSegment], config: LogConfig, now_ms: int
    ) -> tuple[list[LogSegment], bool]:
        """The segments on disk now (`current`'s objects where their files are the same), and
        whether that differs from `current`."""
        listed = sorted(
            parsed[0]
            for name in os.listdir(self.directory)
            if (parsed := parse_segment_file_name(name)) is not None and parsed[1] == LOG_SUFFIX and not parsed[2]
        )
        known = {segment.base_offset: segment for segment in current}
        segments, changed = [], len(listed) != len(current)
        for base in listed:
            segment = known.get(base)
            if segment is None or segment.replaced_on_disk():
                changed = True
                try:
                    segment = segment_for(self.directory, base, config, writable=False, now_ms=now_ms)
                except FileNotFoundError:  # deleted meanwhile
                    continue
            segments.append(segment)
        return segments, changed
