"""The real agent process (simulated vLLM, fake NVML): SIGHUP reloads the config and stops nothing; a starting
run's readiness deadline is in the status the agent serves."""

from __future__ import annotations

import asyncio
import signal

import pytest
from support.agent_config import sim_profile, write_agent_config
from support.agent_proc import Agent, e2e_config, state_db

from lynxtop.agent.serving import procs
from lynxtop.cli import ctl
from lynxtop.contract.status import Status

pytestmark = pytest.mark.timeout(90)


async def _wait_output(a: Agent, text: str, timeout: float = 10) -> str:
    for _ in range(int(timeout / 0.05)):
        out = a.output()
        if text in out:
            return out
        await asyncio.sleep(0.05)
    raise AssertionError(f"{text!r} not in the agent's output:\n{a.output()}")


async def _profiles(a: Agent) -> list[str]:
    code, body = await a.api("GET", "/v1/profiles")
    assert code == 200
    return [p["name"] for p in body["profiles"]]


async def test_sighup_reloads_the_config_and_leaves_serving_alone(tmp_path, cleanup):
    cfg = e2e_config(tmp_path)
    a = Agent(tmp_path, cfg)
    cleanup.append(a)
    st = await a.wait_state(lambda s: s["state"] == "ready", what="ready")
    run, pid = st["serving"]["run_id"], st["serving"]["pid"]
    cfg.write_text(cfg.read_text() + sim_profile("v4-tp2", tp=2))
    a.drain()
    a.messages.clear()
    a.proc.send_signal(signal.SIGHUP)
    await a.wait_notify("RELOADING=1")  # systemd's reload protocol: RELOADING=1, then READY=1 once done
    out = await _wait_output(a, "config reloaded")
    assert "v4-tp2" in out.split("config reloaded", 1)[1].splitlines()[0]
    assert a.proc.poll() is None  # the agent lives
    assert "v4-tp2" in await _profiles(a)
    await asyncio.sleep(1)
    st = await a.status()
    assert st["serving"]["run_id"] == run and st["serving"]["pid"] == pid and st["serving"]["state"] == "ready"
    assert procs.alive(pid)
    # a config with errors is refused, the one in use kept; still nothing stopped
    good = cfg.read_text()
    cfg.write_text(good + "\n[[profile]]\nname = \"broken\"\nport = \"not a port\"\n")
    a.proc.send_signal(signal.SIGHUP)
    await _wait_output(a, "kept the previous config")
    assert a.proc.poll() is None
    assert "broken" not in await _profiles(a) and "v4-tp2" in await _profiles(a)
    st = await a.status()
    assert st["serving"]["run_id"] == run and st["serving"]["pid"] == pid and st["serving"]["state"] == "ready"
    assert len(state_db(tmp_path, "SELECT id FROM runs")) == 1
    # and it still stops cleanly afterwards (systemd's STOPPING=1, agent.stopped), leaving serving up (live restore)
    a.drain()  # the notify queue is small: make room for STOPPING=1
    assert a.stop() == 0
    assert any("STOPPING=1" in m for m in a.messages)
    assert "agent.stopped" in [e["kind"] for e in state_db(tmp_path, "SELECT kind FROM events")]
    assert procs.alive(pid)


async def test_a_starting_run_shows_its_readiness_deadline(tmp_path, cleanup):
    profiles = [sim_profile("slow", tp=8, startup_s=20, readiness_timeout_s=600, stop_grace_s=3)]
    cfg = write_agent_config(tmp_path / "config.toml", tmp_path / "state" / "lynxtop.db",
                             tmp_path / "run" / "agent.sock", fake_nvml="sim", sample_interval_s=0.2,
                             default_profile="slow", autostart=True, profiles=profiles)
    a = Agent(tmp_path, cfg)
    cleanup.append(a)
    st = await a.wait_state(lambda s: s["state"] == "starting", what="starting")
    srv = st["serving"]
    assert srv["ready_timeout_s"] == 600
    assert abs(srv["ready_deadline_ms"] - (srv["started_ms"] + 600_000)) <= 1000, srv
    text = ctl.format_status(Status.from_json(st))
    assert "of at most 10m00s (readiness_timeout_s 600): stopped in 9m" in text, text
    code, _ = await a.api("POST", "/v1/stop", {})
    assert code in (200, 202)
    st = await a.wait_state(lambda s: s["state"] == "stopped", what="stopped")
    assert st["serving"]["ready_timeout_s"] is None and st["serving"]["ready_deadline_ms"] is None
    a.stop()


