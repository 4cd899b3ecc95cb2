"""A persistent `/health` fault is told once per episode: one log line and one event at its start, one at its end.

Audit of persistent faults: a failing /health wrote `serving: degraded -> degraded (... N times in a row)` on every
probe (720 lines an hour), and a hang seen through a silent /health was "recovered" a second later by an idle but
readable /metrics page, then never told again.
"""

from __future__ import annotations

import logging

import pytest

from lynxtop.agent.serving import lifecycle
from lynxtop.agent.serving.health import HangDetector, Health, HealthProbe

pytestmark = pytest.mark.timeout(60)

wait_for = db_rows = None  # bound from the `h` fixture (tests import only lynxtop.*)
LOGGER = "lynxtop.agent.serving.supervisor"


@pytest.fixture(autouse=True)
def _helpers(h):
    global wait_for, db_rows
    wait_for, db_rows = h.wait_for, h.db_rows


class FakeHealth:
    """`GET /health` as the probe sees it: a status (None: no answer in time), whatever is set now."""

    def __init__(self) -> None:
        self.status: int | None = 200

    async def get(self, url: str, timeout_s: float = 3.0):
        return self.status, None


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def events(store, kind: str) -> list[dict]:
    store.flush()
    return db_rows(store.path, "SELECT * FROM events WHERE kind = ? ORDER BY id", (kind,))


def state_lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == LOGGER and r.getMessage().startswith("serving:")]


async def ready_sup(make_sup, agent: str = ""):
    sup = make_sup(agent)
    await sup.start("alpha", by="uid 0 (root)")
    await wait_for(lambda: sup.state == "ready" and sup.action is None, 15, what="ready")
    return sup


async def test_a_failing_health_is_logged_once_not_per_probe(make_sup, store, caplog):
    """HTTP 500 for 100 probes: one state line (ready -> degraded) and one event; the status keeps the live count."""
    sup = await ready_sup(make_sup)
    http, clock = FakeHealth(), Clock()
    probe = HealthProbe(http, "http://x", fail_threshold=3, hang_timeout_s=20, clock=clock)  # type: ignore[arg-type]
    caplog.set_level(logging.INFO, logger=LOGGER)
    http.status = 500
    for _ in range(100):
        clock.t += 5
        v = await probe.probe()
        if v is not None:
            sup.on_verdict(v)
    assert sup.state == "degraded" and "HTTP 500, 100 times in a row" in sup.reason  # live in `lynxtop status`
    lines = state_lines(caplog)
    assert len(lines) == 1 and "ready -> degraded" in lines[0], lines
    assert len(events(store, "serving.degraded.health")) == 1
    http.status = None  # the failure changes (no answer now): that is news, logged once more
    for _ in range(2):
        clock.t += 5
        sup.on_verdict(await probe.probe())
    lines = state_lines(caplog)
    assert len(lines) == 2 and "no answer" in lines[1], lines
    http.status = 200
    clock.t += 5
    sup.on_verdict(await probe.probe())
    assert sup.state == "ready" and len(state_lines(caplog)) == 3
    assert len(events(store, "serving.recovered.health")) == 1
    await sup.shutdown(stop_serving=True)


async def test_a_long_failure_gets_a_slow_reminder_with_its_count(make_sup, store, caplog, monkeypatch):
    """Past the reminder period a still-failing /health is logged again, with the count it has reached."""
    monkeypatch.setattr(lifecycle, "REASON_REMINDER_S", 0.0)
    sup = await ready_sup(make_sup)
    http, clock = FakeHealth(), Clock()
    probe = HealthProbe(http, "http://x", fail_threshold=3, clock=clock)  # type: ignore[arg-type]
    caplog.set_level(logging.INFO, logger=LOGGER)
    http.status = 500
    for _ in range(5):
        v = await probe.probe()
        if v is not None:
            sup.on_verdict(v)
    lines = state_lines(caplog)
    assert len(lines) == 3 and "still degraded" in lines[-1] and "5 times in a row" in lines[-1], lines
    await sup.shutdown(stop_serving=True)


