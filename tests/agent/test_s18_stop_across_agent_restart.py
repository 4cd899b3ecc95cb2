"""An operator's stop outlives the agent (session 18).

- The agent dies (OOM killer, watchdog abort, kill -9) while an operator's stop drains vLLM: the next agent adopted
  the draining server, recorded its exit as a crash "not requested by anyone" and the retry loaded the model again,
  autostart off or not. Now `stopped.json` says a stop is under way (its run, since when, its grace) from before the
  SIGTERM, and the next agent finishes the stop instead of adopting: the rest of the grace, then SIGKILL, the GPUs'
  release, the run closed as stopped by the operator.
- With `autostart = true` (the shipped example), an operator stops serving, then the agent restarts (an upgrade, the
  watchdog, the OOM killer): the default profile was autostarted. Now the stop is kept, with the boot id, until an
  operator starts, restarts or switches, or the node reboots: autostart is held (`agent.autostart_held`, reason
  `stopped_by_operator`) and the status says why serving is stopped.

Real agents (`lynxtop agent` processes) supervising the stand-in vLLM (tests/agent/standin_vllm.py).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support.agent_config import write_agent_config
from support.agent_proc import Agent, run_leaders
from support.db import db_rows

pytestmark = pytest.mark.timeout(150)


def cfg_for(tmp_path, h, autostart=True):
    prof = h.standin_profile("alpha", tp=8, readiness_s=60, stop_grace_s=12)
    return write_agent_config(tmp_path / "config.toml", tmp_path / "state" / "lynxtop.db",
                              tmp_path / "run" / "agent.sock", fake_nvml="sim", sample_interval_s=0.2,
                              default_profile="alpha", autostart=autostart, backoff_initial_s=0.3, backoff_max_s=1,
                              gpu_release_timeout_s=5, profiles=[prof])


def runs(tmp_path):
    return db_rows(tmp_path / "state" / "lynxtop.db", "SELECT id, end_reason FROM runs ORDER BY id")


def events(tmp_path, kind):
    return db_rows(tmp_path / "state" / "lynxtop.db", "SELECT kind, message, details FROM events WHERE kind = ? "
                   "ORDER BY id", (kind,))


async def watch(agent, seconds):
    """The (state, run id) pairs the status shows for `seconds`, each change once."""
    seen = []
    t0 = time.monotonic()
    while time.monotonic() - t0 < seconds:
        st = (await agent.status())["serving"]
        item = (st["state"], st["run_id"])
        if not seen or seen[-1] != item:
            seen.append(item)
        await asyncio.sleep(0.1)
    return seen


async def ready_then_stopped(tmp_path, cfg, name="a1"):
    a = Agent(tmp_path, cfg, name)
    await a.wait_state(lambda s: s["state"] == "ready", 40)
    code, body = await a.api("POST", "/v1/stop", {})
    assert code == 202, body
    await a.wait_state(lambda s: s["state"] == "stopped", 40)
    return a


async def test_stopped_serving_stays_stopped_across_an_agent_restart(tmp_path, cleanup, h, reap):
    """`lynxtop stop` (GPUs freed for maintenance), then `systemctl restart lynxtop-agent` (an upgrade)."""
    cfg = cfg_for(tmp_path, h)
    a = await ready_then_stopped(tmp_path, cfg)
    cleanup.append(a)
    assert a.stop(signal.SIGTERM) == 0
    b = Agent(tmp_path, cfg, "a2")
    cleanup.append(b)
    await b.wait_notify("READY=1")
    seen = await watch(b, 4)
    assert all(s == "stopped" for s, _ in seen), f"serving the operator stopped was started again: {seen}"
    assert len(runs(tmp_path)) == 1
    held = events(tmp_path, "agent.autostart_held")
    assert len(held) == 1, held
    assert json.loads(held[0]["details"])["reason"] == "stopped_by_operator", held
    assert "lynxtop start" in held[0]["message"], held
    st = (await b.status())["serving"]
    assert "stopped by" in st["reason"] and "autostart" in st["reason"], st["reason"]
    shown = subprocess.run([sys.executable, "-m", "lynxtop", "status", "--socket", b.sock_path], capture_output=True,
                           text=True, timeout=30)
    line = next(x for x in shown.stdout.splitlines() if x.startswith("serving"))
    assert "STOPPED" in line and "stopped by" in line and "autostart of alpha held" in line, shown.stdout
    # an operator's start ends it: serving runs again, and a later agent restart adopts it as any run
    code, body = await b.api("POST", "/v1/start", {"profile": "alpha"})
    assert code == 202, body
    st = await b.wait_state(lambda s: s["state"] == "ready", 40)
    run_id = st["serving"]["run_id"]
    assert b.stop(signal.SIGTERM) == 0
    c = Agent(tmp_path, cfg, "a3")
    cleanup.append(c)
    st = await c.wait_state(lambda s: s["state"] == "ready", 40)
    assert st["serving"]["run_id"] == run_id and st["serving"]["adopted"], st["serving"]
    assert len(events(tmp_path, "agent.autostart_held")) == 1


async def test_after_a_reboot_autostart_goes_ahead(tmp_path, cleanup, h, reap):
    """The stop was of a boot that is gone (another boot id): the node's config says serve, and it does."""
    cfg = cfg_for(tmp_path, h)
    a = await ready_then_stopped(tmp_path, cfg)
    cleanup.append(a)
    assert a.stop(signal.SIGTERM) == 0
    note = tmp_path / "state" / "stopped.json"
    data = json.loads(note.read_text())
    assert data["boot_id"] == Path("/proc/sys/kernel/random/boot_id").read_text().strip(), data
    note.write_text(json.dumps({**data, "boot_id": "00000000-0000-0000-0000-000000000000"}))
    b = Agent(tmp_path, cfg, "a2")
    cleanup.append(b)
    await b.wait_state(lambda s: s["state"] == "ready", 40, "autostarted after the reboot")
    assert not events(tmp_path, "agent.autostart_held")
    assert not note.exists()


