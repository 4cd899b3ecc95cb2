"""`lynxtop bench` end to end: the real command against an agent serving the simulator (stored per run, JSON
with vLLM's keys, the documented curve shape, compare), and against a server that fails on purpose (clear
errors, partial results kept and marked, Ctrl-C)."""

from __future__ import annotations

import asyncio
import re
import shutil
import signal
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.bench_env import (
    FAST_SPEED,
    PLATEAU_SPEED,
    DyingServer,
    FlakyServer,
    bench,
    bench_popen,
    levels,
    start_agent,
    stop_agent,
    switch,
)
from support.db import db_rows
from support.ports import free_port

from lynxtop.cli.bench_stats import VLLM_KEYS
from lynxtop.cli.bench_view import compare, pct
from lynxtop.sim.model import (
    REF_LONG_OUTPUT_TOKENS,
    REF_LONG_PROMPT_TOKENS,
    TARGET_PLATEAU_TOKENS_PER_S,
    TARGET_PLATEAU_TPOT_S,
    TARGET_SINGLE_STREAM_TOKENS_PER_S,
)

pytestmark = pytest.mark.timeout(600)

ISSUE_KEYS = ("request_throughput", "output_throughput", "total_token_throughput", "mean_ttft_ms", "median_ttft_ms",
              "p99_ttft_ms", "mean_tpot_ms", "p99_tpot_ms", "mean_itl_ms", "p99_itl_ms", "max_concurrency",
              "completed", "failed", "duration")


def wait_line(proc, text: str, timeout: float = 60) -> None:
    """Read the command's stderr until a line holds `text` (the progress lines come one a line off a terminal)."""
    deadline = time.monotonic() + timeout
    seen = []
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        seen.append(line)
        if text in line:
            return
        assert line or proc.poll() is None, "".join(seen)
    raise AssertionError(f"no {text!r} in {timeout} s: {''.join(seen)}")


@pytest.fixture(scope="module")
def node() -> Iterator[dict]:
    tmp = Path(tempfile.mkdtemp(prefix="lxb-", dir="/tmp"))
    agent = start_agent(tmp)
    try:
        yield {"tmp": tmp, "agent": agent, "cfg": str(agent.cfg), "db": tmp / "state" / "lynxtop.db"}
    finally:
        stop_agent(agent, tmp)
        shutil.rmtree(tmp, ignore_errors=True)


def test_sweep_is_stored_with_its_run_and_writes_vllm_keys(node, tmp_path):
    st = asyncio.run(node["agent"].status())["serving"]
    out = tmp_path / "bench.json"
    r = bench("--config", node["cfg"], "--concurrency", "1", "2", "4", "--input-len", "16", "--output-len", "16",
              "--json", str(out))
    assert r.returncode == 0, r.stderr
    assert "out tok/s" in r.stdout and "output tokens/s" in r.stdout  # the table and the chart
    assert "level 3/3 c=4" in r.stderr and "16/16" in r.stderr  # the progress line: level, done/total
    data = levels(out)
    assert [d["max_concurrency"] for d in data] == [1, 2, 4]
    for d in data:
        assert set(ISSUE_KEYS) <= set(d) and set(VLLM_KEYS) <= set(d)
        assert d["completed"] == d["num_prompts"] and d["failed"] == 0 and not d["partial"]
        assert d["total_output_tokens"] == 16 * d["completed"]
        assert d["median_tpot_ms"] <= d["p99_tpot_ms"] and d["mean_itl_ms"] > 0
    rows = db_rows(node["db"], "SELECT * FROM bench_results WHERE bench_id = ? ORDER BY concurrency",
                   (data[0]["bench_id"],))
    assert [x["concurrency"] for x in rows] == [1, 2, 4]
    for x in rows:
        assert x["run_id"] == st["run_id"] and x["profile"] == "fast" and x["vllm_version"] == st["vllm_version"]
        assert x["simulated"] == 1 and x["partial"] == 0 and x["input_len"] == 16 and x["output_len"] == 16
        assert x["goodput_per_s"] is not None  # the [sla] of the config
    assert rows[2]["output_tokens_per_s"] == pytest.approx(data[2]["output_throughput"])


