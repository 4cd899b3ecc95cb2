"""Session 25: `--sim-fail hang-after-idle=S` / `hang-on-next-request`, the simulated EngineCore hanging in its first
step after an idle spell as vLLM's does (an NCCL collective that never returns). vLLM sets its scheduler gauges only
when a step ends (vllm/v1/engine/async_llm.py, output_handler -> PrometheusStatLogger.record), so such an engine
keeps reading 0 running, 0 waiting on /metrics while every request sent to it waits for ever; `/health` answers 200.
The simulator published the gauges as each request arrived, which hid this from every test of the agent."""

from __future__ import annotations

import threading
import time

import pytest
from support.waits import holds, wait_for

from lynxtop.sim.flags import SimUsageError, parse_serve_args

pytestmark = pytest.mark.timeout(90)


def _page(kit, sp) -> dict[str, float]:
    """The request gauges and the token counters of the page now."""
    vals: dict[str, float] = {}
    keys = ("vllm:num_requests_running{", "vllm:num_requests_waiting{", "vllm:generation_tokens_total{",
            "vllm:prompt_tokens_total{")
    for line in kit.http(sp.url + "/metrics")[1].decode().splitlines():
        for key in keys:
            if line.startswith(key):
                vals[key[5:-1]] = vals.get(key[5:-1], 0.0) + float(line.rsplit(" ", 1)[1])
    return vals


def _send(kit, sp, out: list, timeout: float = 30.0) -> threading.Thread:
    def go() -> None:
        try:
            out.append(kit.http(sp.url + "/v1/completions", {"prompt": "1", "max_tokens": 1}, timeout=timeout)[0])
        except OSError as exc:  # the server is killed at teardown while the request waits: that is the point
            out.append(type(exc).__name__)

    t = threading.Thread(target=go, daemon=True)
    t.start()
    return t


def test_the_failure_switches_parse():
    assert parse_serve_args(["m", "--sim-fail", "hang-on-next-request"]).failure.hang_after_idle_s == 0.0
    assert parse_serve_args(["m"], env={"LYNXTOP_SIM_FAIL": "hang-after-idle=30"}).failure.hang_after_idle_s == 30.0
    assert parse_serve_args(["m"]).failure.hang_after_idle_s is None
    for bad in ("hang-after-idle=-1", "hang-after-idle=x", "hang-on-next-request=3", "hang-after-idle=nan"):
        with pytest.raises(SimUsageError, match="hang-after-idle=SECONDS"):
            parse_serve_args(["m", "--sim-fail", bad])


def test_the_key_comes_from_vllm_api_key_and_the_flag_wins():
    assert parse_serve_args(["m"], env={"VLLM_API_KEY": "k1"}).api_key == "k1"
    assert parse_serve_args(["m", "--api-key", "k2"], env={"VLLM_API_KEY": "k1"}).api_key == "k2"
    assert parse_serve_args(["m"], env={}).api_key is None


def test_hang_on_next_request_keeps_idle_gauges_and_health_while_the_request_waits(start_sim, kit):
    sp = start_sim("--sim-fail", "hang-on-next-request", env={"LYNXTOP_SIM_SPEED": "5"})
    sp.wait_ready()
    before = _page(kit, sp)
    assert before["num_requests_running"] == 0 and before["num_requests_waiting"] == 0
    got: list = []
    t = _send(kit, sp, got, timeout=4.0)
    wait_for(lambda: any(st["phase"] == "hung" for st in sp.engine_states()), timeout=20, what="engine hung")
    # what vLLM shows: nothing moves, not even the request counts (set at a step's end), and /health is 200
    holds(lambda: _page(kit, sp) == before, 2.0, what="the page keeps its idle reading")
    assert kit.http(sp.url + "/health")[0] == 200
    t.join(10)
    assert got == ["TimeoutError"], got  # no answer: it waited for ever
    assert _page(kit, sp) == before  # the abort of the request that gave up publishes nothing either


def test_a_busy_engine_does_not_hang_and_an_idle_spell_does(start_sim, kit):
    """hang-after-idle=S: requests served back to back never hang it; the first one after S idle seconds does."""
    sp = start_sim("--sim-fail", "hang-after-idle=3", env={"LYNXTOP_SIM_SPEED": "5"})
    sp.wait_ready()
    t0 = time.monotonic()
    served = 0
    while time.monotonic() - t0 < 2.0:  # within the first idle spell allowance: served at once
        assert kit.http(sp.url + "/v1/completions", {"prompt": "1", "max_tokens": 1}, timeout=10)[0] == 200
        served += 1
    assert served >= 1 and not any(st["phase"] == "hung" for st in sp.engine_states())
    moved = _page(kit, sp)
    assert moved["generation_tokens_total"] >= served
    time.sleep(3.5)  # an idle spell longer than 3 s
    got: list = []
    t = _send(kit, sp, got, timeout=4.0)
    wait_for(lambda: any(st["phase"] == "hung" for st in sp.engine_states()), timeout=20, what="engine hung")
    holds(lambda: _page(kit, sp) == moved, 1.5, what="the page keeps its last reading")
    assert kit.http(sp.url + "/health")[0] == 200
    t.join(10)
    assert got == ["TimeoutError"], got
