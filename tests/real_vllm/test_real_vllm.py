"""The agent against a REAL vLLM (the CPU build serving a tiny random Llama built on the spot).

The simulator is our everyday test bed; only a real server proves that we read its log, its /metrics, its
signals and its process tree right. The tests run in file order on one shared agent (a server load costs
20-80 s here): start -> load -> simulator check -> drain + switch -> SIGKILL of the API server (orphans)
-> agent SIGKILL + adoption -> a profile vLLM rejects. Each test can also run alone (-k): it starts what it needs.

Run:  .venv/bin/python tests/real_vllm/prepare.py && .venv/bin/pytest -m real_vllm tests/real_vllm -q -rA
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest
from rv_support import (
    bucket_bounds,
    counter,
    exact_quantile,
    families,
    histogram,
    histogram_mean,
    histogram_quantile,
    http_get,
    leftovers,
    load_loop,
    stream_completion,
    vllm_tree,
    wait_for,
)
from support.ports import free_port
from support.real import unavailable
from support.waits import holds

pytestmark = [pytest.mark.real_vllm, pytest.mark.timeout(1500)]  # the first test may build the cache

MODEL = "tiny"  # served_model_name of every profile
LOAD_N, LOAD_CONCURRENCY, LOAD_TOKENS = 24, 4, 24

# Families only a CPU build shows, with the reason; the simulator need not print them. vLLM 0.32's CPU build
# turned out to print no family of its own: every family on its page is registered by the common V1 metrics
# code (vllm/v1/metrics/loggers.py, perf.py) on every platform, so this stays empty on purpose.
CPU_ONLY_FAMILIES: dict[str, str] = {}

_shared: dict = {}  # facts one test hands to a later one (tests run in file order on one agent)


def now_ms() -> int:
    return int(time.time() * 1000)


def alive(p: psutil.Process) -> bool:
    """Gone, reaped or a zombie: not alive (never raises: a process may exit while it is read)."""
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def run_id_of(row: dict) -> int:
    return int(row.get("id", row.get("run_id")))


def ensure_ready(agent, profile: str | None = None, timeout: float = 400) -> dict:
    """The serving state 'ready' (on `profile` if given), starting "tiny" if nothing serves: lets a single
    test run alone, and costs nothing when the previous test left a ready server."""
    s = agent.serving()
    if s["state"] == "ready" and profile in (None, s.get("profile")):
        return s
    if s["state"] in ("stopped", "backoff", "crash-loop"):
        if s["state"] != "stopped":
            agent.post("/v1/stop")
            agent.wait_state({"stopped"}, 120)
        code, body = agent.post("/v1/start", {"profile": profile or "tiny"})
        assert code == 202, (code, body)
    elif s["state"] == "ready":
        code, body = agent.post("/v1/switch", {"profile": profile})
        assert code == 202, (code, body)
    return agent.wait_state({"ready"}, timeout)


def serving_rows(agent, run_id: int, start_ms: int, end_ms: int) -> list[dict]:
    from lynxtop.store.reader import StoreReader

    cols = ["run_id", "scrape_ok", "requests_finished", "prompt_tokens", "generation_tokens",
            "ttft_p50_ms", "ttft_p90_ms", "ttft_p99_ms", "itl_p50_ms", "itl_p90_ms", "itl_p99_ms",
            "prefill_mean_ms", "decode_mean_ms", "phase_times_derived"]
    r = StoreReader(agent.database)
    try:
        _, rows = r.series("serving", cols, start_ms, end_ms, resolution="raw")
    finally:
        r.close()
    return [row for row in rows if row.get("run_id") == run_id]


# ---------------------------------------------------------------------------------------------------- start


def test_start_reads_phases_from_the_real_log_and_records_the_real_version(agent, prepared):
    t0 = now_ms()
    code, body = agent.post("/v1/start", {"profile": "tiny"})
    assert code == 202, (code, body)
    seen: list[str] = []

    accepted = time.monotonic()

    def ready() -> dict | None:
        s = agent.serving()
        if s.get("phase") and (not seen or seen[-1] != s["phase"]):
            seen.append(s["phase"])
        # 202 means accepted: the state may read "stopped" for a moment before the action runs.
        if s["state"] == "stopped" and not seen and time.monotonic() - accepted < 10:
            return None
        assert s["state"] in ("starting", "ready"), f"left starting for {s['state']}: {s.get('reason')}"
        return s if s["state"] == "ready" else None

    s = wait_for(ready, 400, "the real vLLM to become ready", interval=0.3)
    assert s["profile"] == "tiny" and s["pid"] > 0 and s["run_id"]
    port = agent.port
    code, version = http_get(port, "/version")
    assert code == 200
    real_version = json.loads(version)["version"]  # "0.32.0": /version omits the "+cpu" local part
    assert real_version.startswith("0.")

    # Phases come from the real log: the agent's list must follow vLLM's own order and end at "api up".
    phases = [p["phase"] for p in s["phases"]]
    assert phases[0] == "loading weights" and phases[-1] == "api up", phases
    assert "kv cache" in phases, f"'Available KV cache memory' of the real log was not read: {phases}"
    stamps = [p["ts_ms"] for p in s["phases"]]
    assert stamps == sorted(stamps) and stamps[0] >= t0 - 1000

    # The run row: real version, real pid, the profile's argv, ready after started.
    runs = agent.runs()
    row = next(r for r in runs if run_id_of(r) == s["run_id"])
    assert row["vllm_version"] == real_version
    assert row["profile"] == "tiny" and row["pid"] == s["pid"]
    assert row["ready_ms"] and row["ready_ms"] >= row["started_ms"] >= t0 - 1000
    assert not row.get("simulated"), "a real vLLM run must not be labelled simulated"
    argv = row["argv"] if isinstance(row["argv"], list) else json.loads(row["argv"])
    assert argv[:3] == [str(prepared.vllm), "serve", str(prepared.model)]
    assert "--shutdown-timeout" in argv and "127.0.0.1" in argv

    # The real process tree, with vLLM's own titles, all in the leader's process group.
    tree = vllm_tree(s["pid"])
    titles = [" ".join(p.cmdline()) for p in tree]
    assert any(t.startswith("VLLM::EngineCore") for t in titles), titles
    assert any(t.startswith("VLLM::Worker") for t in titles), titles
    assert {os.getpgid(p.pid) for p in tree} == {s["pid"]}, "vLLM must run in its own process group"
    # ... and the host rows count the engine's and the worker's memory under their roles, not the API server's
    # (vLLM titles them after their imports, seconds after the agent first sees them)
    from support.db import db_rows

    def by_role() -> dict | None:
        rows = db_rows(agent.database, "SELECT vllm_api_rss_bytes AS api, vllm_engine_rss_bytes AS engine, "
                       "vllm_workers_rss_bytes AS workers FROM host_samples ORDER BY ts_ms DESC LIMIT 1")
        return rows[0] if rows and rows[0]["engine"] and rows[0]["workers"] and rows[0]["api"] else None

    wait_for(by_role, 60, "the host rows' engine and worker memory by role", interval=0.5)
    # The operator's view through the real CLI client agrees.
    cli = subprocess.run([sys.executable, "-m", "lynxtop", "status", "--json", "--config", str(agent.config)],
                         capture_output=True, text=True, timeout=60)
    assert cli.returncode == 0, cli.stderr
    shown = json.loads(cli.stdout)["serving"]
    assert (shown["state"], shown["run_id"], shown["vllm_version"]) == ("ready", s["run_id"], real_version)
    _shared["version"] = real_version
    _shared["first_run"] = s["run_id"]


# ---------------------------------------------------------------------------------------------------- load


def test_serving_samples_agree_with_the_clients_own_measurement(agent):
    s = ensure_ready(agent)
    port, run_id = agent.port, s["run_id"]
    # The agent must have a baseline scrape before the first request, or the first deltas are lost.
    wait_for(lambda: (agent.status().get("serving_metrics") or {}).get("scrape_ok") == 1, 30,
             "a successful scrape of the real /metrics")
    _, page0 = http_get(port, "/metrics")
    assert counter(page0, "vllm:request_success") == 0, "this test needs a run that has served nothing yet"
    t_start = now_ms()
    results = load_loop(port, MODEL, LOAD_N, LOAD_CONCURRENCY, LOAD_TOKENS)
    t_end = now_ms()
    bad = [r for r in results if not r.ok]
    assert len(results) == LOAD_N and not bad, [r.error for r in bad][:3]
    assert all(r.completion_tokens == LOAD_TOKENS == r.tokens for r in results)
    gen = sum(r.completion_tokens for r in results)
    prompt = sum(r.prompt_tokens for r in results)
    _, page1 = http_get(port, "/metrics")
    assert counter(page1, "vllm:request_success") == LOAD_N  # the server agrees with the client first

    def totals() -> tuple[int, int, int] | None:
        rows = [r for r in serving_rows(agent, run_id, t_start - 60_000, now_ms() + 1000) if r["scrape_ok"]]
        got = (sum(r["requests_finished"] or 0 for r in rows), sum(r["prompt_tokens"] or 0 for r in rows),
               sum(r["generation_tokens"] or 0 for r in rows))
        _shared["totals"] = got
        return got if got == (LOAD_N, prompt, gen) and rows[-1]["ttft_p50_ms"] is not None else None

    try:
        wait_for(totals, 20, "the agent's serving samples to add up to the client's counts")
    except AssertionError:
        pass
    assert _shared["totals"] == (LOAD_N, prompt, gen), \
        f"agent (requests, prompt tokens, generation tokens) {_shared['totals']} != client {(LOAD_N, prompt, gen)}"

    latest = serving_rows(agent, run_id, t_start, now_ms() + 1000)[-1]
    # Prefill and decode time: vLLM 0.32 exports its own histograms, so the agent reads them (not TTFT - queue)
    assert latest["phase_times_derived"] == 0, latest
    for phase in ("prefill", "decode"):
        name = f"vllm:request_{phase}_time_seconds"
        assert histogram(page1, name), f"vLLM's page has no {name}"
        server_ms = histogram_mean(page0, page1, name) * 1000
        assert latest[f"{phase}_mean_ms"] == pytest.approx(server_ms, rel=0.02, abs=0.01), (phase, latest)
    ttft_before, ttft_after = histogram(page0, "vllm:time_to_first_token_seconds"), \
        histogram(page1, "vllm:time_to_first_token_seconds")
    itl_before, itl_after = histogram(page0, "vllm:inter_token_latency_seconds"), \
        histogram(page1, "vllm:inter_token_latency_seconds")
    client_ttft = [r.ttft_s for r in results]
    client_itl = [x for r in results for x in r.itls_s]
    # The client sees each token later than the engine stamps it (HTTP, detokenising, SSE): the difference
    # of the two means, exact from the histogram's _sum/_count, is that offset on average.
    offsets = {
        "ttft": sum(client_ttft) / len(client_ttft) - histogram_mean(page0, page1, "vllm:time_to_first_token_seconds"),
        "itl": sum(client_itl) / len(client_itl) - histogram_mean(page0, page1, "vllm:inter_token_latency_seconds"),
    }
    report: dict = {"offset_ms": {k: v * 1000 for k, v in offsets.items()}}
    floor: dict[str, float] = {}
    previous: dict[str, float] = {}
    for q, stat in ((0.5, "p50"), (0.9, "p90"), (0.99, "p99")):
        for series, values, before, after in (("ttft", client_ttft, ttft_before, ttft_after),
                                              ("itl", client_itl, itl_before, itl_after)):
            agent_ms = latest[f"{series}_{stat}_ms"]
            server_s = histogram_quantile(q, before, after)
            client_s = exact_quantile(values, q)
            report[f"{series}_{stat}"] = {"agent_ms": agent_ms, "server_hist_ms": server_s * 1000,
                                          "client_ms": client_s * 1000}
            assert agent_ms is not None, f"agent reported no {series} {stat}"
            # The agent reads the same histogram we do: its percentile is Prometheus' own interpolation…
            assert agent_ms == pytest.approx(server_s * 1000, rel=0.02, abs=0.01), report
            # …and percentiles only grow with q.
            assert agent_ms >= previous.get(series, 0.0) - 1e-6, report
            previous[series] = agent_ms
            if q == 0.5:
                # The median lies in the server's bucket that holds the client's own median, or that median less
                # the offset: a few stalled requests cannot move a median.
                lo1, hi1 = bucket_bounds(list(after), client_s)
                lo2, hi2 = bucket_bounds(list(after), max(0.0, client_s - offsets[series]))
                lo, hi = min(lo1, lo2), max(hi1, hi2)
                floor[series] = lo
            else:
                # The tails hold the client's own stalls (2 shared cores: its threads wait for a core), which the
                # engine never sees: CI runs saw the client's p99 ITL at 91 ms beside the server's 48 ms, its p90
                # TTFT at 101 ms beside 64 ms, and a tail five buckets above the server's. So below, the tail is
                # held only to the median's floor (percentiles grow with q). Above, the client bounds it: each
                # request's first token reaches the client after the engine stamps it, so the server's TTFT
                # percentile is at most the client's and lies at most in the client's bucket; ITL chunks can
                # also arrive bunched, so one bucket above the client's is allowed at p90 and two at p99.
                lo = floor[series]
                _, hi = bucket_bounds(list(after), client_s, widen_above=0 if series == "ttft" else
                                      {0.9: 1, 0.99: 2}[q])
            report[f"{series}_{stat}"]["buckets_ms"] = [lo * 1000, hi * 1000]
            assert lo * 1000 - 1e-6 <= agent_ms <= hi * 1000 + 1e-6, (f"{series} {stat}", report)
    _shared["load_report"] = report
    _shared["token_rate"] = gen / max(0.001, (t_end - t_start) / 1000)
    print("load report:", json.dumps(report))


# ---------------------------------------------------------------------------------------------------- simulator


def _sim_log_and_page(tmp: Path) -> tuple[str, str]:
    """Run the simulated vLLM the agent's tests use, once, and read its log and /metrics."""
    exe = Path(sys.executable).parent / "lynxtop-sim-vllm"
    if not exe.exists():
        unavailable("the simulated vLLM (lynxtop-sim-vllm) is not installed")
    port = free_port()
    log = tmp / "sim.log"
    with log.open("w") as fh:
        proc = subprocess.Popen([str(exe), "serve", "deepseek-ai/DeepSeek-V4.1", "--host", "127.0.0.1",
                                 "--port", str(port), "-tp", "8", "--sim-startup-seconds", "2",
                                 "--sim-state-dir", str(tmp / "sim-state")],
                                stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)
    try:
        wait_for(lambda: http_get(port, "/health")[0] == 200, 90, "the simulated vLLM to answer /health")
        # one request so that every per-request series exists on both sides
        r = stream_completion(port, "deepseek-ai/DeepSeek-V4.1", "hello", 4)
        assert r.ok, r.error
        _, page = http_get(port, "/metrics")
    finally:
        # Its EngineCore and workers mimic vLLM and may outlive the leader: end the whole group, for sure.
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            pass
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
    return log.read_text(errors="replace"), page


