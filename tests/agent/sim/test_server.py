"""The simulated server's HTTP surface against a real process: OpenAI endpoints, SSE, /metrics, errors."""

from __future__ import annotations

import json
import time
import urllib.request

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

# Every family of the default (newest) version's page, with its type, as prometheus_client parses it.
# Counters lose their `_total` suffix in the parser; `_created` families are gauges in text format 0.0.4.
# The list is vLLM 0.32.0's page as recorded from a real server (docs/real_vllm.md).
COUNTERS = ["vllm:num_preemptions", "vllm:prompt_tokens", "vllm:generation_tokens", "vllm:prompt_tokens_cached",
            "vllm:request_success", "vllm:prefix_cache_queries", "vllm:prefix_cache_hits",
            "vllm:external_prefix_cache_queries", "vllm:external_prefix_cache_hits", "vllm:mm_cache_queries",
            "vllm:mm_cache_hits", "vllm:prompt_tokens_by_source", "vllm:prompt_tokens_cached_by_source",
            "vllm:admission_rejections", "vllm:estimated_flops_per_gpu", "vllm:estimated_read_bytes_per_gpu",
            "vllm:estimated_write_bytes_per_gpu"]
NEW_IN_032 = ["vllm:external_prefix_cache_queries", "vllm:external_prefix_cache_hits", "vllm:mm_cache_queries",
              "vllm:mm_cache_hits", "vllm:prompt_tokens_by_source", "vllm:prompt_tokens_cached_by_source",
              "vllm:admission_rejections", "vllm:estimated_flops_per_gpu", "vllm:estimated_read_bytes_per_gpu",
              "vllm:estimated_write_bytes_per_gpu", "vllm:request_num_preemptions",
              "vllm:request_prefill_kv_computed_tokens"]
# vLLM 0.32.0's CacheConfig.metrics_info() keys plus `engine`: 37 labels on the real page
CACHE_CONFIG_LABELS_032 = {
    "_block_size_resolved", "block_size", "cache_dtype", "cache_hit_alignment_tokens",
    "effective_attention_block_size", "enable_mamba_shared_prefix_checkpoint", "enable_prefix_caching", "engine",
    "gpu_memory_utilization", "hash_block_size", "is_attention_free", "kv_cache_dtype_skip_layers",
    "kv_cache_layout", "kv_cache_max_concurrency", "kv_cache_memory_bytes", "kv_cache_size_tokens",
    "kv_offloading_backend", "kv_offloading_size", "kv_sharing_fast_prefill", "mamba_block_size",
    "mamba_cache_dtype", "mamba_cache_mode", "mamba_page_size_padded", "mamba_ssm_cache_dtype", "num_cpu_blocks",
    "num_gpu_blocks", "num_gpu_blocks_override", "prefix_cache_retention_interval", "prefix_caching_hash_algo",
    "prefix_match_unit", "replayssm_buffer_len", "skip_page_size_padded", "sliding_window", "swa_bounded_replay",
    "use_kda_recoverssm", "use_replayssm", "user_specified_block_size"}
HISTOGRAMS = ["vllm:iteration_tokens_total", "vllm:time_to_first_token_seconds", "vllm:inter_token_latency_seconds",
              "vllm:request_time_per_output_token_seconds", "vllm:e2e_request_latency_seconds",
              "vllm:request_queue_time_seconds", "vllm:request_inference_time_seconds",
              "vllm:request_prefill_time_seconds", "vllm:request_decode_time_seconds", "vllm:request_prompt_tokens",
              "vllm:request_generation_tokens", "vllm:request_max_num_generation_tokens", "vllm:request_params_n",
              "vllm:request_params_max_tokens", "vllm:request_num_preemptions",
              "vllm:request_prefill_kv_computed_tokens"]
GAUGES = ["vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:num_requests_waiting_by_reason",
          "vllm:engine_sleep_state", "vllm:kv_cache_usage_perc", "vllm:cache_config_info"]
EXPECTED_NEW = ({n: "counter" for n in COUNTERS} | {n: "histogram" for n in HISTOGRAMS} | {n: "gauge" for n in GAUGES}
                | {n + "_created": "gauge" for n in COUNTERS + HISTOGRAMS})
