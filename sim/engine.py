"""The simulated `VLLM::EngineCore` process: start-up phases, the scheduling loop, and the "GPU memory" it holds.

It runs as a child of the API server (`python -m lynxtop.sim.engine FD DP-RANK -- SERVE-ARGS`), renames
itself `VLLM::EngineCore` (`VLLM::EngineCore_DP<r>` with data parallelism), optionally forks
`VLLM::Worker_TP<k>` processes, and talks to the API server over a socketpair with JSON lines. Like real
vLLM it does NOT die when the API server is SIGKILLed: it keeps its memory (published in the state file)
until someone signals it. SIGTERM/SIGINT end it cleanly.

Messages from the API server: {"t": "add", ...} {"t": "abort", "rid"} {"t": "shutdown"}.
Messages to it: "phase", "ready", "fail", "step", "gauges", "dead".
"""

from __future__ import annotations

import json
import math
import os
import selectors
import signal
import socket
import sys
import time
from collections import deque
from pathlib import Path

from lynxtop.sim import vlog
from lynxtop.sim.flags import ServeArgs, SimUsageError, parse_serve_args
from lynxtop.sim.model import (
    GIB,
    MemoryPlan,
    SimEngine,
    SimRequest,
    StepResult,
    plan_memory,
    weights_per_gpu,
)
from lynxtop.sim.proctitle import die_with_parent, set_title
from lynxtop.sim.state import EngineState, Holder, process_identity, read_states, remove_state, write_state

STATE_INTERVAL_S = 0.5
SHARD_BYTES = 5 * 10**9  # Hugging Face's default max_shard_size ("5GB"): DeepSeek-V4.1's 296 GB is 60 shards


class _Stop(Exception):
    """Raised from the SIGTERM/SIGINT handler to unwind to the clean-up."""


