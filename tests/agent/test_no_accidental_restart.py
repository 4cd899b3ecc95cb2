"""Audit of paths that could stop or restart a healthy, ready vLLM without an operator asking.

Each test failed against the code before its fix (see the commit that added it), except
test_adoption_of_a_removed_profile_keeps_serving, test_pid_reused_by_another_process_is_neither_adopted_nor_killed
and test_health_not_answering_while_ready_never_stops_the_server, which pin down paths the audit found right.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lynxtop.agent.serving import procs
from lynxtop.agent.serving.health import HangDetector

wait_for = db_rows = None  # bound from the `h` fixture (tests import only lynxtop.*)


@pytest.fixture(autouse=True)
def _helpers(h):
    global wait_for, db_rows
    wait_for, db_rows = h.wait_for, h.db_rows


def events(store, kind_prefix: str) -> list[dict]:
    store.flush()
    return [e for e in db_rows(store.path, "SELECT * FROM events ORDER BY id") if e["kind"].startswith(kind_prefix)]


async def start_ready(sup, profile="alpha"):
    await sup.start(profile, by="uid 0 (root) pid 1")
    await wait_for(lambda: sup.state == "ready" and sup.action is None, 15, what="ready")


async def test_adopted_ready_server_survives_a_slow_first_health(make_sup, store):
    """Agent restart while serving: the server got ready an hour ago, far past its 20 s readiness timeout.
    Its first /health after the adoption does not answer (busy server): that must not count as a readiness
    timeout and kill it."""
    a = make_sup()
    await start_ready(a)
    pid = a.proc.pid
    await a.shutdown(stop_serving=False)
    rec = json.loads(a.state_path.read_text())
    hour_ago = int(time.time() * 1000) - 3600_000
    rec["started_ms"], rec["ready_ms"] = hour_ago, hour_ago + 600_000
    a.state_path.write_text(json.dumps(rec))
    os.kill(pid, signal.SIGSTOP)  # /health hangs until the client gives up (3 s)
    try:
        b = make_sup()
        assert await b.adopt_previous()
        deadline = time.monotonic() + 3.6
        while time.monotonic() < deadline:
            assert b.state == "starting", (b.state, b.reason)
            await asyncio.sleep(0.1)
    finally:
        os.kill(pid, signal.SIGCONT)
    await wait_for(lambda: b.state == "ready", 10, what="adopted server ready again")
    assert procs.alive(pid) and b.proc.pid == pid
    assert not events(store, "serving.readiness_timeout")
    await b.shutdown(stop_serving=True)


# ------------------------------------------------------------------------------------ the agent as a process


def _agent(cfg: Path, log: Path) -> subprocess.Popen:
    out = open(log, "ab")  # noqa: SIM115 - the child holds it; closed when the test ends
    try:
        return subprocess.Popen([sys.executable, "-m", "lynxtop", "agent", "--config", str(cfg)],
                                stdout=out, stderr=subprocess.STDOUT)
    finally:
        out.close()


def _db(tmp_path: Path, sql: str) -> list[dict]:
    path = tmp_path / "state" / "lynxtop.db"
    if not path.exists():
        return []
    try:
        return db_rows(path, sql)
    except sqlite3.OperationalError:  # not created yet
        return []


async def _until(pred, timeout: float, what: str, agents: list[subprocess.Popen]):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = pred()
        if got:
            return got
        for a in agents:
            assert a.poll() is None, f"agent exited with {a.returncode} while waiting for {what}"
        await asyncio.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture
def reaper(tmp_path):
    """Kills every agent the test started and every process of a run started under tmp_path."""
    agents: list[subprocess.Popen] = []
    yield agents
    for a in agents:
        if a.poll() is None:
            a.kill()
            a.wait(10)
    logs = os.path.realpath(tmp_path / "state" / "logs")
    for pid in procs.runs_started_in(logs):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


@pytest.mark.timeout(90)
@pytest.mark.parametrize("record", ['{"run_id": 1, "profile": "alpha", "pid"',  # cut short by a full disk
                                    '{"run_id": 1, "profile": "alpha", "pid": PID}'],  # an older format
                         ids=["truncated", "old-format"])
async def test_unadoptable_live_server_holds_autostart(tmp_path, h, reaper, record):
    """Agent restart with the state file unreadable: the live server cannot be adopted, and autostart must not
    put a second vLLM on the same GPUs (nor kill the first)."""
    cfg = h.write_config(tmp_path, agent='autostart = true\ndefault_profile = "alpha"\nsample_interval_s = 0.2')
    a = _agent(cfg, tmp_path / "a.log")
    reaper.append(a)
    run = await _until(lambda: _db(tmp_path, "SELECT * FROM runs WHERE ready_ms IS NOT NULL"), 30, "ready", [a])
    pid = run[0]["pid"]
    a.kill()  # the agent dies (OOM killer, upgrade gone wrong); serving stays
    a.wait(10)
    (tmp_path / "state" / "serving.json").write_text(record.replace("PID", str(pid)))
    (tmp_path / "run" / "agent.serving.json").unlink()  # its copy gone too: no readable record anywhere
    b = _agent(cfg, tmp_path / "b.log")
    reaper.append(b)
    started = await _until(lambda: _db(tmp_path, "SELECT id FROM events WHERE kind = 'agent.started'")[1:], 30,
                           "the second agent started", [b])
    decided = ("SELECT * FROM events WHERE kind IN ('agent.autostart_held', 'serving.starting', "
               f"'serving.adopted') AND id > {started[0]['id']} ORDER BY id")
    ev = await _until(lambda: _db(tmp_path, decided), 30, "the second agent's decision", [b])
    assert ev[0]["kind"] == "agent.autostart_held", (tmp_path / "b.log").read_text()[-2000:]
    assert str(pid) in ev[0]["message"]
    assert len(_db(tmp_path, "SELECT id FROM runs")) == 1
    assert procs.alive(pid)
    # an operator's start is refused too while that server lives, naming it
    r = await asyncio.to_thread(subprocess.run, [sys.executable, "-m", "lynxtop", "start", "--yes", "--config",
                                                 str(cfg)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and str(pid) in r.stderr + r.stdout, (r.stdout, r.stderr)
    assert len(_db(tmp_path, "SELECT id FROM runs")) == 1
    b.send_signal(signal.SIGTERM)  # live_restore on: the agent goes, serving stays
    assert b.wait(30) == 0
    assert procs.alive(pid)


@pytest.mark.timeout(90)
async def test_two_agents_started_at_once_start_one_server(tmp_path, h, reaper):
    """Both pass the 'does the socket answer' check when started in the same instant; only one may go on to
    adopt or autostart, the other must refuse with a message and touch nothing."""
    cfg = h.write_config(tmp_path, agent='autostart = true\ndefault_profile = "alpha"\nsample_interval_s = 0.2')
    for _ in range(3):  # the race is narrow on an idle machine: give it a few chances
        agents = [_agent(cfg, tmp_path / f"agent{i}.log") for i in range(2)]
        reaper.extend(agents)
        await _until(lambda: _db(tmp_path, "SELECT * FROM runs WHERE ready_ms IS NOT NULL"), 30, "ready", [])
        await asyncio.sleep(0.5)  # a second autostart, if any, would show by now
        refused = [a for a in agents if a.poll() is not None]
        assert len(refused) == 1, [(tmp_path / f"agent{i}.log").read_text()[-1500:] for i in range(2)]
        assert refused[0].returncode == 1
        out = (tmp_path / f"agent{agents.index(refused[0])}.log").read_text()
        # the lock's message; on a loaded machine the second may start late enough to find the socket answering
        assert ("another agent (pid" in out and "state directory" in out) or "another agent is already running on" \
            in out, out
        assert "Traceback" not in out
        # refused before opening anything: the old check let both open the store and race to bind the socket
        assert len(_db(tmp_path, "SELECT id FROM events WHERE kind = 'agent.started'")) == 1
        runs = _db(tmp_path, "SELECT * FROM runs")
        assert len(runs) == 1 and procs.alive(runs[0]["pid"])
        live = next(a for a in agents if a.poll() is None)
        live.send_signal(signal.SIGTERM)
        assert live.wait(30) == 0
        for pid in procs.runs_started_in(os.path.realpath(tmp_path / "state" / "logs")):
            os.kill(pid, signal.SIGKILL)
        await _until(lambda: not procs.runs_started_in(os.path.realpath(tmp_path / "state" / "logs")), 10,
                     "the run killed", [])
        (tmp_path / "state" / "serving.json").unlink(missing_ok=True)
        (tmp_path / "run" / "agent.serving.json").unlink(missing_ok=True)  # its copy
        (tmp_path / "state" / "lynxtop.db").unlink()
        for side in ("-wal", "-shm"):
            (tmp_path / "state" / f"lynxtop.db{side}").unlink(missing_ok=True)


def _profile(h, name: str, port: int, readiness_s: float = 20) -> str:
    return h.standin_profile(name, port, tp=8, readiness_s=readiness_s, model="deepseek-ai/DeepSeek-V4.1")


async def test_adoption_mid_load_keeps_the_runs_own_readiness_timeout(make_sup, store, h, tmp_path, monkeypatch):
    """Agent restart during a long load, after an operator shortened the profile's readiness timeout (and moved
    its port, and made another profile the autostart default): the load under way keeps the timeout and the
    address it started with; the edit is for the next run."""
    monkeypatch.setenv("STANDIN_STARTUP_S", "3")
    port = h.free_port()
    a = make_sup(cfg_path=h.write_config(tmp_path, profiles=_profile(h, "alpha", port)))
    await a.start("alpha", by="uid 0 (root) pid 1")
    await wait_for(lambda: a.state == "starting" and a.proc is not None and a.run_id is not None, 30, what="starting")
    pid = a.proc.pid
    await a.shutdown(stop_serving=False)
    edited = h.write_config(tmp_path, agent='default_profile = "gamma"\nautostart = true',
                            profiles=_profile(h, "alpha", h.free_port(), readiness_s=1)
                            + _profile(h, "gamma", h.free_port()))
    b = make_sup(cfg_path=edited)
    assert await b.adopt_previous()
    assert events(store, "serving.adopted_profile_changed")
    await wait_for(lambda: b.state == "ready", 15, what="adopted load finished")
    assert b.proc.pid == pid and procs.alive(pid) and b.url().endswith(f":{port}")
    assert not events(store, "serving.readiness_timeout")
    assert len(db_rows(store.path, "SELECT id FROM runs")) == 1
    await b.shutdown(stop_serving=True)


async def test_adoption_of_a_removed_profile_keeps_serving(make_sup, store, h, tmp_path):
    """The profile of the ready server was renamed in the config meanwhile: adopt it anyway, say so."""
    port = h.free_port()
    a = make_sup(cfg_path=h.write_config(tmp_path, profiles=_profile(h, "alpha", port)))
    await start_ready(a)
    pid = a.proc.pid
    await a.shutdown(stop_serving=False)
    b = make_sup(cfg_path=h.write_config(tmp_path, agent='default_profile = "alpha-v2"\nautostart = true',
                                         profiles=_profile(h, "alpha-v2", h.free_port())))
    assert await b.adopt_previous()
    ev = events(store, "serving.adopted_unknown_profile")
    assert ev and "'alpha'" in ev[0]["message"]
    await wait_for(lambda: b.state == "ready", 10, what="adopted ready")
    assert b.proc.pid == pid and procs.alive(pid) and b.url().endswith(f":{port}")
    assert len(db_rows(store.path, "SELECT id FROM runs")) == 1
    await b.shutdown(stop_serving=True)
    assert not procs.alive(pid)


@pytest.mark.parametrize("same_start", [False, True], ids=["start-time-differs", "command-differs"])
async def test_pid_reused_by_another_process_is_neither_adopted_nor_killed(make_sup, store, same_start):
    """The recorded pid now belongs to an unrelated process (pid reuse after a reboot or a long downtime)."""
    a = make_sup()
    await start_ready(a)
    rec = json.loads(a.state_path.read_text())
    await a.shutdown(stop_serving=True)  # the run is gone...
    other = subprocess.Popen(["sleep", "30"], start_new_session=True)  # ...and its pid is someone else's
    try:
        st = procs.stat(other.pid)
        rec["pid"] = rec["pgid"] = other.pid
        rec["start_ticks"] = st.start_ticks if same_start else st.start_ticks + 1
        a.state_path.write_text(json.dumps(rec))
        b = make_sup()
        assert not await b.adopt_previous()
        assert procs.alive(other.pid) and other.poll() is None
        ev = events(store, "serving.not_adopted")[-1]
        assert ("different command line" if same_start else "start time differs") in ev["message"]
        assert b.state == "stopped" and b.proc is None
        await b.shutdown(stop_serving=True)
        assert other.poll() is None
    finally:
        other.kill()
        other.wait(5)


async def test_health_not_answering_while_ready_never_stops_the_server(make_sup, store):
    """A ready server that stops answering /health (frozen here with SIGSTOP) is marked degraded at most;
    only an exit is a crash."""
    sup = make_sup()
    await start_ready(sup)
    pid = sup.proc.pid
    seen = set()
    os.kill(pid, signal.SIGSTOP)
    try:
        deadline = time.monotonic() + 4.0  # one /health times out (3 s), the next ones queue behind it
        while time.monotonic() < deadline:
            seen.add(sup.state)
            await asyncio.sleep(0.05)
    finally:
        os.kill(pid, signal.SIGCONT)
    await wait_for(lambda: sup.state == "ready", 15, what="ready again")
    assert seen <= {"ready", "degraded"}, seen
    assert sup.proc.pid == pid and procs.alive(pid) and sup.crashes == 0
    assert not events(store, "serving.crash") and not events(store, "serving.exited")
    await sup.shutdown(stop_serving=True)


async def test_metrics_outage_then_first_request_is_not_a_hang(make_sup, store):
    """/metrics unreadable for two minutes on an idle server; when it answers again a request is in prefill
    (no new token yet). That is not a hang, and with restart_on_hang on it must not restart the server."""
    sup = make_sup(agent="restart_on_hang = true\nhang_timeout_s = 60")
    await start_ready(sup)
    pid = sup.proc.pid
    hang = HangDetector(sup.cfg.agent.hang_timeout_s)

    def observe(running, tokens, now):  # the agent's tick: the detector's verdict goes to the supervisor
        verdict = hang.observe(running, tokens, now=now)
        if verdict is not None:
            sup.on_verdict(verdict)

    t0 = 1000.0
    observe(0, 500.0, now=t0)  # idle
    for i in range(1, 121):
        observe(None, None, now=t0 + i)  # scrape outage (the scraper gives no readings)
    observe(1, 500.0, now=t0 + 121)  # back: one request, still in prefill
    assert sup.state == "ready" and sup.action is None, (sup.state, sup.reason, sup.action)
    assert not events(store, "serving.degraded.hang")
    observe(1, 500.0, now=t0 + 150)
    assert sup.state == "ready"
    observe(1, 500.0, now=t0 + 182)  # a real stall, 61 s after the readings came back: still caught
    assert events(store, "serving.degraded.hang")
    await wait_for(lambda: sup.action is None and sup.state == "ready", 20, what="restart after the real hang")
    assert sup.proc.pid != pid
    await sup.shutdown(stop_serving=True)