TTFT_LE = ["0.001", "0.005", "0.01", "0.02", "0.04", "0.06", "0.08", "0.1", "0.25", "0.5", "0.75", "1.0", "2.5",
           "5.0", "7.5", "10.0", "20.0", "40.0", "80.0", "160.0", "640.0", "2560.0", "+Inf"]
ITL_LE = ["0.01", "0.025", "0.05", "0.075", "0.1", "0.15", "0.2", "0.3", "0.4", "0.5", "0.75", "1.0", "2.5", "5.0",
          "7.5", "10.0", "20.0", "40.0", "80.0", "+Inf"]
E2E_LE = ["0.3", "0.5", "0.8", "1.0", "1.5", "2.0", "2.5", "5.0", "10.0", "15.0", "20.0", "30.0", "40.0", "50.0",
          "60.0", "120.0", "240.0", "480.0", "960.0", "1920.0", "7680.0", "+Inf"]


def families(text: str) -> dict:
    return {f.name: f for f in text_string_to_metric_families(text)}


@pytest.fixture
def page_fams(shared_sim, kit) -> dict:
    """The shared server's page after two more completions, parsed."""
    for _ in range(2):
        status, _ = kit.http(shared_sim.url + "/v1/completions", {"prompt": "x" * 400, "max_tokens": 8})
        assert status == 200
    status, body = kit.http(shared_sim.url + "/metrics")
    assert status == 200
    return families(body.decode())


def value(fams: dict, name: str, suffix: str = "_total") -> float:
    return next(s.value for s in fams[name].samples if s.name.endswith(suffix))


def labelled(fams: dict, name: str, key: str) -> dict[str, float]:
    return {s.labels[key]: s.value for s in fams[name].samples if s.name.endswith("_total")}


def le(fams: dict, name: str) -> list[str]:
    return [s.labels["le"] for s in fams[name].samples if s.name.endswith("_bucket")]


def test_metrics_page_has_vllms_exact_families_and_types(page_fams):
    fams = page_fams
    vllm = {name: f.type for name, f in fams.items() if name.startswith("vllm:")}
    assert vllm == EXPECTED_NEW
    assert {"process_cpu_seconds", "python_gc_objects_collected", "http_requests"} <= set(fams)
    assert fams["lynxtop_simulated_info"].samples[0].value == 1  # the page says it is simulated


def test_metrics_page_has_vllms_labels_and_cache_config(page_fams, kit):
    fams = page_fams
    for name in [n for n in COUNTERS if n != "vllm:admission_rejections"] + HISTOGRAMS + GAUGES[:3] + GAUGES[4:5]:
        for s in fams[name].samples:
            assert s.labels["model_name"] == kit.MODEL and s.labels["engine"] == "0", (name, s)
    info = fams["vllm:cache_config_info"].samples[0].labels
    assert set(info) == CACHE_CONFIG_LABELS_032 and len(info) == 37  # no model_name, as in vLLM
    assert info["block_size"] == "64" and info["user_specified_block_size"] == "False"
    assert int(info["kv_cache_size_tokens"]) == int(info["num_gpu_blocks"]) * 64 > 32768
    assert float(info["kv_cache_max_concurrency"]) == pytest.approx(int(info["kv_cache_size_tokens"]) / 32768, 0.01)
    rejections = [s for s in fams["vllm:admission_rejections"].samples if s.name.endswith("_total")]
    assert {s.labels["reason"] for s in rejections} == {"max_num_queued_reqs", "max_num_queued_tokens"}
    assert all(set(s.labels) == {"model_name", "reason"} for s in rejections)  # no engine label in vLLM 0.32


def test_metrics_page_splits_prompt_tokens_by_source_and_estimates_perf(page_fams):
    fams = page_fams
    by_source = labelled(fams, "vllm:prompt_tokens_by_source", "source")
    assert set(by_source) == {"local_compute", "local_cache_hit", "external_kv_transfer"}
    assert sum(by_source.values()) == value(fams, "vllm:prompt_tokens") and by_source["external_kv_transfer"] == 0
    cached = labelled(fams, "vllm:prompt_tokens_cached_by_source", "source")
    assert set(cached) == {"device", "host", "p2p", "disk", "external_unspecified"}
    hits = value(fams, "vllm:prefix_cache_hits")
    assert cached["device"] == hits and sum(cached.values()) == hits  # vLLM: sums to the hits
    iteration = value(fams, "vllm:iteration_tokens_total", "_sum")
    # 2 FLOPs per active parameter per token, TP 8
    assert value(fams, "vllm:estimated_flops_per_gpu") == pytest.approx(2 * 37e9 * iteration / 8)
    read = value(fams, "vllm:estimated_read_bytes_per_gpu")
    write = value(fams, "vllm:estimated_write_bytes_per_gpu")
    assert read > 296e9 / 8 and 0 < write < read  # every step streams this rank's weights
    computed = value(fams, "vllm:request_prefill_kv_computed_tokens", "_sum")
    assert 0 < computed <= by_source["local_compute"]