def test_curve_shape_matches_the_simulators_documented_targets(node, tmp_path):
    # one long-context stream on the fast clock: ~1.2 tokens/s end to end
    single = tmp_path / "single.json"
    r = bench("--config", node["cfg"], "--concurrency", "1", "--requests", "1", "--warmup", "0",
              "--input-len", str(REF_LONG_PROMPT_TOKENS), "--output-len", str(REF_LONG_OUTPUT_TOKENS),
              "--json", str(single))
    assert r.returncode == 0, r.stderr
    s = levels(single)[0]
    tok_s = REF_LONG_OUTPUT_TOKENS / (s["mean_e2el_ms"] / 1000 * FAST_SPEED)
    assert tok_s == pytest.approx(TARGET_SINGLE_STREAM_TOKENS_PER_S, rel=0.10), s

    # the plateau on the slower clock: within 5 % of 86 tokens/s, ~138 ms per output token
    switch(node["agent"], "plateau")
    curve = tmp_path / "curve.json"
    r = bench("--config", node["cfg"], "--concurrency", "1", "4", "16", "32", "--input-len", "16",
              "--output-len", "80", "--rounds", "1", "--json", str(curve))  # one request per stream
    assert r.returncode == 0, r.stderr
    by_c = {d["max_concurrency"]: d for d in levels(curve)}
    tput = {c: d["output_throughput"] / PLATEAU_SPEED for c, d in by_c.items()}
    assert tput[1] < tput[4] < tput[16], tput  # rises with concurrency
    plateau = by_c[32]
    assert plateau["output_throughput"] / PLATEAU_SPEED == pytest.approx(TARGET_PLATEAU_TOKENS_PER_S, rel=0.05), tput
    assert abs(tput[32] - tput[16]) / tput[16] < 0.10, tput  # flat past the knee
    tpot_s = plateau["median_tpot_ms"] / 1000 * PLATEAU_SPEED
    assert tpot_s == pytest.approx(32 / 88, rel=0.10) and tpot_s > TARGET_PLATEAU_TPOT_S  # streams / 88 s
    tpot16 = by_c[16]["median_tpot_ms"] / 1000 * PLATEAU_SPEED
    assert tpot16 == pytest.approx(TARGET_PLATEAU_TPOT_S * 16 / 12, rel=0.15), by_c[16]
    switch(node["agent"], "fast")


def test_compare_two_stored_sweeps_side_by_side_in_percent(node, tmp_path):
    ids = []
    for output_len in ("16", "32"):
        out = tmp_path / f"b{output_len}.json"
        r = bench("--config", node["cfg"], "--concurrency", "1", "2", "--input-len", "8", "--output-len", output_len,
                  "--json", str(out))
        assert r.returncode == 0, r.stderr
        ids.append(levels(out)[0]["bench_id"])
        time.sleep(1.1)  # sweep ids carry the second
    r = bench("compare", ids[0], ids[1], "--config", node["cfg"])
    assert r.returncode == 0, r.stderr
    assert f"A = {ids[0]}" in r.stdout and f"B = {ids[1]}" in r.stdout
    lines = [ln for ln in r.stdout.splitlines() if ln.strip().startswith(("1 ", "2 "))]
    # 8 requests a level (the default at these levels): n shown, no percentage (contract/change.py)
    assert len(lines) == 2 and all(" 8 " in ln and "n<30" in ln and "%" not in ln for ln in lines)
    st = asyncio.run(node["agent"].status())["serving"]
    r = bench("compare", ids[0], f"run:{st['run_id']}", "--config", node["cfg"], "--json")
    assert r.returncode == 0, r.stderr
    assert ids[1] in r.stdout  # run:N is that run's newest sweep
    r = bench("list", "--config", node["cfg"])
    assert ids[0] in r.stdout and ids[1] in r.stdout
    r = bench("compare", ids[0], "no-such-sweep", "--config", node["cfg"])
    assert r.returncode == 2 and "no stored sweep 'no-such-sweep'" in r.stderr


def test_compare_text_differences():
    a = [{"max_concurrency": 1, "output_throughput": 100.0, "p99_ttft_ms": 200.0, "completed": 40}]
    b = [{"max_concurrency": 1, "output_throughput": 125.0, "p99_ttft_ms": 150.0, "partial": True, "completed": 30}]
    text = compare("a", a, "b", b)
    assert "+25.0%" in text and "-25.0%" in text and "1 *" in text
    assert pct(None, 1.0, 40, 40) == "-" and pct(0.0, 1.0, 40, 40) == "A~0"


