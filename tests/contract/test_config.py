"""Config validation: every kind of mistake gets one message naming file, key and problem."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from lynxtop.contract import config as config_mod
from lynxtop.contract.config import (
    OWNED_FLAGS,
    SOCKET_PATH_MAX,
    Config,
    ConfigError,
    host_problems,
    load_config,
    parse_config,
)

GOOD = """
[agent]
database = "/var/lib/lynxtop/x.db"
sample_interval_s = 0.5

[agent.retention]
raw_days = 3

[sla]
ttft_p99_ms = 1500

[[profile]]
name = "ds-tp8"
executable = "/opt/vllm/bin/vllm"
model = "deepseek-ai/DeepSeek-V4.1"
served_model_name = "deepseek-v4.1"
tensor_parallel_size = 8
gpu_memory_utilization = 0.92
max_model_len = 32768
kv_cache_dtype = "fp8"
attention_backend = "FLASHMLA"
enable_prefix_caching = false
trust_remote_code = true
shutdown_timeout_s = 20
extra_args = ["--speculative-config", '{"method": "mtp"}']
env = { CUDA_VISIBLE_DEVICES = "0,1,2,3,4,5,6,7", NCCL_DEBUG = "WARN" }

[[profile]]
name = "ds-tp8-pp2"
executable = "/opt/vllm/bin/vllm"
model = "deepseek-ai/DeepSeek-V4.1"
tensor_parallel_size = 8
pipeline_parallel_size = 2
distributed_executor_backend = "ray"
"""


def problems(text: str) -> list[str]:
    with pytest.raises(ConfigError) as exc:
        parse_config(text, source="/etc/lynxtop/config.toml")
    return exc.value.problems


def test_good_config_parses_with_types_and_defaults():
    cfg = parse_config(GOOD, source="t.toml")
    assert cfg.agent.database == Path("/var/lib/lynxtop/x.db")
    assert cfg.agent.sample_interval_s == 0.5
    assert cfg.agent.retention.raw_days == 3 and cfg.agent.retention.minute_days == 90
    assert cfg.sla.ttft_p99_ms == 1500 and cfg.sla.tpot_p99_ms == 150
    p = cfg.profile("ds-tp8")
    assert p is not None and p.readiness_timeout_s == 1800
    assert p.stop_grace_s == 50  # shutdown_timeout + 30 by default
    assert cfg.profile("nope") is None


def test_argv_is_exact_and_never_shell():
    cfg = parse_config(GOOD, source="t.toml")
    argv = cfg.profile("ds-tp8").argv()
    assert argv == [
        "/opt/vllm/bin/vllm", "serve", "deepseek-ai/DeepSeek-V4.1", "--host", "127.0.0.1", "--port", "8000",
        "--served-model-name", "deepseek-v4.1", "--tensor-parallel-size", "8", "--max-model-len", "32768",
        "--gpu-memory-utilization", "0.92", "--kv-cache-dtype", "fp8", "--attention-backend", "FLASHMLA",
        "--no-enable-prefix-caching", "--trust-remote-code", "--shutdown-timeout", "20",
        "--speculative-config", '{"method": "mtp"}',
    ]
    pp = cfg.profile("ds-tp8-pp2").argv()
    assert pp[pp.index("--pipeline-parallel-size") + 1] == "2"
    assert pp[pp.index("--distributed-executor-backend") + 1] == "ray"


def test_flags_diff_material():
    cfg = parse_config(GOOD, source="t.toml")
    a, b = cfg.profile("ds-tp8").flags(), cfg.profile("ds-tp8-pp2").flags()
    assert a["--kv-cache-dtype"] == "fp8" and "--kv-cache-dtype" not in b
    assert b["--pipeline-parallel-size"] == "2"
    assert a["env CUDA_VISIBLE_DEVICES"] == "0,1,2,3,4,5,6,7"


@pytest.mark.parametrize(
    ("snippet", "key", "words"),
    [
        ('[agent]\nbogus = 1', "agent.bogus", "unknown key"),
        ('[agent]\nsample_interval_s = "fast"', "agent.sample_interval_s", "expected a number"),
        ("[agent]\nsample_interval_s = 0.01", "agent.sample_interval_s", "out of range"),
        ("[agent]\nsample_interval_s = 61", "agent.sample_interval_s", "out of range"),
        ('[agent]\ndatabase = "rel/x.db"', "agent.database", "relative path"),
        ('[agent]\nmetrics_listen = "nohost"', "agent.metrics_listen", "host:port"),
        ("[sla]\nttft_p99_ms = -1", "sla.ttft_p99_ms", "out of range"),
        ("[nonsense]\na = 1", "nonsense", "unknown section"),
        ('[[profile]]\nname = "a"\nexecutable = "vllm"\nmodel = "m"', "profile[0] (a).executable", "relative path"),
        ('[[profile]]\nname = "a"\nexecutable = "/x/vllm"\nmodel = "--evil"', "profile[0] (a).model",
         "would be read by vLLM as a flag"),
        ('[[profile]]\nname = "a"\nexecutable = "/x/vllm"\nmodel = "m"\ntensor_parallel_size = "8"',
         "profile[0] (a).tensor_parallel_size", "expected an integer"),
        ('[[profile]]\nname = "a"\nexecutable = "/x/vllm"\nmodel = "m"\ntensor_parallel_size = true',
         "profile[0] (a).tensor_parallel_size", "expected an integer"),
        ('[[profile]]\nname = "a"\nexecutable = "/x/vllm"\nmodel = "m"\ngpu_memory_utilization = 1.5',
         "profile[0] (a).gpu_memory_utilization", "out of range"),
        ('[[profile]]\nname = "a"\nexecutable = "/x/vllm"\nmodel = "m"\nkv_cache_dtype = "fp4"',
         "profile[0] (a).kv_cache_dtype", "not one of"),
        ('[[profile]]\nname = "a"\nexecutable = "/x/vllm"\nmodel = "m"\nenv = { LD_PRELOAD = "/evil.so" }',
         "profile[0] (a).env", "LD_PRELOAD is not allowed"),
        ('[[profile]]\nname = "a"\nexecutable = "/x/vllm"\nmodel = "m"\nenv = { PYTHONPATH = "/x" }',
         "profile[0] (a).env", "PYTHONPATH is not allowed"),
        ('[[profile]]\nname = "a"\nexecutable = "/x/vllm"\nmodel = "m"\nextra_args = ["--port", "9"]',
         "profile[0] (a).extra_args", "owned by the typed key port"),
        ('[[profile]]\nname = "a"\nexecutable = "/x/vllm"\nmodel = "m"\nshutdown_timeout_s = 60\nstop_grace_s = 10',
         "profile[0] (a).stop_grace_s", "shutdown_timeout_s"),
        ('[[profile]]\nname = "a"\nmodel = "m"', "profile[0] (a).executable", "is required"),
        ('[[profile]]\nname = "a"\nexecutable = "/x/vllm"\nmodel = "m"\n[[profile]]\nname = "a"\n'
         'executable = "/x/vllm"\nmodel = "m2"', "profile[1] (a).name", "duplicate profile name"),
        ('[agent]\ndefault_profile = "ghost"', "agent.default_profile", "no profile named"),
    ],
)
def test_each_mistake_names_file_key_and_problem(snippet, key, words):
    msgs = problems(snippet)
    assert len(msgs) == 1, msgs
    assert msgs[0].startswith(f"/etc/lynxtop/config.toml: {key}: "), msgs[0]
    assert words in msgs[0]


def test_all_problems_reported_at_once():
    msgs = problems('[agent]\nbogus = 1\nsample_interval_s = 0\n[sla]\nwindow_s = "x"')
    assert len(msgs) == 3


def test_invalid_toml_names_the_file():
    msgs = problems("[agent\n")
    assert msgs[0].startswith("/etc/lynxtop/config.toml: not valid TOML")


def test_default_paths_follow_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("STATE_DIRECTORY", str(tmp_path / "state"))
    monkeypatch.setenv("RUNTIME_DIRECTORY", str(tmp_path / "run"))
    cfg = parse_config("")
    assert cfg.agent.database == tmp_path / "state" / "lynxtop.db"
    assert cfg.agent.socket == tmp_path / "run" / "agent.sock"
    assert cfg.agent.run_log_dir == tmp_path / "state" / "logs"


def test_load_config_env_override_and_missing(monkeypatch, tmp_path):
    f = tmp_path / "c.toml"
    f.write_text(GOOD)
    monkeypatch.setenv("LYNXTOP_CONFIG", str(f))
    assert load_config().profile("ds-tp8") is not None
    with pytest.raises(ConfigError, match="config file not found"):
        load_config(str(tmp_path / "missing.toml"))


def run_cli(*args: str, env_config: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "lynxtop", *args], capture_output=True, text=True, timeout=60)


def fake_vllm(tmp_path: Path) -> Path:
    """An executable file standing in for vllm (`config check` and the agent check that it exists)."""
    exe = tmp_path / "bin" / "vllm"
    exe.parent.mkdir(exist_ok=True)
    exe.write_text("#!/bin/sh\nexit 0\n")
    exe.chmod(0o755)
    return exe


def test_config_check_prints_argv(tmp_path):
    f = tmp_path / "c.toml"
    exe = fake_vllm(tmp_path)
    f.write_text(GOOD.replace("/opt/vllm/bin/vllm", str(exe)))
    r = run_cli("config", "check", "--config", str(f))
    assert r.returncode == 0, r.stderr
    assert f"{exe} serve deepseek-ai/DeepSeek-V4.1 --host 127.0.0.1 --port 8000" in r.stdout
    assert "--speculative-config '{\"method\": \"mtp\"}'" in r.stdout
    assert "[[profile]] ds-tp8-pp2" in r.stdout


def test_config_check_bad_file_exit_2_without_traceback(tmp_path):
    f = tmp_path / "c.toml"
    f.write_text('[[profile]]\nname = "a"\nexecutable = "vllm"\nmodel = "m"\n')
    r = run_cli("config", "check", "--config", str(f))
    assert r.returncode == 2
    assert f"{f}: profile[0] (a).executable: 'vllm' is a relative path" in r.stderr
    assert "Traceback" not in r.stderr


def test_example_config_is_valid():
    example = Path(__file__).resolve().parents[2] / "systemd" / "config.example.toml"
    if not example.exists():
        pytest.fail("systemd/config.example.toml is missing")
    cfg = load_config(str(example))
    names = [p.name for p in cfg.profiles]
    assert len(names) >= 3
    assert any(p.pipeline_parallel_size == 2 and p.distributed_executor_backend == "ray" for p in cfg.profiles)


# ---------------------------------------------------------------------------------------------- issue 11, bad input

PROFILE = """
[[profile]]
name = "a"
executable = "/x/vllm"
model = "m"
host = "127.0.0.1"
tensor_parallel_size = 8
enable_prefix_caching = true
"""


@pytest.mark.parametrize(
    ("snippet", "key"),
    [
        ("[agent]\nsample_interval_s = nan", "agent.sample_interval_s"),
        ("[agent]\nhang_timeout_s = inf", "agent.hang_timeout_s"),
        ("[agent]\nbackoff_initial_s = -inf", "agent.backoff_initial_s"),
        ("[agent.retention]\nraw_days = nan", "agent.retention.raw_days"),
        ("[agent.retention]\nhour_days = +inf", "agent.retention.hour_days"),
        ("[sla]\nttft_p99_ms = nan", "sla.ttft_p99_ms"),
        ("[sla]\nwindow_s = -nan", "sla.window_s"),
        (PROFILE + "gpu_memory_utilization = nan", "profile[0] (a).gpu_memory_utilization"),
        (PROFILE + "readiness_timeout_s = inf", "profile[0] (a).readiness_timeout_s"),
        (PROFILE + "stop_grace_s = nan", "profile[0] (a).stop_grace_s"),
    ],
)
def test_nan_and_inf_are_refused_naming_file_and_key(snippet, key):
    """nan compares false with every bound: `sample_interval_s = nan` ran an agent that never sampled."""
    msgs = problems(snippet)
    assert len(msgs) == 1, msgs
    assert msgs[0].startswith(f"/etc/lynxtop/config.toml: {key}: "), msgs[0]
    assert "not a finite number" in msgs[0]


def test_every_float_key_of_every_section_refuses_nan():
    """One place refuses nan for all float keys, including keys added later to any section."""
    specs = {"agent": config_mod._AGENT_SPEC, "agent.retention": config_mod._RETENTION_SPEC,  # noqa: SLF001
             "sla": config_mod._SLA_SPEC, "profile": config_mod._PROFILE_SPEC}  # noqa: SLF001
    float_keys = 0
    for section, spec in specs.items():
        for key, conv in spec.items():
            for bad in (float("nan"), float("inf"), float("-inf")):
                try:
                    conv(key, bad)
                except config_mod._Bad as exc:  # noqa: SLF001
                    if "expected" not in str(exc):  # a float key (others refuse the type)
                        assert "not a finite number" in str(exc), f"{section}.{key}: {exc}"
                        float_keys += 1
                else:
                    pytest.fail(f"{section}.{key} accepted {bad}")
    assert float_keys >= 3 * 15


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--tensor_parallel_size", "2"], "--tensor_parallel_size (vLLM reads it as --tensor-parallel-size) is owned "
                                          "by the typed key tensor_parallel_size"),
        (["--tensor-parallel-size=2"], "--tensor-parallel-size=2 is owned by the typed key tensor_parallel_size"),
        (["--tensor-par", "2"], "prefix of --tensor-parallel-size"),
        (["-t", "2"], "-t is a prefix of -tp"),
        (["--hos", "0.0.0.0"], "--hos is a prefix of --host (vLLM expands an unambiguous prefix"),
        (["--hos=0.0.0.0"], "--hos=0.0.0.0 is a prefix of --host"),
        (["--host=0.0.0.0"], "--host=0.0.0.0 is owned by the typed key host"),
        (["--uds", "/tmp/v.sock"], "owned by the typed key host/port"),
        (["--no-enable-prefix-caching"], "--no-enable-prefix-caching is owned by the typed key enable_prefix_caching"),
        (["--no_enable_prefix_caching"], "owned by the typed key enable_prefix_caching"),
        (["--no-enable-prefix"], "prefix of --no-enable-prefix-caching"),
        (["--no-trust-remote-code"], "owned by the typed key trust_remote_code"),
        (["-ep"], "owned by the typed key enable_expert_parallel"),
        (["-qfp8"], "-qfp8 is -q fp8 (value attached), owned by the typed key quantization"),
        (["--device-memory-utilization", "0.5"], "owned by the typed key gpu_memory_utilization"),
        (["--max-num", "8"], "prefix of --max-num-batched-tokens, --max-num-seqs"),
        (["--gpu_memory_utilization.x", "1"], "owned by the typed key gpu_memory_utilization"),
    ],
)
def test_extra_args_cannot_override_a_typed_flag(args, words):
    """Normalised as vLLM does (`_`, `=`, abbreviations): `--hos 0.0.0.0` bound the server to every interface."""
    msgs = problems(PROFILE + f"extra_args = {json.dumps(args)}")
    assert len(msgs) == 1, msgs
    assert msgs[0].startswith("/etc/lynxtop/config.toml: profile[0] (a).extra_args: "), msgs[0]
    assert words in msgs[0], msgs[0]
    assert "use the typed key instead of extra_args" in msgs[0]


def test_unowned_flags_and_values_stay_accepted():
    """The owned-flag check must not refuse vLLM's other flags, their abbreviations or negative values."""
    args = ["--enforce-eager", "--max-num-partial-prefills", "2", "--data-parallel-size-local", "1", "-dpl", "1",
            "--seed", "-1", "-O3", "--speculative-config", '{"method": "mtp"}', "--enable-chunked-prefill",
            "--max_logprobs=5", "--kv-cache-memory-bytes", "1G", "--pooler-config", "{}"]
    cfg = parse_config(PROFILE + f"extra_args = {json.dumps(args)}", source="t.toml")
    assert cfg.profiles[0].argv()[-len(args):] == args
    for flag in OWNED_FLAGS:  # every owned flag, exactly, is refused
        with pytest.raises(ConfigError, match="owned by the typed key"):
            parse_config(PROFILE + f'extra_args = ["{flag}"]', source="t.toml")


