"""Alerts over flapping conditions, run by the real promtool on contrib's rules: a vLLM page failing 1 scrape in 3
fires LynxtopVllmMetricsFailing (the last scrape's scrape_ok never held 0 for 2 minutes, so it never did); a GPU
lost and back every 30 s is one firing LynxtopGpuLost (it paged once per flap); ticks a lagging writer drops and
ticks the agent misses have alerts of their own (they were only counted)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import yaml
from support.real import needs_tools

RULES = Path(__file__).resolve().parents[2] / "contrib" / "prometheus" / "lynxtop-rules.yml"
N1 = 'job="lynxtop", instance="n1:9464", node="n1"'
LABELS = {"severity": "warning", "job": "lynxtop", "instance": "n1:9464", "node": "n1"}


def _promtool(tmp_path: Path, series: dict[str, str], checks: list[tuple[str, str, list[dict[str, Any]]]],
              interval: str = "15s") -> subprocess.CompletedProcess:
    """promtool test rules on one group: series (name{labels} -> values), checks (eval time, alert, expected)."""
    case = {"rule_files": [str(RULES)], "evaluation_interval": "15s", "tests": [{
        "interval": interval,
        "input_series": [{"series": s, "values": v} for s, v in series.items()],
        "alert_rule_test": [{"eval_time": t, "alertname": a, "exp_alerts": exp} for t, a, exp in checks]}]}
    f = tmp_path / "case.test.yml"
    f.write_text(yaml.safe_dump(case, sort_keys=False))
    promtool = shutil.which("promtool")
    assert promtool is not None
    return subprocess.run([promtool, "test", "rules", str(f)], capture_output=True, text=True, timeout=60)


def _alert(summary: str, description: str | None = None, **labels: str) -> list[dict[str, Any]]:
    ann = {"summary": summary} | ({"description": description} if description else {})
    return [{"exp_labels": {**LABELS, **labels}, "exp_annotations": ann}]


METRICS_FAILING = _alert("n1: the agent cannot read vLLM's /metrics")


@needs_tools("promtool")
def test_a_page_failing_one_scrape_in_three_fires_the_metrics_alert(tmp_path):
    p = _promtool(tmp_path, {f"lynxtop_serving_scrape_ok{{{N1}}}": " ".join(["0 1 1"] * 14),
                             f"lynxtop_serving_up{{{N1}}}": "1x45"},
                  [("90s", "LynxtopVllmMetricsFailing", []), ("9m", "LynxtopVllmMetricsFailing", METRICS_FAILING)])
    assert p.returncode == 0, p.stdout + p.stderr


@needs_tools("promtool")
def test_failed_scrapes_prometheus_never_samples_fire_it_from_the_agents_counter(tmp_path):
    """The agent scrapes at 10 Hz and one scrape in 300 fails: scrape_ok reads 1 at every Prometheus sample."""
    p = _promtool(tmp_path, {f"lynxtop_serving_scrape_ok{{{N1}}}": "1x40",
                             f"lynxtop_serving_scrape_errors_total{{{N1}}}": " ".join(str(i // 2) for i in range(40)),
                             f"lynxtop_serving_up{{{N1}}}": "1x40"},
                  [("6m", "LynxtopVllmMetricsFailing", METRICS_FAILING)])
    assert p.returncode == 0, p.stdout + p.stderr


@needs_tools("promtool")
def test_one_failed_scrape_is_no_alert(tmp_path):
    p = _promtool(tmp_path, {f"lynxtop_serving_scrape_ok{{{N1}}}": "1 1 0 1x37",
                             f"lynxtop_serving_scrape_errors_total{{{N1}}}": "0 0 1x38",
                             f"lynxtop_serving_up{{{N1}}}": "1x40"},
                  [(t, "LynxtopVllmMetricsFailing", []) for t in ("1m", "2m", "3m", "5m")])
    assert p.returncode == 0, p.stdout + p.stderr


@needs_tools("promtool")
def test_a_flapping_gpu_is_one_firing_alert(tmp_path):
    lost = _alert("n1: GPU 1 fell off the bus", "NVML reports GPU 1 (G1) lost; the node needs a GPU reset or a "
                  "reboot. While NVML gives no readings (LynxtopNvmlDown) this is the last state read: it resolves "
                  "only once NVML reads the GPU back.", severity="critical", gpu="1", uuid="G1")
    p = _promtool(tmp_path, {f'lynxtop_gpu_lost{{{N1}, gpu="1", uuid="G1"}}': "0 " + "1 1 0 0 " * 5,
                             f"lynxtop_nvml_ok{{{N1}}}": "1x20"},
                  [(t, "LynxtopGpuLost", lost) for t in ("15s", "60s", "3m45s", "5m")])
    assert p.returncode == 0, p.stdout + p.stderr


@needs_tools("promtool")
def test_dropped_and_missed_ticks_have_alerts(tmp_path):
    dropped = _alert("n1: the agent drops samples instead of storing them",
                     "The agent on n1:9464 dropped 45 sampling ticks in the last 10 minutes: its history has gaps. "
                     "`lynxtop status` (store: queued, dropped, last_error) and `lynxtop events` (store.ticks_dropped, "
                     "store.write_failed) say whether the writer lags or writes fail.")
    missed = _alert("n1: the agent keeps missing sampling ticks",
                    "The agent on n1:9464 missed 5 sampling ticks in the last 5 minutes, and has been missing some for "
                    "10 minutes: its samples have gaps. `lynxtop status` gives missed and failed ticks and the last "
                    "tick error; `journalctl -u lynxtop-agent` says why.")
    p = _promtool(tmp_path, {f"lynxtop_store_dropped_ticks_total{{{N1}}}": "0 0 45x20",
                             f"lynxtop_agent_missed_ticks_total{{{N1}}}": "0+1x20"},
                  [("5m", "LynxtopStoreDroppingTicks", []), ("8m", "LynxtopStoreDroppingTicks", dropped),
                   ("9m", "LynxtopAgentMissingTicks", []), ("14m", "LynxtopAgentMissingTicks", missed)],
                  interval="1m")
    assert p.returncode == 0, p.stdout + p.stderr
