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

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    Task,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.progress_bar import ProgressBar
from rich.text import Text

from lynxtop.cli.bench_load import Level, LevelRun, Workload, run_level, streams
from lynxtop.cli.bench_stats import summarize

Sink = Callable[[dict[str, Any]], None]  # called with each finished level's summary


class LevelHook:
    """Work around each level outside its timed window (the --save-result files): `before` runs just before
    the level starts, `after` once it is summarized, with its requests."""

    async def before(self) -> None:
        return None

    async def after(self, run: LevelRun, summary: dict[str, Any]) -> None:
        return None


@dataclass
class SweepResult:
    levels: list[dict[str, Any]] = field(default_factory=list)
    interrupted: bool = False
    server_gone: str = ""  # why the sweep stopped early, when the server stopped answering


class ProgressLine:
    """Where a sweep stands: on a terminal, rich's progress with one row per level (a finished level stays as
    a completed row, so the whole sweep stays in view); in a log, a plain line every few seconds.

    Call `close()` when the sweep ends, however it ends (a finally): it stops rich's live display, which would
    otherwise leave the cursor hidden and the last frame half drawn after a second Ctrl-C.
    """

    def __init__(self, out: TextIO = sys.stderr, every_s: float = 5.0, console: Console | None = None,
                 clock: Callable[[], float] = time.monotonic, tty: bool | None = None):
        self.out, self.every_s, self.clock = out, every_s, clock  # clock: a test's, to see 12 s of 30 at once
        # tty: the caller's say (bench: stdout AND stderr are terminals; `bench > log` must get no redraws)
        self.tty = tty if tty is not None else console.is_terminal if console is not None else out.isatty()
        self.level, self.total, self.t0, self.last = "", 0, 0.0, 0.0
        self.duration: float | None = None
        self._console = console
        self._rich: Progress | None = None  # started at the first level, on a terminal only
        self._task: TaskID | None = None

    def start(self, level: Level, index: int, count: int) -> None:
        self.level = f"level {index}/{count} {level.label}"
        self.total, self.t0, self.last = level.requests, self.clock(), 0.0
        self.duration = level.duration_s
        if self.tty:
            self._start_row()

    def __call__(self, done: int) -> None:
        if self._rich is not None and self._task is not None:
            if self.total:
                self._rich.update(self._task, completed=done)
            else:  # the row's bar and clock follow time on their own (_timed); only the count is news
                self._rich.update(self._task, done=done)
            return
        now = self.clock()
        if self.tty or (now - self.last < self.every_s and done != self.total):
            return  # a terminal draws only through rich's rows (none before the first level)
        self.last = now
        el = now - self.t0
        if self.total:
            eta = el / done * (self.total - done) if done else None
            tail = f"{done}/{self.total}  ETA {f'{eta:.0f} s' if eta is not None else '?'}"
        else:
            tail = f"{done} done  {el:.0f}/{self.duration:g} s"
        text = f"{self.level}  {_bar(done, self.total)}{tail}"
        self.out.write(text + "\n")
        self.out.flush()

    def end(self) -> None:
        """The level is over: its row stays, its clock stops (an interrupted level keeps its partial count)."""
        if self._rich is None or self._task is None:
            return
        task = self._rich.tasks[self._task]
        if task.fields.get("timed"):
            self._rich.update(self._task, completed=_timed(task))
        self._rich.stop_task(self._task)
        self._task = None

    def close(self) -> None:
        """Stop the live display, leaving every level's row printed and the terminal as it was; idempotent."""
        if self._rich is not None:
            self.end()
            self._rich.stop()
            self._rich = None

    def _start_row(self) -> None:
        if self._rich is None:
            # rich comes with textual (a dependency), so it needs no line of its own in pyproject
            console = self._console or (Console(stderr=True) if self.out is sys.stderr else Console(file=self.out))
            self._rich = Progress(TextColumn("{task.description}"), _Bar(), _Count(), TimeElapsedColumn(),
                                  _Remaining(), console=console, refresh_per_second=4, get_time=self.clock)
            self._rich.start()
        self.end()  # a level the sweep did not end (it always does; this keeps one live row at most)
        timed = not self.total
        self._task = self._rich.add_task(self.level, total=(self.duration or 0) if timed else self.total,
                                         timed=timed, done=0)


def _timed(task: Task) -> float:
    """How far a duration-bound level is: its elapsed seconds, up to its duration."""
    return min(task.elapsed or 0.0, task.total or 0.0)


class _Bar(BarColumn):
    """The bar; a duration-bound level's fills with time, not with finished requests."""

    def render(self, task: Task) -> ProgressBar:
        bar = super().render(task)
        if task.fields.get("timed"):
            bar.completed = _timed(task)
        return bar


class _Count(MofNCompleteColumn):
    """`37/64` requests; a duration-bound level has no request total: `120 done  12/30 s` instead."""

    def render(self, task: Task) -> Text:
        if task.fields.get("timed"):
            return Text(f"{task.fields['done']} done  {_timed(task):.0f}/{task.total or 0:g} s",
                        style="progress.download")
        return super().render(task)


class _Remaining(TimeRemainingColumn):
    """rich's estimate for a level of requests; a duration-bound level's remaining time is known exactly."""

    def render(self, task: Task) -> Text:
        if task.fields.get("timed"):
            left = max(0, int((task.total or 0) - _timed(task)))
            return Text(f"{left // 3600:d}:{left // 60 % 60:02d}:{left % 60:02d}", style="progress.remaining")
        return super().render(task)


def _bar(done: int, total: int, width: int = 20) -> str:
    if not total:
        return ""
    n = round(done / total * width)
    return "[" + "#" * n + "." * (width - n) + "]  "


async def sweep(wl: Workload, levels: Sequence[Level], *, warmup: int, stop: asyncio.Event, sink: Sink,
                sla: tuple[float | None, float | None] = (None, None), progress: ProgressLine | None = None,
                timeout_s: float = 600.0, hook: LevelHook | None = None) -> SweepResult:
    """Run `levels` in order; each summary goes to `sink` as soon as its level ends."""
    out = SweepResult()
    top = max((lv.concurrency or 0) for lv in levels) or 256
    async with streams(wl.url, timeout_s) as pool:
        if warmup:
            await run_level(pool, wl, Level(concurrency=min(warmup, top), requests=warmup), stop, offset=10**7)
        for i, level in enumerate(levels, 1):
            if stop.is_set():
                out.interrupted = True
                break
            if hook:
                await hook.before()
            if progress:
                progress.start(level, i, len(levels))
            run = await run_level(pool, wl, level, stop, progress, offset=i * 100_000)
            if progress:
                progress.end()
            summary = summarize(run, *sla)
            out.interrupted = out.interrupted or run.interrupted
            out.server_gone = _gone(run)
            summary["partial"] = bool(run.interrupted or out.server_gone or run.error)
            out.levels.append(summary)
            sink(summary)
            if hook:
                await hook.after(run, summary)
            if out.interrupted or out.server_gone:
                break
    return out


def _gone(run: LevelRun) -> str:
    """Why the server counts as gone after this level ('' while it answers)."""
    if run.results and run.results[-1].unreachable:  # workers stop at a refusal: the level ended on one
        return run.results[-1].error
    return ""
