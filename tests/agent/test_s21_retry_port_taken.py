"""A retry that finds the profile's port taken backs off and tries again (session 21).

A run crashed; its retry came while another process (the crashed run's straggler, a hand-started server) still held
the port: the agent went "stopped" for good, so the restart policy ended on a passing condition and the node stayed
down until an operator came. The agent's own start (retry, autostart) now counts it as a failure and backs off (the
crash-loop limit still caps it); an operator's start is still refused at once (tests/agent/test_port_identity.py).
Real processes and sockets throughout.
"""

from __future__ import annotations

import json
import os

import pytest
from support.agent_config import agent_toml
from support.db import db_rows
from test_port_identity import foreign_server

from lynxtop.agent.serving import procs

pytestmark = pytest.mark.timeout(120)


def kinds(store) -> list[tuple[str, dict]]:
    assert store.flush(10)
    return [(r["kind"], json.loads(r["details"]) if r["details"] else {})
            for r in db_rows(store.path, "SELECT kind, details FROM events ORDER BY id")]


async def test_a_retry_meeting_a_taken_port_backs_off_and_serves_once_it_is_free(make_sup, store, h, tmp_path,
                                                                                 monkeypatch):
    cfg = tmp_path / "config.toml"
    cfg.write_text(agent_toml(tmp_path / "state" / "lynxtop.db", tmp_path / "run" / "agent.sock",
                              backoff_initial_s=1.5, backoff_max_s=3, crash_loop_failures=5, crash_loop_window_s=120,
                              gpu_release_timeout_s=5, profiles=h.standin_profile("alpha", port=h.free_port())))
    monkeypatch.setenv("STANDIN_MODE", "fail_start")
    monkeypatch.setenv("STANDIN_STARTUP_S", "3")
    sup = make_sup(cfg_path=cfg)
    port = sup.cfg.profile("alpha").port
    await sup.start("alpha", by="test")
    await h.wait_for(lambda: sup.proc is not None and sup.run_id is not None, 20, what="run started")
    first = sup.run_id
    srv = foreign_server(port)  # taken while the run loads: the run never binds it, then fails
    try:
        await h.wait_for(lambda: "is already in use" in (sup.reason or ""), 40, what="the retry finds the port taken")
        assert sup.state == "backoff", (sup.state, sup.reason)
        assert f"port {port} is already in use" in sup.reason, sup.reason
        evs = [d for k, d in kinds(store) if k == "serving.port_in_use"]
        assert evs and all(d["pids"] == [os.getpid()] for d in evs), evs
        monkeypatch.setenv("STANDIN_MODE", "ok")
        monkeypatch.setenv("STANDIN_STARTUP_S", "0.2")
    finally:
        srv.shutdown()
        srv.server_close()
    await h.wait_for(lambda: sup.state == "ready", 40, what="ready once the port is free")
    assert sup.run_id != first
    ours, _ = procs.listener_is_ours(port, sup.proc.members())
    assert ours is True
    backoffs = [d for k, d in kinds(store) if k == "serving.backoff"]
    assert len(backoffs) >= 2, backoffs  # the crash, then the taken port
    await sup.shutdown(stop_serving=True)


async def test_taken_ports_end_in_a_crash_loop_not_a_retry_for_ever(make_sup, store, h, tmp_path, monkeypatch):
    cfg = tmp_path / "config.toml"
    cfg.write_text(agent_toml(tmp_path / "state" / "lynxtop.db", tmp_path / "run" / "agent.sock",
                              backoff_initial_s=0.2, backoff_max_s=0.5, crash_loop_failures=3, crash_loop_window_s=120,
                              gpu_release_timeout_s=5, profiles=h.standin_profile("alpha", port=h.free_port())))
    monkeypatch.setenv("STANDIN_MODE", "fail_start")
    monkeypatch.setenv("STANDIN_STARTUP_S", "2")
    sup = make_sup(cfg_path=cfg)
    port = sup.cfg.profile("alpha").port
    await sup.start("alpha", by="test")
    await h.wait_for(lambda: sup.proc is not None and sup.run_id is not None, 20, what="run started")
    srv = foreign_server(port)
    try:
        await h.wait_for(lambda: sup.state == "crash-loop", 40, what="the crash-loop limit caps the retries")
        assert f"port {port} is already in use" in sup.reason, sup.reason
        starts = [d for k, d in kinds(store) if k == "serving.port_in_use" and "port" in d and "run" not in d]
        assert starts, kinds(store)
    finally:
        srv.shutdown()
        srv.server_close()
    await sup.shutdown(stop_serving=True)
