"""`lynxtop bench --save-result`: one `vllm bench serve --save-result` file per level, with vLLM's keys, types
and file names (docs/bench.md). Against the simulator drafting tokens like DeepSeek's MTP (the speculative keys
must equal the server's own counters), and a server that fails on purpose (0.0 where vLLM writes 0.0, the
failures in the per-request arrays). The real-vLLM stage compares with a file vLLM's own client wrote."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator

import pytest
from support.agent_config import SIM
from support.bench_env import FlakyServer, bench
from support.ports import free_port

from lynxtop.cli.bench_load import RequestResult
from lynxtop.cli.bench_result import spec_counters, spec_keys
from lynxtop.cli.bench_stats import peaks

pytestmark = pytest.mark.timeout(300)

# The keys and types of a `vllm bench serve --save-result --save-detailed` file (vllm/benchmarks/serve.py, 0.32,
# with --max-concurrency, --metric-percentiles 50,90,99 and --percentile-metrics ttft,tpot,itl,e2el,
# client_queue_time); the real-vLLM stage checks the same against a file vLLM's client wrote.
SCALARS = {"date": str, "endpoint_type": str, "backend": str, "model_id": str, "tokenizer_id": str,
           "num_prompts": int, "request_rate": str, "burstiness": float, "max_concurrency": int, "duration": float,
           "completed": int, "failed": int, "total_input_tokens": int, "total_output_tokens": int,
           "request_throughput": float, "output_throughput": float, "total_token_throughput": float,
           "max_output_tokens_per_s": float, "max_concurrent_requests": int, "rtfx": float}
ARRAYS = {"input_lens": int, "output_lens": int, "ttfts": float, "latencies": float, "start_times": float,
          "queue_times": float, "generated_texts": str, "errors": str}
STATS = [f"{s}_{m}_ms" for m in ("ttft", "tpot", "itl", "e2el", "client_queue_time")
         for s in ("mean", "median", "std", "p50", "p90", "p99")]
SPEC = {"spec_decode_acceptance_rate": float, "spec_decode_acceptance_length": float, "spec_decode_num_drafts": int,
        "spec_decode_draft_tokens": int, "spec_decode_accepted_tokens": int,
        "spec_decode_per_position_acceptance_rates": list}
MODEL = "deepseek-ai/DeepSeek-V4.1"


def vllm_shaped(d: dict, n: int) -> None:
    """`d` has every key of a vLLM result file with vLLM's type, and `n` entries in each per-request array."""
    for k, t in SCALARS.items():
        assert type(d[k]) is t, (k, d[k])
    for k, t in ARRAYS.items():
        assert len(d[k]) == n and all(type(x) is t for x in d[k]), (k, d[k])
    assert len(d["itls"]) == n and all(type(g) is float for gaps in d["itls"] for g in gaps)
    assert d["label"] is None or type(d["label"]) is str
    for k in STATS:
        assert type(d[k]) is float, (k, d[k])


def counters(url: str) -> dict[str, float]:
    with urllib.request.urlopen(url + "/metrics", timeout=10) as r:
        page = r.read().decode()
    out: dict[str, float] = {}
    for line in page.splitlines():
        if line.startswith("vllm:spec_decode") and "_total" in line.split("{")[0]:
            name = line.split("{")[0]
            out[name] = out.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
    return out


