"""Issue 28's walk-through in a real terminal: the `lynxtop` console script in tmux at 80x24 and 160x48 against
`lynxtop demo --no-tui`, driven with send-keys and read with capture-pane. Every view by its key, with its
title and a key bar whose labels are whole; then the log follows (and stops on scroll up, End resumes), the
Processes view lists the simulated vLLM workers, `s` sorts the GPU table, `/` narrows the events, and the
command palette (`:` and ctrl+p) runs a command by name."""

from __future__ import annotations

import os
import re

import pytest
from support.captures import SCREENS, TMUX, Terminal, dashboard, demo_node
from support.real import unavailable

pytestmark = [pytest.mark.timeout(300)]

# Every label a key bar may show, whole ("S Start", never "S Star…").
LABELS = ["⏎ Open GPU", "e Engines", "q Quit", "? Help", "1234567 views", "R Restart", "X Stop", "S Start",
          "P Switch", "← Prev GPU", "→ Next GPU", "t Range", "c Compare", "e Export CSV", "/ Filter runs",
          "/ Filter/search", "K Kind", "v Severity", "[] run log", "f Follow", "/ Search", "n Next match",
          "N Prev match", "N Cluster view", "L Load +/-"]
SCROLLBAR = " ▁▂▃▄▅▆▇█▉▊▋▌▍▎▏"
# Each view: its key and what says it is drawn (its title line or its own column names).
VIEWS = [(key, marker) for _, key, marker in SCREENS]


@pytest.fixture(scope="module")
def node():
    if not os.path.exists(TMUX):
        unavailable(f"{TMUX} not installed (apt-get install -y tmux)")
    with demo_node(duration_s=240) as state:
        yield state


def key_bar(screen: str) -> str:
    """The key bar: the last row, and the one above it when that row too is made only of key labels."""
    rows = screen.rstrip("\n").split("\n")
    bar = [rows[-1]]
    above = rows[-2] if len(rows) > 1 else ""
    if above.strip() and not _leftover(above).strip():
        bar.insert(0, above)
    return "\n".join(bar)


def _leftover(text: str) -> str:
    for label in sorted(LABELS, key=len, reverse=True):
        text = text.replace(label, "")
    return text


def check_key_bar(screen: str, view: str) -> None:
    bar = key_bar(screen)
    assert "…" not in bar, f"view {view}: a key cut in the bar:\n{bar}"
    assert "? Help" in bar and "q Quit" in bar, f"view {view}: help or quit missing from the bar:\n{bar}"
    assert not _leftover(bar).strip(), f"view {view}: the bar shows a part of a label: {_leftover(bar)!r}\n{bar}"


def log_body(screen: str) -> list[str]:
    """The log's lines on screen: below the title's rule, above the key bar (the header's timer left out), without
    the scrollbar, whose thumb shrinks as lines come."""
    rows = screen.rstrip("\n").split("\n")
    start = next(i for i, r in enumerate(rows) if r.startswith("─")) + 1
    return [r.rstrip(SCROLLBAR) for r in rows[start:-2]]


def events_count(screen: str) -> tuple[int, int]:
    m = re.search(r"events (\d+)/(\d+)", screen)
    assert m, screen
    return int(m[1]), int(m[2])


def walk_views(term: Terminal, size: str) -> None:
    for key, title in VIEWS:
        term.keys(key)
        screen = term.wait(title, f"view {key}'s title at {size}")
        assert "SIMULATED" in screen.split("\n")[0], screen
        check_key_bar(screen, f"{key} at {size}")


def check_log_follows(term: Terminal) -> None:
    term.keys("6")
    screen = term.wait("● following", "the log following")
    # a new line of the demo's vLLM log (its stats line every 10 s) comes without a key
    before = log_body(screen)
    term.wait(lambda s: log_body(s) != before and "● following" in s, "a new log line while following", 30)
    term.keys("PageUp")
    screen = term.wait("not following", "scrolling up stops following")
    held = log_body(screen)
    # a line arriving now is counted in the title and does not move what is on screen
    screen = term.wait(lambda s: re.search(r"not following \([1-9]\d* new below", s) is not None,
                       "a new line counted below", 30)
    # (a log shorter than the view may show it in the empty rows below: the lines shown stay where they were)
    now = log_body(screen)
    assert [n for n, h in zip(now, held, strict=True) if h] == [h for h in held if h], "the view moved"
    term.keys("End")
    screen = term.wait("● following", "End follows again")
    assert log_body(screen) != held


