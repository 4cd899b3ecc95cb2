"""`lynxtop check`'s verdicts for the shipped profiles on the fake 8xH200, 8xB200 and 8xA100 nodes.

Every expected number is worked out by hand in the comments from the formulas of agent/serving/check.py and the model
table (contract/models.py: DeepSeek-V4.1 W = 284e9 params x 296/284 bytes = 296e9 bytes as shipped (fp8), 61
layers, fp8 MLA cache 656 bytes per token and layer, experts 95 % of W, overhead int(5.5 GiB) + int(0.9 GiB) =
5,905,580,032 + 966,367,641 = 6,871,947,673 bytes per GPU).
"""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path

import pytest
from support.agent_config import profile
from support.db import db_rows
from support.waits import wait_for_async as wait_for

from lynxtop.agent.api.control import ActionError
from lynxtop.agent.gpu.fake import a100_specs, b200_specs, h200_specs
from lynxtop.agent.serving.check import Level, NodeFacts, check_profile, facts_from_info
from lynxtop.agent.serving.supervisor import preflight
from lynxtop.contract.config import ConfigError, load_config, parse_config
from lynxtop.contract.models import DEEPSEEK_V41, find_model

EXAMPLE = Path(__file__).resolve().parents[2] / "systemd" / "config.example.toml"
PROFILES = {p.name: p for p in load_config(str(EXAMPLE)).profiles}
KV_TOKEN_TP = 656 * 61  # 40,016 bytes per token on every GPU (the MLA latent is not split by TP)


def node(specs, driver: str, ray: bool | None = None) -> NodeFacts:
    rows = [{"index": s.index, "name": s.name, "cc_major": s.cc[0], "cc_minor": s.cc[1],
             "mem_total_bytes": s.mem_total_bytes, "nvlink_count": s.nvlink_count} for s in specs]
    return facts_from_info(rows, driver, ray_installed=ray)


H200 = node(h200_specs(), "580.159.04")  # 143,771 MiB = 150,754,820,096 bytes each
B200 = node(b200_specs(), "570.133.20")  # 183,359 MiB = 192,265,846,784 bytes each
A100 = node(a100_specs(), "535.183.01")  # 81,920 MiB = 85,899,345,920 bytes each


def run(profile, facts, **changes):
    prof = dataclasses.replace(PROFILES[profile] if isinstance(profile, str) else profile, **changes)
    return check_profile(prof, facts, find_model(prof.model))


def verdict(report, check):
    [v] = [v for v in report.verdicts if v.check == check]
    return v


def test_tp8_on_h200_fits_but_not_256_full_context_sequences():
    r = run("v4-tp8-h200", H200)
    assert verdict(r, "attention").level == Level.OK and verdict(r, "parallelism").level == Level.OK
    m = verdict(r, "memory")
    n = m.numbers
    assert n["budget_bytes"] == 138_694_434_488  # int(0.92 x 150,754,820,096)
    assert n["weights_bytes"] == 37_000_000_000  # 296e9 / (TP8 x PP1); EP over TP8 splits the experts the same way
    # 138,694,434,488 - 37,000,000,000 - 6,871,947,673 = 94,822,486,815 left for the KV cache
    assert n["kv_free_bytes"] == 94_822_486_815
    assert n["kv_bytes_per_token"] == KV_TOKEN_TP
    assert n["kv_tokens"] == 2_369_614  # 94,822,486,815 // 40,016
    assert n["largest_concurrency"] == 18  # 2,369,614 // 131,072
    assert n["kv_needed_bytes"] == 1_342_714_150_912  # 40,016 x 131,072 x 256
    assert n["margin_bytes"] == 94_822_486_815 - 1_342_714_150_912
    assert m.level == Level.WARNING and "18 of 256" in m.reason and "max_num_seqs = 18" in m.fix
    assert "max_model_len = 9256" in m.fix  # 2,369,614 // 256
    assert r.exit_code == 1


def test_tp8_on_h200_with_16_sequences_is_all_good():
    r = run("v4-tp8-h200", H200, max_num_seqs=16)
    # 40,016 x 131,072 x 16 = 83,919,634,432 <= 94,822,486,815: margin 10,902,852,383
    m = verdict(r, "memory")
    assert m.level == Level.OK and m.numbers["margin_bytes"] == 10_902_852_383
    assert r.exit_code == 0 and all(v.level == Level.OK for v in r.verdicts)


