"""Units, charts, confirmation texts, backoff and outage rules: the pure parts of the dashboard."""

from __future__ import annotations

import pytest
from support.tui import plain
from tui_fake_agent import PROFILES, make_status

from lynxtop.contract.format import (
    fmt_bytes,
    fmt_clock,
    fmt_duration,
    fmt_ms,
    fmt_pct,
    fmt_si,
    throttle_words,
)
from lynxtop.contract.records import ProfileList, RunInfo
from lynxtop.contract.status import ServingState, SlaState, Status
from lynxtop.tui import control_text
from lynxtop.tui.backoff import Backoff
from lynxtop.tui.export_csv import ExportError, check_target
from lynxtop.tui.history_series import points, span
from lynxtop.tui.live_state import LiveState
from lynxtop.tui.plot import bar, bucketize, column_chart, sparkline
from lynxtop.tui.window_stats import span_label, window_mean


@pytest.mark.parametrize(("value", "text"), [
    (None, "N/A"), (0, "0 B"), (1023, "1023 B"), (1536, "1.50 KiB"), (130 * 1024**3, "130 GiB"),
    (12.34 * 1024**3, "12.3 GiB"), (3 * 1024**4, "3.00 TiB"),
])
def test_bytes_binary_by_magnitude(value, text):
    assert fmt_bytes(value) == text


def test_other_units():
    assert fmt_ms(None) == "N/A" and fmt_ms(45.04) == "45.0 ms" and fmt_ms(750) == "750 ms"
    assert fmt_ms(2500) == "2.50 s"
    assert fmt_pct(None) == "N/A" and fmt_pct(37.46, 1) == "37.5%" and fmt_pct(0) == "0%"
    assert fmt_si(1234.5) == "1.23k" and fmt_si(4.2, "req/s") == "4.20 req/s" and fmt_si(None) == "N/A"
    assert fmt_duration(59) == "59s" and fmt_duration(3723) == "1h02m" and fmt_duration(90061) == "1d01h"
    assert fmt_clock(1_796_220_000_000, utc=True) == "14:00:00Z"


def test_throttle_reasons_as_words():
    assert throttle_words(0) == []
    assert throttle_words(0x1) == []  # idle costs nothing
    assert throttle_words(0x1, include_benign=True) == ["idle"]
    assert throttle_words(0x4 | 0x40) == ["SW power cap", "HW thermal"]
    assert throttle_words(0x1000) == ["other 0x1000"]
    assert throttle_words(None) == ["N/A"]


def test_bar_and_ascii_fallback():
    assert bar(50, 4) == "██  "
    assert bar(100, 4) == "████"
    assert bar(None, 5) == " N/A "
    assert bar(50, 4, ascii_only=True) == "##.."


def test_chart_gaps_threshold_and_breaches():
    pts = [(0, 10.0), (10, None), (20, 300.0), (30, 50.0)]
    values = bucketize(pts, 0, 39, 4)
    assert values == [10.0, None, 300.0, 50.0]  # the None bucket is a gap, not zero
    chart = column_chart(values, height=4, threshold=100.0)
    assert chart.breach == [False, False, True, False]
    assert chart.threshold_row is not None and "╌" in chart.rows[chart.threshold_row]
    assert all(row[1] in " ╌" for row in chart.rows)  # the gap column stays empty
    assert sparkline([0, None, 8], 3, vmax=8) == "▁ █"
    assert column_chart([0.001], 2, vmax=100).rows[-1] != " "  # non-zero never drawn as nothing


def test_confirmation_texts_say_what_happens():
    status = Status.from_json(make_status())
    serving, metrics = status.serving, status.serving_metrics
    text = plain(control_text.restart_text(serving, metrics))
    assert "dsv41-tp8" in text and "new run" in text and "17m57s" in text and "12 request(s)" in text
    current, target = ProfileList.from_json(PROFILES).profiles
    diff = control_text.flag_diff(current, target)
    assert ("--max-model-len", "131072", "262144") in diff
    assert ("--enable-expert-parallel", "—", "on") in diff
    assert all(flag != "--kv-cache-dtype" for flag, _, _ in diff)
    switch = plain(control_text.switch_text(serving, current, target))
    assert "2 flag difference(s)" in switch and "minutes" in switch


def test_backoff_grows_and_caps():
    b = Backoff(base_s=1, cap_s=5)
    assert [b.next_delay() for _ in range(5)] == [1, 2, 4, 5, 5]
    b.reset()
    assert b.next_delay() == 1


