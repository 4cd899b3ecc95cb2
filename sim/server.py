"""The simulated vLLM API server process: OpenAI-compatible HTTP, /metrics, and the EngineCore child it drives.

Behaves like `vllm serve` from the outside: the port refuses connections until the engine is ready, SIGTERM
drains for --shutdown-timeout seconds and exits 0, a start-up failure exits 1 with vLLM's error text, and an
engine death after readiness ends the server with status 0 (vLLM's open bug). Everything it prints and
serves says it is SIMULATED. With --distributed-executor-backend ray it also holds a real Ray placement group
(raygroup.py): a lost Ray worker ends it like an engine death, but with status 1 (vLLM's Ray path raises).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST

from lynxtop.contract.loop import run_loop
from lynxtop.sim import vlog
from lynxtop.sim.flags import ServeArgs
from lynxtop.sim.frontends import helper_titles, start_helpers
from lynxtop.sim.metrics import V032, VllmMetrics, cache_config_labels
from lynxtop.sim.promdir import use_multiprocess_dir

if TYPE_CHECKING:
    from lynxtop.sim.raygroup import RayGroup

WORDS = ("the", "model", "is", "simulated", "by", "lynxtop", "and", "no", "GPU", "was", "harmed", "in",
         "making", "this", "token", "stream", "of", "plausible", "words", "for", "testing", ".", ",", "a")
CHARS_PER_TOKEN = 4  # the simulator's tokenizer: one token per 4 characters of text
ROUTES = (("/health", "GET"), ("/load", "GET"), ("/version", "GET"), ("/v1/models", "GET"),
          ("/v1/chat/completions", "POST"), ("/v1/completions", "POST"), ("/metrics", "GET"))


class ApiError(Exception):
    def __init__(self, status: int, message: str, kind: str = "BadRequestError", param: str | None = None):
        super().__init__(message)
        self.status, self.message, self.kind, self.param = status, message, kind, param

    def response(self) -> web.Response:
        return web.json_response({"object": "error", "message": self.message, "type": self.kind,
                                  "param": self.param, "code": self.status}, status=self.status)


@dataclass
class Pending:
    rid: str
    prompt_tokens: int
    queue: asyncio.Queue = field(default_factory=asyncio.Queue)  # int tokens, then ("end", reason) / ("error", msg)
    generated: int = 0

    @property
    def words(self) -> int:
        """Where this request's words start in WORDS (its text is fixed by its id)."""
        return int.from_bytes(hashlib.blake2b(self.rid.encode(), digest_size=4).digest(), "big")


def log(msg: str, level: str = "INFO", src: str = "api_server.py:1870") -> None:
    vlog.log(level, src, msg)


