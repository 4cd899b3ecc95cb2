"""Which GPUs a profile's vLLM sees, as the GPUs-taken look, `lynxtop check` and the start's preflight read them.

CUDA's rules (CUDA programming guide, CUDA_VISIBLE_DEVICES): indices, full UUIDs or unique UUID prefixes, MIG UUIDs;
an invalid entry hides itself and every entry after it; an empty value hides every GPU; CUDA_DEVICE_ORDER=PCI_BUS_ID
numbers the GPUs by PCI bus id. The value is the one vLLM gets: the profile's env over the agent's own environment.
Real sampler over the fake NVML, the agent's NodeGpuView fed from its tick, real `sleep` processes as foreign jobs.
"""

from __future__ import annotations

import subprocess
import time

import pytest

from lynxtop.agent.gpu.fake import FakeNvml, ScriptedNode, h200_specs
from lynxtop.agent.gpu.protocol import FakeGpuSpec
from lynxtop.agent.gpu.sampler import GpuSampler
from lynxtop.agent.node import NodeGpuView
from lynxtop.agent.serving import check, gpu_holders
from lynxtop.agent.serving.supervisor import preflight
from lynxtop.contract.config import load_config

pytestmark = pytest.mark.timeout(60)

# NVML index order is not PCI order here: NVML GPU 0 sits at bus CA, GPU 1 at 18, GPU 2 at 40
SHUFFLED = [FakeGpuSpec(index=0, pci_bus_id="00000000:CA:00.0"), FakeGpuSpec(index=1, pci_bus_id="00000000:18:00.0"),
            FakeGpuSpec(index=2, pci_bus_id="00000000:40:00.0")]


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    """The test runner's own CUDA variables would be the agent's: none unless a test sets them."""
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.delenv("CUDA_DEVICE_ORDER", raising=False)


@pytest.fixture
def job():
    p = subprocess.Popen(["sleep", "300"])
    yield p
    p.kill()
    p.wait(5)


def node_view(specs: list[FakeGpuSpec], processes: dict[int, list[tuple[int, int]]] | None = None
              ) -> tuple[NodeGpuView, list]:
    s = GpuSampler(lambda: FakeNvml(ScriptedNode(specs, processes=processes or {})), xid_events=False)
    s.open()
    tick = s.sample(set())
    view = NodeGpuView()
    view.update(time.monotonic(), tick.process_rows, s.status(), s.static())
    return view, s.static()


def prof(h, tmp_path, env: dict[str, str], tp: int = 1):
    text = h.standin_profile("p", tp=tp, env=env)
    return load_config(str(h.write_config(tmp_path, profiles=text))).profile("p")


def look(view: NodeGpuView, p) -> gpu_holders.Taken:
    taken = gpu_holders.GpuGuard(view).look(p, lambda: [])
    assert taken is not None
    return taken


def parallelism(p, static: list) -> check.Verdict:
    report = check.check_profile(p, check.facts_from_info(static), None)
    par = [v for v in report.verdicts if v.check == "parallelism"]
    assert len(par) == 1, report.verdicts
    return par[0]


def test_gpu_info_carries_uuid_and_pci_bus_id():
    view, static = node_view(SHUFFLED)
    info = view.gpu_info()
    assert info is not None
    assert [g["uuid"] for g in info] == [g["uuid"] for g in static] and all(g["uuid"] for g in info)
    assert [g["pci_bus_id"] for g in info] == ["00000000:CA:00.0", "00000000:18:00.0", "00000000:40:00.0"]


# ----------------------------------------------------------------------------------- UUIDs and their prefixes


def test_full_uuids_narrow_the_look(h, tmp_path, job):
    view, static = node_view(h200_specs(8), {1: [(job.pid, 14 << 30)]})
    uuids = [g["uuid"] for g in static]
    p = prof(h, tmp_path, {"CUDA_VISIBLE_DEVICES": ",".join(uuids[4:8])}, tp=4)
    taken = look(view, p)
    assert not taken, taken.what()
    assert taken.gpus == (4, 5, 6, 7)
    assert parallelism(p, static).numbers["gpus_visible"] == 4