def test_dense_flashmla_on_b200_is_blocking_and_the_fix_names_the_backend_flag():
    r = run("v4-tp8-h200", B200)
    a = verdict(r, "attention")
    assert a.level == Level.BLOCKING and "SM90" in a.reason and "SM100" in a.reason
    assert "CUTLASS_MLA" in a.fix and "FLASHMLA_SPARSE" in a.fix and "--attention-backend" in a.fix
    assert r.exit_code == 2


def test_b200_profile_on_b200():
    r = run("v4-tp8-b200", B200)
    assert verdict(r, "attention").level == Level.OK
    n = verdict(r, "memory").numbers
    assert n["budget_bytes"] == 176_884_579_041  # int(0.92 x 192,265,846,784)
    # 176,884,579,041 - 37,000,000,000 - 6,871,947,673 = 133,012,631,368; // 40,016 = 3,323,986 tokens
    assert n["kv_tokens"] == 3_323_986 and n["largest_concurrency"] == 25  # 3,323,986 // 131,072
    assert n["seqs"] == 1024  # max_num_seqs unset: vLLM's default on a GPU of 70 GiB or more that is not an A100
    assert verdict(run("v4-tp8-h200", A100, max_num_seqs=None), "memory").numbers["seqs"] == 256  # A100: 256
    assert r.exit_code == 1
    # FlashMLA-sparse runs on SM90 and SM100 alike
    for facts in (B200, H200):
        assert verdict(run("v4-tp8-b200", facts, attention_backend="FLASHMLA_SPARSE"), "attention").level == Level.OK


def test_a100_refuses_every_mla_kernel_the_profiles_name():
    for name in ("v4-tp8-h200", "v4-tp8-b200", "v4-dp8ep-h200"):
        a = verdict(run(name, A100), "attention")
        assert a.level == Level.BLOCKING and "SM80" in a.reason and "TRITON_MLA" in a.fix
    # without a backend vLLM picks one; the memory: int(0.92 x 85,899,345,920) = 79,027,398,246 budget,
    # - 37e9 - 6,871,947,673 = 35,155,450,573 for the cache, // 40,016 = 878,534 tokens, 6 at 131,072
    r = run("v4-tp8-h200", A100, attention_backend=None)
    assert verdict(r, "attention").level == Level.OK
    n = verdict(r, "memory").numbers
    assert (n["kv_free_bytes"], n["kv_tokens"], n["largest_concurrency"]) == (35_155_450_573, 878_534, 6)
    assert r.exit_code == 1


def test_a100_context_that_cannot_hold_one_sequence_is_blocking():
    # 878,534 tokens fit (above): a 1,000,000-token max_model_len makes vLLM refuse to start
    m = verdict(run("v4-tp8-h200", A100, attention_backend=None, max_model_len=1_000_000), "memory")
    assert m.level == Level.BLOCKING and "refuses to start" in m.reason and "max_model_len = 878534" in m.fix


def test_a100_tp4_weights_do_not_fit_and_the_check_says_how_many_gpus():
    # weights 296e9 / 4 = 74e9 > 79,027,398,246 - 6,871,947,673 = 72,155,450,573: short by 1,844,549,427
    m = verdict(run("v4-tp8-h200", A100, attention_backend=None, tensor_parallel_size=4), "memory")
    assert m.level == Level.BLOCKING and "weights and overhead alone" in m.reason
    assert m.numbers["kv_free_bytes"] == -1_844_549_427
    assert m.numbers["gpus_needed_to_fit"] == 8 and "tensor_parallel_size = 8" in m.fix  # TP8: the 878,534 above


def test_dp8_with_expert_parallel_fits_eight_h200s():
    r = run("v4-dp8ep-h200", H200)
    n = verdict(r, "memory").numbers
    # dense 5 %: 14.8e9 / (TP1 x PP1) + experts 95 %: 281.2e9 / (TP1 x PP1 x DP8) = 35.15e9 -> 49.95e9
    assert n["weights_bytes"] == 49_950_000_000
    # 138,694,434,488 - 49,950,000,000 - 6,871,947,673 = 81,872,486,815; // 40,016 = 2,045,993; // 131,072 = 15
    assert (n["kv_free_bytes"], n["kv_tokens"], n["largest_concurrency"]) == (81_872_486_815, 2_045_993, 15)
    assert verdict(r, "memory").level == Level.WARNING and r.exit_code == 1


