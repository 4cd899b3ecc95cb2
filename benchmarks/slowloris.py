#!/usr/bin/env python3
"""Slowloris benchmark: thousands of half-sent and idle connections on both listeners of the real agent.

Issue 11 §2: 1,500 half-sent requests on the control socket (or 1,100 idle TCP connections to metrics_listen) took
the agent to its 1024-descriptor limit: /v1/status stopped answering, sampling failed for 114 s with EMFILE and
agent.log grew 324 MB. This runs `python -m lynxtop agent` (simulated vLLM serving, fake NVML "sim") under
RLIMIT_NOFILE 1024 (soft = hard, so the agent cannot raise it: the incident's limit) and a persistent attacker in
its own process: `--unix` connections to the control socket each sending a request header one byte per second
that never ends, and `--tcp` idle connections to metrics_listen from 127.0.0.2 (another host, as far as the agent
can tell); like slowloris, once a second every connection the agent closed is opened again (slowloris' own
cycle is 15 s). Meanwhile an operator's client calls GET /v1/status (a fresh connection each time, like the CLI)
and a scraper GET /metrics from 127.0.0.1, every 50 ms.

`measure()` is also used by benchmarks/agent_faults.py. Last line of output: one JSON object
{slowloris_conns_held, status_p99_ms_under_slowloris, ticks_missed_under_slowloris, log_bytes_under_slowloris, ...}.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import multiprocessing as mp
import os
import resource
import selectors
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import _support  # noqa: F401 - puts tests/ on sys.path for `support`
from support.agent_config import sim_profile, write_agent_config
from support.ports import free_port

ATTACKER_ADDR = "127.0.0.2"  # all of 127/8 is loopback on Linux; Prometheus scrapes from 127.0.0.1
HEADER = b"GET /v1/status HTTP/1.1\r\nHost: agent\r\nUser-Agent: slowloris\r\nX-a: " + b"b" * 4000
AGENT_NOFILE = 1024


class _Unix(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float = 5.0):
        super().__init__("agent", timeout=timeout)
        self.unix_path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect(self.unix_path)


def status(sock: str, timeout: float = 5.0) -> dict | None:
    c = _Unix(sock, timeout)
    try:
        c.request("GET", "/v1/status")
        r = c.getresponse()
        return json.loads(r.read()) if r.status == 200 else None
    except (OSError, ValueError, http.client.HTTPException):
        return None
    finally:
        c.close()


def _metrics_ok(port: int, timeout: float = 5.0) -> bool:
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        c.request("GET", "/metrics")
        r = c.getresponse()
        return r.status == 200 and b"lynxtop_agent_healthy" in r.read()
    except (OSError, http.client.HTTPException):
        return False
    finally:
        c.close()


def _p(values: list[float], q: float) -> float | None:
    if not values:
        return None
    v = sorted(values)
    return v[min(len(v) - 1, max(0, int(round(q * len(v))) - 1))]


# ---------------------------------------------------------------------------------------------- the attacker


def _attacker(sock_path: str, port: int, n_unix: int, n_tcp: int, seconds: float, out: Any) -> None:
    """Keeps n_unix + n_tcp connections open against the agent for `seconds`; reports what it saw."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, max(soft, n_unix + n_tcp + 512)), hard))
    sel = selectors.DefaultSelector()
    conns: dict[socket.socket, dict[str, Any]] = {}
    opened = closed_by_agent = connect_errors = refused_503 = 0

    def open_one(kind: str) -> None:
        nonlocal opened, connect_errors
        try:
            if kind == "unix":
                s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                s.setblocking(False)
                s.connect(sock_path)
            else:
                s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                s.bind((ATTACKER_ADDR, 0))  # another loopback address: the attacker is another host
                s.setblocking(False)
                with contextlib.suppress(BlockingIOError):
                    s.connect(("127.0.0.1", port))
        except OSError:
            connect_errors += 1
            with contextlib.suppress(Exception):
                s.close()
            return
        opened += 1
        conns[s] = {"kind": kind, "sent": 0}
        sel.register(s, selectors.EVENT_READ)

    def drop(s: socket.socket) -> None:
        sel.unregister(s)
        conns.pop(s, None)
        s.close()

    end = time.monotonic() + seconds
    held_samples: list[int] = []
    while time.monotonic() < end:
        # one cycle a second, like slowloris (its default is 15 s): open again what the agent closed, then one
        # more byte of a header that never ends on every unix connection, then watch for closes
        for kind, want in (("unix", n_unix), ("tcp", n_tcp)):
            have = sum(1 for c in conns.values() if c["kind"] == kind)
            for _ in range(want - have):
                open_one(kind)
        for s, c in list(conns.items()):
            if c["kind"] == "unix" and c["sent"] < len(HEADER):
                try:
                    s.send(HEADER[c["sent"]:c["sent"] + 1])
                    c["sent"] += 1
                except BlockingIOError:
                    pass
                except OSError:
                    closed_by_agent += 1
                    drop(s)
        held_samples.append(len(conns))
        cycle_end = min(end, time.monotonic() + 1.0)
        while time.monotonic() < cycle_end:
            for key, _ in sel.select(timeout=max(0.0, cycle_end - time.monotonic())):
                s = key.fileobj
                try:
                    data = s.recv(65536)
                except BlockingIOError:
                    continue
                except OSError:
                    data = b""
                if data.startswith(b"HTTP/1.1 503"):
                    refused_503 += 1
                if not data:
                    closed_by_agent += 1
                    drop(s)
    # what the agent still holds at the end: connections it has not closed
    held = 0
    for s in list(conns):
        try:
            held += s.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) != b""
        except BlockingIOError:
            held += 1
        except OSError:
            pass
    for s in list(conns):
        drop(s)
    out.send({"opened": opened, "closed_by_agent": closed_by_agent, "connect_errors": connect_errors,
              "refused_503": refused_503, "held_at_end": held, "client_open_median": statistics.median(held_samples)
              if held_samples else 0})
    out.close()


