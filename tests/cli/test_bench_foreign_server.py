"""`lynxtop bench` against a hostile OpenAI-compatible server: events that are not objects, numbers no server may
send (strings, NaN, 1e400, 2^64, negatives), bodies without end. The real command runs as a subprocess against a
raw HTTP server on loopback; each case must end as the project's rules say: the request failed with a reason
(or the metric absent), every request counted, no traceback, the exit code telling the truth, memory and time
bounded (docs/bench.md, docs/reliability.md)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from support.ports import free_port

pytestmark = pytest.mark.timeout(120)

HEAD_SSE = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n"
TOKEN = b'data: {"id":"x","choices":[{"index":0,"text":"a","finish_reason":null}]}\n\n'
DONE = b"data: [DONE]\n\n"
OK_METRICS = b'vllm:request_success_total{finished_reason="stop"} 0\nvllm:num_requests_running 0\n'

Answer = Callable[[dict], Iterator[bytes]]  # the request's JSON body -> the answer's bytes, piece by piece


def usage(prompt: object = 3, completion: object = 4) -> bytes:
    """A usage event with raw JSON number text (NaN, 1e400, "4" ... as the server wrote them)."""
    return b'data: {"choices":[],"usage":{"prompt_tokens":%s,"completion_tokens":%s}}\n\n' % (
        str(prompt).encode(), str(completion).encode())


def stream(*events: bytes, tokens: int = 4) -> Answer:
    """`tokens` token events, then `events`, then [DONE]."""
    def answer(_: dict) -> Iterator[bytes]:
        yield HEAD_SSE + TOKEN * tokens + b"".join(events) + DONE
    return answer


def ok_stream(body: dict) -> Iterator[bytes]:
    yield HEAD_SSE + TOKEN * body["max_tokens"] + usage(3, body["max_tokens"]) + DONE


def plain(status: str, body: bytes, ctype: bytes = b"application/json") -> Answer:
    def answer(_: dict) -> Iterator[bytes]:
        yield b"HTTP/1.1 %s\r\nContent-Type: %s\r\nContent-Length: %d\r\n\r\n" % (status.encode(), ctype,
                                                                                   len(body)) + body
    return answer


def endless(head: bytes, first: bytes, piece: bytes) -> Answer:
    """A chunked answer whose body never ends: `first`, then `piece` forever."""
    def answer(_: dict) -> Iterator[bytes]:
        yield head + b"%x\r\n%s\r\n" % (len(first), first)
        while True:
            yield b"%x\r\n%s\r\n" % (len(piece), piece)
    return answer


MODELS = plain("200 OK", json.dumps({"object": "list", "data": [{"id": "m", "root": "org/m"}]}).encode())
METRICS = plain("200 OK", OK_METRICS, b"text/plain")


class Hostile:
    """A raw HTTP/1.1 server in a thread: each path's answer comes from a function of the request's body, written
    piece by piece until it ends or the client goes (an endless answer stops only when the client hangs up).
    `sent` counts the body bytes written per path; `posts` the completions asked."""

    def __init__(self, completions: Answer = ok_stream, models: Answer = MODELS,
                 metrics: Answer = METRICS,
                 on_post: Callable[[], None] | None = None):
        self.answers = {"/v1/completions": completions, "/v1/models": models, "/metrics": metrics}
        self.on_post = on_post
        self.sent: dict[str, int] = {}
        self.posts = 0
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.loop = asyncio.new_event_loop()
        started = threading.Event()
        self.thread = threading.Thread(target=self._serve, args=(started,), daemon=True)
        self.thread.start()
        assert started.wait(10)

    def _serve(self, started: threading.Event) -> None:
        asyncio.set_event_loop(self.loop)
        self.server = self.loop.run_until_complete(asyncio.start_server(self._handle, "127.0.0.1", self.port))
        started.set()
        self.loop.run_forever()

    async def _handle(self, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await r.readuntil(b"\r\n\r\n")
                path = head.split(b"\r\n")[0].split()[1].decode().split("?")[0]
                n = next((int(h.split(b":")[1]) for h in head.split(b"\r\n")
                          if h.lower().startswith(b"content-length:")), 0)
                body = json.loads(await r.readexactly(n)) if n else {}
                if path == "/v1/completions":
                    self.posts += 1
                    if self.on_post:
                        self.on_post()
                answer = self.answers.get(path, plain("404 Not Found", b"{}"))
                for piece in answer(body):
                    w.write(piece)
                    self.sent[path] = self.sent.get(path, 0) + len(piece)
                    await w.drain()
                if path == "/v1/completions":
                    break  # Connection: close
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.LimitOverrunError):
            pass
        finally:
            w.close()

    def close(self) -> None:
        async def stop() -> None:
            self.server.close()

        asyncio.run_coroutine_threadsafe(stop(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


def run_bench(*args: str, timeout: float = 60) -> tuple[int, str, str, float, float]:
    """`lynxtop bench ARGS` as a subprocess: exit code, stdout, stderr, its peak RSS in MiB, its wall time.

    The peak is the child's own memory's high-water mark (/proc/PID/status VmHWM, read every 20 ms while it runs):
    `ru_maxrss` from wait4 also holds the parent's RSS when it forked (Linux keeps the pre-exec mm's mark), which
    under a long pytest run is already past the limits checked here."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        t0 = time.monotonic()
        proc = subprocess.Popen([sys.executable, "-m", "lynxtop", "bench", *args], stdout=out, stderr=err,
                                env=dict(os.environ, COLUMNS="200"))
        peak_kib = 0
        while True:
            peak_kib = max(peak_kib, _hwm_kib(proc.pid))
            pid, status, _ = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            if time.monotonic() - t0 > timeout:
                os.kill(proc.pid, signal.SIGKILL)
                _, status, _ = os.wait4(proc.pid, 0)
                proc.returncode = -9
                break
            time.sleep(0.02)
        wall = time.monotonic() - t0
        proc.returncode = os.waitstatus_to_exitcode(status) if proc.returncode is None else proc.returncode
        out.seek(0)
        err.seek(0)
        return (proc.returncode, out.read().decode(errors="replace"), err.read().decode(errors="replace"),
                peak_kib / 1024, wall)