def test_dp8_without_expert_parallel_holds_a_full_copy_per_gpu():
    # all experts resident on each of the 8 engines: 296e9 per GPU > the 138.7e9 budget
    m = verdict(run("v4-dp8ep-h200", H200, enable_expert_parallel=False), "memory")
    assert m.level == Level.BLOCKING and m.numbers["weights_bytes"] == 296_000_000_000
    # TP2: 148e9 still too much; TP4: 74e9 leaves 138,694,434,488 - 74e9 - 6,871,947,673 = 57.8e9 -> 4 x DP8 = 32
    assert m.numbers["gpus_needed_to_fit"] == 32 and "tensor_parallel_size = 4" in m.fix


def test_tp8_pp2_through_ray_on_one_h200_node():
    r = run("v4-tp8pp2-ray", H200)
    p = verdict(r, "parallelism")
    assert p.level == Level.WARNING and "needs 16 GPUs" in p.reason and "Ray cluster" in p.reason
    assert p.numbers == {"gpus_needed": 16, "gpus_visible": 8, "nodes_needed": 2}
    assert verdict(r, "ray").level == Level.UNKNOWN
    assert verdict(run("v4-tp8pp2-ray", dataclasses.replace(H200, ray_installed=False)), "ray").level == Level.WARNING
    assert verdict(run("v4-tp8pp2-ray", dataclasses.replace(H200, ray_installed=True)), "ray").level == Level.OK
    n = verdict(r, "memory").numbers
    # weights 296e9 / (TP8 x PP2) = 18.5e9; each stage holds ceil(61 / 2) = 31 layers: 656 x 31 = 20,336 bytes a token
    # int(0.90 x 150,754,820,096) = 135,679,338,086 - 18.5e9 - 6,871,947,673 = 110,307,390,413; // 20,336
    assert (n["weights_bytes"], n["kv_bytes_per_token"], n["kv_tokens"]) == (18_500_000_000, 20_336, 5_424_242)
    assert n["context"] == 163_840 and n["largest_concurrency"] == 33  # 5,424,242 // 163,840


def test_too_few_gpus_without_ray_is_blocking():
    four = dataclasses.replace(H200, gpus=H200.gpus[:4])
    p = verdict(run("v4-tp8-h200", four), "parallelism")
    assert p.level == Level.BLOCKING and "needs 8 GPUs" in p.reason and "4 visible" in p.reason


def test_flag_mistakes():
    r = run("v4-tp8-h200", H200, extra_args=("--enable-flashmla",))
    f = verdict(r, "flags")
    assert f.level == Level.BLOCKING and "not a vLLM flag" in f.reason and "--attention-backend" in f.fix
    r = run("v4-tp8-h200", H200, env={"VLLM_ATTENTION_BACKEND": "FLASHMLA"})
    assert verdict(r, "flags").level == Level.WARNING
    heads = [v for v in run("v4-tp8-h200", H200, tensor_parallel_size=3).verdicts if v.check == "parallelism"]
    assert any(v.level == Level.BLOCKING and "128 attention heads" in v.reason for v in heads)


def test_driver_and_nvlink():
    old = dataclasses.replace(B200, driver_version="550.90.07")
    d = verdict(run("v4-tp8-b200", old), "driver")
    assert d.level == Level.BLOCKING and "R570" in d.reason
    pcie = node(h200_specs(nvlink_count=0), "580.159.04")
    assert verdict(run("v4-tp8-h200", pcie), "nvlink").level == Level.WARNING


def test_unknown_model_or_memory_is_said_not_guessed():
    r = run("v4-tp8-h200", H200, model="someone/Other-7B")
    assert verdict(r, "memory").level == Level.UNKNOWN and r.exit_code == 1
    bare = facts_from_info([{"index": i, "name": "NVIDIA H200", "cc_major": 9, "cc_minor": 0} for i in range(8)])
    assert verdict(run("v4-tp8-h200", bare), "memory").level == Level.UNKNOWN


