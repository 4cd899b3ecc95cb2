"""A resumed agent counts no paused time as engine stall; LynxtopGpuLost holds through an NVML outage (session 21).

1. The watchdog thread finds the agent was stopped (SIGSTOP, a VM pause) and tells the ticker (`on_resume`); the
   hang detector of the run being scraped must hear it too. Before, only its learned-gap rule (a gap over twice
   the usual one plus the scrape's timeout) kept a pause out of the stall time: a pause within that bound (slow
   scrapes, a short hang_timeout_s) was counted as stall and judged HUNG (a restart with restart_on_hang).
   Real parts: an aiohttp server with vLLM's page, the real ScrapeSource, HangDetector, Ticker and WatchdogThread
   (its clock is the one thing given: a pause cannot be made of a real test process's monotonic clock).
2. `lynxtop_gpu_lost` vanishes with every GPU reading while NVML is down; the alert resolved then, when nothing was
   fixed. promtool runs the contrib rules over a lost GPU, an NVML outage, and NVML back with the GPU back.
"""

from __future__ import annotations

import shutil
import subprocess
import textwrap
import threading
import time
from pathlib import Path

import pytest
from aiohttp import web
from support.real import needs_tools
from support.web_app import serving

from lynxtop.agent.api.connguard import Episodes
from lynxtop.agent.clock import Timeline
from lynxtop.agent.notify import Notifier, WatchdogThread
from lynxtop.agent.sampling import ScrapeSource, ScrapeTarget, Tick
from lynxtop.agent.serving.health import HangDetector, Health, HttpClient
from lynxtop.agent.ticker import Ticker

pytestmark = pytest.mark.timeout(120)

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "contrib" / "prometheus" / "lynxtop-rules.yml"


def page(gen: float, kv: float, running: int = 12) -> str:
    lab = 'engine="0",model_name="m"'
    return "".join([
        "# TYPE vllm:num_requests_running gauge\n", f"vllm:num_requests_running{{{lab}}} {running}\n",
        "# TYPE vllm:num_requests_waiting gauge\n", f"vllm:num_requests_waiting{{{lab}}} 0\n",
        "# TYPE vllm:kv_cache_usage_perc gauge\n", f"vllm:kv_cache_usage_perc{{{lab}}} {kv}\n",
        "# TYPE vllm:prompt_tokens counter\n", f"vllm:prompt_tokens_total{{{lab}}} 5000\n",
        "# TYPE vllm:generation_tokens counter\n", f"vllm:generation_tokens_total{{{lab}}} {gen}\n",
    ])


def _ticker() -> Ticker:
    return Ticker(1.0, Timeline(), Episodes(lambda _m: None), writer=lambda: None, record=lambda _e: None,
                  context=lambda: (None, None), on_beat=lambda _t: None, on_done=lambda: None)


def _wait(cond, timeout: float = 30.0) -> bool:
    end = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > end:
            return False
        time.sleep(0.02)
    return True


