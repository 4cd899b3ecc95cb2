"""A small load generator for OpenAI-compatible servers: varied demo traffic and `vllm bench serve`-like runs.

The demo needs traffic that makes a dashboard worth watching (bursts that queue and breach the SLA, quiet
spells, the odd long-context prompt, shared system prompts that hit the prefix cache), and the benchmarks
need a closed-loop run at fixed concurrency with the numbers `vllm bench serve` prints. Both stream every
request, so TTFT and inter-token gaps are measured by the client, as a user would see them.
"""

from __future__ import annotations

import asyncio
import json
import random
import statistics
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp

SYSTEM_PROMPTS = (
    "You are lynxtop's on-call assistant. Answer operators precisely and briefly. " * 12,
    "You are a code reviewer for a GPU serving stack. Point out risks first, then style. " * 10,
)


@dataclass(frozen=True)
class Phase:
    name: str
    duration_s: float  # 0: until the generator is stopped
    concurrency: int
    prompt_tokens: tuple[int, int]
    output_tokens: tuple[int, int]
    chat_share: float = 0.5  # share of requests sent as chats with a shared system prompt (prefix-cache hits)


# One cycle of demo traffic (about 2 minutes at time scale 1), repeated.
# Prompts stay short because this node prefills at ~620 tokens/s: a burst of 20 x 300 tokens already
# queues for ~10 s (the SLA breach the dashboard should show), and the long-context phase takes a minute.
# The demo's default load: a healthy node first (short prompts, at most 2 at once, well under the SLA). Answers
# are short (16-48 tokens, a stream's ~13 tokens/s) so every 60 s window holds 35-45 finished requests: with two
# or three streams of 48-128 tokens a window held 18-22, and a new user's first screen said "too few for a p99"
# beside every percentile (tests/cli/test_s25_demo_traffic.py). Two streams, not three, and prompts of at most
# 100 tokens keep each request's TPOT under vLLM's 100 ms bucket bound: short answers feel each prefill mixed into
# their steps, and a p99 in the 100-150 ms bucket reads ~148 ms against the 150 ms limit.
DEMO_CALM: tuple[Phase, ...] = (
    Phase("warm-up", 20, 2, (20, 80), (20, 48)),
    Phase("steady", 40, 2, (20, 100), (20, 48)),
    Phase("quiet", 10, 1, (20, 60), (16, 32)),
)
# The raised load (the demo's load key): bursts and a long context that breach the SLA.
DEMO_PATTERN: tuple[Phase, ...] = (
    Phase("warm-up", 15, 2, (60, 250), (32, 96)),
    Phase("burst", 25, 20, (80, 400), (64, 200)),
    Phase("steady", 30, 8, (60, 300), (64, 160)),
    Phase("quiet", 15, 0, (1, 1), (1, 1)),
    Phase("long-context", 30, 1, (6_000, 9_000), (48, 96), chat_share=0.0),
    Phase("steady", 20, 6, (60, 300), (48, 160)),
)


@dataclass
class Stats:
    started: float = field(default_factory=time.monotonic)
    completed: int = 0
    failed: int = 0
    unavailable: int = 0  # connection refused: the server is starting, stopped or restarting
    output_tokens: int = 0
    ttft_s: list[float] = field(default_factory=list)
    tpot_s: list[float] = field(default_factory=list)
    itl_s: list[float] = field(default_factory=list)
    e2e_s: list[float] = field(default_factory=list)
    in_flight: int = 0
    phase: str = ""
    last_error: str = ""

    def summary(self, duration_s: float | None = None) -> dict[str, Any]:
        """The keys `vllm bench serve --save-result` writes (times in ms)."""
        dur = duration_s if duration_s is not None else time.monotonic() - self.started

        def ms(xs: list[float], q: float | None = None) -> float | None:
            if not xs:
                return None
            if q is None:
                return statistics.fmean(xs) * 1000
            s = sorted(xs)
            return s[min(int(q * len(s)), len(s) - 1)] * 1000

        return {
            "completed": self.completed, "failed": self.failed, "duration": dur,
            "request_throughput": self.completed / dur if dur else 0.0,
            "output_throughput": self.output_tokens / dur if dur else 0.0,
            "mean_ttft_ms": ms(self.ttft_s), "median_ttft_ms": ms(self.ttft_s, 0.5),
            "p99_ttft_ms": ms(self.ttft_s, 0.99),
            "mean_tpot_ms": ms(self.tpot_s), "median_tpot_ms": ms(self.tpot_s, 0.5),
            "p99_tpot_ms": ms(self.tpot_s, 0.99),
            "mean_itl_ms": ms(self.itl_s), "p99_itl_ms": ms(self.itl_s, 0.99),
            "mean_e2el_ms": ms(self.e2e_s),
        }