def _hwm_kib(pid: int) -> int:
    """The process's peak resident memory so far (its own, since its exec), KiB; 0 once it has exited."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return 0


def sweep(srv: Hostile, tmp: Path, *extra: str, requests: int = 2,
          timeout: float = 60) -> tuple[int, str, list[dict], float, float]:
    """Two requests at concurrency 1 with --json: exit code, stderr, the levels, peak RSS (MiB), wall time."""
    out = tmp / "levels.json"
    code, _, err, rss, wall = run_bench("--url", srv.url, "--no-store", "--concurrency", "1", "--requests",
                                        str(requests), "--warmup", "0", "--input-len", "4", "--output-len", "4",
                                        "--json", str(out), *extra, timeout=timeout)
    assert "Traceback" not in err, err
    assert out.exists(), f"no --json written (exit {code}): {err[-800:]}"
    return code, err, json.loads(out.read_text()), rss, wall


@pytest.fixture
def serve() -> Iterator[Callable[..., Hostile]]:
    made: list[Hostile] = []

    def make(**kw: object) -> Hostile:
        made.append(Hostile(**kw))  # type: ignore[arg-type]
        return made[-1]

    yield make
    for s in made:
        s.close()


# ---------------------------------------------------------------------------------------------- bug 1: not objects

@pytest.mark.parametrize("event", [
    b'data: [{"usage":{"completion_tokens":4}}]\n\n',  # usage inside a list
    b'data: ["error"]\n\n',  # an "error" that is a list
    b'data: "\\"usage\\":{"\n\n',  # a JSON string holding the marker
    b'data: 42 \n\n"usage":{\n\n',  # a number; then a line that is not `data:` at all
])
def test_an_event_that_is_not_an_object_fails_its_request_and_is_counted(serve, tmp_path, event):
    srv = serve(completions=stream(event))
    code, err, (level,), _, _ = sweep(srv, tmp_path)
    assert level["completed"] + level["failed"] == 2 and srv.posts == 2
    assert level["failed"] == 2, level
    assert any("not a JSON object" in k for k in level["failures"]), level["failures"]
    assert code == 1, err


def test_usage_that_is_not_an_object_fails_the_request(serve, tmp_path):
    srv = serve(completions=stream(b'data: {"choices":[],"usage":[1,2],"x":"\\"usage\\":{"}\n\n'))
    code, _, (level,), _, _ = sweep(srv, tmp_path)
    assert level["failed"] == 2 and code == 1
    assert any("usage" in k and "not an object" in k for k in level["failures"]), level["failures"]


def test_json_nested_past_the_parser_fails_the_request_not_the_level(serve, tmp_path):
    deep = b'data: {"choices":[],"usage":{"x":' + b"[" * 20_000 + b"]" * 20_000 + b"}}\n\n"
    srv = serve(completions=stream(deep))
    code, _, (level,), _, _ = sweep(srv, tmp_path)
    assert level["failed"] == 2 and code == 1
    assert any(k.startswith("bad event in the stream") for k in level["failures"]), level["failures"]


def test_an_error_body_nested_past_the_parser_is_still_an_http_error(serve, tmp_path):
    srv = serve(completions=plain("500 Internal Server Error", b"[" * 30_000))
    code, _, (level,), _, _ = sweep(srv, tmp_path)
    assert level["failed"] == 2 and code == 1
    assert all(k.startswith("HTTP 500") for k in level["failures"]), level["failures"]


def test_a_worker_that_meets_an_unexpected_error_fails_its_request_not_silently(monkeypatch):
    """Whatever escapes the reader (a bug of ours) is a failed request with its reason, and the level says so."""
    from lynxtop.cli import bench_load
    from lynxtop.cli.bench_http import StreamPool
    from lynxtop.cli.bench_stats import summarize

    srv = Hostile()
    try:
        def broken(res: object, ev: object) -> object:
            raise KeyError("a bug")

        monkeypatch.setattr(bench_load, "_finish", broken)
        wl = bench_load.Workload(srv.url, "m", 4, 4)

        async def go() -> bench_load.LevelRun:
            pool = StreamPool(srv.url, 10)
            try:
                return await bench_load.run_level(pool, wl, bench_load.Level(concurrency=2, requests=3),
                                                  asyncio.Event())
            finally:
                await pool.close()

        run = asyncio.run(go())
    finally:
        srv.close()
    s = summarize(run)
    assert s["completed"] + s["failed"] == 3 and s["failed"] == 3, s
    assert any("KeyError" in k and "a bug" in k for k in s["failures"]), s["failures"]


def test_a_driver_that_dies_marks_the_level(monkeypatch):
    """An exception outside any request (here the progress callback) no longer vanishes in the cancel-all."""
    from lynxtop.cli import bench_load
    from lynxtop.cli.bench_http import StreamPool
    from lynxtop.cli.bench_stats import summarize

    srv = Hostile()
    try:
        wl = bench_load.Workload(srv.url, "m", 4, 4)

        def progress(done: int) -> None:
            raise RuntimeError("progress broke")

        async def go() -> bench_load.LevelRun:
            pool = StreamPool(srv.url, 10)
            try:
                return await bench_load.run_level(pool, wl, bench_load.Level(concurrency=1, requests=3),
                                                  asyncio.Event(), progress)
            finally:
                await pool.close()

        run = asyncio.run(go())
    finally:
        srv.close()
    s = summarize(run)
    assert s["partial"] and any("progress broke" in k for k in s["failures"]), s


# ---------------------------------------------------------------------------------------------- bug 2: numbers

@pytest.mark.parametrize("prompt,completion,why", [
    (3, '"4"', "completion_tokens"), (3, "NaN", "completion_tokens"), (3, "1e400", "completion_tokens"),
    (3, "-Infinity", "completion_tokens"), (3, 2**64, "completion_tokens"), (3, -7, "completion_tokens"),
    (3, "true", "completion_tokens"), (3, "4.0", "completion_tokens"), (3, 2**63, "completion_tokens"),
    (3, "{}", "completion_tokens"), (-5, 4, "prompt_tokens"), ('"3"', 4, "prompt_tokens"),
    (2**64, 4, "prompt_tokens"), ("NaN", 4, "prompt_tokens"),
    (3, 10**6, "more tokens than asked"),  # asked for 4
])
def test_a_foreign_number_fails_its_request_with_a_reason(serve, tmp_path, prompt, completion, why):
    srv = serve(completions=stream(usage(prompt, completion)))
    code, err, (level,), _, _ = sweep(srv, tmp_path)
    assert level["failed"] == 2 and level["completed"] == 0, level
    assert any(why in k for k in level["failures"]), level["failures"]
    assert level["total_output_tokens"] == 0 and level["total_input_tokens"] == 0
    assert code == 1, err


def test_good_numbers_still_count(serve, tmp_path):
    srv = serve(completions=stream(usage(3, 4), tokens=4))
    code, err, (level,), _, _ = sweep(srv, tmp_path)
    assert code == 0, err
    assert level["completed"] == 2 and level["total_output_tokens"] == 8 and level["total_input_tokens"] == 6


@pytest.mark.parametrize("page", [
    b"vllm:request_success_total 0\nvllm:num_requests_running +Inf\n",
    b"vllm:request_success_total 0\nvllm:num_requests_running NaN\n",
    b"vllm:request_success_total 1e400\nvllm:num_requests_running 0\n",
    b"vllm:request_success_total 0\nvllm:num_requests_running -3\n",
    b"vllm:request_success_total 0\nvllm:num_requests_running 1e30\n",
    b"vllm:request_success_total 9e18\nvllm:request_success_total 9e18\nvllm:num_requests_running 0\n",
])
def test_foreign_counters_on_metrics_are_absent_not_a_traceback(serve, tmp_path, page):
    srv = serve(metrics=plain("200 OK", page, b"text/plain"))
    code, err, (level,), _, _ = sweep(srv, tmp_path)
    assert level["foreign_requests"] is None and level["completed"] == 2
    assert code == 0, err


def test_metrics_with_a_timestamp_read_the_value_not_the_timestamp(serve, tmp_path):
    page = b'vllm:request_success_total{finished_reason="stop"} 0 1700000000000\nvllm:num_requests_running 0 17\n'
    srv = serve(metrics=plain("200 OK", page, b"text/plain"))
    code, err, (level,), _, _ = sweep(srv, tmp_path)
    assert level["foreign_requests"] == 0 and code == 0, (level, err)


@pytest.mark.parametrize("page", [
    b'vllm:spec_decode_num_drafts_total 4\nvllm:spec_decode_num_draft_tokens_total 8\n'
    b'vllm:spec_decode_num_accepted_tokens_per_pos_total{position="\xc2\xb2"} 5\n',  # a superscript two
    b'vllm:spec_decode_num_drafts_total 1e300\nvllm:spec_decode_num_draft_tokens_total 1e300\n'
    b'vllm:spec_decode_num_accepted_tokens_per_pos_total{position="' + b"9" * 5000 + b'"} 5\n',
], ids=["unicode-digit", "huge"])
def test_foreign_speculative_counters_do_not_break_save_result(serve, tmp_path, page):
    srv = serve(metrics=plain("200 OK", page, b"text/plain"))
    code, err, (level,), _, _ = sweep(srv, tmp_path, "--save-result", "--result-dir", str(tmp_path / "r"))
    (saved,) = (tmp_path / "r").glob("*.json")
    data = json.loads(saved.read_text())
    assert all(0 <= v < 2**63 for k, v in data.items() if k.startswith("spec_decode_num"))
    assert code == 0, err


# ---------------------------------------------------------------------------------------------- bug 3: sizes

def test_an_endless_models_list_is_refused_after_a_bounded_read(serve, tmp_path):
    head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
    srv = serve(models=endless(head, b'{"data": [', b" " * (1 << 20)))
    code, _, err, rss, wall = run_bench("--url", srv.url, "--no-store", "--concurrency", "1", "--warmup", "0")
    assert "Traceback" not in err, err
    assert code == 3 and "/v1/models" in err and "MiB" in err, err
    assert rss < 200 and wall < 30, (rss, wall)
    assert srv.sent["/v1/models"] < 64 << 20  # the client hung up; it did not read 10 s of it
    assert srv.posts == 0


def test_an_endless_models_error_body_is_bounded(serve, tmp_path):
    head = b"HTTP/1.1 500 Internal Server Error\r\nContent-Type: text/plain\r\nTransfer-Encoding: chunked\r\n\r\n"
    srv = serve(models=endless(head, b"oops", b"x" * (1 << 20)))
    code, _, err, rss, _ = run_bench("--url", srv.url, "--no-store", "--concurrency", "1", "--warmup", "0")
    assert "Traceback" not in err and code == 3 and "HTTP 500" in err, err
    assert rss < 200 and len(err) < 4000, (rss, len(err))


def test_an_endless_metrics_page_is_no_count_and_does_not_stall(serve, tmp_path):
    head = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nTransfer-Encoding: chunked\r\n\r\n"
    srv = serve(metrics=endless(head, OK_METRICS, b"# padding\n" * 100_000))
    code, err, (level,), rss, wall = sweep(srv, tmp_path)
    assert code == 0 and level["completed"] == 2 and level["foreign_requests"] is None, (level, err)
    assert rss < 250 and wall < 30, (rss, wall)


def test_an_event_without_end_fails_its_request_at_once(serve, tmp_path):
    srv = serve(completions=endless(HEAD_SSE.replace(b"Connection: close", b"Transfer-Encoding: chunked"),
                                    b"data: ", b"x" * (1 << 20)))
    code, err, (level,), rss, wall = sweep(srv, tmp_path)
    assert level["failed"] == 2 and code == 1, level
    assert any("KiB" in k for k in level["failures"]), level["failures"]
    assert rss < 200 and wall < 20, (rss, wall)


def test_one_huge_event_fails_its_request(serve, tmp_path):
    big = b'data: {"choices":[{"index":0,"text":"' + b"a" * (200 << 10) + b'","finish_reason":null}]}\n\n'
    srv = serve(completions=stream(big, usage(3, 4)))
    code, _, (level,), _, _ = sweep(srv, tmp_path)
    assert level["failed"] == 2 and code == 1 and any("KiB" in k for k in level["failures"]), level


def test_a_server_streaming_tokens_forever_fails_the_request_early(serve, tmp_path):
    head = HEAD_SSE.replace(b"Connection: close", b"Transfer-Encoding: chunked")
    srv = serve(completions=endless(head, TOKEN, TOKEN * 1000))
    code, err, (level,), rss, wall = sweep(srv, tmp_path, "--timeout", "60")
    assert level["failed"] == 2 and code == 1, level
    assert any("more tokens than asked" in k for k in level["failures"]), level["failures"]
    assert rss < 200 and wall < 20, (rss, wall)


def test_the_event_buffer_is_bounded_and_linear():
    """64 MiB of one event arriving in 64 KiB reads: refused at the cap, never a quadratic copy."""
    from lynxtop.cli.bench_load import RequestResult, _Events

    ev = _Events(RequestResult(), 0.0)
    t0 = time.perf_counter()
    with pytest.raises(ValueError, match="KiB"):
        ev.feed(b"data: ", 0.0)
        for i in range(1024):
            ev.feed(b"x" * 65536, float(i))
    assert time.perf_counter() - t0 < 1.0


def test_the_event_reader_finds_a_blank_line_split_across_reads():
    from lynxtop.cli.bench_load import RequestResult, _Events, _finish

    res = RequestResult()
    ev = _Events(res, 0.0)
    data = TOKEN * 3 + usage(3, 3) + DONE
    for i in range(len(data)):  # one byte a read: every boundary falls between reads once
        ev.feed(data[i:i + 1], float(i))
    assert _finish(res, ev).ok and res.output_tokens == 3 and len(res.itl) == 2
    for cut in range(1, len(data)):
        res = RequestResult()
        ev = _Events(res, 0.0)
        ev.feed(data[:cut], 1.0)
        ev.feed(data[cut:], 2.0)
        assert _finish(res, ev).ok and res.output_tokens == 3, cut