async def test_a_pause_the_watchdog_found_is_no_stall_even_within_the_learned_gap():
    """Scrapes every 10 s (hang_timeout_s 15, the scrape's timeout 2 s: a gap up to 2*10+2 = 22 s is "watched" by
    the learned-gap rule). The agent and vLLM are paused 20 s; the watchdog finds it on its wake-up and calls the
    ticker's `resumed`. The page after the pause is the page before it: no stall, no HUNG. A real hang after the
    resume is still judged once hang_timeout_s was watched."""
    state = {"gen": 100.0, "kv": 0.30}

    async def metrics(_r: web.Request) -> web.Response:
        return web.Response(text=page(state["gen"], state["kv"]), content_type="text/plain")

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    verdicts: list = []
    http = HttpClient()
    clock = {"t": 1000.0}
    lock = threading.Lock()

    def now() -> float:
        with lock:
            return clock["t"]

    ticker = _ticker()
    watchdog = WatchdogThread(Notifier(None, None), lambda: True, 5.0, on_resume=ticker.resumed, step_s=0.02,
                              clock=now)
    try:
        async with serving(app) as url:
            target = ScrapeTarget(url + "/metrics", 1, "token")
            src = ScrapeSource(http, lambda: target, window_s=60, timeout_s=2.0, hang_timeout_s=15.0,
                               on_new_run=lambda: None, on_verdict=verdicts.append)
            ticker.use([[src]])  # as node.py wires it: the scrape is one of the ticker's samplers

            async def scrape(t: float) -> None:
                rows, _ = await src.sample(Tick(ts_ms=int(t * 1000), t0=t, deadline=time.monotonic() + 10,
                                                root=None, run_id=1))
                assert rows["serving_row"]["scrape_ok"] == 1

            watchdog.start()
            try:
                t = 1000.0
                for _ in range(6):  # busy decoding, a page every 10 s
                    state["gen"] += 860
                    state["kv"] += 0.001
                    await scrape(t)
                    t += 10.0
                assert not [v for v in verdicts if v.health is Health.HUNG]
                hang = src.hang
                assert isinstance(hang, HangDetector)
                t += 10.0  # paused 20 s after the last page (1050 -> 1070): within 2*10+2
                with lock:
                    clock["t"] = t - 0.5  # the watchdog's next wake-up is 19.5 s late: the process was stopped
                assert _wait(lambda: watchdog.resumes >= 1), "the watchdog did not find the pause"
                await scrape(t)  # the page as before the pause: the engine was paused too
                hung = [v for v in verdicts if v.health is Health.HUNG]
                assert not hung, [v.reason for v in hung]  # was: "no token generated for 20 s"
                assert src.hang is hang  # the same run's detector
                t += 10.0  # really stuck now: 10 s watched is not yet a hang
                await scrape(t)
                assert not [v for v in verdicts if v.health is Health.HUNG], [v.reason for v in verdicts]
                t += 10.0
                await scrape(t)
                hung = [v for v in verdicts if v.health is Health.HUNG]
                assert len(hung) == 1 and "for 20 s" in hung[0].reason, [v.reason for v in hung]
            finally:
                src.close()
    finally:
        watchdog.stop()
        await http.close()


def test_a_resume_between_two_readings_makes_that_gap_unwatched_whichever_thread_tells_it():
    """The detector alone: a resume told (from another thread, as the watchdog does) between two readings leaves
    that gap out of the stall, even one the learned-gap rule takes as watched; the gap after counts again."""
    hang = HangDetector(10, slack_s=5)
    assert hang.observe(1, 5.0, now=0).health is Health.PROGRESSING
    assert hang.observe(1, 5.0, now=2) is None  # 2 s of stall
    told = threading.Thread(target=hang.resumed, args=(9.5,))
    told.start()
    told.join()
    assert hang.observe(1, 5.0, now=10) is None  # 8 s <= 2*2+5: watched by the rule, yet paused
    assert hang.observe(1, 5.0, now=14) is None  # 2 + 4 = 6 s
    v = hang.observe(1, 5.0, now=18)  # 2 + 4 + 4 = 10 s watched
    assert v is not None and v.health is Health.HUNG and v.reason.endswith("for 10 s"), v


# ------------------------------------------------------------------------------------------- LynxtopGpuLost

