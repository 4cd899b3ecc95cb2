"""Session 25: an EngineCore that hangs in its first step after an idle spell was never judged hung.

vLLM sets its scheduler gauges (running, waiting, KV usage) when an engine step ends, and no /metrics series moves
when a request reaches the API server (the HTTP counters are written when the answer ends): such an engine reads 0
running, 0 waiting for good, the hang detector saw an idle server, and every request sent to it waited for ever.
`[agent] idle_probe_s` (opt-in) sends a ready run idle that long one 1-token completion, which must be answered
within hang_timeout_s; no answer while /health answers 200 is a hang (condition `unresponsive`, the hang's event,
alert and restart_on_hang). Real agent, real simulated vLLM (`--sim-fail hang-on-next-request`); the probe's own
unit tests run it against a real HTTP server on loopback."""

from __future__ import annotations

import asyncio
import json
import logging
import time

import aiohttp
import pytest
from aiohttp import web
from support.agent_config import sim_profile, write_agent_config
from support.agent_proc import Agent, e2e_config, state_db

from lynxtop.agent.serving.health import Health, HttpClient
from lynxtop.agent.serving.idleprobe import IdleProbe
from lynxtop.contract.config import ConfigError, load_config

pytestmark = pytest.mark.timeout(120)

IDLE_S, HANG_S = 5, 5
KEY = "sk-idle-probe-\u2603-not-ascii"  # replaced below by an ASCII key; this one must never be sent
ASCII_KEY = "sk-s25-idle-probe-0123456789abcdef"


def _events(tmp_path, kind: str) -> list[dict]:
    return [e for e in state_db(tmp_path, "SELECT * FROM events") if e["kind"] == kind]


