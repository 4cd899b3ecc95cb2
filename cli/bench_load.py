"""The load side of `lynxtop bench`: streamed OpenAI-compatible requests, timed on the client.

Timing follows `vllm bench serve` (vllm/benchmarks/lib/endpoint_request_func.py) so the two clients agree on
the same server: the clock starts just before the POST, every SSE event that carries a choice is one
arrival (TTFT for the first, an inter-token gap for each later one), e2e ends at the last arrival, and the
output length comes from the usage block when the server sends one. A level runs closed-loop at a fixed
concurrency (`--max-concurrency`) or open-loop at a Poisson request rate (`--request-rate`).

The event stream is read in raw chunks and only the usage and error events are parsed as JSON: at 512
streams and 20,000 tokens/s a `json.loads` per token would cost the loop more than the measurement may.

Nothing the server sends is trusted (docs/reliability.md): an event is at most MAX_EVENT bytes, a request at
most `token_limit` token events, every parsed event must be a JSON object and every count in it an int in
[0, 2^63); anything else fails that request with its reason, and no number that failed the check reaches the
statistics. The server's other answers (/v1/models, /metrics) are read up to a cap (`read_capped`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import sys
import time
from array import array
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from lynxtop.cli.bench_http import ConnectFailed, ProtocolError, StreamPool

NETWORK_ERRORS = (aiohttp.ClientError, OSError, TimeoutError)
MAX_EVENT = 64 * 1024  # one SSE event (vLLM's token event is ~250 bytes; its usage event smaller)
MAX_JSON_ANSWER = 1 << 20  # /v1/models and other JSON answers
MAX_ERROR_TEXT = 64 * 1024  # what is read of an error answer, for its message
COUNT_LIMIT = 2**63  # a token count at or above it is no count (SQLite's INTEGER, and no server's)


def token_limit(asked: int) -> int:
    """Token events one request may bring: far above what it asked (a server may add an empty closing event, or
    count differently), yet bounded, so a server streaming forever fails the request instead of filling memory."""
    return 4 * asked + 16


class BadEvent(ValueError):
    """An event no server should send (not an object, a foreign number, too long, too many tokens); the message
    is the request's failure reason, whole."""


class TooLarge(ValueError):
    """An answer over its cap: the read stopped there."""


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
            with contextlib.suppress(ValueError, LookupError, TypeError, AttributeError, RecursionError):
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

    def body(self, i: int, offset: int = 0) -> bytes:
        """Request `i`'s body, built when it is sent: a level of 4096 requests of 131072 tokens built in advance
        took ~19 GB. The same seed, offset and index give the same prompt (random token ids in 100..30000)."""
        if self.prompts:
            prompt: Any = self.prompts[(offset + i) % len(self.prompts)]
        else:
            raw = array("H", random.Random(f"{self.seed}/{offset}/{i}").randbytes(2 * self.input_len))
            if sys.byteorder == "big":  # the same prompts on every machine
                raw.byteswap()
            prompt = [100 + v % 29_901 for v in raw]
        # the body `vllm bench serve` sends (server-default sampling), so both load the server alike
        return json.dumps({"model": self.model, "prompt": prompt, "max_tokens": self.output_len, "stream": True,
                           "ignore_eos": True, "stream_options": {"include_usage": True}}).encode()


