"""The simulator's /metrics page has the structure of a real vLLM 0.32 page, for DP1, DP2 with two API
servers, and DeepSeek's DP8 + expert parallelism.

The reference pages were captured from real vLLM 0.32 servers (tests/agent/io/pages, CPU build, a tiny model,
`--max-num-seqs 8`, then a few streamed completions): values differ, the structure must not (families and
types, label names per sample, engine label values, `_created` samples or their absence, the order of families
and of samples within them). With more than one API server vLLM renders the page from its Prometheus
multiprocess directory: no process_*/python_* families, no `_created` samples, histograms as sum/buckets/count.
"""

from __future__ import annotations

from pathlib import Path

import page_shape as ps
import psutil
import pytest

from lynxtop.contract.config import load_config

PAGES = Path(__file__).parent.parent / "io" / "pages"
PLAIN = PAGES / "vllm-0.32-cpu-tiny.txt"
DP2_API2 = PAGES / "vllm-0.32-cpu-tiny-dp2-api2.txt"
EXAMPLE = Path(__file__).parents[3] / "systemd" / "config.example.toml"
SHAPE = ("--served-model-name", "tiny", "--max-num-seqs", "8")
pytestmark = pytest.mark.timeout(300)


def served_page(sp, kit, requests: int = 6) -> str:
    sp.wait_ready(60)
    for _ in range(requests):  # streamed, as on the real servers: the stream has no Content-Length
        status, _ = kit.http(sp.url + "/v1/completions", {"prompt": "hello there you", "max_tokens": 12,
                                                          "stream": True})
        assert status == 200
    status, body = kit.http(sp.url + "/metrics")
    assert status == 200
    return body.decode()


def assert_same_structure(real: str, sim: str) -> None:
    assert ps.families(sim) == ps.families(real)
    assert ps.label_sets(sim) == ps.label_sets(real)
    assert ps.engines(sim) == ps.engines(real)
    for prefix in ("vllm:", "http_"):
        assert ps.sample_order(sim, prefix) == ps.sample_order(real, prefix)
    # with several API servers the real order of the types follows the directory order of vLLM's .db files;
    # the simulator reads its files in the recorded page's order
    assert ps.family_order(sim) == ps.family_order(real)
    assert ("_created" in real) == ("_created" in sim)
    assert ps.skeleton(sim) == ps.skeleton(real)  # all of the above at once: line for line, values left out
    assert ("process_cpu_seconds_total" in real) == ("process_cpu_seconds_total" in sim)


def child_titles(sp) -> list[str]:
    return sorted(c.name() for c in psutil.Process(sp.proc.pid).children())


def test_single_engine_page_matches_real_vllm(start_sim, kit):
    sp = start_sim(*SHAPE, max_model_len=1000)
    page = served_page(sp, kit)
    assert_same_structure(PLAIN.read_text(), page)
    assert "lynxtop_simulated_info" in page  # the one family of its own
    assert child_titles(sp) == ["VLLM::EngineCore"]


def test_dp2_with_two_api_servers_matches_real_vllm(start_sim, kit):
    sp = start_sim(*SHAPE, "--data-parallel-size", "2", "--api-server-count", "2", tp=4, max_model_len=1000)
    page = served_page(sp, kit)
    assert_same_structure(DP2_API2.read_text(), page)
    assert child_titles(sp) == ["VLLM::APIServer_0", "VLLM::APIServer_1", "VLLM::DPCoordinator",
                                "VLLM::EngineCore_DP0", "VLLM::EngineCore_DP1"]


def example_profile_flags(name: str) -> list[str]:
    """The vLLM flags of a profile shipped in systemd/config.example.toml, less where it listens."""
    (prof,) = [p for p in load_config(str(EXAMPLE)).profiles if p.name == name]
    argv, flags = prof.argv()[3:], []
    while argv:
        flag = argv.pop(0)
        if flag in ("--host", "--port"):
            argv.pop(0)
        else:
            flags.append(flag)
    return flags


def test_dp8_with_expert_parallelism_serves_eight_engines(start_sim, kit):
    """DeepSeek's shape, the example config's `v4-dp8ep-h200` profile: `--data-parallel-size 8
    --enable-expert-parallel`, TP1 (the experts are spread over the 8 GPUs, so the weights fit); vLLM then
    defaults to 8 API servers: the multiprocess page."""
    flags = example_profile_flags("v4-dp8ep-h200")
    assert "--data-parallel-size" in flags and "--enable-expert-parallel" in flags and "-tp" not in flags
    sp = start_sim(*flags, tp=1)
    page = served_page(sp, kit, requests=8)
    real = DP2_API2.read_text()
    assert ps.families(page) == ps.families(real)
    assert ps.label_sets(page) == ps.label_sets(real) and ps.family_order(page) == ps.family_order(real)
    eight = {str(e) for e in range(8)}
    assert ps.engines(page) == {name: eight for name in ps.engines(real)}
    assert "_created" not in page and "process_cpu_seconds_total" not in page
    assert child_titles(sp) == sorted([*(f"VLLM::APIServer_{i}" for i in range(8)), "VLLM::DPCoordinator",
                                       *(f"VLLM::EngineCore_DP{r}" for r in range(8))])
    assert "Defaulting api_server_count to data_parallel_size (8)." in sp.text()


def test_explicit_single_api_server_keeps_the_plain_page_with_dp2(start_sim, kit):
    sp = start_sim(*SHAPE, "--data-parallel-size", "2", "--api-server-count", "1", tp=4, max_model_len=1000)
    page = served_page(sp, kit, requests=2)
    assert "_created" in page and "process_cpu_seconds_total" in page
    assert {v for e in ps.engines(page).values() for v in e} == {"0", "1"}
    assert child_titles(sp) == ["VLLM::DPCoordinator", "VLLM::EngineCore_DP0", "VLLM::EngineCore_DP1"]


def test_dp8_without_expert_parallelism_does_not_fit(start_sim, kit):
    """Without EP every DP rank would hold the whole model: start-up fails as `-tp 1` does, and says why."""
    sp = start_sim("--data-parallel-size", "8", tp=1)
    assert sp.wait_exit(60) == 1
    text = sp.text()
    assert "No available memory for the cache blocks" in text and "add --enable-expert-parallel to -dp" in text
    assert kit.group_members(sp.pgid) == []  # the stand-ins went with the server
