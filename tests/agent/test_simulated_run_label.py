"""A run of lynxtop's simulated vLLM is labelled simulated even where the GPUs are real (the node is not).

The rule: a simulated component is labelled as simulated wherever a user can see it. An agent on real NVML whose
profile runs `lynxtop-sim-vllm` stored its runs (and so its bench rows) as real and showed no SIMULATED line."""

from __future__ import annotations

import pytest
from support.agent_config import SIM

from lynxtop.agent.serving.launcher import runs_simulator
from lynxtop.agent.serving.supervisor import Supervisor
from lynxtop.cli.ctl import format_status
from lynxtop.contract.config import load_config
from lynxtop.contract.status import Status

pytestmark = pytest.mark.timeout(90)


@pytest.mark.parametrize(("argv", "sim"), [
    ([str(SIM), "serve", "m"], True),
    (["/usr/bin/python3", "-m", "lynxtop.sim", "serve", "m"], True),
    (["/opt/vllm/bin/vllm", "serve", "m"], False),
    (["/usr/bin/python3", "-m", "vllm.entrypoints.openai.api_server"], False),
    (["/srv/lynxtop-sim-vllm-notes/vllm", "serve"], False),
    ([], False),
])
def test_the_simulator_is_told_by_its_argv(argv, sim):
    assert runs_simulator(argv) is sim


@pytest.mark.parametrize("simulator", [True, False])
async def test_a_run_of_the_simulator_on_a_real_node_is_stored_and_shown_simulated(
        simulator, tmp_path, store, h, monkeypatch):
    monkeypatch.setenv("LYNXTOP_SIM_STATE_DIR", str(tmp_path / "sim"))
    profiles = h.sim_profile("alpha") if simulator else None  # else the stand-in vLLM: a real server to the agent
    cfg = load_config(str(h.write_config(tmp_path, profiles=profiles)))
    sup = Supervisor(cfg, store, h.ProcGpuView(), state_path=tmp_path / "state" / "serving.json", host="node",
                     simulated=False, health_poll_s=0.05, stop_kill_wait_s=5)  # real GPUs: the node is not simulated
    try:
        await sup.start("alpha", by="test")
        await h.wait_for(lambda: sup.state == "ready", 30, what="ready")
        store.flush()
        row = h.db_rows(store.path, "SELECT simulated FROM runs WHERE id = ?", (sup.run_id,))[0]
        assert bool(row["simulated"]) is simulator
        serving = sup.serving_status()
        assert serving.simulated is simulator
        wire = Status.from_json(Status(serving=serving).to_json())  # on the wire too
        assert wire.serving.simulated is simulator
        text = format_status(wire)
        assert ("SIMULATED" in text) is simulator
    finally:
        await sup.stop(by="test")
        await h.wait_for(lambda: sup.state == "stopped", 20)
        await sup.shutdown(stop_serving=True)