def test_metrics_page_has_vllms_buckets_and_counts(page_fams):
    fams = page_fams
    assert le(fams, "vllm:request_num_preemptions") == ["1.0", "2.0", "3.0", "4.0", "5.0", "10.0", "20.0", "+Inf"]
    assert le(fams, "vllm:request_prefill_kv_computed_tokens") == le(fams, "vllm:request_prompt_tokens")
    assert le(fams, "vllm:time_to_first_token_seconds") == TTFT_LE
    assert le(fams, "vllm:inter_token_latency_seconds") == ITL_LE
    assert le(fams, "vllm:e2e_request_latency_seconds") == E2E_LE
    assert le(fams, "vllm:iteration_tokens_total")[:3] == ["1.0", "8.0", "16.0"]
    assert value(fams, "vllm:generation_tokens") >= 16
    ok = labelled(fams, "vllm:request_success", "finished_reason")
    assert ok["length"] >= 2 and set(ok) == {"stop", "length", "abort", "error", "repetition"}
    assert value(fams, "vllm:time_to_first_token_seconds", "_count") >= 2


def test_old_version_prints_the_old_names(start_sim, kit):
    sp = start_sim("--sim-vllm-version", "0.10")
    sp.wait_ready()
    assert kit.http(sp.url + "/v1/completions", {"prompt": "hello", "max_tokens": 4})[0] == 200
    _, body = kit.http(sp.url + "/version")
    assert json.loads(body) == {"version": "0.10.0+sim"}
    fams = families(kit.http(sp.url + "/metrics")[1].decode())
    types = {n: f.type for n, f in fams.items()}
    assert types["vllm:gpu_cache_usage_perc"] == "gauge" and types["vllm:kv_cache_usage_perc"] == "gauge"
    assert types["vllm:gpu_prefix_cache_queries"] == "counter" and types["vllm:gpu_prefix_cache_hits"] == "counter"
    assert types["vllm:time_per_output_token_seconds"] == "histogram"
    for newer in ("vllm:inter_token_latency_seconds", "vllm:request_time_per_output_token_seconds",
                  "vllm:num_requests_waiting_by_reason", "vllm:engine_sleep_state", *NEW_IN_032):
        assert newer not in types
    info = fams["vllm:cache_config_info"].samples[0].labels
    assert {"swap_space", "cpu_offload_gb"} <= set(info) and "kv_cache_size_tokens" not in info
    assert {s.labels["finished_reason"] for s in fams["vllm:request_success"].samples} == {"stop", "length", "abort"}
    tpot = next(s.value for s in fams["vllm:time_per_output_token_seconds"].samples if s.name.endswith("_count"))
    assert tpot == 3  # one observation per decode step after the first token


async def test_streaming_completion_token_by_token(shared_sim):
    n = 20
    body = {"prompt": "tell me about lynxtop", "max_tokens": n, "stream": True,
            "stream_options": {"include_usage": True}}
    events, stamps = [], []
    async with aiohttp.ClientSession() as s, s.post(shared_sim.url + "/v1/completions", json=body) as r:
        assert r.status == 200 and r.headers["Content-Type"].startswith("text/event-stream")
        async for raw in r.content:
            line = raw.decode().strip()
            if line.startswith("data: "):
                events.append(line[6:])
                stamps.append(time.monotonic())
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    tokens = [c for c in chunks if c["choices"] and c["choices"][0]["text"]]
    assert len(tokens) == n
    assert all(len(c["choices"][0]["text"].split()) == 1 for c in tokens)  # one token per event
    assert all(c["choices"][0]["finish_reason"] is None for c in tokens)
    final = [c for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]]
    assert [c["choices"][0]["finish_reason"] for c in final] == ["length"]
    usage = chunks[-1]
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == n
    assert usage["usage"]["total_tokens"] == usage["usage"]["prompt_tokens"] + n
    assert len({c["id"] for c in chunks}) == 1
    # tokens arrive as they are generated (19 decode steps of ~75 ms simulated at speed 20), not in one burst
    assert stamps[n] - stamps[1] > 0.5 * (n - 1) * 0.075 / 20


