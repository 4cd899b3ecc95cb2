"""The idle probe (`[agent] idle_probe_s`, opt-in): one 1-token completion to a ready run that has been idle that long.

vLLM publishes its scheduler gauges (running, waiting, KV usage) when an engine step ends, and nothing on /metrics
moves when a request reaches the API server (prometheus-fastapi-instrumentator writes the HTTP series when the
answer ends; its in-progress gauge is off in vLLM). An EngineCore that hangs in its first step after an idle spell
(an NCCL collective that never returns) therefore reads 0 running, 0 waiting for good: the hang detector
(health.py) sees an idle server, `/health` answers 200, and every request sent to it waits for ever. Only a request
of our own tells: no answer within hang_timeout_s, while `/health` answers 200, the engine's counters stand still
and the agent was not paused meanwhile, is a hang, given as the verdict the lifecycle already acts on (the hang's
event and alert, `restart_on_hang`). Its condition is "unresponsive" (the server answers no request): the idle
page the scrape reads at every tick ends a "hang" at once, and must not end this one. A later probe answered, or the
engine moving, ends it.

The probe is one request in vLLM's own counters (request_success, prompt and generation tokens, the latency
histograms). A profile's VLLM_API_KEY goes only into the request's Authorization header: never logged, stored or
served. A key the server refuses, or a model that refuses the request, turns the probe off for the run, told once.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from collections.abc import Callable
from typing import Any

import aiohttp

from lynxtop.agent.serving.health import PROBE_TIMEOUT_S, Health, HttpClient, Verdict, read_capped

log = logging.getLogger("lynxtop.agent.serving.supervisor")

KEY_ENV = "VLLM_API_KEY"  # where vLLM reads its key when `--api-key` is not given (the agent refuses the flag)
PROMPT = "1"
POLL_S = 1.0  # how often the probe looks whether the run is due (the scrape's idle reading, its own clock)


def api_key(profile_env: dict[str, str]) -> str | None:
    """The key the run's server was given: the profile's VLLM_API_KEY, else the agent's own (the child inherits
    the agent's environment, agent/serving/launcher.py child_env)."""
    return profile_env.get(KEY_ENV) or os.environ.get(KEY_ENV) or None


