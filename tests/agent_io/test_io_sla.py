"""SLA: one event per breach and per recovery, with the worst values seen; state for the status object."""

from __future__ import annotations

from lynxtop.agent.config import SlaConfig
from lynxtop.agent.sla import SlaTracker


def row(ttft=None, tpot=None, itl=None):
    return {"ttft_p99_ms": ttft, "tpot_p99_ms": tpot, "itl_p99_ms": itl}


def test_breach_and_recovery_events_carry_worst_values():
    sla = SlaTracker(SlaConfig(ttft_p99_ms=2000, tpot_p99_ms=150, window_s=60))
    assert sla.state()["state"] == "unknown"
    assert sla.update(row(500, 40), 1_000) == []
    assert sla.state()["state"] == "ok" and sla.state()["since_ms"] == 1_000

    events = sla.update(row(3200, 40), 2_000)
    assert [e["kind"] for e in events] == ["sla_breach"]
    assert events[0]["severity"] == "warning"
    assert "TTFT 3.20 s > 2.00 s" in events[0]["message"]
    assert events[0]["details"]["worst_ttft_p99_ms"] == 3200

    # still breached, worse, and TPOT joins: no new event, worst values tracked
    assert sla.update(row(5100, 180), 3_000) == []
    assert sla.update(row(4000, 160), 4_000) == []
    st = sla.state()
    assert st["state"] == "breach" and st["since_ms"] == 2_000
    assert st["breached"] == ["tpot", "ttft"]
    assert st["worst_ttft_p99_ms"] == 5100 and st["worst_tpot_p99_ms"] == 180
    assert st["ttft_p99_ms"] == 4000 and st["ttft_threshold_ms"] == 2000 and st["window_s"] == 60

    events = sla.update(row(900, 60), 9_000)
    assert [e["kind"] for e in events] == ["sla_recovered"]
    ev = events[0]
    assert ev["details"]["worst_ttft_p99_ms"] == 5100 and ev["details"]["worst_tpot_p99_ms"] == 180
    assert ev["details"]["duration_s"] == 7.0
    assert "5.10 s" in ev["message"] and "180 ms" in ev["message"]
    assert sla.state()["state"] == "ok" and sla.state()["breached"] == []


def test_no_data_is_unknown_and_ends_an_open_breach():
    sla = SlaTracker(SlaConfig())
    sla.update(row(None, 500), 0)
    assert sla.state()["state"] == "breach"
    events = sla.update(None, 60_000)
    assert [e["kind"] for e in events] == ["sla_recovered"]
    assert "no latency data" in events[0]["message"]
    assert sla.state()["state"] == "unknown"
    assert sla.update(None, 61_000) == []


def test_itl_stands_in_for_tpot_on_old_vllm():
    sla = SlaTracker(SlaConfig(tpot_p99_ms=100))
    events = sla.update(row(100, None, itl=250), 0)
    assert events and "ITL (as TPOT) 250 ms > 100 ms" in events[0]["message"]
    assert sla.state()["tpot_source"] == "itl" and sla.state()["tpot_p99_ms"] == 250


def test_thresholds_from_config_are_respected():
    sla = SlaTracker(SlaConfig(ttft_p99_ms=5000, tpot_p99_ms=300))
    assert sla.update(row(4999, 299), 0) == []
    assert sla.state()["state"] == "ok"
    assert sla.update(row(5001, 10), 1) != []
