"""vLLM's log line format, so log parsers written against real vLLM work unchanged on the simulator.

Real lines look like `INFO 12-02 15:40:01 [gpu_model_runner.py:1892] Loading weights took 12.31 seconds`,
with `(EngineCore_DP0 pid=1234) ` in front when the EngineCore process prints them.

Log lines go through vLLM's `logging` handlers, which swallow a failed write (`log`); its progress bars do not
(`Bar`): tqdm writes to stderr itself and re-raises the OSError, so on a full log disk a load dies (exit 1).
"""

from __future__ import annotations

import sys
import time


def format_line(level: str, source: str, message: str, prefix: str = "") -> str:
    return f"{prefix}{level} {time.strftime('%m-%d %H:%M:%S')} [{source}] {message}"


def log(level: str, source: str, message: str, prefix: str = "") -> None:
    """Whole lines, flushed at once: two processes share the same log pipe."""
    text = "\n".join(format_line(level, source, m, prefix) for m in message.split("\n"))
    try:
        sys.stdout.write(text + "\n")
        sys.stdout.flush()
    except (OSError, ValueError):
        pass  # the log is gone or full (ENOSPC): keep serving, as vLLM's logging handlers do


def raw(lines: str) -> None:
    """Traceback-style text (no prefix), as Python prints an uncaught exception."""
    try:
        sys.stdout.write(lines.rstrip("\n") + "\n")
        sys.stdout.flush()
    except (OSError, ValueError):
        pass


class Bar:
    """A tqdm progress bar as vLLM draws it on a file: `\r` + vLLM's bar_format (ending in a newline) per
    update, on stderr, unprefixed. A failed write raises (OSError: ENOSPC on a full log disk), as tqdm's does."""

    def __init__(self, desc: str, total: int):
        self.desc, self.total = desc, max(total, 1)
        self.t0 = time.monotonic()
        self.shown: int | None = None

    def show(self, n: int) -> None:
        """Draw the bar at `n` done (once per value: tqdm redraws at most every 0.1 s)."""
        n = min(max(n, 0), self.total)
        if n == self.shown:
            return
        self.shown = n
        sys.stderr.write("\r" + self.line(n, time.monotonic() - self.t0) + "\n")
        sys.stderr.flush()

    def close(self) -> None:
        """tqdm's close on a file: the bar left as it is, and a newline (an empty line in the log)."""
        sys.stderr.write("\n")
        sys.stderr.flush()

    def line(self, n: int, elapsed: float) -> str:
        """`{desc}: {percentage:3.0f}% Completed | {n_fmt}/{total_fmt} [{elapsed}<{remaining}, {rate_fmt}]`."""
        rate = n / elapsed if n and elapsed > 0 else None
        if rate is None:
            remaining, rate_fmt = "?", "?it/s"
        else:
            remaining = _clock((self.total - n) / rate)
            rate_fmt = f"{1 / rate:5.2f}s/it" if rate < 1 else f"{rate:5.2f}it/s"
        return (f"{self.desc}: {100 * n / self.total:3.0f}% Completed | {n}/{self.total} "
                f"[{_clock(elapsed)}<{remaining}, {rate_fmt}]")


def _clock(seconds: float) -> str:
    m, s = divmod(int(seconds), 60)
    return f"{m:02d}:{s:02d}" if m < 60 else f"{m // 60:d}:{m % 60:02d}:{s:02d}"
