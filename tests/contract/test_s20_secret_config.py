"""Session 20: secrets a config puts where other local users read them.

A URL's password in `extra_args` (a profile's, or `[ray]`'s) would sit in the child's /proc/PID/cmdline, which
every local user reads, and in serving.json: refused, as `--api-key` is, by the one validation `config check` and
the agent share (parse_config), naming the key and never the value. A file of secrets (env_file, a credential)
or a config with a secret written inline that the operators' group (`[agent] socket_group`) or every user may
read is told as a warning by `config check` and at the agent's start: refusing it would stop working installs.
"""

from __future__ import annotations

import grp
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support.agent_config import SIM, profile, sim_profile, write_agent_config
from support.agent_proc import Agent

from lynxtop.contract.config import ConfigError, load_config, parse_config

PASSWORD = "hunter2-s3cr3t-pw"
URL = f"https://ops:{PASSWORD}@otel.example:4318"
TOKEN = "hf_abcdefghijklmnopqrstuvwxyz012345"
OPERATORS = "users"  # a group that exists here with gid != 0, standing for `lynxtop`


def _lynxtop(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "lynxtop", *args], capture_output=True, text=True, timeout=60,
                          env=None if env is None else dict(os.environ, **env))


def _config(tmp_path: Path, **kw) -> Path:
    return write_agent_config(tmp_path / "config.toml", tmp_path / "state" / "lynxtop.db", tmp_path / "agent.sock",
                              **kw)


# ---------------------------------------------------------------------------------------------- URL passwords

@pytest.mark.parametrize("args", [["--otlp-traces-endpoint", URL], [f"--otlp-traces-endpoint={URL}"],
                                  ["--kv-transfer-config", f'{{"url": "{URL}/x"}}']])
def test_a_url_password_in_a_profiles_extra_args_is_refused_without_quoting_it(tmp_path, args):
    cfg = _config(tmp_path, profiles=profile("p", SIM, extra_args=args))
    with pytest.raises(ConfigError) as exc:
        load_config(str(cfg))
    [problem] = exc.value.problems
    assert problem.startswith(f"{cfg}: profile[0] (p).extra_args: "), problem
    assert PASSWORD not in problem and "ops" not in problem
    assert "--otlp-traces-endpoint" in problem or "--kv-transfer-config" in problem  # the flag it goes with
    assert "ps" in problem and "env_file" in problem and "env_credentials" in problem  # where it goes instead
    r = _lynxtop("config", "check", "--config", str(cfg))
    assert r.returncode == 2 and PASSWORD not in r.stdout + r.stderr
    assert r.stderr == f"lynxtop: config error: {problem}\n"


def test_the_agent_refuses_to_start_on_the_same_url_password(tmp_path):
    cfg = _config(tmp_path, profiles=profile("p", SIM, extra_args=["--otlp-traces-endpoint", URL]))
    check = _lynxtop("config", "check", "--config", str(cfg))
    agent = _lynxtop("agent", "--config", str(cfg))
    assert agent.returncode == check.returncode == 2
    assert agent.stderr == check.stderr and "extra_args" in agent.stderr and PASSWORD not in agent.stderr
    assert not (tmp_path / "state").exists()  # refused before it opened anything


def test_a_url_password_in_ray_extra_args_is_refused(tmp_path):
    text = f'[ray]\nextra_args = ["--tracing-startup-hook", "x", "--storage={URL}"]\n'
    with pytest.raises(ConfigError) as exc:
        parse_config(text)
    [problem] = exc.value.problems
    assert problem.startswith("<config>: ray.extra_args: ") and "--storage" in problem, problem
    assert PASSWORD not in problem and "[ray] env" in problem


# a user part alone (`https://ops@`, `https://ops:@`) is refused since session 21 (test_s21_secrets_leftovers.py)
@pytest.mark.parametrize("arg", ["https://otel.example:4318", "user:pw@host", "s3://bucket/key@v2"])
def test_urls_without_a_password_stay_accepted(arg):
    cfg = parse_config(f'[[profile]]\nname = "p"\nexecutable = "/bin/true"\nmodel = "m"\n'
                       f'extra_args = ["--otlp-traces-endpoint", "{arg}"]\n')
    assert cfg.profiles[0].extra_args[-1] == arg


# ---------------------------------------------------------------------------------------------- readable secrets

def _env_file(tmp_path: Path, group: str, mode: int) -> Path:
    env_file = tmp_path / "hf.env"
    env_file.write_text(f"HF_TOKEN={TOKEN}\n")
    os.chown(env_file, 0, grp.getgrnam(group).gr_gid)
    os.chmod(env_file, mode)
    return env_file