# ---------------------------------------------------------------------------------------------- measuring


def measure(sock: str, metrics_port: int, log_path: Path, seconds: float = 20.0, n_unix: int = 1500,
            n_tcp: int = 1100) -> dict[str, Any]:
    """Attack a running agent for `seconds`; return the slowloris_* keys."""
    import psutil

    base: list[float] = []  # the same calls before the flood: what this machine gives without it
    end = time.monotonic() + min(10.0, seconds / 2)
    while time.monotonic() < end:
        t0 = time.perf_counter()
        ok = status(sock) is not None
        base.append((time.perf_counter() - t0) * 1000 if ok else 5000.0)
        _metrics_ok(metrics_port)
        time.sleep(0.05)
    before = status(sock) or {}
    agent = psutil.Process(before["agent"]["pid"]) if before else None
    cpu0 = agent.cpu_times() if agent else None
    log0 = log_path.stat().st_size
    parent, child = mp.Pipe(duplex=False)
    proc = mp.get_context("fork").Process(target=_attacker, args=(sock, metrics_port, n_unix, n_tcp, seconds, child),
                                          daemon=True)
    proc.start()
    time.sleep(1.0)  # let the flood build up first
    lat: list[float] = []
    mlat: list[float] = []
    failures = mfailures = 0
    held_by_agent: list[int] = []
    deadline = time.monotonic() + seconds - 1.5
    while time.monotonic() < deadline:
        t0 = time.perf_counter()
        st = status(sock)
        dt = (time.perf_counter() - t0) * 1000
        if st is None:
            failures += 1
            dt = 5000.0
        else:
            conns = st["agent"].get("connections") or {}
            held_by_agent.append(sum(c.get("open", 0) for c in conns.values()))
        lat.append(dt)
        t0 = time.perf_counter()
        ok = _metrics_ok(metrics_port)
        mlat.append((time.perf_counter() - t0) * 1000 if ok else 5000.0)
        mfailures += not ok
        time.sleep(0.05)
    cpu1 = agent.cpu_times() if agent else None
    report = parent.recv() if parent.poll(seconds + 30) else {}
    proc.join(10)
    time.sleep(0.5)
    after = status(sock) or {}
    a0, a1 = before.get("agent", {}), after.get("agent", {})
    return {
        # the attacker's connections the agent holds at once (its own count; the cap bounds it)
        "slowloris_conns_held": max(held_by_agent) if held_by_agent else None,
        "slowloris_conns_held_at_end": report.get("held_at_end"),
        "status_p99_ms_under_slowloris": round(_p(lat, 0.99), 1) if lat else None,
        "status_median_ms_under_slowloris": round(statistics.median(lat), 1) if lat else None,
        "status_failures_under_slowloris": failures,
        "status_p99_ms_before_slowloris": round(_p(base, 0.99), 1) if base else None,
        "status_median_ms_before_slowloris": round(statistics.median(base), 1) if base else None,
        "status_calls_under_slowloris": len(lat),
        "metrics_p99_ms_under_slowloris": round(_p(mlat, 0.99), 1) if mlat else None,
        "metrics_failures_under_slowloris": mfailures,
        "ticks_missed_under_slowloris": (a1.get("missed_ticks", 0) - a0.get("missed_ticks", 0)) if a1 else None,
        "ticks_failed_under_slowloris": (a1.get("failed_ticks", 0) - a0.get("failed_ticks", 0)) if a1 else None,
        "log_bytes_under_slowloris": log_path.stat().st_size - log0,
        "agent_cpu_pct_under_slowloris": round(100 * (cpu1.user + cpu1.system - cpu0.user - cpu0.system)
                                               / (seconds - 1.5), 1) if cpu0 and cpu1 else None,
        "slowloris_opened": report.get("opened"),
        "slowloris_closed_by_agent": report.get("closed_by_agent"),
        "slowloris_connect_errors": report.get("connect_errors"),
        "slowloris_refused_503": report.get("refused_503"),
            "slowloris_attack": {"unix": n_unix, "tcp": n_tcp, "seconds": seconds, "cycle_s": 1.0},
        "agent_connections_after": a1.get("connections"),
        "agent_descriptors_after": a1.get("descriptors"),
        "agent_healthy_after": a1.get("healthy"),
    }


