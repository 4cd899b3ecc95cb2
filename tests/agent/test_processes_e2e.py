"""A real agent (simulated GPUs and vLLM) answers `GET /v1/processes` with its run's processes on the GPUs, and
`GET /v1/logs` to a follower with only the lines written since (issue 28.4)."""

from __future__ import annotations

import asyncio
import getpass
import time

from support.agent_proc import Agent, e2e_config


async def test_a_real_agent_lists_its_runs_gpu_processes_and_follows_its_log(tmp_path, cleanup):
    a = Agent(tmp_path, e2e_config(tmp_path))
    cleanup.append(a)
    await a.wait_state(lambda s: s["state"] == "ready", what="ready")
    procs: list[dict] = []
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        code, body = await a.api("GET", "/v1/processes")
        assert code == 200, body
        procs = body["processes"]
        # the sim's engines are the run's own from the first answer that lists them: the tick's membership may
        # not know the workers yet, but no process of the run is ever called a stray
        assert all(p["in_run"] for p in procs), procs
        # processes are read about once a second and the sim loads in 0.5 s: an answer may still hold the read
        # made before any weights were resident (0 bytes, as NVML showed then); the next read has them
        if len(procs) == 8 and all(p["used_mem_bytes"] > 0 for p in procs):
            break
        await asyncio.sleep(0.2)
    assert len(procs) == 8, procs
    assert {p["user"] for p in procs} == {getpass.getuser()} and all(p["command"] for p in procs)
    assert sorted(p["gpu"] for p in procs) == list(range(8)) and all(p["used_mem_bytes"] > 0 for p in procs)

    code, first = await a.api("GET", "/v1/logs?lines=5")
    assert code == 200 and first["lines"] and isinstance(first["inode"], int)
    code, body = await a.api("GET", f"/v1/logs?lines=100&after={first['next']}&inode={first['inode']}")
    assert code == 200 and body["reset"] is None and body["inode"] == first["inode"]
    assert a.stop() == 0
