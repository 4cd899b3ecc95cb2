"""Session 25: a server the agent holds (left by the previous agent, alive with its run's token, not provably the
server: never adopted) is in the status as data, `serving.held`, not only in the reason's words: the CLI and the
dashboard show it from there. Present while the held server lives; gone once `lynxtop stop` ended it, or once it
ended by other means (checked every few seconds, never per status).

The contract's part (round trip, bad values) on its own; the rest with real agents, real simulated vLLM, real
processes.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time

import pytest
from support.agent_proc import state_db
from support.serving_record import start_and_argv
from test_s25_supervision import _gone, _ready_then_edited, _stopped, _wait

from lynxtop.__main__ import main
from lynxtop.contract.records import RecordError
from lynxtop.contract.status import HeldRun, ServingState, ServingStatus, Status

pytestmark = pytest.mark.timeout(150)


# ---------------------------------------------------------------------------------------------- the contract


def test_held_round_trips_and_an_older_agent_sends_none():
    srv = ServingStatus(state=ServingState.STOPPED, held=HeldRun(run_id=12, profile="dsv41", pid=4242))
    back = ServingStatus.from_json(json.loads(json.dumps(srv.to_json())))
    assert back.held == HeldRun(run_id=12, profile="dsv41", pid=4242)
    assert srv.to_json()["held"] == {"run_id": 12, "profile": "dsv41", "pid": 4242}
    assert ServingStatus.from_json({"state": "stopped"}).held is None  # an older agent: no key
    assert ServingStatus.from_json({"state": "stopped", "held": None}).held is None
    assert ServingStatus().to_json()["held"] is None
    whole = Status(serving=srv)
    assert Status.from_json(json.loads(json.dumps(whole.to_json()))).serving.held == srv.held


@pytest.mark.parametrize("held", ["run 12", 12, True, False, "", [], [12, "dsv41", 4242], {"pid": "4242"},
                                  {"pid": 4242, "run_id": "12"}, {"pid": 4242, "profile": 7},
                                  {"pid": True}])
def test_a_held_value_of_another_type_is_refused_naming_the_field(held):
    with pytest.raises(RecordError, match="held|HeldRun"):
        ServingStatus.from_json({"state": "stopped", "held": held})


@pytest.mark.parametrize("pid, run_id", [(0, 0), (-1, -5), (2**22 + 1, 2**53), (2**64, 2**64),
                                         (float("nan"), float("inf"))])
def test_a_held_pid_or_run_out_of_range_is_not_read_as_one(pid, run_id):
    """A number that is no pid (0, negative, past the kernel's limit) or no run id is not named: `pid ?`, never
    `pid -1` for an operator to `kill`. The server is still said to be held."""
    held = ServingStatus.from_json({"state": "stopped", "held": {"pid": pid, "run_id": run_id, "profile": "p"}}).held
    assert held is not None and held.pid is None and held.run_id is None and held.profile == "p"


def test_a_held_pid_sent_as_a_whole_float_is_read():
    held = ServingStatus.from_json({"state": "stopped", "held": {"pid": 4242.0, "run_id": 12.0}}).held
    assert held == HeldRun(run_id=12, profile="", pid=4242)
    assert type(held.pid) is int and type(held.run_id) is int


# ---------------------------------------------------------------------------------------------- a real agent


async def _held_now(b, timeout: float, want) -> dict:
    """The status once `want(serving.held)` holds."""
    deadline = time.monotonic() + timeout
    while True:
        st = await b.status()
        if want(st["serving"].get("held")):
            return st
        assert time.monotonic() < deadline, f"held still {st['serving'].get('held')}: {st['serving']}"
        await asyncio.sleep(0.2)


async def test_a_held_server_is_in_the_status_until_the_stop_ends_it(tmp_path, cleanup, capsys):
    b, pid, run_id, token, family, since = await _ready_then_edited(tmp_path, cleanup, start_and_argv)
    st = await b.status()
    profile = json.loads((tmp_path / "state" / "serving.json").read_text())["profile"]
    assert st["serving"]["state"] == "stopped"
    assert st["serving"]["held"] == {"run_id": run_id, "profile": profile, "pid": pid}, st["serving"]
    # `lynxtop status` against the agent says it on a line of its own
    assert await asyncio.to_thread(main, ["status", "--socket", b.sock_path]) == 0
    out = capsys.readouterr().out
    held_lines = [line for line in out.splitlines() if line.startswith("held ")]
    assert len(held_lines) == 1, out
    assert f"run {run_id}" in held_lines[0] and f"pid {pid}" in held_lines[0] and "lynxtop stop" in held_lines[0]
    code, body = await b.api("POST", "/v1/stop", {})
    assert code == 202, body
    await _wait(lambda: _gone(family), 45, f"the held run's processes {family} still live after the stop")
    await _stopped(b)
    st = await b.status()
    assert st["serving"]["held"] is None, st["serving"]  # cleared by the stop, not only by a later check
    assert await asyncio.to_thread(main, ["status", "--socket", b.sock_path]) == 0
    assert not [line for line in capsys.readouterr().out.splitlines() if line.startswith("held ")]
    assert b.stop() == 0


async def test_a_held_server_ended_by_other_means_leaves_the_status(tmp_path, cleanup):
    """Killed by hand (kill -9 of its processes): the status stops naming it within the check's period, and the
    reason no longer says `lynxtop stop` ends it."""
    b, pid, run_id, token, family, since = await _ready_then_edited(tmp_path, cleanup, start_and_argv)
    st = await _held_now(b, 10, lambda h: h is not None and h["pid"] == pid)
    assert "`lynxtop stop` ends it" in st["serving"]["reason"]
    for p, _ in family:
        try:
            os.kill(p, signal.SIGKILL)
        except ProcessLookupError:
            pass
    await _wait(lambda: _gone(family), 30, f"{family} still alive after SIGKILL")
    t0 = time.monotonic()
    st = await _held_now(b, 30, lambda h: h is None)
    assert time.monotonic() - t0 < 20, "the held mark outlived its server by more than the check's period"
    assert st["serving"]["state"] == "stopped"
    assert "lynxtop stop` ends it" not in st["serving"]["reason"], st["serving"]["reason"]
    assert f"run {run_id}" in st["serving"]["reason"] and "ended" in st["serving"]["reason"], st["serving"]
    # nothing of the run was touched by the agent: its row is closed at the next agent's start, as before
    assert state_db(tmp_path, "SELECT ended_ms FROM runs WHERE id = ?", (run_id,))[0]["ended_ms"] is None
    assert b.stop() == 0
