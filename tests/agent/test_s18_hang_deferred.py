"""A request that only waits for a deferred reason is not a hang (restart_on_hang would restart a healthy server).

vLLM (0.12+) splits `vllm:num_requests_waiting` by reason: `capacity` (waits for room) and `deferred` (waits on
something outside the scheduler: a decode instance waiting for a prefill node's KV, a structured-output grammar
compiling, a LoRA budget). A deferred request does not move until that ends, however healthy the engine. The hang
rule counts running requests and those waiting for capacity; the by-reason family read per engine (one series an
engine at DP8), absent on older vLLM (then every waiting request counts, as before).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from pathlib import Path

import aiohttp
import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from support.agent_proc import Agent, e2e_config, state_db
from support.vllm_pages import sim_page

from lynxtop.agent.metrics.layout import PageLayout
from lynxtop.agent.metrics.page import parse_text
from lynxtop.agent.metrics.scrape import MetricsScraper
from lynxtop.agent.serving import policy, procs
from lynxtop.agent.serving.health import HangDetector, Health
from lynxtop.contract.config import AgentConfig
from lynxtop.sim.metrics import VllmMetrics
from lynxtop.sim.model import SimEngine, SimParams, SimRequest

PAGES = Path(__file__).resolve().parent / "io" / "pages"
CFG = AgentConfig(database="/tmp/x.db", socket="/tmp/x.sock", restart_on_hang=True)


def engine(e: str, running: int, waiting: int, deferred: int | None = None) -> dict:
    """One engine's load as the scraper hands it over (agent/metrics/row.py `engine_loads`)."""
    out = {"engine": e, "running": running, "waiting": waiting, "kv_cache_usage_pct": 0.0}
    if deferred is not None:
        out["deferred"] = deferred
    return out


def stalled_verdict(engines: list[dict], running: int | None = None, waiting: int | None = None):
    """The detector's verdict after 61 s of the same readings (hang_timeout_s 60): nothing moved."""
    running = sum(e["running"] for e in engines) if running is None else running
    waiting = sum(e["waiting"] for e in engines) if waiting is None else waiting
    det = HangDetector(60.0)
    row = {"kv_cache_usage_pct": 0.0, "requests_waiting": waiting}
    det.observe(running, 1000, waiting, now=0.0, row=row, engines=engines)  # the progress baseline
    return det.observe(running, 1000, waiting, now=61.0, row=row, engines=engines)


def hung(verdict) -> bool:
    return verdict is not None and verdict.health is Health.HUNG


# ------------------------------------------------------------------------------------------ the rule


def test_a_deferred_request_alone_is_not_a_hang_and_restarts_nothing():
    # running 0, waiting 1, waiting_by_reason{reason="deferred"} 1: a decode instance waits for a prefill node's KV
    verdict = stalled_verdict([engine("0", 0, 1, deferred=1)])
    assert not hung(verdict), verdict
    assert not policy.restart_on_verdict(hung(verdict), CFG, False, True)


def test_a_request_waiting_for_capacity_beside_a_deferred_one_is_still_a_hang_and_says_what_is_deferred():
    verdict = stalled_verdict([engine("0", 0, 3, deferred=1)])
    assert hung(verdict)
    assert "3 waiting" in verdict.reason and "1 deferred" in verdict.reason
    assert policy.restart_on_verdict(True, CFG, False, True)  # what the supervisor then does (restart_on_hang)


def test_running_requests_with_deferred_ones_waiting_are_still_a_hang():
    assert hung(stalled_verdict([engine("0", 2, 1, deferred=1)]))


def test_without_the_by_reason_family_every_waiting_request_counts_as_before():
    verdict = stalled_verdict([engine("0", 0, 1)])  # vLLM before 0.12: no deferred reading
    assert hung(verdict) and "deferred" not in verdict.reason
    assert hung(stalled_verdict([], running=0, waiting=1))  # no per-engine readings at all


def test_dp8_each_engine_s_deferred_requests_are_set_against_its_own_waiting_ones():
    idle = [engine(str(e), 0, 0, deferred=0) for e in range(8)]
    only_deferred = [engine(str(e), 0, 2, deferred=2) if e in (1, 6) else idle[e] for e in range(8)]
    assert not hung(stalled_verdict(only_deferred))
    # engine 3 waits for capacity while 1 and 6 only wait deferred: engine 3 is stuck
    stuck = [engine("3", 0, 1, deferred=0) if e == 3 else only_deferred[e] for e in range(8)]
    verdict = stalled_verdict(stuck)
    assert hung(verdict) and "4 deferred" in verdict.reason
    # an engine that says more are deferred than wait does not cancel another engine's waiting requests
    odd = [engine("0", 0, 1, deferred=5), engine("1", 0, 1, deferred=0)]
    assert hung(stalled_verdict(odd))
    # an engine whose deferred reading was no reading (None) counts all its waiting requests
    assert hung(stalled_verdict([engine("0", 0, 1) | {"deferred": None}]))


