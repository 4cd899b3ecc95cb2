"""`lynxtop demo`'s default traffic fills the latency window: a p99 over enough requests from the first screen.

The calm load drove ~0.3 finished requests a second (two or three streams of 48-128-token answers at ~13 tokens a
second each), so every 60 s window held 18-22 requests and a new user's first screen said `n=...` and "too few for
a p99" beside every percentile. The calm pattern (sim/loadgen.py DEMO_CALM) now asks for short answers: 35-45 a
window, and still a healthy serving node (TTFT well under its 2 s limit, every TPOT under vLLM's 100 ms bucket bound
so its p99 does not read as interpolated towards the 150 ms limit).

Real parts: the simulator's performance model (sim/model.py, the engine the simulated EngineCore runs) in virtual
time for the pattern's figures; and the real demo (agent, simulated vLLM and GPUs, the load generator) in a
subprocess, read through the agent's socket as the dashboard reads it.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.marked_procs import MARK, marked, marked_tree

from lynxtop.contract.client import AgentClient, AgentRefused, AgentUnreachable
from lynxtop.contract.status import FEW_OBSERVATIONS, SlaState, Status
from lynxtop.sim.loadgen import DEMO_CALM, DEMO_PATTERN, Phase
from lynxtop.sim.model import FinishedRequest, SimRequest, default_engine

WINDOW_S = 60.0  # the demo's SLA window (no [sla] in its config: the default)


def _calm_in_virtual_time(pattern: tuple[Phase, ...], cycles: int, seed: int) -> list[tuple[float, FinishedRequest]]:
    """The demo's closed loop (one request at a time per stream, `concurrency` streams in each phase) against the
    demo profile's engine (max_num_seqs 8, max_num_batched_tokens 2048), in simulated time: (end, request) each.
    Chats carry a shared system prompt the prefix cache holds, so only their question is computed."""
    eng = default_engine(max_num_seqs=8, max_num_batched_tokens=2048)
    rng = random.Random(seed)
    spans, t = [], 0.0
    for _ in range(cycles):
        for ph in pattern:
            spans.append((t, t + ph.duration_s, ph))
            t += ph.duration_s
    end, now, n = t, 0.0, 0
    streams: dict[int, str] = {}
    done: list[tuple[float, FinishedRequest]] = []
    while now < end:
        ph = next(p for a, b, p in spans if a <= now < b)
        for k in range(ph.concurrency):
            if k not in streams:
                p, o = rng.randint(*ph.prompt_tokens), rng.randint(*ph.output_tokens)
                prompt = int(0.75 * p) + 10 if rng.random() < ph.chat_share else p  # sim/server.py: 4 chars a token
                streams[k] = f"r{n}"
                eng.add(SimRequest(rid=f"r{n}", prompt_tokens=prompt, max_tokens=o, arrival_s=now))
                n += 1
        res = eng.step(now)
        now += max(res.duration_s, 0.01)
        for f in res.finished:
            done.append((now, f))
            streams = {k: r for k, r in streams.items() if r != f.rid}
    return done


def test_the_calm_pattern_fills_every_window_and_stays_healthy():
    """Every 60 s window of the calm pattern (three cycles after the first minute, three seeds) holds at least 30
    finished requests; TTFT stays under 1 s and each request's TPOT under 100 ms (vLLM's TPOT bucket bound: one
    over it and the p99 reads ~148 ms against the 150 ms limit). The raised pattern (the load key) still puts
    more requests in flight at once."""
    for seed in (0, 1, 2):
        done = _calm_in_virtual_time(DEMO_CALM, cycles=4, seed=seed)
        total = sum(p.duration_s for p in DEMO_CALM) * 4
        windows = [sum(1 for t, _ in done if end - WINDOW_S < t <= end) for end in range(60, int(total) + 1, 5)]
        assert min(windows) >= 30, (seed, windows)
        assert max(f.ttft_s for _, f in done) < 1.0
        assert max(f.tpot_s for _, f in done) < 0.1, sorted(f.tpot_s for _, f in done)[-5:]
    assert max(p.concurrency for p in DEMO_PATTERN) > 2 * max(p.concurrency for p in DEMO_CALM)


# ----------------------------------------------------------------------------------------------- the real demo


@pytest.fixture
def mark() -> Iterator[str]:
    """A marker for the demo's environment; whatever of its tree is left at the end is killed."""
    with marked_tree() as value:
        yield value


def _status(sock: Path) -> Status | None:
    try:
        return AgentClient(sock, 3.0).status()
    except (AgentRefused, AgentUnreachable):
        return None


@pytest.mark.timeout(300)
def test_after_the_warm_up_the_demos_windows_hold_enough_requests_for_a_p99(sock_dir: Path, mark: str):
    """The real demo, its default load: once the first minute of traffic has passed, the status the dashboard
    reads says at least 20 requests (25: a margin the old traffic's 18-22 did not reach) behind the TTFT, TPOT and
    E2E percentiles and behind the SLA's verdict, which is "ok"."""
    state = sock_dir / "st"
    env = {k: v for k, v in os.environ.items() if not k.startswith("LYNXTOP_SIM_")} | {MARK: mark}
    proc = subprocess.Popen([sys.executable, "-m", "lynxtop", "demo", "--no-tui", "--duration", "200",
                             "--startup-seconds", "0.5", "--state-dir", str(state)], stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)
    sock = state / "agent.sock"
    seen: list[tuple[float, dict[str, int], int | None, str | None, str]] = []
    try:
        deadline = time.monotonic() + 90
        ready = None
        while ready is None and time.monotonic() < deadline and proc.poll() is None:
            st = _status(sock)
            if st is not None and st.serving.state == "ready":
                ready = time.monotonic()
            time.sleep(0.5)
        assert ready is not None, "the demo's simulated server did not become ready within 90 s"
        # the first minute fills the window (traffic starts as the server is ready); then read it for 15 s
        while time.monotonic() < ready + WINDOW_S + 20 and proc.poll() is None:
            st = _status(sock) if time.monotonic() >= ready + WINDOW_S + 5 else None
            if st is not None and st.serving.window_counts:
                seen.append((time.monotonic() - ready, dict(st.serving.window_counts), st.sla.window_requests,
                             st.sla.window_requests_source, st.sla.state))
            time.sleep(3.0 if st is not None else 0.5)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)  # the demo's own clean-up, as Ctrl-C
        out, _ = proc.communicate(timeout=90)
    print(out.decode(errors="replace")[-3000:])
    print(*seen, sep="\n")
    assert len(seen) >= 3, seen
    for _, counts, sla_n, source, sla_state in seen:
        for series in ("ttft", "tpot", "e2e"):
            assert counts[series] >= max(FEW_OBSERVATIONS, 25), (series, counts)
        assert sla_n is not None and sla_n >= max(FEW_OBSERVATIONS, 25) and source == "finished"
        assert sla_state == SlaState.OK
    assert proc.returncode == 0
    assert marked(mark) == []
