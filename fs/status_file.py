"""`<topic>/<p>/status`: the partition's status document (engine.status), as it is when read."""

from __future__ import annotations

import os
import stat

from seglogfs.engine.status import status_json
from seglogfs.fs.node import Attributes, BytesHandle, Handle, PartitionNode


class StatusFile(PartitionNode):
    """The engine's document, how far the partition's views are measured (`views`: per format
    looked at so far, `measured` and the segment bytes measured of those to measure), and, once a
    read_committed view has been used, what it goes by (`readCommitted`: the last stable offset,
    the open transactions, how many were aborted)."""

    def _document(self) -> bytes:
        extra: dict[str, object] = {"views": self.tree.view_progress(self.log)}
        read_committed = self.tree.read_committed_state(self.log)
        if read_committed is not None:
            extra["readCommitted"] = read_committed
        return status_json(self.log, extra)

    def attributes(self) -> Attributes:
        """Readable by whoever may read the partition's files (its views). Its size is the
        document's now, asked for afresh at every stat (`valid_s` 0): the document changes with
        every append, and gains `readCommitted` once a read_committed view is used, and nothing
        tells the kernel so (it kept the first stat's size for an hour)."""
        return self.shown(
            stat.S_IFREG,
            self.partition_access().reading(),
            size=len(self._document()),
            mtime_ns=self.tree.mounted_ns,
            valid_s=0,
        )

    def open(self, flags: int) -> Handle:
        self.refuse_writes(flags)
        return BytesHandle(self, self._document())

    def truncate(self, size: int) -> None:
        self.refuse_writes(os.O_WRONLY)
