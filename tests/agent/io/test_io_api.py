"""The control API on a real unix socket with a fake controller: routes, every bad input, permissions, peers."""

from __future__ import annotations

import asyncio
import grp
import json
import os
import socket
import stat
from pathlib import Path

import aiohttp
import pytest
from agent_io_helpers import FakeController

from lynxtop.agent.api.routes import ApiServer, ApiStartError

TEST_GROUP = "users"  # a group that exists on Debian; the agent's operators' group in these tests


@pytest.fixture
async def api(sock_dir):
    ctl = FakeController()
    logs: list[str] = []
    server = ApiServer(ctl, sock_dir / "agent.sock", group=TEST_GROUP, log=logs.append)
    await server.start()
    session = aiohttp.ClientSession(connector=aiohttp.UnixConnector(path=str(sock_dir / "agent.sock")))

    async def call(method: str, path: str, **kw) -> tuple[int, dict]:
        async with session.request(method, "http://agent" + path, **kw) as resp:
            return resp.status, await resp.json(content_type=None)

    yield call, ctl, logs, server
    await session.close()
    await server.stop()


async def test_socket_mode_group_and_cleanup(api, sock_dir):
    _, _, logs, server = api
    st = (sock_dir / "agent.sock").stat()
    assert stat.S_ISSOCK(st.st_mode)
    assert stat.S_IMODE(st.st_mode) == 0o660
    assert st.st_gid == grp.getgrnam(TEST_GROUP).gr_gid
    assert any("listening on" in line for line in logs)
    assert [p.name for p in sock_dir.iterdir()] == ["agent.sock"]  # no temporary name left behind
    await server.stop()
    assert not (sock_dir / "agent.sock").exists()


async def test_read_only_calls(api):
    call, ctl, _, _ = api
    code, body = await call("GET", "/v1/status")
    assert code == 200 and body["serving"]["state"] == "ready" and len(body["gpus"]) == 8
    code, body = await call("GET", "/v1/profiles")
    assert code == 200 and [p["name"] for p in body["profiles"]] == ["tp8", "tp8-fp8kv"]
    code, body = await call("GET", "/v1/runs?limit=3")
    assert code == 200 and [r["id"] for r in body["runs"]] == [7, 6, 5]
    code, body = await call("GET", "/v1/events?since=2000&limit=2")  # an async controller method works too
    assert code == 200 and [e["id"] for e in body["events"]] == [3, 4]
    code, body = await call("GET", "/v1/logs?lines=3")
    assert code == 200 and body["run_id"] == 7 and body["lines"] == ["line 0", "line 1", "line 2"]
    code, body = await call("GET", "/v1/logs?run=99")
    assert code == 404 and body["error"] == "unknown_run"


@pytest.mark.parametrize(("path", "code", "error"), [
    ("/v1/runs?limit=abc", 400, "wrong_type"),
    ("/v1/runs?limit=0", 400, "out_of_range"),
    ("/v1/runs?limit=99999999", 400, "out_of_range"),
    ("/v1/events?since=-5", 400, "out_of_range"),
    ("/v1/events?sinse=5", 400, "unknown_parameter"),
    ("/v1/status?verbose=1", 400, "unknown_parameter"),
    ("/v1/nope", 404, "not_found"),
    ("/v1/stop", 405, "method_not_allowed"),
])
async def test_bad_read_requests(api, path, code, error):
    call, ctl, _, _ = api
    got, body = await call("GET", path)
    assert (got, body["error"]) == (code, error)
    assert body["message"]


async def test_mutating_calls_accepted_and_logged(api):
    call, ctl, logs, _ = api
    ctl.serving["state"] = "stopped"
    code, body = await call("POST", "/v1/start", json={"profile": "tp8-fp8kv"})
    assert code == 202 and body == {"accepted": True, "action": "start", "message": "start accepted"}
    code, body = await call("POST", "/v1/stop", data=b"")  # an empty body is {}
    assert code == 202
    code, _ = await call("POST", "/v1/restart", json={})
    assert code == 202
    code, _ = await call("POST", "/v1/switch", json={"profile": "tp8"})
    assert code == 202
    assert [(a, p) for a, p, _ in ctl.calls] == [("start", "tp8-fp8kv"), ("stop", None), ("restart", None),
                                                 ("switch", "tp8")]
    by = ctl.calls[0][2]
    assert by.startswith(f"uid {os.getuid()} (") and f"pid {os.getpid()}" in by
    assert sum("accepted:" in line and by in line for line in logs) == 4


