"""The dashboard on the terminals operators have: a slow SSH link (an idle node sends nothing), a C/Latin-1 locale
(ASCII drawing by default), a monochrome terminal (no state told by colour alone), and the compact GPU table."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from support.status import GIB, gpu_row, make_status
from support.tui import make_app, screen_text, wait_for
from support.tui_keys import open_screen

from lynxtop.tui.app import ascii_default
from lynxtop.tui.screens.gpu import GpuScreen
from lynxtop.tui.screens.latency import LatencyScreen
from lynxtop.tui.screens.logs import LogsScreen
from lynxtop.tui.widgets.gpu_table import GpuTable
from lynxtop.tui.widgets.node_header import NodeHeader
from lynxtop.tui.widgets.outage_banner import OutageBanner
from lynxtop.tui.widgets.serving_panel import ServingPanel

REPO = Path(__file__).resolve().parents[2]


def _status_polls(agent: Any) -> int:
    return len([r for r in agent.requests if "status" in r[1]])


async def _bytes_per_idle_poll(app: Any, pilot: Any, agent: Any, polls: int = 6) -> tuple[float, set[str]]:
    """Bytes the app sends to the terminal per status poll while `polls` polls come in, and the screens shown."""
    from textual._compositor import CompositorUpdate

    seen: dict[str, Any] = {"bytes": 0, "texts": set()}
    orig = app._display

    def display(screen: Any, renderable: Any) -> Any:
        if isinstance(renderable, CompositorUpdate):
            seen["bytes"] += len(renderable.render_segments(app.console))
            seen["texts"].add(screen_text(app))
        return orig(screen, renderable)

    app._display = display
    try:
        start = _status_polls(agent)
        await wait_for(pilot, lambda: _status_polls(agent) - start >= polls)
        await pilot.pause()
    finally:
        app._display = orig
    return seen["bytes"] / polls, seen["texts"]


# ------------------------------------------------------------------------------------------ 1. idle redraws

@pytest.mark.parametrize("size", [(80, 24), (160, 48)])
async def test_idle_node_view_sends_nothing(agent, size):
    """The same status every poll and the clock frozen: the Node view (header, serving panel, GPU table, and on a
    tall terminal the per-GPU trends and recent events) sends next to nothing (it re-sent 4-12 KB per poll)."""
    app = make_app(agent.socket_path)
    async with app.run_test(size=size) as pilot:
        await wait_for(pilot, lambda: app.screen.query_one(GpuTable).row_count == 8)
        await pilot.pause(1.0)
        per_poll, texts = await _bytes_per_idle_poll(app, pilot, agent)
        assert len(texts) <= 1, "the screen changed: this test wants an idle node"
        assert per_poll < 300, f"{per_poll:.0f} bytes sent per idle poll at {size}"


@pytest.mark.parametrize(("key", "screen"), [("2", GpuScreen), ("3", LatencyScreen), ("6", LogsScreen)])
async def test_idle_other_views_send_nothing(agent, key, screen):
    app = make_app(agent.socket_path)
    async with app.run_test(size=(160, 48)) as pilot:
        await open_screen(pilot, app, key, screen)
        await pilot.pause(1.0)
        per_poll, texts = await _bytes_per_idle_poll(app, pilot, agent)
        assert len(texts) <= 1, "the screen changed: this test wants an idle node"
        assert per_poll < 300, f"{per_poll:.0f} bytes sent per idle poll in {screen.__name__}"


async def test_a_change_after_idle_polls_is_still_drawn(agent):
    """The guard compares what is drawn with what would be: a changed reading, a new SLA state and a new
    title still reach the screen after idle polls (and the size of what is sent stays small: only what changed)."""
    app = make_app(agent.socket_path)
    async with app.run_test(size=(160, 48)) as pilot:
        await wait_for(pilot, lambda: app.screen.query_one(GpuTable).row_count == 8)
        await _bytes_per_idle_poll(app, pilot, agent, polls=3)
        rows = [gpu_row(i) for i in range(8)]
        rows[3]["temp_c"] = 77
        agent.status = make_status(gpu_rows=rows, sla={"state": "breach", "ttft_p99_ms": 3000.0})
        await wait_for(pilot, lambda: "77°C" in screen_text(app) and "BREACH" in screen_text(app))
        await pilot.press("2")
        await wait_for(pilot, lambda: isinstance(app.screen, GpuScreen) and "GPU 0" in screen_text(app))
        await pilot.press("right")
        await wait_for(pilot, lambda: "GPU 1 " in screen_text(app))


# ------------------------------------------------------------------------------------------ 2. the locale

@pytest.mark.parametrize(("env", "codeset", "want"), [
    ({"LC_ALL": "C", "LANG": "en_US.UTF-8"}, "ANSI_X3.4-1968", True),  # LC_ALL wins over LANG
    ({"LANG": "C"}, "ANSI_X3.4-1968", True),
    ({}, "ANSI_X3.4-1968", True),
    ({"LANG": "de_DE.ISO-8859-1"}, "ISO-8859-1", True),
    ({"LANG": "en_US.UTF-8"}, "UTF-8", False),
    ({"LC_CTYPE": "en_US.utf8", "LANG": "C"}, "ANSI_X3.4-1968", False),  # the name says UTF-8, not installed
    ({"LANG": "C"}, "UTF-8", False),  # a C locale that is UTF-8 (musl)
    ({"LC_ALL": "C", "LYNXTOP_ASCII": "0"}, "ANSI_X3.4-1968", False),
    ({"LANG": "en_US.UTF-8", "LYNXTOP_ASCII": "1"}, "UTF-8", True),
])
def test_ascii_default_follows_the_locale(env, codeset, want):
    assert ascii_default(env, codeset=codeset, coerced=False) is want


def test_coerced_c_locale_is_read_as_the_operator_set_it():
    """Python coerces LANG=C to LC_CTYPE=C.UTF-8 at its start: the coerced name and codeset are not the
    terminal's. A coerced environment with LANG=C is ASCII; an operator's own C.UTF-8 is not."""
    assert ascii_default({"LANG": "C", "LC_CTYPE": "C.UTF-8"}, codeset="UTF-8", coerced=True) is True
    assert ascii_default({"LC_CTYPE": "C.UTF-8"}, codeset="UTF-8", coerced=False) is False


def _default_in_subprocess(env: dict[str, str]) -> str:
    """The default as a real interpreter started with exactly `env` decides it (Python's coercion included)."""
    code = "from lynxtop.tui.app import ascii_default; print(ascii_default())"
    full = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), **env}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=full, cwd=REPO)
    assert r.returncode == 0, r.stderr[-800:]
    return r.stdout.strip()