@pytest.fixture
def mtp_sim(tmp_path) -> Iterator[str]:
    """The simulated vLLM drafting two tokens a step (DeepSeek's MTP), in its own session like the agent runs it."""
    port = free_port()
    log = (tmp_path / "sim.log").open("wb")
    proc = subprocess.Popen([str(SIM) if SIM.exists() else sys.executable, *([] if SIM.exists() else
                             ["-m", "lynxtop.sim"]), "serve", MODEL, "--host", "127.0.0.1", "--port", str(port),
                             "-tp", "8", "--max-model-len", "4096", "--sim-startup-seconds", "0.2", "--sim-speed", "40",
                             "--sim-state-dir", str(tmp_path / "simstate"), "--no-sim-workers", "--sim-log-interval",
                             "0", "--speculative-config", '{"method": "mtp", "num_speculative_tokens": 2}'],
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None and time.monotonic() < deadline, (tmp_path / "sim.log").read_text()
            try:
                with urllib.request.urlopen(url + "/health", timeout=1) as r:
                    if r.status == 200:
                        break
            except OSError:
                time.sleep(0.1)
        yield url
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
        log.close()


def test_save_result_writes_one_vllm_file_per_level_with_the_servers_mtp_counters(mtp_sim, tmp_path):
    out = tmp_path / "results"
    before = counters(mtp_sim)
    r = bench("--url", mtp_sim, "--no-store", "--concurrency", "1", "2", "--requests", "6", "--warmup", "0",
              "--input-len", "8", "--output-len", "24", "--save-result", "--result-dir", str(out), "--label", "lx",
              "--json", str(tmp_path / "levels.json"))
    assert r.returncode == 0, r.stderr
    after = counters(mtp_sim)
    files = sorted(out.iterdir())
    # vLLM's name: {label}-{request_rate}qps-concurrency{C}-{model's last path part}-{date}.json
    assert [re.sub(r"-\d{8}-\d{6}\.json$", "", f.name) for f in files] == \
        ["lx-infqps-concurrency1-DeepSeek-V4.1", "lx-infqps-concurrency2-DeepSeek-V4.1"], files
    assert "2 vllm --save-result file(s)" in r.stderr
    levels = [json.loads(f.read_text()) for f in files]
    for c, d in zip((1, 2), levels, strict=True):
        vllm_shaped(d, 6)
        assert d["max_concurrency"] == c and d["request_rate"] == "inf" and d["label"] == "lx"
        assert d["model_id"] == d["tokenizer_id"] == MODEL and d["completed"] == 6 and d["errors"] == [""] * 6
        assert d["output_lens"] == [24] * 6 == [len(gaps) + 1 for gaps in d["itls"]]
        assert all(t.strip() for t in d["generated_texts"])
        # vLLM's peaks count one-second buckets: every request that ran in the busiest second
        assert 1 <= d["max_concurrent_requests"] <= 6 and 0 < d["max_output_tokens_per_s"] <= 6 * 24
        assert d["start_times"] == sorted(d["start_times"]) and d["partial"] is False and "bench_id" in d
        for k, t in SPEC.items():  # a server that drafts tokens: vLLM's speculative keys
            assert type(d[k]) is t, (k, d[k])
        assert d["spec_decode_draft_tokens"] == 2 * d["spec_decode_num_drafts"]
        assert 0 < d["spec_decode_accepted_tokens"] <= d["spec_decode_draft_tokens"]
        assert d["spec_decode_acceptance_rate"] == pytest.approx(
            100 * d["spec_decode_accepted_tokens"] / d["spec_decode_draft_tokens"])
    # the two levels' counts are the server's own counters over the sweep (no warm-up: nothing else drafted)
    for key, name in (("spec_decode_num_drafts", "drafts"), ("spec_decode_draft_tokens", "draft_tokens"),
                      ("spec_decode_accepted_tokens", "accepted_tokens")):
        page = f"vllm:spec_decode_num_{name}_total"
        assert sum(d[key] for d in levels) == after[page] - before.get(page, 0.0), key
    # --json: the same levels as an array, with the same scalar keys and types, no per-request arrays
    arr = json.loads((tmp_path / "levels.json").read_text())
    assert [a["max_concurrency"] for a in arr] == [1, 2] and "ttfts" not in arr[0]
    for k in [*SCALARS, *[s for s in STATS if "client_queue" not in s and "p50" not in s]]:
        assert type(arr[0][k]) is type(levels[0][k]), k


def test_a_level_without_successes_writes_zeros_like_vllm_and_its_failures(tmp_path):
    srv = FlakyServer()  # warm-up: ok, ok, 500; then the level's one request is cut after two tokens
    try:
        r = bench("--url", srv.url, "--no-store", "--concurrency", "1", "--requests", "1", "--warmup", "3",
                  "--output-len", "8", "--save-result", "--result-dir", str(tmp_path / "r"),
                  "--json", str(tmp_path / "levels.json"))
    finally:
        srv.close()
    assert r.returncode == 1, r.stderr
    (f,) = (tmp_path / "r").iterdir()
    assert f.name.startswith("openai-infqps-concurrency1-flaky-model-")
    d = json.loads(f.read_text())
    assert d["completed"] == 0 and d["failed"] == 1 and d["output_lens"] == [0] and d["latencies"] == [0.0]
    assert d["errors"][0] and len(d["ttfts"]) == 1 and d["max_concurrent_requests"] == 0
    for k in STATS:  # numpy of no samples: vLLM writes 0.0, not null
        assert d[k] == 0.0 and type(d[k]) is float, k
    (lv,) = json.loads((tmp_path / "levels.json").read_text())
    assert lv["mean_ttft_ms"] == 0.0 and lv["p99_tpot_ms"] == 0.0 and lv["failures"]


def test_a_result_dir_that_cannot_be_written_is_refused_before_the_sweep(tmp_path):
    srv = FlakyServer()
    try:
        a_file = tmp_path / "plain-file"
        a_file.write_text("keep me\n")
        r = bench("--url", srv.url, "--no-store", "--concurrency", "1", "--save-result", "--result-dir", str(a_file))
        assert r.returncode == 2 and f"--result-dir {a_file} is not a directory" in r.stderr, r.stderr
        assert a_file.read_text() == "keep me\n" and "Traceback" not in r.stderr
        r = bench("--url", srv.url, "--no-store", "--concurrency", "1", "--label", "x")
        assert r.returncode == 2 and "go with --save-result" in r.stderr
        assert srv.count == 0  # nothing was sent
        # sysfs takes no new file, though root passes its access check: then the sweep runs, the failure is
        # reported (once by the level, once at the end), the levels are still measured and shown, exit 1
        r = bench("--url", srv.url, "--no-store", "--concurrency", "1", "1", "--requests", "1", "--warmup", "0",
                  "--output-len", "4", "--save-result", "--result-dir", "/sys/kernel")
        if os.access("/sys/kernel", os.W_OK | os.X_OK):  # root
            assert r.returncode == 1 and r.stderr.count("cannot write a result file in /sys/kernel") == 2, r.stderr
            assert "0 vllm --save-result file(s)" in r.stderr and "out tok/s" in r.stdout
        else:
            assert r.returncode == 2 and "/sys/kernel is not writable" in r.stderr, r.stderr
        assert "Traceback" not in r.stderr
    finally:
        srv.close()


def test_peaks_count_like_vllms_one_second_buckets():
    def req(start: float, ttft: float, gaps: list[float]) -> RequestResult:
        return RequestResult(ok=True, start=start, ttft=ttft, itl=gaps, e2e=ttft + sum(gaps),
                             output_tokens=len(gaps) + 1)

    # tokens at 0.5 0.9 1.2 (first) and 1.1 1.3 1.4 2.5 (second): 4 in second 1; in flight: 2 in seconds 1 and 2
    rs = [req(0.0, 0.5, [0.4, 0.3]), req(0.6, 0.5, [0.2, 0.1, 1.1])]
    assert peaks(rs) == (4.0, 2)
    assert peaks([]) == (0.0, 0)


def test_spec_counters_read_the_page_as_vllms_client_does():
    page = "\n".join([
        "# TYPE vllm:spec_decode_num_drafts counter",
        'vllm:spec_decode_num_drafts_total{engine="0",model_name="a b"} 10.0',
        'vllm:spec_decode_num_drafts_total{engine="1",model_name="a b"} 5.0',
        'vllm:spec_decode_num_drafts_created{engine="0",model_name="a b"} 1.7e9',
        'vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="a b"} 30.0 1700000000000',
        'vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="a b"} 12.0',
        'vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="a b",position="0"} 8.0',
        'vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="a b",position="1"} 4.0',
        'vllm:spec_decode_num_accepted_tokens_total{engine="1",model_name="x"} NaN'])
    c = spec_counters(page)
    assert c is not None and (c.drafts, c.draft_tokens, c.accepted, c.per_pos) == (15, 30, 12, {0: 8, 1: 4})
    assert spec_counters('vllm:num_requests_running{engine="0"} 1.0') is None
    start = spec_counters(page.replace("10.0", "0.0").replace("30.0", "10.0").replace("12.0", "2.0"))
    keys = spec_keys(start, c)  # 10 more drafts, 20 more draft tokens, 10 more accepted
    assert keys["spec_decode_num_drafts"] == 10 and keys["spec_decode_draft_tokens"] == 20
    assert keys["spec_decode_acceptance_rate"] == 50.0 and keys["spec_decode_acceptance_length"] == 2.0
    assert spec_keys(c, c) == {} and spec_keys(None, c) == {}