async def test_a_silent_health_stays_unresponsive_while_metrics_read_idle(make_sup, store):
    """/health silent (one wedged API server of several) while /metrics reads an idle engine: the run stays
    degraded ("unresponsive") until /health answers; the idle page recovers nothing, and the hang is told once."""
    sup = await ready_sup(make_sup, "hang_timeout_s = 20")
    http, clock = FakeHealth(), Clock()
    probe = HealthProbe(http, "http://x", fail_threshold=3, hang_timeout_s=20, clock=clock)  # type: ignore[arg-type]
    engine = HangDetector(20)
    http.status = None
    for i in range(20):  # 100 s of silence, a scrape of an idle engine each second in between
        clock.t += 5
        v = await probe.probe()
        if v is not None:
            sup.on_verdict(v)
        for s in range(5):
            idle = engine.observe(0, 5.0, waiting=0, now=clock.t + s)
            assert idle is not None and idle.health is Health.PROGRESSING
            sup.on_verdict(idle)
        if clock.t >= 25:
            assert sup.state == "degraded" and "unresponsive" in sup.serving_status().degraded, (i, sup.reason)
    hangs = events(store, "serving.degraded.hang")
    assert len(hangs) == 1 and "GET /health unanswered" in hangs[0]["message"], hangs
    assert not events(store, "serving.recovered.hang")
    assert sup.action is None and sup.restarts == 0 and sup.proc.leader_alive()  # restart_on_hang is off
    http.status = 200
    for _ in range(2):
        clock.t += 5
        sup.on_verdict(await probe.probe())
    assert sup.state == "ready" and sup.serving_status().degraded == ()
    rec = events(store, "serving.recovered.hang")
    assert len(rec) == 1 and "GET /health answers again" in rec[0]["message"], rec
    await sup.shutdown(stop_serving=True)


async def test_an_engine_hang_is_not_cleared_by_a_health_answer(make_sup, store):
    """The engine's hang (counters stand still, /health 200: a hung NCCL collective) ends only when the engine
    moves; a /health that answers again after a silence ends only the silence."""
    sup = await ready_sup(make_sup, "hang_timeout_s = 20")
    http, clock = FakeHealth(), Clock()
    probe = HealthProbe(http, "http://x", fail_threshold=3, hang_timeout_s=20, clock=clock)  # type: ignore[arg-type]
    engine = HangDetector(20)
    http.status = None
    clock.t = 25
    sup.on_verdict(await probe.probe())  # silent for 25 s: unresponsive
    engine.observe(2, 10.0, now=0)
    sup.on_verdict(engine.observe(2, 10.0, now=21))  # and the engine hangs
    assert set(sup.serving_status().degraded) == {"hang", "unresponsive"}
    http.status = 200
    clock.t += 5
    sup.on_verdict(await probe.probe())
    assert sup.state == "degraded" and sup.serving_status().degraded == ("hang",), sup.reason
    sup.on_verdict(engine.observe(2, 11.0, now=30))
    assert sup.state == "ready" and sup.serving_status().degraded == ()
    assert len(events(store, "serving.degraded.hang")) == 2 and len(events(store, "serving.recovered.hang")) == 2
    await sup.shutdown(stop_serving=True)


async def test_an_unresponsive_server_is_restarted_with_restart_on_hang(make_sup, store):
    sup = await ready_sup(make_sup, "hang_timeout_s = 20\nrestart_on_hang = true")
    first = sup.run_id
    http, clock = FakeHealth(), Clock()
    probe = HealthProbe(http, "http://x", fail_threshold=3, hang_timeout_s=20, clock=clock)  # type: ignore[arg-type]
    http.status = None
    clock.t = 21
    v = await probe.probe()
    assert v is not None and v.health is Health.HUNG and v.condition == "unresponsive"
    sup.on_verdict(v)
    await wait_for(lambda: sup.run_id != first and sup.state == "ready" and sup.action is None, 20,
                   what="a new run after the unresponsive one")
    store.flush()
    assert db_rows(store.path, "SELECT end_reason FROM runs WHERE id = ?", (first,))[0]["end_reason"] == "restarted"
    await sup.shutdown(stop_serving=True)


async def test_any_answer_ends_the_silence_and_a_new_failure_is_news():
    """A 500 after a silence ends "unresponsive" (the server answers) and goes on as "health"; its first
    unhealthy verdict is news, the next ones only re-count."""
    http, clock = FakeHealth(), Clock()
    probe = HealthProbe(http, "http://x", fail_threshold=3, hang_timeout_s=20, clock=clock)  # type: ignore[arg-type]
    http.status = None
    clock.t = 21
    assert (await probe.probe()).condition == "unresponsive"
    http.status = 500
    v = await probe.probe()
    assert v.health is Health.PROGRESSING and v.condition == "unresponsive" and "HTTP 500" in v.reason
    first, again = await probe.probe(), await probe.probe()
    assert first.condition == again.condition == "health" and not first.repeat and again.repeat
    assert "HTTP 500, 4 times in a row" in again.reason
