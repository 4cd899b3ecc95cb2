"""The run comparison shows every `*_ms` row as a latency in ms (s from 1000 ms), as the rest of the dashboard
does, and a run's times as times, to the second, in the dashboard's zone (tmux audit, session 16: "compare's
`*_ms` rows show minutes": `started_ms 2026-12-02 13:00`, and any `_ms` latency outside a list of five words
was drawn as a date). On the real history database the store's writer builds (tests/tui/conftest.py)."""

from __future__ import annotations

import re
import time

import pytest
from support.tui import make_app, text_of, wait_for

from lynxtop.tui.screens.compare import CompareScreen, _fmt_value

LATENCY = re.compile(r"N/A|\d+(\.\d+)? ms|\d+\.\d\d s")


@pytest.fixture
def far_zone(monkeypatch):
    """Local time 5h30 off UTC (and off by half an hour): a time drawn in local time cannot pass for UTC."""
    monkeypatch.setenv("TZ", "Asia/Kolkata")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


def _rows(text: str) -> dict[str, list[str]]:
    """The comparison table's rows: name -> [run a, run b]."""
    out = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("│").split("│")]
        if len(cells) == 3 and cells[0]:
            out[cells[0]] = cells[1:]
    return out


async def test_compare_ms_rows_are_latencies_and_run_times_are_times(sock_dir, history_db, far_zone):
    db, info = history_db
    app = make_app(sock_dir / "absent.sock", db, utc=True)
    async with app.run_test(size=(200, 60)) as pilot:
        app.push_screen(CompareScreen(info["run1"], info["run2"]))
        await wait_for(pilot, lambda: isinstance(app.screen, CompareScreen) and app.screen.query("#compare-body"))
        body = app.screen.query_one("#compare-body")
        await wait_for(pilot, lambda: "serving.ttft_p99_ms" in text_of(body))
        rows = _rows(text_of(body))
    ms_rows = {name: values for name, values in rows.items() if name.endswith("_ms")}
    assert len(ms_rows) >= 8, rows  # ttft, tpot (p50, p99, worst), itl, e2e
    for name, values in ms_rows.items():
        assert all(LATENCY.fullmatch(v) for v in values), (name, values)  # not "2026-12-02 13:00"
    assert rows["serving.ttft_p99_max_ms"] == ["3.00 s", "3.00 s"]
    # the run's times: named as times, to the second, in UTC as the dashboard is (not the machine's +05:30)
    assert rows["started at"] == ["2026-12-02 13:00:00 UTC", "2026-12-02 13:30:00 UTC"], rows
    assert rows["ready at"] == ["2026-12-02 13:01:00 UTC", "2026-12-02 13:31:30 UTC"], rows
    assert rows["ended at"][0] == "2026-12-02 13:29:59 UTC" and rows["ended at"][1] == "N/A", rows


@pytest.mark.parametrize(("key", "value", "shown"), [
    ("serving.prefill_time_p99_ms", 250.0, "250 ms"),  # was "1970-01-01 00:00": a latency without a listed word
    ("serving.decode_time_p50_ms", 1500.0, "1.50 s"),
    ("serving.ttft_p99_ms", 42.0, "42.0 ms"),
])
def test_any_ms_summary_value_is_a_latency(key, value, shown):
    assert _fmt_value(key, value) == shown
