"""A flapping or intermittently failing `/health` is one episode, told once at its start and once at its end.

Audit s22: /health failing 3 probes then answering one 200 (probe every 1 s) gave 1,800 events and 3,600 journal
lines an hour (each 200 ended the episode); failing every other probe was never told at all (only failures in a
row counted). Driven through the real supervisor (a real simulated vLLM run), its event store (SQLite) and the
real probe; only /health's answers and the probe's clock are scripted.
"""

from __future__ import annotations

import logging

import pytest

from lynxtop.agent.serving.health import Health, HealthProbe
from lynxtop.agent.serving.health_episode import SETTLE_S

pytestmark = pytest.mark.timeout(120)

wait_for = db_rows = None  # bound from the `h` fixture (tests import only lynxtop.*)
LOGGER = "lynxtop.agent.serving.supervisor"


@pytest.fixture(autouse=True)
def _helpers(h):
    global wait_for, db_rows
    wait_for, db_rows = h.wait_for, h.db_rows


class FakeHealth:
    """`GET /health` as the probe sees it: whatever status is set now (None: no answer)."""

    def __init__(self) -> None:
        self.status: int | None = 200

    async def get(self, url: str, timeout_s: float = 3.0):
        return self.status, None


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def events(store, pattern: str) -> list[dict]:
    store.flush()
    return db_rows(store.path, "SELECT * FROM events WHERE kind LIKE ? ORDER BY id", (pattern,))


def state_lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == LOGGER and r.getMessage().startswith("serving:")]


async def ready_sup(make_sup, agent: str = ""):
    sup = make_sup(agent)
    await sup.start("alpha", by="uid 0 (root)")
    await wait_for(lambda: sup.state == "ready" and sup.action is None, 20, what="ready")
    return sup


async def drive(sup, probe: HealthProbe, http: FakeHealth, clock: Clock, pattern, seconds: int,
                states: list[str] | None = None) -> None:
    """One probe a second for `seconds`, /health answering pattern(i); the state after each probe noted."""
    for i in range(seconds):
        clock.t += 1
        http.status = pattern(i)
        v = await probe.probe()
        if v is not None:
            sup.on_verdict(v)
        if states is not None:
            states.append(sup.state)


async def test_a_flapping_health_is_one_episode_and_its_end_counts_the_flaps(make_sup, store, caplog):
    """3 failed probes, one 200, for 15 minutes: one degraded event, the run degraded all along (never back to
    ready between flaps), a few log lines; then 200s: ready again after SETTLE_S, one recovery with the count."""
    sup = await ready_sup(make_sup)
    http, clock = FakeHealth(), Clock()
    probe = HealthProbe(http, "http://x", fail_threshold=3, hang_timeout_s=20, clock=clock)  # type: ignore[arg-type]
    caplog.set_level(logging.INFO, logger=LOGGER)
    states: list[str] = []
    await drive(sup, probe, http, clock, lambda i: 200 if i % 4 == 3 else 500, 900, states)
    assert states[2] == "degraded" and set(states[2:]) == {"degraded"}, "back to ready between flaps"
    assert [e["severity"] for e in events(store, "serving.%.health")] == ["error"]
    assert len(state_lines(caplog)) <= 3, state_lines(caplog)
    settled: list[str] = []
    await drive(sup, probe, http, clock, lambda i: 200, int(SETTLE_S) + 2, settled)
    assert settled[0] == "degraded" and settled[-1] == "ready", settled  # degraded until it holds healthy
    assert settled.index("ready") >= SETTLE_S - 1, settled
    rec = events(store, "serving.recovered.health")
    assert len(rec) == 1, rec
    assert "failed and answered again 224 times" in rec[0]["message"], rec[0]["message"]
    assert len(events(store, "serving.%.health")) == 2
    assert len(state_lines(caplog)) <= 4, state_lines(caplog)
    await sup.shutdown(stop_serving=True)


async def test_health_failing_every_other_probe_is_degraded_and_never_restarted(make_sup, store):
    """Every other probe fails (never 2 in a row) for 15 minutes: degraded once, in words the operator reads
    ("failing intermittently: 6 of the last 12 probes failed"); even with restart_on_hang the server is kept."""
    sup = await ready_sup(make_sup, "hang_timeout_s = 20\nrestart_on_hang = true")
    first, pid = sup.run_id, sup.proc.pid
    http, clock = FakeHealth(), Clock()
    probe = HealthProbe(http, "http://x", fail_threshold=3, hang_timeout_s=20, clock=clock)  # type: ignore[arg-type]
    await drive(sup, probe, http, clock, lambda i: 500 if i % 2 else 200, 900)
    deg = events(store, "serving.degraded%")
    assert len(deg) == 1 and deg[0]["kind"] == "serving.degraded.health", deg
    assert "failing intermittently: 6 of the last 12 probes failed" in deg[0]["message"], deg[0]["message"]
    assert sup.state == "degraded" and "intermittently" in sup.reason
    assert sup.run_id == first and sup.proc.pid == pid and sup.proc.leader_alive() and sup.action is None
    assert sup.restarts == 0
    await sup.shutdown(stop_serving=True)


async def test_scattered_failures_below_half_never_degrade():
    """One probe in three failing (4 of 12, never 2 in a row), and a single blip: no verdict at all."""
    http, clock = FakeHealth(), Clock()
    probe = HealthProbe(http, "http://x", fail_threshold=3, hang_timeout_s=20, clock=clock)  # type: ignore[arg-type]
    for i in range(900):
        clock.t += 1
        http.status = 500 if i % 3 == 0 or i == 500 else 200
        v = await probe.probe()
        assert v is None or v.health is Health.HEALTHY, (i, v)


async def test_a_short_failure_stays_degraded_until_settled(make_sup, store):
    """3 failed probes then 200s: the run stays degraded SETTLE_S, then one recovery with no flap count; a
    steady failure longer than SETTLE_S still ends at the first 200 (test_health_episodes.py)."""
    sup = await ready_sup(make_sup)
    http, clock = FakeHealth(), Clock()
    probe = HealthProbe(http, "http://x", fail_threshold=3, hang_timeout_s=20, clock=clock)  # type: ignore[arg-type]
    states: list[str] = []
    await drive(sup, probe, http, clock, lambda i: 500 if i < 3 else 200, 3 + int(SETTLE_S) + 2, states)
    assert states[2] == "degraded" and states[3 + int(SETTLE_S) - 2] == "degraded" and states[-1] == "ready", states
    rec = events(store, "serving.recovered.health")
    assert len(rec) == 1 and "answered again" not in rec[0]["message"], rec
    await sup.shutdown(stop_serving=True)