def test_a_reload_before_ready_tells_systemd_nothing_and_a_bad_file_keeps_the_config(tmp_path):
    from lynxtop.agent.config_source import ConfigSource
    from lynxtop.agent.node import reload_config
    from lynxtop.contract.config import load_config

    cfg_path = e2e_config(tmp_path)
    source = ConfigSource(load_config(str(cfg_path)))
    before = source.current
    cfg_path.write_text(cfg_path.read_text() + "\n[[profile]]\nname = 7\n")
    msg = reload_config(source, None, lambda: "starting")
    assert "kept the previous config" in msg and source.current is before

    class Notifier:
        sent: list[tuple[str, ...]] = []

        def send(self, *lines: str) -> bool:
            self.sent.append(lines)
            return True

        def ready(self, status: str = "") -> bool:
            return self.send("READY=1", f"STATUS={status}")

    n = Notifier()
    cfg_path.write_text(cfg_path.read_text().replace("\n[[profile]]\nname = 7\n", "") + sim_profile("v4-tp2", tp=2))
    msg = reload_config(source, n, lambda: "serving ready")  # type: ignore[arg-type]
    assert "config reloaded" in msg and "v4-tp2" in [p.name for p in source.current.profiles]
    assert n.sent[0][0] == "RELOADING=1" and n.sent[0][1].startswith("MONOTONIC_USEC=")
    assert n.sent[1] == ("READY=1", "STATUS=serving ready")


async def _events(a: Agent, kind: str, n: int, timeout: float = 10) -> list[dict]:
    """The agent's events of `kind` through its events API, once there are `n` (the store writes them async)."""
    for _ in range(int(timeout / 0.05)):
        a.drain()  # the notify queue is small: a full one only makes the agent warn, but keep it quiet
        code, body = await a.api("GET", "/v1/events?since=0&limit=1000")
        assert code == 200
        found = [e for e in body["events"] if e["kind"] == kind]
        if len(found) >= n:
            return found
        await asyncio.sleep(0.05)
    raise AssertionError(f"no {n} {kind} events; the agent's output:\n{a.output()}")


async def test_sighup_reload_is_an_event_and_a_bad_file_one_naming_its_problems(tmp_path, cleanup):
    # the file's own name is foreign text: it reaches the events escaped, never as a terminal escape
    cfg = e2e_config(tmp_path, autostart=False).rename(tmp_path / "conf\x1b[2J.toml")
    a = Agent(tmp_path, cfg)
    cleanup.append(a)
    await a.wait_notify("READY=1")
    cfg.write_text(cfg.read_text() + sim_profile("v4-tp2", tp=2))
    a.proc.send_signal(signal.SIGHUP)
    (ok,) = await _events(a, "agent.config_reloaded", 1)
    assert ok["severity"] == "info"
    assert ok["details"]["profiles"] == ["v4-tp8", "v4-tp4", "v4-tp2"]
    assert ok["details"]["file"] == str(tmp_path / "conf\\x1b[2J.toml")
    assert "v4-tp2" in ok["message"] and "conf\\x1b[2J.toml" in ok["message"] and "\x1b" not in ok["message"]
    # a file with errors: the event names them, each escaped and cut, and no more than a bounded number of them
    good = cfg.read_text()
    broken = "".join(f'\n[[profile]]\nname = "broken{i}"\nport = "\\u001b]0;pwned\\u0007{"x" * 2000}"\n'
                     for i in range(30))
    cfg.write_text(good + broken)
    a.proc.send_signal(signal.SIGHUP)
    (failed,) = await _events(a, "agent.config_reload_failed", 1)
    assert failed["severity"] == "warning"
    details = failed["details"]
    assert details["file"] == str(tmp_path / "conf\\x1b[2J.toml")
    assert details["problems_total"] == 90  # per profile: the port, the executable, the model
    problems = details["problems"]
    assert 0 < len(problems) <= 20 and all(len(p) <= 240 for p in problems)
    assert "broken0" in problems[0] and ".port" in problems[0]
    assert "kept" in failed["message"] and "broken0" in failed["message"] and len(failed["message"]) <= 2000
    for text in (failed["message"], *problems):
        assert "\x1b" not in text and "\x07" not in text
    assert "broken0" not in await _profiles(a)  # the config in use kept
    assert len(await _events(a, "agent.config_reloaded", 1)) == 1
    a.stop()
