"""Running a mount: the FUSE session, the data dir's background work, and a clean unmount.

`serve(...)` mounts, runs until the filesystem is unmounted (`seglogfs umount`, `fusermount3 -u`,
`umount`) or the process gets SIGINT/SIGTERM, then closes the data dir as after a clean
shutdown. The scheduler (retention, flushes, compaction, checkpoints) runs in the same trio loop,
its work in a worker thread, and after work that changes what views show the kernel is told.
SIGUSR1 logs how many requests of each kind the filesystem has served (also logged at unmount).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pyfuse3
import trio

from seglogfs.engine import BrokerConfig, DataDir
from seglogfs.engine.scheduler import Scheduler
from seglogfs.fs.operations import Operations
from seglogfs.fs.tree import MountOptions, Tree

logger = logging.getLogger(__name__)

# Test hook: milliseconds an unmounted mount waits before it closes the data dir, as one with
# thousands of partitions takes to write its checkpoints (what `seglogfs umount` waits for).
CLOSE_DELAY_ENV = "SEGLOGFS_TEST_CLOSE_DELAY_MS"
_CLOSE_DELAY_S = float(os.environ.get(CLOSE_DELAY_ENV, "0") or 0) / 1000


def fuse_options(source: str, *, read_only: bool, allow_other: bool, default_permissions: bool) -> set[str]:
    """FUSE's mount options. `allow_other` always comes with `default_permissions`: other users
    are let in only for the kernel to check each request against the owner and mode every node
    shows (those of the data dir's files, fs.permissions); without it they would read and write
    all of it as the mount's user. Every way to mount (`seglogfs mount`, `mount -t
    fuse.seglogfs`, an fstab line) comes through here."""
    options = set(pyfuse3.default_options)
    options.discard("default_permissions")
    options |= {f"fsname={source}", "subtype=seglogfs"}
    if read_only:
        options.add("ro")
    if allow_other:
        options.add("allow_other")
    if default_permissions or allow_other:
        options.add("default_permissions")
    return options


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


async def _background(operations: Operations, scheduler: Scheduler | None) -> None:
    await trio.to_thread.run_sync(operations.tree.prune_view_cache)
    if scheduler is None:  # read-only: another process may be writing the data dir
        await operations.follow_writers()
    assert scheduler is not None
    while True:
        await trio.sleep(max(scheduler.next_due_ms - _now_ms(), 10) / 1000)
        try:
            report = await trio.to_thread.run_sync(scheduler.run_due, _now_ms())
            if report.deleted_segments or report.cleaned_logs or report.offline:
                await operations.after_background_work()
        except Exception:  # run_due guards its work: this is a bug, and the mount stays up
            logger.exception("background work failed; retried in a minute")
            await trio.sleep(60)


async def _main(operations: Operations, scheduler: Scheduler | None, ready: Callable[[], None]) -> None:
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_background, operations, scheduler)
        nursery.start_soon(operations.notify_in_background)

        async def stop_on_signals() -> None:
            with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
                async for signum in signals:
                    logger.info("got signal %d: unmounting", signum)
                    nursery.cancel_scope.cancel()
                    return

        nursery.start_soon(stop_on_signals)

        watch = _LoopWatch()
        trio.lowlevel.add_instrument(watch)

        async def report_on_sigusr1() -> None:
            with trio.open_signal_receiver(signal.SIGUSR1) as signals:
                async for _ in signals:
                    _report(operations, watch)

        nursery.start_soon(report_on_sigusr1)
        ready()
        await pyfuse3.main()
        nursery.cancel_scope.cancel()  # unmounted from outside: stop the background work
    _report(operations, watch)


class _LoopWatch(trio.abc.Instrument):
    """How long the trio loop was kept from running its tasks: the longest stretch it ran
    without going back to wait for I/O (a handler that blocks delays every request). Told by
    the loop itself as it waits and wakes, so an idle mount costs nothing; a task that woke every
    5 ms to see how late it was took 2-4 % of a core from each mount, idle or not."""

    def __init__(self) -> None:
        self.longest_ms = 0.0  # since the last report
        self._woke: float | None = None

    def after_io_wait(self, timeout: float) -> None:
        self._woke = time.perf_counter()

    def before_io_wait(self, timeout: float) -> None:
        if self._woke is not None:
            self.longest_ms = max(self.longest_ms, (time.perf_counter() - self._woke) * 1000)

    def take(self) -> float:
        longest, self.longest_ms = self.longest_ms, 0.0
        return round(longest, 3)


def _report(operations: Operations, watch: _LoopWatch) -> None:
    """The requests served so far by kind, and the loop's longest stall since the last report
    (SIGUSR1, and at unmount)."""
    counts: dict[str, float] = dict(sorted(operations.requests.items()))
    counts["loop_blocked_max_ms"] = watch.take()
    logger.info("requests %s", json.dumps(counts))


def serve(
    config: BrokerConfig,
    mountpoint: Path,
    options: MountOptions,
    *,
    allow_other: bool = False,
    default_permissions: bool = False,
    ready: Callable[[], None] = lambda: None,
    source: str | None = None,
) -> None:
    """Mount the data dir at `mountpoint` and serve it until unmounted; `ready` is called once
    the mount is in place. `source` is what the mount table shows (default: the log dirs)."""
    data_dir = DataDir.open(config, read_only=options.read_only, serve_the_rest=True, now_ms=_now_ms())
    measurer: threading.Thread | None = None
    with data_dir:  # (a failure to close is said, and never hides the error that ended the mount)
        tree = Tree(data_dir, options)
        operations = Operations(tree)
        scheduler = None if options.read_only else Scheduler(data_dir, _now_ms())
        if source is None:
            source = ",".join(str(d) for d in config.log_dirs)
        pyfuse3.init(
            operations,
            os.fspath(mountpoint),
            fuse_options(
                source,
                read_only=options.read_only,
                allow_other=allow_other,
                default_permissions=default_permissions,
            ),
        )
        if options.measure:
            measurer = threading.Thread(target=tree.measure_in_background, name="seglogfs-measure", daemon=True)
            measurer.start()
        try:
            trio.run(_main, operations, scheduler, ready)
        finally:
            tree.stop_measures()
            if measurer is not None:
                measurer.join()
            pyfuse3.close(unmount=True)
            tree.keep_layouts()
            if _CLOSE_DELAY_S:
                time.sleep(_CLOSE_DELAY_S)
