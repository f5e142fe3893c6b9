"""A progress bar on stderr while the benchmark runs (plain lines when not a terminal)."""

from __future__ import annotations

import sys
import time
from typing import TextIO

WIDTH = 30


class Bar:
    """``[#####-----]  12/40  clean · kinbox-batch · rep 2  (3m10s)``.

    Args:
        total: how many runs the plan holds.
        stream: where to draw (stderr).
    """

    def __init__(self, total: int, stream: TextIO | None = None) -> None:
        self.total = max(1, total)
        self.done = 0
        self.label = ""
        self._fraction = 0.0
        self._stream = stream or sys.stderr
        self._tty = self._stream.isatty()
        self._started = time.monotonic()
        self._drawn = 0.0

    def begin(self, label: str) -> None:
        """A run starts."""
        self.label, self._fraction = label, 0.0
        if not self._tty:
            print(f"[{self.done + 1}/{self.total}] {label} ...", file=self._stream, flush=True)
        self._draw(force=True)

    def update(self, fraction: float) -> None:
        """The run in progress is ``fraction`` done."""
        self._fraction = min(1.0, max(0.0, fraction))
        self._draw()

    def end(self) -> None:
        """The run finished (passed or failed)."""
        self.done += 1
        self._fraction = 0.0
        self._draw(force=True)

    def say(self, line: str) -> None:
        """Print a line above the bar."""
        if self._tty:
            self._stream.write("\r\x1b[2K")
        print(line, file=self._stream, flush=True)
        self._draw(force=True)

    def close(self) -> None:
        """Leave the terminal on a fresh line."""
        if self._tty:
            self._stream.write("\r\x1b[2K")
            self._stream.flush()

    def _draw(self, force: bool = False) -> None:
        now = time.monotonic()
        if not self._tty or (not force and now - self._drawn < 0.2):
            return
        self._drawn = now
        share = (self.done + self._fraction) / self.total
        filled = round(WIDTH * share)
        elapsed = int(now - self._started)
        self._stream.write(
            f"\r\x1b[2K[{'#' * filled}{'-' * (WIDTH - filled)}] {self.done}/{self.total}"
            f"  {self.label}  ({elapsed // 60}m{elapsed % 60:02d}s)"
        )
        self._stream.flush()
