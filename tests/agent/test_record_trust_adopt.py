"""A ready server, the agent restarted with live restore, and serving.json not as the agent wrote it (another
version's record, a hand edit): the next agent must never signal the live server. It used to take a `start_ticks`
of another type for "the pid belongs to another process" and SIGKILL every process carrying the run's token, the
server among them, then autostart a new 20-minute load. Real agents, real simulated vLLM, real files."""

from __future__ import annotations

import asyncio
import json

import aiohttp
import pytest
from support.agent_proc import Agent, e2e_config, run_processes, state_db, stored_events
from support.serving_record import format_2, start_and_argv

from lynxtop.agent.serving import procs

pytestmark = pytest.mark.timeout(120)


def _start_null(rec: dict) -> str:
    rec["start_ticks"] = None
    return json.dumps(rec)


def _start_other_number(rec: dict) -> str:
    rec["start_ticks"] += 1
    return json.dumps(rec)


def _previous_version(rec: dict) -> str:
    del rec["format"]
    return json.dumps(rec)


def _start_string(rec: dict) -> str:
    rec["start_ticks"] = str(rec["start_ticks"])
    return json.dumps(rec)


def _start_float(rec: dict) -> str:
    rec["start_ticks"] = float(rec["start_ticks"])
    return json.dumps(rec)


def _start_infinite(rec: dict) -> str:
    return json.dumps(rec).replace(f'"start_ticks": {rec["start_ticks"]}', '"start_ticks": 1e999')


def _no_token(rec: dict) -> str:
    del rec["token"]
    return json.dumps(rec)


ADOPTED = {  # edit -> what agent.state_file says (None: nothing to say, the record is as an agent writes it)
    "start-null": (_start_null, "start time not recorded"),
    "start-other-number": (_start_other_number, "start time differs"),
    "previous-version": (_previous_version, None),
}
UNREADABLE = {  # edit -> what agent.state_file says is wrong
    "start-string": (_start_string, '"start_ticks" is "{ticks}", not a positive integer or null'),
    "start-float": (_start_float, '"start_ticks" is {ticks}.0, not a positive integer or null'),
    "start-1e999": (_start_infinite, "1e999"),  # safefile.loads_strict's words
    "no-token": (_no_token, '"token" is missing'),
    "format-2": (format_2, '"format" is 2: written by a newer agent'),
}


async def _healthy(url: str) -> bool:
    async with aiohttp.ClientSession() as s, s.get(f"{url}/health", timeout=aiohttp.ClientTimeout(total=5)) as r:
        return r.status == 200


async def _ready_then_edited(tmp_path, cleanup, edit) -> tuple:
    """Agent A serves until ready and exits (live restore); serving.json is edited; agent B starts."""
    cfg = e2e_config(tmp_path)
    a = Agent(tmp_path, cfg, "a1")
    cleanup.append(a)
    st = await a.wait_state(lambda s: s["state"] == "ready", what="ready")
    pid, run_id, url = st["serving"]["pid"], st["serving"]["run_id"], st["serving"]["url"]
    a.stop()  # live restore: the server keeps serving
    assert procs.alive(pid)
    state = tmp_path / "state" / "serving.json"
    rec = json.loads(state.read_text())
    assert rec["format"] == 1 and rec["pid"] == pid
    token, ticks = rec["token"], rec["start_ticks"]
    before = run_processes(token)
    assert (pid, ticks) in before and len(before) > 1  # the API server and its engine
    state.write_text(edit(rec))
    (tmp_path / "run" / "agent.serving.json").unlink()  # its copy gone too: the edited record is all there is
    since = state_db(tmp_path, "SELECT max(id) AS id FROM events")[0]["id"]
    b = Agent(tmp_path, cfg, "a2")
    cleanup.append(b)
    await b.wait_notify("READY=1", timeout=30)
    return b, pid, run_id, url, token, ticks, before, since


