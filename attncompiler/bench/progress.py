"""A one-line progress bar on stderr (no dependency): done/total, percent, elapsed, ETA, current item.

On a terminal the line is redrawn in place; otherwise (a log file, the device tool's captured
output) a full line is written every ``log_every_pct`` percent or ``log_every_s`` seconds, so a log
holds a handful of lines instead of one per step.
"""
from __future__ import annotations

import sys
import time
from typing import Callable, TextIO

__all__ = ["Progress", "format_seconds"]


def format_seconds(s: float) -> str:
    """``75`` -> ``"1m15s"``, ``9.5`` -> ``"9.5s"``."""
    if s != s or s < 0:  # NaN
        return "?"
    if s < 60:
        return f"{s:.1f}s" if s < 10 else f"{s:.0f}s"
    m, sec = divmod(int(round(s)), 60)
    return f"{m}m{sec:02d}s"


class Progress:
    """``p = Progress(total, "forward"); p.step("d=128 N=4096 v2"); ...; p.close()``."""

    def __init__(self, total: int, label: str = "bench", *, stream: TextIO | None = None, enabled: bool = True,
                 width: int = 24, tty: bool | None = None, log_every_pct: float = 10.0, log_every_s: float = 30.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.total = max(0, int(total))
        self.label = label
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = enabled
        self.width = width
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)()) if tty is None else tty
        self.log_every_pct = log_every_pct
        self.log_every_s = log_every_s
        self.clock = clock
        self.t0 = clock()
        self.done = 0
        self._last_pct = -1e9
        self._last_t = self.t0
        self._closed = False

    def render(self, text: str = "") -> str:
        """The bar as a string (no I/O)."""
        frac = self.done / self.total if self.total else 1.0
        fill = int(round(frac * self.width))
        el = self.clock() - self.t0
        eta = el / self.done * (self.total - self.done) if self.done else float("nan")
        bar = "#" * fill + "-" * (self.width - fill)
        line = (f"[{self.label}] |{bar}| {self.done}/{self.total} {100 * frac:3.0f}% "
                f"{format_seconds(el)} eta {format_seconds(eta)}")
        return f"{line}  {text}" if text else line

    def step(self, text: str = "", n: int = 1) -> None:
        """Advance by ``n`` and show ``text`` (what was just done or comes next)."""
        self.done = min(self.total, self.done + n) if self.total else self.done + n
        if not self.enabled:
            return
        if self.tty:
            self.stream.write("\r" + self.render(text[:60]).ljust(110))
            self.stream.flush()
            return
        pct = 100 * self.done / self.total if self.total else 100.0
        now = self.clock()
        if pct - self._last_pct >= self.log_every_pct or now - self._last_t >= self.log_every_s \
                or self.done == self.total:
            self._last_pct, self._last_t = pct, now
            self.stream.write(self.render(text[:80]) + "\n")
            self.stream.flush()

    def close(self, text: str = "done") -> None:
        if self._closed or not self.enabled:
            self._closed = True
            return
        self._closed = True
        if self.tty:
            self.stream.write("\r" + self.render(text).ljust(110) + "\n")
        elif self.done != self.total or self.total == 0:
            self.stream.write(self.render(text) + "\n")
        self.stream.flush()
