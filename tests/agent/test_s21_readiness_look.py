"""Readiness is noticed when /health answers, not after the watch's look at the run's processes.

While a run loads, the watch looks at every process of the node (in a worker thread) about each second. On a busy
agent (a DP8 /metrics scrape, many status pollers) each /proc read of that look waits for the GIL, and the watch
awaited the look before each /health probe: readiness came seconds late (session 20: 6-9 s). Here the environment
is made slow the same way: the run's member look sleeps in its worker thread before looking; the look on the
loop's own thread (the port check at readiness, note_files) stays fast, as it is in the field.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from pathlib import Path

import pytest
from support.waits import wait_for_async as wait_for

from lynxtop.agent.serving import launcher

pytestmark = pytest.mark.timeout(90)

SLOW_S = 6.0  # how long each member look in a worker thread takes here (the busy agent's GIL convoy)


class SlowLooks:
    """ServerProcess.members made slow in worker threads (the environment, not the code under test): each call
    off the loop's thread sleeps `delay` s before the real look; `fail` makes it raise instead."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, delay: float = SLOW_S, fail: str | None = None):
        self.started: list[float] = []
        self.ended: list[float] = []
        self.delay, self.fail = delay, fail
        real = launcher.ServerProcess.members
        looks = self

        def members(proc: launcher.ServerProcess, table=None) -> list[int]:
            if table is not None or threading.current_thread() is threading.main_thread():
                return real(proc, table)
            looks.started.append(time.monotonic())
            try:
                if looks.fail is not None:
                    raise OSError(looks.fail)
                time.sleep(looks.delay)
                return real(proc, table)
            finally:
                looks.ended.append(time.monotonic())

        monkeypatch.setattr(launcher.ServerProcess, "members", members)


