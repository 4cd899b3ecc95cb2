"""Run comparison states n and its statistic, and gives no percentage from too few requests (issue 28.4)."""

from __future__ import annotations

from pathlib import Path

import pytest
from steer_history import build_steer_history
from support.tui import make_app, text_of, wait_for

from lynxtop.tui.screens.compare import CompareScreen


@pytest.fixture(scope="module")
def bench_db(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    """Per run a sweep with 4 requests a side at concurrency 2 (a p99 of 4 requests is the slowest one) and 40
    at concurrency 16."""
    path = tmp_path_factory.mktemp("cmp") / "history.db"
    return path, build_steer_history(path)


async def test_compare_shows_n_and_no_percentage_under_the_minimum(sock_dir, bench_db):
    db, info = bench_db
    app = make_app(sock_dir / "absent.sock", db, utc=True)
    async with app.run_test(size=(200, 60)) as pilot:
        app.push_screen(CompareScreen(info["run1"], info["run2"]))
        await wait_for(pilot, lambda: isinstance(app.screen, CompareScreen) and app.screen.query("#compare-body"))
        body = app.screen.query_one("#compare-body")
        await wait_for(pilot, lambda: "benchmark curves" in text_of(body))
        text = text_of(body)
        lines = [ln.replace("│", " ").split() for ln in text.splitlines()]
        rows = {cells[0]: cells for cells in lines if cells and cells[0] in ("2", "16")}
        assert rows["2"][1] == "4" and "n<30" in rows["2"] and not any("%" in c for c in rows["2"])  # was +2848.0%
        assert rows["16"][1] == "40" and rows["16"][-1] == "+10.0%"
        assert "fewer than 30 samples" in text  # the rule stated
        assert "n (stored samples" in text and "mean over the run's samples" in text  # n and the statistic
