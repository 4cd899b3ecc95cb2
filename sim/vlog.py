"""vLLM's log line format, so log parsers written against real vLLM work unchanged on the simulator.

Real lines look like `INFO 12-02 15:40:01 [gpu_model_runner.py:1892] Loading weights took 12.31 seconds`,
with `(EngineCore_DP0 pid=1234) ` in front when the EngineCore process prints them.
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
