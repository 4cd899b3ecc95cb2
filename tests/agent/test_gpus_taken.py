"""GPUs taken by processes that are not the agent's run (another agent's model, another team's job): a start is
refused (409 gpus_taken) before anything is spawned, an autostart waits and says why once, then launches when the
GPUs are free; a switch's own old run is no obstacle. The GPU view is the tests' ProcGpuView (every process of a
run is on the GPUs) plus real `sleep` processes standing for the foreign jobs."""

from __future__ import annotations

import asyncio
import json
import subprocess

import pytest

from lynxtop.agent.api.control import ActionError
from lynxtop.agent.serving import gpu_holders, procs

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def sleeper():
    """A real process standing for a foreign job on the GPUs."""
    made: list[subprocess.Popen] = []

    def make() -> subprocess.Popen:
        p = subprocess.Popen(["sleep", "300"])
        made.append(p)
        return p

    yield make
    for p in made:
        if p.poll() is None:
            p.kill()
        p.wait(5)


def crowded_view(h, foreign: list[int]):
    """ProcGpuView, with `foreign` (while alive) on the GPUs too, as NVML would list them."""

    class Crowded(h.ProcGpuView):
        def compute_pids(self):
            seen = super().compute_pids()
            if seen is None:
                return None
            ts, pids = seen
            return ts, pids | {p for p in foreign if procs.alive(p)}

    return Crowded()


def run_logs(tmp_path) -> list:
    logs = tmp_path / "state" / "logs"
    return sorted(logs.glob("*.log")) if logs.exists() else []


def events(h, store, kind: str) -> list[dict]:
    store.flush()
    return h.db_rows(store.path, "SELECT * FROM events WHERE kind = ? ORDER BY id", (kind,))


async def test_start_is_refused_naming_the_foreign_process_and_nothing_is_spawned(make_sup, h, tmp_path, sleeper):
    job = sleeper()
    sup = make_sup(gpus=crowded_view(h, [job.pid]))
    with pytest.raises(ActionError) as exc:
        await sup.start("alpha", by="test")
    err = exc.value
    assert err.code == "gpus_taken" and err.http_status == 409
    assert f"pid {job.pid} (sleep)" in err.message and "GPU 0-7" in err.message and "stop them" in err.message
    assert err.details["pids"] == [job.pid]
    assert sup.state == "stopped" and sup.run is None and sup.action is None and not run_logs(tmp_path)
    job.kill()
    job.wait(5)
    await sup.start("alpha", by="test")  # gone: the same start goes ahead
    await h.wait_for(lambda: sup.state == "ready", 15, what="ready")


async def test_autostart_waits_says_why_once_then_launches_when_the_gpus_are_free(make_sup, h, store, tmp_path,
                                                                                  sleeper):
    job = sleeper()
    sup = make_sup(gpus=crowded_view(h, [job.pid]))
    await sup.take_over("alpha")
    await h.wait_for(lambda: sup.state == "waiting", 30, what="waiting for the GPUs")
    assert f"pid {job.pid} (sleep)" in sup.reason
    await asyncio.sleep(1.5)  # several re-checks (backoff_initial_s 0.2 here): still one event, nothing launched
    held = events(h, store, "agent.autostart_held")
    assert len(held) == 1 and str(job.pid) in held[0]["message"]
    assert json.loads(held[0]["details"])["pids"] == [job.pid]
    assert sup.run is None and not run_logs(tmp_path) and not events(h, store, "agent.autostart_failed")
    job.kill()
    job.wait(5)
    await h.wait_for(lambda: sup.state == "ready", 15, what="ready once the GPUs are free")
    assert len(run_logs(tmp_path)) == 1 and len(events(h, store, "agent.autostart_held")) == 1


async def test_a_stop_ends_the_autostarts_wait(make_sup, h, tmp_path, sleeper):
    job = sleeper()
    sup = make_sup(gpus=crowded_view(h, [job.pid]))
    await sup.take_over("alpha")
    await h.wait_for(lambda: sup.state == "waiting", 30, what="waiting for the GPUs")
    await sup.stop(by="test")
    await h.wait_for(lambda: sup.state == "stopped" and sup.action is None, 30, what="stopped")
    job.kill()
    job.wait(5)
    await asyncio.sleep(0.6)
    assert sup.run is None and not run_logs(tmp_path)