def test_one_outage_one_notice_and_history_kept():
    state = LiveState()
    assert state.apply_status(Status.from_json(make_status(ts_ms=1000)), 1000) is None
    assert state.mark_lost("refused", 2000) is True
    assert state.mark_lost("refused", 3000) is False
    assert state.stale and state.age_s(5000) == 4.0
    ended = state.apply_status(Status.from_json(make_status(ts_ms=6000)), 6000)
    assert ended is not None and ended.since_ms == 2000 and state.connected
    assert [ts for ts, _ in state.serving_history] == [1000, 6000]
    # stored history goes before live samples, never replacing them
    state.backfill([{"ts_ms": 500, "ttft_p99_ms": 1.0}, {"ts_ms": 6000, "ttft_p99_ms": 99.0}], [])
    assert [ts for ts, _ in state.serving_history] == [500, 1000, 6000]
    assert state.serving_history[-1][1]["ttft_p99_ms"] == 750.0


def test_live_state_reads_the_typed_status():
    state = LiveState()
    # before the first status: empty defaults, not errors
    assert state.serving.state == ServingState.STOPPED and state.sla.state == SlaState.UNKNOWN
    assert state.gpus == () and state.agent.host == "" and state.serving_metrics.metric("ttft_p99_ms") is None
    status = Status.from_json(make_status(ts_ms=1000))
    state.apply_status(status, 1000)
    # the views read the status's own objects (no JSON copy kept beside them)
    assert state.serving is status.serving and state.sla is status.sla and state.agent is status.agent
    assert state.gpus is status.gpus and state.serving_metrics is status.serving_metrics
    assert not hasattr(state, "section")


def test_history_points_average_gpus_and_pick_rollup_stat():
    rows = [{"ts_ms": 1, "gpu": 0, "x_avg": 10, "x_max": 20}, {"ts_ms": 1, "gpu": 1, "x_avg": 30, "x_max": 40},
            {"ts_ms": 2, "gpu": 0, "x_avg": None, "x_max": None}]
    assert points(rows, "x", "avg") == [(1, 20.0), (2, None)]
    assert points(rows, "x", "max") == [(1, 30.0), (2, None)]
    assert span(RunInfo(1, started_ms=100, ended_ms=500), None, 9999) == (100, 500)
    assert span(RunInfo(1, started_ms=100, ended_ms=None), 50, 1000) == (950, 1000)


def test_export_target_checks(tmp_path):
    (tmp_path / "exists.csv").write_text("x")
    with pytest.raises(ExportError, match="already exists"):
        check_target(str(tmp_path / "exists.csv"))
    with pytest.raises(ExportError, match="no such directory"):
        check_target(str(tmp_path / "nope" / "a.csv"))
    with pytest.raises(ExportError, match="no path"):
        check_target("  ")
    assert check_target(str(tmp_path / "new.csv")) == tmp_path / "new.csv"




def test_cli_variants_of_the_shared_formatters():
    """`lynxtop status` prints whole milliseconds, 1-decimal bytes up to TiB and '-' for no duration."""
    assert fmt_ms(45.04, decimals=0) == "45 ms" and fmt_ms(2500, decimals=0) == "2.50 s"
    assert fmt_bytes(12.34 * 1024**3, decimals=1) == "12.3 GiB" and fmt_bytes(1536, decimals=1) == "1.5 KiB"
    assert fmt_bytes(2048 * 1024**4, decimals=1, largest="TiB") == "2048.0 TiB" and fmt_bytes(5, decimals=1) == "5 B"
    assert fmt_duration(None, na="-") == "-" and fmt_duration(None) == "N/A"


def test_window_mean_of_a_per_tick_rate():
    pts = [(0, 0.0), (1000, 2.0), (2000, None), (3000, 0.0)]
    assert window_mean(pts) == (2.0 / 3, 4000)  # 3 readings; the span counts the first tick too
    assert window_mean(pts, window_ms=2000) == (0.0, 1000)  # only the reading at 3000 is after 1000
    assert window_mean(pts, end_ms=10 * 60_000) == (None, 0)  # nothing in the last 5 minutes
    assert window_mean([]) == (None, 0)
    assert span_label(4000) == "4s" and span_label(300_000) == "5m" and span_label(119_000) == "119s"


async def test_chart_max_is_never_below_now():
    """Columns are bucket averages; the header's max is the readings' max, so never below now."""
    from textual.app import App

    from lynxtop.contract.format import fmt_temp
    from lynxtop.tui.widgets.time_chart import TimeChart

    class One(App):
        def compose(self):
            yield TimeChart("Temperature", fmt_temp, agg="avg")

    t0 = 1_796_220_000_000
    app = One()
    async with app.run_test(size=(80, 8)) as pilot:
        chart = app.query_one(TimeChart)
        chart.set_data([(t0 - 59_000 + i * 1000, 50.0) for i in range(59)] + [(t0, 56.0)], t0 - 900_000, t0)
        await pilot.pause()
        header = plain(chart.render()).splitlines()[0]
        assert "now 56°C" in header and "max 56°C" in header, header