@pytest.mark.parametrize(("env", "want"), [
    ({"LANG": "C"}, "True"),  # coerced to C.UTF-8 by Python: still the operator's C
    ({"LC_ALL": "C"}, "True"),
    ({}, "True"),
    ({"LANG": "C.UTF-8"}, "False"),
    ({"LC_CTYPE": "C.UTF-8"}, "False"),
    ({"LANG": "C", "LYNXTOP_ASCII": "0"}, "False"),
])
def test_ascii_default_in_a_real_interpreter(env, want):
    assert _default_in_subprocess(env) == want


async def test_c_locale_switches_the_dashboard_to_ascii(agent, monkeypatch):
    for var in ("LANG", "LC_ALL", "LC_CTYPE"):
        monkeypatch.setenv(var, "C")
    monkeypatch.delenv("LYNXTOP_ASCII", raising=False)
    app = make_app(agent.socket_path, ascii_only=None)  # decided by the environment
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_for(pilot, lambda: app.screen.query_one(GpuTable).row_count == 8)
        assert app.ascii_only
        bad = sorted({c for c in screen_text(app) if ord(c) > 127} - set("│┃─━╭╮╰╯▁▂▃▄▅▆▇█"))
        assert app.ascii_only and not [c for c in bad if c in "✗✓⚠≤°×▲▼"], bad


async def test_utf8_locale_keeps_the_glyphs(agent, monkeypatch):
    monkeypatch.setenv("LANG", "C.UTF-8")
    monkeypatch.delenv("LC_ALL", raising=False)
    monkeypatch.delenv("LC_CTYPE", raising=False)
    monkeypatch.delenv("LYNXTOP_ASCII", raising=False)
    app = make_app(agent.socket_path, ascii_only=None)  # decided by the environment
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_for(pilot, lambda: app.screen.query_one(GpuTable).row_count == 8)
        assert not app.ascii_only


# ------------------------------------------------------------------------------------------ 3. ASCII marks

def _non_ascii(text: str) -> list[str]:
    return sorted({c for c in text if ord(c) > 127})


async def test_ascii_mode_draws_broken_marks_in_ascii(agent):
    """A lost GPU, an ECC error, an SLA breach with its limit and °C: all in ASCII, the words kept."""
    rows = [gpu_row(i, lost=1 if i == 5 else 0) for i in range(8)]
    rows[2]["ecc_uncorrected"] = 4
    agent.status = make_status(gpu_rows=rows, sla={"state": "breach", "ttft_p99_ms": 3000.0})
    app = make_app(agent.socket_path, ascii_only=True)
    async with app.run_test(size=(160, 48)) as pilot:
        await wait_for(pilot, lambda: app.screen.query_one(GpuTable).row_count == 8 and "LOST" in screen_text(app))
        shown = "".join(str(w.render()) for w in (app.screen.query_one(GpuTable), app.screen.query_one(NodeHeader),
                                                  app.screen.query_one(ServingPanel)))
        assert not _non_ascii(shown), shown
        assert "X LOST" in shown and "X ECC uncorr 4" in shown and "SLA X BREACH" in shown, shown
        assert "<=" in shown and "60C" in shown, shown  # the SLA limit, a temperature


