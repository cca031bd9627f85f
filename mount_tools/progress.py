"""The progress of long work on stderr, as Linux tools show it (pv, rsync --info=progress2, wget).

On a terminal (stderr a TTY) one line is redrawn in place (`\\r`, the text, erase to the end of
the line) at most ten times a second, cut to the terminal's width so that it never wraps, and
erased when the work ends, fails or is interrupted; what the command prints after it starts on a
clean line:

    check [#########.....................]  30.0%  1.0 GB of 3.3 GB  410 MB/s  ETA 0:06
    produce  120 MB  1,234,567 records  95 MB/s  0:01
    clean: retention and compaction of 12 partitions, 3.3 GB  0:07

Off a terminal (a log file, a pipe, cron, a systemd unit) a short run writes nothing; a run still
going after 5 s writes one plain line, and after that at most one every 10 s, so that a log shows
the work is alive without filling up:

    produce: 1,234,567 records, 120 MB so far
    check: 1.0 GB of 3.3 GB (30%) so far

`plain=False` (the commands' `--json`) leaves off-terminal stderr without those lines; `quiet`
shows nothing at all (`produce` typed at a terminal).

The caller counts (`advance`) at whatever grain it has — a chunk of input, a segment, a file; the
clock is read there and a line written only when one is due, so counting often costs nothing that
shows (produce counts per MiB read, not per record). Work that tells nothing until it ends (a
cleanup pass) takes `tick=True`: a thread then redraws its `phase` and the time so far. While a
line is drawn, a WARNING that Python's last-resort handler prints (a CLI sets up no logging)
erases it first. The stream, whether it is a terminal, and the clock can be given (tests).
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from collections.abc import Callable
from types import TracebackType
from typing import TextIO

DRAW_INTERVAL_S = 0.1  # a terminal's line: at most ten redraws a second
PLAIN_FIRST_S = 5.0  # off a terminal: nothing for a run shorter than this
PLAIN_INTERVAL_S = 10.0  # then at most one line this often
_RATE_AFTER_S = 0.5  # a rate over less time than this is noise
_BAR_WIDTH = 30
_MIN_BAR_WIDTH = 10  # narrower than this, the bar is left out rather than squeezed
_DEFAULT_COLUMNS = 80  # a terminal that does not say its width (a fresh pseudo-terminal says 0)
_ERASE_LINE = "\r\033[K"
_TIMING_ROOM = "  999 MB/s  ETA 0:00"  # what the bar leaves room for beside a total's figures


def format_bytes(count: float) -> str:
    """`512 B`, `1.2 kB`, `120 MB`, `3.3 GB`: decimal units, as dd, pv and rsync print them."""
    if count < 1000:
        return f"{count:.0f} B"
    for unit in ("kB", "MB", "GB", "TB"):
        count /= 1000
        if count < 999.5 or unit == "TB":
            break
    return f"{count:.1f} {unit}" if count < 9.95 else f"{count:.0f} {unit}"


def format_duration(seconds: float) -> str:
    """`0:07`, `12:30`, `1:02:03`."""
    whole = int(seconds)
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


class Progress:
    """`with Progress("check", total_bytes) as p: ... p.advance(n)`: see the module docstring.

    `total` is the bytes the work will count (None: not known ahead, as of a pipe); `records`
    shows a count of records beside the bytes. Counting (`advance`) is meant for one thread, the
    one doing the work; drawing is serialised with the ticker thread and the logging hook by one
    lock. After the `with` block nothing more is written."""

    def __init__(
        self,
        label: str,
        total: int | None = None,
        *,
        records: bool = False,
        phase: str = "",
        plain: bool = True,
        quiet: bool = False,
        tick: bool = False,
        stream: TextIO | None = None,
        tty: bool | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.label = label
        self.total = total
        self.done = 0  # bytes
        self.records = 0
        self.phase = phase  # what the work is doing now, shown after the label (set it as it changes)
        self.count_records = records
        self.stream: TextIO = sys.stderr if stream is None else stream
        terminal = self.stream.isatty() if tty is None else tty
        self.enabled = terminal and not quiet  # the line drawn in place
        self.plain = plain and not terminal and not quiet  # the plain lines of long runs
        self.tick = tick
        self._clock = clock
        self._started = clock()
        # When `advance` next writes: at once on a terminal (the first count draws the line), after
        # PLAIN_FIRST_S off one, never when nothing is shown.
        if self.enabled:
            self._due = self._started
        elif self.plain:
            self._due = self._started + PLAIN_FIRST_S
        else:
            self._due = float("inf")
        self._lock = threading.Lock()
        self._drawn = False  # a line is on the terminal now
        self._closed = False
        self._stop = threading.Event()
        self._ticker: threading.Thread | None = None
        self._last_resort: logging.Handler | None = None

    # -- counting ---------------------------------------------------------------------------------
    def advance(self, amount: int = 0, records: int = 0) -> None:
        """Count `amount` more bytes done (and `records` more records); writes a line when one is
        due. Called per segment by check, per file by backup, per chunk read by produce."""
        self.done += amount
        self.records += records
        now = self._clock()
        if now >= self._due:
            self.update(now)

    def update(self, now: float | None = None) -> None:
        """Write what is due at `now` (default: the clock's time): the terminal's line, or a plain
        line off a terminal. Thread-safe."""
        with self._lock:
            now = self._clock() if now is None else now
            if self._closed or now < self._due:
                return
            if self.enabled:
                self._due, self._drawn = now + DRAW_INTERVAL_S, True
                self._write("\r" + self.line(now, self._columns()) + "\033[K")
            elif self.plain:
                self._due = now + PLAIN_INTERVAL_S
                self._write(self.plain_line(now) + "\n")

    # -- what is shown ----------------------------------------------------------------------------
    def line(self, now: float, columns: int = _DEFAULT_COLUMNS) -> str:
        """The terminal's line at `now`, at most `columns - 1` characters (the last column would
        wrap on some terminals). The bar takes the room left beside the figures, the rate and the
        ETA (room kept for those two from the start, so that the bar stays put when they appear),
        up to 30 characters; it is left out on a terminal too narrow for 10."""
        elapsed = now - self._started
        head = f"{self.label}: {self.phase}" if self.phase else self.label
        figures = []
        total = None
        if self.total is not None:
            total = max(self.total, self.done)  # a file that grew while read: no 120%
            figures.append(f"{format_bytes(self.done)} of {format_bytes(total)}")
        elif self.done or self.count_records:
            figures.append(format_bytes(self.done))
        if self.count_records:
            figures.append(f"{self.records:,} records")
        timing = []
        rate = self.done / elapsed if elapsed >= _RATE_AFTER_S and self.done else None
        if rate:
            timing.append(f"{format_bytes(rate)}/s")
        if total is None:
            timing.append(format_duration(elapsed))
        elif rate and self.done < total:
            timing.append(f"ETA {format_duration((total - self.done) / rate)}")
        tail = "".join(f"  {figure}" for figure in figures + timing)
        if total is not None:
            fraction = self.done / max(total, 1)
            tail = f" {fraction:6.1%}{tail}"  # of fixed width, so that the figures after it stay put
            room = columns - 1 - len(head) - len(tail) + sum(len(f"  {t}") for t in timing) - len(_TIMING_ROOM)
            width = min(_BAR_WIDTH, room - 3)  # " [" and "]"
            if width >= _MIN_BAR_WIDTH:
                filled = int(fraction * width)
                head += f" [{'#' * filled}{'.' * (width - filled)}]"
        return (head + tail)[: max(columns - 1, 1)]

    def plain_line(self, now: float) -> str:
        """The line written off a terminal: `produce: 1,234,567 records, 120 MB so far`."""
        pieces = [self.phase] if self.phase else []
        if self.count_records:
            pieces.append(f"{self.records:,} records")
        if self.total is not None:
            total = max(self.total, self.done)
            pieces.append(f"{format_bytes(self.done)} of {format_bytes(total)} ({self.done / max(total, 1):.0%})")
        elif self.done or self.count_records:
            pieces.append(format_bytes(self.done))
        else:
            pieces.append(f"{now - self._started:.0f} s")  # only a phase: say for how long
        return f"{self.label}: {', '.join(pieces)} so far"

    # -- the terminal -----------------------------------------------------------------------------
    def _columns(self) -> int:
        try:
            columns = os.get_terminal_size(self.stream.fileno()).columns
        except (AttributeError, OSError, ValueError):  # no file descriptor (a test's stream), or closed
            columns = 0
        return columns if columns > 0 else _DEFAULT_COLUMNS

    def _write(self, text: str) -> None:
        try:
            self.stream.write(text)
            self.stream.flush()
        except (OSError, ValueError):  # the terminal went away: the work goes on without a line
            self.enabled = self.plain = self._drawn = False
            self._due = float("inf")

    def _erase(self) -> None:
        """Erase the line (the lock held)."""
        if self._drawn:
            self._drawn = False
            self._write(_ERASE_LINE)

    # -- the work's extent ------------------------------------------------------------------------
    def __enter__(self) -> Progress:
        if self.enabled and logging.lastResort is not None:
            # A WARNING printed mid-line would be glued to the line's end: erase the line first.
            self._last_resort = logging.lastResort
            logging.lastResort = _EraseFirst(self, self._last_resort)
        if self.tick and (self.enabled or self.plain):
            self.update()  # on a terminal the phase shows at once; off one, nothing yet
            self._ticker = threading.Thread(target=self._run_ticker, name=f"progress {self.label}", daemon=True)
            self._ticker.start()
        return self

    def _run_ticker(self) -> None:
        while not self._stop.wait(DRAW_INTERVAL_S):
            self.update()

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self._stop.set()
        if self._ticker is not None:
            self._ticker.join()
        with self._lock:
            self._erase()
            self._closed = True
        if self._last_resort is not None:
            logging.lastResort = self._last_resort
            self._last_resort = None


class _EraseFirst(logging.Handler):
    """Python's last-resort handler (how a WARNING reaches stderr when nothing set up logging),
    erasing the progress line before the message; the next update draws the line again."""

    def __init__(self, progress: Progress, inner: logging.Handler) -> None:
        super().__init__(inner.level)
        self.progress = progress
        self.inner = inner

    def emit(self, record: logging.LogRecord) -> None:
        with self.progress._lock:
            self.progress._erase()
            self.inner.emit(record)
