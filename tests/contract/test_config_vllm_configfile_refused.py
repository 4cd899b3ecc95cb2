"""A profile's extra_args cannot hand vLLM a `--config FILE.yaml` (in any spelling vLLM's parser reads as it).

vLLM reads that YAML's keys as long flags when the run starts, after `config check` and the agent's validation:
through it a profile could set what a typed key owns (host, port, tensor-parallel-size), turn on TLS the health
probe cannot speak, or put an api key in a file lynxtop never sees; and the file could change between the check and
a start. The config refuses it, naming the config file, the profile, the key and the YAML file, so `config check`,
`lynxtop check`, `lynxtop agent` and the agent's reload all say the same, and nothing is started. vLLM's other
`--config-*` and `--*-config` options stay accepted.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from support.agent_config import profile, write_agent_config

from lynxtop.agent.config_source import ConfigSource
from lynxtop.contract.config import ConfigError, config_file_use, load_config, parse_config
from lynxtop.sim.flags import parse_serve_args
from lynxtop.sim.vllm_options import VLLM_SERVE_OPTIONS

pytestmark = pytest.mark.timeout(90)

SOURCE = "/etc/lynxtop/config.toml"
PROFILE = '[[profile]]\nname = "a"\nexecutable = "/x/vllm"\nmodel = "m"\n'
YAML = "/etc/vllm/serve.yaml"
ADVICE = "put those flags in the profile"


def _problems(args: list[str]) -> list[str]:
    with pytest.raises(ConfigError) as exc:
        parse_config(PROFILE + f"extra_args = {json.dumps(args)}\n", source=SOURCE)
    return exc.value.problems


@pytest.mark.parametrize(("args", "named"), [
    (["--config", YAML], YAML),
    ([f"--config={YAML}"], YAML),
    (["--enforce-eager", "--config", "serve.yml", "--seed", "1"], "serve.yml"),
    (["--config"], None),  # no file after it: still vLLM's config file option
    (["--conf", YAML], "a prefix of --config"),  # ambiguous with --config-format in vLLM 0.32: it exits
    ([f"--confi={YAML}"], "a prefix of --config"),
    (["--config.port", "9000"], "read by vLLM as --config"),  # dotted: vLLM turns it into --config '{"port": 9000}'
], ids=["separate", "attached", "among-others", "no-file", "prefix", "prefix-attached", "dotted"])
def test_a_vllm_config_file_in_extra_args_is_refused(args, named):
    """`named`: what the message names besides the key (the YAML file, or how vLLM reads the spelling)."""
    (problem,) = _problems(args)
    assert problem.startswith(f"{SOURCE}: profile[0] (a).extra_args: "), problem
    assert "hands vLLM a config file" in problem and ADVICE in problem and "checked" in problem, problem
    if named:
        assert named in problem, problem


def test_every_other_vllm_option_passes_the_config_file_check():
    """Only `--config` and what vLLM reads as it: --config-format, --hf-config-path, --*-config are other options."""
    assert "--config" in VLLM_SERVE_OPTIONS and "--config-format" in VLLM_SERVE_OPTIONS
    over = [f for f in VLLM_SERVE_OPTIONS if f != "--config" and config_file_use(f, "x")]
    assert over == []
    args = ["--config-format", "hf", "--config_format=mistral", "--config-f", "auto", "--hf-config-path", "/m",
            "--compilation-config", "{}", "--speculative-config.method", "ngram", "--generation-config", "auto",
            "--chat-template", "config.yaml"]
    cfg = parse_config(PROFILE + f"extra_args = {json.dumps(args)}\n", source=SOURCE)
    assert cfg.profiles[0].extra_args == tuple(args)


def test_the_simulator_reads_the_prefix_as_vllm_does():
    """`--conf` is ambiguous in vLLM 0.32 (--config, --config-format): vLLM exits 2 rather than read a file."""
    with pytest.raises(SystemExit) as exc:
        parse_serve_args(["m", "--conf", "x.yaml"], env={})
    assert exc.value.code == 2


# ---------------------------------------------------------------------------------------------- one validation

def _config(tmp_path: Path, extra_args: list[str]) -> Path:
    exe = tmp_path / "vllm"
    exe.write_text("#!/bin/sh\n")
    exe.chmod(0o755)
    return write_agent_config(tmp_path / "c.toml", tmp_path / "state" / "lynxtop.db", tmp_path / "agent.sock",
                              fake_nvml="sim", profiles=profile("big", exe, model="m", port=None,
                                                                extra_args=extra_args))


def _lynxtop(*args: str) -> subprocess.CompletedProcess:
    try:
        return subprocess.run([sys.executable, "-m", "lynxtop", *args], capture_output=True, text=True, timeout=30)
    except subprocess.TimeoutExpired:
        pytest.fail(f"lynxtop {' '.join(args)} ran on with a config that must be refused")


def test_config_check_check_and_agent_refuse_it_alike_and_start_nothing(tmp_path):
    yaml = tmp_path / "serve.yaml"
    yaml.write_text("port: 9999\nssl-keyfile: /etc/k.pem\napi-key: s3cret\ntensor-parallel-size: 2\n")
    before = yaml.read_text()
    path = _config(tmp_path, ["--enforce-eager", "--config", str(yaml)])
    check = _lynxtop("config", "check", "--config", str(path))
    agent = _lynxtop("agent", "--config", str(path))
    preflight = _lynxtop("check", "--config", str(path))
    want = f"lynxtop: config error: {path}: profile[0] (big).extra_args: --config {yaml} "
    for r, code in ((check, 2), (agent, 2), (preflight, 7)):  # `lynxtop check`: 7, could not check (s22)
        assert r.returncode == code, (r.returncode, r.stdout, r.stderr)
        assert r.stderr.startswith(want), r.stderr
        assert ADVICE in r.stderr and "Traceback" not in r.stderr and "s3cret" not in r.stderr + r.stdout
    assert agent.stderr == check.stderr == preflight.stderr
    assert "valid" not in check.stdout
    assert not (tmp_path / "state").exists() and not (tmp_path / "agent.sock").exists()  # nothing opened
    assert yaml.read_text() == before


def test_agent_reload_refuses_it_and_poll_keeps_the_previous_profiles(tmp_path):
    path = _config(tmp_path, ["--enforce-eager"])
    src = ConfigSource(load_config(str(path)))
    assert src.poll().profiles[0].extra_args == ("--enforce-eager",)  # the first poll notes the mtime
    good = path.read_text()
    path.write_text(good.replace('["--enforce-eager"]', f'["--config={tmp_path}/serve.yaml"]'))
    with pytest.raises(ConfigError) as exc:
        src.reload()
    assert any("profile[0] (big).extra_args: --config" in p and ADVICE in p for p in exc.value.problems)
    os.utime(path, (1, 1))  # a changed mtime, whatever the clock's resolution
    assert src.poll().profiles[0].extra_args == ("--enforce-eager",)