class _Events:
    """Splits a byte stream into SSE `data:` payloads and times each event that carries a token.

    The start of an event whose blank line has not come yet is held as a list of reads (each read is searched
    once, with the held part's last byte for a blank line split between reads): no re-copy per read, and past
    MAX_EVENT bytes the request fails instead of growing."""

    def __init__(self, res: RequestResult, t0: float, keep: bool = False, asked: int | None = None):
        self.res, self.t0, self.last = res, t0, t0
        self.held: list[bytes] = []
        self.held_len = 0
        self.tokens = 0
        self.asked = asked
        self.limit = token_limit(asked) if asked else 1 << 20
        self.usage_tokens: int | None = None
        self.usage_prompt: int | None = None
        self.done = False
        self.kept: list[bytes] | None = [] if keep else None
        self.kept_len = 0
        self.kept_limit = 1024 * self.limit + MAX_EVENT  # the events kept for the text: ~250 bytes a token

    @property
    def buf(self) -> bytes:
        """The bytes of the event not yet ended."""
        return b"".join(self.held)

    def feed(self, data: bytes, now: float) -> None:
        if self.held and self.held_len < 4096:  # the usual: the start of an event from the read before
            data = self.held[0] + data if len(self.held) == 1 else b"".join(self.held) + data
            self.held, self.held_len = [], 0
        elif self.held:  # a long event: this read searched alone (and the held part's last byte)
            i = (self.held[-1][-1:] + data).find(b"\n\n")  # index 0: the held part ends with the first \n
            if i < 0:
                self._hold(data)
                return
            event = b"".join(self.held) + data[:max(i - 1, 0)]
            self.held, self.held_len = [], 0
            data = data[i + 1:]
            self._one(event, now)
        *events, rest = data.split(b"\n\n")
        for ev in events:  # _one inlined: this loop runs once a token
            if len(ev) > MAX_EVENT:
                raise BadEvent(f"bad event in the stream: an event over {MAX_EVENT // 1024} KiB")
            for line in ev.split(b"\n"):
                if line.startswith(b"data:"):
                    self._event(line[5:].strip(), now)
        if rest:
            self._hold(rest)

    def _hold(self, part: bytes) -> None:
        self.held.append(part)
        self.held_len += len(part)
        if self.held_len > MAX_EVENT:
            raise BadEvent(f"bad event in the stream: over {MAX_EVENT // 1024} KiB without an end")

    def _one(self, ev: bytes, now: float) -> None:
        if len(ev) > MAX_EVENT:
            raise BadEvent(f"bad event in the stream: an event over {MAX_EVENT // 1024} KiB")
        for line in ev.split(b"\n"):
            if line.startswith(b"data:"):
                self._event(line[5:].strip(), now)

    def _event(self, payload: bytes, now: float) -> None:
        if not payload.startswith(b"{"):  # one byte compared: an array, string or number is no event of ours
            if payload == b"[DONE]":
                self.done = True
            elif payload:
                raise BadEvent("bad event in the stream: not a JSON object")
            return
        if b'"finish_reason":null' in payload or b'"finish_reason": null' in payload:
            # a token, found with one search: error, usage-only and closing events have no null finish_reason
            if b'"usage":{' in payload or b'"usage": {' in payload:  # continuous usage stats
                self._usage(payload)
            self._token(now, payload)
            return
        if b'"error"' in payload and b'"choices"' not in payload:
            err = _object(payload).get("error")
            raise StreamError(str(err.get("message", err) if isinstance(err, dict) else err))
        if b'"usage":' in payload:  # an object, a null, or a foreign value: parsed to tell
            self._usage(payload)
        if _carries_token(payload):
            self._token(now, payload)

    def _usage(self, payload: bytes) -> None:
        usage = _object(payload).get("usage")
        if usage is None:
            return
        if not isinstance(usage, dict):
            raise BadEvent("bad event in the stream: usage is not an object")
        done, prompt = _count(usage, "completion_tokens"), _count(usage, "prompt_tokens")
        if done is not None and done > self.limit:
            raise BadEvent(f"server sent more tokens than asked: usage says {done} for max_tokens {self.asked}")
        self.usage_tokens = done if done is not None else self.usage_tokens
        self.usage_prompt = prompt if prompt is not None else self.usage_prompt

    def _token(self, now: float, payload: bytes) -> None:
        if self.tokens >= self.limit:
            raise BadEvent(f"server sent more tokens than asked: over {self.limit} events for max_tokens "
                           f"{self.asked}")
        if self.kept is not None:
            self.kept_len += len(payload)
            if self.kept_len > self.kept_limit:
                raise BadEvent(f"server sent over {_size(self.kept_limit)} of token events for max_tokens "
                               f"{self.asked}")
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


