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
from dataclasses import dataclass, field
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


class _Attack:
    """The attacker's connections: opened again when the agent closes them, each unix one trickling a header."""

    def __init__(self, sock_path: str, port: int):
        self.sock_path, self.port = sock_path, port
        self.sel = selectors.DefaultSelector()
        self.conns: dict[socket.socket, dict[str, Any]] = {}
        self.opened = self.closed_by_agent = self.connect_errors = self.refused_503 = 0

    def _connect(self, kind: str) -> socket.socket:
        if kind == "unix":
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                s.setblocking(False)
                s.connect(self.sock_path)
            except OSError:
                s.close()
                raise
            return s
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            s.bind((ATTACKER_ADDR, 0))  # another loopback address: the attacker is another host
            s.setblocking(False)
            with contextlib.suppress(BlockingIOError):
                s.connect(("127.0.0.1", self.port))
        except OSError:
            s.close()
            raise
        return s

    def open_one(self, kind: str) -> None:
        try:
            s = self._connect(kind)
        except OSError:
            self.connect_errors += 1
            return
        self.opened += 1
        self.conns[s] = {"kind": kind, "sent": 0}
        self.sel.register(s, selectors.EVENT_READ)

    def drop(self, s: socket.socket) -> None:
        self.sel.unregister(s)
        self.conns.pop(s, None)
        s.close()

    def top_up(self, wants: dict[str, int]) -> None:
        for kind, want in wants.items():
            have = sum(1 for c in self.conns.values() if c["kind"] == kind)
            for _ in range(want - have):
                self.open_one(kind)

    def trickle(self) -> None:
        """One more byte of a header that never ends, on every unix connection."""
        for s, c in list(self.conns.items()):
            if c["kind"] != "unix" or c["sent"] >= len(HEADER):
                continue
            try:
                s.send(HEADER[c["sent"]:c["sent"] + 1])
                c["sent"] += 1
            except BlockingIOError:
                pass
            except OSError:
                self.closed_by_agent += 1
                self.drop(s)

    def watch(self, until: float) -> None:
        """Count the agent's answers (a 503) and closes until `until` (monotonic)."""
        while time.monotonic() < until:
            for key, _ in self.sel.select(timeout=max(0.0, until - time.monotonic())):
                s = key.fileobj
                try:
                    data = s.recv(65536)
                except BlockingIOError:
                    continue
                except OSError:
                    data = b""
                if data.startswith(b"HTTP/1.1 503"):
                    self.refused_503 += 1
                if not data:
                    self.closed_by_agent += 1
                    self.drop(s)

    def held_at_end(self) -> int:
        """Connections the agent has not closed."""
        held = 0
        for s in list(self.conns):
            try:
                held += s.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) != b""
            except BlockingIOError:
                held += 1
            except OSError:
                pass
        return held