async def health_200(port: int) -> bool:
    """Whether GET /health on the simulator answers 200 now (a raw request: no client of the agent's)."""
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), 1.0)
    except (TimeoutError, OSError):
        return False
    try:
        writer.write(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        await writer.drain()
        line = await asyncio.wait_for(reader.readline(), 2.0)
        return line.split()[1:2] == [b"200"]
    except (TimeoutError, OSError, IndexError):
        return False
    finally:
        writer.close()


async def first_200(port: int, until: float) -> float | None:
    """When /health first answered 200 (monotonic), polled every 20 ms."""
    while time.monotonic() < until:
        if await health_200(port):
            return time.monotonic()
        await asyncio.sleep(0.02)
    return None


def look_tasks() -> list[asyncio.Task]:
    return [t for t in asyncio.all_tasks() if "look at its processes" in t.get_name() and not t.done()]


def record_members(path: Path) -> list[list[int]]:
    try:
        return json.loads(path.read_text()).get("members", [])
    except (OSError, ValueError):
        return []


async def test_ready_within_2_s_of_health_while_a_member_look_is_slow(make_sup, h, tmp_path, monkeypatch):
    monkeypatch.setenv("LYNXTOP_SIM_STATE_DIR", str(tmp_path / "sim"))
    looks = SlowLooks(monkeypatch)
    sup = make_sup(profiles=h.sim_profile("alpha", startup_s=0.3))
    port = sup.cfg.profile("alpha").port
    try:
        t0 = time.monotonic()
        observer = asyncio.create_task(first_200(port, t0 + 40))
        await sup.start("alpha", by="test")
        healthy_at = await observer
        assert healthy_at is not None, "the simulator never answered GET /health 200"
        await wait_for(lambda: sup.state == "ready", 40, step=0.01, what="ready")
        ready_at = time.monotonic()
        assert looks.started, "no member look ran while the run loaded"
        late = ready_at - healthy_at
        assert late < 2.0, (f"ready {late:.1f} s after GET /health first answered 200 (a member look takes "
                            f"{SLOW_S:g} s here; looks started at "
                            f"{[round(t - t0, 1) for t in looks.started]} s)")
        # the scenario held: a look was in flight when the run became ready
        assert any(s < healthy_at and (i >= len(looks.ended) or looks.ended[i] > healthy_at)
                   for i, s in enumerate(looks.started)), (t0, healthy_at, looks.started, looks.ended)
        # nothing of the watch's look is left running as an asyncio task once the run is ready
        await wait_for(lambda: not look_tasks(), 5, what="no member-look task left after readiness")
        # the slow look's thread finishes; the record keeps the run's processes, ready_ms included
        await wait_for(lambda: len(looks.ended) == len(looks.started), 3 * SLOW_S, what="the slow look's end")
        state = tmp_path / "state" / "serving.json"
        live = sorted([p, t] for p, t in sup.proc.known.items() if p in set(sup.proc.members()))
        await wait_for(lambda: live and record_members(state) == live, 10,
                       what=f"serving.json naming the run's processes {live}")
        assert json.loads(state.read_text())["ready_ms"]
        assert sup.state == "ready"
    finally:
        await sup.shutdown(stop_serving=True)


async def test_a_slow_look_mid_load_is_saved_in_the_record(make_sup, h, tmp_path, monkeypatch):
    """A look that ends while the run still loads: its members are written to serving.json then (an agent killed
    mid-load leaves them to the next one), though the watch no longer waits for it."""
    monkeypatch.setenv("LYNXTOP_SIM_STATE_DIR", str(tmp_path / "sim"))
    looks = SlowLooks(monkeypatch, delay=2.0)
    sup = make_sup(profiles=h.sim_profile("alpha", startup_s=30, readiness_timeout_s=60))
    state = tmp_path / "state" / "serving.json"
    try:
        await sup.start("alpha", by="test")
        await wait_for(lambda: looks.ended, 30, what="a member look's end")
        await wait_for(lambda: len(record_members(state)) >= 2, 10,
                       what="serving.json naming the run's processes while it loads")
        assert sup.state == "starting"
        pids = {p for p, _ in record_members(state)}
        assert sup.proc.pid in pids and pids <= set(sup.proc.members())
    finally:
        await sup.shutdown(stop_serving=True)


async def test_a_failing_look_is_logged_and_readiness_still_comes(make_sup, h, tmp_path, monkeypatch, caplog):
    """A look that raises (the OS refusing it) is logged with the run; the watch goes on to see the run ready."""
    monkeypatch.setenv("LYNXTOP_SIM_STATE_DIR", str(tmp_path / "sim"))
    caplog.set_level(logging.WARNING, logger="lynxtop")
    looks = SlowLooks(monkeypatch, delay=0, fail="Too many open files (test)")
    sup = make_sup(profiles=h.sim_profile("alpha", startup_s=0.3))
    try:
        await sup.start("alpha", by="test")
        await wait_for(lambda: sup.state == "ready", 40, what="ready despite failing looks")
        assert looks.started
        said = [r for r in caplog.records if "Too many open files (test)" in r.getMessage()]
        assert said and f"run {sup.run_id}" in said[0].getMessage(), [r.getMessage() for r in caplog.records]
        assert not [r for r in caplog.records if "watching it failed" in r.getMessage()]
    finally:
        await sup.shutdown(stop_serving=True)


async def test_a_run_that_exits_mid_look_leaves_no_look_behind(make_sup, h, tmp_path, monkeypatch):
    """A run that crashes while a (slow) look is in flight: the watch ends without waiting for the look, and no
    task of it is left pending (the next run's watch starts clean)."""
    monkeypatch.setenv("LYNXTOP_SIM_STATE_DIR", str(tmp_path / "sim"))
    looks = SlowLooks(monkeypatch)
    sup = make_sup(profiles=h.sim_profile("oom", sim_args=("--sim-fail", "oom")))
    try:
        await sup.start("oom", by="test")
        await wait_for(lambda: sup.state in ("backoff", "crash-loop"), 30, step=0.01, what="the crash seen")
        crashed_at = time.monotonic()
        assert looks.started and (len(looks.ended) < len(looks.started) or looks.ended[-1] > crashed_at - 1.0), \
            "no look was in flight as the run exited: the scenario did not happen"
        await wait_for(lambda: sup.state == "crash-loop", 60, what="crash loop")
        await wait_for(lambda: not look_tasks(), 5, what="no member-look task left after the runs exited")
    finally:
        await sup.shutdown(stop_serving=True)