def _object(payload: bytes) -> dict[str, Any]:
    """A parsed event, which must be a JSON object (a list's `.get` once killed the worker and its level)."""
    try:
        obj = json.loads(payload)
    except RecursionError:
        raise BadEvent("bad event in the stream: JSON nested too deep") from None
    except ValueError as exc:
        raise BadEvent(f"bad event in the stream: {exc}") from None
    if not isinstance(obj, dict):
        raise BadEvent("bad event in the stream: not a JSON object")
    return obj


def _count(usage: dict[str, Any], key: str) -> int | None:
    """A token count of the usage block: an int (not a bool, not 4.0) in [0, 2^63), or None when absent."""
    v = usage.get(key)
    if v is None:
        return None
    if type(v) is not int or not 0 <= v < COUNT_LIMIT:
        raise BadEvent(f"bad event in the stream: usage.{key} is not a count: {_show(v)}")
    return v


def _show(v: Any) -> str:
    """A foreign value, short (a 4000-digit int or a long string must not become the reason)."""
    if type(v) is int and abs(v) >= 2**64:
        return f"{'-' if v < 0 else ''}an integer of {abs(v).bit_length()} bits"
    text = repr(v)
    return text if len(text) <= 40 else text[:37] + "..."


class StreamError(Exception):
    """The server reported an error inside the stream."""


async def one_request(pool: StreamPool, wl: Workload, body: dict[str, Any] | bytes) -> RequestResult:
    """POST one streamed completion and time it; never raises (but for cancellation): whatever goes wrong,
    the server's doing or a bug of ours, is this request failed with its reason, so a worker never dies and
    takes its level's count with it."""
    res = RequestResult(prompt_tokens=wl.input_len)
    try:
        return await _request(pool, wl, body, res)
    except Exception as exc:  # noqa: BLE001 - nothing foreseen: still a failed request, counted, with the why
        res.ok, res.output_tokens = False, 0
        res.error = f"unexpected error in lynxtop bench: {type(exc).__name__}: {exc}"[:300]
        return res


async def _request(pool: StreamPool, wl: Workload, body: dict[str, Any] | bytes,
                   res: RequestResult) -> RequestResult:
    headers = {"Authorization": f"Bearer {wl.api_key}"} if wl.api_key else None
    payload = body if isinstance(body, bytes) else json.dumps(body).encode()
    t0 = res.start = time.perf_counter()
    ev = _Events(res, t0, wl.keep_text, wl.output_len)
    res.chunks = ev.kept
    try:
        answer = await pool.post("/v1/completions", payload, headers, ev.feed)  # tokens timed as they are read
    except StreamError as exc:
        res.error = f"error in stream: {exc}"[:300]
        return res
    except BadEvent as exc:
        res.error = str(exc)[:300]
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
    res.output_tokens = ev.usage_tokens if ev.usage_tokens else ev.tokens  # both checked where they were read
    if ev.usage_prompt:  # the server's count (checked in _count): text prompts too
        res.prompt_tokens = ev.usage_prompt
    res.e2e = ev.last - ev.t0
    return res


def _message(text: str) -> str:
    """The server's error message from a JSON error body (vLLM and OpenAI shapes), else the text."""
    try:
        data = json.loads(text)
    except (ValueError, RecursionError):
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
    error: str = ""  # the level's driver died (a bug of ours): partial, and said so, never silently short


Progress = Callable[[int], None]  # called with the count of finished requests