def test_simulator_matches_the_real_metrics_page_and_startup_log(agent, tmp_path):
    from lynxtop.agent.serving import startup

    s = ensure_ready(agent)
    _, real_page = http_get(agent.port, "/metrics")
    code, body = agent.request("GET", f"/v1/logs?run={s['run_id']}&lines=100000")
    assert code == 200, body
    real_log = "\n".join(body["lines"])
    sim_log, sim_page = _sim_log_and_page(tmp_path)

    real, sim = families(real_page), families(sim_page)
    assert real, "the real server printed no vllm: family"
    problems: list[str] = []
    missing = sorted(n for n in real if n not in sim and n not in CPU_ONLY_FAMILIES)
    if missing:
        problems.append(f"families the real server has and the simulator lacks: {missing}")
    for name, (typ, label_sets) in sorted(real.items()):
        if name not in sim:
            continue
        if sim[name][0] != typ:
            problems.append(f"{name}: type {typ} on the real server, {sim[name][0]} in the simulator")
        for ls in label_sets - sim[name][1]:
            sim_ls = sorted(map(sorted, sim[name][1]))
            problems.append(f"{name}: label set {sorted(ls)} on the real server; the simulator has {sim_ls} "
                            f"(missing {sorted(ls - set().union(*sim[name][1]))})")

    # Every milestone the agent parses that the real log prints must be printed by the simulator too.
    patterns = [p for p, _ in startup._MILESTONES]
    real_hits = {p.pattern for p in patterns if any(p.search(line) for line in real_log.splitlines())}
    sim_hits = {p.pattern for p in patterns if any(p.search(line) for line in sim_log.splitlines())}
    assert real_hits, "none of the agent's milestones matched the real log"
    if real_hits - sim_hits:
        problems.append(f"milestones in the real log but not in the simulator's: {sorted(real_hits - sim_hits)}")

    # And the phase sequence the agent derives is the same for both logs (up to graph capture, which
    # --enforce-eager skips on the real side).
    def phases_of(text: str, path: Path) -> list[str]:
        path.write_text(text)
        tr = startup.PhaseTracker(path, started_ms=0)
        tr.poll(1)
        return [m.phase for m in tr.marks]

    real_phases = phases_of(real_log, tmp_path / "real.log")
    sim_phases = [p for p in phases_of(sim_log, tmp_path / "sim2.log") if p in real_phases]
    if real_phases[-1] != "api up" or sim_phases != real_phases:
        problems.append(f"phases from the real log {real_phases} vs the simulator's {sim_phases}")
    assert not problems, "the simulator differs from the real vLLM:\n  " + "\n  ".join(problems)


