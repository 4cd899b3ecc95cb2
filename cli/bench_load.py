"""The load side of `lynxtop bench`: streamed OpenAI-compatible requests, timed on the client.

Timing follows `vllm bench serve` (vllm/benchmarks/lib/endpoint_request_func.py) so the two clients agree on
the same server: the clock starts just before the POST, every SSE event that carries a choice is one
arrival (TTFT for the first, an inter-token gap for each later one), e2e ends at the last arrival, and the
output length comes from the usage block when the server sends one. A level runs closed-loop at a fixed
concurrency (`--max-concurrency`) or open-loop at a Poisson request rate (`--request-rate`).

The event stream is read in raw chunks and only the usage and error events are parsed as JSON: at 512
streams and 20,000 tokens/s a `json.loads` per token would cost the loop more than the measurement may.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from lynxtop.cli.bench_http import ConnectFailed, ProtocolError, StreamPool

NETWORK_ERRORS = (aiohttp.ClientError, OSError, TimeoutError)


@dataclass
class RequestResult:
    """One request as the client saw it (seconds, `time.perf_counter` based)."""

    ok: bool = False
    prompt_tokens: int = 0
    output_tokens: int = 0
    ttft: float = 0.0
    e2e: float = 0.0
    itl: list[float] = field(default_factory=list)
    error: str = ""
    unreachable: bool = False  # connection refused or reset before an answer: the server is gone
    start: float = 0.0  # perf_counter just before the POST (vLLM's start_times)
    queued: float = 0.0  # from its arrival to its POST (vLLM's client_queue_time)
    chunks: list[bytes] | None = None  # the token events, kept whole only when the text is wanted

    @property
    def text(self) -> str:
        """The generated text, decoded from the kept events (after the level: no JSON is parsed while timing)."""
        out = []
        for payload in self.chunks or ():
            with contextlib.suppress(ValueError, LookupError, TypeError, AttributeError):
                out.append(str(json.loads(payload)["choices"][0].get("text") or ""))
        return "".join(out)

    @property
    def tpot(self) -> float | None:
        """Time per output token after the first, as vLLM computes it: (e2e - ttft) / (tokens - 1)."""
        return (self.e2e - self.ttft) / (self.output_tokens - 1) if self.output_tokens > 1 else None


@dataclass(frozen=True)
class Workload:
    """What every request of a sweep asks for."""

    url: str
    model: str
    input_len: int
    output_len: int
    seed: int = 0
    api_key: str | None = None
    prompts: tuple[str, ...] = ()  # text prompts (else random token ids of input_len)
    keep_text: bool = False  # keep each token event for the generated text (--save-result files)

    def bodies(self, n: int, offset: int = 0) -> list[dict[str, Any]]:
        """`n` request bodies; the same seed and offset give the same prompts."""
        rng = random.Random(self.seed * 1_000_003 + offset)
        out = []
        for i in range(n):
            if self.prompts:
                prompt: Any = self.prompts[(offset + i) % len(self.prompts)]
            else:
                prompt = [rng.randint(100, 30_000) for _ in range(self.input_len)]
            # the body `vllm bench serve` sends (server-default sampling), so both load the server alike
            out.append({"model": self.model, "prompt": prompt, "max_tokens": self.output_len, "stream": True,
                        "ignore_eos": True, "stream_options": {"include_usage": True}})
        return out


class _Events:
    """Splits a byte stream into SSE `data:` payloads and times each event that carries a token."""

    def __init__(self, res: RequestResult, t0: float, keep: bool = False):
        self.res, self.t0, self.last = res, t0, t0
        self.buf = b""
        self.tokens = 0
        self.usage_tokens: int | None = None
        self.usage_prompt: int | None = None
        self.done = False
        self.kept: list[bytes] | None = [] if keep else None

    def feed(self, data: bytes, now: float) -> None:
        self.buf += data
        *events, self.buf = self.buf.split(b"\n\n")
        for ev in events:
            for line in ev.split(b"\n"):
                if line.startswith(b"data:"):
                    self._event(line[5:].strip(), now)

    def _event(self, payload: bytes, now: float) -> None:
        if b'"finish_reason":null' in payload or b'"finish_reason": null' in payload:
            # a token, found with one search: error, usage-only and closing events have no null finish_reason
            if b'"usage":{' in payload or b'"usage": {' in payload:  # continuous usage stats
                self._usage(payload)
            self._token(now, payload)
            return
        if payload == b"[DONE]":
            self.done = True
            return
        if b'"error"' in payload and b'"choices"' not in payload:
            err = json.loads(payload).get("error")
            raise StreamError(str(err.get("message", err) if isinstance(err, dict) else err))
        if b'"usage":{' in payload or b'"usage": {' in payload:
            self._usage(payload)
        if _carries_token(payload):
            self._token(now, payload)

    def _usage(self, payload: bytes) -> None:
        usage = json.loads(payload).get("usage") or {}
        self.usage_tokens = usage.get("completion_tokens")
        self.usage_prompt = usage.get("prompt_tokens")

    def _token(self, now: float, payload: bytes) -> None:
        if self.kept is not None:
            self.kept.append(payload)
        if self.tokens == 0:
            self.res.ttft = now - self.t0
        else:
            self.res.itl.append(now - self.last)
        self.last = now
        self.tokens += 1


def _carries_token(payload: bytes) -> bool:
    """An event with a choice, except the empty closing one some servers add after the last token."""
    if b'"choices":[]' in payload or b'"choices": []' in payload or b'"choices"' not in payload:
        return False
    closing = (b'"text":""' in payload or b'"text": ""' in payload) and b'"finish_reason":null' not in payload \
        and b'"finish_reason": null' not in payload
    return not closing


class StreamError(Exception):
    """The server reported an error inside the stream."""


async def one_request(pool: StreamPool, wl: Workload, body: dict[str, Any]) -> RequestResult:
    """POST one streamed completion and time it; never raises for a server or network problem."""
    res = RequestResult(prompt_tokens=wl.input_len)
    headers = {"Authorization": f"Bearer {wl.api_key}"} if wl.api_key else None
    payload = json.dumps(body).encode()
    t0 = res.start = time.perf_counter()
    ev = _Events(res, t0, wl.keep_text)
    res.chunks = ev.kept
    try:
        answer = await pool.post("/v1/completions", payload, headers, ev.feed)  # tokens timed as they are read
    except StreamError as exc:
        res.error = f"error in stream: {exc}"[:300]
        return res
    except ConnectFailed as exc:
        res.error, res.unreachable = f"cannot connect: {exc}"[:300], True
        return res
    except ProtocolError as exc:
        res.error = f"bad answer: {exc}"[:300]
        return res
    except ValueError as exc:  # an error or usage event that is not JSON
        res.error = f"bad event in the stream: {exc}"[:300]
        return res
    except (OSError, TimeoutError) as exc:
        if str(exc):
            what = f"{type(exc).__name__}: {exc}"
        else:
            what = f"timed out after {pool.timeout_s:g} s" if isinstance(exc, TimeoutError) else type(exc).__name__
        res.error = f"{'stream cut' if ev.tokens else 'no answer'}: {what}"[:300]
        return res
    if answer.status != 200:
        res.error = f"HTTP {answer.status}: {_message(answer.body.decode('utf-8', 'replace'))}"
        return res
    return _finish(res, ev)


def _finish(res: RequestResult, ev: _Events) -> RequestResult:
    if not ev.done:
        res.error = f"stream ended after {ev.tokens} tokens without [DONE]"
        return res
    if ev.tokens == 0:
        res.error = "no tokens in the answer"
        return res
    res.ok = True
    res.output_tokens = ev.usage_tokens if ev.usage_tokens else ev.tokens
    if isinstance(ev.usage_prompt, int) and ev.usage_prompt > 0:  # the server's count: text prompts too
        res.prompt_tokens = ev.usage_prompt
    res.e2e = ev.last - ev.t0
    return res


def _message(text: str) -> str:
    """The server's error message from a JSON error body (vLLM and OpenAI shapes), else the text."""
    try:
        data = json.loads(text)
    except ValueError:
        return text.strip()[:300]
    err = data.get("error", data) if isinstance(data, dict) else data
    if isinstance(err, dict):
        return str(err.get("message") or err)[:300]
    return str(data.get("message") or err)[:300] if isinstance(data, dict) else str(err)[:300]


