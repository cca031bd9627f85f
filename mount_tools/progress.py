"""A progress bar on stderr, shown only when stderr is a terminal."""

from __future__ import annotations

import sys
import time
from types import TracebackType


class Progress:
    """`with Progress("checking", total_bytes) as p: ... p.advance(n)`; silent off a terminal."""

    def __init__(self, label: str, total: int) -> None:
        self.label = label
        self.total = max(total, 1)
        self.done = 0
        self.enabled = sys.stderr.isatty()
        self._last_draw = 0.0

    def __enter__(self) -> Progress:
        return self

    def advance(self, amount: int) -> None:
        self.done += amount
        now = time.monotonic()
        if self.enabled and now - self._last_draw > 0.1:
            self._last_draw = now
            self._draw()

    def _draw(self) -> None:
        fraction = min(self.done / self.total, 1.0)
        width = 30
        filled = int(fraction * width)
        sys.stderr.write(f"\r{self.label} [{'#' * filled}{'.' * (width - filled)}] {fraction:6.1%}")
        sys.stderr.flush()

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        if self.enabled:
            sys.stderr.write("\r\033[K")
            sys.stderr.flush()
