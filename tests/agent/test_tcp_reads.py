"""Another node's History, Events, Logs and Processes over the TCP endpoint (issue 28, `[agent] tcp_reads`).

A real agent serves a simulated run with a secret in its env, its `metrics_listen` on loopback. Reads over TCP are
off by default (403 saying what to set); on, they answer only the holder of the token in `tcp_token_file` (401
otherwise, with nothing of the data and nothing of the token in the answer or the agent's log), and then answer what
the unix socket answers, and the History charts' series as the store's reader reads them.
"""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from pathlib import Path

import aiohttp
import pytest
from support.agent_config import sim_profile, write_agent_config
from support.agent_proc import Agent, reap_sims
from support.ports import free_port, short_dir

from lynxtop.contract.client import AgentClient, AgentRefused
from lynxtop.store.reader import StoreReader

pytestmark = pytest.mark.timeout(120)

TOKEN = "tcp-read-token-5d1e9c0b7a2f4e68"
HF_SECRET = "hf_tcpReadsSecret0Zq7"


def _config(tmp: Path, sock: Path, port: int, reads: bool) -> Path:
    token = tmp / "read.token"
    token.write_text(TOKEN + "\n")
    token.chmod(0o600)
    extra = f'tcp_reads = true\ntcp_token_file = "{token}"\n' if reads else ""
    profiles = [sim_profile("sim", startup_s=0.3, stop_grace_s=5, env={"HF_TOKEN": HF_SECRET},
                            sim_args=("--sim-log-interval", "0.2"))]
    return write_agent_config(tmp / "config.toml", tmp / "state" / "lynxtop.db", sock, fake_nvml="sim",
                              sample_interval_s=0.2, default_profile="sim", autostart=True, gpu_release_timeout_s=10,
                              metrics_listen=f"127.0.0.1:{port}", extra=extra, profiles=profiles)


async def _get(port: int, path: str, token: str | None = None) -> tuple[int, dict, dict]:
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    async with aiohttp.ClientSession() as s, s.get(f"http://127.0.0.1:{port}{path}", headers=headers) as r:
        return r.status, await r.json(content_type=None) if r.content_type == "application/json" else {}, \
            dict(r.headers)


async def _ready_agent(tmp: Path, d: Path, reads: bool) -> tuple[Agent, int]:
    port = free_port()
    cfg = _config(tmp, d / "a.sock", port, reads)
    agent = Agent(tmp, cfg, sock=d / "a.sock")
    if reads:  # a run, its events and log to read
        await agent.wait_state(lambda s: s["state"] == "ready", timeout=60, what="ready")
    else:
        await agent.wait_notify("READY=1", timeout=60)
    return agent, port


async def test_reads_over_tcp_are_off_by_default_and_say_what_to_set(tmp_path):
    with short_dir() as d:
        agent, port = await _ready_agent(tmp_path, d, reads=False)
        try:
            for path in ("/v1/runs", "/v1/events", "/v1/logs", "/v1/processes", "/v1/history?read=runs"):
                code, body, _ = await _get(port, path, TOKEN)
                assert code == 403 and body["error"] == "tcp_reads_off", (path, body)
                assert "tcp_reads = true" in body["message"] and "runs" not in body
            code, body, _ = await _get(port, "/v1/status")  # the cluster view's read stays open
            assert code == 200 and "serving" in body
            code, _, _ = await _get(port, "/v1/start")
            assert code == 404  # and never a control route
        finally:
            agent.stop()
            reap_sims(tmp_path / "sim-state")