def check_processes(term: Terminal) -> None:
    term.keys("7")
    screen = term.wait(lambda s: all(f"VLLM::Worker_TP{i}" in s for i in range(8)), "the 8 simulated workers")
    assert "8 processes on 8 GPUs" in screen and "vLLM run" in screen


def gpu_rows(screen: str) -> list[tuple[int, int]]:
    """(GPU, SM activity %) of each row of the Node view's GPU table, top to bottom."""
    rows = re.findall(r"^ (\d)(?: H\w+)?  +\D*?(\d+)%", screen, re.M)[:8]  # 160 columns name the model
    return [(int(g), int(sm)) for g, sm in rows]


def check_sort(term: Terminal) -> None:
    term.keys("1")
    screen = term.wait(lambda s: len(gpu_rows(s)) == 8, "the GPU table")
    assert "SM act▼" not in screen and [g for g, _ in gpu_rows(screen)] == list(range(8))  # GPU order
    term.keys("s")  # the next column: SM activity, busiest first
    screen = term.wait(lambda s: "SM act▼" in s and len(gpu_rows(s)) == 8, "the SM activity sort mark")
    sm = [v for _, v in gpu_rows(screen)]
    assert sm == sorted(sm, reverse=True), screen
    term.keys("I")
    screen = term.wait(lambda s: "SM act▲" in s and len(gpu_rows(s)) == 8, "the inverted sort mark")
    sm = [v for _, v in gpu_rows(screen)]
    assert sm == sorted(sm), screen


def check_events_filter(term: Terminal) -> None:
    term.keys("5")
    screen = term.wait(lambda s: "serving.ready" in s and re.search(r"events \d+/\d+", s) is not None, "the events")
    shown, total = events_count(screen)
    assert shown == total > 1
    term.keys("/")
    term.wait(lambda s: "filter events:" in s and "┏" in s, "the filter box, focused")  # heavy border: has the keys
    term.keys("-l", "ready")
    term.keys("Enter")
    screen = term.wait(lambda s: events_count(s)[0] < total, "the filter narrowing the events")
    assert "serving.ready" in screen and "serving.starting" not in screen
    term.keys("Escape")
    # every event again (filters are read in SQL: a filtered read's count is its own, so shown == read holds at once)
    term.wait(lambda s: events_count(s)[0] == events_count(s)[1] >= total and "text:" not in s,
              "Escape clearing the filter")


def check_palette(term: Terminal) -> None:
    for opener in (":", "C-p"):
        term.keys("1")
        term.wait("util* = NVML")
        term.keys(opener)
        term.wait("Search for commands", f"the palette opened by {opener}")
        term.keys("-l", "processes view")
        term.wait(lambda s: _first_command(s) == "Processes view", "the command first in the palette's list")
        term.keys("Enter")
        term.wait("processes on", f"the palette ({opener}) running 'Processes view'")


def _first_command(screen: str) -> str | None:
    """The palette's first listed command once the whole query is typed (Enter runs the highlighted one)."""
    rows = screen.split("\n")
    at = next((i for i, r in enumerate(rows) if "🔎 processes view" in r), None)
    if at is None:
        return None
    return next((r.strip() for r in rows[at + 1:] if r.strip()), None)


@pytest.mark.parametrize("size", [(80, 24), (160, 48)], ids=["80x24", "160x48"])
def test_walk_every_view_and_its_keys(node, size):
    width, height = size
    with dashboard(node, width, height) as term:
        term.wait("READY", "the node serving", timeout_s=60)
        walk_views(term, f"{width}x{height}")
        check_processes(term)
        check_sort(term)
        check_events_filter(term)
        check_palette(term)
        check_log_follows(term)