class IdleProbe:
    """One run's idle probe: `run` loops until cancelled; verdicts go to `on_verdict`, the reason it turned off (once)
    to `tell(message, details)`. `off` says why it is off (None while on)."""

    def __init__(self, http: HttpClient, url: str, *, model: str, key: str | None, idle_s: float, timeout_s: float,
                 tell: Callable[[str, dict[str, Any]], None], run_label: str,
                 clock: Callable[[], float] = time.monotonic):
        self.http = http
        self.base = url.rstrip("/")
        self.model = model  # the profile's name for it; /v1/models has the last word
        self._key = key
        self.idle_s = idle_s
        self.timeout_s = timeout_s
        self.tell = tell
        self.run_label = run_label  # "run 12 (profile v4-tp8)": how messages name the run
        self.clock = clock
        self._since = clock()  # idle readings before the probe existed (another run's) count from here
        self._last_sent: float | None = None
        self._asked_models = False
        self.hung = False  # this probe's hang verdict stands (a later answer or the engine moving ends it)
        self.hung_at = 0.0
        self.off: str | None = None

    # ------------------------------------------------------------------------------------- the loop

    async def run(self, ready: Callable[[], bool], on_verdict: Callable[[Verdict], None],
                  poll_s: float = POLL_S) -> None:
        """Until cancelled: a probe whenever one is due. An unexpected error costs one round, logged once."""
        said: str | None = None
        while self.off is None:
            await asyncio.sleep(poll_s)
            try:
                verdict = await self.step(ready())
            except Exception as exc:  # noqa: BLE001 - the probe must never end the run's watch
                what = self._scrub(f"{type(exc).__name__}: {exc}")
                if what != said:
                    log.warning("%s: the idle probe failed: %s; tried again later", self.run_label, what)
                said = what
                continue
            if verdict is not None:
                on_verdict(verdict)

    async def step(self, ready: bool) -> Verdict | None:
        """One look: the hung verdict's end when the engine moves; else a probe if one is due, and its verdict."""
        now = self.clock()
        if self.hung:
            moved = getattr(self.http, "engine_moved_at", None)
            if moved is not None and moved > self.hung_at:
                self.hung = False
                return Verdict(Health.PROGRESSING, "the engine moves again (its counters on /metrics)",
                               unanswered=True)
        elif not ready:
            return None
        if not self._due(now):
            return None
        if self._key is not None and not (self._key.isascii() and self._key.isprintable()):
            return self._turn_off(f"the profile's {KEY_ENV} is not printable ASCII and cannot go in an "
                                  "Authorization header", reason="key not ascii")
        if not self._asked_models:
            self._asked_models = True
            await self._learn_model()
            if self.off is not None:
                return None
        return await self._probe()

    def _due(self, now: float) -> bool:
        """Idle (the scrape's reading) for idle_s, counted from this probe's start and its last request too; while
        its hang verdict stands, every idle_s whatever the page says."""
        last = self._last_sent if self._last_sent is not None else self._since
        if self.hung:
            return now - last >= self.idle_s
        idle = getattr(self.http, "engine_idle_since", None)
        return idle is not None and now - max(idle, last, self._since) >= self.idle_s

    # ------------------------------------------------------------------------------------- requests

    def _headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self._key}"} if self._key else {}

    async def _learn_model(self) -> None:
        """The served name from GET /v1/models (frontend only, no engine step); it also shows a refused key before
        any completion carries it. Anything else (no answer, an odd body) keeps the profile's name."""
        try:
            async with self.http.session().get(self.base + "/v1/models", headers=self._headers(),
                                               timeout=aiohttp.ClientTimeout(total=PROBE_TIMEOUT_S * 3)) as resp:
                if resp.status in (401, 403):
                    self._refused_key(resp.status, "/v1/models")
                    return
                raw = await read_capped(resp) if resp.status == 200 else None
        except (TimeoutError, aiohttp.ClientError, OSError):
            return
        try:
            data = json.loads(raw) if raw else None
        except ValueError:
            return
        cards = data.get("data") if isinstance(data, dict) else None
        ids = [m.get("id") for m in cards if isinstance(m, dict)] if isinstance(cards, list) else []
        ids = [i for i in ids if isinstance(i, str) and i and len(i) <= 256 and i.isprintable()]
        if ids and self.model not in ids:
            self.model = ids[0]

    async def _probe(self) -> Verdict | None:
        sent = self._last_sent = self.clock()
        resumes = getattr(self.http, "resumes", 0)
        body = {"model": self.model, "prompt": PROMPT, "max_tokens": 1, "temperature": 0.0, "stream": False}
        try:
            async with self.http.session().post(self.base + "/v1/completions", json=body, headers=self._headers(),
                                                timeout=aiohttp.ClientTimeout(total=self.timeout_s)) as resp:
                status = resp.status
                await read_capped(resp)
        except TimeoutError:
            return await self._silent(sent, resumes)
        except (aiohttp.ClientError, OSError):
            return None  # refused or reset: the server is down, which /health and the exit tell
        if status in (401, 403):
            return self._refused_key(status, "/v1/completions")
        if status in (400, 404, 405, 422):
            return self._turn_off(f"POST /v1/completions answered HTTP {status} for the model {self.model!r} "
                                  "(a model that serves no completions, or another name)", reason=f"http {status}")
        if status == 200 and self.hung:
            self.hung = False
            return Verdict(Health.PROGRESSING, "a probe request (POST /v1/completions) is answered again",
                           unanswered=True)
        return None  # a 5xx is the engine failing, not hanging: /health and the exit tell that

    async def _silent(self, sent: float, resumes: int) -> Verdict | None:
        """No answer within timeout_s: a hang unless the agent was paused meanwhile, the engine moved (a busy
        server, not a hung one) or /health does not answer 200 (the /health probe judges that itself)."""
        now = self.clock()
        moved = getattr(self.http, "engine_moved_at", None)
        if getattr(self.http, "resumes", 0) != resumes or (moved is not None and moved > sent) or self.hung:
            return None
        status, _ = await self.http.get(self.base + "/health")
        if status != 200:
            return None
        self.hung, self.hung_at = True, self.clock()
        return Verdict(Health.HUNG, f"hang: a probe request (POST /v1/completions, 1 token) sent after "
                                    f"{self.idle_s:g} s idle (idle_probe_s) got no answer in {now - sent:.0f} s "
                                    f"(hang_timeout_s {self.timeout_s:g}) while GET /health answers 200 and /metrics "
                                    "shows no movement: the engine hangs in a step (its gauges, set at a step's "
                                    "end, read idle)", unanswered=True)

    # ------------------------------------------------------------------------------------- off

    def _refused_key(self, status: int, path: str) -> Verdict | None:
        had = f"the profile's {KEY_ENV}" if self._key else f"no key ({KEY_ENV} is not in the profile's env)"
        return self._turn_off(f"{path} answered HTTP {status} to the probe, sent with {had}: set the server's key "
                              f"as {KEY_ENV} in the profile's env, env_file or env_credentials",
                              reason=f"http {status}")

    def _turn_off(self, why: str, reason: str) -> Verdict | None:
        """Off for this run, told once; no verdict (None)."""
        self.off = why
        self.tell(f"{self.run_label}: the idle probe is off for this run: {why}; hangs after an idle spell are "
                  "not detected for it", {"reason": reason, "model": self.model})
        return None

    def _scrub(self, text: str) -> str:
        """`text` with the key masked: an error's words never carry it into a log."""
        return text.replace(self._key, "***") if self._key else text