class EngineCore:
    def __init__(self, args: ServeArgs, sock: socket.socket, api_pid: int, rank: int = 0):
        self.a = args
        self.sock = sock
        self.api_pid = api_pid
        self.rank = rank  # data-parallel rank: engine label and GPU slice
        self.pid = os.getpid()
        self.prefix = f"(EngineCore_DP{rank} pid={self.pid}) "
        self.state_dir = Path(args.state_dir)
        self.world = args.tp * args.pp
        self.weights_per_gpu = weights_per_gpu(args.params, tp=args.tp, pp=args.pp, dp=args.dp,
                                               expert_parallel=args.enable_expert_parallel)
        self.gpus = self._visible_gpus()[rank * self.world:(rank + 1) * self.world]
        straggler = args.failure.straggler_gpu
        self.straggler = straggler if straggler in self.gpus else None  # a slow GPU slows its own group only
        self.slowdown = args.params.straggler_slowdown if self.straggler is not None else 1.0
        self.workers: list[int] = []
        self.mem_per_gpu = 0
        self.phase = "loading weights"
        self.engine: SimEngine | None = None
        self.plan: MemoryPlan | None = None
        self.api_gone = False
        self.hung = False
        # hung in a step after an idle spell (--sim-fail hang-after-idle): as vLLM's EngineCore stuck in a step,
        # it publishes nothing more, not even the gauges of requests that arrive (vLLM sets them at a step's end)
        self.silent = False
        self._idle_since: float | None = None  # when the engine last ran out of work (monotonic); None: busy
        self.ready_mono: float | None = None
        self._buf = b""
        self._sel = selectors.DefaultSelector()
        self._sel.register(sock, selectors.EVENT_READ)
        self._last_state = 0.0
        # (wall start, wall end, prefill share, decoding, batch) of recent steps: GPU activity is spread
        # over the wall time a step takes, not booked when it is scheduled
        self._steps: deque[tuple[float, float, float, bool, int]] = deque()
        self._tokens = {"prompt": 0, "gen": 0}
        self._acc_since = time.monotonic()
        self._orphan_since: float | None = None
        self._sim_now = 0.0  # simulated seconds since ready (requests are stamped with it)
        self._wall0: float | None = None

    # ------------------------------------------------------------------ plumbing

    def log(self, msg: str, level: str = "INFO", src: str = "core.py:100") -> None:
        vlog.log(level, src, msg, self.prefix)

    def send(self, msg: dict) -> None:
        if self.api_gone:
            return
        try:
            self.sock.sendall((json.dumps(msg, separators=(",", ":")) + "\n").encode())
        except OSError:
            self._on_api_gone()

    def _visible_gpus(self) -> list[int]:
        cvd = os.environ.get("CUDA_VISIBLE_DEVICES")
        if cvd is None or cvd.strip() == "":
            return list(range(self.a.node_gpus))
        out = []
        for part in cvd.split(","):
            part = part.strip()
            if part.isdigit() and int(part) < self.a.node_gpus:
                out.append(int(part))
        return out

    def _activity(self, now: float) -> dict[str, float]:
        """Busy/prefill/decode seconds and batch-seconds of the steps overlapping [last publish, now] (wall)."""
        t0 = self._acc_since
        out = {"busy": 0.0, "prefill": 0.0, "decode": 0.0, "batch_s": 0.0}
        for start, end, prefill_share, decoding, batch in self._steps:
            overlap = min(end, now) - max(start, t0)
            if overlap <= 0:
                continue
            out["busy"] += overlap
            out["prefill"] += overlap * prefill_share
            out["decode"] += overlap * (1 - prefill_share) if decoding else 0.0
            out["batch_s"] += overlap * batch
        while self._steps and self._steps[0][1] <= now:
            self._steps.popleft()
        return out

    def publish(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._last_state < STATE_INTERVAL_S:
            return
        span = max(now - self._acc_since, 1e-6)
        act = self._activity(now)
        holders = []
        for i, gpu in enumerate(self.gpus):
            pid = self.workers[i] if i < len(self.workers) else self.pid
            holders.append(Holder(gpu=gpu, pid=pid, start_ticks=process_identity(pid), mem_bytes=self.mem_per_gpu))
        eng = self.engine
        active = not (self.hung or self.api_gone)
        st = EngineState(
            engine_pid=self.pid, api_pid=self.api_pid, model=self.a.model, tp=self.a.tp, gpus=self.gpus,
            phase=self.phase, holders=holders,
            running=len(eng.running) if eng else 0, waiting=len(eng.waiting) if eng else 0,
            kv_usage=eng.kv_usage if eng else 0.0,
            busy_frac=min(act["busy"] / span, 1.0) if active else 0.0,
            prefill_frac=min(act["prefill"] / span, 1.0) if active else 0.0,
            decode_frac=min(act["decode"] / span, 1.0) if active else 0.0,
            mean_batch=act["batch_s"] / act["busy"] if act["busy"] else 0.0,
            prompt_tokens_per_s=self._tokens["prompt"] / span, generation_tokens_per_s=self._tokens["gen"] / span,
            straggler_gpu=self.straggler, straggler_slowdown=self.slowdown, updated_unix=time.time(),
        )
        try:
            write_state(self.state_dir, st)
        except OSError as exc:
            self.log(f"cannot write simulated GPU state in {self.state_dir}: {exc}", "WARNING")
        self._last_state = now
        self._tokens = {"prompt": 0, "gen": 0}
        self._acc_since = now

    def wait(self, seconds: float) -> None:
        """Sleep while still reading the API server's messages (they queue for the next step)."""
        deadline = time.monotonic() + seconds
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return
            self.poll(min(left, 0.1))
            self.publish()

    def poll(self, timeout: float) -> None:
        if self.api_gone:
            time.sleep(timeout)
            return
        for _key, _ in self._sel.select(timeout):
            try:
                data = self.sock.recv(1 << 16)
            except OSError:
                data = b""
            if not data:
                self._on_api_gone()
                return
            self._buf += data
            while b"\n" in self._buf:
                line, self._buf = self._buf.split(b"\n", 1)
                if line.strip():
                    self.handle(json.loads(line))

    def _on_api_gone(self) -> None:
        if self.api_gone:
            return
        self.api_gone = True
        try:
            self._sel.unregister(self.sock)
        except (KeyError, ValueError):
            pass
        if not self.a.orphan:
            raise _Stop()
        # Real vLLM's EngineCore keeps running (and holding GPU memory) when its API server is SIGKILLed.
        self.phase = "orphaned"
        self._orphan_since = time.monotonic()
        if self.engine is not None:
            self.engine.waiting.clear()
            self.engine.running.clear()
        self.publish(force=True)

    # ------------------------------------------------------------------ messages

    def handle(self, msg: dict) -> None:
        kind = msg.get("t")
        if kind == "shutdown":
            raise _Stop()
        if self.engine is None:
            return
        if self.silent:
            return  # stuck in a step: requests and aborts wait in the input queue, nothing is published
        if kind == "add":
            idle_s = self._idle_spell()
            if not self.engine.has_work and self._wall0 is not None:  # idle: the clock restarts from now
                self._sim_now = max(self._sim_now, (time.monotonic() - self._wall0) * self.a.speed)
            self.engine.add(SimRequest(
                rid=msg["rid"], prompt_tokens=int(msg["prompt_tokens"]), max_tokens=int(msg["max_tokens"]),
                arrival_s=self._sim_now, finish_reason_at_max=msg.get("reason", "length"),
                block_hashes=tuple(msg.get("hashes", ())), ready_s=self._sim_now + self.a.params.remote_kv_wait_s,
            ))
            after = self.a.failure.hang_after_idle_s
            if after is not None and idle_s is not None and idle_s >= after and not self.hung:
                self._hang_in_step()
                return
            self._gauges()
        elif kind == "abort":
            fin = self.engine.abort(msg["rid"], self._sim_now)
            if fin is not None:
                self.send({"t": "step", "fin": [fin.__dict__], "tok": [], "itl": []} | self._gauge_fields())
            self._gauges()

    def _idle_spell(self) -> float | None:
        """How long the serving engine has had no work, or None while it has some (or before it serves)."""
        if self.engine is None or self.engine.has_work or self._idle_since is None:
            return None
        return time.monotonic() - self._idle_since

    def _hang_in_step(self) -> None:
        """The first step after an idle spell never ends (a collective that never returns): /health still
        answers, the request waits for ever, and /metrics keeps the idle gauges (0 running, 0 waiting)."""
        self.hung = self.silent = True
        self.phase = "hung"
        self.publish(force=True)

    def _gauge_fields(self) -> dict:
        eng = self.engine
        assert eng is not None
        return {"running": len(eng.running), "waiting": len(eng.waiting), "deferred": eng.deferred(self._sim_now),
                "kv": eng.kv_usage}

    def _gauges(self) -> None:
        self.send({"t": "gauges"} | self._gauge_fields())

    # ------------------------------------------------------------------ start-up

    def fail(self, text: str) -> None:
        """Print an error the way vLLM does (traceback-shaped) and end with status 1."""
        vlog.raw("\n".join(self.prefix + line for line in text.strip("\n").split("\n")))
        self.send({"t": "fail", "msg": text.strip().split("\n")[-1]})
        raise SystemExit(1)

    def set_phase(self, phase: str) -> None:
        self.phase = phase
        self.send({"t": "phase", "phase": phase})
        self.publish(force=True)

    def start_workers(self) -> None:
        if not self.a.workers or self.world <= 1:
            return
        # Signals stay blocked across each fork: a group SIGTERM landing between fork() and the bookkeeping
        # below could otherwise leave a worker unrecorded (never reaped) or run EngineCore's handler in a child.
        stop_signals = {signal.SIGTERM, signal.SIGINT}
        signal.pthread_sigmask(signal.SIG_BLOCK, stop_signals)
        try:
            for k in range(self.world):
                pid = os.fork()
                if pid == 0:  # the worker: a title, no work; exits on SIGTERM and when EngineCore dies
                    try:
                        for s in stop_signals:
                            signal.signal(s, signal.SIG_DFL)
                        set_title(f"VLLM::Worker_DP{self.rank}_TP{k}" if self.a.dp > 1 else f"VLLM::Worker_TP{k}")
                        die_with_parent(signal.SIGKILL)
                        self.sock.close()
                        if os.getppid() != self.pid:
                            os._exit(0)
                        signal.pthread_sigmask(signal.SIG_UNBLOCK, stop_signals)  # a pending SIGTERM ends it here
                        while True:
                            time.sleep(3600)
                    finally:
                        os._exit(0)
                self.workers.append(pid)
        finally:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, stop_signals)  # a pending SIGTERM raises _Stop here

    def startup(self) -> None:
        a, p = self.a, self.a.params
        t0 = time.monotonic()
        self.log(f"Initializing a V1 LLM engine (v{a.version_string}) with config: model={a.model!r}, "
                 f"tensor_parallel_size={a.tp}, pipeline_parallel_size={a.pp}, max_seq_len={a.max_model_len}, "
                 f"kv_cache_dtype={a.kv_cache_dtype}, enable_prefix_caching={a.enable_prefix_caching} "
                 f"[SIMULATED by lynxtop: no GPU is used]", src="core.py:77")
        if len(self.gpus) < self.world:
            need = self.world * a.dp
            self.fail(f"ValueError: The number of required GPUs ({need}) exceeds the number of available GPUs "
                      f"({len(self._visible_gpus())}); check --tensor-parallel-size, --pipeline-parallel-size, "
                      f"--data-parallel-size and CUDA_VISIBLE_DEVICES.")
        if self.straggler is not None:
            self.log(f"[SIMULATED] GPU {self.straggler} is a straggler: thermally throttled, every step of this "
                     f"engine takes {self.slowdown:g}x as long", "WARNING", src="sim")
        self.check_free_memory()
        self.start_workers()
        self.publish(force=True)
        self.set_phase("loading weights")
        weights = self.weights_per_gpu
        load_s = a.startup_s * p.startup_weights_share
        self.log(f"Starting to load model {a.model}...", src="gpu_model_runner.py:2338")
        steps = max(int(load_s / 0.2), 1)
        shards = max(math.ceil(p.weights_bytes_total / SHARD_BYTES), 1)
        # vLLM draws the bar on the first rank only (enable_tqdm)
        bar = vlog.Bar("Loading safetensors checkpoint shards", shards) if a.use_tqdm_on_load and not self.rank \
            else None
        try:
            if bar:
                bar.show(0)
            for i in range(steps):
                self.wait(load_s / steps)
                self.mem_per_gpu = min(int(weights * (i + 1) / steps), p.gpu_mem_bytes)  # NVML never shows > total
                self.publish(force=True)
                if bar:
                    bar.show(shards * (i + 1) // steps)
            if bar:
                bar.close()
        except OSError as exc:  # tqdm re-raises a failed write: a full log disk ends the load
            self.fail(_bar_failed_text(exc))
        took = time.monotonic() - t0
        self.log(f"Loading weights took {took:.2f} seconds", src="default_loader.py:267")
        self.log(f"Model loading took {weights / GIB:.4f} GiB and {took:.6f} seconds", src="gpu_model_runner.py:2370")

        self.set_phase("kv cache")
        t1 = time.monotonic()
        self.wait(a.startup_s * p.startup_profile_share)
        if a.failure.oom:
            self.mem_per_gpu = int(p.gpu_mem_bytes * 0.99)
            self.publish(force=True)
            self.fail(_oom_text(p.gpu_mem_bytes, self.mem_per_gpu))
        plan = plan_memory(p, tp=a.tp, pp=a.pp, gpu_memory_utilization=a.gpu_memory_utilization,
                           block_size=a.block_size, kv_cache_dtype=a.kv_cache_dtype, dp=a.dp,
                           expert_parallel=a.enable_expert_parallel)
        self.plan = plan
        if plan.kv_bytes <= 0:
            if plan.weights_bytes > p.gpu_mem_bytes * a.gpu_memory_utilization:
                self.log(f"[SIMULATED] the weights take {plan.weights_bytes / GIB:.2f} GiB per GPU with TP={a.tp}, "
                         f"PP={a.pp}, DP={a.dp}, EP={a.enable_expert_parallel}; the GPU has "
                         f"{p.gpu_mem_bytes / GIB:.2f} GiB: raise --tensor-parallel-size, or add "
                         f"--enable-expert-parallel to -dp (DeepSeek-V4.1 needs 8 H200s)", "WARNING", src="sim")
            self.fail("ValueError: No available memory for the cache blocks. Try increasing `gpu_memory_utilization` "
                      "when initializing the engine (this flag also controls CPU memory reservation on the CPU "
                      "backend, despite its name). See https://docs.vllm.ai/en/latest/configuration/"
                      "conserving_memory/ for more details.")
        if plan.kv_tokens < a.max_model_len:
            need = a.max_model_len * p.kv_bytes_per_token_for(a.kv_cache_dtype) / GIB
            self.fail(f"ValueError: To serve at least one request with the models's max seq len "
                      f"({a.max_model_len}), ({need:.2f} GiB KV cache is needed, which is larger than the "
                      f"available KV cache memory ({plan.kv_bytes / GIB:.2f} GiB). Based on the available memory, "
                      f"the estimated maximum model length is {plan.kv_tokens}. Try increasing "
                      f"`gpu_memory_utilization` or decreasing `max_model_len` when initializing the engine.")
        self.mem_per_gpu = plan.weights_bytes + plan.activation_bytes + plan.kv_bytes
        self.log(f"Available KV cache memory: {plan.kv_bytes / GIB:.2f} GiB", src="gpu_worker.py:298")
        self.log(f"GPU KV cache size: {plan.kv_tokens:,} tokens", src="kv_cache_utils.py:1087")
        self.log(f"Maximum concurrency for {a.max_model_len:,} tokens per request: "
                 f"{plan.kv_tokens / a.max_model_len:.2f}x", src="kv_cache_utils.py:1091")
        self.publish(force=True)

        self.set_phase("cuda graphs")
        t2 = time.monotonic()
        self.wait(a.startup_s * p.startup_graphs_share)
        self.mem_per_gpu = plan.used_bytes
        self.log(f"Graph capturing finished in {time.monotonic() - t2:.0f} secs, took "
                 f"{plan.graph_bytes / GIB:.2f} GiB", src="gpu_model_runner.py:3106")
        self.log(f"init engine (profile, create kv cache, warmup model) took {time.monotonic() - t1:.2f} seconds",
                 src="core.py:210")
        self.engine = SimEngine(p, num_gpu_blocks=plan.num_gpu_blocks, block_size=plan.block_size,
                                max_num_seqs=a.max_num_seqs, max_num_batched_tokens=a.max_num_batched_tokens,
                                enable_prefix_caching=a.enable_prefix_caching, spec_tokens=a.speculative_tokens,
                                seed=a.seed, slowdown=self.slowdown)
        self.phase = "ready"
        self.send({"t": "ready", "num_gpu_blocks": plan.num_gpu_blocks, "block_size": plan.block_size,
                   "kv_tokens": plan.kv_tokens, "kv_bytes": plan.kv_bytes, "mem_per_gpu": self.mem_per_gpu})
        self.publish(force=True)

    def check_free_memory(self) -> None:
        """vLLM refuses to start when other processes already use the memory it was told to take."""
        p = self.a.params
        used = {g: 0 for g in self.gpus}
        for st in read_states(self.state_dir):
            if st.engine_pid == self.pid:
                continue
            for h in st.holders:
                if h.gpu in used:
                    used[h.gpu] += h.mem_bytes
        gpu, other = max(used.items(), key=lambda kv: kv[1]) if used else (0, 0)
        free = p.gpu_mem_bytes - other
        want = p.gpu_mem_bytes * self.a.gpu_memory_utilization
        if free < want:
            self.fail(f"ValueError: Free memory on device cuda:{gpu} ({free / GIB:.2f}/{p.gpu_mem_bytes / GIB:.2f} "
                      f"GiB) on startup is less than desired GPU memory utilization "
                      f"({self.a.gpu_memory_utilization}, {want / GIB:.2f} GiB). Decrease GPU memory utilization "
                      f"or reduce GPU memory used by other processes.")

    # ------------------------------------------------------------------ serving loop

    def serve(self) -> None:
        eng = self.engine
        assert eng is not None
        speed = self.a.speed
        self.ready_mono = time.monotonic()
        wall0 = self._wall0 = self.ready_mono
        self._sim_now = 0.0
        self._idle_since = self.ready_mono
        fail = self.a.failure
        while True:
            now = time.monotonic()
            if self.api_gone:
                ttl = self.a.orphan_ttl_s
                if ttl and self._orphan_since is not None and now - self._orphan_since >= ttl:
                    raise _Stop()
                self.poll(0.5)
                self.publish()
                continue
            since_ready = now - self.ready_mono
            if fail.exit0_after_s is not None and since_ready >= fail.exit0_after_s:
                self.die()
            if fail.hang_after_s is not None and since_ready >= fail.hang_after_s and not self.hung:
                self.hung = True  # like an NCCL deadlock: silent, no progress, /health still answers
                self.phase = "hung"
                self.publish(force=True)
            if not eng.has_work and self._idle_since is None:
                self._idle_since = now
            elif eng.has_work:
                self._idle_since = None
            if self.hung or not eng.has_work:
                self._sim_now = max(self._sim_now, (now - wall0) * speed)
                self.poll(0.05 if not self.hung else 0.2)
                self.publish()
                continue
            self._sim_now = max(self._sim_now, (now - wall0) * speed - 0.5 * speed)  # catch up after idle only
            res = eng.step(self._sim_now)
            if res.duration_s <= 0:
                self.poll(0.05)  # nothing schedulable (e.g. waiting for KV blocks that never free)
                continue
            step_wall_start = max(time.monotonic(), wall0 + (self._sim_now) / speed)
            self._sim_now += res.duration_s
            self.account(res, step_wall_start, max(wall0 + self._sim_now / speed, step_wall_start))
            left = wall0 + self._sim_now / speed - time.monotonic()
            if left > 0:
                self.wait(left)
            else:
                self.poll(0)
                self.publish()
            self.send_step(res)

    def account(self, res: StepResult, wall_start: float, wall_end: float) -> None:
        share = res.prefill_s / res.duration_s if res.duration_s else 0.0
        batch = len(self.engine.running) if self.engine else 0
        self._steps.append((wall_start, wall_end, share, res.decode_tokens > 0 or bool(res.tokens), batch))
        self._tokens["prompt"] += res.prefill_tokens
        self._tokens["gen"] += sum(n for _, n in res.tokens)

    def perf_estimate(self, res: StepResult) -> dict[str, float]:
        """vLLM 0.32's per-GPU FLOP and byte estimates for one step: 2 FLOPs per active parameter per token;
        the step streams this rank's weights once and reads every running request's KV (MLA keeps the whole
        latent on each TP rank); each new token writes its KV."""
        tokens = res.iteration_tokens
        if tokens <= 0 or self.engine is None:
            return {}
        p = self.a.params
        kv = p.kv_bytes_per_token_for(self.a.kv_cache_dtype)
        context = sum(r.computed for r in self.engine.running)
        return {"fl": 2.0 * p.active_params * tokens / self.world,
                "rb": self.weights_per_gpu + kv * context, "wb": float(kv * tokens)}

    def send_step(self, res: StepResult) -> None:
        self.send({
            "t": "step", "dur": res.duration_s, "tok": res.tokens, "first": res.first_tokens,
            "fin": [f.__dict__ for f in res.finished], "itl": [round(x, 6) for x in res.itl_s],
            "it": res.iteration_tokens, "prompt": res.prompt_tokens_done, "pc": res.prompt_cached_done,
            "gen": sum(n for _, n in res.tokens), "pre": res.preemptions, "pq": res.prefix_queries,
            "ph": res.prefix_hits, "sd": res.spec_drafts, "sdt": res.spec_draft_tokens, "sa": res.spec_accepted,
        } | self.perf_estimate(res) | self._gauge_fields())

    def die(self) -> None:
        """Engine death after readiness (the API server then exits with status 0: vLLM's open bug)."""
        vlog.raw("\n".join(self.prefix + ln for ln in (
            f"ERROR {time.strftime('%m-%d %H:%M:%S')} [core.py:710] EngineCore encountered a fatal error.",
            "Traceback (most recent call last):",
            '  File "vllm/v1/engine/core.py", line 701, in run_engine_core',
            "    engine_core.run_busy_loop()",
            "RuntimeError: NCCL error: unhandled cuda error (run with NCCL_DEBUG=INFO for details) [SIMULATED]",
        )))
        self.send({"t": "dead", "msg": "EngineCore encountered a fatal error."})
        raise SystemExit(1)

    # ------------------------------------------------------------------ life cycle

    def cleanup(self) -> None:
        for pid in self.workers:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        for pid in self.workers:
            try:
                os.waitpid(pid, 0)
            except OSError:
                pass
        self.workers.clear()
        remove_state(self.state_dir, self.pid)

    def run(self) -> int:
        code = 0
        try:
            self.startup()
            self.serve()
        except _Stop:
            code = 0
            if _received_signal:  # what real vLLM's EngineCore logs before it shuts its executor down
                self.log(f"[shutdown] EngineCore: trigger received signal={_received_signal}", src="core.py:1455")
        except SystemExit as exc:
            code = int(exc.code or 0)
        except KeyboardInterrupt:
            code = 0
        finally:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            self.cleanup()
        return code


def _bar_failed_text(exc: OSError) -> str:
    """What vLLM's EngineCore prints when the checkpoint shards' progress bar cannot write (a full log disk)."""
    return (
        "Traceback (most recent call last):\n"
        '  File "vllm/model_executor/model_loader/weight_utils.py", line 612, in safetensors_weights_iterator\n'
        "    for st_file in tqdm(\n"
        '  File "tqdm/std.py", line 1191, in __iter__\n'
        "    self.update(n - last_print_n)\n"
        f"OSError: [Errno {exc.errno}] {exc.strerror or exc} [SIMULATED]"
    )


def _oom_text(total: int, used: int) -> str:
    free = total - used
    return (
        "Traceback (most recent call last):\n"
        '  File "vllm/v1/worker/gpu_worker.py", line 276, in determine_available_memory\n'
        "    self.model_runner.profile_run()\n"
        f"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.75 GiB. GPU 0 has a total capacity of "
        f"{total / GIB:.2f} GiB of which {free / GIB:.2f} GiB is free. Including non-PyTorch memory, this process "
        f"has {used / GIB:.2f} GiB memory in use. Of the allocated memory {used / GIB * 0.97:.2f} GiB is allocated "
        f"by PyTorch. [SIMULATED]"
    )


_received_signal = ""  # set by the handler, logged after the unwind (printing inside a handler can re-enter I/O)


def _raise_stop(signum: int, frame: object) -> None:
    global _received_signal
    _received_signal = signal.Signals(signum).name
    raise _Stop()


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if len(argv) < 3 or argv[2] != "--" or not argv[0].isdigit() or not argv[1].isdigit():
        print("usage: python -m lynxtop.sim.engine FD DP-RANK -- SERVE-ARGS (started by the simulated API "
              "server)", file=sys.stderr)
        return 2
    fd, rank = int(argv[0]), int(argv[1])
    try:
        args = parse_serve_args(argv[3:])
    except SimUsageError as exc:
        print(f"vllm serve: error: {exc}", file=sys.stderr)
        return 2
    set_title(f"VLLM::EngineCore_DP{rank}" if args.dp > 1 else "VLLM::EngineCore")
    signal.signal(signal.SIGTERM, _raise_stop)
    signal.signal(signal.SIGINT, _raise_stop)
    sock = socket.socket(fileno=fd)
    core = EngineCore(args, sock, api_pid=os.getppid(), rank=rank)
    code = core.run()
    return code


if __name__ == "__main__":
    sys.exit(main())