@pytest.mark.parametrize(
    ("env", "words"),
    [
        ('{ "VLLM_A=B" = "x" }', "'VLLM_A=B' is not a valid environment variable name"),
        ('{ "VLLM_A\\u0000B" = "x" }', "'VLLM_A\\x00B' is not a valid environment variable name"),
        ('{ "" = "x" }', "'' is not a valid environment variable name"),
        ('{ VLLM_A = "x\\u0000y" }', "the value of VLLM_A holds the control character \\x00"),
    ],
)
def test_env_names_and_values_that_cannot_reach_execve_are_refused(env, words):
    """A name with '=' or NUL, or a value with NUL, passed `config check` and failed at spawn with a traceback."""
    msgs = problems(PROFILE + f"env = {env}")
    assert len(msgs) == 1, msgs
    assert msgs[0].startswith("/etc/lynxtop/config.toml: profile[0] (a).env: "), msgs[0]
    assert words in msgs[0], msgs[0]


@pytest.mark.parametrize("size", [108, 200, SOCKET_PATH_MAX + 1])
def test_socket_path_longer_than_the_agent_can_bind_is_refused(size):
    path = "/run/" + "s" * (size - len("/run/"))
    msgs = problems(f'[agent]\nsocket = "{path}"')
    assert len(msgs) == 1, msgs
    assert msgs[0].startswith("/etc/lynxtop/config.toml: agent.socket: control socket path "), msgs[0]
    assert f"is {size} bytes; at most {SOCKET_PATH_MAX} fit" in msgs[0]
    ok = "/run/" + "s" * (SOCKET_PATH_MAX - len("/run/"))
    assert parse_config(f'[agent]\nsocket = "{ok}"').agent.socket == Path(ok)


