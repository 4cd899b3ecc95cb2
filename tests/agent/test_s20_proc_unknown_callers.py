"""/proc that cannot be listed (the agent out of descriptors) is "unknown", never "no process" (procs.ProcUnreadable):
the callers that acted on an empty listing do nothing destructive and try again later (session 20).

- The node's process table keeps its last look: the host tick's vLLM tree and the run's member look go on reading
  the processes as alive (which refuses a start, never kills), where the listing's error failed the tick.
- A previous run found dead at the agent's start keeps its record when its leftovers cannot be looked for: it
  was SIGKILL-swept by an empty look (nothing killed, the record removed: the next agent knew nothing of them).

Real processes and a real store; the listing's failure is raised by `all_pids` itself (its real EMFILE path is
tests/agent/test_s20_stop_unknown_procs.py)."""

from __future__ import annotations

import json
import os
import signal
import traceback

import pytest

from lynxtop.agent.serving import procs
from lynxtop.agent.serving.proctable import ProcTable

pytestmark = pytest.mark.timeout(60)


def _unlistable(*_a, **_k):
    raise procs.ProcUnreadable("cannot list /proc: out of file descriptors (test)")


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_the_process_table_keeps_its_last_look_while_proc_cannot_be_listed(monkeypatch):
    clock = Clock()
    table = ProcTable(clock=clock)
    first = table.look()
    assert os.getpid() in first
    clock.t += 10  # past reuse: a new listing is due
    monkeypatch.setattr(procs, "all_pids", _unlistable)
    assert table.look() == first  # was: ProcUnreadable out of the host tick
    monkeypatch.undo()
    clock.t += 10
    assert os.getpid() in table.look()


async def test_a_dead_run_whose_leftovers_cannot_be_looked_for_keeps_its_record(make_sup, store, h, monkeypatch):
    a = make_sup()
    await a.start("alpha", by="test")
    await h.wait_for(lambda: a.state == "ready" and a.action is None, 15, what="ready")
    pgid, run_id = a.proc.record.pgid, a.run_id
    await a.shutdown(stop_serving=False)  # live restore: the agent goes, serving stays...
    os.killpg(pgid, signal.SIGKILL)  # ...and dies while no agent watches
    await h.wait_for(lambda: not procs.run_processes(None, pgid), 10, what="the run to be gone")
    b = make_sup()
    real = procs.all_pids
    calls = []

    def unlistable_for_leftovers():
        if any(f.name in ("kill_leftovers", "leftovers") for f in traceback.extract_stack()):
            calls.append(1)
            _unlistable()
        return real()

    monkeypatch.setattr(procs, "all_pids", unlistable_for_leftovers)
    assert not await b.adopt_previous()
    assert calls  # the leftovers' look was the one refused
    assert b.state_path.exists(), "the record of a run whose processes could not be looked for was removed"
    store.flush()
    rows = h.db_rows(store.path, "SELECT * FROM events WHERE kind = 'serving.not_adopted' ORDER BY id")
    (ev,) = rows
    assert "cannot be looked for" in ev["message"] and json.loads(ev["details"])["kept"] is True
    assert f"previous run {run_id}" in ev["message"]
    monkeypatch.undo()
    await b.shutdown(stop_serving=True)