@dataclass(frozen=True)
class Level:
    """One point of the sweep: a concurrency (closed loop) or a request rate (open loop, Poisson)."""

    concurrency: int | None = None
    rate: float | None = None
    requests: int = 0  # requests of the level (0: run for `duration_s`)
    duration_s: float | None = None

    @property
    def label(self) -> str:
        return f"c={self.concurrency}" if self.rate is None else f"{self.rate:g} req/s"


@dataclass
class LevelRun:
    level: Level
    results: list[RequestResult] = field(default_factory=list)
    duration_s: float = 0.0
    interrupted: bool = False  # stopped early (Ctrl-C): partial


Progress = Callable[[int], None]  # called with the count of finished requests


async def run_level(pool: StreamPool, wl: Workload, level: Level, stop: asyncio.Event,
                    progress: Progress | None = None, offset: int = 0) -> LevelRun:
    """Run one level to its end (or until `stop` is set: then in-flight requests are cancelled)."""
    out = LevelRun(level)
    deadline = time.perf_counter() + level.duration_s if level.duration_s else None
    todo = level.requests or 10**9
    bodies = wl.bodies(min(todo, 4096), offset)
    t0 = time.perf_counter()

    async def one(i: int, arrived: float | None = None) -> bool:
        # queue time as vLLM's client counts it: a closed loop's requests all arrive at the start (rate inf),
        # an open loop's at their Poisson arrival
        res = await one_request(pool, wl, bodies[i % len(bodies)])
        res.queued = max(0.0, res.start - (t0 if arrived is None else arrived))
        out.results.append(res)
        if progress:
            progress(len(out.results))
        return not res.unreachable

    driver = _closed_loop(one, level, todo, deadline) if level.rate is None else \
        _open_loop(one, level, todo, deadline, wl.seed + offset)
    task = asyncio.ensure_future(driver)
    stopper = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({task, stopper}, return_when=asyncio.FIRST_COMPLETED)
        out.interrupted = not task.done()
    finally:  # also when the sweep is aborted: no request outlives its level (nor the session it reads from)
        await _cancel_all([task, stopper])
    out.duration_s = time.perf_counter() - t0
    return out