async def test_streaming_chat_has_role_then_content_deltas(shared_sim):
    body = {"model": shared_sim_model(shared_sim), "messages": [{"role": "system", "content": "be brief"},
            {"role": "user", "content": "hi"}], "max_tokens": 5, "stream": True}
    async with aiohttp.ClientSession() as s, s.post(shared_sim.url + "/v1/chat/completions", json=body) as r:
        text = await r.text()
    data = [ln[6:] for ln in text.splitlines() if ln.startswith("data: ")]
    assert data[-1] == "[DONE]"
    chunks = [json.loads(d) for d in data[:-1]]
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    contents = [c["choices"][0]["delta"].get("content") for c in chunks[1:-1]]
    assert len(contents) == 5 and all(contents)
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert all(c["object"] == "chat.completion.chunk" and "usage" not in c for c in chunks)


def shared_sim_model(sp) -> str:
    return sp.argv[sp.argv.index("serve") + 1]


def test_non_streaming_chat_and_models_and_version(shared_sim, kit):
    status, body = kit.http(shared_sim.url + "/v1/chat/completions",
                            {"messages": [{"role": "user", "content": "hello"}], "max_tokens": 3})
    assert status == 200
    data = json.loads(body)
    assert data["object"] == "chat.completion" and data["usage"]["completion_tokens"] == 3
    assert len(data["choices"][0]["message"]["content"].split()) == 3
    models = json.loads(kit.http(shared_sim.url + "/v1/models")[1])
    card = models["data"][0]
    assert card["id"] == kit.MODEL and card["max_model_len"] == 32768 and "SIMULATED" in card["owned_by"]
    assert json.loads(kit.http(shared_sim.url + "/version")[1])["version"].endswith("+sim")
    assert json.loads(kit.http(shared_sim.url + "/load")[1]) == {"server_load": 0}
    status, body = kit.http(shared_sim.url + "/health")
    assert status == 200 and body == b""


def test_bad_requests_get_openai_style_errors(shared_sim, kit):
    url = shared_sim.url
    status, body = kit.http(url + "/v1/completions", {"prompt": "x", "max_tokens": 40000})
    assert status == 400 and "maximum context length is 32768 tokens" in json.loads(body)["message"]
    status, body = kit.http(url + "/v1/completions", {"model": "gpt-5", "prompt": "x"})
    assert status == 404 and json.loads(body)["message"] == "The model `gpt-5` does not exist."
    status, body = kit.http(url + "/v1/completions", {"prompt": 42})
    assert status == 400 and json.loads(body)["param"] == "prompt"
    status, body = kit.http(url + "/v1/completions", {"prompt": "x", "max_tokens": 0})
    assert status == 400 and "max_tokens" in json.loads(body)["message"]
    status, body = kit.http(url + "/v1/chat/completions", {"messages": "hi"})
    assert status == 400 and json.loads(body)["param"] == "messages"
    import urllib.request
    req = urllib.request.Request(url + "/v1/completions", data=b"{not json", method="POST")
    try:
        urllib.request.urlopen(req, timeout=5)
        raise AssertionError("expected 400")
    except urllib.error.HTTPError as exc:
        assert exc.code == 400 and b"not valid JSON" in exc.read()


def test_prefix_cache_hits_show_in_metrics(shared_sim, kit):
    system = "You are a careful assistant. " * 120  # ~900 tokens shared by both requests
    for q in ("first question", "second question"):
        body = {"messages": [{"role": "system", "content": system}, {"role": "user", "content": q}],
                "max_tokens": 2}
        assert kit.http(shared_sim.url + "/v1/chat/completions", body)[0] == 200
    fams = families(kit.http(shared_sim.url + "/metrics")[1].decode())
    hits = next(s.value for s in fams["vllm:prefix_cache_hits"].samples if s.name.endswith("_total"))
    assert hits >= 768  # at least 12 of the shared 64-token blocks


