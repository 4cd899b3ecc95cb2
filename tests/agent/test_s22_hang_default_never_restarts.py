"""restart_on_hang is off by default, and a hang then restarts nothing (session 22 mutation audit).

A deliberate break (the default flipped to True) passed every test: they checked that the leader was alive right
after the verdict, while a restart is only scheduled then. This one checks the parsed default and, for 2 s after
the verdict, that no action holds the slot and the same pid serves. An in-process supervisor serving the stand-in
vLLM (a real process)."""

from __future__ import annotations

import asyncio

import pytest

from lynxtop.agent.serving.health import HangDetector

pytestmark = pytest.mark.timeout(90)


async def test_a_hang_under_the_default_config_degrades_and_restarts_nothing(make_sup, store, h):
    """restart_on_hang is off unless configured: a hang verdict degrades, starts no restart, the same pid serves."""
    sup = make_sup('hang_timeout_s = 5')
    assert sup.cfg.agent.restart_on_hang is False
    await sup.start("alpha", by="uid 0 (root) pid 1")
    await h.wait_for(lambda: sup.state == "ready" and sup.action is None, 30, what="ready")
    pid = sup.proc.pid
    hang = HangDetector(sup.cfg.agent.hang_timeout_s)
    for now in (1000.0, 1004.0, 1005.5):
        v = hang.observe(3, 100, None, now=now)
        if v is not None:
            sup.on_verdict(v)
    assert sup.state == "degraded" and "hang" in sup.reason
    for _ in range(40):  # 2 s: a restart, had one begun, holds the action slot or replaces the process
        assert sup.action is None, sup.action
        await asyncio.sleep(0.05)
    assert sup.proc is not None and sup.proc.pid == pid and sup.proc.leader_alive()
    await sup.shutdown(stop_serving=True)