def _attacker(sock_path: str, port: int, n_unix: int, n_tcp: int, seconds: float, out: Any) -> None:
    """Keeps n_unix + n_tcp connections open against the agent for `seconds`; reports what it saw."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, max(soft, n_unix + n_tcp + 512)), hard))
    a = _Attack(sock_path, port)
    end = time.monotonic() + seconds
    held_samples: list[int] = []
    while time.monotonic() < end:
        # one cycle a second, like slowloris (its default is 15 s): open again what the agent closed, then one
        # more byte of a header that never ends on every unix connection, then watch for closes
        a.top_up({"unix": n_unix, "tcp": n_tcp})
        a.trickle()
        held_samples.append(len(a.conns))
        a.watch(min(end, time.monotonic() + 1.0))
    held = a.held_at_end()
    for s in list(a.conns):
        a.drop(s)
    out.send({"opened": a.opened, "closed_by_agent": a.closed_by_agent, "connect_errors": a.connect_errors,
              "refused_503": a.refused_503, "held_at_end": held,
              "client_open_median": statistics.median(held_samples) if held_samples else 0})
    out.close()


# ---------------------------------------------------------------------------------------------- measuring


def _timed_ms(fn: Any, *args: Any) -> tuple[Any, float]:
    """(what fn returned, milliseconds); a failed call (None or False) counts as 5 s (the client's timeout)."""
    t0 = time.perf_counter()
    got = fn(*args)
    return got, (time.perf_counter() - t0) * 1000 if got is not None and got is not False else 5000.0


def _baseline(sock: str, metrics_port: int, seconds: float) -> list[float]:
    """/v1/status latencies before the flood: what this machine gives without it."""
    base: list[float] = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        base.append(_timed_ms(status, sock)[1])
        _metrics_ok(metrics_port)
        time.sleep(0.05)
    return base


@dataclass
class _Probe:
    """What an operator's client and a scraper saw while the flood went on."""

    lat: list[float] = field(default_factory=list)
    mlat: list[float] = field(default_factory=list)
    failures: int = 0
    mfailures: int = 0
    held_by_agent: list[int] = field(default_factory=list)

    def run(self, sock: str, metrics_port: int, until: float) -> None:
        while time.monotonic() < until:
            st, dt = _timed_ms(status, sock)
            self.failures += st is None
            if st is not None:
                conns = st["agent"].get("connections") or {}
                self.held_by_agent.append(sum(c.get("open", 0) for c in conns.values()))
            self.lat.append(dt)
            ok, dt = _timed_ms(_metrics_ok, metrics_port)
            self.mlat.append(dt)
            self.mfailures += not ok
            time.sleep(0.05)


def _ms(values: list[float], q: float | None = None) -> float | None:
    if not values:
        return None
    return round(statistics.median(values) if q is None else _p(values, q), 1)


def _delta(after: dict, before: dict, key: str) -> int | None:
    return (after.get(key, 0) - before.get(key, 0)) if after else None


def measure(sock: str, metrics_port: int, log_path: Path, seconds: float = 20.0, n_unix: int = 1500,
            n_tcp: int = 1100) -> dict[str, Any]:
    """Attack a running agent for `seconds`; return the slowloris_* keys."""
    import psutil

    base = _baseline(sock, metrics_port, min(10.0, seconds / 2))
    before = status(sock) or {}
    agent = psutil.Process(before["agent"]["pid"]) if before else None
    cpu0 = agent.cpu_times() if agent else None
    log0 = log_path.stat().st_size
    parent, child = mp.Pipe(duplex=False)
    proc = mp.get_context("fork").Process(target=_attacker, args=(sock, metrics_port, n_unix, n_tcp, seconds, child),
                                          daemon=True)
    proc.start()
    time.sleep(1.0)  # let the flood build up first
    probe = _Probe()
    probe.run(sock, metrics_port, time.monotonic() + seconds - 1.5)
    cpu1 = agent.cpu_times() if agent else None
    report = parent.recv() if parent.poll(seconds + 30) else {}
    proc.join(10)
    time.sleep(0.5)
    after = status(sock) or {}
    a0, a1 = before.get("agent", {}), after.get("agent", {})
    return {
        # the attacker's connections the agent holds at once (its own count; the cap bounds it)
        "slowloris_conns_held": max(probe.held_by_agent) if probe.held_by_agent else None,
        "slowloris_conns_held_at_end": report.get("held_at_end"),
        "status_p99_ms_under_slowloris": _ms(probe.lat, 0.99),
        "status_median_ms_under_slowloris": _ms(probe.lat),
        "status_failures_under_slowloris": probe.failures,
        "status_p99_ms_before_slowloris": _ms(base, 0.99),
        "status_median_ms_before_slowloris": _ms(base),
        "status_calls_under_slowloris": len(probe.lat),
        "metrics_p99_ms_under_slowloris": _ms(probe.mlat, 0.99),
        "metrics_failures_under_slowloris": probe.mfailures,
        "ticks_missed_under_slowloris": _delta(a1, a0, "missed_ticks"),
        "ticks_failed_under_slowloris": _delta(a1, a0, "failed_ticks"),
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
    from lynxtop.agent.serving import procs

    agent.send_signal(signal.SIGTERM)
    try:
        agent.wait(30)
    except subprocess.TimeoutExpired:
        agent.kill()
    # The API server carries the variable; its engines retitle themselves, which blanks their environ (as
    # setproctitle does), so they are found by the API server's process group (the agent starts it as a session).
    groups = set()
    for p in procs.all_pids():
        if procs.environ_has(p, "LYNXTOP_SIM_STATE_DIR", str(sim_state)):
            with contextlib.suppress(ProcessLookupError):
                groups.add(os.getpgid(p))
                os.kill(p, signal.SIGKILL)
    for g in groups - {os.getpgrp()}:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(g, signal.SIGKILL)


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
