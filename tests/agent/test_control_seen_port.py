"""A switch or restart whose new run could not bind its port is refused before the serving run is stopped.

Before, `start` refused at once (409 port_in_use) but `switch` and `restart` stopped the ready model first and
only then found the port taken: nothing served. Now they make start's checks first, counting only a foreign
holder: the run being replaced holds its own port, and a new profile on that same port is fine.
Real agent process, simulated vLLM, a squatter socket of this test process.
"""

from __future__ import annotations

import asyncio
import os
import socket

import pytest
from support.agent_config import sim_profile, write_agent_config
from support.agent_proc import Agent, state_db
from support.ports import free_port

pytestmark = pytest.mark.timeout(120)


def _config(tmp_path, ports: dict[str, int]):
    profiles = [sim_profile(name, tp=tp, startup_s=0.5, stop_grace_s=5, port=ports[name])
                for name, tp in (("alpha", 8), ("beta", 4), ("gamma", 4))]
    return write_agent_config(tmp_path / "config.toml", tmp_path / "state" / "lynxtop.db",
                              tmp_path / "run" / "agent.sock", fake_nvml="sim", sample_interval_s=0.2,
                              default_profile="alpha", autostart=True, backoff_initial_s=0.3, backoff_max_s=1,
                              gpu_release_timeout_s=10, profiles=profiles)


async def test_switch_and_restart_onto_a_taken_port_are_refused_before_anything_stops(tmp_path, cleanup):
    squatter = socket.socket()
    squatter.bind(("127.0.0.1", 0))
    squatter.listen()
    taken = squatter.getsockname()[1]
    own = free_port()
    ports = {"alpha": own, "beta": taken, "gamma": own}  # gamma shares alpha's port
    cfg = _config(tmp_path, ports)
    a = Agent(tmp_path, cfg)
    cleanup.append(a)
    try:
        st = await a.wait_state(lambda s: s["state"] == "ready", what="ready")
        run1, pid1 = st["serving"]["run_id"], st["serving"]["pid"]
        code, body = await a.api("POST", "/v1/switch", {"profile": "beta"})
        assert code == 409 and body["error"] == "port_in_use", body
        assert f"port {taken} is already in use" in body["message"] and f"pid {os.getpid()}" in body["message"]
        assert body["details"] == {"pids": [os.getpid()], "port": taken}
        # the profile's port edited onto the squatter's: the restart is refused too
        cfg.write_text(cfg.read_text().replace(f"port = {own}\n", f"port = {taken}\n", 1))
        code, body = await a.api("POST", "/v1/restart", {})
        assert code == 409 and body["error"] == "port_in_use", body
        await asyncio.sleep(0.5)
        st = await a.status()
        assert st["serving"]["state"] == "ready" and st["serving"]["run_id"] == run1 and st["serving"]["pid"] == pid1
        assert st["agent"]["action"] is None
        assert not state_db(tmp_path, "SELECT * FROM events WHERE kind IN ('action.switch', 'action.restart', "
                                      "'serving.port_in_use')")
        assert not (tmp_path / "state" / "switch.json").exists()
        # the port given back: the run's own port is no obstacle to its restart, nor to a profile sharing it
        cfg.write_text(cfg.read_text().replace(f"port = {taken}\n", f"port = {own}\n", 1))
        code, body = await a.api("POST", "/v1/restart", {})
        assert code == 202, body
        st = await a.wait_state(lambda s: s["state"] == "ready" and s["run_id"] != run1, what="restarted")
        run2 = st["serving"]["run_id"]
        code, body = await a.api("POST", "/v1/switch", {"profile": "gamma"})
        assert code == 202, body
        st = await a.wait_state(lambda s: s["state"] == "ready" and s["profile"] == "gamma", what="switched")
        assert st["serving"]["run_id"] != run2
    finally:
        squatter.close()
    a.stop()