async def test_reads_need_the_token_and_then_answer_what_the_socket_answers(tmp_path):
    with short_dir() as d:
        agent, port = await _ready_agent(tmp_path, d, reads=True)
        try:
            for token in (None, "", "Bearer", TOKEN[:-1], TOKEN + "x", TOKEN.upper()):
                for path in ("/v1/runs", "/v1/events?limit=5", "/v1/logs", "/v1/processes",
                             "/v1/history?read=series&table=gpu&start=0&end=9999999999999"):
                    code, body, headers = await _get(port, path, token)
                    assert code == 401 and body["error"] == "unauthorized", (path, token, body)
                    assert set(body) == {"error", "message"} and "tcp_token_file" in body["message"]
                    assert headers.get("WWW-Authenticate", "").startswith("Bearer")
            # a wrong scheme with the right token is refused too
            async with aiohttp.ClientSession() as s, s.get(f"http://127.0.0.1:{port}/v1/runs",
                                                           headers={"Authorization": f"Basic {TOKEN}"}) as r:
                assert r.status == 401

            tcp = AgentClient(f"http://127.0.0.1:{port}", token=TOKEN)
            sock = AgentClient(d / "a.sock")
            assert [r.to_json() for r in tcp.runs()] == [r.to_json() for r in sock.runs()] != []
            ev_tcp = tcp.request("GET", "/v1/events", {"limit": 50})
            ev_sock = sock.request("GET", "/v1/events", {"limit": 50})
            assert ev_tcp == ev_sock and ev_tcp["events"]
            run_id = tcp.runs()[0].id
            log_tcp = tcp.request("GET", "/v1/logs", {"run": run_id, "lines": 20})
            log_sock = sock.request("GET", "/v1/logs", {"run": run_id, "lines": 20})
            assert log_tcp["path"] == log_sock["path"] and log_tcp["lines"] and log_tcp["inode"] == log_sock["inode"]
            procs = tcp.request("GET", "/v1/processes")
            assert procs.keys() == sock.request("GET", "/v1/processes").keys() and "processes" in procs
            with pytest.raises(AgentRefused) as bad:  # the socket's own checks, word for word
                tcp.request("GET", "/v1/runs", {"limit": 0})
            assert bad.value.status == 400 and bad.value.code == "out_of_range"

            # the History charts' series, as the store's reader reads them
            start = min(e["ts_ms"] for e in ev_tcp["events"]) - 1000
            end = start + 120_000
            cols = ["sm_active_pct", "dram_bw_pct"]  # two of the History screen's GPU columns
            got = tcp.request("GET", "/v1/history", {"read": "series", "table": "gpu", "columns": ",".join(cols),
                                                     "start": start, "end": end, "max_points": 4000})
            reader = StoreReader(tmp_path / "state" / "lynxtop.db")
            try:
                res, rows = reader.series("gpu", cols, start, end, max_points=4000)
                runs = reader.runs(limit=50)
            finally:
                reader.close()
            assert got["resolution"] == res == "raw" and rows and set(rows[0]) == {"ts_ms", "gpu", *cols}
            assert got["rows"][: len(rows)] == rows  # and those written since
            hist_runs = tcp.request("GET", "/v1/history", {"read": "runs"})["runs"]
            assert [r["id"] for r in hist_runs] == [r.id for r in runs]
            one = tcp.request("GET", "/v1/history", {"read": "run", "id": run_id, "summary": 0})["run"]
            assert one["id"] == run_id
            with pytest.raises(AgentRefused) as bad:
                tcp.request("GET", "/v1/history", {"read": "series", "table": "gpu", "columns": "x; DROP TABLE gpu",
                                                   "start": start, "end": end})
            assert bad.value.status == 400 and "unknown column" in bad.value.message
            with pytest.raises(AgentRefused) as bad:
                tcp.request("GET", "/v1/history", {"read": "nope"})
            assert bad.value.status == 400 and "'read'" in bad.value.message

            # nothing of the token, nor the profile's secret, in any answer or the agent's log
            answers = repr((ev_tcp, log_tcp, procs, hist_runs, one)) + agent.output()
            assert TOKEN not in answers and HF_SECRET not in answers
            assert "without the read token" in agent.output()
        finally:
            agent.stop()
            reap_sims(tmp_path / "sim-state")
        log = (tmp_path / "agent.log").read_text(errors="replace")
        assert TOKEN not in log and HF_SECRET not in log
        db = sqlite3.connect(tmp_path / "state" / "lynxtop.db")
        try:
            dump = "\n".join(db.iterdump())
        finally:
            db.close()
        assert TOKEN not in dump


def test_config_check_refuses_tcp_reads_without_a_usable_token_file(tmp_path):
    """`config check` (the agent's own check) names what is wrong: no token file, a loose mode, too short."""
    token = tmp_path / "t.token"
    token.write_text(TOKEN + "\n")
    token.chmod(0o644)
    short = tmp_path / "short.token"
    short.write_text("abc\n")
    short.chmod(0o600)
    cases = (("tcp_reads = true\n", "needs agent.tcp_token_file"),
             (f'tcp_reads = true\ntcp_token_file = "{token}"\n', "has mode 0644"),
             (f'tcp_reads = true\ntcp_token_file = "{short}"\n', "holds 3 characters"))
    for extra, why in cases:
        cfg = write_agent_config(tmp_path / "c.toml", tmp_path / "db", tmp_path / "s.sock",
                                 metrics_listen="127.0.0.1:9464", extra=extra)
        out = subprocess.run([sys.executable, "-m", "lynxtop", "config", "check", "--config", str(cfg)],
                             capture_output=True, text=True, timeout=60, check=False)
        assert out.returncode != 0 and why in out.stdout + out.stderr, (extra, out.stdout, out.stderr)
        assert "Traceback" not in out.stderr and TOKEN not in out.stdout + out.stderr