GPU_LOST_CASE = """\
rule_files:
  - {rules}
evaluation_interval: 15s

tests:
  - interval: 15s
    input_series:
      # GPU 3 falls off the bus at 30s; NVML stops answering from 1m to 10m (every GPU series gone from the page:
      # stale, as Prometheus marks a series a scrape no longer has; nvml_ok 0); NVML back at 10m with GPU 3 back
      # (after a reset). GPU 4 stays fine throughout. The alert keeps firing 10 min after (keep_firing_for: a GPU
      # that flaps is one alert, session 22).
      - series: 'lynxtop_gpu_lost{{job="lynxtop", instance="n1:9464", node="n1", gpu="3", uuid="GPU-3"}}'
        values: '0 0 1 1 stale _x35 0x45'
      - series: 'lynxtop_gpu_lost{{job="lynxtop", instance="n1:9464", node="n1", gpu="4", uuid="GPU-4"}}'
        values: '0 0 0 0 stale _x35 0 0 0 0'
      - series: 'lynxtop_nvml_ok{{job="lynxtop", instance="n1:9464", node="n1"}}'
        values: '1 1 1 1 0x35 1 1 1 1'
      # another node whose NVML is down with no GPU ever lost: nothing fires for it
      - series: 'lynxtop_gpu_lost{{job="lynxtop", instance="n2:9464", node="n2", gpu="0", uuid="GPU-20"}}'
        values: '0 0 0 0 stale _x35 0 0 0 0'
      - series: 'lynxtop_nvml_ok{{job="lynxtop", instance="n2:9464", node="n2"}}'
        values: '1 1 1 1 0x35 1 1 1 1'
    alert_rule_test:
      - eval_time: 15s
        alertname: LynxtopGpuLost
        exp_alerts: []
      - eval_time: 45s
        alertname: LynxtopGpuLost
        exp_alerts: &lost
          - exp_labels: {{severity: critical, job: lynxtop, instance: "n1:9464", node: n1, gpu: "3", uuid: GPU-3}}
            exp_annotations:
              summary: "n1: GPU 3 fell off the bus"
              description: >-
                NVML reports GPU 3 (GPU-3) lost; the node needs a GPU reset or a reboot.
                While NVML gives no readings (LynxtopNvmlDown) this is the last state read: it resolves only once NVML
                reads the GPU back.
      - eval_time: 2m
        alertname: LynxtopGpuLost
        exp_alerts: *lost
      - eval_time: 9m45s
        alertname: LynxtopGpuLost
        exp_alerts: *lost
      - eval_time: 10m30s
        alertname: LynxtopGpuLost
        exp_alerts: *lost
      - eval_time: 20m30s
        alertname: LynxtopGpuLost
        exp_alerts: []

  - interval: 15s
    input_series:
      # n3: GPU 1 lost, then NVML hangs (the agent still reads nvml_ok 1, but serves no GPU readings after 2 s):
      # held as well; the agent stops answering at 5m (every series stale): what was held goes, 10 min later
      - series: 'lynxtop_gpu_lost{{job="lynxtop", instance="n3:9464", node="n3", gpu="1", uuid="GPU-31"}}'
        values: '1 1 1 1 stale'
      - series: 'lynxtop_nvml_ok{{job="lynxtop", instance="n3:9464", node="n3"}}'
        values: '1 1 1 1 1x15 stale'
    alert_rule_test:
      - eval_time: 15s
        alertname: LynxtopGpuLost
        exp_alerts: &n3
          - exp_labels: {{severity: critical, job: lynxtop, instance: "n3:9464", node: n3, gpu: "1", uuid: GPU-31}}
            exp_annotations:
              summary: "n3: GPU 1 fell off the bus"
              description: >-
                NVML reports GPU 1 (GPU-31) lost; the node needs a GPU reset or a reboot.
                While NVML gives no readings (LynxtopNvmlDown) this is the last state read: it resolves only once NVML
                reads the GPU back.
      - eval_time: 4m45s
        alertname: LynxtopGpuLost
        exp_alerts: *n3
      - eval_time: 5m30s
        alertname: LynxtopGpuLost
        exp_alerts: *n3
      - eval_time: 15m30s
        alertname: LynxtopGpuLost
        exp_alerts: []
"""


@needs_tools("promtool")
def test_gpu_lost_keeps_firing_while_nvml_is_down_and_resolves_when_the_gpu_is_read_back(tmp_path):
    case = tmp_path / "gpulost.test.yml"
    case.write_text(textwrap.dedent(GPU_LOST_CASE.format(rules=RULES)))
    promtool = shutil.which("promtool")
    assert promtool is not None
    p = subprocess.run([promtool, "test", "rules", str(case)], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stdout + p.stderr