async def test_ascii_mode_sla_ok_and_too_small(agent):
    app = make_app(agent.socket_path, ascii_only=True)
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_for(pilot, lambda: app.screen.query_one(GpuTable).row_count == 8)
        header = str(app.screen.query_one(NodeHeader).render())
        assert "SLA" in header and not _non_ascii(header), header
        await pilot.resize_terminal(60, 20)
        await wait_for(pilot, lambda: "needs at least" in screen_text(app))
        shown = screen_text(app)
        assert "80x24" in shown and "60x20" in shown and "×" not in shown, shown


async def test_ascii_mode_outage_banner(agent):
    app = make_app(agent.socket_path, ascii_only=True)
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_for(pilot, lambda: app.screen.query_one(GpuTable).row_count == 8)
        agent.stop()
        banner = app.screen.query_one(OutageBanner)
        await wait_for(pilot, lambda: "unreachable" in str(banner.render()))
        text = str(banner.render())
        assert not _non_ascii(text) and text.startswith("! agent unreachable") and " - " in text, text


def test_glyph_table_is_ascii():
    from lynxtop.tui.glyphs import ASCII, glyph

    assert all(v.isascii() for v in ASCII.values())
    assert glyph("✗", True) == "X" and glyph("✗", False) == "✗"


# ------------------------------------------------------------------------------------------ 4. colour-only states

def _gpu_line(app: Any, index: int) -> str:
    return next(ln for ln in screen_text(app).splitlines() if ln.lstrip("│┃ ").startswith(f"{index} "))


@pytest.mark.parametrize("size", [(160, 48), (80, 24)])
async def test_critical_temperature_and_memory_are_words(agent, monkeypatch, size):
    """NO_COLOR: a GPU past the red temperature line (88 °C) or the red memory line (99 %) says so in its State
    column; one in the yellow band (85 °C, 96 %) stays ok, as its colour is no alarm."""
    monkeypatch.setenv("NO_COLOR", "1")
    rows = [gpu_row(i) for i in range(8)]
    rows[2]["temp_c"] = 93
    rows[3]["temp_c"] = 85
    rows[4]["mem_used_bytes"] = rows[4]["mem_total_bytes"] * 0.996
    rows[5]["mem_used_bytes"] = rows[5]["mem_total_bytes"] * 0.96
    agent.status = make_status(gpu_rows=rows)
    app = make_app(agent.socket_path)
    async with app.run_test(size=size) as pilot:
        await wait_for(pilot, lambda: app.screen.query_one(GpuTable).row_count == 8 and "93" in screen_text(app))
        hot, full = _gpu_line(app, 2), _gpu_line(app, 4)
        assert "hot 93°C" in hot, hot
        assert "mem 99%" in full or "mem 100%" in full, full
        assert _gpu_line(app, 3).rstrip(" │┃").endswith("ok") and _gpu_line(app, 5).rstrip(" │┃").endswith("ok")


# ------------------------------------------------------------------------------------------ 5. compact memory

async def test_compact_memory_shows_a_held_context(agent):
    """A GPU holding only a CUDA context (400 MiB of 80 GiB) reads 0.4, never 0; the header says GiB; the row
    fits 80 columns."""
    rows = [gpu_row(i, mem_total_bytes=80 * GIB) for i in range(8)]
    rows[1]["mem_used_bytes"] = 400 * 1024**2
    rows[2]["mem_used_bytes"] = 0
    rows[3]["mem_used_bytes"] = 9.96 * GIB
    rows[4]["mem_used_bytes"] = 79.6 * GIB
    agent.status = make_status(gpu_rows=rows)
    app = make_app(agent.socket_path)
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_for(pilot, lambda: app.screen.query_one(GpuTable).row_count == 8)
        table = app.screen.query_one(GpuTable)
        mem = {i: table.rows[str(i)]["mem"].plain for i in range(5)}
        assert mem[1] == "0.4/80", mem
        assert mem[2] == "0/80", mem
        assert mem[3] == "10/80", mem  # 9.96 rounds to 10.0: shown whole
        assert mem[4] == "80/80", mem
        header = screen_text(app).splitlines()
        assert any("Mem GiB" in ln for ln in header), "\n".join(header)
        assert all(len(ln) <= 80 for ln in header)
        assert "0.4/80" in _gpu_line(app, 1)