@pytest.mark.parametrize(("path", "kw", "code", "error"), [
    ("/v1/stop", {"data": b"{not json"}, 400, "invalid_json"),
    ("/v1/stop", {"data": b"\xff\xfe"}, 400, "invalid_json"),
    ("/v1/stop", {"json": []}, 400, "wrong_type"),
    ("/v1/stop", {"json": "stop"}, 400, "wrong_type"),
    ("/v1/stop", {"json": {"force": True}}, 400, "unknown_field"),
    ("/v1/start", {"json": {"profile": "tp8", "extra": 1}}, 400, "unknown_field"),
    ("/v1/start", {"json": {"profile": 5}}, 400, "wrong_type"),
    ("/v1/start", {"json": {"profile": True}}, 400, "wrong_type"),
    ("/v1/start", {"json": {"profile": "nope"}}, 404, "unknown_profile"),
    ("/v1/switch", {"json": {}}, 400, "missing_field"),
    ("/v1/switch", {"json": {"profile": ""}}, 400, "wrong_type"),
    ("/v1/switch", {"json": {"profile": ["tp8"]}}, 400, "wrong_type"),
    ("/v1/switch", {"json": {"profile": "does-not-exist"}}, 404, "unknown_profile"),
    ("/v1/switch", {"data": b"x" * (64 * 1024 + 1)}, 413, "too_large"),
    ("/v1/switch", {"data": b'{"profile": "' + b"a" * (70 * 1024) + b'"}'}, 413, "too_large"),
    ("/v1/start/now", {"json": {}}, 404, "not_found"),
])
async def test_bad_mutating_requests_change_nothing(api, path, kw, code, error):
    call, ctl, _, _ = api
    ctl.serving["state"] = "stopped"
    got, body = await call("POST", path, **kw)
    assert (got, body["error"]) == (code, error), body
    assert body["message"]
    assert ctl.calls == []
    if error == "unknown_profile":
        assert "tp8" in body["message"]  # names the profiles that do exist


async def test_oversized_chunked_body_is_refused(api):
    call, ctl, _, _ = api

    async def chunks():
        for _ in range(80):
            yield b"x" * 1024

    got, body = await call("POST", "/v1/stop", data=chunks())
    assert (got, body["error"]) == (413, "too_large")
    assert ctl.calls == []


async def test_busy_preflight_state_and_controller_bug(api):
    call, ctl, logs, _ = api
    ctl.busy = "switch to tp8-fp8kv"
    code, body = await call("POST", "/v1/restart", json={})
    assert (code, body["error"]) == (409, "busy") and "switch to tp8-fp8kv" in body["message"]
    assert any("refused:" in line and "busy" in line for line in logs)
    ctl.busy = None
    ctl.preflight_fail = ["executable /opt/vllm/bin/vllm not found", "profile needs 8 GPUs, 4 visible"]
    code, body = await call("POST", "/v1/switch", json={"profile": "tp8-fp8kv"})
    assert (code, body["error"]) == (422, "preflight_failed")
    assert body["details"]["reasons"] == ctl.preflight_fail
    code, body = await call("POST", "/v1/start", json={})
    assert (code, body["error"]) == (409, "already_running")
    ctl.boom = True
    code, body = await call("POST", "/v1/stop", json={})
    assert (code, body["error"]) == (500, "internal") and "controller bug" in body["message"]
    assert any("RuntimeError" in line for line in logs)
    ctl.boom = False
    code, _ = await call("GET", "/v1/status")  # the server survives a failing controller
    assert code == 200
    assert ctl.calls == []