def test_the_agent_preflight_runs_the_same_check(tmp_path):
    exe = tmp_path / "vllm"
    exe.write_text("#!/bin/sh\n")
    exe.chmod(0o755)
    gpus = [{"index": s.index, "name": s.name, "cc_major": 9, "cc_minor": 0, "mem_total_bytes": s.mem_total_bytes,
             "nvlink_count": 18} for s in h200_specs()]
    prof = dataclasses.replace(PROFILES["v4-dp8ep-h200"], executable=str(exe))
    problems, warnings = preflight(prof, gpus)
    assert problems == [] and any("15 of 64" in w for w in warnings)  # warnings become preflight.warning events
    problems, _ = preflight(dataclasses.replace(prof, enable_expert_parallel=False), gpus)
    assert any("weights and overhead alone" in p for p in problems)  # refused: 422 before anything stops
    b200 = [g | {"cc_major": 10} for g in gpus]
    problems, _ = preflight(prof, b200)
    assert any("FLASHMLA does not fit" in p for p in problems)


def test_config_model_tables_override_and_add():
    base = '[agent]\ndatabase = "/tmp/x/l.db"\nsocket = "/tmp/x/a.sock"\n'
    cfg = parse_config(base + '[[model]]\nname = "deepseek-ai/DeepSeek-V4.1"\noverhead_gib = 8\n'
                              'bytes_per_param = { int8 = 1.0 }\n'
                              '[[model]]\nname = "org/Dense-70B"\nparams_b = 70\nlayers = 80\nattention_heads = 64\n'
                              'context_window = 131072\nnative_quantization = "bf16"\nbytes_per_param = { bf16 = 2 }\n'
                              'kv_heads = 8\nhead_dim = 128\n')
    ds = find_model("deepseek-ai/DeepSeek-V4.1", cfg.models)
    assert ds.overhead_bytes == 8 * 1024**3 and ds.layers == 61
    assert ds.bytes_per_param["int8"] == 1.0 and ds.bytes_per_param["fp8"] == DEEPSEEK_V41.bytes_per_param["fp8"]
    dense = find_model("org/Dense-70B", cfg.models)
    assert dense.weights_bytes(None) == 140_000_000_000  # 70e9 x 2
    assert dense.kv_bytes_per_token_layer("auto", 8) == 2 * 1 * 128 * 2  # K and V, 8 heads / TP8 = 1, BF16
    with pytest.raises(ConfigError) as exc:
        parse_config(base + '[[model]]\nname = "org/New"\nparams_b = -1\n[[model]]\nlayers = 3\n')
    text = "\n".join(exc.value.problems)
    assert "model[0] (org/New).params_b" in text and "model[1].name: is required" in text
    with pytest.raises(ConfigError) as exc:
        parse_config(base + '[[model]]\nname = "org/New"\nparams_b = 7\n')
    assert "mla_latent_dim (or kv_heads and head_dim)" in "\n".join(exc.value.problems)


class _B200View:
    """8 B200s as the node's gpu_info() reports them (memory, links, driver); nothing holds them."""

    def gpu_info(self):
        return [{"index": s.index, "name": s.name, "cc_major": 10, "cc_minor": 0, "mem_total_bytes": s.mem_total_bytes,
                 "nvlink_count": 18, "driver_version": "570.133.20"} for s in b200_specs()]

    def compute_pids(self):
        return time.monotonic(), set()


async def test_the_supervisor_refuses_before_anything_changes_and_records_warnings(make_sup, store, tmp_path):
    standin = Path(__file__).resolve().parent / "standin_vllm.py"  # the stand-in vLLM of the supervisor tests
    keys = {"tensor_parallel_size": 8, "readiness_timeout_s": 20, "stop_grace_s": 3, "shutdown_timeout_s": 1}
    profiles = (profile("dense", standin, model="deepseek-ai/DeepSeek-V4.1", attention_backend="FLASHMLA", **keys)
                + profile("old-env", standin, env={"VLLM_ATTENTION_BACKEND": "CUTLASS_MLA"}, **keys))
    sup = make_sup(gpus=_B200View(), profiles=profiles)
    with pytest.raises(ActionError) as exc:
        await sup.switch("dense", by="test")
    assert exc.value.http_status == 422 and "FLASHMLA does not fit NVIDIA B200 (SM100)" in exc.value.message
    assert "CUTLASS_MLA" in exc.value.details["reasons"][0]
    assert sup.state == "stopped" and sup.proc is None and sup.action is None
    answer = await sup.start("old-env", by="test")
    assert "(warning: VLLM_ATTENTION_BACKEND is deprecated" in answer
    store.flush()
    kinds = [e["kind"] for e in db_rows(store.path, "SELECT kind FROM events ORDER BY id")]
    assert "preflight.warning" in kinds
    await wait_for(lambda: sup.action is None, 20, what="start finished")
    await sup.stop(by="test")
    await wait_for(lambda: sup.state == "stopped" and sup.action is None, 20, what="stopped")
    await sup.shutdown(stop_serving=True)