async def test_a_switch_whose_old_run_is_all_that_holds_the_gpus_goes_ahead(make_sup, h):
    sup = make_sup()  # every process of any run is on the GPUs: here only the old run's
    await sup.start("alpha", by="test")
    await h.wait_for(lambda: sup.state == "ready", 15, what="alpha ready")
    first = sup.run_id
    await sup.switch("beta", by="test")
    await h.wait_for(lambda: sup.state == "ready" and sup.profile_name == "beta", 20, what="beta ready")
    assert sup.run_id != first
    await sup.restart(by="test")
    await h.wait_for(lambda: sup.state == "ready" and sup.run_id not in (first, None) and sup.action is None, 20,
                     what="restart ready")


async def test_a_switch_is_refused_before_anything_is_stopped_when_a_foreign_process_holds_the_gpus(make_sup, h,
                                                                                                    sleeper):
    foreign: list[int] = []
    sup = make_sup(gpus=crowded_view(h, foreign))
    await sup.start("alpha", by="test")
    await h.wait_for(lambda: sup.state == "ready", 15, what="alpha ready")
    job = sleeper()
    foreign.append(job.pid)
    with pytest.raises(ActionError) as exc:
        await sup.switch("beta", by="test")
    assert exc.value.code == "gpus_taken" and exc.value.details["pids"] == [job.pid]
    assert sup.state == "ready" and sup.profile_name == "alpha" and sup.proc is not None and not sup.proc.exited


async def test_nvml_unavailable_does_not_block_a_start(make_sup, h, caplog):
    view = h.ProcGpuView()
    view.nvml_ok = False
    sup = make_sup(gpus=view)
    await sup.start("alpha", by="test")
    await h.wait_for(lambda: sup.state == "ready", 15, what="ready")
    said = [r for r in caplog.records if "NVML unavailable" in r.getMessage() and "other processes" in r.getMessage()]
    assert len(said) == 1


class RowsView:
    """A view with NVML's per-GPU rows, as node.py's NodeGpuView keeps them."""

    def __init__(self, rows: list[dict]):
        self.process_rows = rows

    def gpu_info(self):
        return [{"index": i, "name": "NVIDIA H200"} for i in range(8)]

    def compute_pids(self):
        return 1.0, {r["pid"] for r in self.process_rows}


def test_cuda_visible_devices_narrows_the_gpus_looked_at_and_memory_is_named(h, tmp_path, sleeper):
    from lynxtop.contract.config import load_config

    job = sleeper()
    cfg = load_config(str(h.write_config(tmp_path, profiles=h.standin_profile("two", env={"CUDA_VISIBLE_DEVICES":
                                                                                          "0,1"}))))
    prof = cfg.profile("two")
    guard = gpu_holders.GpuGuard(RowsView([{"gpu": 5, "pid": job.pid, "used_mem_bytes": 14 << 30}]))
    assert not guard.look(prof, lambda: [])  # on GPU 5, which the profile does not use
    guard = gpu_holders.GpuGuard(RowsView([{"gpu": 1, "pid": job.pid, "used_mem_bytes": 14 << 30}]))
    taken = guard.look(prof, lambda: [])
    assert taken and f"pid {job.pid} (sleep, 14.0 GiB, on GPU 1)" in taken.refusal(prof)
    assert "GPU 0,1 hold" in taken.refusal(prof)
    assert not guard.look(prof, lambda: [job.pid])  # the run being replaced: ours


def test_a_process_name_is_escaped(tmp_path, sleeper):
    exe = tmp_path / "x\x1b[2Jy"
    exe.symlink_to("/bin/sleep")
    p = subprocess.Popen([str(exe), "300"])
    try:
        holder = gpu_holders.holder_of(p.pid, [])
        assert "\x1b" not in holder.name and "\\x1b" in holder.name
    finally:
        p.kill()
        p.wait(5)
