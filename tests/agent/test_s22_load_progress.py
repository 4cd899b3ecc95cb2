"""s22: a long model load as the operator watches it: the shards' progress, a silent (stuck) log told apart from a
slow one, the profile's usual load time, and an adopted load's phases keeping their times.

Parsing runs on real log files; the stall warning on a real agent and the simulated vLLM (SIGSTOP as a hung read)."""

from __future__ import annotations

import asyncio
import os
import signal
import sqlite3
import time
from pathlib import Path

import pytest
from support.agent_config import sim_profile, write_agent_config
from support.agent_proc import Agent, state_db

from lynxtop.agent.serving.startup import PhaseTracker, line_ms
from lynxtop.cli.ctl import format_status
from lynxtop.contract.config import ConfigError, parse_config
from lynxtop.contract.records import RecordError
from lynxtop.contract.status import LoadProgress, ServingState, ServingStatus, Status
from lynxtop.store import schema
from lynxtop.store.reader import StoreReader, usual_load_ms


def _stamp(t: float) -> str:
    return time.strftime("%m-%d %H:%M:%S", time.localtime(t))


# ------------------------------------------------------------------------------------------ the log


def test_shard_progress_is_read_from_newline_and_carriage_return_bars(tmp_path: Path) -> None:
    log = tmp_path / "run.log"
    now = int(time.time() * 1000)
    log.write_text(f"INFO {_stamp(time.time())} [x.py:1] Starting to load model m...\n"
                   "\rLoading safetensors checkpoint shards:   3% Completed | 2/60 [00:10<05:00, 5.0s/it]\n")
    tr = PhaseTracker(log, now)
    tr.poll(now)
    assert tr.progress == (2, 60, 3.0)
    # tqdm on a file: `\r` between redraws, no newline until it closes; the last redraw counts
    with log.open("a") as f:
        f.write("\rLoading safetensors checkpoint shards:  43% Completed | 26/60 [02:10<03:00, 5.0s/it]"
                "\rLoading safetensors checkpoint shards:  45% Completed | 27/60 [02:15<02:55, 5.0s/it]")
    tr.poll(now + 1000)
    assert tr.progress == (27, 60, 45.0)
    assert tr.phase == "loading weights"


def test_log_growth_is_recorded_and_silence_is_not_growth(tmp_path: Path) -> None:
    log = tmp_path / "run.log"
    log.write_text("a line\n")
    tr = PhaseTracker(log, 1000)
    tr.poll(5000)
    assert tr.grew_ms == 5000
    tr.poll(9000)  # nothing written
    assert tr.grew_ms == 5000
    with log.open("a") as f:
        f.write("half a li")  # a partial line is growth too (a bar redrawn with `\r`)
    tr.poll(12000)
    assert tr.grew_ms == 12000


def test_adopted_catch_up_stamps_phases_from_their_lines(tmp_path: Path) -> None:
    """An agent adopting a load 60 s after its kv cache phase began keeps that phase's real start."""
    wall = time.time()
    now = int(wall * 1000)
    started = now - 120_000
    log = tmp_path / "run.log"
    log.write_text(f"(EngineCore_DP0 pid=1) INFO {_stamp(wall - 118)} [x.py:1] Starting to load model m...\n"
                   f"(EngineCore_DP0 pid=1) INFO {_stamp(wall - 60)} [x.py:2] Loading weights took 58.00 seconds\n")
    os.utime(log, (wall - 60, wall - 60))
    tr = PhaseTracker(log, started)
    tr.start_at_tail()
    tr.catch_up(now)
    kv = next(m.ts_ms for m in tr.marks if m.phase == "kv cache")
    assert abs(kv - (now - 60_000)) <= 1500, kv - now
    assert abs(tr.grew_ms - (now - 60_000)) <= 1500  # silent since its last write, not since the adoption


def test_a_stamp_that_cannot_be_this_runs_falls_back_to_now(tmp_path: Path) -> None:
    now = int(time.time() * 1000)
    old = _stamp(time.time() - 3 * 86400)
    assert line_ms(f"INFO {old} [x.py:1] Loading weights took 1 s", now, now - 60_000) == now  # before its start
    assert line_ms("Loading weights took 1 s", now, now - 60_000) == now  # no prefix
    assert line_ms("INFO 13-45 99:99:99 [x] Loading weights took", now, None) == now  # garbage


# ------------------------------------------------------------------------------------------ the contract


def test_status_carries_load_progress_and_older_agents_still_parse() -> None:
    srv = ServingStatus(state=ServingState.STARTING, phase="loading weights",
                        load_progress=LoadProgress(done=27, total=60, pct=45.0), log_grew_ms=123)
    back = ServingStatus.from_json(srv.to_json())
    assert back.load_progress == LoadProgress(27, 60, 45.0) and back.log_grew_ms == 123
    older = srv.to_json()
    del older["load_progress"], older["log_grew_ms"]
    assert ServingStatus.from_json(older).load_progress is None
    with pytest.raises(RecordError, match="load_progress|LoadProgress"):
        ServingStatus.from_json({**srv.to_json(), "load_progress": {"done": "27", "total": 60, "pct": 45}})


