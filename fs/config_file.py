"""`<topic>/config`: the topic's config overrides as `key=value` lines (kafka-configs
--describe); writing it replaces them (kafka-configs --alter), checked line by line.

It behaves like a file a shell writes. A handle open for writing holds the
file's text: the current overrides, or nothing when opened with O_TRUNC. Each write must leave
every complete line valid, or it fails (EINVAL) and the handle is spoiled: nothing it holds is
ever applied. What it holds is applied when a descriptor that wrote is closed (`flush`: a
shell's `>` closes its first descriptor before writing, so a close before any write applies
nothing) or fsync'd, and, for an open with O_TRUNC and no write (`: > config`, clearing the
overrides), when the last descriptor goes (`release`). An open that writes nothing changes nothing.

Each write also stores what its complete lines would make the overrides file to a temporary
file, and removes it: a full disk fails the write itself (ENOSPC). A shell's `printf … > config`
reports a failed write; a failed close it never sees (the builtin writes, the shell closes). A
failed write or apply spoils the handle too: a later close applies nothing.
"""

from __future__ import annotations

import dataclasses
import errno
import os
import stat
import threading
from typing import TYPE_CHECKING

from seglogfs.engine.config import format_topic_config, parse_topic_config
from seglogfs.engine.errors import ConfigError, EngineError
from seglogfs.fs.node import Attributes, BytesHandle, Changes, Handle, Node, NoEntry, Refused

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

    def apply(self, text: bytes, source: str | None = None) -> Changes:
        """Replace the overrides by those of `text`, checked line by line (ConfigError naming
        `source`, the file they came from, and the line: nothing changed)."""
        self.tree.data_dir.set_topic_overrides(self.topic, parse_topic_config(text, source or self.path))
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

    def fsync(self) -> Changes:
        """What was written is applied and stored (an fsync that succeeded with nothing stored
        would promise what a close may then refuse)."""
        return self.flush()

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


TEMPORARY_MAX_BYTES = 1 << 20  # a topic's overrides take a few hundred bytes
_TEMPORARY_LIMIT = f"a file beside config holds at most {TEMPORARY_MAX_BYTES} bytes"


class TemporaryFile(Node):
    """A file made beside `config` to save it as editors do (`sed -i`'s `sedXXXXXX`, a Python
    save's temporary, then `rename` onto `config`): held in the mount's memory only, never in
    the data dir. Renamed onto `config` (`TopicDir.rename`), its text replaces the overrides,
    checked line by line as a write of `config` is; unlinked, or its rename refused, it is
    gone (the memory goes when the kernel forgets the inode). After its rename the kernel names
    `config` by this inode until it looks the name up again: it then stands for `config`.
    Thread-safe: its text and attributes change under `_lock`."""

    def __init__(
        self,
        tree: Tree,
        inode: int,
        key: tuple[object, ...],
        path: str,
        *,
        config: ConfigFile,
        mode: int,
        owner: tuple[int, int],
        now_ns: int,
    ) -> None:
        super().__init__(tree, inode, key, path)
        self.config = config
        self.text = bytearray()
        self.mode = stat.S_IMODE(mode)
        self.uid, self.gid = owner
        self.mtime_ns = now_ns
        self.renamed = False  # renamed onto `config`: stands for it
        self.gone = False  # no name names it any more: the tree drops it when the kernel forgets it
        self._lock = threading.Lock()

    def attributes(self) -> Attributes:
        if self.renamed:
            return dataclasses.replace(self.config.attributes(), valid_s=0)
        if self.gone:  # (the kernel may hold its name a moment longer)
            raise NoEntry(f"getattr {self.path}")
        with self._lock:
            size = len(self.text)
        # (valid_s 0: a write through one descriptor changes the size another stats)
        return Attributes(
            stat.S_IFREG | self.mode, size=size, mtime_ns=self.mtime_ns, uid=self.uid, gid=self.gid, valid_s=0
        )

    def open_now(self, flags: int) -> Handle | None:
        if self.renamed:
            return None
        if self.gone:
            raise NoEntry(f"open {self.path}")
        if flags & os.O_TRUNC and flags & os.O_ACCMODE != os.O_RDONLY:
            self.truncate(0)
        return TemporaryHandle(self)

    def open(self, flags: int) -> Handle:
        if self.renamed:
            return self.config.open(flags)
        handle = self.open_now(flags)
        assert handle is not None
        return handle

    def content(self) -> bytes:
        with self._lock:
            return bytes(self.text)

    def read(self, position: int, length: int) -> bytes:
        with self._lock:
            return bytes(self.text[position : position + length])

    def write(self, position: int, data: bytes) -> None:
        with self._lock:
            end = position + len(data)
            if end > TEMPORARY_MAX_BYTES:
                raise Refused(errno.EFBIG, f"write {self.path}: {_TEMPORARY_LIMIT}")
            if position > len(self.text):
                self.text += bytes(position - len(self.text))
            self.text[position:end] = data

    def truncate(self, size: int) -> None:
        if self.renamed:
            self.config.truncate(size)
            return
        if size > TEMPORARY_MAX_BYTES:
            raise Refused(errno.EFBIG, f"truncate {self.path}: {_TEMPORARY_LIMIT}")
        with self._lock:
            self.text = self.text[:size] + bytes(max(0, size - len(self.text)))

    def change(self, mode: int | None, owner: tuple[int, int] | None) -> None:
        """chmod and chown, which editors do to their copy to keep the file's (sed -i fails
        when it cannot)."""
        with self._lock:
            if mode is not None:
                self.mode = stat.S_IMODE(mode)
            if owner is not None:
                self.uid, self.gid = owner

    def forgettable(self) -> bool:
        return self.gone


class TemporaryHandle(Handle):
    """A `TemporaryFile` open: reads and writes its text in memory, on the loop."""

    def __init__(self, node: TemporaryFile) -> None:
        super().__init__(node)
        self.file = node

    def read_now(self, position: int, length: int) -> bytes:
        return self.file.read(position, length)

    def read(self, position: int, length: int) -> bytes:
        return self.read_now(position, length)

    def write_now(self, position: int, data: bytes) -> Changes:
        self.file.write(position, data)
        return Changes()

    def write(self, position: int, data: bytes) -> Changes:
        return self.write_now(position, data)
