"""The crash-loop marker that cannot be written is an event, once per episode (session 18).

crash-loop.json keeps a restarted agent from autostarting a server that crash-loops; readiness-timeouts.json keeps
the count of readiness timeouts in a row across a restart (agent/serving/retry.py). When either could not be
written (a full disk, a read-only directory) the agent said so only in its log: the operator, reading events and
the dashboard, did not learn that the protection would not survive an agent restart. Now a failed write is one
`agent.state_file` warning per episode (not one per retry), saying what a restarted agent will not know.

Real Supervisor and stand-in servers, a real SQLite store, the markers' directory a real tmpfs (root only), filled
to the last byte or remounted read-only.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from support.small_fs import fill, mounted

from lynxtop.agent.serving.retry import Retry
from lynxtop.contract.config import AgentConfig
from lynxtop.contract.events import EventKind, Severity

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def small_fs(tmp_path):
    """A 1m tmpfs (support/small_fs.py) for the supervisor's state files; the database stays on the test's disk."""
    with mounted(tmp_path / "small", "1m") as mnt:
        yield mnt


def _state_file_events(h, store, name: str) -> list[dict]:
    store.flush()
    return [e for e in h.db_rows(store.path, "SELECT * FROM events WHERE kind = 'agent.state_file' ORDER BY id")
            if name in e["message"]]


def _kind(h, store, kind: str) -> list[dict]:
    store.flush()
    return h.db_rows(store.path, "SELECT id FROM events WHERE kind = ?", (kind,))


async def test_a_crash_loop_that_cannot_be_recorded_is_told_once_per_crash_loop(make_sup, store, h, tmp_path,
                                                                                monkeypatch, small_fs):
    monkeypatch.setenv("LYNXTOP_SIM_STATE_DIR", str(tmp_path / "sim"))
    profiles = h.sim_profile("oom", sim_args=("--sim-fail", "oom")) + h.sim_profile("good")
    fill(small_fs)  # the state directory's disk is full: serving.json, crash-loop.json cannot be written
    sup = make_sup(profiles=profiles, state_path=small_fs / "serving.json")
    try:
        await sup.start("oom", by="test")
        await h.wait_for(lambda: sup.state == "crash-loop", 40, what="crash loop")
        told = _state_file_events(h, store, "crash-loop.json")
        assert len(told) == 1, told
        ev = told[0]
        assert ev["severity"] == "warning", ev
        assert "No space left on device" in ev["message"] and str(small_fs / "crash-loop.json") in ev["message"]
        assert "restarted agent" in ev["message"] and "oom" in ev["message"], ev["message"]
        # what the event warns of: an agent restarted now does not hold the crash loop
        again = make_sup(profiles=profiles, state_path=small_fs / "serving.json")
        assert not again.restore_crash_loop()
        await again.shutdown(stop_serving=True)

        # the operator starts it again; it crash-loops again: a new episode, told again (once)
        await sup.start("oom", by="operator")
        await h.wait_for(lambda: sup.state == "crash-loop" and len(_kind(h, store, "serving.crash_loop")) == 2, 40,
                         what="second crash loop")
        assert len(_state_file_events(h, store, "crash-loop.json")) == 2
    finally:
        await sup.shutdown(stop_serving=True)


async def test_readiness_timeouts_that_cannot_be_recorded_are_told_once_not_per_retry(make_sup, store, h, tmp_path,
                                                                                      monkeypatch, small_fs):
    monkeypatch.setenv("STANDIN_STARTUP_S", "300")  # a load far slower than its readiness timeout
    fill(small_fs)
    cfg = h.write_config(tmp_path, profiles=h.standin_profile("slow", readiness_s=1.5, stop_grace_s=1))
    sup = make_sup(cfg_path=cfg, state_path=small_fs / "serving.json")
    try:
        await sup.start("slow", by="t")
        await h.wait_for(lambda: sup.state == "crash-loop", 40, what="gave up after two readiness timeouts")
        assert len(_kind(h, store, "serving.readiness_timeout")) == 2  # two failed writes of the count ...
        told = _state_file_events(h, store, "readiness-timeouts.json")
        assert len(told) == 1, told  # ... one event
        assert "No space left on device" in told[0]["message"] and "restarted agent" in told[0]["message"], told
        assert len(_state_file_events(h, store, "crash-loop.json")) == 1
    finally:
        await sup.shutdown(stop_serving=True)


def test_a_read_only_directory_is_told_once_per_marker_and_episode(small_fs):
    """The markers' own code path on a read-only directory (remounted so, as after an I/O error): each marker's
    failed writes are one event until the episode ends (the operator acted: the marker cleared)."""
    r = subprocess.run(["mount", "-o", "remount,ro", str(small_fs)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    told: list[tuple] = []
    retry = Retry(_agent(), small_fs / "crash-loop.json", event=lambda *a, **kw: told.append((*a, kw)))
    for _ in range(2):
        retry.fail("slow", readiness_timeout=True)  # each readiness timeout tries to write the count
    retry.save_crash_loop("slow", "gave up")
    retry.save_crash_loop("slow", "gave up")  # the same crash loop (an agent restart re-recording it): told once
    files = [Path(kw["path"]).name for *_, kw in told]
    assert files == ["readiness-timeouts.json", "crash-loop.json"], told
    assert all(kind == EventKind.AGENT_STATE_FILE and sev == Severity.WARNING for kind, sev, *_ in told), told
    assert all("Read-only file system" in msg for _, _, msg, _ in told), told
    retry.clear_crash_loop()  # an operator acted: the next crash loop that cannot be recorded is told again
    retry.save_crash_loop("slow", "gave up again")
    assert [Path(kw["path"]).name for *_, kw in told][2:] == ["crash-loop.json"], told
    assert told[2][1] == Severity.WARNING

    r = subprocess.run(["mount", "-o", "remount,rw", str(small_fs)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    retry.save_crash_loop("slow", "gave up again")  # written now: the episode's end is told, once
    retry.save_crash_loop("slow", "gave up again")
    assert [(Path(kw["path"]).name, sev) for _, sev, _, kw in told[3:]] == [("crash-loop.json", Severity.INFO)], told
    assert "written again" in told[3][2]
    assert Retry(_agent(), small_fs / "crash-loop.json").recorded_crash_loop() == ("slow", "gave up again")


def _agent() -> AgentConfig:
    return AgentConfig(database=Path("/nonexistent/lynxtop.db"), socket=Path("/nonexistent/agent.sock"),
                       crash_loop_failures=5, crash_loop_window_s=1800, backoff_initial_s=10, backoff_max_s=300)
