"""The benchmark scripts run end to end here: their JSON last line, the no-driver path, the import shim.

Timings are not asserted (the machine is shared and noisy); the scripts' own JSON carries them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]


def run(*args: str, timeout: float = 90) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run([sys.executable, *args], cwd=REPO, capture_output=True, text=True, timeout=timeout,
                          env=env)


def last_json(out: str) -> dict:
    return json.loads(out.strip().splitlines()[-1])


def test_nvml_real_without_a_driver_says_so_and_exits_2():
    p = run("benchmarks/nvml_real.py")
    if p.returncode == 0:
        return  # a real GPU here: the hardware path ran instead
    assert p.returncode == 2, p.stderr
    assert "Traceback" not in p.stderr
    assert "no NVIDIA driver" in p.stderr
    out = last_json(p.stdout)
    assert out["gpus"] == 0 and "no NVIDIA driver" in out["error"]


def test_nvml_real_shim_imports_this_checkout():
    p = run("benchmarks/nvml_real.py", "--self-check")
    assert p.returncode == 0, p.stderr
    out = last_json(p.stdout)
    assert Path(out["sampler"]) == REPO / "agent" / "gpu" / "sampler.py"
    assert not Path(out["shim"]).exists()  # the temporary package is removed at exit


def test_nvml_real_measurement_code_on_the_fake_node():
    p = run("benchmarks/nvml_real.py", "--fake", "a100x8", "--rounds", "20")
    out = last_json(p.stdout)
    assert out["gpus"] == 8 and out["simulated"] is True
    assert out["raw_calls_per_tick"] > 8 * 5
    assert out["tick_cpu_ms_per_gpu"] > 0 and out["tick_vs_raw_nvml_ratio"] > 0
    assert out["checks"]["distinct_uuid"] == "PASS" and out["checks"]["memory_accounting"] == "SKIP"
    assert "nvmlDeviceGetFieldValues" in out["raw_ms_by_function"]  # A100: NVLink from field counters
    assert "nvmlGpmSampleGet" not in out["raw_ms_by_function"]
    assert p.returncode in (0, 1)  # 1 only when a cost bound failed on this noisy machine


def test_sampling_benchmark_prints_its_json():
    p = run("benchmarks/sampling.py", "--quick", timeout=120)
    assert p.returncode == 0, p.stderr
    out = last_json(p.stdout)
    for key in ("tick_overhead_ms", "cpu_percent_1hz", "cpu_percent_10hz"):
        assert isinstance(out[key], float) and out[key] > 0
    assert out["tick_overhead_ms"] < out["tick_wall_ms"]
    assert out["backend_calls_per_tick"] >= 8 * 10


def test_gpu_agent_own_benchmark_prints_its_json():
    """The agent's own reading path over constant C-level answers: it runs, and every GPU's row is read."""
    p = run("benchmarks/gpu_agent_own.py", "--ticks", "70", timeout=120)
    assert p.returncode == 0, p.stderr
    out = last_json(p.stdout)
    assert out["gpus"] == 8 and out["own_ms_per_tick"] > 0 and out["spread"][0] <= out["spread"][1]
