"""The CLI clients and the Prometheus endpoint against a real `lynxtop agent` running the SIMULATED vLLM and GPUs."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families
from support.agent_config import sim_profile, write_agent_config
from support.agent_proc import sim_processes, terminate
from support.ports import free_port, short_dir

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def node():
    with short_dir() as d:
        metrics_port = free_port()
        profiles = [sim_profile(name, tp=tp, startup_s=0.5, stop_grace_s=5)
                    for name, tp in (("v4-tp8", 8), ("v4-tp4", 4))]
        cfg = write_agent_config(d / "config.toml", d / "state" / "lynxtop.db", d / "run" / "agent.sock",
                                 fake_nvml="sim", sample_interval_s=0.2, live_restore=False,
                                 metrics_listen=f"127.0.0.1:{metrics_port}", gpu_release_timeout_s=10,
                                 profiles=profiles)
        env = {k: v for k, v in os.environ.items() if k not in ("NOTIFY_SOCKET", "WATCHDOG_USEC")}
        env["LYNXTOP_SIM_STATE_DIR"] = str(d / "sim")
        log = open(d / "agent.log", "wb")  # noqa: SIM115 - closed below
        agent = subprocess.Popen([sys.executable, "-m", "lynxtop", "agent", "--config", str(cfg)], stdout=log,
                                 stderr=subprocess.STDOUT, env=env)
        try:
            deadline = time.monotonic() + 30
            while not (d / "run" / "agent.sock").exists():
                assert agent.poll() is None, (d / "agent.log").read_text()[-3000:]
                assert time.monotonic() < deadline, "agent socket did not appear"
                time.sleep(0.1)

            def cli(*argv: str, timeout: float = 60) -> subprocess.CompletedProcess:
                return subprocess.run([sys.executable, "-m", "lynxtop", *argv, "--config", str(cfg)],
                                      stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout)

            yield cli, metrics_port, d
        finally:
            terminate(agent)
            log.close()
            for pid in sim_processes(d / "sim", runs_only=False):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)


def _metrics(port: int) -> dict[str, float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        text = r.read().decode()
    return {s.name + json.dumps(s.labels, sort_keys=True): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def test_cli_drives_a_real_agent(node):
    cli, metrics_port, d = node
    p = cli("status")
    assert p.returncode == 0, p.stderr
    assert "SIMULATED" in p.stdout and "STOPPED" in p.stdout

    p = cli("start", "v4-tp8", "--wait")
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stdout.rstrip().endswith("ready")
    st = json.loads(cli("status", "--json").stdout)
    assert st["serving"]["state"] == "ready" and st["serving"]["profile"] == "v4-tp8"
    run1 = st["serving"]["run_id"]

    m = _metrics(metrics_port)
    assert m['lynxtop_serving_up{}'] == 1 and m['lynxtop_agent_simulated{}'] == 1
    assert m['lynxtop_serving_state{"state": "ready"}'] == 1
    assert m['lynxtop_gpu_memory_total_bytes{"gpu": "0", "uuid": "' + st["gpus"][0]["uuid"] + '"}'] > 0

    p = cli("restart")  # no terminal, no --yes: refused before anything happens
    assert p.returncode == 2 and "--yes" in p.stderr

    p = cli("switch", "v4-tp4", "--yes")  # accepted, not waited for
    assert p.returncode == 0, p.stderr
    p = cli("restart", "--yes")  # the switch is still in progress
    assert p.returncode == 4 and "busy" in p.stderr and "switch" in p.stderr
    p = cli("switch", "nope", "--yes")
    assert p.returncode == 2 and "unknown_profile" in p.stderr

    deadline = time.monotonic() + 60
    while True:
        st = json.loads(cli("status", "--json").stdout)
        if st["serving"]["state"] == "ready" and st["agent"]["action"] is None:
            break
        assert time.monotonic() < deadline, st["serving"]
        time.sleep(0.3)
    assert st["serving"]["profile"] == "v4-tp4" and st["serving"]["run_id"] != run1

    p = cli("stop", "--yes", "--wait")
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stdout.rstrip().endswith("stopped")
    p = cli("stop", "--yes")
    assert p.returncode == 0 and "already stopped: nothing to do" in p.stderr  # s22: the goal reached
    assert _metrics(metrics_port)['lynxtop_serving_up{}'] == 0