def test_compare_states_n_and_gives_no_percentage_from_a_handful_of_requests():
    """Issue 28.4: "+2848 %" came from a level's TTFT p99 over 4 requests a side (the p99 of 4 is their slowest)."""
    a = [{"max_concurrency": 1, "output_throughput": 10.0, "p99_ttft_ms": 35.0, "completed": 4},
         {"max_concurrency": 8, "output_throughput": 80.0, "p99_ttft_ms": 40.0, "completed": 32}]
    b = [{"max_concurrency": 1, "output_throughput": 9.0, "p99_ttft_ms": 1032.0, "completed": 4},
         {"max_concurrency": 8, "output_throughput": 88.0, "p99_ttft_ms": 44.0, "completed": 29}]
    rows = {ln.split()[0]: ln.split() for ln in compare("a", a, "b", b).splitlines()
            if ln.strip().startswith(("1 ", "8 "))}
    assert rows["1"][1:3] == ["4", "4"] and rows["8"][1:3] == ["32", "29"]  # n A, n B
    assert "%" not in " ".join(rows["1"]) + " ".join(rows["8"]) and "n<30" in rows["1"] and "n<30" in rows["8"]
    text = compare("a", a, "b", [{**b[1], "completed": 30}])
    assert "+10.0%" in text  # 30 a side is enough
    assert "fewer than 30 samples" in text and "over those requests" in text  # the rule and the statistic, stated
    assert pct(1.0, 2.0) == "n?"  # a stored level without its count: no percentage either


def test_store_call_checks_types_and_needs_control(node):
    code, body = asyncio.run(node["agent"].api("POST", "/v1/bench", {"result": {"concurrency": "eight"}}))
    assert code == 400 and body["error"] == "wrong_type" and "concurrency" in body["message"]
    code, body = asyncio.run(node["agent"].api("POST", "/v1/bench", {}))
    assert code == 400 and body["error"] == "missing_field"


def test_unreachable_server_and_wrong_model_are_clear(node):
    r = bench("--url", f"http://127.0.0.1:{free_port()}", "--no-store", "--concurrency", "1")
    assert r.returncode == 3 and "cannot reach the server" in r.stderr, r.stderr
    r = bench("--config", node["cfg"], "--model", "no/such-model", "--concurrency", "1")
    assert r.returncode == 2 and "model 'no/such-model' is not served" in r.stderr and "DeepSeek" in r.stderr


def test_http_errors_mid_stream_are_counted_with_reasons(tmp_path):
    srv = FlakyServer()
    try:
        out = tmp_path / "flaky.json"
        r = bench("--url", srv.url, "--no-store", "--concurrency", "1", "2", "--requests", "6", "--warmup", "0",
                  "--output-len", "8", "--json", str(out))
    finally:
        srv.close()
    assert r.returncode == 1, r.stderr
    data = levels(out)
    assert sum(d["failed"] for d in data) == 7 and sum(d["completed"] for d in data) == 5  # 4 x 500, 3 cut
    reasons = " ".join(k for d in data for k in d["failures"])
    assert "HTTP 500: simulated overload" in reasons and ("stream cut" in reasons or "without [DONE]" in reasons)
    assert "failed: HTTP 500: simulated overload" in r.stdout and "NOT stored" in r.stderr


def test_server_gone_keeps_finished_levels_and_marks_the_partial_one(tmp_path):
    srv = DyingServer()  # killed mid-level: the kernel resets its connections, as for a vLLM that dies
    out = tmp_path / "gone.json"
    proc = bench_popen("--url", srv.url, "--no-store", "--concurrency", "1", "1", "--duration", "3", "--warmup", "0",
                       "--output-len", "4", "--json", str(out))
    try:
        wait_line(proc, "level 2/2")  # the server goes away during the second level
        srv.stop()
        _, err = proc.communicate(timeout=60)
    finally:
        srv.close()
    assert proc.returncode == 1, err
    data = levels(out)
    assert len(data) == 2 and not data[0]["partial"] and data[1]["partial"]
    assert data[0]["completed"] > 0 and "server stopped answering" in err


def test_ctrl_c_stops_cleanly_and_keeps_finished_levels(node, tmp_path):
    out = tmp_path / "int.json"
    proc = bench_popen("--config", node["cfg"], "--concurrency", "2", "4", "--duration", "4", "--warmup", "0",
                       "--input-len", "8", "--output-len", "16", "--json", str(out))
    wait_line(proc, "level 2/2")
    time.sleep(0.5)  # Ctrl-C mid-level is the case under test: level 2 runs a while (of its 4 s) first
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    data = levels(out)
    assert len(data) == 2 and not data[0]["partial"] and data[1]["partial"] and data[0]["completed"] > 0
    rows = db_rows(node["db"], "SELECT concurrency, partial FROM bench_results WHERE bench_id = ? ORDER BY id",
                   (data[0]["bench_id"],))
    assert [(x["concurrency"], x["partial"]) for x in rows] == [(2, 0), (4, 1)]
    assert "Traceback" not in err