def agent_limit() -> None:
    """preexec_fn: the agent runs with the incident's descriptor limit, soft = hard (it cannot raise it)."""
    resource.setrlimit(resource.RLIMIT_NOFILE, (AGENT_NOFILE, AGENT_NOFILE))


def stop_agent(agent: subprocess.Popen, sim_state: Path) -> None:
    """SIGTERM the agent (killed after 30 s), then kill the simulated servers it leaves running (live restore)."""
    from lynxtop.agent import procs

    agent.send_signal(signal.SIGTERM)
    try:
        agent.wait(30)
    except subprocess.TimeoutExpired:
        agent.kill()
    for p in procs.all_pids():
        if procs.environ_has(p, "LYNXTOP_SIM_STATE_DIR", str(sim_state)):
            with contextlib.suppress(ProcessLookupError):
                os.kill(p, signal.SIGKILL)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--unix", type=int, default=1500)
    ap.add_argument("--tcp", type=int, default=1100)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="lynxtop-slowloris-"))
    sock = str(tmp / "agent.sock")
    port = free_port()
    cfg = write_agent_config(tmp / "config.toml", tmp / "state" / "lynxtop.db", sock, fake_nvml="sim",
                             sample_interval_s=0.2, metrics_listen=f"127.0.0.1:{port}", default_profile="sim",
                             autostart=True, profiles=sim_profile("sim", readiness_timeout_s=60, stop_grace_s=5))
    env = dict(os.environ, LYNXTOP_SIM_STATE_DIR=str(tmp / "sim-state"))
    env.pop("NOTIFY_SOCKET", None)
    log_path = tmp / "agent.log"
    log = open(log_path, "wb")  # noqa: SIM115
    prof = ["-m", "cProfile", "-o", os.environ["SLOWLORIS_PROFILE"]] if os.environ.get("SLOWLORIS_PROFILE") else []
    agent = subprocess.Popen([sys.executable, *prof, "-m", "lynxtop", "agent", "--config", str(cfg)], stdout=log,
                             stderr=subprocess.STDOUT, env=env, preexec_fn=agent_limit)
    result: dict[str, Any] = {}
    try:
        deadline = time.monotonic() + 60
        while True:
            st = status(sock)
            if st and st["serving"]["state"] == "ready":
                break
            if agent.poll() is not None or time.monotonic() > deadline:
                print(log_path.read_text()[-3000:], file=sys.stderr)
                return 1
            time.sleep(0.1)
        time.sleep(1.0)
        result = measure(sock, port, log_path, args.seconds, args.unix, args.tcp)
    finally:
        stop_agent(agent, tmp / "sim-state")
        log.close()
    result["agent_nofile"] = AGENT_NOFILE
    result["agent_log"] = str(log_path)
    print(json.dumps(result))
    ok = (result.get("status_p99_ms_under_slowloris") or 1e9) <= 100 and result.get("ticks_missed_under_slowloris") \
        == 0 and result.get("log_bytes_under_slowloris", 1e9) <= 1 << 20
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
