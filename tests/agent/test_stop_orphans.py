"""Stopping a run the way vLLM needs it: the API server alone first (so it drains), then what it leaves behind;
orphans of a SIGKILLed server are named in an event and their /dev/shm and vllm_dist_* files removed.

Real processes throughout: the stand-in server (tests/agent/standin_vllm.py) with an engine child that maps a
real POSIX shared-memory segment and starts a real multiprocessing resource tracker, as vLLM's do.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import tempfile
import uuid
from pathlib import Path

import pytest

from lynxtop.agent.serving import procs
from lynxtop.agent.serving.runfiles import RunFiles, dist_files_in_log

pytestmark = pytest.mark.timeout(60)


def events(store, db_rows, kind: str) -> list[dict]:
    store.flush()
    rows = db_rows(store.path, "SELECT * FROM events WHERE kind = ? ORDER BY id", (kind,))
    for r in rows:
        r["details"] = json.loads(r["details"]) if r["details"] else {}
    return rows


def run_row(store, db_rows, run_id: int) -> dict:
    store.flush()
    return db_rows(store.path, "SELECT * FROM runs WHERE id = ?", (run_id,))[0]


async def start_ready(sup, h, profile: str = "alpha") -> None:
    await sup.start(profile, by="test")
    await h.wait_for(lambda: sup.state == "ready" and sup.action is None, 15, what="ready")


def siglog_lines(path: Path) -> list[tuple[float, str]]:
    out = []
    for line in path.read_text().splitlines():
        t, rest = line.split(" ", 1)
        out.append((float(t), rest))
    return out


def tree(leader: int) -> tuple[int, int | None]:
    """(engine pid, resource tracker pid or None) of a stand-in server, from /proc."""
    engine = tracker = None
    for pid in procs.run_processes(None, os.getpgid(leader), [leader]):
        args = " ".join(procs.cmdline(pid) or [])
        if "--engine" in args:
            engine = pid
        elif "resource_tracker" in args:
            tracker = pid
    assert engine is not None, "the stand-in has no engine child"
    return engine, tracker


async def test_stop_terms_the_api_server_alone_and_the_rest_only_after_it_exited(make_sup, store, h, tmp_path,
                                                                                 monkeypatch):
    siglog = tmp_path / "signals.log"
    monkeypatch.setenv("STANDIN_MODE", "drain")  # drains 0.6 s, exits 0 and leaves its engine behind
    monkeypatch.setenv("STANDIN_DRAIN_S", "0.6")
    monkeypatch.setenv("STANDIN_SIGLOG", str(siglog))
    sup = make_sup()
    await start_ready(sup, h)
    leader, run_id = sup.proc.pid, sup.run_id
    engine, _ = tree(leader)
    await sup.stop(by="test")
    await h.wait_for(lambda: sup.state == "stopped" and sup.action is None, 15, what="stopped")
    lines = siglog_lines(siglog)
    kinds = [rest.split(" ", 2)[0] + " " + rest.split(" ")[2] for _, rest in lines]
    # the API server got SIGTERM and finished its drain before anything else of the run was signalled
    assert kinds[:3] == ["leader SIGTERM", "leader exit", "engine SIGTERM"], lines
    t_exit = lines[1][0]
    engine_terms = [(t, rest) for t, rest in lines if rest.startswith(f"engine {engine} SIGTERM")]
    assert len(engine_terms) == 1 and engine_terms[0][0] >= t_exit, lines
    assert engine_terms[0][1].endswith(f"from {os.getpid()}"), lines  # sent by the agent (this process)
    assert run_row(store, h.db_rows, run_id)["exit_code"] == 0  # drained and exited by itself: no SIGKILL
    assert not procs.alive(engine)
    # the engine it left behind is named, with what it took to stop it
    orphans = events(store, h.db_rows, "serving.orphans")
    assert len(orphans) == 1 and orphans[0]["severity"] == "warning", orphans
    assert orphans[0]["details"]["orphans"][0]["pid"] == engine
    assert orphans[0]["details"]["orphans"][0]["ended_by"] == "SIGTERM"
    assert f"{engine} " in orphans[0]["message"] and "(SIGTERM)" in orphans[0]["message"]
    await sup.shutdown(stop_serving=True)


async def test_a_server_that_stops_its_engine_gives_no_orphan_event(make_sup, store, h):
    sup = make_sup()
    await start_ready(sup, h)
    members = sup.proc.members()
    await sup.stop(by="test")
    await h.wait_for(lambda: sup.state == "stopped" and sup.action is None, 15, what="stopped")
    assert all(not procs.alive(p) for p in members)
    assert not events(store, h.db_rows, "serving.orphans")
    exited = events(store, h.db_rows, "serving.exited")[0]
    assert set(members) <= set(exited["details"]["pids"]) and exited["details"]["removed"] == []
    await sup.shutdown(stop_serving=True)


@pytest.fixture
def made(tmp_path):
    """Every shm/dist file a test made, or any stand-in run of the test logged: removed afterwards, whatever the
    test's outcome (a failed assertion must not leave segments in the machine's /dev/shm)."""
    paths: list[Path] = []
    yield paths
    for log in (tmp_path / "state" / "logs").glob("*.log"):
        with contextlib.suppress(StopIteration, ValueError):
            _run_files(str(log), paths)
    for p in paths:
        p.unlink(missing_ok=True)


def _decoys(made: list[Path]) -> tuple[Path, Path]:
    """A psm_ segment and a vllm_dist_ file of 'another run': same uid, same names, not in our run's maps/log."""
    shm = Path(f"/dev/shm/psm_{uuid.uuid4().hex[:8]}")
    dist = Path(tempfile.gettempdir()) / f"vllm_dist_{uuid.uuid4().hex}"
    for p in (shm, dist):
        os.close(os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
        made.append(p)
    return shm, dist


def _run_files(log_path: str, made: list[Path]) -> tuple[Path, Path]:
    text = Path(log_path).read_text()
    shm = Path(next(line.split()[-1] for line in text.splitlines() if "engine shm /dev/shm/psm_" in line))
    (dist,) = (Path(p) for p in dist_files_in_log(log_path))
    made.extend((shm, dist))
    return shm, dist


@pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="needs /dev/shm (POSIX shared memory)")
async def test_sigkilled_server_orphans_are_named_stopped_and_their_files_removed(make_sup, store, h, tmp_path,
                                                                                   monkeypatch, made):
    siglog = tmp_path / "signals.log"
    for var, value in (("STANDIN_SHM", "1"), ("STANDIN_DIST", "1"), ("STANDIN_ENGINE_IGNORE_TERM", "1"),
                       ("STANDIN_SIGLOG", str(siglog))):
        monkeypatch.setenv(var, value)
    sup = make_sup(profiles=h.standin_profile("alpha", stop_grace_s=1))
    decoy_shm, decoy_dist = _decoys(made)
    await start_ready(sup, h)
    leader, run_id, log_path = sup.proc.pid, sup.run_id, sup.proc.record.log_path
    engine, tracker = tree(leader)
    assert tracker is not None, "the engine's multiprocessing resource tracker did not start"
    shm, dist = _run_files(log_path, made)
    assert shm.exists() and dist.exists()
    assert str(shm) in procs.shm_segments(engine)

    os.kill(leader, signal.SIGKILL)  # the engine and the tracker outlive it, as vLLM's do
    await h.wait_for(lambda: sup.state == "ready" and sup.run_id != run_id, 20, what="restarted")

    assert not procs.alive(engine) and not procs.alive(tracker)
    assert not shm.exists() and not dist.exists(), "the killed run's files were left behind"
    assert decoy_shm.exists() and decoy_dist.exists(), "another run's files were removed"
    (ev,) = [e for e in events(store, h.db_rows, "serving.orphans") if e["run_id"] == run_id]
    assert ev["severity"] == "warning"
    by_pid = {o["pid"]: o for o in ev["details"]["orphans"]}
    assert {engine, tracker} <= set(by_pid) and {engine, tracker} <= set(ev["details"]["pids"])
    assert by_pid[engine]["ended_by"] == "SIGKILL"  # it ignored the SIGTERM it got first
    assert "--engine" in by_pid[engine]["title"] and "resource_tracker" in by_pid[tracker]["title"]
    assert f"{engine} " in ev["message"] and f"{tracker} " in ev["message"] and "already gone" in ev["message"]
    assert sorted(ev["details"]["removed"]) == sorted([str(shm), str(dist)])
    assert str(shm) in ev["message"] and str(dist) in ev["message"]
    terms = [rest for _, rest in siglog_lines(siglog) if rest.startswith(f"engine {engine} SIGTERM")]
    assert terms == [f"engine {engine} SIGTERM from {os.getpid()}"]
    assert run_row(store, h.db_rows, run_id)["exit_signal"] == signal.SIGKILL

    # an operator's stop of the new run (its engine needs SIGKILL too) also leaves no file behind
    new_shm, new_dist = _run_files(sup.proc.record.log_path, made)
    assert new_shm.exists() and new_dist.exists()
    await sup.stop(by="test")
    await h.wait_for(lambda: sup.state == "stopped" and sup.action is None, 15, what="stopped")
    assert not new_shm.exists() and not new_dist.exists()
    exited = [e for e in events(store, h.db_rows, "serving.exited") if e["run_id"] == sup.run_id][0]
    assert sorted(exited["details"]["removed"]) == sorted([str(new_shm), str(new_dist)])
    assert decoy_shm.exists() and decoy_dist.exists()
    await sup.shutdown(stop_serving=True)


@pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="needs /dev/shm (POSIX shared memory)")
async def test_a_run_killed_as_a_whole_still_has_its_files_removed(make_sup, store, h, monkeypatch, made):
    # no process is left whose /proc/<pid>/maps could be read at stop time: the segments seen at readiness count
    monkeypatch.setenv("STANDIN_SHM", "1")
    monkeypatch.setenv("STANDIN_DIST", "1")
    sup = make_sup()
    decoy_shm, decoy_dist = _decoys(made)
    await start_ready(sup, h)
    run_id, pgid = sup.run_id, sup.proc.record.pgid
    members = sup.proc.members()
    shm, dist = _run_files(sup.proc.record.log_path, made)
    assert shm.exists() and dist.exists()
    os.killpg(pgid, signal.SIGKILL)  # e.g. the OOM killer, or `kill -9 -PGID` by hand
    await h.wait_for(lambda: run_id in {e["run_id"] for e in events(store, h.db_rows, "serving.cleanup")}, 15,
                     what="clean-up event")
    assert all(not procs.alive(p) for p in members)
    assert not shm.exists() and not dist.exists()
    assert decoy_shm.exists() and decoy_dist.exists()
    (ev,) = [e for e in events(store, h.db_rows, "serving.cleanup") if e["run_id"] == run_id]
    assert sorted(ev["details"]["removed"]) == sorted([str(shm), str(dist)]) and str(shm) in ev["message"]
    assert not [e for e in events(store, h.db_rows, "serving.orphans") if e["run_id"] == run_id]
    await sup.shutdown(stop_serving=True)


@pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="needs /dev/shm (POSIX shared memory)")
async def test_files_of_a_run_that_died_while_the_agent_was_down_are_removed(make_sup, store, h, monkeypatch,
                                                                              made):
    monkeypatch.setenv("STANDIN_SHM", "1")
    monkeypatch.setenv("STANDIN_DIST", "1")
    a = make_sup()
    decoy_shm, decoy_dist = _decoys(made)
    await start_ready(a, h)
    shm, dist = _run_files(a.proc.record.log_path, made)
    pgid, run_id = a.proc.record.pgid, a.run_id
    assert json.loads(a.state_path.read_text())["shm_segments"] == [str(shm)]
    await a.shutdown(stop_serving=False)  # live restore: the agent goes, serving stays...
    os.killpg(pgid, signal.SIGKILL)  # ...and then dies as a whole while no agent watches
    await h.wait_for(lambda: not procs.run_processes(None, pgid), 10, what="the run to be gone")
    assert shm.exists() and dist.exists()
    b = make_sup()
    assert not await b.adopt_previous()
    assert not shm.exists() and not dist.exists()
    assert decoy_shm.exists() and decoy_dist.exists()
    (ev,) = events(store, h.db_rows, "serving.not_adopted")
    assert sorted(ev["details"]["removed"]) == sorted([str(shm), str(dist)]) and str(dist) in ev["message"]
    assert f"previous run {run_id}" in ev["message"]
    await b.shutdown(stop_serving=True)


def test_run_files_are_only_removed_when_still_the_runs_regular_files(tmp_path):
    mine = tmp_path / "vllm_dist_aa"
    other = tmp_path / "vllm_dist_bb"
    link = tmp_path / "vllm_dist_cc"
    target = tmp_path / "precious"
    for p in (mine, other, target):
        p.write_text("x")
    link.symlink_to(target)
    me = os.getuid()
    files = RunFiles(paths={str(mine): me, str(other): me + 1, str(link): me, str(tmp_path / "gone"): me})
    removed, refused = files.remove()
    assert removed == [str(mine)] and not mine.exists()
    assert other.exists() and any(str(other) in r and f"uid {me + 1}" in r for r in refused)
    assert link.is_symlink() and target.exists() and any("not a regular file" in r for r in refused)
    assert len(refused) == 2  # a file already gone is no problem (vLLM cleaned it up)


def test_dist_file_names_come_only_from_the_logs_own_line(tmp_path):
    log = tmp_path / "run.log"
    log.write_text(
        "(Worker pid=7) INFO distributed_init_method=file:///tmp/vllm_dist_0123abcd backend=gloo\n"
        "(Worker pid=8) INFO distributed_init_method=file:///tmp/../etc/vllm_dist_ff backend=gloo\n"
        "INFO something else file:///tmp/vllm_dist_99 without the key\n")
    assert dist_files_in_log(log) == {"/tmp/vllm_dist_0123abcd"}
    assert dist_files_in_log(tmp_path / "missing.log") == set()
