"""`GET /v1/logs` for a follower and `GET /v1/processes` (issue 28.4), on a real socket over a real log file
and real processes: only new lines, a partial line never shown cut, rotation and truncation noticed, bad
parameters refused, secrets in command lines masked."""

from __future__ import annotations

import getpass
import os
import subprocess
import sys

import aiohttp
import pytest
from support.log_agent import FileController

from lynxtop.agent.api.routes import ApiServer
from lynxtop.contract.processes import GpuProcesses
from lynxtop.contract.redact import mask


@pytest.fixture
async def api(sock_dir, tmp_path):
    ctl = FileController(tmp_path / "run.log")
    server = ApiServer(ctl, sock_dir / "agent.sock", group="nogroup-lynxtop-test", log=lambda m: None)
    await server.start()
    session = aiohttp.ClientSession(connector=aiohttp.UnixConnector(path=str(sock_dir / "agent.sock")))

    async def call(path: str) -> tuple[int, dict]:
        async with session.get("http://agent" + path) as resp:
            return resp.status, await resp.json(content_type=None)

    yield call, ctl
    await session.close()
    await server.stop()


def _append(path, text: str) -> None:
    with open(path, "a") as f:
        f.write(text)


async def test_a_follower_gets_only_new_lines_and_a_partial_line_whole(api):
    call, ctl = api
    ctl.log_path.write_text("one\ntwo\n")
    code, first = await call("/v1/logs?lines=10")
    assert code == 200 and first["lines"] == ["one", "two"] and first["next"] == 8
    assert first["inode"] == os.stat(ctl.log_path).st_ino and first["partial"] is False
    code, body = await call(f"/v1/logs?lines=10&after=8&inode={first['inode']}")
    assert code == 200 and body["lines"] == [] and body["next"] == 8 and body["reset"] is None
    _append(ctl.log_path, "three\nfou")
    code, body = await call(f"/v1/logs?lines=10&after=8&inode={first['inode']}")
    assert body["lines"] == ["three", "fou"] and body["partial"] is True and body["next"] == 14
    _append(ctl.log_path, "r\n\nfive\n")
    code, body = await call(f"/v1/logs?lines=10&after=14&inode={first['inode']}")
    assert body["lines"] == ["four", "five"] and body["partial"] is False and body["next"] == 25


async def test_rotation_and_truncation_read_the_new_file_from_its_start(api):
    call, ctl = api
    ctl.log_path.write_text("old 1\nold 2\n")
    _, first = await call("/v1/logs?lines=10")
    os.rename(ctl.log_path, ctl.log_path.with_suffix(".log.1"))  # logrotate: renamed, a new one created
    ctl.log_path.write_text("new 1\n")
    _, body = await call(f"/v1/logs?lines=10&after={first['next']}&inode={first['inode']}")
    assert body["reset"] == "rotated" and body["lines"] == ["new 1"] and body["inode"] != first["inode"]
    ctl.log_path.write_text("")  # copytruncate: the same file, shorter than the follower's offset
    _append(ctl.log_path, "after truncate\n")
    _, again = await call(f"/v1/logs?lines=10&after={body['next'] + 100}&inode={body['inode']}")
    assert again["reset"] == "truncated" and again["lines"] == ["after truncate"]


async def test_more_new_lines_than_asked_gives_the_last_and_says_how_much_was_skipped(api):
    call, ctl = api
    ctl.log_path.write_text("")
    _, first = await call("/v1/logs?lines=10")
    _append(ctl.log_path, "".join(f"line {i}\n" for i in range(100)))
    _, body = await call(f"/v1/logs?lines=3&after=0&inode={first['inode']}")
    assert body["lines"] == ["line 97", "line 98", "line 99"] and body["skipped"] == sum(
        len(f"line {i}\n") for i in range(97))


@pytest.mark.parametrize(("query", "error", "named"), [
    ("inode=5", "missing_parameter", "'inode'"),
    ("after=-1", "out_of_range", "'after'"),
    ("after=x", "wrong_type", "'after'"),
    ("after=0&inode=99999999999999999999999", "out_of_range", "'inode'"),
])
async def test_bad_follow_parameters_are_refused_by_name(api, query, error, named):
    call, ctl = api
    ctl.log_path.write_text("x\n")
    code, body = await call(f"/v1/logs?{query}")
    assert (code, body["error"]) == (400, error) and named in body["message"]


async def test_processes_with_user_command_secrets_masked_and_run_membership(api):
    call, ctl = api
    stray = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "--api-key", "sekrit",
                              "HF_TOKEN=hf_abc", "--port=8000"])
    try:
        ctl.process_rows = [
            {"gpu": 0, "pid": stray.pid, "used_mem_bytes": 2 << 30, "in_vllm_tree": False, "sm_util_pct": None},
            {"gpu": 0, "pid": os.getpid(), "used_mem_bytes": 80 << 30, "in_vllm_tree": True, "sm_util_pct": 71},
        ]
        code, body = await call("/v1/processes")
    finally:
        stray.kill()
        stray.wait()
    assert code == 200
    run, other = body["processes"]
    assert (run["pid"], run["in_run"], run["sm_util_pct"]) == (os.getpid(), True, 71)
    assert (other["pid"], other["in_run"], other["user"]) == (stray.pid, False, getpass.getuser())
    assert "sekrit" not in other["command"] and "hf_abc" not in other["command"]
    assert f"--api-key {mask('sekrit')}" in other["command"] and f"HF_TOKEN={mask('hf_abc')}" in other["command"]
    assert "--port=8000" in other["command"]
    assert GpuProcesses.from_json(body).strays[0].pid == stray.pid  # what the client reads
    code, body = await call("/v1/processes?x=1")
    assert (code, body["error"]) == (400, "unknown_parameter")
