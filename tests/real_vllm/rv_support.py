"""Plumbing for the real-vLLM stage: the agent as a subprocess, its unix-socket API, an OpenAI streaming client
that times every token itself, and Prometheus page helpers.

Everything here talks to real things (processes, sockets, HTTP); nothing is faked. Kept out of the test module so
the tests read as the scenario they prove.
"""

from __future__ import annotations

import contextlib
import grp
import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
from prometheus_client.parser import text_string_to_metric_families
from support import waits

HERE = Path(__file__).resolve().parent
PREPARE = HERE / "prepare.py"


# ------------------------------------------------------------------------------------------ waiting


def wait_for(pred: Callable[[], Any], timeout: float, what: str, interval: float = 0.25) -> Any:
    """support.waits.wait_for, where a refused connection or a half answer only means "not yet"."""
    return waits.wait_for(pred, timeout, what, interval, ignore=(OSError, http.client.HTTPException, ValueError))


# ------------------------------------------------------------------------------------------ agent


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float = 10.0):
        super().__init__("localhost", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect(self._path)


@dataclass
class Agent:
    """`python -m lynxtop agent --config FILE` as a real child in its own session (so a SIGKILL hits only it)."""

    config: Path
    socket: Path
    database: Path
    log: Path
    proc: subprocess.Popen | None = None
    starts: int = 0

    def start(self) -> None:
        self.starts += 1
        fh = self.log.open("a")
        fh.write(f"\n===== agent start #{self.starts} =====\n")
        fh.flush()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "lynxtop", "agent", "--config", str(self.config)],
            stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        fh.close()
        wait_for(lambda: self._alive_and_answering(), 60, "the agent's control socket to answer")

    def _alive_and_answering(self) -> bool:
        if self.proc is not None and self.proc.poll() is not None:
            raise AssertionError(f"agent exited with {self.proc.returncode}; log tail:\n{self.log_tail()}")
        return self.socket.exists() and self.request("GET", "/v1/status")[0] == 200

    def request(self, method: str, path: str, body: dict | None = None, timeout: float = 15) -> tuple[int, Any]:
        conn = _UnixConnection(str(self.socket), timeout=timeout)
        try:
            data = json.dumps(body).encode() if body is not None else None
            headers = {"Content-Type": "application/json"} if data is not None else {}
            conn.request(method, path, body=data, headers=headers)
            resp = conn.getresponse()
            raw = resp.read()
            try:
                return resp.status, json.loads(raw) if raw else None
            except ValueError:
                return resp.status, raw.decode(errors="replace")
        finally:
            conn.close()

    def status(self) -> dict:
        code, body = self.request("GET", "/v1/status")
        assert code == 200, (code, body)
        return body

    def serving(self) -> dict:
        return self.status()["serving"]

    def events(self, since_ms: int = 0) -> list[dict]:
        code, body = self.request("GET", f"/v1/events?since={since_ms}&limit=1000")
        assert code == 200, (code, body)
        return body["events"]

    def runs(self) -> list[dict]:
        code, body = self.request("GET", "/v1/runs?limit=50")
        assert code == 200, (code, body)
        return body["runs"]

    def post(self, path: str, body: dict | None = None) -> tuple[int, Any]:
        return self.request("POST", path, body if body is not None else {})

    def wait_state(self, states: set[str], timeout: float, run_not: int | None = None) -> dict:
        def ok() -> dict | None:
            s = self.serving()
            if s["state"] in states and (run_not is None or s.get("run_id") != run_not):
                return s
            return None
        return wait_for(ok, timeout, f"serving state in {sorted(states)}"
                        + (f" with a run other than {run_not}" if run_not else ""), interval=0.5)

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, sig)
            self.proc.wait(timeout=60)

    def stop(self, timeout: float = 60) -> int | None:
        """SIGTERM and wait, SIGKILL if it will not go: the agent must never outlive the test."""
        if self.proc is None or self.proc.poll() is not None:
            return None if self.proc is None else self.proc.returncode
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)
            return None

    def log_tail(self, n: int = 40) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return "(no agent log)"


def operators_group() -> str:
    return grp.getgrgid(os.getgid()).gr_name


# ------------------------------------------------------------------------------------------ vLLM client


@dataclass
class StreamResult:
    ok: bool = False
    status: int = 0
    ttft_s: float | None = None
    itls_s: list[float] = field(default_factory=list)
    e2e_s: float = 0.0
    chunks: int = 0
    tokens: int = 0  # counted from the stream itself, to check against the usage block
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    finish_reason: str | None = None
    error: str = ""


