"""`lynxtop demo`: its default profile passes its own preflight, its default load is the calm one, and the
dashboard's load key (demo only) raises and lowers it (issue 28.1)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from lynxtop.cli import demo
from lynxtop.sim.loadgen import DEMO_CALM, DEMO_PATTERN, LoadGenerator


def test_demo_default_profile_passes_the_demos_own_preflight(tmp_path: Path):
    config = tmp_path / "config.toml"
    config.write_text(demo.config_text(demo.DemoPaths.under(tmp_path), port=demo.free_port(), startup_seconds=8,
                                       executable=demo.sim_executable()))
    # the same check the agent's preflight runs before autostart: exit 1 means a preflight.warning event
    done = subprocess.run([sys.executable, "-m", "lynxtop", "check", "--config", str(config),
                           "--profile", demo.PROFILES[0]], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr


def test_demo_load_starts_calm_and_the_key_switches_patterns():
    gen = LoadGenerator("http://127.0.0.1:1", pattern=DEMO_CALM)
    gen.raised_pattern = DEMO_PATTERN
    assert gen.active_pattern() is DEMO_CALM
    assert max(p.concurrency for p in DEMO_CALM) <= 3  # no queue at ~620 prefill tokens/s: TTFT under 2 s
    gen.set_raised(True)
    assert gen.active_pattern() is DEMO_PATTERN
    gen.set_raised(False)
    assert gen.active_pattern() is DEMO_CALM



async def test_raising_the_load_acts_within_the_running_phase():
    """The key must not wait out a 10-minute phase: the raised pattern starts while the calm one still runs."""
    import asyncio

    from lynxtop.sim.loadgen import Phase

    gen = LoadGenerator("http://127.0.0.1:1", pattern=(Phase("calm", 600, 0, (1, 1), (1, 1)),))
    gen.raised_pattern = (Phase("hot", 600, 0, (1, 1), (1, 1)),)
    stop = asyncio.Event()
    task = asyncio.create_task(gen.run(stop))
    try:
        for _ in range(100):
            if gen.stats.phase == "calm":
                break
            await asyncio.sleep(0.05)
        gen.set_raised(True)
        for _ in range(600):  # generous: a loaded machine; the old code waited the whole 600 s phase
            if gen.stats.phase == "hot":
                break
            await asyncio.sleep(0.05)
        assert gen.stats.phase == "hot"
    finally:
        stop.set()
        await asyncio.wait_for(task, 30)


def test_demo_status_line_labels_summed_memory_and_power(tmp_path: Path):
    from support.status import make_status

    line = demo.Demo(tmp_path, startup_seconds=1, keep=False).status_line(make_status(gpus=8))
    assert "(sums over 8 GPUs)" in line and "(avg)" in line, line
