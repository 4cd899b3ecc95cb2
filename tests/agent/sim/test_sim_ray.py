"""`--distributed-executor-backend ray` against a real (CPU-only) Ray cluster with two fake GPUs: the simulator
reserves them, notices a lost Ray worker, and fails with vLLM's text when the cluster is too small."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest
from support.ports import free_port
from support.real import required, unavailable
from support.waits import wait_for

try:
    import ray  # noqa: F401 - only whether it imports
except ImportError as exc:
    if required():  # a real stage that cannot run fails in CI (support/real.py)
        pytest.fail(f"ray is not installed ({exc}); LYNXTOP_REQUIRE_REAL=1", pytrace=False)
    pytest.skip(f"ray is not installed ({exc}); `pip install 'lynxtop[ray]'` runs these tests",
                allow_module_level=True)

pytestmark = pytest.mark.timeout(180)

RAY_EXE = Path(sys.executable).parent / "ray"
# DeepSeek's weights do not fit two GPUs; a lighter model keeps the KV cache positive at TP=2
LIGHT = ("--sim-param", "weights_bytes_total=40000000000", "--distributed-executor-backend", "ray")
WORKER_TITLE = "ray::RayWorkerWrapper"


@dataclass
class RayHead:
    proc: subprocess.Popen
    address: str
    temp_dir: Path
    log_path: Path

    def env(self, **extra: str) -> dict[str, str]:
        return {"RAY_ADDRESS": self.address, "RAY_USAGE_STATS_ENABLED": "0", **extra}

    def tree(self) -> list[psutil.Process]:
        """Every process of this Ray session: the `ray start` process and what it started (raylet, GCS, workers)."""
        try:
            root = psutil.Process(self.proc.pid)
            return [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return []

    def workers(self) -> list[psutil.Process]:
        """The RayWorkerWrapper actors of this session, by process title."""
        out = []
        for p in self.tree():
            try:
                argv = p.cmdline()
            except psutil.Error:
                continue
            if argv and argv[0].strip().startswith(WORKER_TITLE) and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        return out


def _in_temp_dir(temp_dir: Path) -> list[psutil.Process]:
    out = []
    for p in psutil.process_iter(["cmdline"]):
        if any(str(temp_dir) in part for part in p.info["cmdline"] or ()):
            out.append(p)
    return out


def _alive(procs: list[psutil.Process]) -> list[psutil.Process]:
    out = []
    for p in procs:
        try:
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except psutil.NoSuchProcess:
            pass
    return out


@pytest.fixture(scope="module")
def ray_head() -> Iterator[RayHead]:
    """One head for the module: 2 CPUs, 2 fake GPUs, every port picked free (several people's Ray share the box)."""
    if not RAY_EXE.exists():
        unavailable(f"no `ray` executable next to {sys.executable} (pip install 'lynxtop[ray]')")
    temp_dir = Path(tempfile.mkdtemp(prefix="lxtray", dir="/tmp"))
    log_path = temp_dir / "ray-start.log"
    port = free_port()
    extra_ports = [(flag, str(free_port())) for flag in (
        "--ray-client-server-port", "--dashboard-port", "--dashboard-agent-listen-port",
        "--dashboard-agent-grpc-port", "--runtime-env-agent-port", "--metrics-export-port")]
    cmd = [str(RAY_EXE), "start", "--head", "--block", "--port", str(port), "--num-gpus", "2", "--num-cpus", "2",
           "--include-dashboard", "false", "--temp-dir", str(temp_dir / "t"), "--disable-usage-stats",
           *(x for pair in extra_ports for x in pair)]
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["RAY_USAGE_STATS_ENABLED"] = "0"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=env)
    head = RayHead(proc, f"127.0.0.1:{port}", temp_dir, log_path)
    try:
        def started() -> bool:
            if proc.poll() is not None:
                raise AssertionError(f"ray start exited {proc.returncode}:\n{log_path.read_text(errors='replace')}")
            return "Ray runtime started." in log_path.read_text(errors="replace")

        wait_for(started, timeout=90, what="ray start --head", interval=0.2)
        yield head
    finally:
        members = head.tree()
        proc.send_signal(signal.SIGTERM)  # --block: stops its processes and exits
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        survivors: list[psutil.Process] = []
        try:
            wait_for(lambda: not (_alive(members) or _in_temp_dir(temp_dir)), timeout=20,
                     what="Ray session processes to end")
        except AssertionError:
            survivors = _alive(members) + _in_temp_dir(temp_dir)
            for p in survivors:
                try:
                    p.kill()
                except psutil.NoSuchProcess:
                    pass
        shutil.rmtree(temp_dir, ignore_errors=True)
        assert not survivors, f"processes of the Ray session outlived `ray start --block`: {survivors}"


def _health(url: str) -> int | None:
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(url + "/health", timeout=1.0) as resp:
            return resp.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:
        return None