# ---------------------------------------------------------------------------------------------- DeepSeek-V4.1's options
# decode context parallel (-dcp in extra_args), speculative decoding (--speculative-config), the weight format vs SM

DENSE = dataclasses.replace(DEEPSEEK_V41, name="org/Dense-70B", params_b=70, active_params_b=70, layers=80,
                            attention_heads=64, native_quantization="bf16", bytes_per_param={"bf16": 2.0, "fp8": 1.0,
                            "modelopt_fp4": 0.5625}, mla_latent_dim=0, mla_fp8_bytes=0, kv_heads=8, head_dim=128,
                            expert_share=0.0, draft_method="", draft_block=0, draft_layers=0, draft_params_b=0.0)
V100 = facts_from_info([{"index": i, "name": "Tesla V100-SXM2-32GB", "cc_major": 7, "cc_minor": 0,
                         "mem_total_bytes": 32 * 1024**3} for i in range(8)])


def with_model(model, facts, **changes):
    prof = dataclasses.replace(PROFILES["v4-tp8-h200"], model=model.name, attention_backend=None, **changes)
    return check_profile(prof, facts, model)


def test_dcp_must_divide_tp_and_shards_the_kv_cache_per_gpu():
    r = run("v4-tp8-h200", H200, max_num_seqs=16, extra_args=("-dcp", "3"))
    d = verdict(r, "dcp")
    assert d.level == Level.BLOCKING and "tp_size=8 must be divisible by dcp_size=3" in d.reason
    assert "-dcp 3" in d.reason and d.fix == "-dcp one of 1, 2, 4, 8" and r.exit_code == 2
    # -dcp 8: each GPU holds 1/8 of the MLA cache: 40,016 / 8 = 5,002 bytes a token; 94,822,486,815 // 5,002 =
    # 18,956,914 tokens, 144 full-context sequences at once instead of 18 (the 256 above)
    r = run("v4-tp8-h200", H200, extra_args=("--decode-context-parallel-size=8",))
    assert verdict(r, "dcp").level == Level.OK
    n = verdict(r, "memory").numbers
    assert (n["kv_bytes_per_token"], n["kv_tokens"], n["largest_concurrency"]) == (5_002, 18_956_914, 144)
    assert verdict(run("v4-tp8-h200", H200, max_num_seqs=144, extra_args=("-dcp", "8")), "memory").level == Level.OK
    # vLLM's spelling with underscores is the same flag; the last use wins
    r = run("v4-tp8-h200", H200, extra_args=("-dcp", "2", "--decode_context_parallel_size", "4"))
    assert verdict(r, "memory").numbers["kv_bytes_per_token"] == 10_004  # 40,016 / 4
    # and argparse expands an unambiguous prefix
    assert "dcp_size=3" in verdict(run("v4-tp8-h200", H200, extra_args=("--decode-context", "3")), "dcp").reason
    for bad in (("-dcp", "0"), ("-dcp", "two"), ("-dcp",)):
        d = verdict(run("v4-tp8-h200", H200, extra_args=bad), "dcp")
        assert d.level == Level.BLOCKING and " ".join(bad) in d.reason and "whole number" in d.reason