async def run_level(pool: StreamPool, wl: Workload, level: Level, stop: asyncio.Event,
                    progress: Progress | None = None, offset: int = 0) -> LevelRun:
    """Run one level to its end (or until `stop` is set: then in-flight requests are cancelled)."""
    out = LevelRun(level)
    deadline = time.perf_counter() + level.duration_s if level.duration_s else None
    todo = level.requests or 10**9
    t0 = time.perf_counter()

    async def one(i: int, arrived: float | None = None) -> bool:
        # queue time as vLLM's client counts it: a closed loop's requests all arrive at the start (rate inf),
        # an open loop's at their Poisson arrival
        res = await one_request(pool, wl, wl.body(i, offset))
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
        if task.done() and not task.cancelled() and (exc := task.exception()) is not None:
            out.error = f"{type(exc).__name__}: {exc}"[:300]  # else _cancel_all would swallow it
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
    """A session for the server's other questions (its models, /metrics). Bodies come as sent (no gzip): a cap
    on what is read must be a cap on what is held."""
    conn = aiohttp.TCPConnector(limit=limit, limit_per_host=0, force_close=False)
    return aiohttp.ClientSession(connector=conn, timeout=aiohttp.ClientTimeout(total=timeout_s, sock_connect=5),
                                 auto_decompress=False, headers={"Accept-Encoding": "identity"})


async def read_capped(r: aiohttp.ClientResponse, limit: int, cut: bool = False) -> bytes:
    """The answer's body, at most `limit` bytes: past it TooLarge (or, with `cut`, the first `limit` bytes, for
    an error message); the rest is never read (the session's total timeout bounds the time)."""
    if r.content_length is not None and r.content_length > limit and not cut:
        raise TooLarge(f"an answer of {r.content_length} bytes, over {_size(limit)}")
    buf = bytearray()
    while len(buf) <= limit:
        piece = await r.content.read(min(65536, limit + 1 - len(buf)))
        if not piece:
            return bytes(buf)
        buf += piece
    if cut:
        return bytes(buf[:limit])
    raise TooLarge(f"an answer over {_size(limit)}")


def _size(n: int) -> str:
    return f"{n >> 20} MiB" if n >= 1 << 20 else f"{n >> 10} KiB"


async def served_models(sess: aiohttp.ClientSession, url: str, api_key: str | None = None) -> dict[str, str]:
    """The model names the server serves, each with its `root` (the path it was loaded from, vLLM's model_id;
    the name where the server gives none); raises ServerError with a clear message when it cannot say."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else None
    try:
        async with sess.get(url + "/v1/models", headers=headers, timeout=aiohttp.ClientTimeout(total=10)) as r:
            if r.status != 200:
                text = (await read_capped(r, MAX_ERROR_TEXT, cut=True)).decode("utf-8", "replace")
                raise ServerError(f"{url}/v1/models answered HTTP {r.status}: {_message(text)}")
            data = json.loads(await read_capped(r, MAX_JSON_ANSWER))
    except NETWORK_ERRORS as exc:
        raise ServerError(f"cannot reach the server at {url}: {str(exc) or type(exc).__name__}") from None
    except TooLarge as exc:
        raise ServerError(f"{url}/v1/models sent {exc}") from None
    except RecursionError:
        raise ServerError(f"{url}/v1/models is not JSON: nested too deep") from None
    except ValueError as exc:
        raise ServerError(f"{url}/v1/models is not JSON: {exc}") from None
    models = data.get("data") if isinstance(data, dict) else None
    return {str(m.get("id")): str(m.get("root") or m.get("id")) for m in models or [] if isinstance(m, dict)}


MAX_METRICS_PAGE = 8 << 20  # vLLM's /metrics is ~100 KiB; with many engines and LoRA adapters a few MiB


async def metrics_page(url: str) -> str | None:
    """The server's /metrics page (at most MAX_METRICS_PAGE, within 10 s); None when it has none or sends more
    (the counters read from it are then absent, never a guess)."""
    try:
        async with session(2, 10) as sess, sess.get(url + "/metrics") as r:
            return (await read_capped(r, MAX_METRICS_PAGE)).decode("utf-8", "replace") if r.status == 200 else None
    except (*NETWORK_ERRORS, TooLarge):
        return None


class ServerError(Exception):
    """The server cannot be benchmarked (unreachable, no such model); the message says why."""