def test_a_deferred_request_turning_into_a_capacity_wait_starts_the_clock_there():
    det = HangDetector(60.0)
    row = {"kv_cache_usage_pct": 0.0}
    det.observe(0, 1000, 1, now=0.0, row=row, engines=[engine("0", 0, 1, deferred=1)])
    assert not hung(det.observe(0, 1000, 1, now=200.0, row=row, engines=[engine("0", 0, 1, deferred=1)]))
    # its KV arrived at 200 s: it now waits for capacity (the by-reason gauges moved), and stays so
    assert not hung(det.observe(0, 1000, 1, now=201.0, row=row, engines=[engine("0", 0, 1, deferred=0)]))
    assert not hung(det.observe(0, 1000, 1, now=250.0, row=row, engines=[engine("0", 0, 1, deferred=0)]))
    assert hung(det.observe(0, 1000, 1, now=262.0, row=row, engines=[engine("0", 0, 1, deferred=0)]))


# ------------------------------------------------------------------------------------------ the page


def _with_deferred(text: str, per_engine: dict[str, str]) -> str:
    """The real DP2 page with engine e's deferred (and its waiting) sample set to per_engine[e]."""
    for e, value in per_engine.items():
        for name in (f'vllm:num_requests_waiting_by_reason{{engine="{e}",model_name="tiny",reason="deferred"}}',
                     f'vllm:num_requests_waiting{{engine="{e}",model_name="tiny"}}'):
            assert name + " 0.0" in text
            text = text.replace(name + " 0.0", f"{name} {value}")
    return text


def test_the_real_dp_page_s_deferred_requests_are_read_per_engine_and_summed():
    base = (PAGES / "vllm-0.32-cpu-tiny-dp2-api2.txt").read_text()
    layout = PageLayout()
    for n in (2.0, 3.0, 3.0):  # the full parse, then through the learnt layout (and its plan)
        text = _with_deferred(base, {"1": f"{n}"})
        for page in (parse_text(text), layout.parse(text)):
            assert page.engines["1"]["deferred"] == n and page.engines["0"]["deferred"] == 0.0
            assert page.gauges["deferred"] == n and page.gauges["waiting"] == n
    s = MetricsScraper("http://x:1/metrics")
    row = s.parse_page(_with_deferred(base, {"0": "1.0"}), now=0.0)
    assert row["scrape_ok"] == 1 and row["requests_waiting"] == 1
    assert [(e["engine"], e["waiting"], e["deferred"]) for e in s.engines] == [("0", 1, 1), ("1", 0, 0)]


def test_the_capacity_series_is_never_read_as_deferred():
    text = (PAGES / "vllm-0.32-cpu-tiny.txt").read_text().replace(
        'vllm:num_requests_waiting_by_reason{engine="0",model_name="tiny",reason="capacity"} 0.0',
        'vllm:num_requests_waiting_by_reason{engine="0",model_name="tiny",reason="capacity"} 7.0')
    page = parse_text(text)
    assert page.gauges["deferred"] == 0.0 and page.engines["0"]["deferred"] == 0.0


def test_a_page_without_the_by_reason_family_gives_no_deferred_reading():
    text = (PAGES / "vllm-0.32-cpu-tiny.txt").read_text()
    kept = [x for x in text.splitlines(keepends=True) if "num_requests_waiting_by_reason" not in x]
    page = parse_text("".join(kept))
    assert "deferred" not in page.gauges and "deferred" not in page.engines["0"]
    s = MetricsScraper("http://x:1/metrics")
    assert s.parse_page("".join(kept), now=0.0)["scrape_ok"] == 1
    assert "deferred" not in s.engines[0]


@pytest.mark.parametrize("value", ["NaN", "+Inf", "-1.0", "1e300"])
def test_a_deferred_sample_that_is_no_reading_counts_nothing_as_deferred(value):
    text = (PAGES / "vllm-0.32-cpu-tiny.txt").read_text().replace(
        'reason="deferred"} 0.0', f'reason="deferred"}} {value}')
    s = MetricsScraper("http://x:1/metrics")
    row = s.parse_page(text, now=0.0)
    assert row["scrape_ok"] == 1
    assert s.engines[0].get("deferred") is None  # left out, or None: not a count
    assert s.bad_values >= 1  # and counted as a value that was no reading
    assert hung(stalled_verdict([dict(s.engines[0], waiting=1)]))


# ------------------------------------------------------------------------------------------ the simulator


def _page_values(m: VllmMetrics) -> dict[tuple[str, str], float]:
    page = parse_text(generate_latest(m.registry).decode())
    return {(e, k): v for e, vals in page.engines.items() for k, v in vals.items()}