def test_a_unique_uuid_prefix_names_its_gpu(h, tmp_path, job):
    specs = [FakeGpuSpec(index=i, uuid=u) for i, u in
             enumerate(["GPU-8932f937-aaaa-4000-8000-000000000000", "GPU-1c2d3e4f-bbbb-4000-8000-000000000001"])]
    view, static = node_view(specs, {1: [(job.pid, 14 << 30)]})
    taken = look(view, prof(h, tmp_path, {"CUDA_VISIBLE_DEVICES": "GPU-1c2d"}))
    assert taken and taken.gpus == (1,), taken
    assert not look(view, prof(h, tmp_path, {"CUDA_VISIBLE_DEVICES": "GPU-8932f937"}))


def test_an_ambiguous_prefix_is_invalid_and_hides_what_follows(h, tmp_path, job):
    """The fake's UUIDs share 'GPU-5111a7ed': as a prefix it names 8 GPUs, so CUDA takes it as invalid."""
    view, static = node_view(h200_specs(8), {1: [(job.pid, 14 << 30)]})
    p = prof(h, tmp_path, {"CUDA_VISIBLE_DEVICES": f"{static[0]['uuid']},GPU-5111a7ed,1"}, tp=2)
    taken = look(view, p)
    assert not taken and taken.gpus == (0,), taken  # GPU 1 is behind the invalid entry: the job there is no obstacle
    v = parallelism(p, static)
    assert v.level == check.Level.BLOCKING and "1 visible" in v.reason and "GPU-5111a7ed" in v.reason, v.reason
    assert "ambiguous" in v.reason or "8 GPUs" in v.reason, v.reason


def test_a_uuid_of_no_gpu_here_is_invalid(h, tmp_path, job):
    view, static = node_view(h200_specs(8), {5: [(job.pid, 14 << 30)]})
    p = prof(h, tmp_path, {"CUDA_VISIBLE_DEVICES": f"{static[4]['uuid']},GPU-deadbeef,{static[5]['uuid']}"})
    taken = look(view, p)
    assert not taken and taken.gpus == (4,), taken
    v = parallelism(p, static)
    assert v.level == check.Level.WARNING and "GPU-deadbeef" in v.reason and "1 visible" in v.reason, v.reason


def test_mig_uuids_still_check_every_gpu(h, tmp_path, job):
    view, _ = node_view(h200_specs(8), {1: [(job.pid, 14 << 30)]})
    taken = look(view, prof(h, tmp_path, {"CUDA_VISIBLE_DEVICES": "MIG-4b1a6a8b-8a1f-5c5e-9a0d-3d6c2f1e0b7a"}))
    assert taken and taken.gpus is None


# ----------------------------------------------------------------------------------- CUDA's invalid-entry rule


def test_an_invalid_entry_hides_it_and_the_rest(h, tmp_path, job):
    """'0,2,-1,1': CUDA sees GPUs 0 and 2; a job on GPU 1 is on no GPU vLLM uses."""
    view, static = node_view(h200_specs(8), {1: [(job.pid, 14 << 30)]})
    p = prof(h, tmp_path, {"CUDA_VISIBLE_DEVICES": "0,2,-1,1"}, tp=2)
    taken = look(view, p)
    assert not taken and taken.gpus == (0, 2), taken
    v = parallelism(p, static)
    assert v.level == check.Level.WARNING and "-1" in v.reason and v.numbers["gpus_visible"] == 2, v.reason


