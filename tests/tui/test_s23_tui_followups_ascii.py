"""s23 follow-up: in ASCII mode the Events, History and Help screens say their marks in the glyph table's words.

The last-resort line filter (tui/glyphs.py AsciiFilter) keeps every cell where it is, so it can only put one ASCII
cell for one mark: `≥info` read `>info`, `13:00→14:00` read `13:00>14:00`, `↑↓` read `??`. These screens now route
their marks through the table, so ASCII mode reads `>=info`, `->`, `C` and `up/down`. The assertions name the words,
not only that the screen is ASCII (which the filter alone already made it)."""

from __future__ import annotations

import re

from support.tui import make_app, screen_text, wait_for
from test_snapshots import SCREENS, settle


async def _shown(agent, db, name: str) -> str:
    app = make_app(agent.socket_path, db, utc=True, poll_interval_s=3600, backfill=True, ascii_only=True)
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        await SCREENS[name](pilot)
        await settle(pilot)
        await wait_for(pilot, lambda: screen_text(app).strip() != "")
        return screen_text(app)


def _words(shown: str) -> str:
    """The screen's text as one line of words: a dialog's border cells and its wrapping taken out."""
    return " ".join(" ".join(line.strip().strip("|+").split()) for line in shown.splitlines())


async def test_events_filters_say_at_least_in_ascii(agent, history_db, monkeypatch):
    db, _ = history_db
    monkeypatch.chdir(db.parent)
    shown = await _shown(agent, type(db)(db.name), "events")
    assert shown.isascii(), shown
    assert "severity (v): >=info" in shown, shown
    assert "XX critical" in shown and "X error" in shown, shown  # the severity marks, as the table says them


async def test_history_window_arrow_is_two_cells_in_ascii(agent, history_db, monkeypatch):
    db, _ = history_db
    monkeypatch.chdir(db.parent)
    shown = await _shown(agent, type(db)(db.name), "history")
    assert shown.isascii(), shown
    assert re.search(r"\d\d:\d\d->\d\d:\d\d", shown), shown


async def test_help_says_degrees_and_arrows_in_words_in_ascii(agent, history_db, monkeypatch):
    db, _ = history_db
    monkeypatch.chdir(db.parent)
    shown = await _shown(agent, type(db)(db.name), "help")
    assert shown.isascii(), shown
    words = _words(shown)
    assert "temperature yellow >= 80 C, red >= 88 C" in words, shown
    assert "memory yellow >= 95 %, red >= 99 %" in words, shown
    assert "Esc closes . up/down PgUp PgDn scroll" in words, shown
    assert "red with X above the SLA limit; ^ marks breaches" in words, shown
