"""The sweep of `lynxtop bench`: warm-up, then one level after another, each summarized and handed on as it
finishes (so Ctrl-C or a server that goes away keeps every finished level), with a progress line.

The first Ctrl-C (`stop` set by the command's signal handler) cancels the requests in flight: that level is
kept and marked partial and no later level starts. A level whose every request could not connect stops the
sweep too: the server is gone, and the next levels would only measure the refusal.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TextIO

from lynxtop.bench_load import Level, LevelRun, Workload, run_level, session
from lynxtop.bench_stats import summarize

Sink = Callable[[dict[str, Any]], None]  # called with each finished level's summary


@dataclass
class SweepResult:
    levels: list[dict[str, Any]] = field(default_factory=list)
    interrupted: bool = False
    server_gone: str = ""  # why the sweep stopped early, when the server stopped answering


class ProgressLine:
    """`c=8  37/64  ETA 12 s` on one rewritten line (a terminal) or a line every few seconds (a log)."""

    def __init__(self, out: TextIO = sys.stderr, every_s: float = 5.0):
        self.out, self.tty, self.every_s = out, out.isatty(), every_s
        self.level, self.total, self.t0, self.last = "", 0, 0.0, 0.0

    def start(self, level: Level, index: int, count: int) -> None:
        self.level = f"level {index}/{count} {level.label}"
        self.total, self.t0, self.last = level.requests, time.monotonic(), 0.0
        self.duration = level.duration_s

    def __call__(self, done: int) -> None:
        now = time.monotonic()
        if now - self.last < (0.2 if self.tty else self.every_s) and done != self.total:
            return
        self.last = now
        el = now - self.t0
        if self.total:
            eta = el / done * (self.total - done) if done else None
            tail = f"{done}/{self.total}  ETA {f'{eta:.0f} s' if eta is not None else '?'}"
        else:
            tail = f"{done} done  {el:.0f}/{self.duration:g} s"
        text = f"{self.level}  {_bar(done, self.total)}{tail}"
        self.out.write(f"\r{text:<78}" if self.tty else text + "\n")
        self.out.flush()

    def end(self) -> None:
        if self.tty:
            self.out.write("\r" + " " * 78 + "\r")
            self.out.flush()


def _bar(done: int, total: int, width: int = 20) -> str:
    if not total:
        return ""
    n = round(done / total * width)
    return "[" + "#" * n + "." * (width - n) + "]  "


async def sweep(wl: Workload, levels: Sequence[Level], *, warmup: int, stop: asyncio.Event, sink: Sink,
                sla: tuple[float | None, float | None] = (None, None), progress: ProgressLine | None = None,
                timeout_s: float = 600.0) -> SweepResult:
    """Run `levels` in order; each summary goes to `sink` as soon as its level ends."""
    out = SweepResult()
    top = max((lv.concurrency or 0) for lv in levels) or 256
    async with session(top + 8, timeout_s) as sess:
        if warmup:
            await run_level(sess, wl, Level(concurrency=min(warmup, top), requests=warmup), stop, offset=10**7)
        for i, level in enumerate(levels, 1):
            if stop.is_set():
                out.interrupted = True
                break
            if progress:
                progress.start(level, i, len(levels))
            run = await run_level(sess, wl, level, stop, progress, offset=i * 100_000)
            if progress:
                progress.end()
            summary = summarize(run, *sla)
            out.interrupted = out.interrupted or run.interrupted
            out.server_gone = _gone(run)
            summary["partial"] = bool(run.interrupted or out.server_gone)
            out.levels.append(summary)
            sink(summary)
            if out.interrupted or out.server_gone:
                break
    return out


def _gone(run: LevelRun) -> str:
    """Why the server counts as gone after this level ('' while it answers)."""
    if run.results and run.results[-1].unreachable:  # workers stop at a refusal: the level ended on one
        return run.results[-1].error
    return ""