def test_dcp_on_a_gqa_model_needs_tp_above_the_kv_heads_and_a_backend_that_returns_the_lse():
    d = verdict(with_model(DENSE, H200, extra_args=("-dcp", "2")), "dcp")  # TP8, 8 KV heads: no copies to shard
    assert d.level == Level.BLOCKING and "must be greater than total num kv heads 8" in d.reason
    d = verdict(with_model(DENSE, H200, tensor_parallel_size=16, extra_args=("-dcp", "4")), "dcp")
    assert d.level == Level.BLOCKING and "16 / 8 KV heads = 2" in d.reason and d.fix == "-dcp 2 or less"
    assert verdict(with_model(DENSE, H200, tensor_parallel_size=16, extra_args=("-dcp", "2")), "dcp").level == Level.OK
    # a backend whose LSE support depends on the vLLM release is a warning; FLASHMLA has it in every one read
    d = verdict(run("v4-tp8-b200", B200, extra_args=("-dcp", "8")), "dcp")
    assert d.level == Level.WARNING and "CUTLASS_MLA" in d.reason and "FLASHMLA" in d.fix
    assert verdict(run("v4-tp8-h200", H200, extra_args=("-dcp", "8")), "dcp").level == Level.OK


def spec(**keys):
    return ("--speculative-config", json.dumps(keys))


def test_speculative_method_must_match_the_checkpoints_draft_layers():
    # DeepSeek-V4.1's draft stages are DSpark: vLLM refuses "mtp" and its aliases for deepseek_v41
    for method in ("mtp", "deepseek_mtp"):
        s = verdict(run("v4-tp8-h200", H200, extra_args=spec(method=method, num_speculative_tokens=1)), "speculative")
        assert s.level == Level.BLOCKING and "draft layers are dspark, not mtp" in s.reason
        assert s.fix == '"method": "dspark"'
    # a dspark round drafts 5 tokens: above 5, a multiple of 5
    s = verdict(run("v4-tp8-h200", H200, extra_args=spec(method="dspark", num_speculative_tokens=7)), "speculative")
    assert s.level == Level.BLOCKING and "must be divisible by n_predict=5" in s.reason
    assert s.fix == '"num_speculative_tokens": 5 or 10'
    for k in (3, 5, 10):
        assert verdict(run("v4-tp8-h200", H200, extra_args=spec(method="dspark", num_speculative_tokens=k)),
                       "speculative").level == Level.OK
    # vLLM's dotted form is the same config
    dotted = ("--speculative-config.method", "dspark", "--speculative_config.num_speculative_tokens", "7")
    assert "n_predict=5" in verdict(run("v4-tp8-h200", H200, extra_args=dotted), "speculative").reason
    # a model without draft layers, or not in the table
    s = verdict(with_model(DENSE, H200, extra_args=spec(method="mtp", num_speculative_tokens=1)), "speculative")
    assert s.level == Level.BLOCKING and "ships no draft layers" in s.reason
    r = run("v4-tp8-h200", H200, model="someone/Other-7B", extra_args=spec(method="mtp"))
    assert verdict(r, "speculative").level == Level.UNKNOWN


def test_speculative_config_mistakes_vllm_refuses():
    cases = [(("--speculative-config", '{"method": "dspark"'), "is not JSON"),
             (("--speculative-config", "[5]"), "not an object"),
             (("--speculative-config",), "has no value"),
             (spec(method="dspark", num_speculative_tokens=0), "whole number above 0"),
             (spec(method="dspark", tensor_parallel_size=8), "draft_tensor_parallel_size"),
             (spec(method="dspark", draft_tensor_parallel_size=2), "only 1 or the target's tensor parallel size 8"),
             (spec(method="eagle", num_speculative_tokens=2), "without speculative model")]
    for args, words in cases:
        s = verdict(run("v4-tp8-h200", H200, extra_args=args), "speculative")
        assert s.level == Level.BLOCKING and words in s.reason + s.fix, args
    assert verdict(run("v4-tp8-h200", H200, extra_args=spec(method="ngram", num_speculative_tokens=4)),
                   "speculative").level == Level.OK
    s = verdict(run("v4-tp8-h200", H200, extra_args=spec(method="eagle", model="org/eagle-head")), "speculative")
    assert s.level == Level.UNKNOWN and "not counted" in s.reason