def test_a_second_ctrl_c_aborts_at_once_without_a_traceback(node, tmp_path):
    proc = bench_popen("--config", node["cfg"], "--concurrency", "2", "4", "--duration", "6", "--warmup", "0",
                       "--input-len", "8", "--output-len", "16")
    wait_line(proc, "level 2/2")
    proc.send_signal(signal.SIGINT)
    wait_line(proc, "Ctrl-C again")
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    # the second press aborts the level in flight; one that lands after the clean stop already finished the sweep
    # ends the command as Ctrl-C does (killed by SIGINT while it exits): either way no traceback
    if "aborted;" in err:
        # on a loaded machine level 2 may finish between the two presses: then both levels are stored
        assert proc.returncode == 130 and re.search(r"aborted; [12] finished level\(s\) stored as sweep", err), err
    else:
        assert proc.returncode in (130, -signal.SIGINT) and "stopped by Ctrl-C" in err, err
    assert "Traceback" not in err and "never retrieved" not in err, err


def test_stdout_to_a_file_gets_plain_progress_lines_not_redraws(node, tmp_path):
    """`lynxtop bench > log` with stderr still a terminal: the progress is plain lines, no bar redraws
    (no carriage return, no escape code), in the log or on the terminal."""
    import os
    import pty
    import subprocess
    import sys
    import termios

    master, slave = pty.openpty()
    attrs = termios.tcgetattr(slave)
    attrs[1] &= ~termios.OPOST  # the terminal passes bytes as written ("\n" stays "\n")
    termios.tcsetattr(slave, termios.TCSANOW, attrs)
    log = tmp_path / "log"
    with log.open("w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "lynxtop", "bench", "--config", node["cfg"],
                                 "--concurrency", "1", "2", "--input-len", "16", "--output-len", "16"],
                                stdout=out, stderr=slave, env=dict(os.environ, COLUMNS="200"))
    os.close(slave)
    raw = b""
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:  # EIO: the command closed its end
            break
        if not chunk:
            break
        raw += chunk
    os.close(master)
    assert proc.wait(timeout=240) == 0, raw.decode()
    err, text = raw.decode(), log.read_text()
    assert "level 2/2 c=2" in err and "8/8" in err  # the plain line: level and done/total
    for stream in (err, text):
        assert "\r" not in stream and "\x1b" not in stream, repr(stream)
    assert "out tok/s" in text


def _foreign_client(url: str, stop, done: list) -> None:
    """Another user of the server: plain completions one after another until `stop` is set."""
    import json
    import urllib.request

    model = json.loads(urllib.request.urlopen(url + "/v1/models", timeout=30).read())["data"][0]["id"]
    body = json.dumps({"model": model, "prompt": "hello " * 16, "max_tokens": 32}).encode()
    while not stop.is_set():
        req = urllib.request.Request(url + "/v1/completions", data=body, headers={"Content-Type": "application/json"})
        urllib.request.urlopen(req, timeout=60).read()
        done.append(1)


def test_foreign_traffic_during_a_level_is_warned_with_its_count(node, tmp_path):
    import threading

    url = asyncio.run(node["agent"].status())["serving"]["url"].rstrip("/")
    stop, done = threading.Event(), []
    clients = [threading.Thread(target=_foreign_client, args=(url, stop, done), daemon=True) for _ in range(3)]
    for t in clients:
        t.start()
    deadline = time.monotonic() + 60
    while not done and time.monotonic() < deadline:  # the other client is really running before bench starts
        time.sleep(0.05)
    out = tmp_path / "bench.json"
    try:
        r = bench("--config", node["cfg"], "--concurrency", "2", "--requests", "24", "--input-len", "16",
                  "--output-len", "32", "--json", str(out))
    finally:
        stop.set()
        for t in clients:
            t.join(timeout=60)
    assert r.returncode == 0, r.stderr
    (level,) = levels(out)
    n = level["foreign_requests"]
    assert n >= 2, level  # 3 clients running at the level's start, more finished during it
    assert f"2: WARNING {n} request(s) from other clients" in r.stdout, r.stdout


def test_no_foreign_traffic_no_warning(node, tmp_path):
    out = tmp_path / "bench.json"
    r = bench("--config", node["cfg"], "--concurrency", "2", "--requests", "24", "--input-len", "16",
              "--output-len", "32", "--json", str(out))
    assert r.returncode == 0, r.stderr
    (level,) = levels(out)
    assert level["foreign_requests"] == 0, level
    assert "WARNING" not in r.stdout and "other clients" not in r.stdout