def test_ready_on_a_placement_group_and_sigterm_releases_it(ray_head, start_sim):
    sp = start_sim(*LIGHT, tp=2, env=ray_head.env())
    sp.wait_ready(timeout=90)
    text = sp.text()
    assert "No current placement group found. Creating a new placement group." in text
    ready = re.search(r"Ray placement group ([0-9a-f]+) is ready \(2 bundles of 1 GPU, strategy PACK\); started 2 "
                      r"RayWorkerWrapper actors on 1 node\(s\): (\S+) \(2\)", text)
    assert ready, text
    assert re.search(rf"rank 0 on {re.escape(ready[2])} \(actor [0-9a-f]+\), rank 1 on ", text), text
    assert text.index("is ready (2 bundles") < text.index("Loading weights took") < text.index(
        "Application startup complete.")  # GPUs first, as vLLM reserves them before it loads
    assert len(wait_for(lambda: len(ray_head.workers()) == 2 and ray_head.workers(), what="2 actors")) == 2

    t0 = time.monotonic()
    os.kill(sp.proc.pid, signal.SIGTERM)
    assert sp.wait_exit(20) == 0
    assert time.monotonic() - t0 < 10
    assert "Shutting down Ray distributed executor." in sp.text()
    wait_for(lambda: not ray_head.workers(), timeout=15, what="the actors to go with the placement group")


def test_killed_ray_worker_ends_the_server_with_a_nonzero_status(ray_head, start_sim):
    sp = start_sim(*LIGHT, tp=2, env=ray_head.env())
    sp.wait_ready(timeout=90)
    victim = wait_for(lambda: len(ray_head.workers()) == 2 and ray_head.workers()[0], what="2 actors")
    assert _health(sp.url) == 200
    t0 = time.monotonic()
    victim.kill()
    code = sp.wait_exit(30)
    took = time.monotonic() - t0
    text = sp.text()
    assert code == 1, text
    assert took < 30, took
    lost = re.search(r"ERROR .*Ray worker RayWorkerWrapper rank \d on node (\S+) is lost: "
                     r"(ActorDiedError|ActorUnavailableError|RayActorError|GetTimeoutError): ", text)
    assert lost, text
    assert lost[1] in text.split("is ready")[1].split("\n")[0]  # the node the log named at start-up
    assert text.index("is lost:") < text.index("EngineDeadError") < text.index("Shutting down FastAPI")
    assert _health(sp.url) != 200
    wait_for(lambda: not ray_head.workers(), timeout=15, what="the surviving actor to be released")


def test_too_few_gpus_waits_then_fails_with_vllms_error(ray_head, start_sim):
    sp = start_sim(*LIGHT, tp=4, env=ray_head.env(LYNXTOP_SIM_RAY_PG_TIMEOUT_S="3"))
    code = sp.wait_exit(60)
    text = sp.text()
    assert code == 1, text
    assert "The number of required GPUs exceeds the total number of available GPUs in the placement group." in text
    assert re.search(r"Waiting for creating a placement group of specs for \d+ seconds\. specs=\[\{'GPU': 1\.0, "
                     r"'node:[^']+': 0\.001\}, \{'GPU': 1\.0\}, .*Check `ray status` and `ray list nodes`", text), text
    assert ("ValueError: Cannot provide a placement group requiring 4.0 GPUs (placement_group_specs=[" in text
            and "within 3 seconds.\nTensor parallel size may exceed available GPUs in your cluster." in text), text
    assert "Engine core initialization failed." in text
    assert text.index("Waiting for creating") < text.index("Cannot provide")
    assert "Loading weights" not in text and "Application startup complete." not in text


def test_without_ray_installed_startup_fails_with_vllms_import_error(start_sim, tmp_path):
    fake = tmp_path / "noray" / "ray"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text('raise ImportError("No module named \'ray\'")\n')
    sp = start_sim(*LIGHT, tp=2, env={"PYTHONPATH": str(fake.parent)})
    assert sp.wait_exit(30) == 1
    text = sp.text()
    assert "ValueError: Failed to import Ray: No module named 'ray'.Please install Ray with `pip install ray`." in text
    assert "Loading weights" not in text


def test_sigterm_while_waiting_for_gpus_is_a_prompt_shutdown(ray_head, start_sim):
    sp = start_sim(*LIGHT, tp=4, env=ray_head.env())
    wait_for(lambda: "Creating a new placement group." in sp.text(), timeout=60, what="the placement group request")
    t0 = time.monotonic()
    os.kill(sp.proc.pid, signal.SIGTERM)
    assert sp.wait_exit(20) == 0, sp.text()
    assert time.monotonic() - t0 < 5
    text = sp.text()
    assert "Shutting down during start-up (signal received)." in text
    assert "Cannot provide a placement group" not in text and "Loading weights" not in text
