"""Whoever answers on the profile's port is not necessarily the server just started (issue 24.4).

After `rm -rf` of the state directory a restarted agent cannot adopt the server the previous one left, and a
readiness that believed any 200 on /health made the orphan's answer the new run's. Now a start is refused while
another process listens on the port (naming its pid), and readiness is only reached when a process of the run
holds the listening socket. Also here: a second agent whose database path is a symlink to the live one, and the
state file retried after a full disk. Real processes and sockets throughout.
"""

from __future__ import annotations

import asyncio
import http.server
import json
import os
import shutil
import signal
import socket
import threading
from pathlib import Path

import pytest
from support.agent_proc import Agent, e2e_config, sim_processes
from support.db import db_rows
from support.small_fs import fill, mounted

from lynxtop.agent.api.control import ActionError
from lynxtop.agent.serving import launcher, procs

pytestmark = pytest.mark.timeout(120)


class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        body = b'{"version": "0.0-foreign"}'
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


def foreign_server(port: int) -> http.server.ThreadingHTTPServer:
    """A server of someone else (this test process) answering 200 on every path of `port`."""
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", port), Health)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv


def events(store, kind: str) -> list[dict]:
    assert store.flush(10)
    rows = db_rows(store.path, "SELECT * FROM events WHERE kind = ? ORDER BY id", (kind,))
    for r in rows:
        r["details"] = json.loads(r["details"]) if r["details"] else {}
    return rows


async def test_start_is_refused_while_another_process_holds_the_port(make_sup, store):
    sup = make_sup()
    port = sup.cfg.profile("alpha").port
    srv = foreign_server(port)
    try:
        with pytest.raises(ActionError) as err:
            await sup.start("alpha", by="test")
        assert err.value.code == "port_in_use" and err.value.http_status == 409
        assert f"port {port} is already in use" in err.value.message
        assert f"pid {os.getpid()}" in err.value.message, err.value.message
        assert err.value.details["pids"] == [os.getpid()]
        assert sup.proc is None and sup.state == "stopped"  # nothing was started
    finally:
        srv.shutdown()
        srv.server_close()


async def test_readiness_is_not_an_answer_from_another_process(make_sup, store, h, monkeypatch):
    """The port is free at the start; a foreign server takes it while the run loads. Its 200 on /health does not
    make the run ready; the run, unable to bind, fails; once the port is free again the retry gets ready."""
    monkeypatch.setenv("STANDIN_STARTUP_S", "2")
    sup = make_sup()
    port = sup.cfg.profile("alpha").port
    await sup.start("alpha", by="test")
    await h.wait_for(lambda: sup.proc is not None and sup.run_id is not None, 10, what="run started")
    first = sup.run_id
    srv = foreign_server(port)
    try:
        await h.wait_for(lambda: events(store, "serving.port_in_use"), 15, what="the foreign answer noticed")
        ev = events(store, "serving.port_in_use")[0]
        assert ev["run_id"] == first and ev["details"]["pids"] == [os.getpid()], ev
        assert "answered, but not from this run" in ev["message"] and f"pid {os.getpid()}" in ev["message"]
        assert sup.state == "starting" and sup.run_id == first
        await h.wait_for(lambda: sup.run_id != first or sup.state in ("backoff", "stopped", "crash-loop"), 20,
                         what="the run that could not bind has failed")
        assert h.db_rows(store.path, "SELECT ready_ms FROM runs WHERE id = ?", (first,))[0]["ready_ms"] is None
    finally:
        srv.shutdown()
        srv.server_close()
    await h.wait_for(lambda: sup.state == "ready", 30, what="ready once the port is its own")
    assert sup.run_id != first
    ours, _ = procs.listener_is_ours(port, sup.proc.members())
    assert ours is True
    await sup.shutdown(stop_serving=True)


@pytest.fixture
def small_fs(tmp_path):
    """A 1m tmpfs (support/small_fs.py)."""
    with mounted(tmp_path / "small", "1m") as mnt:
        yield mnt


async def test_state_file_is_written_once_space_returns(make_sup, store, h, small_fs):
    """serving.json could not be written at the start (full disk): it is retried while the run lives, so a
    restarted agent can adopt the run once space came back, with no transition needed."""
    sup = make_sup(state_path=small_fs / "serving.json")
    filler = fill(small_fs)
    await sup.start("alpha", by="test")
    await h.wait_for(lambda: sup.state == "ready" and sup.action is None, 15, what="ready on a full disk")
    assert launcher.read_record(sup.state_path) == (None, None)
    warned = events(store, "agent.state_file")
    assert len(warned) == 1 and "retrying" in warned[0]["message"], warned  # one event, not one per retry
    filler.unlink()
    await h.wait_for(lambda: launcher.read_record(sup.state_path)[0] is not None, 15, what="serving.json written")
    record, _ = launcher.read_record(sup.state_path)
    assert record.pid == sup.proc.pid and record.ready_ms is not None and record.run_id == sup.run_id
    await h.wait_for(lambda: len(events(store, "agent.state_file")) == 2, 30, what="the written-again event")
    await sup.shutdown(stop_serving=False)
    other = make_sup(state_path=sup.state_path)  # the agent restarted: it adopts the run
    assert await other.adopt_previous()
    assert other.proc.pid == record.pid
    await other.shutdown(stop_serving=True)


