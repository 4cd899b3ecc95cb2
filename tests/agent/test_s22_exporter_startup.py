"""During a load, /metrics says where it is (audit s22 #6): the start-up phase, when that phase began and when the
readiness timeout stops the load, so an alert can fire on "loading weights for more than N minutes" or on a load
about to be stopped. Served by the real exporter on a real socket, read back with prometheus_client's parser."""

from __future__ import annotations

import subprocess
from dataclasses import replace

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families
from support.real import needs_tools

from lynxtop.agent.metrics.exporter import MetricsExporter
from lynxtop.contract.status import PhaseMark, ServingState, ServingStatus, Status

STARTED = 1_800_000_000_000


def _loading(phase: str = "loading weights", since_ms: int = STARTED + 5_000) -> ServingStatus:
    return ServingStatus(state=ServingState.STARTING, state_since_ms=STARTED, phase=phase, phase_since_ms=since_ms,
                         phases=(PhaseMark("loading weights", STARTED + 5_000), PhaseMark(phase, since_ms)),
                         profile="v4-tp8", run_id=12, pid=4242, model="deepseek-ai/DeepSeek-V4.1",
                         started_ms=STARTED, ready_timeout_s=1800, ready_deadline_ms=STARTED + 1_800_000)


def _samples(text: str) -> dict[tuple[str, tuple], float]:
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


@pytest.fixture
async def served():
    state = {"status": Status(serving=_loading())}
    exp = MetricsExporter("127.0.0.1:0", lambda: state["status"], log=lambda _m: None)
    await exp.start()
    session = aiohttp.ClientSession()

    async def get() -> str:
        async with session.get(f"http://127.0.0.1:{exp.bound_port}/metrics") as r:
            assert r.status == 200
            return await r.text()

    yield get, state, exp
    await session.close()
    await exp.stop()


def _phases(s: dict) -> dict[str, float]:
    return {dict(labels)["phase"]: v for (name, labels), v in s.items() if name == "lynxtop_serving_startup_phase"}


async def test_a_load_exports_its_phase_the_phase_start_and_the_readiness_deadline(served):
    get, _, _ = served
    s = _samples(await get())
    assert _phases(s) == {"loading weights": 1.0, "kv cache": 0.0, "cuda graphs": 0.0, "api up": 0.0}
    assert s[("lynxtop_serving_phase_since_seconds", ())] == (STARTED + 5_000) / 1000
    assert s[("lynxtop_serving_ready_deadline_seconds", ())] == (STARTED + 1_800_000) / 1000


async def test_the_cached_page_follows_a_phase_change_between_ticks(served):
    """The page is rendered once per change of what it is built from: a new phase (same tick objects, a new
    serving part) must be on the next GET, not the page rendered for the previous phase."""
    get, state, exp = served
    await get()
    await get()
    renders = exp.renders
    state["status"] = replace(state["status"], serving=_loading("kv cache", STARTED + 900_000))
    s = _samples(await get())
    assert exp.renders == renders + 1
    assert _phases(s)["kv cache"] == 1.0 and _phases(s)["loading weights"] == 0.0
    assert s[("lynxtop_serving_phase_since_seconds", ())] == (STARTED + 900_000) / 1000
    state["status"] = replace(state["status"], serving=replace(state["status"].serving,
                                                               ready_deadline_ms=STARTED + 3_600_000))
    s = _samples(await get())
    assert s[("lynxtop_serving_ready_deadline_seconds", ())] == (STARTED + 3_600_000) / 1000


async def test_a_ready_or_stopped_run_exports_no_startup_series(served):
    """Outside a load the series are absent (not a phase frozen at its last value): an alert on them cannot fire
    on a run that is serving or stopped."""
    get, state, _ = served
    for serving in (ServingStatus(state=ServingState.READY, state_since_ms=STARTED, run_id=12, profile="v4-tp8",
                                  started_ms=STARTED, ready_ms=STARTED + 1_200_000),
                    ServingStatus(state=ServingState.STOPPED)):
        state["status"] = Status(serving=serving)
        text = await get()
        assert "lynxtop_serving_startup_phase" not in text and "phase_since_seconds" not in text, text
        assert "lynxtop_serving_ready_deadline_seconds" not in text, text


async def test_a_phase_this_exporter_does_not_know_is_still_its_current_phase(served):
    """A phase word outside the known list (a newer tracker's) is exported as the one at 1, never dropped."""
    get, state, _ = served
    state["status"] = Status(serving=_loading("compiling"))
    phases = _phases(_samples(await get()))
    assert phases["compiling"] == 1.0 and sum(phases.values()) == 1.0, phases


@needs_tools("promtool")
async def test_promtool_accepts_the_page_during_a_load(served):
    get, _, _ = served
    text = await get()
    done = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
