"""A lone surrogate ("\\ud800", valid JSON) in a bench result's text field is not UTF-8, so SQLite cannot store it:
the request is a 400 naming the field, with nothing stored and no store error (it was a 500, a dropped write and a
store error shown in every later status)."""

from __future__ import annotations

import aiohttp
import pytest
from support.agent_proc import Agent, e2e_config

pytestmark = pytest.mark.timeout(90)


async def _post(sock: str, path: str, raw: bytes) -> tuple[int, dict]:
    async with aiohttp.ClientSession(connector=aiohttp.UnixConnector(path=sock)) as s, \
            s.post(f"http://agent{path}", data=raw, headers={"Content-Type": "application/json"}) as r:
        return r.status, await r.json()


async def test_lone_surrogate_in_a_bench_text_field_is_a_400_not_a_500(tmp_path, cleanup):
    a = Agent(tmp_path, e2e_config(tmp_path, autostart=False))
    cleanup.append(a)
    await a.wait_notify("READY=1")
    code, body = await _post(a.sock_path, "/v1/bench", b'{"result": {"concurrency": 8, "model": "m\\ud800"}}')
    st = await a.status()
    out = a.output()
    a.stop()
    print(code, body)
    print("store.last_error:", st["agent"]["store"].get("last_error"))
    assert "Traceback" not in out, out[-3000:]
    assert st["agent"]["store"].get("last_error") is None
    assert code == 400, body
    assert "model" in body["message"]