class LoadGenerator:
    """Streams completions at `base_url`; `time_scale` < 1 shortens the phases (tests, fast demos)."""

    def __init__(self, base_url: str, *, pattern: tuple[Phase, ...] = DEMO_PATTERN, seed: int = 0,
                 api_key: str | None = None, time_scale: float = 1.0, request_timeout_s: float = 600.0):
        self.base_url = base_url.rstrip("/")
        self.pattern = pattern
        self.raised_pattern: tuple[Phase, ...] | None = None  # set_raised() switches to it, and back
        self.raised = False
        self.rng = random.Random(seed)
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.time_scale = time_scale
        self.timeout = aiohttp.ClientTimeout(total=request_timeout_s, sock_connect=2.0)
        self.stats = Stats()
        self.model: str | None = None

    async def _model(self, session: aiohttp.ClientSession) -> str:
        if self.model is None:
            async with session.get(self.base_url + "/v1/models", headers=self.headers) as r:
                r.raise_for_status()
                self.model = (await r.json())["data"][0]["id"]
        return self.model

    def _body(self, phase: Phase, model: str) -> tuple[str, dict[str, Any]]:
        p = self.rng.randint(*phase.prompt_tokens)
        n = self.rng.randint(*phase.output_tokens)
        common = {"model": model, "max_tokens": n, "stream": True, "stream_options": {"include_usage": True},
                  "ignore_eos": True}
        if self.rng.random() < phase.chat_share:
            system = self.rng.choice(SYSTEM_PROMPTS)
            question = " ".join(str(self.rng.randint(0, 99999)) for _ in range(max(p // 2, 1)))
            return "/v1/chat/completions", common | {"messages": [
                {"role": "system", "content": system}, {"role": "user", "content": question}]}
        return "/v1/completions", common | {"prompt": [self.rng.randint(100, 120_000) for _ in range(p)]}

    async def one(self, session: aiohttp.ClientSession, phase: Phase) -> None:
        """One streamed request; its timings go into `stats`."""
        st = self.stats
        try:
            model = await self._model(session)
        except (TimeoutError, aiohttp.ClientError, OSError, KeyError, IndexError, ValueError) as exc:
            st.unavailable += 1
            st.last_error = f"models: {exc}"
            await asyncio.sleep(1.0)
            return
        path, body = self._body(phase, model)
        t0 = time.monotonic()
        first = last = None
        tokens = 0
        st.in_flight += 1
        try:
            async with session.post(self.base_url + path, json=body, headers=self.headers) as r:
                if r.status != 200:
                    st.failed += 1
                    st.last_error = f"HTTP {r.status}: {(await r.text())[:200]}"
                    return
                async for raw in r.content:
                    line = raw.strip()
                    if not line.startswith(b"data: ") or line == b"data: [DONE]":
                        continue
                    chunk = json.loads(line[6:])
                    if "error" in chunk:
                        st.failed += 1
                        st.last_error = str(chunk["error"].get("message", chunk["error"]))[:200]
                        return
                    choices = chunk.get("choices") or []
                    if choices and (choices[0].get("text") or (choices[0].get("delta") or {}).get("content")):
                        now = time.monotonic()
                        if first is None:
                            first = now
                        else:
                            st.itl_s.append(now - last)
                        last = now
                        tokens += 1
            end = time.monotonic()
            if first is None:
                st.failed += 1
                return
            st.completed += 1
            st.output_tokens += tokens
            st.ttft_s.append(first - t0)
            st.e2e_s.append(end - t0)
            if tokens > 1:
                st.tpot_s.append((last - first) / (tokens - 1))
        except (aiohttp.ClientConnectorError, ConnectionRefusedError) as exc:
            st.unavailable += 1
            st.last_error = str(exc)[:200]
            self.model = None  # the next server may serve another name
            await asyncio.sleep(1.0)
        except (TimeoutError, aiohttp.ClientError, OSError, ValueError) as exc:
            st.failed += 1
            st.last_error = f"{type(exc).__name__}: {exc}"[:200]
        finally:
            st.in_flight -= 1

    def active_pattern(self) -> tuple[Phase, ...]:
        return self.raised_pattern if self.raised and self.raised_pattern else self.pattern

    def set_raised(self, raised: bool) -> None:
        """Switch between the pattern and the raised one; the running cycle ends at its current phase."""
        self.raised = raised

    async def _hold(self, stop: asyncio.Event, length: float | None, raised: bool) -> None:
        """Wait out a phase (None: until stop), in slices of a second, so the load key acts within one."""
        loop = asyncio.get_running_loop()
        end = None if length is None else loop.time() + length
        while not stop.is_set() and self.raised == raised:
            left = 1.0 if end is None else min(1.0, end - loop.time())
            if left <= 0:
                return
            try:
                await asyncio.wait_for(stop.wait(), left)
            except TimeoutError:
                pass

    async def run(self, stop: asyncio.Event) -> Stats:
        """Cycle through the (active) pattern until `stop` is set."""
        max_workers = max(p.concurrency for p in (*self.pattern, *(self.raised_pattern or ())))
        current: dict[str, Phase] = {"phase": self.pattern[0]}

        async def worker(k: int, session: aiohttp.ClientSession) -> None:
            while not stop.is_set():
                phase = current["phase"]
                if k >= phase.concurrency:
                    await asyncio.sleep(0.2)
                    continue
                await self.one(session, phase)

        async with aiohttp.ClientSession(timeout=self.timeout) as session:
            tasks = [asyncio.create_task(worker(k, session)) for k in range(max_workers)]
            try:
                while not stop.is_set():
                    pattern, raised = self.active_pattern(), self.raised
                    for phase in pattern:
                        if self.raised != raised:
                            break  # the load key was pressed: start the other pattern now
                        current["phase"] = phase
                        self.stats.phase = phase.name
                        # a phase of no length lasts until stop: waiting 0 s in a loop would spin a core
                        length = phase.duration_s * self.time_scale if phase.duration_s > 0 else None
                        await self._hold(stop, length, raised)
                        if stop.is_set():
                            break
            finally:
                for t in tasks:
                    t.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
        return self.stats


async def bench(base_url: str, *, concurrency: int, requests: int, prompt_tokens: int, output_tokens: int,
                api_key: str | None = None, seed: int = 0) -> dict[str, Any]:
    """Closed loop at fixed concurrency, like `vllm bench serve --max-concurrency N --num-prompts M`."""
    phase = Phase("bench", 0, concurrency, (prompt_tokens, prompt_tokens), (output_tokens, output_tokens), 0.0)
    gen = LoadGenerator(base_url, pattern=(phase,), seed=seed, api_key=api_key)
    left = {"n": requests}
    t0 = time.monotonic()

    async def worker(session: aiohttp.ClientSession) -> None:
        while left["n"] > 0:
            left["n"] -= 1
            await gen.one(session, phase)

    async with aiohttp.ClientSession(timeout=gen.timeout) as session:
        await asyncio.gather(*(worker(session) for _ in range(concurrency)))
    out = gen.stats.summary(time.monotonic() - t0)
    out["max_concurrency"] = concurrency
    return out