def test_speculative_decoding_changes_the_memory_fit():
    r = run("v4-tp8-h200", H200, max_num_seqs=16, extra_args=spec(method="dspark", num_speculative_tokens=5))
    n = verdict(r, "memory").numbers
    # the draft: 14e9 params x 296/284 bytes / TP8 = 518e9 / 284 = 1,823,943,661.97 -> 37e9 + 1,823,943,662
    assert n["weights_bytes"] == 38_823_943_662
    assert n["kv_bytes_per_token"] == 41_984  # 656 x (61 + 3 draft layers)
    # 138,694,434,488 - 38,823,943,662 - 6,871,947,673 = 92,998,543,153; each sequence 131,072 + 5 tokens
    assert (n["kv_free_bytes"], n["lookahead"]) == (92_998_543_153, 5)
    assert n["kv_needed_bytes"] == 41_984 * 131_077 * 16 and n["margin_bytes"] == 4_948_354_865
    assert verdict(r, "memory").level == Level.OK and r.exit_code == 0
    # 10,902,852,383 to spare without it (test_tp8_on_h200_with_16_sequences_is_all_good)
    assert verdict(run("v4-tp8-h200", H200, max_num_seqs=16), "memory").numbers["margin_bytes"] == 10_902_852_383


def test_quantization_against_the_checkpoint_and_the_gpu_architecture():
    q = verdict(run("v4-tp8-h200", H200), "quantization")
    assert q.level == Level.OK and "fp8 weights (as shipped) run natively on NVIDIA H200 (SM90)" in q.reason
    q = verdict(run("v4-tp8-h200", A100, attention_backend=None), "quantization")
    assert q.level == Level.WARNING and "Marlin W8A16" in q.reason  # FP8 tensor cores are SM89+
    q = verdict(run("v4-tp8-h200", V100, attention_backend=None), "quantization")
    assert q.level == Level.BLOCKING and "Minimum capability: 75. Current capability: 70." in q.reason
    # FP4: Blackwell natively, Hopper through Marlin; a bf16 checkpoint quantized online to fp8
    assert verdict(with_model(DENSE, B200, quantization="modelopt_fp4"), "quantization").level == Level.OK
    assert verdict(with_model(DENSE, H200, quantization="modelopt_fp4"), "quantization").level == Level.WARNING
    assert verdict(with_model(DENSE, H200, quantization="fp8"), "quantization").level == Level.OK
    assert [v for v in with_model(DENSE, H200).verdicts if v.check == "quantization"] == []  # bf16 as shipped
    # another format than the FP8 checkpoint's: vLLM refuses; a path that may hold another copy: a warning
    r = run("v4-tp8-h200", H200, quantization="awq")
    [mismatch] = [v for v in r.verdicts if v.check == "quantization" and v.level == Level.BLOCKING]
    assert "model config (fp8) does not match" in mismatch.reason and r.exit_code == 2
    r = run("v4-tp8-h200", H200, quantization="awq", model="/models/DeepSeek-V4.1")
    assert {v.level for v in r.verdicts if v.check == "quantization"} == {Level.WARNING, Level.OK}
    # not --quantization choices at all
    for name, words in (("bf16", "--dtype bfloat16"), ("nvfp4", "modelopt_fp4")):
        q = verdict(run("v4-tp8-h200", H200, quantization=name), "quantization")
        assert q.level == Level.BLOCKING and "invalid choice" in q.reason and words in q.reason + q.fix
    q = [v for v in run("v4-tp8-h200", H200, quantization="int3").verdicts if v.check == "quantization"]
    assert q[0].level == Level.WARNING and "choices this check knows" in q[0].reason


def test_the_agent_preflight_refuses_what_vllm_would(tmp_path):
    exe = tmp_path / "vllm"
    exe.write_text("#!/bin/sh\n")
    exe.chmod(0o755)
    gpus = [{"index": s.index, "name": s.name, "cc_major": 9, "cc_minor": 0, "mem_total_bytes": s.mem_total_bytes,
             "nvlink_count": 18} for s in h200_specs()]
    prof = dataclasses.replace(PROFILES["v4-tp8-h200"], executable=str(exe), max_num_seqs=16,
                               extra_args=("-dcp", "3", *spec(method="deepseek_mtp")))
    problems, _ = preflight(prof, gpus)
    assert any("dcp_size=3" in p for p in problems) and any("not mtp" in p for p in problems)
    problems, warnings = preflight(dataclasses.replace(prof, extra_args=("-dcp", "8", *spec(method="dspark"))), gpus)
    assert problems == [] and warnings == []