def test_metrics_come_back_plain_and_whole_as_the_simulator_serves_them(agent):
    """vLLM 0.32 answers /metrics with prometheus-fastapi-instrumentator's handler: no gzip even when asked, and a
    prometheus_client `name[]` selection is ignored. The simulator answers so; the agent reads whole pages."""
    import http.client

    ensure_ready(agent)
    conn = http.client.HTTPConnection("127.0.0.1", agent.port, timeout=10)
    try:
        conn.request("GET", "/metrics", headers={"Accept-Encoding": "gzip"})
        resp = conn.getresponse()
        body = resp.read().decode()
        assert resp.status == 200 and resp.getheader("Content-Encoding") is None and body.startswith("# HELP")
    finally:
        conn.close()
    code, selected = http_get(agent.port, "/metrics?name%5B%5D=vllm%3Anum_requests_running")
    assert code == 200 and set(families(selected)) == set(families(body)) and len(families(body)) > 5


# ---------------------------------------------------------------------------------------------------- drain + switch


def test_switch_drains_open_streams_and_makes_a_new_run(agent):
    s = ensure_ready(agent, profile="tiny")
    old_run, old_pid = s["run_id"], s["pid"]
    # Streams must still be mid-flight when the switch arrives and able to finish within --shutdown-timeout
    # (10 s): time a probe of 3 parallel streams now (this machine's speed varies) and aim at ~3 s each.
    probe = [None] * 3

    def probe_one(i: int) -> None:
        probe[i] = stream_completion(agent.port, MODEL, f"probe {i}", 48)

    ths = [threading.Thread(target=probe_one, args=(i,), daemon=True) for i in range(3)]
    for t in ths:
        t.start()
    for t in ths:
        t.join(timeout=120)
    assert all(r is not None and r.ok for r in probe), probe
    per_stream_rate = min(48 / max(r.e2e_s, 1e-3) for r in probe)
    max_tokens = int(max(48, min(480, per_stream_rate * 3)))
    started = [threading.Event() for _ in range(3)]
    results: list = [None] * 3
    ended: list[float] = [0.0] * 3

    def go(i: int) -> None:
        results[i] = stream_completion(agent.port, MODEL, f"drain me {i}", max_tokens, started=started[i])
        ended[i] = time.time()

    threads = [threading.Thread(target=go, args=(i,), daemon=True) for i in range(3)]
    for t in threads:
        t.start()
    for e in started:
        assert e.wait(60), "a stream never produced its first token"
    t_switch = now_ms()
    code, body = agent.post("/v1/switch", {"profile": "tiny-b"})
    assert code == 202, (code, body)
    for t in threads:
        t.join(timeout=60)
    in_flight = sum(1 for x in ended if x * 1000 > t_switch)
    assert in_flight >= 1, f"no stream was still open at the switch ({max_tokens} tokens was too few)"
    # vLLM ends an aborted stream with a plain [DONE] too: only finish_reason and usage tell the cut.
    # Judged last, so that a drain failure does not hide what the switch itself did.
    cut = [f"{r.tokens} of {max_tokens} tokens, finish_reason={r.finish_reason}" for r in results
           if not (r is not None and r.ok and r.completion_tokens == max_tokens == r.tokens
                   and r.finish_reason == "length")]

    s2 = agent.wait_state({"ready"}, 400, run_not=old_run)
    assert s2["profile"] == "tiny-b" and s2["run_id"] > old_run and s2["pid"] != old_pid
    assert not psutil.pid_exists(old_pid) or psutil.Process(old_pid).status() == psutil.STATUS_ZOMBIE
    runs = {run_id_of(r): r for r in agent.runs()}
    old = runs[old_run]
    grace_ms = 40_000
    assert old["ended_ms"] and old["ended_ms"] - t_switch <= grace_ms, old
    assert old["exit_code"] == 0 and not old.get("exit_signal"), \
        f"a drained vLLM exits 0 on SIGTERM; the run says {old}"
    new = runs[s2["run_id"]]
    new_argv = new["argv"] if isinstance(new["argv"], list) else json.loads(new["argv"])
    assert new_argv[new_argv.index("--max-num-seqs") + 1] == "4"
    assert new["started_ms"] >= old["ended_ms"], "the new server started before the old one was gone"
    assert not cut, (f"{len(cut)} of 3 open streams were cut by the switch instead of drained within "
                     f"--shutdown-timeout: {cut}")


