"""A read call's integer query parameter (`?limit=`, `?since=`, `?lines=`...) is ASCII decimal digits with an
optional leading `-`, nothing else: Python's int() also takes `1_000`, surrounding spaces, a `+` and non-ASCII
digits (`٥٠` is 50), which a client would never mean and a log or a cache key would show differently. Each of those
is a 400 `wrong_type` naming the parameter; the controller is never called."""

from __future__ import annotations

from urllib.parse import quote

import aiohttp
import pytest

from lynxtop.agent.api.routes import ApiServer

pytestmark = pytest.mark.timeout(60)


class Ctl:
    def __init__(self):
        self.limits: list[int] = []

    def runs(self, limit):
        self.limits.append(limit)
        return []


@pytest.fixture
async def runs(sock_dir):
    ctl = Ctl()
    server = ApiServer(ctl, sock_dir / "agent.sock", group="users", log=lambda m: None)
    await server.start()
    session = aiohttp.ClientSession(connector=aiohttp.UnixConnector(path=str(sock_dir / "agent.sock")))

    async def call(raw: str):
        async with session.get(f"http://agent/v1/runs?limit={quote(raw, safe='')}") as r:
            return r.status, await r.json(content_type=None)

    yield call, ctl
    await session.close()
    await server.stop()


@pytest.mark.parametrize("raw", ["1_000", " 5 ", "5 ", "+5", "\u0665\u0660", "\uff15", "5.0", "0x10", "", "-"],
                         ids=["underscore", "spaces", "trailing_space", "plus", "arabic_indic", "fullwidth", "float",
                              "hex", "empty", "lone_minus"])
async def test_query_integer_that_is_not_ascii_decimal_is_a_400(runs, raw):
    call, ctl = runs
    code, body = await call(raw)
    assert code == 400, (code, body)
    assert body["error"] == "wrong_type" and "'limit'" in body["message"], body
    assert ctl.limits == []


async def test_ascii_decimal_is_read_and_a_negative_one_is_out_of_range(runs):
    call, ctl = runs
    assert (await call("25"))[0] == 200
    assert (await call("0025"))[0] == 200
    code, body = await call("-3")
    assert code == 400 and body["error"] == "out_of_range", body
    assert ctl.limits == [25, 25]
