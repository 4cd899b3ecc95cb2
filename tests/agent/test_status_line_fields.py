"""The status line reads the serving state, profile, run and phase from the run lifecycle itself, not from a whole
`ServingStatus` built each tick (issue 29.3): it must say what `Supervisor.serving_status()` says, in every state."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from lynxtop.agent.serving.supervisor import Supervisor
from lynxtop.agent.status_view import StatusView
from lynxtop.contract.status import ServingState


def _run(run_id: int | None, phase: str | None) -> SimpleNamespace:
    tracker = SimpleNamespace(phase=phase, phase_since_ms=1_000 if phase else None, marks=(), grew_ms=1_000)
    return SimpleNamespace(run_id=run_id, tracker=tracker, vllm_version=None, started_ms=1_000, ready_ms=None,
                           adopted=False, log_problem=None, degraded=set(), proc=None, load_progress=None,
                           was_ready=False)


def _node(state: ServingState, profile: str | None, run: SimpleNamespace | None) -> SimpleNamespace:
    lc = SimpleNamespace(state=state, state_since_ms=1_000, reason="", run=run, proc=None, profile_name=profile,
                         run_id=run.run_id if run is not None else None,
                         profile=SimpleNamespace(model="m") if profile else None, url=lambda: None,
                         readiness_deadline=lambda: None)
    sup = SimpleNamespace(runs=lc, _retry=SimpleNamespace(next_retry_ms=None, failures=()))
    sup.serving_status = lambda: Supervisor.serving_status(sup)  # type: ignore[arg-type]
    ticker = SimpleNamespace(missed_ticks=0, failed_ticks=0)
    return SimpleNamespace(supervisor=sup, gpu_view=SimpleNamespace(static=[{}, {}]), simulated=False, cluster=None,
                           ticker=ticker, timeline=SimpleNamespace(steps=0, offset_ms=0), writer=None)


def _line_from_serving_status(node: SimpleNamespace) -> str:
    """The line as it was built from the whole ServingStatus."""
    s = node.supervisor.serving_status()
    parts = [f"serving {s.state}"]
    if s.profile:
        parts.append(f"profile {s.profile}" + (f" run {s.run_id}" if s.run_id else ""))
    if s.phase:
        parts.append(f"phase {s.phase}")
    parts.append("2 GPUs")
    return "; ".join(parts)


@pytest.mark.parametrize("state", list(ServingState))
@pytest.mark.parametrize(("profile", "run_id", "phase"), [
    (None, None, None), ("dp8", None, None), ("dp8", 7, None), ("dp8", 7, "loading weights"),
    ("dp8", None, "loading weights"), ("dp8", 0, "compiling"),
])
def test_the_line_says_what_serving_status_says(state, profile, run_id, phase):
    run = None if run_id is None and phase is None else _run(run_id, phase)
    node = _node(state, profile, run)
    assert StatusView(node).line() == _line_from_serving_status(node)  # type: ignore[arg-type]


def test_a_starting_run_shows_its_phase_and_a_ready_one_does_not():
    starting = _node(ServingState.STARTING, "dp8", _run(3, "loading weights"))
    ready = _node(ServingState.READY, "dp8", _run(3, "loading weights"))
    assert StatusView(starting).line() == "serving starting; profile dp8 run 3; phase loading weights; 2 GPUs"  # type: ignore[arg-type]
    assert StatusView(ready).line() == "serving ready; profile dp8 run 3; 2 GPUs"  # type: ignore[arg-type]
