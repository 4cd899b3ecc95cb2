"""The auditor's sequences against a REAL agent (simulated vLLM): Alice's dialog shows run 1, Bob switches, and
Alice's Tab, Enter must not stop Bob's 20-minute load nor restart a profile her dialog never named.

Nothing is posted in either sequence (the dialog is withdrawn first), so these hold whatever the agent's
`expect_run` support; the agent's own guard is tested in tests/agent/test_control_seen_run.py.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.agent_config import sim_profile, write_agent_config
from support.agent_proc import Agent, reap_sims, state_db
from support.tui import make_app, plain, wait_for
from support.waits import holds_async

from lynxtop.tui.screens.confirm import ConfirmScreen

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def agents(tmp_path: Path) -> Iterator[list[Agent]]:
    started: list[Agent] = []
    yield started
    for a in started:
        if a.proc.poll() is None:
            a.proc.kill()
            a.proc.wait(5)
    reap_sims(tmp_path / "sim-state")


def _config(tmp_path: Path, slow_s: float) -> Path:
    profiles = [sim_profile("v4-tp8", tp=8, startup_s=0.5, stop_grace_s=5),
                sim_profile("v4-tp4", tp=4, startup_s=slow_s, readiness_timeout_s=600, stop_grace_s=5)]
    return write_agent_config(tmp_path / "config.toml", tmp_path / "state" / "lynxtop.db",
                              tmp_path / "run" / "agent.sock", fake_nvml="sim", sample_interval_s=0.2,
                              default_profile="v4-tp8", autostart=True, backoff_initial_s=0.3, backoff_max_s=1,
                              gpu_release_timeout_s=10, profiles=profiles)


def _notices(app: Any) -> list[tuple[str, str, str]]:
    notices: list[tuple[str, str, str]] = []
    original = app.notify

    def spy(message: str, *a: Any, **kw: Any) -> None:
        notices.append((kw.get("title", ""), str(message), kw.get("severity", "information")))
        original(message, *a, **kw)

    app.notify = spy
    return notices


@pytest.mark.parametrize(("key", "slow_s", "bob_state"), [("X", 120, "starting"), ("R", 0.5, "ready")])
async def test_alices_dialog_cannot_act_on_bobs_new_run(tmp_path, agents, key, slow_s, bob_state):
    a = Agent(tmp_path, _config(tmp_path, slow_s))
    agents.append(a)
    st = await a.wait_state(lambda s: s["state"] == "ready", what="ready")
    run1 = st["serving"]["run_id"]
    app = make_app(a.sock_path)
    notices = _notices(app)
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for(pilot, lambda: app.state.connected, 10)
        await pilot.press(key)
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen))
        assert f"run {run1}" in plain(app.screen.body) and "v4-tp8" in plain(app.screen.body)
        code, body = await a.api("POST", "/v1/switch", {"profile": "v4-tp4"})  # Bob, from another terminal
        assert code == 202, body
        st = await a.wait_state(lambda s: s["state"] == bob_state and s["profile"] == "v4-tp4", what="bob's run")
        run2 = st["serving"]["run_id"]
        await wait_for(pilot, lambda: app.state.serving.run_id == run2, 10)
        await pilot.press("tab", "enter")  # Alice, late
        await holds_async(lambda: not isinstance(app.screen, ConfirmScreen), 1.0, what="no dialog",
                          sleep=pilot.pause)
        assert any(sev == "warning" and f"run {run1}" in m and "nothing done" in m for _, m, sev in notices)
    st = await a.status()
    assert st["serving"]["run_id"] == run2 and st["serving"]["state"] == bob_state  # Bob's run goes on
    runs = {r["id"]: r for r in state_db(tmp_path, "SELECT * FROM runs")}
    assert runs[run2]["end_reason"] is None
    a.stop()


async def test_a_switch_the_dashboard_has_not_polled_yet_is_refused_by_the_agent(tmp_path, agents):
    """The last instant: Bob's switch lands after the dashboard's last poll, so Alice's dialog still shows run 1
    when she confirms. The stop carries expect_run = 1; the agent refuses (409 run_changed), she reads why, and
    Bob's load goes on. Then, on the run she now sees, her stop is acted on."""
    a = Agent(tmp_path, _config(tmp_path, 120))
    agents.append(a)
    st = await a.wait_state(lambda s: s["state"] == "ready", what="ready")
    run1 = st["serving"]["run_id"]
    app = make_app(a.sock_path)
    notices = _notices(app)
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for(pilot, lambda: app.state.connected, 10)
        app.poll_interval_s = 3600.0  # the next poll re-arms an hour away: the app will not see Bob's switch
        await pilot.pause(0.6)
        await pilot.press("X")
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen))
        code, body = await a.api("POST", "/v1/switch", {"profile": "v4-tp4"})
        assert code == 202, body
        st = await a.wait_state(lambda s: s["state"] == "starting" and s["profile"] == "v4-tp4", what="bob's load")
        run2 = st["serving"]["run_id"]
        assert app.state.serving.run_id == run1 and isinstance(app.screen, ConfirmScreen)
        await pilot.press("tab", "enter")
        await wait_for(pilot, lambda: any("run changed" in t for t, _, _ in notices), 10)
        title, message, severity = next(n for n in notices if "run changed" in n[0])
        assert severity == "warning" and f"run {run1}" in message and f"run {run2}" in message, message
        await wait_for(pilot, lambda: app.state.serving.run_id == run2, 10)  # the refusal asked for a fresh status
        st = await a.status()
        assert st["serving"]["run_id"] == run2 and st["serving"]["state"] == "starting"  # Bob's load goes on
        await pilot.press("X")  # Alice, now shown run 2, means it
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen))
        assert f"run {run2}" in plain(app.screen.body)
        await pilot.press("tab", "enter")
        await wait_for(pilot, lambda: any("stop accepted" in t for t, _, _ in notices), 10)
    await a.wait_state(lambda s: s["state"] == "stopped", what="stopped")
    runs = {r["id"]: r for r in state_db(tmp_path, "SELECT * FROM runs")}
    assert runs[run2]["end_reason"] == "stopped by operator"
    a.stop()