# ---------------------------------------------------------------------------------------------------- orphans


def test_sigkill_of_the_api_server_orphans_are_found_stopped_and_cleaned(agent):
    s = ensure_ready(agent)
    run_id, pid = s["run_id"], s["pid"]
    run = next(r for r in agent.runs() if run_id_of(r) == run_id)
    tree = vllm_tree(pid)
    children = [p for p in tree if p.pid != pid]
    titles = {p.pid: " ".join(p.cmdline()).strip() for p in children}
    assert any(t.startswith("VLLM::EngineCore") for t in titles.values()), titles
    rss = {p.pid: p.memory_info().rss for p in children}
    # Leftovers of this run: created since it started (other runs' files are not this run's to judge).
    started_s = run["started_ms"] / 1000 - 1
    mine = {f for f in leftovers() if os.stat(f).st_mtime >= started_s}
    assert mine, "the run made no /dev/shm/psm_* nor /tmp/vllm_dist_* file: nothing to prove cleaning on"
    killed_at = time.time()
    os.kill(pid, signal.SIGKILL)
    time.sleep(1.5)  # what is checked is who is still alive a while after the kill: the span is the behaviour
    # vLLM's known behaviour, which the agent must handle: the engine outlives its API server.
    survivors = [p.pid for p in children if alive(p)]
    assert survivors, "expected EngineCore/Worker to outlive a SIGKILL of the API server (vLLM 0.32 does)"

    last_orphan_ms = 0

    def restarted() -> dict | None:
        nonlocal last_orphan_ms
        if any(psutil.pid_exists(x) and psutil.Process(x).status() != psutil.STATUS_ZOMBIE for x in survivors):
            last_orphan_ms = now_ms()
        st = agent.serving()
        return st if st["state"] == "ready" and st["run_id"] != run_id else None

    s2 = wait_for(restarted, 400, "the agent to clean up and restart after the SIGKILL", interval=0.2)
    living = [p.pid for p in children if p.pid in survivors and alive(p)]
    assert not living, f"orphans of run {run_id} still alive: {[titles[x] for x in living]}"
    freed_mib = sum(rss[x] for x in survivors) / 2**20
    runs = {run_id_of(r): r for r in agent.runs()}
    assert runs[s2["run_id"]]["started_ms"] >= last_orphan_ms, \
        f"the new server started while orphans (holding {freed_mib:.0f} MiB) were alive"
    old = runs[run_id]
    assert old["ended_ms"] and old.get("exit_signal") == signal.SIGKILL, old
    # The killed run's /dev/shm segments and /tmp/vllm_dist_* files are gone; newer ones belong to the new run.
    still = sorted(f for f in mine if os.path.exists(f))
    assert not still, f"leftovers of the killed run {run_id} not cleaned: {still}"
    # An operator must be able to see that leftovers were found and stopped: an event names their pids
    # (in its message, or as numbers in its details; log tails quoted in details do not count).
    events = agent.events(since_ms=int(killed_at * 1000) - 1000)
    named = set()
    for e in events:
        named |= {int(x) for x in re.findall(r"\b\d+\b", e.get("message") or "")}
        named |= _numbers({k: v for k, v in (e.get("details") or {}).items() if k != "log_tail"})
    assert set(survivors) <= named, \
        f"no event names the orphans {[titles[x] for x in survivors]} ({survivors}) the agent had to stop: " \
        f"{[(e['kind'], e['message']) for e in events]}"