def test_default_socket_path_too_long_is_refused(monkeypatch):
    monkeypatch.setenv("RUNTIME_DIRECTORY", "/run/" + "d" * 120)
    msgs = problems("")
    assert len(msgs) == 1 and msgs[0].startswith("/etc/lynxtop/config.toml: agent.socket: "), msgs
    assert "(the default; set [agent] socket)" in msgs[0]


def _with_exe(tmp_path: Path, exe: str) -> Config:
    f = tmp_path / "c.toml"
    f.write_text(PROFILE.replace("/x/vllm", exe))
    return load_config(str(f))


def test_executable_missing_not_executable_or_a_directory_named_with_file_and_key(tmp_path):
    f = tmp_path / "c.toml"
    assert host_problems(_with_exe(tmp_path, str(fake_vllm(tmp_path)))) == []
    missing = tmp_path / "nope" / "vllm"
    assert host_problems(_with_exe(tmp_path, str(missing))) == [
        f"{f}: profile[0] (a).executable: {missing} does not exist"]
    plain = tmp_path / "plain"
    plain.write_text("#!/bin/sh\n")
    plain.chmod(0o644)
    (msg,) = host_problems(_with_exe(tmp_path, str(plain)))
    assert msg.startswith(f"{f}: profile[0] (a).executable: {plain} is not executable by ") and "mode 644" in msg
    (msg,) = host_problems(_with_exe(tmp_path, str(tmp_path)))
    assert msg == f"{f}: profile[0] (a).executable: {tmp_path} is a directory, not an executable file"
    link = tmp_path / "dangling"
    link.symlink_to(tmp_path / "gone")
    (msg,) = host_problems(_with_exe(tmp_path, str(link)))
    assert "is a symbolic link to" in msg and "which does not exist" in msg