def test_api_key_guards_only_v1_and_mtp_adds_spec_decode_counters(start_sim, kit):
    sp = start_sim("--api-key", "s3cret", "--speculative-config", '{"method": "mtp", "num_speculative_tokens": 2}')
    sp.wait_ready()
    auth = {"Authorization": "Bearer s3cret"}
    assert kit.http(sp.url + "/v1/models")[0] == 401
    assert kit.http(sp.url + "/v1/models", headers=auth)[0] == 200
    assert kit.http(sp.url + "/health")[0] == 200 and kit.http(sp.url + "/metrics")[0] == 200
    status, body = kit.http(sp.url + "/v1/completions", {"prompt": "speculate", "max_tokens": 40}, headers=auth)
    assert status == 200 and json.loads(body)["usage"]["completion_tokens"] == 40  # never more than asked
    fams = families(kit.http(sp.url + "/metrics")[1].decode())

    def total(name: str) -> float:
        return next(s.value for s in fams[name].samples if s.name.endswith("_total"))

    drafts, draft_tokens = total("vllm:spec_decode_num_drafts"), total("vllm:spec_decode_num_draft_tokens")
    accepted = total("vllm:spec_decode_num_accepted_tokens")
    assert draft_tokens == 2 * drafts and 0 < accepted <= draft_tokens
    assert drafts < 39  # accepted drafts made some steps yield more than one token


def test_data_parallel_runs_one_engine_per_rank_with_its_own_series_and_gpus(start_sim, kit):
    import psutil

    from lynxtop.sim.gpus import SimScenario

    sp = start_sim("-dp", "2", tp=4)
    sp.wait_ready()
    names = sorted(c.name() for c in psutil.Process(sp.proc.pid).children())
    # vLLM 0.32 defaults --api-server-count to the DP size and runs a DP coordinator beside the engines
    assert names == ["VLLM::APIServer_0", "VLLM::APIServer_1", "VLLM::DPCoordinator", "VLLM::EngineCore_DP0",
                     "VLLM::EngineCore_DP1"]
    for _ in range(4):
        assert kit.http(sp.url + "/v1/completions", {"prompt": "balance me", "max_tokens": 3})[0] == 200
    fams = families(kit.http(sp.url + "/metrics")[1].decode())
    per_engine = {s.labels["engine"]: s.value for s in fams["vllm:request_success"].samples
                  if s.name.endswith("_total") and s.labels["finished_reason"] == "length"}
    assert set(per_engine) == {"0", "1"} and sum(per_engine.values()) == 4 and min(per_engine.values()) >= 1
    assert {s.labels["engine"] for s in fams["vllm:num_requests_running"].samples} == {"0", "1"}
    scen = SimScenario(sp.state_dir)
    holders = [scen.state(g, time.monotonic()).processes for g in range(8)]
    assert all(len(h) == 1 for h in holders)
    assert len({h[0][0] for h in holders[:4]}) == 1 and holders[0] != holders[4]  # one engine per GPU half


def test_more_gpus_than_the_node_has_fails_startup(start_sim):
    sp = start_sim("-dp", "2", tp=8)
    assert sp.wait_exit(20) == 1
    assert "The number of required GPUs (16) exceeds the number of available GPUs (8)" in sp.text()


def test_metrics_are_answered_as_vllm_0_32_does_plain_and_whole(shared_sim):
    """Checked on the real vLLM 0.32 server: prometheus-fastapi-instrumentator's handler answers /metrics, so the
    page is never gzipped and a prometheus_client `name[]` selection is ignored."""
    def get(encoding: str, query: str = "") -> tuple[str | None, bytes]:
        req = urllib.request.Request(shared_sim.url + "/metrics" + query, headers={"Accept-Encoding": encoding})
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.headers.get("Content-Encoding"), r.read()

    enc, asked_gzip = get("gzip, deflate")
    assert enc is None and asked_gzip.startswith(b"# HELP")
    _, selected = get("identity", "?name%5B%5D=vllm%3Anum_requests_running")
    whole = set(families(asked_gzip.decode()))
    assert set(families(selected.decode())) == whole and len(whole) > 5