def _numbers(obj) -> set[int]:
    if isinstance(obj, bool):
        return set()
    if isinstance(obj, int):
        return {obj}
    if isinstance(obj, str):
        return {int(x) for x in re.findall(r"\b\d+\b", obj)}
    if isinstance(obj, dict):
        return set().union(*(_numbers(v) for v in obj.values())) if obj else set()
    if isinstance(obj, (list, tuple)):
        return set().union(*(_numbers(v) for v in obj)) if obj else set()
    return set()


# ---------------------------------------------------------------------------------------------------- adoption


def test_agent_sigkill_and_restart_adopts_the_live_server(agent):
    s = ensure_ready(agent)
    pid, run_id = s["pid"], s["run_id"]
    agent.kill(signal.SIGKILL)
    # The server must not notice the agent's death: alive and healthy throughout 2 s, not only at their end.
    holds(lambda: psutil.pid_exists(pid) and http_get(agent.port, "/health")[0] == 200, 2,
          "the served vLLM alive and healthy without its agent", interval=0.25)
    agent.start()
    s2 = agent.wait_state({"ready"}, 60)
    assert s2["adopted"] is True and s2["pid"] == pid and s2["run_id"] == run_id, s2
    runs = agent.runs()
    assert sum(1 for r in runs if run_id_of(r) == run_id) == 1 and run_id_of(runs[0]) == run_id, \
        "adoption must not create a new run"
    # The adopting agent's first scrape is its baseline: wait for it, or the request falls before it.
    t = now_ms()
    wait_for(lambda: any(x["scrape_ok"] for x in serving_rows(agent, run_id, t, now_ms() + 1000)), 30,
             "a successful scrape of the adopted server")
    t = now_ms()
    r = stream_completion(agent.port, MODEL, "after adoption", 8)
    assert r.ok, r.error
    # Samples keep flowing for the adopted run.
    wait_for(lambda: any(x["scrape_ok"] and (x["requests_finished"] or 0) >= 1
                         for x in serving_rows(agent, run_id, t - 2000, now_ms() + 1000)),
             30, "serving samples of the adopted run to count the request")


def test_retitled_engine_left_while_the_agent_was_down_is_found_by_the_record(agent):
    """EngineCore and its Worker retitle themselves (setproctitle): /proc shows no run token in them. With the agent
    down, the API server and the one token carrier left (multiprocessing's resource tracker) SIGKILLed, the next
    agent must still find them (by the pid and start time serving.json recorded at readiness) and kill them: they
    hold the GPUs' memory. Before, it killed the tracker alone and left them running."""
    s = ensure_ready(agent)
    pid, run_id = s["pid"], s["run_id"]
    token = psutil.Process(pid).environ().get("LYNXTOP_RUN_TOKEN")
    assert token, "the API server does not carry the run token"
    children = [p for p in vllm_tree(pid) if p.pid != pid]

    def carries(p: psutil.Process) -> bool:
        try:
            return p.environ().get("LYNXTOP_RUN_TOKEN") == token
        except psutil.Error:
            return False

    carriers = [p for p in children if carries(p)]
    titles = {p.pid: " ".join(p.cmdline()).strip() for p in children if not carries(p)}
    titles = {pid: t for pid, t in titles.items() if t.startswith("VLLM::")}  # retitled (others may come and go)
    retitled = [p for p in children if p.pid in titles]
    assert any(t.startswith("VLLM::EngineCore") for t in titles.values()), \
        f"expected EngineCore to show no run token once retitled (vLLM 0.32 does): {titles}"
    server = psutil.Process(pid)
    agent.kill(signal.SIGKILL)
    t0 = now_ms()
    for p in [server, *carriers]:
        with contextlib.suppress(psutil.Error):
            p.kill()
    wait_for(lambda: not any(alive(p) for p in [server, *carriers]), 20, "the API server and the token carriers to end")
    holds(lambda: all(alive(p) for p in retitled), 1.0, "EngineCore and Worker alive without them")
    agent.start()

    def gone() -> bool:
        return not any(alive(p) for p in retitled)

    wait_for(gone, 90, f"the new agent to kill run {run_id}'s retitled processes {titles}")

    def named() -> list[dict]:  # the event is recorded once the kill is done: a moment after the processes end
        return [e for e in agent.events(since_ms=t0 - 1000) if e["kind"] == "serving.not_adopted"
                and set(titles) <= set((e.get("details") or {}).get("pids") or [])]

    wait_for(named, 30, f"a serving.not_adopted event naming the killed processes {titles}")


# ---------------------------------------------------------------------------------------------------- bad flag