async def test_second_agent_refused_and_stale_socket_replaced(sock_dir):
    path = sock_dir / "agent.sock"
    first = ApiServer(FakeController(), path, group=TEST_GROUP, log=lambda m: None)
    await first.start()
    second = ApiServer(FakeController(), path, group=TEST_GROUP, log=lambda m: None)
    with pytest.raises(ApiStartError, match="another process .* answering on"):
        await second.start()
    assert path.exists()  # the running agent's socket was left alone
    await first.stop()

    stale = socket.socket(socket.AF_UNIX)  # a socket file nobody listens on: an agent that was SIGKILLed
    stale.bind(str(path))
    stale.close()
    third = ApiServer(FakeController(), path, group=TEST_GROUP, log=lambda m: None)
    await third.start()
    reader, writer = await asyncio.open_unix_connection(str(path))
    writer.write(b"GET /v1/profiles HTTP/1.0\r\n\r\n")
    assert b"200 OK" in (await reader.read())
    writer.close()
    await third.stop()


async def test_refuses_a_non_socket_and_an_overlong_path(sock_dir):
    path = sock_dir / "agent.sock"
    path.write_text("precious")
    with pytest.raises(ApiStartError, match="is not a socket"):
        await ApiServer(FakeController(), path, log=lambda m: None).start()
    assert path.read_text() == "precious"
    long = sock_dir / ("d" * 120) / "agent.sock"
    with pytest.raises(ApiStartError, match="longer than 107 bytes"):
        await ApiServer(FakeController(), long, log=lambda m: None).start()


async def test_missing_group_leaves_socket_to_root_and_agent_user(sock_dir):
    logs: list[str] = []
    server = ApiServer(FakeController(), sock_dir / "run" / "agent.sock", group="no-such-group-lx", log=logs.append)
    await server.start()
    st = (sock_dir / "run" / "agent.sock").stat()
    assert stat.S_IMODE(st.st_mode) == 0o660 and st.st_gid == os.getgid()
    assert stat.S_IMODE((sock_dir / "run").stat().st_mode) == 0o750
    assert any("does not exist" in line for line in logs)
    await server.stop()


# ---------------------------------------------------------------------------------------------- peers

PEER_SCRIPT = r"""
import http.client, json, socket, sys
class C(http.client.HTTPConnection):
    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX); self.sock.connect(sys.argv[1])
out = {}
for method, path, body in (("GET", "/v1/status", None), ("POST", "/v1/stop", "{}")):
    c = C("agent", timeout=10); c.request(method, path, body=body); r = c.getresponse()
    out[method] = [r.status, json.loads(r.read())]
print(json.dumps(out))
"""
PEER_PYTHON = "/usr/bin/python3"  # readable by uid 65534, unlike a venv under /root


async def _as_peer(path: Path, uid: int, gid: int, extra_groups: list[int]) -> dict:
    proc = await asyncio.create_subprocess_exec(
        PEER_PYTHON, "-I", "-c", PEER_SCRIPT, str(path), user=uid, group=gid, extra_groups=extra_groups,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, cwd="/")
    out, err = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode == 0, err.decode()
    return json.loads(out)


@pytest.mark.skipif(os.geteuid() != 0 or not os.path.exists(PEER_PYTHON), reason="needs root to become another uid")
async def test_peer_outside_group_gets_403_but_can_read(api, sock_dir):
    call, ctl, logs, _ = api
    users = grp.getgrnam(TEST_GROUP).gr_gid
    nobody, nogroup = 65534, 65534
    os.chmod(sock_dir, 0o755)
    path = sock_dir / "agent.sock"
    # Mode 0660 already keeps strangers out; loosen it to test the second line of defence: SO_PEERCRED.
    os.chmod(path, 0o666)
    res = await _as_peer(path, nobody, nogroup, [])
    assert res["GET"][0] == 200 and res["GET"][1]["serving"]["state"] == "ready"
    assert res["POST"][0] == 403 and res["POST"][1]["error"] == "forbidden"
    assert "uid 65534" in res["POST"][1]["message"]
    assert ctl.calls == []
    assert any(line.startswith("denied: uid 65534 (nobody)") for line in logs)

    os.chmod(path, 0o660)
    res = await _as_peer(path, nobody, users, [])  # primary group is the operators' group
    assert res["POST"][0] == 202
    res = await _as_peer(path, nobody, nogroup, [users])  # supplementary group
    assert res["POST"][0] == 202
    assert [c[0] for c in ctl.calls] == ["stop", "stop"]
    assert all(c[2].startswith("uid 65534 (nobody) pid ") for c in ctl.calls)

