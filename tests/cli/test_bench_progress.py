"""`lynxtop bench`'s progress: rich's rows on a terminal (one per level, kept when the level ends, the terminal
restored at close, a second Ctrl-C included) and the plain lines of a log, which must not change."""

from __future__ import annotations

import io
import re

from rich.console import Console

from lynxtop.cli.bench_load import Level
from lynxtop.cli.bench_sweep import ProgressLine

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
HIDE, SHOW = "\x1b[?25l", "\x1b[?25h"


class Clock:
    """A clock the test moves, so rich's elapsed and remaining columns show known values."""

    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def terminal() -> tuple[Console, io.StringIO]:
    buf = io.StringIO()
    return Console(file=buf, force_terminal=True, width=100), buf


def last_frame(raw: str) -> list[str]:
    """The rows of the frame left on screen at close (each redraw first erases the rows of the one before)."""
    frame = re.split(r"\r\x1b\[2K(?:\x1b\[1A\x1b\[2K)*", raw)[-1]
    return [line.strip() for line in ANSI.sub("", frame).splitlines() if line.strip()]


def test_terminal_rows_per_level_with_counts_elapsed_and_remaining() -> None:
    console, buf = terminal()
    clock = Clock()
    p = ProgressLine(console=console, clock=clock)
    assert p.tty
    p.start(Level(concurrency=8, requests=64), 1, 2)
    for done in range(1, 65):  # one request a second
        clock.t += 1
        p(done)
    p.end()
    p.start(Level(concurrency=16, requests=32), 2, 2)
    for done in range(1, 17):
        clock.t += 1
        p(done)
    p.end()
    p.close()
    rows = last_frame(buf.getvalue())
    assert len(rows) == 2, rows  # the finished level stays as a row of its own
    first, second = rows
    assert first.startswith("level 1/2 c=8") and "64/64" in first
    assert "0:01:04" in first and first.endswith("0:00:00")  # elapsed 64 s, nothing left
    assert second.startswith("level 2/2 c=16") and "16/32" in second
    assert "0:00:16 0:00:16" in second  # 16 s elapsed; at 1 request/s, 16 left take 16 s
    raw = buf.getvalue()
    assert HIDE in raw and raw.rindex(SHOW) > raw.rindex(HIDE)  # the cursor is back


def test_terminal_duration_level_shows_elapsed_against_duration() -> None:
    console, buf = terminal()
    clock = Clock()
    p = ProgressLine(console=console, clock=clock)
    p.start(Level(concurrency=4, duration_s=30), 1, 1)
    clock.t += 12
    p(5)
    p.end()
    p.close()
    (row,) = last_frame(buf.getvalue())
    assert row.startswith("level 1/1 c=4")
    assert "5 done  12/30 s" in row and "0:00:12" in row and row.endswith("0:00:18")


def test_close_without_end_keeps_the_partial_row_and_restores_the_terminal() -> None:
    """A second Ctrl-C cancels the sweep mid-level: bench's finally calls close() alone."""
    console, buf = terminal()
    p = ProgressLine(console=console, clock=Clock())
    p.start(Level(concurrency=8, requests=64), 1, 3)
    p(3)
    p.close()
    p.close()  # idempotent
    (row,) = last_frame(buf.getvalue())
    assert row.startswith("level 1/3 c=8") and " 3/64" in row
    raw = buf.getvalue()
    assert raw.rindex(SHOW) > raw.rindex(HIDE)


def test_log_gets_the_plain_lines_unchanged() -> None:
    out, clock = io.StringIO(), Clock()
    p = ProgressLine(out=out, every_s=5.0, clock=clock)
    assert not p.tty
    p.start(Level(concurrency=8, requests=64), 1, 2)
    for done in range(1, 65):  # a request every half second: a line at most every 5 s, and the last
        clock.t += 0.5
        p(done)
    p.end()
    p.start(Level(concurrency=4, duration_s=30), 2, 2)
    clock.t += 12
    p(7)
    p.end()
    p.close()
    lines = out.getvalue().splitlines()
    assert lines[0] == "level 1/2 c=8  [" + "." * 20 + "]  1/64  ETA 32 s"
    assert lines[1] == "level 1/2 c=8  [###.................]  11/64  ETA 26 s"  # 5 s later
    assert lines[-2] == "level 1/2 c=8  [####################]  64/64  ETA 0 s"  # the last, at once
    assert len(lines) == 7 + 1 + 1  # 1, 11, ... 61 (5 s apart), then 64; then level 2
    assert lines[-1] == "level 2/2 c=4  7 done  12/30 s"
    assert "\x1b" not in out.getvalue() and "\r" not in out.getvalue()