def test_an_env_file_the_operators_group_reads_is_a_warning_naming_file_mode_group_and_fix(tmp_path):
    env_file = _env_file(tmp_path, OPERATORS, 0o640)
    cfg = _config(tmp_path, socket_group=OPERATORS, profiles=profile("p", SIM, env_file=str(env_file)))
    os.chmod(cfg, 0o600)
    r = _lynxtop("config", "check", "--config", str(cfg))
    assert r.returncode == 0 and "valid" in r.stdout, r.stderr  # a warning: a working install keeps working
    assert TOKEN not in r.stdout + r.stderr
    [line] = r.stderr.splitlines()
    assert line.startswith(f"lynxtop: config warning: {cfg}: profile[0] (p).env_file: {env_file} "), line
    assert "mode 0640" in line and f"group {OPERATORS}" in line and "socket_group" in line
    assert "chmod 600" in line and "LoadCredential" in line


@pytest.mark.parametrize(("group", "mode"), [("root", 0o640), (OPERATORS, 0o600)])
def test_an_env_file_only_the_agent_reads_gives_no_warning(tmp_path, group, mode):
    env_file = _env_file(tmp_path, group, mode)
    cfg = _config(tmp_path, socket_group=OPERATORS, profiles=profile("p", SIM, env_file=str(env_file)))
    os.chmod(cfg, 0o644)  # no secret in it
    r = _lynxtop("config", "check", "--config", str(cfg))
    assert r.returncode == 0 and r.stderr == "", r.stderr


def test_a_credential_file_others_read_is_a_warning(tmp_path):
    creds = tmp_path / "creds"
    creds.mkdir()
    (creds / "hf").write_text(TOKEN)
    os.chmod(creds / "hf", 0o644)
    cfg = _config(tmp_path, profiles=profile("p", SIM, env_credentials={"HF_TOKEN": "hf"}))
    os.chmod(cfg, 0o600)
    r = _lynxtop("config", "check", "--config", str(cfg), env={"CREDENTIALS_DIRECTORY": str(creds)})
    assert r.returncode == 0 and TOKEN not in r.stdout + r.stderr
    [line] = r.stderr.splitlines()
    assert line.startswith(f"lynxtop: config warning: {cfg}: profile[0] (p).env_credentials.HF_TOKEN: "
                           f"{creds / 'hf'} "), line
    assert "mode 0644" in line and "every local user" in line
    os.chmod(creds / "hf", 0o400)
    r = _lynxtop("config", "check", "--config", str(cfg), env={"CREDENTIALS_DIRECTORY": str(creds)})
    assert r.returncode == 0 and r.stderr == ""


@pytest.mark.parametrize(("group", "mode", "told"), [("root", 0o644, True), (OPERATORS, 0o640, True),
                                                     ("root", 0o640, False), (OPERATORS, 0o600, False)])
def test_an_inline_secret_in_a_config_others_read_is_a_warning(tmp_path, group, mode, told):
    cfg = _config(tmp_path, socket_group=OPERATORS,
                  profiles=profile("p", SIM, env={"HF_TOKEN": TOKEN, "VLLM_LOGGING_LEVEL": "INFO"}))
    os.chown(cfg, 0, grp.getgrnam(group).gr_gid)
    os.chmod(cfg, mode)
    r = _lynxtop("config", "check", "--config", str(cfg))
    assert r.returncode == 0 and TOKEN not in r.stdout + r.stderr
    if not told:
        assert r.stderr == ""
        return
    [line] = r.stderr.splitlines()
    assert line.startswith(f"lynxtop: config warning: {cfg}: profile[0] (p).env: HF_TOKEN "), line
    assert f"mode {mode:04o}" in line and f"group {group}" in line and "VLLM_LOGGING_LEVEL" not in line
    assert "env_file" in line and "LoadCredential" in line


def test_the_agent_starts_and_says_the_same_warning(tmp_path):
    cfg = _config(tmp_path, fake_nvml="sim", sample_interval_s=0.2,
                  profiles=sim_profile("p", tp=1, env={"HF_TOKEN": TOKEN}))
    os.chmod(cfg, 0o644)
    want = _lynxtop("config", "check", "--config", str(cfg)).stderr
    assert want.startswith("lynxtop: config warning: ")
    a = Agent(tmp_path, cfg)
    try:
        deadline = time.monotonic() + 60
        while not any("READY=1" in m for m in a.drain()):
            assert a.proc.poll() is None and time.monotonic() < deadline, a.output()
            time.sleep(0.05)
        out = a.output()
    finally:
        a.stop()
    assert want.strip() in out and TOKEN not in out
