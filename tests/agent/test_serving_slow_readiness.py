"""A load slower than its readiness timeout is retried once, then given up: never killed and reloaded forever.

Real Supervisor, stand-in vLLM processes that take far longer to load than the profile's readiness timeout, real
SQLite store (tests/agent/conftest.py). The crash-loop window is as short as the timeout, as with the defaults
(readiness_timeout_s 1800 == crash_loop_window_s 1800): each timeout comes more than one window after the last,
so the window alone never holds more than one of them.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from pathlib import Path

import pytest
from support.agent_config import agent_toml

from lynxtop.agent.serving import policy
from lynxtop.agent.serving.backoff import FailureWindow
from lynxtop.contract.config import AgentConfig

pytestmark = pytest.mark.timeout(90)


def _cfg(tmp_path, profiles: str, **agent) -> object:
    keys = dict(backoff_initial_s=0.1, backoff_max_s=0.2, crash_loop_failures=5, crash_loop_window_s=2,
                gpu_release_timeout_s=5)
    keys.update(agent)
    path = tmp_path / "config.toml"
    path.write_text(agent_toml(tmp_path / "state" / "lynxtop.db", tmp_path / "run" / "agent.sock",
                               profiles=profiles, **keys))
    return path


def _events(h, store, prefix):
    store.flush()
    return [e for e in h.db_rows(store.path, "SELECT * FROM events ORDER BY id") if e["kind"].startswith(prefix)]


async def test_two_readiness_timeouts_in_a_row_give_up_although_the_window_holds_one(make_sup, store, tmp_path, h,
                                                                                      monkeypatch):
    monkeypatch.setenv("STANDIN_STARTUP_S", "300")  # inherited by the stand-in: a load far slower than the timeout
    cfg = _cfg(tmp_path, h.standin_profile("slow", readiness_s=2, stop_grace_s=1))
    sup = make_sup(cfg_path=cfg)
    try:
        await sup.start("slow", by="t")
        await h.wait_for(lambda: sup.state == "crash-loop", 30, what="gave up after the second timeout")
        assert "readiness_timeout_s" in sup.reason and "twice in a row" in sup.reason, sup.reason
        assert "raise readiness_timeout_s" in sup.reason and "slow" in sup.reason, sup.reason
        await asyncio.sleep(1.5)  # nothing more is started
        assert sup.state == "crash-loop"
        assert len(_events(h, store, "serving.readiness_timeout")) == 2
        assert len(_events(h, store, "serving.starting")) == 2  # the first load and one retry
        assert _events(h, store, "serving.crash_loop")
        runs = h.db_rows(store.path, "SELECT * FROM runs")
        assert len(runs) == 2 and all(r["ended_ms"] for r in runs)
        # it outlives the agent, as a crash loop does: a new agent holds it rather than autostart the same load
        recorded = json.loads((tmp_path / "state" / "crash-loop.json").read_text())
        assert recorded["profile"] == "slow" and "twice in a row" in recorded["reason"]
        again = make_sup(cfg_path=cfg)
        await again.take_over("slow")
        assert again.state == "crash-loop" and "twice in a row" in again.reason
        await again.shutdown(stop_serving=True)
    finally:
        await sup.shutdown(stop_serving=True)


async def test_the_count_of_timeouts_outlives_an_agent_restart_during_the_retry(make_sup, store, tmp_path, h,
                                                                                monkeypatch):
    """The first load timed out; the agent is restarted (live restore) while the retry loads: the next agent
    adopts that load and, when it times out too, gives up instead of starting a third."""
    monkeypatch.setenv("STANDIN_STARTUP_S", "300")
    cfg = _cfg(tmp_path, h.standin_profile("slow", readiness_s=3, stop_grace_s=1))
    a = make_sup(cfg_path=cfg)
    await a.start("slow", by="t")
    await h.wait_for(lambda: len(_events(h, store, "serving.readiness_timeout")) == 1, 20, what="first timeout")
    first = a.run_id
    await h.wait_for(lambda: a.state == "starting" and a.run_id != first, 20, what="the retry loading")
    await a.shutdown(stop_serving=False)  # the agent goes away; the loading retry keeps loading
    b = make_sup(cfg_path=cfg)
    try:
        await b.take_over("slow")
        assert b.adopted and b.state == "starting"
        await h.wait_for(lambda: b.state == "crash-loop", 20, what="gave up after the adopted load timed out")
        assert "twice in a row" in b.reason
        await asyncio.sleep(1)
        assert b.state == "crash-loop"
        assert len(h.db_rows(store.path, "SELECT * FROM runs")) == 2
    finally:
        await b.shutdown(stop_serving=True)


async def test_an_operator_start_after_giving_up_gets_two_loads_again(make_sup, store, tmp_path, h, monkeypatch):
    monkeypatch.setenv("STANDIN_STARTUP_S", "300")
    cfg = _cfg(tmp_path, h.standin_profile("slow", readiness_s=1.5, stop_grace_s=1))
    sup = make_sup(cfg_path=cfg)
    try:
        await sup.start("slow", by="t")
        await h.wait_for(lambda: sup.state == "crash-loop", 30, what="gave up")
        monkeypatch.setenv("STANDIN_STARTUP_S", "0.2")  # the operator fixed the cause
        await sup.start("slow", by="alice")
        await h.wait_for(lambda: sup.state == "ready", 20, what="ready after the operator's start")
        assert not (tmp_path / "state" / "readiness-timeouts.json").exists()
    finally:
        await sup.shutdown(stop_serving=True)


def _agent(**keys) -> AgentConfig:
    base: dict = dict(database=Path("/nonexistent/lynxtop.db"), socket=Path("/nonexistent/agent.sock"),
                      crash_loop_failures=5, crash_loop_window_s=1800, backoff_initial_s=10, backoff_max_s=300)
    base.update(keys)
    return AgentConfig(**base)


def test_a_ready_run_between_two_timeouts_starts_the_count_again():
    w = FailureWindow(_agent())
    t = 0.0
    for _ in range(20):  # a timeout, a retry that became ready and crashed later, ... never two timeouts in a row
        assert w.fail(t, readiness_timeout=True) is not None
        w.ready()
        t += 3600
    assert w.timeouts_in_a_row == 0


def test_crashes_between_two_timeouts_do_not_hide_them():
    """Timeout, crash before ready, timeout: no ready run between the two timeouts, so they are in a row."""
    w = FailureWindow(_agent())
    assert w.fail(0.0, readiness_timeout=True) is not None
    assert w.fail(3600.0) is not None  # a crash before ready, more than a window later
    assert w.fail(7200.0, readiness_timeout=True) is None


def test_fast_crashes_keep_the_window_rule():
    a = _agent(crash_loop_failures=3, crash_loop_window_s=60)
    w = FailureWindow(a)
    assert w.fail(0.0) is not None and w.fail(1.0) is not None
    assert w.fail(2.0) is None  # three in the window
    slow = FailureWindow(a)
    assert all(slow.fail(t * 100.0) is not None for t in range(50))  # crashes one window apart: retried
    assert policy.after_failure([0.0], 1, a, timeouts_in_a_row=2).next is policy.Next.GIVE_UP
    assert policy.after_failure([0.0], 1, a, timeouts_in_a_row=1).next is policy.Next.RETRY


def test_readiness_timeouts_at_the_defaults_give_up_at_the_second():
    """The audited case, at the real defaults: 1800 s timeout, 1800 s window, 5 failures."""
    a = _agent(**{f.name: f.default for f in dataclasses.fields(AgentConfig)
                  if f.name in ("crash_loop_failures", "crash_loop_window_s", "backoff_initial_s", "backoff_max_s")})
    assert a.crash_loop_window_s == 1800 and a.crash_loop_failures == 5
    w = FailureWindow(a)
    now = time.monotonic()
    assert w.fail(now, readiness_timeout=True) is not None
    assert w.fail(now + 1800 + 30 + 10, readiness_timeout=True) is None