async def _nothing_signalled(tmp_path, url, token, before, run_id) -> None:
    await asyncio.sleep(1.0)  # a SIGTERMed sim drains and exits well within this
    assert run_processes(token) == before  # the server and its engine: same pids, same processes
    assert await _healthy(url)
    assert [r["id"] for r in state_db(tmp_path, "SELECT id FROM runs")] == [run_id]  # no second run
    assert len(state_db(tmp_path, "SELECT id FROM events WHERE kind = 'serving.starting'")) == 1  # A's only


@pytest.mark.parametrize("name", list(ADOPTED))
async def test_a_record_whose_start_time_is_wrong_or_unknown_is_adopted_on_the_token(tmp_path, cleanup, name):
    edit, words = ADOPTED[name]
    b, pid, run_id, url, token, ticks, before, since = await _ready_then_edited(tmp_path, cleanup, edit)
    st = await b.wait_state(lambda s: s["state"] == "ready" and s["pid"] == pid, what="adopted and ready")
    assert st["serving"]["run_id"] == run_id and st["serving"]["adopted"]
    await _nothing_signalled(tmp_path, url, token, before, run_id)
    said = state_db(tmp_path, "SELECT message FROM events WHERE kind = 'agent.state_file' AND id > ?", (since,))
    if words is None:
        assert not said
    else:
        assert len(said) == 1 and words in said[0]["message"] and "adopted on its run token" in said[0]["message"]
        # the record is saved again with the process's real start time: the next agent needs no token for it
        rec = json.loads((tmp_path / "state" / "serving.json").read_text())
        assert rec["start_ticks"] == ticks and rec["format"] == 1
    assert not state_db(tmp_path, "SELECT id FROM events WHERE kind = 'serving.not_adopted'")
    b.stop()
    assert procs.alive(pid)


@pytest.mark.parametrize("name", list(UNREADABLE))
async def test_a_record_no_agent_wrote_is_unreadable_and_the_live_server_is_left_alone(tmp_path, cleanup, name):
    edit, words = UNREADABLE[name]
    b, pid, run_id, url, token, ticks, before, since = await _ready_then_edited(tmp_path, cleanup, edit)
    held = await stored_events(tmp_path, "agent.autostart_held", since, timeout=20)
    assert str(pid) in held[0]["message"]
    await _nothing_signalled(tmp_path, url, token, before, run_id)
    said = state_db(tmp_path, "SELECT message FROM events WHERE kind = 'agent.state_file' AND id > ?", (since,))
    assert len(said) == 1, said
    assert "is not a valid server record (" in said[0]["message"], said
    assert words.format(ticks=ticks) in said[0]["message"].split("record (", 1)[1], said
    assert "nothing is adopted and nothing is signalled" in said[0]["message"]
    st = await b.status()
    assert st["serving"]["state"] == "stopped" and st["serving"]["pid"] is None
    assert not state_db(tmp_path, "SELECT id FROM events WHERE kind = 'serving.not_adopted'")
    b.stop()
    assert procs.alive(pid)


async def test_a_token_carrier_that_is_not_provably_the_server_is_held_not_signalled(tmp_path, cleanup):
    """Start time and argv both edited: the live pid carries the run's token but cannot be proven the server (the
    token alone does not tell it from another process of the run). Held: not adopted, nothing signalled, the
    operator told what to do; autostart held."""
    b, pid, run_id, url, token, ticks, before, since = await _ready_then_edited(tmp_path, cleanup, start_and_argv)
    ev = await stored_events(tmp_path, "serving.not_adopted", since, timeout=20)
    msg = ev[0]["message"]
    assert f"pid {pid} carries the run's token (start time differs" in msg and "different command line" in msg
    assert "nothing of it is signalled" in msg and f"ps -fp {pid}" in msg and f"kill {pid}" in msg
    assert json.loads(ev[0]["details"])["held"] is True
    held = await stored_events(tmp_path, "agent.autostart_held", since, timeout=20)
    assert str(pid) in held[0]["message"]
    await _nothing_signalled(tmp_path, url, token, before, run_id)
    assert (tmp_path / "state" / "serving.json").exists()  # kept: the next agent decides the same way
    assert not state_db(tmp_path, "SELECT ended_ms FROM runs")[0]["ended_ms"]  # the run is not closed: it serves
    b.stop()
    assert procs.alive(pid)
