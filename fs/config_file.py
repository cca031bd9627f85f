"""`<topic>/config`: the topic's config overrides as `key=value` lines (kafka-configs
--describe); writing it replaces them (kafka-configs --alter), checked line by line.

It behaves like a file a shell writes (DESIGN.md §2). A handle open for writing holds the
file's text: the current overrides, or nothing when opened with O_TRUNC. Each write must leave
every complete line valid, or it fails (EINVAL) and the handle is spoiled: nothing it holds is
ever applied. What it holds is applied when a descriptor that wrote is closed (`flush`: a
shell's `>` closes its first descriptor before writing, so a close before any write applies
nothing) and, for an open with O_TRUNC and no write (`: > config`, clearing the overrides),
when the last descriptor goes (`release`). An open that writes nothing changes nothing.

Each write also stores what its complete lines would make the overrides file to a temporary
file, and removes it: a full disk fails the write itself (ENOSPC). A shell's `printf … > config`
reports a failed write; a failed close it never sees (the builtin writes, the shell closes). A
failed write or apply spoils the handle too: a later close applies nothing.
"""

from __future__ import annotations

import errno
import os
import stat
import threading
from typing import TYPE_CHECKING

from seglogfs.engine.config import format_topic_config, parse_topic_config
from seglogfs.engine.errors import ConfigError, EngineError
from seglogfs.fs.node import Attributes, BytesHandle, Changes, Handle, Node, Refused

if TYPE_CHECKING:
    from seglogfs.fs.tree import Tree


class ConfigFile(Node):
    def __init__(self, tree: Tree, inode: int, key: tuple[object, ...], path: str, *, topic: str) -> None:
        super().__init__(tree, inode, key, path)
        self.topic = topic

    def content(self) -> bytes:
        return format_topic_config(self.tree.data_dir.topic_overrides(self.topic))

    def attributes(self) -> Attributes:
        """Read and written by whoever may list and change the data dir (writing it changes
        what the data dir keeps of the topic: retention may delete its records)."""
        access = self.tree.data_dir_access().file()
        return self.shown(stat.S_IFREG, access, size=len(self.content()), mtime_ns=self.tree.mounted_ns)

    def open(self, flags: int) -> Handle:
        if flags & os.O_ACCMODE == os.O_RDONLY:
            return BytesHandle(self, self.content())
        if self.tree.read_only:
            raise Refused(errno.EROFS, f"write {self.path}")
        return ConfigHandle(self, truncated=bool(flags & os.O_TRUNC))

    def truncate(self, size: int) -> None:
        if size != 0:  # `>` may truncate to 0 before writing: the handle's O_TRUNC says it
            super().truncate(size)

    def try_storing(self, text: bytes) -> None:
        """Raise the OSError (ENOSPC) that storing the overrides of `text` (valid) would meet."""
        self.tree.data_dir.try_storing_topic_overrides(self.topic, parse_topic_config(text, self.path))

    def apply(self, text: bytes) -> Changes:
        """Replace the overrides by those of `text` (valid: checked by the caller)."""
        self.tree.data_dir.set_topic_overrides(self.topic, parse_topic_config(text, self.path))
        return Changes(inodes=[self.inode])


class ConfigHandle(Handle):
    """`config` open for writing. See the module docstring. Thread-safe: its state changes
    under `_lock` (a truncate arrives on the event loop, writes in worker threads)."""

    writable = True

    def __init__(self, node: ConfigFile, *, truncated: bool) -> None:
        super().__init__(node)
        self.config = node
        self.text = bytearray() if truncated else bytearray(node.content())
        self.changed = truncated  # something to apply at the end
        self.written = False  # a write came through this handle (its flush applies)
        self.spoiled = False  # a write was refused: nothing is applied
        self.applied: bytes | None = None
        self._lock = threading.Lock()

    def read_now(self, position: int, length: int) -> bytes:
        with self._lock:
            return bytes(self.text[position : position + length])

    def read(self, position: int, length: int) -> bytes:
        return self.read_now(position, length)

    def write(self, position: int, data: bytes) -> Changes:
        with self._lock:
            return self._write_locked(position, data)

    def _write_locked(self, position: int, data: bytes) -> Changes:
        text = bytearray(self.text)
        if position > len(text):
            text += bytes(position - len(text))
        text[position : position + len(data)] = data
        try:
            complete = bytes(text[: text.rfind(b"\n") + 1])
            parse_topic_config(complete, self.node.path)
            self.config.try_storing(complete)
        except (ConfigError, OSError):
            self.spoiled = True
            raise
        self.text = text
        self.changed = self.written = True
        return Changes()

    def truncate(self, size: int) -> None:
        # An open with O_TRUNC where the kernel truncates apart from the open (no atomic O_TRUNC).
        with self._lock:
            self.text = self.text[:size] + bytes(max(0, size - len(self.text)))
            self.changed = True

    def flush(self) -> Changes:
        with self._lock:
            return self._apply_locked() if self.written else Changes()

    def release(self) -> Changes:
        with self._lock:
            return self._apply_locked()

    def _apply_locked(self) -> Changes:
        text = bytes(self.text)
        if self.spoiled or not self.changed or text == self.applied:
            return Changes()
        try:
            changes = self.config.apply(text)  # the last line may lack its newline: checked here
        except (EngineError, OSError):  # (a close that failed is not tried again by the next)
            self.spoiled = True
            raise
        self.applied = text
        return changes