def test_a_flag_vllm_rejects_ends_in_an_event_quoting_vllm_and_backoff(agent):
    s = agent.serving()
    t0 = now_ms()
    if s["state"] in ("ready", "starting"):
        code, body = agent.post("/v1/switch", {"profile": "badflag"})
    else:
        code, body = agent.post("/v1/start", {"profile": "badflag"})
    assert code == 202, (code, body)
    s2 = agent.wait_state({"backoff", "crash-loop"}, 180)
    assert s2["profile"] == "badflag"
    if s2["state"] == "backoff":
        assert s2["next_retry_ms"] and s2["next_retry_ms"] > t0
    assert s2["failures_in_window"] >= 1
    bad_run = max((r for r in agent.runs() if r["profile"] == "badflag"), key=run_id_of)
    assert bad_run["exit_code"] == 2 and not bad_run.get("ready_ms"), bad_run
    code, body = agent.request("GET", f"/v1/logs?run={run_id_of(bad_run)}&lines=200")
    assert code == 200
    err = [line for line in body["lines"] if "unrecognized arguments" in line]
    assert err, f"vLLM's own error line is not in the run log: {body['lines'][-10:]}"
    events = agent.events(since_ms=t0 - 1000)
    quoted = [e for e in events if "--no-such-flag-lynxtop" in json.dumps(e)
              and "unrecognized arguments" in json.dumps(e)]
    assert quoted, f"no event quotes vLLM's error line {err[-1]!r}: {events}"
    code, body = agent.post("/v1/stop")
    assert code == 202, (code, body)
    agent.wait_state({"stopped"}, 60)


# ---------------------------------------------------------------------------------------------------- bench
# `lynxtop bench` against vLLM's own client (`vllm bench serve`, from the same venv as the server) on the same
# prompts, lengths and concurrency. Added at the end: it only needs "tiny" ready (ensure_ready starts it).
# The two clients run AT THE SAME TIME, each at concurrency 1: on 2 shared cores the tiny server's latency
# drifts by tens of ms from one run to the next (a neighbour's burst, the agent's scrape), more than the 10 %
# asked for, so runs one after the other compare the moments, not the clients. Side by side, both clients see
# the same server at the same moments; ours starts during vLLM's warm-up.

BENCH_PROMPTS, BENCH_OUTPUT, BENCH_CONCURRENCY = 128, 16, 1  # ~290-token prompts: TTFT well above the jitter
# vLLM's warm-up outlasts our client's start-up (a second of a full core): that start-up must not fall into
# vLLM's measured window while ours has none of vLLM's in its own
BENCH_VLLM_WARMUPS = 64  # ~3 s: our client is up (~1.5 s of a core) before vLLM measures
BUNCHED_ITL_MS = 0.1  # a client whose median token gap is below this got the tokens in one read, not streamed
BENCH_COMPARED = ("mean_ttft_ms", "median_ttft_ms", "mean_tpot_ms", "median_tpot_ms", "mean_itl_ms", "median_itl_ms")


def _bench_prompts(out: Path) -> tuple[Path, Path]:
    """The same prompts twice: ShareGPT JSON for `vllm bench serve` (its custom dataset needs pandas, which the
    CPU venv lacks) and JSON lines, in the opposite order, for `lynxtop bench --prompts`. Every prompt is
    unique, and the server caches prefixes: in the same order one client would always find the other's prompt
    cached; in opposite orders each is first for half of them."""
    words = ("node", "vllm", "serves", "tokens", "latency", "queue", "batch", "cache", "stream", "agent")
    prompts = [f"request {i}: " + " ".join(words[(i * 3 + k * 7) % len(words)] for k in range(80 + i % 8))
               for i in range(BENCH_PROMPTS)]
    ours, theirs = out / "prompts.jsonl", out / "prompts.sharegpt.json"
    ours.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in reversed(prompts)))
    theirs.write_text(json.dumps([{"conversations": [{"from": "human", "value": p}, {"from": "gpt", "value": p}]}
                                  for p in prompts]))
    return ours, theirs


def _vllm_bench(prepared, port: int, prompts: Path, out: Path) -> subprocess.Popen:
    argv = [str(prepared.vllm), "bench", "serve", "--backend", "openai", "--base-url", f"http://127.0.0.1:{port}",
            "--model", str(prepared.model), "--tokenizer", str(prepared.model), "--served-model-name", MODEL,
            "--dataset-name", "sharegpt", "--dataset-path", str(prompts), "--sharegpt-output-len", str(BENCH_OUTPUT),
            "--disable-shuffle", "--num-prompts", str(BENCH_PROMPTS), "--ready-check-timeout-sec", "0",
            "--disable-tqdm",
            "--max-concurrency", str(BENCH_CONCURRENCY), "--ignore-eos", "--num-warmups", str(BENCH_VLLM_WARMUPS),
            "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,90,99",
            "--save-result", "--result-dir", str(out.parent), "--result-filename", out.name]
    log = (out.parent / "vllm-bench.log").open("w")
    # one thread each for torch and the tokenizer: their idle pools spin on 2 shared cores and slow vLLM's own loop
    quiet = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    return subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **prepared.env(), **quiet})


def _successes(port: int) -> float:
    return counter(http_get(port, "/metrics")[1], "vllm:request_success")


