"""`<topic>/<p>/status`: the partition's status document (engine.status), as it is when read."""

from __future__ import annotations

import os
import stat

from seglogfs.engine.status import status_json
from seglogfs.fs.node import Attributes, BytesHandle, Handle, PartitionNode


class StatusFile(PartitionNode):
    def attributes(self) -> Attributes:
        return Attributes(stat.S_IFREG | 0o444, len(status_json(self.log)), self.tree.mounted_ns)

    def open(self, flags: int) -> Handle:
        self.refuse_writes(flags)
        return BytesHandle(self, status_json(self.log))

    def truncate(self, size: int) -> None:
        self.refuse_writes(os.O_WRONLY)