def test_load_stall_warn_s_is_validated() -> None:
    base = '[agent]\ndatabase = "/tmp/x.db"\nsocket = "/tmp/x.sock"\n'
    assert parse_config(base).agent.load_stall_warn_s == 300
    assert parse_config(base + "load_stall_warn_s = 0\n").agent.load_stall_warn_s == 0
    with pytest.raises(ConfigError, match="load_stall_warn_s"):
        parse_config(base + "load_stall_warn_s = -5\n")


# ------------------------------------------------------------------------------------------ usual load time


def test_usual_load_time_is_the_median_of_the_profiles_last_ready_loads(tmp_path: Path) -> None:
    path = tmp_path / "h.db"
    schema.create_file(path)
    c = sqlite3.connect(path, isolation_level=None)
    schema.migrate(c)
    rows = [("v4", 0, 100_000), ("v4", 0, 300_000), ("v4", 0, None), ("other", 0, 5_000), ("v4", 0, 200_000),
            ("v4", 0, 900_000)]  # oldest first; the last is the load under way (excluded by its id)
    for prof, started, ready in rows:
        c.execute("INSERT INTO runs (profile, started_ms, ready_ms) VALUES (?, ?, ?)", (prof, started, ready))
    c.close()
    with StoreReader(path) as r:
        assert usual_load_ms(r, "v4", exclude_run=6) == 200_000  # median of 200, 300, 100 (s)
        assert usual_load_ms(r, "v4") == 300_000  # 900, 200, 300
        assert usual_load_ms(r, "nothing") is None


def test_status_text_says_progress_silence_and_usual_time() -> None:
    now = 10_000_000
    srv = ServingStatus(state=ServingState.STARTING, state_since_ms=now - 600_000, phase="loading weights",
                        phase_since_ms=now - 552_000, started_ms=now - 600_000, profile="v4", run_id=3,
                        load_progress=LoadProgress(27, 60, 45.0), log_grew_ms=now - 252_000)
    text = format_status(Status(ts_ms=now, serving=srv), usual_ms=1_140_000)
    phase = next(line for line in text.splitlines() if "phase:" in line)
    assert "loading weights 27/60 shards (45%) for 9m12s" in phase
    assert "LOG SILENT 4m12s" in phase
    assert "usually ready in ~19m" in text
    quiet = format_status(Status(ts_ms=now, serving=srv.__class__(**{**srv.__dict__, "log_grew_ms": now - 2000})))
    assert "last log output 2s ago" in quiet and "SILENT" not in quiet and "usually" not in quiet


# ------------------------------------------------------------------------------------------ a real agent


@pytest.mark.timeout(180)
async def test_stalled_load_warns_once_and_resumes_without_a_stop(tmp_path: Path, cleanup) -> None:
    prof = sim_profile("v4", startup_s=60, readiness_timeout_s=600, sim_args=("--sim-log-interval", "1"))
    cfg = write_agent_config(tmp_path / "config.toml", tmp_path / "state" / "lynxtop.db", tmp_path / "run" / "a.sock",
                             fake_nvml="sim", sample_interval_s=0.2, default_profile="v4", autostart=True,
                             load_stall_warn_s=4, profiles=[prof])
    a = Agent(tmp_path, cfg, sock=tmp_path / "run" / "a.sock")
    cleanup.append(a)
    st = await a.wait_state(lambda s: s["state"] == "starting" and s["pid"], timeout=60, what="starting")
    pid, run_id = st["serving"]["pid"], st["serving"]["run_id"]
    st = await a.wait_state(lambda s: (s.get("load_progress") or {}).get("done", 0) > 0, timeout=60,
                            what="shard progress in the status")
    assert st["serving"]["load_progress"]["total"] > 0
    os.killpg(pid, signal.SIGSTOP)
    try:
        await asyncio.sleep(8)  # the warning is due after 4 s of silence; 8 s give it time to come, and to repeat
        st = await a.status()
        assert st["ts_ms"] - st["serving"]["log_grew_ms"] > 6000, st["serving"]
        stalled = state_db(tmp_path, "SELECT * FROM events WHERE kind = 'serving.load_stalled'")
        assert len(stalled) == 1 and stalled[0]["severity"] == "warning", stalled  # once per episode
        assert st["serving"]["state"] == "starting" and st["serving"]["run_id"] == run_id  # never stopped for it
    finally:
        os.killpg(pid, signal.SIGCONT)
    deadline = time.monotonic() + 60
    while not state_db(tmp_path, "SELECT * FROM events WHERE kind = 'serving.load_resumed'"):
        assert time.monotonic() < deadline, "no serving.load_resumed after the output came back"
        await asyncio.sleep(0.2)
    st = await a.status()
    assert st["serving"]["run_id"] == run_id
