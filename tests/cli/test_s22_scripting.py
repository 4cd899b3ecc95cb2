"""Session 22: the command line as operators script it (runbooks, cron, pipes, CI gates, ASCII terminals).

Real subprocesses of `python -m lynxtop`, a real SQLite history, real agents supervising the simulated vLLM, and a
real unix socket answering a chosen status (support/status_socket.py).
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support.agent_config import sim_profile, write_agent_config
from support.agent_proc import Agent, reap_sims
from support.status import make_status, status_json
from support.status_socket import agent_socket

from lynxtop.cli import ctl
from lynxtop.contract.events import Event, EventKind, Severity
from lynxtop.store.writer import StoreWriter

pytestmark = pytest.mark.timeout(180)
NOW = int(time.time() * 1000)


def _lynxtop(*args: str, env: dict[str, str] | None = None, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "lynxtop", *args], capture_output=True, text=True, timeout=90,
                          env=env, errors="replace", **kw)


def _strict(line: str) -> object:
    def refuse(token: str) -> object:
        raise ValueError(f"not JSON: {token}")
    return json.loads(line, parse_constant=refuse)


@pytest.fixture
def db(tmp_path) -> Path:
    path = tmp_path / "h.db"
    with StoreWriter(path) as w:
        run = w.create_run(profile="p", model="m", started_ms=NOW - 3_600_000)
        w.record(Event(EventKind.SLA_BREACH, Severity.WARNING, "SLA breach", run_id=run, ts_ms=NOW - 60_000,
                       details={"p99_ms": float("nan"), "threshold_ms": float("inf")}))
        w.record(Event(EventKind.SERVING_STARTING, Severity.INFO, "starting modèle-tp8", run_id=run,
                       ts_ms=NOW - 50_000))
    return path


def _agent(tmp_path: Path, startup_s: float = 0.5) -> tuple[Agent, Path]:
    profs = [sim_profile("alpha", tp=8, startup_s=startup_s, readiness_timeout_s=120),
             sim_profile("beta", tp=8, startup_s=startup_s, readiness_timeout_s=120)]
    cfg = write_agent_config(tmp_path / "config.toml", tmp_path / "state" / "lynxtop.db",
                             tmp_path / "run" / "agent.sock", fake_nvml="sim", sample_interval_s=0.2,
                             default_profile="alpha", profiles=profs)
    return Agent(tmp_path, cfg), cfg


@pytest.fixture
def agents(tmp_path):
    started: list[Agent] = []
    yield started
    for a in started:
        a.stop(signal.SIGKILL)
    reap_sims(tmp_path / "sim-state")


# ------------------------------------------------------------------------- 1. "already" is the goal reached


async def test_already_in_the_asked_state_exits_0_and_a_real_refusal_still_exits_1(tmp_path, agents):
    agent, cfg = _agent(tmp_path)
    agents.append(agent)
    await agent.wait_state(lambda s: s["state"] == "stopped", 60, "stopped (no autostart)")
    r = _lynxtop("stop", "-y", "--wait", "--config", str(cfg))
    assert r.returncode == 0 and "already stopped: nothing to do" in r.stderr, (r.returncode, r.stderr)
    code, body = await agent.api("POST", "/v1/stop", {"expect_run": None})
    assert code == 409 and body["error"] == "already_stopped", (code, body)
    r = _lynxtop("start", "--wait", "--config", str(cfg))
    assert r.returncode == 0, (r.stdout, r.stderr)
    r = _lynxtop("start", "alpha", "--wait", "--config", str(cfg))  # the profile already serving
    assert r.returncode == 0 and "already serving: nothing to do" in r.stderr, (r.returncode, r.stderr)
    r = _lynxtop("start", "beta", "--config", str(cfg))  # another profile serves: a refusal, as before
    assert r.returncode == 1 and "state:" in r.stderr, (r.returncode, r.stderr)


# ------------------------------------------------------------------------- 2. Ctrl-C on --wait


async def test_ctrl_c_on_start_wait_says_the_start_goes_on_and_how_to_cancel(tmp_path, agents):
    agent, cfg = _agent(tmp_path, startup_s=60)
    agents.append(agent)
    await agent.wait_state(lambda s: s["state"] == "stopped", 60, "stopped (no autostart)")
    p = subprocess.Popen([sys.executable, "-m", "lynxtop", "start", "--wait", "--config", str(cfg)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        seen = ""
        deadline = time.monotonic() + 60
        while "  profile alpha" not in seen and time.monotonic() < deadline:
            seen += p.stdout.readline()  # type: ignore[union-attr]
        assert "  profile alpha" in seen, seen
        p.send_signal(signal.SIGINT)
        _, err = p.communicate(timeout=30)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 130 and "Traceback" not in err, (p.returncode, err)
    assert "continues on the agent" in err and "lynxtop stop" in err, err
    assert (await agent.status())["serving"]["state"] == "starting"
    assert "lynxtop stop" in _lynxtop("start", "--help").stdout


# ------------------------------------------------------------------------- 3. status --check


@pytest.mark.parametrize("state, healthy, code", [("ready", True, 0), ("crash-loop", True, 6), ("backoff", True, 6),
                                                  ("stopped", True, 6), ("degraded", True, 6), ("ready", False, 6)])
def test_status_check_exits_0_only_when_ready_and_healthy(tmp_path, state, healthy, code):
    sock = tmp_path / "agent.sock"
    with agent_socket(sock, status_json(state, agent={"healthy": healthy})):
        r = _lynxtop("status", "--check", "--socket", str(sock))
        plain = _lynxtop("status", "--socket", str(sock))
    assert r.returncode == code, (state, healthy, r.returncode, r.stderr)
    assert plain.returncode == 0  # without --check, as before
    if code:
        assert "not serving as expected" in r.stderr, r.stderr


# ------------------------------------------------------------------------- 4. --json is strict JSON


def test_events_json_from_the_database_is_strict_json(db):
    r = _lynxtop("events", "--database", str(db), "--json")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert len(lines) == 2
    assert [_strict(ln) for ln in lines][0]["details"] == {"p99_ms": None, "threshold_ms": None}


def test_finite_helper_walks_nested_values():
    from lynxtop.contract.jsonsafe import finite, strict_dumps

    assert finite({"a": [1.0, float("nan"), (float("-inf"),)], "b": "x"}) == {"a": [1.0, None, [None]], "b": "x"}
    assert strict_dumps({"a": float("inf")}) == '{"a": null}'


# ------------------------------------------------------------------------- 5./6. stdout that cannot be written


@pytest.mark.parametrize("cmd", [["runs"], ["events"], ["runs", "--json"]])
def test_full_disk_stdout_is_one_line_naming_stdout(db, cmd):
    with open("/dev/full", "w") as full:
        r = subprocess.run([sys.executable, "-m", "lynxtop", *cmd, "--database", str(db)], stdout=full,
                           stderr=subprocess.PIPE, text=True, timeout=60)
    assert r.returncode == 1 and "Traceback" not in r.stderr, (r.returncode, r.stderr[-800:])
    assert r.stderr.count("\n") == 1 and "stdout" in r.stderr and "No space left" in r.stderr, r.stderr


@pytest.mark.parametrize("cmd", [["export", "--run", "1", "--table", "events"], ["runs"], ["events"]])
def test_closed_stdout_says_so_and_exits_1(db, cmd):
    r = subprocess.run([sys.executable, "-m", "lynxtop", *cmd, "--database", str(db)], stdout=subprocess.DEVNULL,
                       stderr=subprocess.PIPE, text=True, timeout=60, preexec_fn=lambda: os.close(1))
    assert r.returncode == 1 and "Traceback" not in r.stderr, (r.returncode, r.stderr[-800:])
    assert "stdout is closed" in r.stderr, r.stderr


# ------------------------------------------------------------------------- 7. SIGTERM during an export


def test_sigterm_during_export_to_a_file_leaves_no_temp_file(tmp_path):
    path = tmp_path / "big.db"
    with StoreWriter(path):
        pass
    con = sqlite3.connect(path)
    con.executemany("INSERT INTO gpu_samples (ts_ms, gpu) VALUES (?, ?)",
                    ((NOW - 2_000_000_000 + i * 1000, g) for i in range(150_000) for g in range(8)))
    con.commit()
    con.close()
    outdir = tmp_path / "out"
    outdir.mkdir()
    p = subprocess.Popen([sys.executable, "-m", "lynxtop", "export", "--database", str(path), "--from", "-30d",
                          "-o", str(outdir / "x.csv")], stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not list(outdir.iterdir()) and p.poll() is None and time.monotonic() < deadline:
            time.sleep(0.01)
        assert p.poll() is None, "the export ended before it could be interrupted: make the history larger"
        p.send_signal(signal.SIGTERM)
        _, err = p.communicate(timeout=30)
    finally:
        if p.poll() is None:
            p.kill()
    assert "Traceback" not in err, err
    assert p.returncode == 143, (p.returncode, err)
    assert list(outdir.iterdir()) == [], [f.name for f in outdir.iterdir()]


# ------------------------------------------------------------------------- 8. check: could not check vs blocking


def test_check_could_not_check_is_its_own_code(tmp_path):
    cfg = write_agent_config(tmp_path / "c.toml", tmp_path / "h.db", tmp_path / "a.sock", fake_nvml="sim",
                             profiles=[sim_profile("alpha")])
    r = _lynxtop("check", "--config", str(cfg), "--profile", "no-such-profile")
    assert r.returncode == 7 and "unknown profile" in r.stderr, (r.returncode, r.stderr)
    r = _lynxtop("check", "--config", str(cfg), "--no-such-option")  # argparse's own usage error
    assert r.returncode == 7, (r.returncode, r.stderr)
    r = _lynxtop("check", "--config", str(tmp_path / "missing.toml"))
    assert r.returncode == 7, (r.returncode, r.stderr)
    assert _lynxtop("check", "--config", str(cfg)).returncode in (0, 1)


# ------------------------------------------------------------------------- 9. bench list --json


def test_bench_list_json(db):
    with StoreWriter(db) as w:
        for conc, tps in ((1, 100.0), (8, 700.5)):
            w.add_bench_result({"bench_id": "b1", "run_id": 1, "profile": "p", "name": "random", "concurrency": conc,
                                "output_tokens_per_s": tps})
    r = _lynxtop("bench", "list", "--database", str(db), "--json")
    assert r.returncode == 0, r.stderr
    data = _strict(r.stdout)
    assert isinstance(data, list) and len(data) == 1, data
    assert data[0]["bench_id"] == "b1" and data[0]["levels"] == 2 and data[0]["max_output_tokens_per_s"] == 700.5


# ------------------------------------------------------------------------- 10. messages name commands that exist


def test_empty_profile_message_names_a_command_that_exists(tmp_path):
    r = _lynxtop("start", "", "--socket", str(tmp_path / "none.sock"))
    assert r.returncode == 2 and "lynxtop config check" in r.stderr, r.stderr
    assert "lynxtop profiles" not in r.stderr


# ------------------------------------------------------------------------- 11. ASCII stdout


def _ascii_env(over: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONIOENCODING", "PYTHONUTF8", "LANG", "LC_ALL",
                                                             "LC_CTYPE")}
    return env | over


@pytest.mark.parametrize("over", [{"LC_ALL": "C", "PYTHONCOERCECLOCALE": "0", "PYTHONUTF8": "0"},
                                  {"PYTHONIOENCODING": "ascii"}])
def test_status_and_events_on_an_ascii_stdout(tmp_path, db, over):
    sock = tmp_path / "agent.sock"
    st = status_json(profile="modèle-tp8", agent={"store": {"path": "/var/lib/lynxtop/lynxtop.db", "queued": 12,
                                                            "dropped": 3, "last_error": "database or disk is full",
                                                            "retrying": True, "free_bytes": 0}})
    with agent_socket(sock, st):
        r = _lynxtop("status", "--socket", str(sock), env=_ascii_env(over))
    assert r.returncode == 0 and "UnicodeEncodeError" not in r.stderr, r.stderr[-800:]
    assert "history  NOT WRITING - " in r.stdout and "mod\\xe8le-tp8" in r.stdout, r.stdout
    r = _lynxtop("events", "--database", str(db), env=_ascii_env(over))
    assert r.returncode == 0 and "starting mod\\xe8le-tp8" in r.stdout, (r.stdout, r.stderr[-800:])


def test_status_marks_are_ascii():
    from lynxtop.contract.status import StoreStatus

    line = ctl.history_line(StoreStatus(path="/x.db", queued=1, dropped=0, last_error="disk full", retrying=True))
    assert line.isascii(), line


# ------------------------------------------------------------------------- 12. KV cache as the dashboard shows it


@pytest.mark.parametrize("kv, shown", [(0.4, "KV 0.4%"), (99.96, "KV 100.0%"), (55.0, "KV 55.0%")])
def test_kv_cache_with_one_decimal(kv, shown):
    text = ctl.format_status(make_status(metrics={"kv_cache_usage_pct": kv, "scrape_ok": 1}))
    assert shown in text, text