def count_text_tokens(text: str) -> int:
    return max(1, -(-len(text) // CHARS_PER_TOKEN))


def block_hashes(units: list[Any], per_block: int) -> list[int]:
    """Chained hashes of full blocks, as vLLM's prefix cache keys them (a block's key includes its prefix)."""
    out: list[int] = []
    prev = b""
    for i in range(0, len(units) - per_block + 1, per_block):
        h = hashlib.blake2b(prev + repr(units[i:i + per_block]).encode(), digest_size=8).digest()
        out.append(int.from_bytes(h, "big") >> 1)
        prev = h
    return out


@dataclass
class EngineLink:
    """The API server's end of one EngineCore (one per data-parallel rank)."""

    rank: int
    proc: subprocess.Popen
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    ready: asyncio.Future
    gone: bool = False
    load: int = 0  # requests routed here and not finished
    stats: dict = field(default_factory=lambda: {"prompt": 0, "gen": 0, "pq": 0, "ph": 0, "running": 0,
                                                  "waiting": 0, "kv": 0.0})


class SimServer:
    def __init__(self, args: ServeArgs, serve_argv: list[str]):
        self.a = args
        self.argv = serve_argv
        self.engines: list[EngineLink] = []
        self.pending: dict[str, Pending] = {}
        self.route: dict[str, EngineLink] = {}  # request id -> the engine that runs it
        self._rr = -1
        self.stop_event = asyncio.Event()
        self.engine_dead = False  # an engine died on its own (crash): /health answers 503
        self.draining = False
        self.block_size = args.block_size or args.params.default_block_size
        self.metrics: VllmMetrics | None = None
        self.prom_dir: tempfile.TemporaryDirectory | None = None
        self.helpers: list[subprocess.Popen] = []  # APIServer_<i>, DPCoordinator stand-ins
        self.created = int(time.time())
        self.ray: RayGroup | None = None  # --distributed-executor-backend ray only
        self.ray_lost = False

    @property
    def engine_gone(self) -> bool:
        return any(e.gone for e in self.engines)

    # ------------------------------------------------------------------ engine links

    async def spawn_engines(self) -> None:
        loop = asyncio.get_running_loop()
        for rank in range(self.a.dp):
            parent, child = socket.socketpair()
            cmd = [sys.executable, "-m", "lynxtop.sim.engine", str(child.fileno()), str(rank), "--", *self.argv]
            proc = subprocess.Popen(cmd, pass_fds=(child.fileno(),), stdin=subprocess.DEVNULL)
            child.close()
            reader, writer = await asyncio.open_unix_connection(sock=parent, limit=1 << 24)
            self.engines.append(EngineLink(rank, proc, reader, writer, loop.create_future()))
        self.helpers = start_helpers(helper_titles(self.a.api_server_count, self.a.dp))

    async def send(self, eng: EngineLink, msg: dict) -> None:
        if eng.gone or self.engine_dead:
            return
        try:
            eng.writer.write((json.dumps(msg, separators=(",", ":")) + "\n").encode())
            await eng.writer.drain()
        except (ConnectionError, OSError):
            pass

    async def send_all(self, msg: dict) -> None:
        for eng in self.engines:
            await self.send(eng, msg)

    def pick_engine(self) -> EngineLink:
        """Least-loaded engine (as vLLM's data-parallel front end balances); ties rotate."""
        n = len(self.engines)
        self._rr = (self._rr + 1) % n
        return min(self.engines, key=lambda e: (e.load, (e.rank - self._rr) % n))

    async def read_engine(self, eng: EngineLink) -> None:
        while True:
            try:
                line = await eng.reader.readline()
            except (ConnectionError, OSError, ValueError):
                line = b""
            if not line:
                break
            msg = json.loads(line)
            kind = msg.get("t")
            if kind == "ready":
                if not eng.ready.done():
                    eng.ready.set_result(msg)
            elif kind == "fail":
                if not eng.ready.done():
                    eng.ready.set_exception(RuntimeError(msg.get("msg", "")))
            elif kind == "step":
                self.on_step(eng, msg)
            elif kind == "gauges" and self.metrics is not None:
                self.metrics.set_gauges(msg["running"], msg["waiting"], msg["kv"], eng.rank, msg.get("deferred", 0))
                eng.stats.update(running=msg["running"], waiting=msg["waiting"], kv=msg["kv"])
        # the engine is gone
        eng.gone = True
        if not eng.ready.done():
            eng.ready.set_exception(RuntimeError("EngineCore exited during start-up"))
        if eng.ready.exception() is not None:
            return  # a start-up failure: run() reports it
        if not self.stop_event.is_set():
            self.on_engine_death()
        else:  # stopped with us (a SIGTERM to the whole group): nothing will finish the open requests
            for p in self.pending.values():
                p.queue.put_nowait(("end", "abort"))

    def on_step(self, eng: EngineLink, m: dict) -> None:
        if self.metrics is not None:
            self.metrics.on_step(m, eng.rank)
        s = eng.stats
        s["prompt"] += m.get("prompt", 0)
        s["gen"] += m.get("gen", 0)
        s["pq"] += m.get("pq", 0)
        s["ph"] += m.get("ph", 0)
        s.update(running=m.get("running", 0), waiting=m.get("waiting", 0), kv=m.get("kv", 0.0))
        for rid, n in m.get("tok", ()):
            p = self.pending.get(rid)
            if p is not None:
                p.queue.put_nowait(n)
        for f in m.get("fin", ()):
            p = self.pending.get(f["rid"])
            if p is not None:
                p.queue.put_nowait(("end", f["reason"]))

    def on_engine_death(self) -> None:
        if self.engine_dead:
            return
        self.engine_dead = True
        log("AsyncLLM output_handler failed.", "ERROR", "async_llm.py:480")
        vlog.raw("vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue. See stack trace "
                 "(above) for the root cause.")
        for p in self.pending.values():
            p.queue.put_nowait(("error", "EngineCore encountered an issue. See stack trace (above) for the root "
                                         "cause."))
        self.stop_event.set()

    def on_ray_lost(self) -> None:
        """A Ray worker is gone: vLLM's EngineCore dies of it, so ours is told to stop (send() is shut once the
        engine is dead) and the server goes the engine-death way."""
        if self.stop_event.is_set():  # our own shutdown taking the actors down
            return
        self.ray_lost = True
        for eng in self.engines:
            with contextlib.suppress(ConnectionError, OSError, RuntimeError):
                eng.writer.write(b'{"t":"shutdown"}\n')
        self.on_engine_death()

    # ------------------------------------------------------------------ HTTP

    def make_app(self) -> web.Application:
        app = web.Application(middlewares=[self.mw_metrics, self.mw_auth], client_max_size=64 * 1024 * 1024)
        app.router.add_get("/health", self.h_health)
        app.router.add_get("/version", self.h_version)
        app.router.add_get("/metrics", self.h_metrics)
        app.router.add_get("/load", self.h_load)
        app.router.add_get("/v1/models", self.h_models)
        app.router.add_post("/v1/completions", self.h_completions)
        app.router.add_post("/v1/chat/completions", self.h_chat)
        return app

    @web.middleware
    async def mw_metrics(self, request: web.Request, handler: Any) -> web.StreamResponse:
        t0 = time.perf_counter()
        status = 500
        resp: web.StreamResponse | None = None
        try:
            resp = await handler(request)
            status = resp.status
            return resp
        except web.HTTPException as exc:
            status = exc.status
            raise
        finally:
            if self.metrics is not None:
                resource = request.match_info.route.resource
                self.metrics.http.observe(resource.canonical if resource is not None else None, request.method,
                                          status, time.perf_counter() - t0, request.content_length or 0,
                                          getattr(resp, "content_length", None) or 0)

    @web.middleware
    async def mw_auth(self, request: web.Request, handler: Any) -> web.StreamResponse:
        if (self.a.api_key and request.path.startswith("/v1")
                and request.headers.get("Authorization", "") != f"Bearer {self.a.api_key}"):
            return web.json_response({"error": "Unauthorized"}, status=401)
        return await handler(request)

    async def h_health(self, request: web.Request) -> web.Response:
        return web.Response(status=503 if self.engine_dead else 200)

    async def h_version(self, request: web.Request) -> web.Response:
        return web.json_response({"version": self.a.version_string})

    async def h_metrics(self, request: web.Request) -> web.Response:
        assert self.metrics is not None
        # vLLM 0.32 answers /metrics with prometheus-fastapi-instrumentator's handler (its route comes before the
        # prometheus_client mount): never gzipped, whatever the client accepts, and `name[]` is ignored
        return web.Response(body=self.metrics.render(), headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def h_load(self, request: web.Request) -> web.Response:
        return web.json_response({"server_load": len(self.pending)})

    async def h_models(self, request: web.Request) -> web.Response:
        card = {"id": self.a.served_model_name, "object": "model", "created": self.created,
                "owned_by": "vllm (SIMULATED by lynxtop)", "root": self.a.model, "parent": None,
                "max_model_len": self.a.max_model_len,
                "permission": [{"id": f"modelperm-{uuid.uuid4().hex}", "object": "model_permission",
                                "created": self.created, "allow_create_engine": False, "allow_sampling": True,
                                "allow_logprobs": True, "allow_search_indices": False, "allow_view": True,
                                "allow_fine_tuning": False, "organization": "*", "group": None,
                                "is_blocking": False}]}
        return web.json_response({"object": "list", "data": [card]})

    async def h_completions(self, request: web.Request) -> web.StreamResponse:
        return await self.completion(request, chat=False)

    async def h_chat(self, request: web.Request) -> web.StreamResponse:
        return await self.completion(request, chat=True)

    def _parse(self, body: Any, chat: bool) -> tuple[int, list[int], int, str, bool, bool]:
        """(prompt tokens, block hashes, max tokens, finish reason at max, stream, include usage)."""
        stream, include_usage = self._check_request(body)
        prompt_tokens, hashes = self._chat_prompt(body) if chat else self._completion_prompt(body)
        max_tokens, reason = self._max_tokens(body, prompt_tokens)
        if prompt_tokens + max_tokens > self.a.max_model_len:
            raise ApiError(400, f"This model's maximum context length is {self.a.max_model_len} tokens. However, "
                                f"you requested {prompt_tokens + max_tokens} tokens ({prompt_tokens} in the "
                                f"messages, {max_tokens} in the completion). Please reduce the length of the "
                                f"messages or completion.")
        return prompt_tokens, hashes, max_tokens, reason, stream, include_usage

    def _check_request(self, body: Any) -> tuple[bool, bool]:
        """The body's envelope: model, n, stream, stream_options. Returns (stream, include usage)."""
        if not isinstance(body, dict):
            raise ApiError(400, "request body must be a JSON object")
        model = body.get("model", self.a.served_model_name)
        if model not in (self.a.served_model_name, self.a.model):
            raise ApiError(404, f"The model `{model}` does not exist.", "NotFoundError", "model")
        if body.get("n", 1) != 1:
            raise ApiError(400, "the simulator supports only n=1", param="n")
        stream = body.get("stream", False)
        if not isinstance(stream, bool):
            raise ApiError(400, "'stream' must be a boolean", param="stream")
        opts = body.get("stream_options") or {}
        if not isinstance(opts, dict):
            raise ApiError(400, "'stream_options' must be an object", param="stream_options")
        return stream, bool(opts.get("include_usage", False))

    def _chat_prompt(self, body: dict) -> tuple[int, list[int]]:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
            raise ApiError(400, "'messages' must be a non-empty array of message objects", param="messages")
        text = ""
        for m in messages:
            content = m.get("content") or ""
            if isinstance(content, list):  # OpenAI content parts
                content = "".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
            text += f"<|{m.get('role', 'user')}|>{content}"
        text += "<|assistant|>"
        return count_text_tokens(text), block_hashes(list(text), self.block_size * CHARS_PER_TOKEN)

    def _completion_prompt(self, body: dict) -> tuple[int, list[int]]:
        prompt = body.get("prompt")
        if isinstance(prompt, str) and prompt:
            return count_text_tokens(prompt), block_hashes(list(prompt), self.block_size * CHARS_PER_TOKEN)
        if isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool)
                                                       for t in prompt):
            return len(prompt), block_hashes(prompt, self.block_size)
        raise ApiError(400, "'prompt' must be a non-empty string or an array of token ids "
                            "(batched prompts are not supported by the simulator)", param="prompt")

    def _max_tokens(self, body: dict, prompt_tokens: int) -> tuple[int, str]:
        """(max tokens, finish reason when reached): without a limit the "model" stops by itself after a seeded,
        prompt-dependent length."""
        max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
        if max_tokens is None:
            room = self.a.max_model_len - prompt_tokens
            lo, hi = self.a.params.default_output_tokens_min, self.a.params.default_output_tokens_max
            seed = int.from_bytes(hashlib.blake2b(f"{self.a.seed}:{prompt_tokens}:{len(self.pending)}".encode(),
                                                  digest_size=4).digest(), "big")
            return max(1, min(lo + seed % max(hi - lo, 1), room)), "stop"
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
            raise ApiError(400, "max_tokens must be at least 1, got " + json.dumps(max_tokens), param="max_tokens")
        return max_tokens, "length"

    @staticmethod
    def _text(base: int, start: int, n: int) -> str:
        return "".join(" " + WORDS[(base + i * 7) % len(WORDS)] for i in range(start, start + n))

    async def completion(self, request: web.Request, chat: bool) -> web.StreamResponse:
        if self.draining or self.engine_dead:
            return ApiError(503, "the server is shutting down", "ServiceUnavailableError").response()
        try:
            body = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError, ValueError):
            return ApiError(400, "request body is not valid JSON").response()
        try:
            prompt_tokens, hashes, max_tokens, reason, stream, include_usage = self._parse(body, chat)
        except ApiError as exc:
            return exc.response()
        rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        p = Pending(rid=rid, prompt_tokens=prompt_tokens)
        eng = self.pick_engine()
        self.pending[rid] = p
        self.route[rid] = eng
        eng.load += 1
        await self.send(eng, {"t": "add", "rid": rid, "prompt_tokens": prompt_tokens, "max_tokens": max_tokens,
                              "reason": reason, "hashes": hashes})
        try:
            if stream:
                return await self._stream(request, p, chat, include_usage)
            return await self._whole(p, chat)
        finally:
            self.pending.pop(rid, None)
            self.route.pop(rid, None)
            eng.load -= 1

    async def abort(self, rid: str) -> None:
        eng = self.route.get(rid)
        if eng is not None:
            await self.send(eng, {"t": "abort", "rid": rid})

    def _usage(self, p: Pending) -> dict:
        return {"prompt_tokens": p.prompt_tokens, "completion_tokens": p.generated,
                "total_tokens": p.prompt_tokens + p.generated, "prompt_tokens_details": None}

    async def _whole(self, p: Pending, chat: bool) -> web.Response:
        text = ""
        try:
            while True:
                item = await p.queue.get()
                if isinstance(item, int):
                    text += self._text(p.words, p.generated, item)
                    p.generated += item
                    continue
                kind, detail = item
                if kind == "error":
                    return ApiError(500, detail, "InternalServerError").response()
                break
        except asyncio.CancelledError:
            await self.abort(p.rid)
            raise
        choice: dict[str, Any] = {"index": 0, "logprobs": None, "finish_reason": detail, "stop_reason": None}
        if chat:
            choice["message"] = {"role": "assistant", "content": text, "tool_calls": [], "reasoning_content": None}
        else:
            choice["text"] = text
            choice["prompt_logprobs"] = None
        return web.json_response({
            "id": p.rid, "object": "chat.completion" if chat else "text_completion", "created": int(time.time()),
            "model": self.a.served_model_name, "choices": [choice], "usage": self._usage(p),
            "system_fingerprint": "lynxtop-sim",
        })

    async def _stream(self, request: web.Request, p: Pending, chat: bool, include_usage: bool) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream; charset=utf-8",
                                           "Cache-Control": "no-cache"})
        await resp.prepare(request)
        created = int(time.time())
        obj = "chat.completion.chunk" if chat else "text_completion"

        def chunk(choices: list, usage: dict | None = None) -> bytes:
            data = {"id": p.rid, "object": obj, "created": created, "model": self.a.served_model_name,
                    "choices": choices}
            if include_usage:
                data["usage"] = usage
            return f"data: {json.dumps(data, separators=(',', ':'))}\n\n".encode()

        def choice(text: str | None, finish: str | None, role: bool = False) -> dict:
            c: dict[str, Any] = {"index": 0, "logprobs": None, "finish_reason": finish}
            if chat:
                c["delta"] = {"role": "assistant", "content": ""} if role else (
                    {"content": text} if text is not None else {})
            else:
                c["text"] = text or ""
                c["stop_reason"] = None
            return c

        # A token's event is this one with its text put in: built once, so a token costs one string encoding
        marker = "\x00lynxtop-token\x00"
        head, tail = (x.encode() for x in chunk([choice(marker, None)]).decode().split(json.dumps(marker), 1))
        words = p.words
        try:
            if chat:
                await resp.write(chunk([choice(None, None, role=True)]))
            while True:
                item = await p.queue.get()
                if isinstance(item, int):
                    for _ in range(item):  # one SSE event per token, as vLLM sends them
                        text = json.dumps(self._text(words, p.generated, 1))
                        await resp.write(b"".join((head, text.encode(), tail)))
                        p.generated += 1
                    continue
                kind, detail = item
                if kind == "error":
                    err = {"error": {"object": "error", "message": detail, "type": "InternalServerError",
                                     "code": 500}}
                    await resp.write(f"data: {json.dumps(err)}\n\n".encode())
                    break
                await resp.write(chunk([choice("" if not chat else None, detail)]))
                if include_usage:
                    await resp.write(chunk([], self._usage(p)))
                break
            await resp.write(b"data: [DONE]\n\n")
            await resp.write_eof()
        except (ConnectionResetError, asyncio.CancelledError):
            await self.abort(p.rid)  # the client went away: free its KV blocks
            raise
        return resp

    # ------------------------------------------------------------------ life cycle

    async def stats_logger(self) -> None:
        """vLLM's periodic 'Engine 000: Avg prompt throughput ...' line, per engine, while busy."""
        interval = self.a.log_interval_s
        if interval <= 0:
            return
        last = [dict(e.stats) for e in self.engines]
        last_t = time.monotonic()
        while True:
            await asyncio.sleep(interval)
            now = time.monotonic()
            dt = max(now - last_t, 1e-6)
            for eng, prev in zip(self.engines, last, strict=True):
                s = eng.stats
                if not (s["prompt"] != prev["prompt"] or s["gen"] != prev["gen"] or s["running"] or s["waiting"]):
                    continue
                dq, dh = s["pq"] - prev["pq"], s["ph"] - prev["ph"]
                log(f"Engine {eng.rank:03d}: Avg prompt throughput: {(s['prompt'] - prev['prompt']) / dt:.1f} "
                    f"tokens/s, Avg generation throughput: {(s['gen'] - prev['gen']) / dt:.1f} tokens/s, "
                    f"Running: {s['running']} reqs, Waiting: {s['waiting']} reqs, "
                    f"GPU KV cache usage: {s['kv'] * 100:.1f}%, "
                    f"Prefix cache hit rate: {(dh / dq * 100 if dq else 0):.1f}%", src="loggers.py:123")
            last, last_t = [dict(e.stats) for e in self.engines], now

    async def stop_engines(self, timeout: float = 10.0) -> None:
        await self.send_all({"t": "shutdown"})
        deadline = time.monotonic() + timeout
        while any(e.proc.poll() is None for e in self.engines) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        for e in self.engines:
            if e.proc.poll() is None:
                e.proc.kill()
                e.proc.wait()

    async def drain(self) -> None:
        """SIGTERM with --shutdown-timeout: refuse new requests, let in-flight ones finish, then abort the rest."""
        self.draining = True
        timeout = self.a.shutdown_timeout_s
        if timeout > 0 and self.pending and not self.engine_gone:
            log(f"Draining {len(self.pending)} in-flight requests (up to {timeout:g} s)...", src="api_server.py:1950")
            deadline = time.monotonic() + timeout
            while self.pending and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
        for rid in list(self.pending):
            await self.abort(rid)
        deadline = time.monotonic() + 2.0
        while self.pending and time.monotonic() < deadline:
            await asyncio.sleep(0.02)

    def build_metrics(self, info: dict) -> VllmMetrics:
        """The /metrics families, once the engines reported their memory plan. With more than one API server
        vLLM keeps its metrics in a Prometheus multiprocess directory and renders the page from there."""
        a = self.a
        page_registry = None
        if a.api_server_count > 1:
            self.prom_dir = tempfile.TemporaryDirectory(prefix="lynxtop-sim-prom-")
            page_registry = use_multiprocess_dir(self.prom_dir.name)
        return VllmMetrics(
            model_name=a.served_model_name, version=a.version_tuple, max_model_len=a.max_model_len,
            spec_decode=a.speculative_tokens > 0, engines=len(self.engines), page_registry=page_registry,
            cache_info=cache_config_labels(
                a.version_tuple, block_size=info["block_size"], user_block_size=a.block_size is not None,
                cache_dtype=a.kv_cache_dtype, enable_prefix_caching=a.enable_prefix_caching,
                gpu_memory_utilization=a.gpu_memory_utilization, num_gpu_blocks=info["num_gpu_blocks"],
                kv_tokens=info["kv_tokens"], max_model_len=a.max_model_len))

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.stop_event.set)
        self._announce()
        code = await self._reserve_ray()
        if code is not None:
            return code
        readers: list[asyncio.Task] = []
        code = await self._start_engines(readers)
        if code is not None:
            return code
        self._log_routes()
        # handlers all end within the drain; never let a stuck client hold the exit for aiohttp's default 60 s
        runner = web.AppRunner(self.make_app(), access_log=None, handle_signals=False, shutdown_timeout=3.0)
        await runner.setup()
        if not await self._bind(runner):
            return 1
        return await self._serve(runner, readers)

    def _announce(self) -> None:
        a = self.a
        log(f"vLLM API server version {a.version_string}")
        log("THIS IS A SIMULATED vLLM SERVER (lynxtop): no model is loaded and no GPU is used; tokens are "
            "synthetic and timings follow lynxtop's DeepSeek-V4.1 TP8 model.", "WARNING")
        log(f"non-default args: {a.non_default}", src="utils.py:326")
        if a.api_server_count > 1 and "api_server_count" not in a.non_default:
            log(f"Defaulting api_server_count to data_parallel_size ({a.api_server_count}).", src="serve.py:126")

    async def _reserve_ray(self) -> int | None:
        """With the Ray backend vLLM reserves the GPUs before it loads anything; an exit code when it cannot."""
        if self.a.distributed_executor_backend != "ray":
            return None
        from lynxtop.sim.raygroup import RayGroup

        self.ray = RayGroup(self.a)
        code = await self.ray.start(self.stop_event)
        if code == 0:
            log("Shutting down during start-up (signal received).", src="api_server.py:1990")
        return code

    async def _start_engines(self, readers: list[asyncio.Task]) -> int | None:
        """The EngineCores up (None), or the exit code of a start-up that ended (a signal, a failed core)."""
        await self.spawn_engines()
        readers.extend(asyncio.create_task(self.read_engine(e)) for e in self.engines)
        all_ready = asyncio.gather(*(e.ready for e in self.engines), return_exceptions=True)
        stop_wait = asyncio.create_task(self.stop_event.wait())
        await asyncio.wait({all_ready, stop_wait}, return_when=asyncio.FIRST_COMPLETED)
        if not all_ready.done() or self.stop_event.is_set():  # SIGTERM during start-up (a group one may
            # already have ended the EngineCore: that is our shutdown, not an initialization failure)
            log("Shutting down during start-up (signal received).", src="api_server.py:1990")
            await self.stop_engines()
            return 0
        results = all_ready.result()
        failed = [e for e, r in zip(self.engines, results, strict=True) if isinstance(r, BaseException)]
        if failed:
            await self.stop_engines(timeout=5.0)
            procs = ", ".join(f"'EngineCore_DP{e.rank}': {e.proc.returncode}" for e in failed)
            vlog.raw("RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): "
                     f"{{{procs}}}")
            return 1
        self.metrics = self.build_metrics(results[0])
        return None

    def _log_routes(self) -> None:
        a = self.a
        url_host = f"[{a.host}]" if ":" in a.host else a.host
        if a.version_tuple >= V032:  # 0.32's wording (checked on a real server), then the route table
            log(f"Starting vLLM server on http://{url_host}:{a.port}", src="entry.py:140")
            log("Available routes are:", src="launcher.py:186")
            for route, methods in ROUTES:
                log(f"Route: {route}, Methods: {methods}", src="launcher.py:196")
        else:
            log(f"Starting vLLM API server 0 on http://{url_host}:{a.port}", src="launcher.py:29")

    async def _bind(self, runner: web.AppRunner) -> bool:
        a = self.a
        try:
            await web.TCPSite(runner, a.host, a.port, reuse_address=True).start()
        except OSError as exc:
            vlog.raw(f"OSError: [Errno {exc.errno}] error while attempting to bind on address "
                     f"({a.host!r}, {a.port}): {exc.strerror}")
            await runner.cleanup()
            await self.stop_engines()
            return False
        return True

    async def _serve(self, runner: web.AppRunner, readers: list[asyncio.Task]) -> int:
        log(f"Started server process [{os.getpid()}]", src="server.py:84")
        log("Waiting for application startup.", src="on.py:48")
        log("Application startup complete.", src="on.py:62")
        stats_task = asyncio.create_task(self.stats_logger())
        if self.ray is not None:
            self.ray.watch(self.on_ray_lost)
        await self.stop_event.wait()
        if not self.engine_dead:
            await self.drain()
        log("Shutting down FastAPI HTTP server.", src="launcher.py:99")
        stats_task.cancel()
        with contextlib.suppress(Exception):
            await runner.shutdown()
            await runner.cleanup()
        await self.stop_engines()
        for t in readers:
            t.cancel()
        # after an engine death vLLM exits 0 (the supervisor must not trust the code); a lost Ray worker raises
        return 1 if self.ray_lost else 0


def serve(args: ServeArgs, serve_argv: list[str]) -> int:
    """Run the server; however it ends (short of SIGKILL), its EngineCores end with it, as vLLM's process
    manager sees to. Only a SIGKILL of this process leaves them orphaned."""
    server = SimServer(args, serve_argv)
    try:
        return run_loop(server.run())  # on uvloop, as vLLM's API server runs
    finally:
        if server.ray is not None:
            server.ray.close()  # the placement group goes back to the cluster
        _end_engines([e.proc for e in server.engines] + server.helpers)


def _end_engines(procs: list[subprocess.Popen], grace_s: float = 5.0) -> None:
    alive = [p for p in procs if p.poll() is None]
    for p in alive:
        with contextlib.suppress(OSError):
            p.terminate()
    deadline = time.monotonic() + grace_s
    for p in alive:
        try:
            p.wait(timeout=max(deadline - time.monotonic(), 0.01))
        except subprocess.TimeoutExpired:
            p.kill()  # "Process manager: force killing remaining process EngineCore"
            p.wait()