def stream_completion(port: int, model: str, prompt: str, max_tokens: int, timeout: float = 120,
                      started: threading.Event | None = None) -> StreamResult:
    """One streamed /v1/completions call, timed on our side: first token, every gap, the usage block."""
    res = StreamResult()
    body = json.dumps({"model": model, "prompt": prompt, "max_tokens": max_tokens, "stream": True,
                       "ignore_eos": True, "temperature": 0.0, "return_token_ids": True,
                       "stream_options": {"include_usage": True}}).encode()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    t0 = time.perf_counter()
    last = None
    try:
        conn.request("POST", "/v1/completions", body=body, headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        res.status = resp.status
        if resp.status != 200:
            res.error = resp.read().decode(errors="replace")[:500]
            return res
        while True:
            line = resp.readline()
            if not line:
                break
            line = line.strip()
            if not line.startswith(b"data:"):
                continue
            payload = line[5:].strip()
            if payload == b"[DONE]":
                res.ok = True
                break
            msg = json.loads(payload)
            now = time.perf_counter()
            if msg.get("usage"):
                res.prompt_tokens = msg["usage"]["prompt_tokens"]
                res.completion_tokens = msg["usage"]["completion_tokens"]
            for ch in msg.get("choices") or []:
                if ch.get("finish_reason"):
                    res.finish_reason = ch["finish_reason"]
                # A chunk's text can be "" (a partial UTF-8 byte is held back), so count tokens by their
                # ids (`return_token_ids`): one chunk usually carries one decode step's token.
                k = len(ch.get("token_ids") or [])
                if not k:
                    continue
                res.chunks += 1
                res.tokens += k
                if last is None:
                    res.ttft_s = now - t0
                    if started is not None:
                        started.set()
                else:
                    res.itls_s.extend([(now - last) / k] * k)
                last = now
    except (OSError, http.client.HTTPException, ValueError) as exc:
        res.error = f"{type(exc).__name__}: {exc}"
    finally:
        res.e2e_s = time.perf_counter() - t0
        conn.close()
    return res


def load_loop(port: int, model: str, n: int, concurrency: int, max_tokens: int,
              prompt: str = "the gpu node serves the model and the cache is warm") -> list[StreamResult]:
    """n streamed requests, at most `concurrency` in flight; bounded in count and time, loopback only."""
    results: list[StreamResult] = []
    lock = threading.Lock()
    todo = list(range(n))

    def worker() -> None:
        while True:
            with lock:
                if not todo:
                    return
                i = todo.pop()
            r = stream_completion(port, model, f"{prompt} {i}", max_tokens)
            with lock:
                results.append(r)

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    return results


def http_get(port: int, path: str, timeout: float = 10) -> tuple[int, str]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        return resp.status, resp.read().decode(errors="replace")
    finally:
        conn.close()


# ------------------------------------------------------------------------------------------ Prometheus


def families(text: str, prefix: str = "vllm:") -> dict[str, tuple[str, set[frozenset[str]]]]:
    """family name -> (type, the label-name sets of its samples), minus the le/quantile axis of histograms."""
    out: dict[str, tuple[str, set[frozenset[str]]]] = {}
    for fam in text_string_to_metric_families(text):
        # *_created gauges are prometheus_client's bookkeeping of when a series was born, not a metric
        if not fam.name.startswith(prefix) or fam.name.endswith("_created"):
            continue
        labels = {frozenset(k for k in s.labels if k not in ("le", "quantile")) for s in fam.samples}
        out[fam.name] = (fam.type, labels)
    return out


def histogram(text: str, name: str) -> dict[str, float]:
    """Cumulative bucket counts of one histogram family, summed over its series: le (as printed) -> count."""
    buckets: dict[str, float] = {}
    for fam in text_string_to_metric_families(text):
        if fam.name != name:
            continue
        for s in fam.samples:
            if s.name == f"{name}_bucket":
                buckets[s.labels["le"]] = buckets.get(s.labels["le"], 0.0) + s.value
    return buckets


def histogram_mean(before_text: str, after_text: str, name: str) -> float:
    """Mean observation between two scrapes, from the histogram's _sum and _count."""
    def sc(text: str) -> tuple[float, float]:
        total = count = 0.0
        for fam in text_string_to_metric_families(text):
            if fam.name == name:
                total += sum(s.value for s in fam.samples if s.name == f"{name}_sum")
                count += sum(s.value for s in fam.samples if s.name == f"{name}_count")
        return total, count
    (s0, c0), (s1, c1) = sc(before_text), sc(after_text)
    return (s1 - s0) / (c1 - c0) if c1 > c0 else 0.0


def describe(pids: list[int]) -> list[str]:
    """pid, parent, group, age and title of each process: what a leak report needs to be acted on."""
    out = []
    for pid in pids:
        try:
            p = psutil.Process(pid)
            out.append(f"{pid} ppid={p.ppid()} pgid={os.getpgid(pid)} age={time.time() - p.create_time():.0f}s "
                       f"{' '.join(p.cmdline())[:160]}")
        except (psutil.Error, OSError):
            out.append(f"{pid} (gone)")
    return out


def counter(text: str, name: str) -> float:
    total = 0.0
    for fam in text_string_to_metric_families(text):
        if fam.name == name:
            total += sum(s.value for s in fam.samples if s.name in (name, f"{name}_total"))
    return total


def bucket_bounds(les: list[str], value: float, widen_below: int = 0, widen_above: int = 0) -> tuple[float, float]:
    """The (lower, upper] bucket of the server's histogram that holds `value`, optionally widened by whole
    neighbouring buckets."""
    edges = [0.0, *sorted(float(le) for le in les)]
    if edges[-1] != float("inf"):
        edges.append(float("inf"))
    i = next(k for k in range(1, len(edges)) if value <= edges[k])  # bucket (edges[i-1], edges[i]]
    return edges[max(0, i - 1 - widen_below)], edges[min(len(edges) - 1, i + widen_above)]


def histogram_quantile(q: float, before: dict[str, float], after: dict[str, float]) -> float | None:
    """Prometheus' histogram_quantile over the difference of two scrapes (linear inside the bucket)."""
    les = sorted(after, key=float)
    cum = [(float(le), after[le] - before.get(le, 0.0)) for le in les]
    total = cum[-1][1] if cum else 0.0
    if total <= 0:
        return None
    rank = q * total
    prev_b, prev_c = 0.0, 0.0
    for b, c in cum:
        if c >= rank:
            if b == float("inf"):
                return prev_b
            return prev_b + (b - prev_b) * ((rank - prev_c) / (c - prev_c) if c > prev_c else 0.0)
        prev_b, prev_c = b, c
    return prev_b


def exact_quantile(values: list[float], q: float) -> float:
    """Nearest-rank percentile of the client's own measurements."""
    vals = sorted(values)
    k = max(0, min(len(vals) - 1, int(-(-q * len(vals) // 1)) - 1))
    return vals[k]


# ------------------------------------------------------------------------------------------ processes


def vllm_tree(pid: int) -> list[psutil.Process]:
    try:
        p = psutil.Process(pid)
        return [p, *p.children(recursive=True)]
    except psutil.Error:
        return []


def vllm_processes(root: Path) -> list[psutil.Process]:
    """Live processes of OUR real vLLM: started from the prepared venv, or carrying its cache path in their
    environment (EngineCore and workers, retitled VLLM::…). Other engineers' simulated VLLM::… processes on
    this shared machine match neither, and must never be touched."""
    out = []
    mark = str(root)
    for p in psutil.process_iter(["cmdline", "status"]):
        try:
            if p.info["status"] == psutil.STATUS_ZOMBIE:
                continue
            cmd = " ".join(p.info["cmdline"] or [])
            if mark in cmd or (cmd.startswith("VLLM::") and any(mark in v for v in p.environ().values())):
                out.append(p)
        except psutil.Error:
            continue
    return out


def leftovers() -> set[str]:
    """The shared-memory segments and dist files vLLM leaves behind when killed."""
    found = set()
    with contextlib.suppress(OSError):
        found |= {f"/dev/shm/{n}" for n in os.listdir("/dev/shm") if n.startswith("psm_")}
    with contextlib.suppress(OSError):
        found |= {f"/tmp/{n}" for n in os.listdir("/tmp") if n.startswith("vllm_dist_")}
    return found


def kill_tree(pids: list[int]) -> None:
    """Test clean-up only: whatever the agent left running must not outlive the test."""
    for pid in pids:
        with contextlib.suppress(psutil.Error, OSError):
            psutil.Process(pid).kill()
