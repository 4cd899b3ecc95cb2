"""Config validation: every kind of mistake gets one message naming file, key and problem."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from lynxtop.agent.config import ConfigError, load_config, parse_config

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
         "profile[0] (a).extra_args", "typed profile option"),
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


def test_config_check_prints_argv(tmp_path):
    f = tmp_path / "c.toml"
    f.write_text(GOOD)
    r = run_cli("config", "check", "--config", str(f))
    assert r.returncode == 0, r.stderr
    assert "/opt/vllm/bin/vllm serve deepseek-ai/DeepSeek-V4.1 --host 127.0.0.1 --port 8000" in r.stdout
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
    example = Path(__file__).resolve().parents[1] / "systemd" / "config.example.toml"
    if not example.exists():
        pytest.fail("systemd/config.example.toml is missing")
    cfg = load_config(str(example))
    names = [p.name for p in cfg.profiles]
    assert len(names) >= 3
    assert any(p.pipeline_parallel_size == 2 and p.distributed_executor_backend == "ray" for p in cfg.profiles)