def test_lynxtop_bench_agrees_with_vllm_bench_serve(agent, prepared):
    ensure_ready(agent, "tiny")
    out = prepared.root / "bench-compare"
    out.mkdir(exist_ok=True)
    (out / "lynxtop.json").unlink(missing_ok=True)  # bench never writes over a file: the last run's goes first
    prompts, sharegpt = _bench_prompts(out)
    before = _successes(agent.port)
    theirs_proc = _vllm_bench(prepared, agent.port, sharegpt, out / "vllm.json")
    try:
        wait_for(lambda: _successes(agent.port) >= before + 2 or theirs_proc.poll() is not None, 300,
                 "vllm bench serve's first warm-up requests")
        page_before = http_get(agent.port, "/metrics")[1]  # the server's own TTFT and prefill over our window
        ours_proc = subprocess.run([sys.executable, "-m", "lynxtop", "bench", "--config", str(agent.config),
                                    "--prompts", str(prompts), "--output-len", str(BENCH_OUTPUT), "--concurrency",
                                    str(BENCH_CONCURRENCY), "--requests", str(BENCH_PROMPTS), "--warmup", "0",
                                    "--json", str(out / "lynxtop.json")], capture_output=True, text=True, timeout=600)
        page_after = http_get(agent.port, "/metrics")[1]
        theirs_proc.wait(600)
    finally:
        if theirs_proc.poll() is None:
            theirs_proc.kill()
    assert theirs_proc.returncode == 0, (out / "vllm-bench.log").read_text()[-3000:]
    assert ours_proc.returncode == 0, ours_proc.stdout + ours_proc.stderr
    ours, theirs = json.loads((out / "lynxtop.json").read_text())[0], json.loads((out / "vllm.json").read_text())
    side = {k: {"lynxtop": ours.get(k), "vllm": theirs.get(k)} for k in
            ("completed", "failed", "total_output_tokens", "duration", "request_throughput", "output_throughput",
             *BENCH_COMPARED, "p99_ttft_ms", "p99_tpot_ms", "p99_itl_ms", "mean_e2el_ms")}
    server_ttft_ms = histogram_mean(page_before, page_after, "vllm:time_to_first_token_seconds") * 1000
    prefill_ms = histogram_mean(page_before, page_after, "vllm:request_prefill_time_seconds") * 1000
    side["server_in_our_window"] = {"mean_ttft_ms": server_ttft_ms, "mean_prefill_ms": prefill_ms}
    (out / "side_by_side.json").write_text(json.dumps(side, indent=2) + "\n")
    print(f"\nlynxtop bench vs vllm bench serve ({out}):\n" + json.dumps(side, indent=1))
    assert ours["completed"] == theirs["completed"] == BENCH_PROMPTS and ours["failed"] == theirs["failed"] == 0
    assert ours["total_output_tokens"] == theirs["total_output_tokens"] == BENCH_PROMPTS * BENCH_OUTPUT
    from support.db import db_rows

    stored = agent.request("GET", "/v1/status")[1]["serving"]
    rows = db_rows(agent.database, "SELECT run_id, vllm_version, partial FROM bench_results WHERE bench_id = ?",
                   (ours["bench_id"],))
    assert rows and rows[0]["run_id"] == stored["run_id"] and rows[0]["vllm_version"] == stored["vllm_version"]
    assert rows[0]["partial"] == 0
    off = {k: (ours[k], theirs[k]) for k in BENCH_COMPARED if abs(ours[k] - theirs[k]) > max(0.10 * theirs[k], 5.0)}
    assert not {k for k in off if "ttft" not in k}, f"TPOT/ITL disagree: {off}\n{side}"
    if off:
        # On 2 shared cores the tiny server stalls 100-600 ms now and then, and the two clients' requests catch
        # those stalls unequally (docs/bench.md: 1 of 4 runs agreed on mean TTFT): say so rather than pass or
        # fail on the machine's noise; a disagreement without such stalls is a failure.
        stalls = max(ours["p99_ttft_ms"], theirs["p99_ttft_ms"]) > 4 * max(ours["median_ttft_ms"],
                                                                            theirs["median_ttft_ms"])
        if stalls:
            pytest.xfail(f"TTFT disagrees under server stalls (p99 >> median): {off}")
        # A client starved of a core reads each stream whole once it runs again: its ITL is ~0 and its "first
        # token" is the last (TTFT = E2EL). A CI run saw vLLM's client at a median ITL of 0.004 ms, TTFT 43 ms
        # against ours 7.5 ms; earlier runs saw the same of ours. Decoding a token takes ~1.5 ms on this server.
        bunched = [name for name, r in (("lynxtop", ours), ("vllm", theirs)) if r["median_itl_ms"] < BUNCHED_ITL_MS]
        if bunched:
            pytest.xfail(f"TTFT disagrees: {', '.join(bunched)} read its streams whole (median ITL < "
                         f"{BUNCHED_ITL_MS} ms): {off}")
        # Two one-stream clients side by side: a request that arrives while the other client's is in prefill
        # waits for it, and the two loops fall into a phase where one of them is mostly the one waiting (runs
        # saw either client 15-24 ms later, while the server's own mean TTFT sat between them). A gap within
        # one mean prefill of the server, on the same window, is that; a wider one is a client's error.
        gaps = {k: abs(a - b) for k, (a, b) in off.items() if "ttft" in k}
        if prefill_ms > 0 and max(gaps.values()) <= prefill_ms + max(0.10 * server_ttft_ms, 5.0):
            pytest.xfail(f"TTFT disagrees within one server prefill ({prefill_ms:.1f} ms; the server's mean TTFT "
                         f"{server_ttft_ms:.1f} ms): the side-by-side clients' phase, not a client: {off}")
        raise AssertionError(f"TTFT disagrees without server stalls: {off}\n{side}")


# `lynxtop bench --save-result` against a file vLLM's own client wrote (`vllm bench serve --save-result
# --save-detailed`, every optional metric asked for) on the same tiny server: lynxtop's file must have every key
# of vLLM's, with the same type (lists: the same element type), and vLLM's file name. The two run one after the
# other: only shapes and counts are compared, no timings.
SAVE_PROMPTS, SAVE_OUTPUT, SAVE_CONCURRENCY = 8, 8, 2


def _shape(v: object) -> object:
    """A value's JSON type; a list's carries its first element's (an empty list matches any list)."""
    if isinstance(v, list):
        return ("list", _shape(v[0])) if v else ("list",)
    return type(v).__name__


def _same_shape(ours: object, theirs: object) -> bool:
    a, b = _shape(ours), _shape(theirs)
    return a == b or (isinstance(a, tuple) and isinstance(b, tuple) and (len(a) == 1 or len(b) == 1))


