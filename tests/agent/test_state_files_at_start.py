"""A real agent started on a state directory holding what no agent wrote: a switch note with a non-finite or
dateless time (every start exited with a traceback, the live model unsupervised), FIFOs in place of the notes read
at start (the start blocked forever before READY), agent.lock as a symlink to a file the service user must not
touch. The agent starts, says what it ignored, adopts or autostarts; or, for the lock, refuses with a message and
leaves the target untouched. Real agents, simulated vLLM, real files."""

from __future__ import annotations

import asyncio
import os
import time

import pytest
from support.agent_proc import Agent, e2e_config, state_db

from lynxtop.agent.serving import procs

pytestmark = pytest.mark.timeout(120)


async def _events(tmp_path, kind: str, n: int = 1, timeout: float = 10) -> list[dict]:
    deadline = time.monotonic() + timeout
    while len(ev := state_db(tmp_path, "SELECT * FROM events WHERE kind = ?", (kind,))) < n:
        assert time.monotonic() < deadline, f"no {kind} event"
        await asyncio.sleep(0.1)
    return ev


@pytest.mark.parametrize("since, words", [
    ("1e999", "the number 1e999 is not finite"), ("-1e999", "the number -1e999 is not finite"),
    ("1e300", '"since_ms" is 1e+300, not an integer'),  # finite, but no date: clock() raised OverflowError
])
async def test_a_switch_note_no_agent_wrote_is_reported_and_the_run_is_adopted(tmp_path, cleanup, since, words):
    cfg = e2e_config(tmp_path)
    a = Agent(tmp_path, cfg, "a1")
    cleanup.append(a)
    st = await a.wait_state(lambda s: s["state"] == "ready", what="ready")
    pid, run_id = st["serving"]["pid"], st["serving"]["run_id"]
    assert a.stop() == 0  # live restore: the server keeps serving
    note = tmp_path / "state" / "switch.json"
    note.write_text('{"action": "switch", "profile": "v4-tp4", "from": "v4-tp8", "run": 1, "by": "x", '
                    f'"since_ms": {since}}}')
    b = Agent(tmp_path, cfg, "a2")
    cleanup.append(b)
    st = await b.wait_state(lambda s: s["state"] == "ready", what="the run adopted")
    assert (st["serving"]["pid"], st["serving"]["run_id"], st["serving"]["profile"]) == (pid, run_id, "v4-tp8")
    ev = await _events(tmp_path, "agent.state_file")
    assert len(ev) == 1 and str(note) in ev[0]["message"] and words in ev[0]["message"], ev
    assert "not finished" in ev[0]["message"] and "Traceback" not in b.output()
    assert not note.exists()  # said once: the next start does not trip on it
    assert not state_db(tmp_path, "SELECT * FROM events WHERE kind = 'action.switch.interrupted'")
    assert b.stop() == 0 and procs.alive(pid)


async def test_fifos_in_place_of_the_notes_read_at_start_do_not_hold_the_start(tmp_path, cleanup):
    state = tmp_path / "state"
    state.mkdir()
    fifos = [state / n for n in ("crash-loop.json", "readiness-timeouts.json", "switch.json")]
    for f in fifos:
        os.mkfifo(f)
    a = Agent(tmp_path, e2e_config(tmp_path), "a1")
    cleanup.append(a)
    try:
        st = await a.wait_state(lambda s: s["state"] == "ready", what="autostarted despite the FIFOs")
    finally:
        for f in fifos:  # a blocked agent (the old code) is released, so the test ends
            if f.exists():
                os.close(os.open(f, os.O_RDWR | os.O_NONBLOCK))
    assert st["serving"]["profile"] == "v4-tp8"
    out = (tmp_path / "a1.log").read_text()
    assert f"{state / 'crash-loop.json'}: it is a FIFO (named pipe)" in out
    assert f"{state / 'readiness-timeouts.json'}: it is a FIFO (named pipe)" in out
    ev = await _events(tmp_path, "agent.state_file")
    assert any(str(state / "switch.json") in e["message"] and "FIFO" in e["message"] for e in ev), ev
    assert a.stop() == 0


async def test_an_agent_lock_symlink_is_refused_and_its_target_left_alone(tmp_path, cleanup):
    state = tmp_path / "state"
    state.mkdir()
    victim = tmp_path / "shadow"  # as root: /etc/shadow, planted by the service user (vLLM's user)
    victim.write_text("root:$6$secret:19000:0:99999:7:::\n")
    (state / "agent.lock").symlink_to(victim)
    a = Agent(tmp_path, e2e_config(tmp_path), "a1")
    cleanup.append(a)
    rc = a.proc.wait(60)
    out = a.output()
    assert rc == 1, out
    assert f"{state / 'agent.lock'} is a symbolic link, not a regular file: not used" in out
    assert f"rm {state / 'agent.lock'}" in out and "Traceback" not in out
    assert victim.read_text() == "root:$6$secret:19000:0:99999:7:::\n"
    assert sorted(p.name for p in state.iterdir()) == ["agent.lock"]  # nothing opened before the lock
    a.stop()