async def _wait_events(tmp_path, kind: str, timeout: float = 30) -> list[dict]:
    """The events of `kind` once one is stored (the writer commits in batches: later on a loaded machine)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ev = _events(tmp_path, kind)
        if ev:
            return ev
        await asyncio.sleep(0.1)
    raise AssertionError(f"no {kind} event in {timeout} s")


async def _page(url: str) -> dict[str, float]:
    """Counters of the served page: finished requests, generated tokens (summed over their labels)."""
    out: dict[str, float] = {}
    async with aiohttp.ClientSession() as s, s.get(url + "/metrics") as r:
        text = await r.text()
    for line in text.splitlines():
        for name in ("vllm:request_success_total", "vllm:generation_tokens_total"):
            if line.startswith(name + "{"):
                out[name] = out.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
    return out


def _config(tmp_path, *, sim_args: tuple[str, ...] = (), extra: str = ""):
    return e2e_config(tmp_path, extra_agent=f"hang_timeout_s = {HANG_S}\nidle_probe_s = {IDLE_S}\n{extra}",
                      sim_args=sim_args)


def test_idle_probe_s_is_off_by_default_and_checked(tmp_path):
    base = e2e_config(tmp_path).read_text()
    assert load_config(str(tmp_path / "config.toml")).agent.idle_probe_s == 0
    for good, want in (("0", 0.0), ("5", 5.0), ("86400", 86400.0)):
        (tmp_path / "c.toml").write_text(base.replace("[agent]\n", f"[agent]\nidle_probe_s = {good}\n", 1))
        assert load_config(str(tmp_path / "c.toml")).agent.idle_probe_s == want
    for bad, words in (("1", "out of range (0 = off, or 5..86400)"), ("86401", "out of range"),
                       ("-5", "out of range"), ("nan", "not a finite number"), ("true", "expected a number"),
                       ('"30"', "expected a number")):
        (tmp_path / "c.toml").write_text(base.replace("[agent]\n", f"[agent]\nidle_probe_s = {bad}\n", 1))
        with pytest.raises(ConfigError) as info:
            load_config(str(tmp_path / "c.toml"))
        assert "idle_probe_s" in str(info.value) and words in str(info.value), str(info.value)


async def test_a_hang_in_the_first_step_after_idle_is_judged_by_the_probe(tmp_path, cleanup):
    """The engine hangs on the next request after ready (the probe's or a client's): /metrics reads idle for good,
    /health answers 200. Judged hung within idle_probe_s + hang_timeout_s (plus the watch's cadence), told once as
    the hang's event; restart_on_hang is off: nothing restarted."""
    a = Agent(tmp_path, _config(tmp_path, sim_args=("--sim-fail", "hang-on-next-request")))
    cleanup.append(a)
    st = await a.wait_state(lambda s: s["state"] == "ready", what="ready")
    ready_at, pid = time.monotonic(), st["serving"]["pid"]
    st = await a.wait_state(lambda s: s["state"] == "degraded", timeout=60, what="degraded by the idle probe")
    took = time.monotonic() - ready_at
    assert took <= IDLE_S + HANG_S + 15, took  # 5 s of the watch's cadence, a scrape, a loaded machine
    reason = st["serving"]["reason"]
    assert "hang" in reason and "POST /v1/completions" in reason and "GET /health answers 200" in reason, reason
    assert "unresponsive" in st["serving"]["degraded"], st["serving"]
    ev = await _wait_events(tmp_path, "serving.degraded.hang")
    assert len(ev) == 1 and ev[0]["severity"] == "error" and "idle" in ev[0]["message"]
    assert json.loads(ev[0]["details"])["condition"] == "unresponsive"
    # it stays judged: the idle page recovers nothing, and nothing is restarted (restart_on_hang is off)
    await asyncio.sleep(IDLE_S + HANG_S + 2)
    st = await a.status()
    assert st["serving"]["state"] == "degraded" and st["serving"]["pid"] == pid
    assert len(_events(tmp_path, "serving.degraded.hang")) == 1
    assert not _events(tmp_path, "serving.recovered.hang")
    assert a.stop() == 0


async def test_restart_on_hang_restarts_a_server_hung_after_idle(tmp_path, cleanup):
    a = Agent(tmp_path, _config(tmp_path, sim_args=("--sim-fail", "hang-on-next-request"),
                                extra="restart_on_hang = true"))
    cleanup.append(a)
    st = await a.wait_state(lambda s: s["state"] == "ready", what="ready")
    run_id = st["serving"]["run_id"]
    await a.wait_state(lambda s: s["run_id"] not in (None, run_id), timeout=60, what="restarted after the hang")
    runs = {r["id"]: r for r in state_db(tmp_path, "SELECT * FROM runs")}
    assert runs[run_id]["end_reason"] == "restarted", runs[run_id]
    ev = await _wait_events(tmp_path, "serving.degraded.hang")
    assert ev[0]["run_id"] == run_id and "POST /v1/completions" in ev[0]["message"]
    assert a.stop() == 0


async def test_a_healthy_idle_server_is_probed_and_never_judged(tmp_path, cleanup):
    """Probes are answered (one request each, shown in vLLM's own counters); the run stays ready throughout. The key
    of a profile with VLLM_API_KEY reaches the server only in the probe's Authorization header: the agent's log,
    events and status never hold it."""
    prof = sim_profile("keyed", tp=8, startup_s=0.5, sim_args=("--sim-log-interval", "1"), stop_grace_s=5,
                       env={"VLLM_API_KEY": ASCII_KEY})
    cfg = write_agent_config(tmp_path / "config.toml", tmp_path / "state" / "lynxtop.db", tmp_path / "run" /
                             "agent.sock", fake_nvml="sim", sample_interval_s=0.2, default_profile="keyed",
                             autostart=True, backoff_initial_s=0.3, backoff_max_s=1, gpu_release_timeout_s=10,
                             extra=f"hang_timeout_s = {HANG_S}\nidle_probe_s = {IDLE_S}\n", profiles=[prof])
    a = Agent(tmp_path, cfg)
    cleanup.append(a)
    st = await a.wait_state(lambda s: s["state"] == "ready", what="ready")
    url = st["serving"]["url"]
    async with aiohttp.ClientSession() as s, s.get(url + "/v1/models") as r:
        assert r.status == 401  # the server wants the key: the probe's requests below carried it
    deadline = time.monotonic() + 60
    seen = 0.0
    while time.monotonic() < deadline:
        st = await a.status()
        assert st["serving"]["state"] == "ready", st["serving"]
        seen = (await _page(url)).get("vllm:request_success_total", 0.0)
        if seen >= 2:
            break
        await asyncio.sleep(0.5)
    assert seen >= 2, "no two probes answered"
    assert not _events(tmp_path, "serving.degraded.hang") and not _events(tmp_path, "serving.idle_probe_off")
    assert a.stop() == 0
    texts = [(tmp_path / "agent.log").read_text(errors="replace"), json.dumps(st),
             json.dumps(state_db(tmp_path, "SELECT * FROM events"))]
    assert not any(ASCII_KEY in t for t in texts)


# ------------------------------------------------------------------ the probe alone, on a real loopback server


class _Server:
    """/health, /v1/models and /v1/completions on loopback: the completions answer, hang, or refuse the key."""

    def __init__(self, key: str | None = None):
        self.key = key
        self.mode = "answer"
        self.seen: list[str] = []  # Authorization headers of the completions asked
        self.runner: web.AppRunner | None = None
        self.url = ""

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get("/health", self._health)
        app.router.add_get("/v1/models", self._models)
        app.router.add_post("/v1/completions", self._completions)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]  # noqa: SLF001
        self.url = f"http://127.0.0.1:{port}"

    async def _health(self, request: web.Request) -> web.Response:
        return web.Response()

    def _refused(self, request: web.Request) -> bool:
        return self.key is not None and request.headers.get("Authorization") != f"Bearer {self.key}"

    async def _models(self, request: web.Request) -> web.Response:
        if self._refused(request):
            return web.json_response({"error": "Unauthorized"}, status=401)
        return web.json_response({"object": "list", "data": [{"id": "served-name"}]})

    async def _completions(self, request: web.Request) -> web.Response:
        self.seen.append(request.headers.get("Authorization", ""))
        if self._refused(request):
            return web.json_response({"error": "Unauthorized"}, status=401)
        body = await request.json()
        assert body["model"] == "served-name" and body["max_tokens"] == 1
        if self.mode == "hang":
            await asyncio.sleep(3600)
        return web.json_response({"choices": [{"text": " 2"}]})

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()


