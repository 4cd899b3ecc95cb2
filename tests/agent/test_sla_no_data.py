"""A breach that ends because there is no latency data (idle, unreachable, serving stopped) is not a recovery.

The 3 a.m. audit: a switch stopped serving mid-breach and the event log said `sla.recovered ... (no latency data in
the window ...)`; skimming the kind column that reads as "fixed itself". Now it is `sla.unknown` ("SLA breach no
longer judged: no latency data ..."), and `sla.recovered` is told only when the data shows latency back within the
limits; the state served is `unknown`, as the event says.
"""

from __future__ import annotations

from lynxtop.agent.metrics.sla import MIN_REQUESTS, SlaTracker
from lynxtop.contract.config import SlaConfig
from lynxtop.contract.events import Event, EventKind


def _breached() -> SlaTracker:
    sla = SlaTracker(SlaConfig(ttft_p99_ms=2000, tpot_p99_ms=150, window_s=60))
    assert [e.kind for e in sla.update({"ttft_p99_ms": 39_630.0, "tpot_p99_ms": 40.0,
                                                 "requests_finished": MIN_REQUESTS}, 0)] == ["sla.breach"]
    return sla


def test_serving_stopped_mid_breach_is_sla_unknown_not_recovered():
    sla = _breached()
    events = sla.update(None, 50_000)  # serving stopped for a switch: no serving row at all
    assert [e.kind for e in events] == ["sla.unknown"]
    ev = events[0]
    assert ev.severity == "info"
    assert ev.message.startswith("SLA breach no longer judged: no latency data"), ev.message
    assert "recovered" not in ev.message and "ended" not in ev.message
    assert "after 50 s" in ev.message and "39.63 s" in ev.message  # how long, and how bad it got
    assert ev.details["duration_s"] == 50.0 and ev.details["worst_ttft_p99_ms"] == 39_630.0
    assert sla.state().state == "unknown" and sla.state().breached == ()
    assert sla.update(None, 51_000) == []  # one event, not one per tick
    # the event goes through the contract's round trip (what the store and /v1/events carry)
    assert Event.from_json(ev.to_json()).kind is EventKind.SLA_UNKNOWN


def test_an_idle_window_and_an_outage_past_the_window_are_sla_unknown_too():
    sla = _breached()
    assert [e.kind for e in sla.update({"ttft_p99_ms": None, "tpot_p99_ms": None}, 10_000)] == ["sla.unknown"]
    sla = _breached()
    failed = {"scrape_ok": 0, "ttft_p99_ms": None, "tpot_p99_ms": None}
    assert all(sla.update(failed, ms) == [] for ms in range(5_000, 60_000, 5_000))  # held for one window
    assert [e.kind for e in sla.update(failed, 60_000)] == ["sla.unknown"]


def test_recovered_only_when_the_data_shows_latency_within_the_limits():
    sla = _breached()
    events = sla.update({"ttft_p99_ms": 900.0, "tpot_p99_ms": 40.0}, 30_000)
    assert [e.kind for e in events] == ["sla.recovered"]
    assert events[0].details["reason"] == "back within thresholds"
    assert sla.state().state == "ok"
    # a breach after "unknown" and then good data: one breach, one unknown, no recovered for the no-data end
    sla = _breached()
    kinds = [e.kind for t, row in ((10_000, None), (20_000, {"ttft_p99_ms": 5000.0, "requests_finished": MIN_REQUESTS}),
                                   (30_000, {"ttft_p99_ms": 100.0})) for e in sla.update(row, t)]
    assert kinds == ["sla.unknown", "sla.breach", "sla.recovered"]