def test_save_result_has_every_key_of_vllms_own_file_with_its_types(agent, prepared):
    ensure_ready(agent, "tiny")
    out = prepared.root / "bench-save-result"
    shutil.rmtree(out, ignore_errors=True)
    (out / "vllm").mkdir(parents=True)
    prompts, sharegpt = _bench_prompts(out)
    # no --model: vLLM's client asks the server (model_id = the served model's root, as lynxtop's); the SLA is
    # the agent's [sla] defaults, so both compute goodput
    argv = [str(prepared.vllm), "bench", "serve", "--backend", "openai", "--base-url", f"http://127.0.0.1:{agent.port}",
            "--tokenizer", str(prepared.model), "--dataset-name", "sharegpt", "--dataset-path", str(sharegpt),
            "--sharegpt-output-len", str(SAVE_OUTPUT), "--disable-shuffle", "--num-prompts", str(SAVE_PROMPTS),
            "--ready-check-timeout-sec", "0", "--disable-tqdm", "--max-concurrency", str(SAVE_CONCURRENCY),
            "--ignore-eos", "--percentile-metrics", "ttft,tpot,itl,e2el,client_queue_time",
            "--metric-percentiles", "50,90,99", "--goodput", "ttft:2000", "tpot:150",
            "--save-result", "--save-detailed", "--result-dir", str(out / "vllm")]
    quiet = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    theirs_proc = subprocess.run(argv, capture_output=True, text=True, timeout=600,
                                 env={**os.environ, **prepared.env(), **quiet})
    assert theirs_proc.returncode == 0, (theirs_proc.stdout + theirs_proc.stderr)[-3000:]
    ours_proc = subprocess.run([sys.executable, "-m", "lynxtop", "bench", "--config", str(agent.config),
                                "--prompts", str(prompts), "--output-len", str(SAVE_OUTPUT), "--concurrency",
                                str(SAVE_CONCURRENCY), "--requests", str(SAVE_PROMPTS), "--warmup", "0",
                                "--save-result", "--result-dir", str(out / "lynxtop")],
                               capture_output=True, text=True, timeout=600)
    assert ours_proc.returncode == 0, ours_proc.stdout + ours_proc.stderr
    (theirs_file,) = [p for p in (out / "vllm").glob("*.json") if not p.name.endswith(".pytorch.json")]
    (ours_file,) = (out / "lynxtop").glob("*.json")
    date = re.compile(r"-\d{8}-\d{6}\.json$")
    assert date.sub("", ours_file.name) == date.sub("", theirs_file.name), (ours_file.name, theirs_file.name)
    theirs, ours = json.loads(theirs_file.read_text()), json.loads(ours_file.read_text())
    missing = sorted(set(theirs) - set(ours))
    differ = {k: (_shape(ours[k]), _shape(theirs[k])) for k in theirs if k in ours
              and not _same_shape(ours[k], theirs[k])}
    print(f"\nvLLM's keys: {len(theirs)}, lynxtop's: {len(ours)}, lynxtop's own: {sorted(set(ours) - set(theirs))}")
    assert not missing and not differ, f"missing: {missing}; other types (lynxtop, vLLM): {differ}"
    itls = [g for gaps in ours["itls"] + theirs["itls"] for g in gaps]
    assert itls and all(isinstance(g, float) for g in itls)
    for k in ("num_prompts", "completed", "failed", "total_output_tokens", "max_concurrency", "request_rate",
              "backend", "label", "model_id"):
        assert ours[k] == theirs[k], (k, ours[k], theirs[k])
    assert ours["output_lens"] == theirs["output_lens"] == [SAVE_OUTPUT] * SAVE_PROMPTS
    assert len(ours["generated_texts"]) == SAVE_PROMPTS and all(ours["generated_texts"])


# ---------------------------------------------------------------------------------------------------- full log disk


def _reserved(log: Path) -> int:
    st = os.stat(log)
    return st.st_blocks * 512 - st.st_size


def test_a_load_whose_log_disk_fills_becomes_ready_on_the_logs_reserve(prepared, tmp_path):
    """vLLM's progress bar (tqdm: the checkpoint shards) re-raises ENOSPC, so a disk that fills during a load kills
    it (session 17 noted it). The agent keeps `[agent] run_log_reserve_mb` allocated past the run log's end
    (session 18, agent/serving/logreserve.py): with the log on a small tmpfs filled right after the spawn, before
    vLLM wrote a byte, the real load writes its whole output, bar included, into the reserve and becomes ready;
    the stop gives the reserve back. Its own agent (the module's shared one keeps its logs on the ordinary disk)."""
    from rv_support import Agent, kill_tree, operators_group, vllm_processes
    from support.agent_config import agent_toml, profile
    from support.small_fs import fill, mounted

    with mounted(tmp_path / "small", "16m") as small:
        state = tmp_path / "state"
        state.mkdir()
        cfg = state / "config.toml"
        cfg.write_text(agent_toml(
            state / "lynxtop.db", state / "agent.sock", socket_group=operators_group(), log_dir=small / "logs",
            sample_interval_s=1.0, min_free_mb=1, run_log_reserve_mb=4, backoff_initial_s=2, backoff_max_s=4,
            crash_loop_failures=2, live_restore=False,
            profiles=[profile("tiny", prepared.vllm, model=str(prepared.model), served_model_name=MODEL,
                              max_model_len=512, shutdown_timeout_s=10, stop_grace_s=40, readiness_timeout_s=400,
                              env=prepared.env(), extra_args=["--dtype", "float32", "--enforce-eager"])]))
        ag = Agent(config=cfg, socket=state / "agent.sock", database=state / "lynxtop.db", log=state / "agent.log")
        before = {p.pid for p in vllm_processes(prepared.root)}
        ag.start()
        try:
            code, body = ag.post("/v1/start", {"profile": "tiny"})
            assert code == 202, (code, body)
            log = wait_for(lambda: next((small / "logs").glob("*.log"), None), 60, "the run's log")
            wait_for(lambda: _reserved(log) >= 2 << 20, 30, "the run log's reserve")
            fill(small)
            s = ag.wait_state({"ready", "backoff", "crash-loop"}, 400)
            assert s["state"] == "ready", (s, ag.log_tail())
            text = log.read_bytes()
            assert b"Loading safetensors checkpoint shards: 100% Completed" in text, text[-2000:]
            assert b"Application startup complete." in text
            assert os.statvfs(small).f_bfree == 0  # still full: the output went into the reserve
            assert not [e for e in ag.events() if e["kind"] == "serving.crash"]
            code, body = ag.post("/v1/stop")
            assert code == 202, (code, body)
            ag.wait_state({"stopped"}, 90)
            wait_for(lambda: _reserved(log) < 4096, 20, "the ended run's reserve given back")
        finally:
            with contextlib.suppress(OSError, AssertionError):
                if ag.proc is not None and ag.proc.poll() is None:
                    ag.post("/v1/stop")
                    ag.wait_state({"stopped"}, 60)
            ag.stop()
            kill_tree([p.pid for p in vllm_processes(prepared.root) if p.pid not in before])