async def _probe(srv: _Server, key: str | None, idle_s: float = 0.3, timeout_s: float = 1.0):
    http = HttpClient()
    http.engine_idle_since = time.monotonic()  # what the scrape says of the engine: idle from now
    verdicts, told = [], []
    probe = IdleProbe(http, srv.url, model="profile-name", key=key, idle_s=idle_s, timeout_s=timeout_s,
                      tell=lambda msg, details: told.append((msg, details)), run_label="run 7")
    task = asyncio.ensure_future(probe.run(lambda: True, verdicts.append, poll_s=0.05))
    return http, probe, task, verdicts, told


async def test_probe_judges_silence_hung_and_an_answer_ends_it():
    srv = _Server()
    await srv.start()
    http, probe, task, verdicts, _ = await _probe(srv, None)
    try:
        t0 = time.monotonic()
        while len(srv.seen) < 2 and time.monotonic() - t0 < 20:  # answered probes: nothing judged
            await asyncio.sleep(0.05)
        assert len(srv.seen) >= 2 and verdicts == [] and srv.seen[0] == ""
        srv.mode = "hang"
        t0 = time.monotonic()
        while not verdicts and time.monotonic() - t0 < 20:
            await asyncio.sleep(0.05)
        assert verdicts and verdicts[0].health is Health.HUNG and verdicts[0].condition == "unresponsive"
        assert time.monotonic() - t0 <= 0.3 + 1.0 + 3, "judged late"
        srv.mode = "answer"
        t0 = time.monotonic()
        while len(verdicts) < 2 and time.monotonic() - t0 < 20:
            await asyncio.sleep(0.05)
        assert verdicts[1].health is Health.PROGRESSING and verdicts[1].condition == "unresponsive"
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await http.close()
        await srv.stop()


async def test_probe_waits_while_the_engine_moves_or_works():
    """No probe while requests run (the scrape reads work: no idle reading), and a silent probe during which the
    engine's counters moved is load, not a hang."""
    srv = _Server()
    await srv.start()
    http, probe, task, verdicts, _ = await _probe(srv, None)
    try:
        http.engine_idle_since = None  # requests run
        await asyncio.sleep(1.0)
        assert srv.seen == []
        srv.mode = "hang"
        http.engine_idle_since = time.monotonic()
        t0 = time.monotonic()
        while not srv.seen and time.monotonic() - t0 < 20:
            await asyncio.sleep(0.02)
        http.engine_moved_at = time.monotonic() + 0.1  # tokens flow while the probe waits
        await asyncio.sleep(2.0)
        assert verdicts == []
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await http.close()
        await srv.stop()


async def test_a_refused_key_turns_the_probe_off_with_one_info_event_and_the_key_is_never_told(caplog):
    caplog.set_level(logging.DEBUG)
    srv = _Server(key="the-servers-own-key")
    await srv.start()
    http, probe, task, verdicts, told = await _probe(srv, ASCII_KEY)
    try:
        t0 = time.monotonic()
        while not told and time.monotonic() - t0 < 20:
            await asyncio.sleep(0.05)
        await asyncio.sleep(1.0)  # off: nothing more is sent or told
        assert len(told) == 1 and probe.off is not None and verdicts == []
        msg, details = told[0]
        assert "401" in msg and "VLLM_API_KEY" in msg and "run 7" in msg, msg
        assert srv.seen == []  # refused at /v1/models: no completion was sent with it
        everything = msg + json.dumps(details) + caplog.text
        assert ASCII_KEY not in everything
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await http.close()
        await srv.stop()


async def test_a_key_that_cannot_go_in_a_header_turns_the_probe_off_unquoted(caplog):
    caplog.set_level(logging.DEBUG)
    srv = _Server()
    await srv.start()
    http, probe, task, verdicts, told = await _probe(srv, KEY)
    try:
        t0 = time.monotonic()
        while not told and time.monotonic() - t0 < 20:
            await asyncio.sleep(0.05)
        assert len(told) == 1 and srv.seen == [] and verdicts == []
        assert KEY not in told[0][0] + json.dumps(told[0][1]) + caplog.text
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await http.close()
        await srv.stop()