async def _closed_loop(one: Callable, level: Level, todo: int, deadline: float | None) -> None:
    left = iter(range(todo))

    async def worker() -> None:
        for i in left:
            if deadline is not None and time.perf_counter() >= deadline:
                return
            if not await one(i):
                return  # refused: the server is gone, hammering it measures nothing

    await _gather_cancelling([worker() for _ in range(level.concurrency or 1)])


async def _open_loop(one: Callable, level: Level, todo: int, deadline: float | None, seed: int) -> None:
    rng = random.Random(seed)
    limit = asyncio.Semaphore(level.concurrency) if level.concurrency else None
    tasks = []

    async def limited(i: int, arrived: float) -> None:
        if limit is None:
            await one(i, arrived)
            return
        async with limit:
            await one(i, arrived)

    try:
        for i in range(todo):
            if deadline is not None and time.perf_counter() >= deadline:
                break
            tasks.append(asyncio.ensure_future(limited(i, time.perf_counter())))
            await asyncio.sleep(rng.expovariate(level.rate or 1.0))
        await asyncio.gather(*tasks)
    finally:
        await _cancel_all(tasks)


async def _cancel_all(tasks: list[asyncio.Future]) -> None:
    """Cancel the level's requests and collect every end. Shielded: when this task is cancelled again (an abort
    cancels whatever is left), the gather still collects them, so none is "Task exception was never retrieved"."""
    for t in tasks:
        t.cancel()
    await asyncio.shield(asyncio.gather(*tasks, return_exceptions=True))


async def _gather_cancelling(coros: list) -> None:
    tasks = [asyncio.ensure_future(c) for c in coros]
    try:
        await asyncio.gather(*tasks)
    finally:
        await _cancel_all(tasks)


@contextlib.asynccontextmanager
async def streams(url: str, timeout_s: float) -> AsyncIterator[StreamPool]:
    """The connections a sweep streams its requests over (closed at the end however it ends)."""
    pool = StreamPool(url, timeout_s)
    try:
        yield pool
    finally:
        await pool.close()


def session(limit: int, timeout_s: float) -> aiohttp.ClientSession:
    """A session for the server's other questions (its models)."""
    conn = aiohttp.TCPConnector(limit=limit, limit_per_host=0, force_close=False)
    return aiohttp.ClientSession(connector=conn, timeout=aiohttp.ClientTimeout(total=timeout_s, sock_connect=5))


async def served_models(sess: aiohttp.ClientSession, url: str, api_key: str | None = None) -> dict[str, str]:
    """The model names the server serves, each with its `root` (the path it was loaded from, vLLM's model_id;
    the name where the server gives none); raises ServerError with a clear message when it cannot say."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else None
    try:
        async with sess.get(url + "/v1/models", headers=headers, timeout=aiohttp.ClientTimeout(total=10)) as r:
            if r.status != 200:
                raise ServerError(f"{url}/v1/models answered HTTP {r.status}: {_message(await r.text())}")
            data = await r.json(content_type=None)
    except NETWORK_ERRORS as exc:
        raise ServerError(f"cannot reach the server at {url}: {exc or type(exc).__name__}") from None
    except ValueError as exc:
        raise ServerError(f"{url}/v1/models is not JSON: {exc}") from None
    models = data.get("data") if isinstance(data, dict) else None
    return {str(m.get("id")): str(m.get("root") or m.get("id")) for m in models or [] if isinstance(m, dict)}


class ServerError(Exception):
    """The server cannot be benchmarked (unreachable, no such model); the message says why."""
