"""The process-wide cache of open segment files: a bounded LRU, as Kafka's lazy index handles.

Kafka keeps a segment's `.log` open and opens its indexes lazily (`LazyIndex`), closing them
(`closeHandlers`) when the segment goes. A process here may hold thousands of segments at the
default `ulimit -n` of 1024, so a segment opens its files on first use and gives them back when
the process holds too many: this module keeps the list of segments holding open files, least
recently used first, and the budget.

A segment holds up to five descriptors: its `.log`, and for each index the file and the mapping
(Python's `mmap` keeps a duplicate of the descriptor it maps). The budget, in segments, is
`max(16, (soft RLIMIT_NOFILE - 64) // 5)`: 64 descriptors stay for everything else (the FUSE
device, sockets, open mirror files, layout files); `SEGLOGFS_MAX_OPEN_SEGMENTS` or
`set_max_open_segments` sets it instead.

What a holder (`engine.log.segment.LogSegment`) does:

* it calls `touch` whenever it takes a lease (a read, an iteration, an append, an index open:
  see `LogSegment._lease`), which opens its `.log` if need be: the cache moves it to the most
  recently used end, or adds it. When adding makes the cache hold more than the budget, the least recently used
  holders that are `evictable` (not leased, not pinned) are asked to `try_release_handles`: each
  closes its files unless one of its locks is taken by another thread at that moment, and then
  `forget`s itself. Nothing here waits for a holder: a busy one is skipped, and the budget may be
  exceeded until a later addition finds it idle;
* it calls `forget` when it has closed its files (release, eviction, close).

When an open fails with EMFILE or ENFILE all the same (files held open by others than segments),
`opening` sheds half of the cache and tries once more.

Thread safety: every method. `_lock` guards the LRU only and is a leaf: no holder method is called
under it (`touch` releases it before evicting), while holders may call `touch`/`forget` under
their own locks.
"""

from __future__ import annotations

import errno
import os
import resource
import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Protocol, TypeVar

from seglogfs.engine.errors import ConfigError

MAX_OPEN_SEGMENTS_ENV = "SEGLOGFS_MAX_OPEN_SEGMENTS"
FDS_PER_SEGMENT = 5
RESERVED_FDS = 64
MIN_OPEN_SEGMENTS = 16
_UNLIMITED_FDS = 1 << 20  # what RLIM_INFINITY counts as

_T = TypeVar("_T")


class HandleHolder(Protocol):
    """What the cache asks of a segment."""

    @property
    def evictable(self) -> bool:
        """A hint read without locks: not leased and not pinned at this moment."""
        ...

    def try_release_handles(self) -> bool:
        """Close the files now unless leased, pinned or busy (never waits); forget itself.
        Returns whether it did."""
        ...


def default_max_open_segments() -> int:
    """The budget: `SEGLOGFS_MAX_OPEN_SEGMENTS` when set, else derived from the soft
    RLIMIT_NOFILE (see the module docstring)."""
    configured = os.environ.get(MAX_OPEN_SEGMENTS_ENV, "").strip()
    if configured:
        try:
            value = int(configured)
        except ValueError:
            value = 0
        if value < 1:
            raise ConfigError(f"{MAX_OPEN_SEGMENTS_ENV}={configured!r}: not a positive number of segments")
        return value
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft > _UNLIMITED_FDS:
        soft = _UNLIMITED_FDS
    return max(MIN_OPEN_SEGMENTS, (soft - RESERVED_FDS) // FDS_PER_SEGMENT)


class OpenSegments:
    """The LRU of holders with open files (see the module docstring). Thread-safe."""

    def __init__(self, max_open: int | None = None) -> None:
        self._lock = threading.Lock()
        self._entries: OrderedDict[HandleHolder, None] = OrderedDict()
        self._max_open = max_open

    @property
    def max_open(self) -> int:
        """The budget, in segments (derived on first use unless set)."""
        budget = self._max_open
        if budget is None:
            budget = self._max_open = default_max_open_segments()
        return budget

    def set_max_open(self, max_open: int | None) -> None:
        """Set the budget (None: derive it again from the environment and the rlimit) and
        close what is over it now, as far as nobody uses it."""
        if max_open is not None and max_open < 1:
            raise ValueError(f"the open-segment budget must be at least 1, not {max_open}")
        self._max_open = max_open
        self.shed(self.max_open)

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, holder: object) -> bool:
        return holder in self._entries

    def touch(self, holder: HandleHolder) -> None:
        """`holder` is being used and holds open files: most recently used now. Adding it may
        evict others (outside the lock; never `holder` itself)."""
        with self._lock:
            entries = self._entries
            if holder in entries:
                entries.move_to_end(holder)
                return
            entries[holder] = None
            excess = len(entries) - self.max_open
            if excess <= 0:
                return
            victims = self._pick_locked(excess, spare=holder)
        for victim in victims:
            victim.try_release_handles()

    def forget(self, holder: HandleHolder) -> None:
        """`holder` closed its files."""
        with self._lock:
            self._entries.pop(holder, None)

    def shed(self, keep: int) -> int:
        """Evict least recently used holders until at most `keep` remain, skipping those in use;
        returns how many closed their files."""
        with self._lock:
            victims = self._pick_locked(len(self._entries) - keep, spare=None)
        return sum(victim.try_release_handles() for victim in victims)

    def _pick_locked(self, count: int, spare: HandleHolder | None) -> list[HandleHolder]:
        """Up to `count` evictable holders, least recently used first. Holders passed over as in
        use (leased, pinned) move to the most recently used end, so that the next pick does not
        walk past them again."""
        victims: list[HandleHolder] = []
        in_use: list[HandleHolder] = []
        if count > 0:
            for holder in self._entries:
                if holder is spare:
                    continue
                if holder.evictable:
                    victims.append(holder)
                    if len(victims) >= count:
                        break
                else:
                    in_use.append(holder)
        for holder in in_use:
            self._entries.move_to_end(holder)
        return victims


OPEN_SEGMENTS = OpenSegments()


def max_open_segments() -> int:
    """The process's budget of segments holding open files."""
    return OPEN_SEGMENTS.max_open


def set_max_open_segments(max_open: int | None) -> None:
    """Set the process's budget (None: `SEGLOGFS_MAX_OPEN_SEGMENTS`, else from the rlimit) and
    close what is over it now. For tests and embedders."""
    OPEN_SEGMENTS.set_max_open(max_open)


def opening(open_files: Callable[[], _T]) -> _T:
    """`open_files()`; when it fails for want of descriptors (EMFILE, ENFILE), half the open
    segments give theirs back (those not in use) and it is tried once more."""
    try:
        return open_files()
    except OSError as error:
        if error.errno not in (errno.EMFILE, errno.ENFILE):
            raise
    OPEN_SEGMENTS.shed(len(OPEN_SEGMENTS) // 2)
    return open_files()