async def test_agent_restarted_after_its_state_dir_was_removed_starts_no_second_server(tmp_path, cleanup):
    cfg = e2e_config(tmp_path)
    a = Agent(tmp_path, cfg)
    cleanup.append(a)
    st = await a.wait_state(lambda s: s["state"] == "ready", what="ready")
    orphan = st["serving"]["pid"]
    left = set(sim_processes(tmp_path / "sim-state"))  # the server and its engines
    assert orphan in left
    a.stop(signal.SIGKILL)
    shutil.rmtree(tmp_path / "state")  # the database, serving.json and the run logs
    (tmp_path / "run" / "agent.serving.json").unlink()  # and its copy: nothing tells the next agent of the run
    assert procs.alive(orphan)
    b = Agent(tmp_path, cfg, name="agent2")
    cleanup.append(b)
    await b.wait_notify("READY=1")
    evs: list = []
    deadline = asyncio.get_running_loop().time() + 30  # the autostart's checks run later on a loaded machine
    while asyncio.get_running_loop().time() < deadline:
        evs = (await b.api("GET", "/v1/events?since=0&limit=1000"))[1].get("events", [])
        if any(e["kind"] == "agent.autostart_failed" for e in evs):
            break
        await asyncio.sleep(0.05)
    failed = [e for e in evs if e["kind"] == "agent.autostart_failed"]
    assert failed and f"pid {orphan}" in failed[0]["message"], evs
    assert "already in use" in failed[0]["message"]
    st = await b.status()
    assert st["serving"]["state"] == "stopped" and st["serving"]["pid"] is None, st["serving"]
    assert set(sim_processes(tmp_path / "sim-state")) == left  # no second vLLM on the same GPUs and port
    b.stop()


async def test_second_agent_with_a_symlink_to_the_live_database_is_refused(tmp_path, cleanup):
    cfg = e2e_config(tmp_path, autostart=False)
    a = Agent(tmp_path, cfg)
    cleanup.append(a)
    await a.wait_notify("READY=1")
    other = tmp_path / "other"
    other.mkdir()
    (other / "lynxtop.db").symlink_to(tmp_path / "state" / "lynxtop.db")
    cfg2 = tmp_path / "config2.toml"
    cfg2.write_text(cfg.read_text().replace(str(tmp_path / "state" / "lynxtop.db"), str(other / "lynxtop.db"))
                    .replace(str(tmp_path / "run" / "agent.sock"), str(tmp_path / "run" / "agent2.sock")))
    b = Agent(tmp_path, cfg2, name="agent2", sock=tmp_path / "run" / "agent2.sock")
    cleanup.append(b)
    rc = b.proc.wait(30)
    out = b.output()
    assert rc != 0, out
    assert f"locked by pid {a.proc.pid}" in out and f"reached through {other / 'lynxtop.db'}" in out, out
    assert "Traceback" not in out, out
    assert (await a.status())["agent"]["healthy"]  # the first agent is untouched
    a.stop()


async def events_of(agent: Agent, kind: str) -> list[dict]:
    evs = (await agent.api("GET", "/v1/events?since=0&limit=1000"))[1].get("events", [])
    return [e for e in evs if e["kind"] == kind]


def answers(path: Path) -> bool:
    with socket.socket(socket.AF_UNIX) as c:
        try:
            c.connect(str(path))
        except OSError:
            return False
    return True


async def wait_socket(path: Path, what: str) -> None:
    """Until something listens on `path` again: the agent's maintenance pass re-created its socket."""
    for _ in range(300):
        if answers(path):
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"{path} not re-created: {what}")


async def test_control_socket_removed_or_replaced_is_bound_again(tmp_path, cleanup):
    cfg = e2e_config(tmp_path, autostart=False)
    a = Agent(tmp_path, cfg)
    cleanup.append(a)
    await a.wait_notify("READY=1")
    sock = Path(a.sock_path)
    shutil.rmtree(sock.parent)  # a tmpfiles clean of /run: the directory and the socket in it
    await wait_socket(sock, "after the directory was removed")
    assert (await a.status())["agent"]["pid"] == a.proc.pid  # `lynxtop` reaches the agent again
    sock.unlink()
    dead = socket.socket(socket.AF_UNIX)  # replaced by a socket nobody listens on any more
    dead.bind(str(sock))
    dead.close()
    assert not answers(sock)
    await wait_socket(sock, "after it was replaced by a dead socket")
    assert (await a.status())["agent"]["pid"] == a.proc.pid
    rebound = await events_of(a, "agent.socket_recreated")
    assert len(rebound) == 2, rebound
    assert "was removed" in rebound[0]["message"] and "replaced by another file" in rebound[1]["message"]
    # a regular file in its place is not ours to remove: reported once, left as it is
    sock.unlink()
    sock.write_text("someone's file\n")
    for _ in range(300):
        if a.proc.poll() is not None or "not re-created" in a.output():
            break
        await asyncio.sleep(0.05)
    assert "not re-created" in a.output() and "is not a socket" in a.output(), a.output()
    assert sock.read_text() == "someone's file\n"
    sock.unlink()  # gone again: re-created, and the agent still answers
    await wait_socket(sock, "after the file was removed")
    lost = await events_of(a, "agent.socket_lost")
    assert len(lost) == 1 and "is not a socket" in lost[0]["message"], lost
    a.stop()