def test_an_index_the_node_lacks_blocks_a_tp8_start(h, tmp_path):
    _, static = node_view(h200_specs(8))
    p = prof(h, tmp_path, {"CUDA_VISIBLE_DEVICES": "0,1,2,3,4,5,6,8"}, tp=8)
    v = parallelism(p, static)
    assert v.level == check.Level.BLOCKING and "7 visible" in v.reason and "entry 8" in v.reason, v.reason
    assert v.numbers["gpus_visible"] == 7


def test_an_empty_value_hides_every_gpu(h, tmp_path, job):
    view, static = node_view(h200_specs(8), {1: [(job.pid, 14 << 30)]})
    p = prof(h, tmp_path, {"CUDA_VISIBLE_DEVICES": ""})
    taken = look(view, p)
    assert not taken and taken.gpus == (), taken
    v = parallelism(p, static)
    assert v.level == check.Level.BLOCKING and "0 visible" in v.reason and "empty" in v.reason, v.reason


# ----------------------------------------------------------------------------------- CUDA_DEVICE_ORDER


def test_pci_bus_id_order_numbers_by_bus_id(h, tmp_path, job):
    """CUDA device 0 under PCI_BUS_ID is the lowest bus id (NVML GPU 1), device 1 the next (NVML GPU 2)."""
    view, _ = node_view(SHUFFLED, {1: [(job.pid, 14 << 30)]})
    taken = look(view, prof(h, tmp_path, {"CUDA_VISIBLE_DEVICES": "0", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}))
    assert taken and taken.gpus == (1,), taken
    taken = look(view, prof(h, tmp_path, {"CUDA_VISIBLE_DEVICES": "1,2", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}))
    assert not taken and taken.gpus == (0, 2), taken


def test_without_an_order_indices_are_nvml_indices(h, tmp_path, job):
    view, _ = node_view(SHUFFLED, {1: [(job.pid, 14 << 30)]})
    taken = look(view, prof(h, tmp_path, {"CUDA_VISIBLE_DEVICES": "0"}))
    assert not taken and taken.gpus == (0,), taken


def test_the_order_may_come_from_the_agents_environment(h, tmp_path, job, monkeypatch):
    monkeypatch.setenv("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
    view, _ = node_view(SHUFFLED, {1: [(job.pid, 14 << 30)]})
    taken = look(view, prof(h, tmp_path, {"CUDA_VISIBLE_DEVICES": "0"}))
    assert taken and taken.gpus == (1,), taken


# ----------------------------------------------------------------------------------- the agent's own environment


def test_the_agents_cvd_narrows_the_look_check_and_preflight(h, tmp_path, job, monkeypatch):
    """systemd's Environment=CUDA_VISIBLE_DEVICES=4,5,6,7 reaches vLLM: the look checks GPUs 4-7 (a job on GPU 1
    is no obstacle, one on GPU 5 is) and a tp=8 start is refused by the preflight (4 visible)."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5,6,7")
    view, static = node_view(h200_specs(8), {1: [(job.pid, 14 << 30)]})
    taken = look(view, prof(h, tmp_path, {}, tp=4))
    assert not taken and taken.gpus == (4, 5, 6, 7), taken
    view5, _ = node_view(h200_specs(8), {5: [(job.pid, 14 << 30)]})
    assert look(view5, prof(h, tmp_path, {}, tp=4))
    p8 = prof(h, tmp_path, {}, tp=8)
    assert parallelism(p8, static).numbers["gpus_visible"] == 4
    problems, _ = preflight(p8, view.gpu_info(), [])
    assert any("4 visible" in m for m in problems), problems


def test_the_profiles_cvd_wins_over_the_agents(h, tmp_path, job, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5,6,7")
    view, static = node_view(h200_specs(8), {1: [(job.pid, 14 << 30)]})
    p = prof(h, tmp_path, {"CUDA_VISIBLE_DEVICES": "0,1"}, tp=2)
    taken = look(view, p)
    assert taken and taken.gpus == (0, 1), taken
    assert parallelism(p, static).level == check.Level.OK