def test_the_sim_page_splits_waiting_into_capacity_and_deferred_as_vllm_does():
    m = VllmMetrics(model_name="m", version=(0, 32), max_model_len=4096, spec_decode=False,
                    cache_info={"block_size": "16"}, engines=2)
    m.set_gauges(0, 3, 0.0, 1, deferred=2)
    m.on_step({"running": 1, "waiting": 1, "deferred": 1, "kv": 0.1}, 0)
    vals = _page_values(m)
    assert vals[("1", "waiting")] == 3 and vals[("1", "deferred")] == 2
    assert vals[("0", "waiting")] == 1 and vals[("0", "deferred")] == 1
    fams = {f.name: f for f in text_string_to_metric_families(generate_latest(m.registry).decode())}
    by = {(s.labels["engine"], s.labels["reason"]): s.value
          for s in fams["vllm:num_requests_waiting_by_reason"].samples}
    assert by == {("0", "capacity"): 0, ("0", "deferred"): 1, ("1", "capacity"): 1, ("1", "deferred"): 2}


def test_the_sim_holds_requests_deferred_for_remote_kv_wait_s_and_then_runs_them():
    p = SimParams(remote_kv_wait_s=5.0)
    eng = SimEngine(p, num_gpu_blocks=400, block_size=64, max_num_seqs=16, max_num_batched_tokens=8192)
    eng.add(SimRequest(rid="a", prompt_tokens=100, max_tokens=4, arrival_s=0.0, ready_s=5.0))
    assert eng.deferred(1.0) == 1 and eng.waiting_for_capacity(1.0) == 0
    res = eng.step(1.0)
    assert res.duration_s == 0 and not eng.running  # nothing scheduled: its KV has not arrived
    res = eng.step(5.0)
    assert res.duration_s > 0 and [r.rid for r in eng.running] == ["a"] and eng.deferred(5.0) == 0


# ------------------------------------------------------------------------------------------ the agent


@pytest.mark.timeout(120)
async def test_the_agent_does_not_restart_a_server_whose_only_request_is_deferred(tmp_path, cleanup):
    """restart_on_hang on, hang_timeout_s 5 (its least): the simulated decode instance holds the request 25 s for
    its KV (deferred), running 0 and waiting 1 all along. The server is neither degraded nor restarted; the
    request then runs to its end."""
    cfg = e2e_config(tmp_path, extra_agent="hang_timeout_s = 5\nrestart_on_hang = true",
                     sim_args=("--sim-param", "remote_kv_wait_s=25"))
    a = Agent(tmp_path, cfg)
    cleanup.append(a)
    st = await a.wait_state(lambda s: s["state"] == "ready", what="ready")
    pid, run_id, url = st["serving"]["pid"], st["serving"]["run_id"], st["serving"]["url"]
    body = {"model": "deepseek-ai/DeepSeek-V4.1", "prompt": "hello " * 50, "max_tokens": 4}
    async with aiohttp.ClientSession() as session:
        task = asyncio.create_task(session.post(url + "/v1/completions", json=body,
                                                timeout=aiohttp.ClientTimeout(total=60)))
        try:
            deadline = time.monotonic() + 15
            while ((await a.status()).get("serving_metrics") or {}).get("requests_waiting") != 1:
                assert time.monotonic() < deadline, "the agent never read the deferred request waiting"
                await asyncio.sleep(0.1)
            seen = set()
            deadline = time.monotonic() + 12  # over two hang timeouts with the request deferred throughout
            while time.monotonic() < deadline:
                _, st = await a.api("GET", "/v1/status")
                seen.add(st["serving"]["state"])
                assert st["serving"]["pid"] == pid and st["serving"]["run_id"] == run_id
                sm = st.get("serving_metrics") or {}
                assert sm.get("requests_running") in (0, None), sm  # still deferred: nothing ran
                await asyncio.sleep(0.2)
            assert seen == {"ready"}, seen
            resp = await asyncio.wait_for(task, 40)
            assert resp.status == 200
            done = await resp.json()
            assert done["usage"]["completion_tokens"] == 4
            resp.release()
        finally:
            if not task.done():
                task.cancel()
            with contextlib.suppress(BaseException):
                await task
    assert procs.alive(pid)
    kinds = {e["kind"] for e in state_db(tmp_path, "SELECT kind FROM events")}
    assert "serving.degraded.hang" not in kinds, kinds
    assert a.stop() == 0


def test_the_sim_s_random_dp8_pages_hold_no_deferred_request():
    """The sim's random DP8 pages (tests/support/vllm_pages.py): capacity + deferred = waiting per engine."""
    page = parse_text(sim_page(8, seed=4))
    for vals in page.engines.values():
        assert vals["deferred"] == 0.0 and not math.isnan(vals["waiting"])
