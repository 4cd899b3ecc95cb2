"""The real agent under a connection flood with a low descriptor limit: sampling and status never starve.

Issue 11 §2: 1,500 half-sent requests on the control socket (or 1,100 idle TCP connections to metrics_listen) took
the agent to its 1024-descriptor limit; /v1/status stopped answering, sampling failed with EMFILE for 114 s, the log
grew 324 MB. Here the agent runs with RLIMIT_NOFILE 768 (it cannot raise it) and gets 700 + 400 such connections.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
import pytest
from support.agent_config import write_agent_config
from support.db import db_rows
from support.ports import free_port
from support.waits import wait_for_async

pytestmark = pytest.mark.timeout(90)

LIMIT = 768


def _low_limit() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (LIMIT, LIMIT))


def _host_rows(db: Path) -> int:
    return db_rows(db, "SELECT count(*) AS n FROM host_samples")[0]["n"]


async def test_flood_of_slow_connections_leaves_sampling_and_status_alone(tmp_path):
    sock = Path(f"/tmp/lxfd{free_port()}.sock")  # AF_UNIX paths are short; tmp_path is long
    port = free_port()
    db = tmp_path / "state" / "lynxtop.db"
    cfg = write_agent_config(tmp_path / "config.toml", db, sock, fake_nvml="h200x8", sample_interval_s=0.2,
                             metrics_listen=f"127.0.0.1:{port}")
    log_path = tmp_path / "agent.log"
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 1400:
        pytest.skip(f"the test itself needs ~1,200 descriptors (soft limit {soft})")
    with open(log_path, "wb") as log:
        agent = subprocess.Popen([sys.executable, "-m", "lynxtop", "agent", "--config", str(cfg)], stdout=log,
                                 stderr=subprocess.STDOUT, preexec_fn=_low_limit)
    writers: list[asyncio.StreamWriter] = []
    try:
        session = aiohttp.ClientSession(connector=aiohttp.UnixConnector(path=str(sock)))

        async def status() -> dict:
            async with session.get("http://agent/v1/status", timeout=aiohttp.ClientTimeout(total=5)) as resp:
                assert resp.status == 200
                return await resp.json()

        deadline = time.monotonic() + 30
        while True:
            try:
                st = await status()
                break
            except (aiohttp.ClientError, OSError):
                assert agent.poll() is None, log_path.read_text()
                assert time.monotonic() < deadline, log_path.read_text()
                await asyncio.sleep(0.1)
        # a fixed pause kept on purpose: waiting on the first host rows instead, the status calls under the flood
        # below broke now and then (a broken pipe on the kept-alive connection); why is not understood yet
        await asyncio.sleep(0.5)
        rows_before = _host_rows(db)
        for _ in range(700):  # half-sent requests on the control socket
            _, w = await asyncio.open_unix_connection(str(sock))
            w.write(b"GET /v1/status HTTP/1.1\r\nHost: agent\r\nX-Slow: ")
            writers.append(w)
        for _ in range(400):  # idle TCP connections to the metrics listener
            _, w = await asyncio.open_connection("127.0.0.1", port)
            writers.append(w)
        for _ in range(20):  # status keeps answering while the flood is held
            st = await status()
            await asyncio.sleep(0.1)
        # sampling goes on under the held flood (0.2 s interval): 10 more rows come, however slow the machine
        await wait_for_async(lambda: _host_rows(db) >= rows_before + 10, 60, what="host rows written under the flood")
        st = await status()
        a = st["agent"]
        assert a.get("failed_ticks") == 0 and a["healthy"], a
        # the caps were fitted under the limit with a reserve, and held
        assert a["descriptors"]["limit"] == LIMIT
        api, metrics = a["connections"]["api"], a["connections"]["metrics"]
        assert api["max"] + metrics["max"] < LIMIT - 256
        assert api["open"] <= api["max"] and metrics["open"] <= metrics["max"]
        assert api["refused"] + api["evicted"] > 0 and metrics["refused"] + metrics["evicted"] > 0
        assert a["descriptors"]["open"] < LIMIT - 128, a["descriptors"]
        async with aiohttp.ClientSession() as s, s.get(f"http://127.0.0.1:{port}/metrics") as resp:
            assert resp.status == 200 and "lynxtop_agent_failed_ticks_total 0.0" in await resp.text()
    finally:
        for w in writers:
            w.close()
        with contextlib.suppress(Exception):
            await session.close()
        agent.send_signal(signal.SIGTERM)
        try:
            agent.wait(20)
        except subprocess.TimeoutExpired:
            agent.kill()
        sock.unlink(missing_ok=True)
    text = log_path.read_text()
    assert agent.returncode == 0, text
    assert "Traceback" not in text and "Too many open files" not in text, text[-3000:]
    assert len(text) < 20_000, f"log grew to {len(text)} bytes"
    print(json.dumps({"log_bytes": len(text)}))