@pytest.mark.parametrize("autostart", [False, True])
async def test_agent_killed_during_an_operators_stop_does_not_bring_the_model_back(tmp_path, cleanup, h, reap,
                                                                                  autostart):
    """The agent dies (OOM killer, watchdog abort, kill -9) while an operator's stop drains vLLM."""
    cfg = cfg_for(tmp_path, h, autostart=autostart)
    env = {"STANDIN_MODE": "drain", "STANDIN_DRAIN_S": "5"}
    a = Agent(tmp_path, cfg, "a1", env=env)
    cleanup.append(a)
    await a.wait_notify("READY=1")
    if not autostart:
        code, body = await a.api("POST", "/v1/start", {"profile": "alpha"})
        assert code == 202, body
    await a.wait_state(lambda s: s["state"] == "ready", 40)
    code, body = await a.api("POST", "/v1/stop", {})
    assert code == 202, body
    await a.wait_state(lambda s: s["state"] == "stopping", 10)
    await asyncio.sleep(1.0)
    assert run_leaders(tmp_path), "the server drains"
    a.stop(signal.SIGKILL)
    b = Agent(tmp_path, cfg, "a2", env=env)
    cleanup.append(b)
    await b.wait_notify("READY=1")
    await b.wait_state(lambda s: s["state"] == "stopped", 30, "the stop finished")
    seen = await watch(b, 3)
    rows = runs(tmp_path)
    assert len(rows) == 1, f"the model the operator stopped was started again: {rows}"
    assert rows[0]["end_reason"] == "stopped by operator", rows
    assert all(s == "stopped" for s, _ in seen), seen
    assert not events(tmp_path, "serving.crash"), "the drained server's exit is the stop's, not a crash"
    assert not run_leaders(tmp_path)
    assert not (tmp_path / "state" / "serving.json").exists()


@pytest.mark.parametrize("text", ['{"by": 5, "since_ms": 1}', '{"by": "x", "since_ms": 1e999}', '[1]',
                                  '{"by": "x", "since_ms": 1, "stopping": "yes"}', '{"by": "x", "since_ms": -1}'])
def test_a_note_not_as_an_agent_writes_it_is_said_removed_and_ignored(tmp_path, text):
    """Never fatal at agent start, never a held autostart on the word of a broken note."""
    from lynxtop.agent.serving.stopnote import StopNote

    path = tmp_path / "stopped.json"
    path.write_text(text)
    told = []
    note = StopNote(path, lambda kind, severity, message, *a, **kw: told.append((str(kind), message)))
    assert note.read() is None
    assert not path.exists()
    assert len(told) == 1 and told[0][0] == "agent.state_file" and str(path) in told[0][1], told


def test_a_stop_is_of_this_boot_until_the_boot_id_changes(tmp_path, monkeypatch):
    from lynxtop.agent.serving import stopnote

    note = stopnote.StopNote(tmp_path / "stopped.json", lambda *a, **kw: None)
    note.stopping("uid 1000 (alice)", 7, 30.0)
    stop = note.read()
    assert stop is not None and stop.stopping and stop.run == 7 and stop.this_boot()
    assert 29 < stop.grace_left_s() <= 30
    note.stopped()
    assert note.read() == dataclasses.replace(stop, stopping=False)
    other = tmp_path / "boot_id"
    other.write_text("00000000-0000-0000-0000-000000000001\n")
    monkeypatch.setattr(stopnote, "BOOT_ID", other)
    assert not note.read().this_boot()


def test_the_grace_left_is_counted_by_the_boot_clock_not_the_wall_clock(tmp_path, monkeypatch):
    """The next agent waited out the rest of a drain by the wall clock: a clock stepped forward an hour while vLLM
    drained cut the drain to nothing (SIGKILL at once). The boot clock is the count; the wall clock only for a note
    without it (an older agent's)."""
    import json
    import time

    from lynxtop.agent.serving import stopnote

    path = tmp_path / "stopped.json"
    note = stopnote.StopNote(path, lambda *a, **kw: None)
    note.stopping("uid 1000 (alice)", 7, 30.0)
    assert json.loads(path.read_text())["boot_ms"] > 0
    real_now = stopnote.now_ms
    monkeypatch.setattr(stopnote, "now_ms", lambda: real_now() + 3_600_000)  # the wall clock stepped 1 h forward
    stop = note.read()
    assert 29 < stop.grace_left_s() <= 30
    monkeypatch.setattr(stopnote, "boot_ms", lambda: time.clock_gettime_ns(time.CLOCK_BOOTTIME) // 10**6 + 20_000)
    assert 9 < stop.grace_left_s() <= 10  # 20 s of the drain gone by the boot clock
    older = json.loads(path.read_text())
    del older["boot_ms"]
    path.write_text(json.dumps(older))
    assert note.read().grace_left_s() == 0.0  # no boot clock: the wall clock's hour, as before
    older["boot_ms"] = 2**64
    path.write_text(json.dumps(older))
    assert note.read() is None and not path.exists()
