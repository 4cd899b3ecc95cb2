"""Issue 24.3: secrets in a profile's env. The values reach vLLM (Profile.env) but every shown form (flags, the
served env, config_as_dict, the switch diff) masks them as `***<short hash>`; an env_file is read only if its
mode and owner keep it private, line by line with file:line problems that never show a value; a systemd credential
comes from $CREDENTIALS_DIRECTORY. Through load_config(secrets=True), which the agent and `config check` share."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from lynxtop.contract.config import ConfigError, config_as_dict, load_config, parse_config
from lynxtop.contract.records import ProfileInfo
from lynxtop.contract.redact import mask
from lynxtop.tui.control_text import flag_diff

TOKEN = "hf_abcSecretToken123"
KEY = "sk-secret-api-key-456"


def _profile(name: str = "p", **keys: str) -> str:
    body = "".join(f"{k} = {v}\n" for k, v in keys.items())
    return f'\n[[profile]]\nname = "{name}"\nexecutable = "/x/vllm"\nmodel = "m"\n{body}'


def _config(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "config.toml"
    path.write_text(text)
    return path


def _env_file(tmp_path: Path, text: str, mode: int = 0o600) -> Path:
    path = tmp_path / "secret.env"
    path.write_text(text)
    path.chmod(mode)
    return path


def _problems(path: Path) -> list[str]:
    with pytest.raises(ConfigError) as exc:
        load_config(str(path), secrets=True)
    return exc.value.problems


def test_secret_values_reach_the_env_and_are_masked_in_every_shown_form():
    cfg = parse_config('[agent]\nsecret_env = ["VLLM_PLUGIN_AUTH"]\n' + _profile(
        env=f'{{ HF_TOKEN = "{TOKEN}", VLLM_API_KEY = "{KEY}", VLLM_PLUGIN_AUTH = "x1", NCCL_DEBUG = "INFO" }}'))
    prof = cfg.profiles[0]
    assert prof.env["HF_TOKEN"] == TOKEN and prof.env["VLLM_API_KEY"] == KEY  # what vLLM gets
    flags = prof.flags()
    assert flags["env HF_TOKEN"] == mask(TOKEN) and flags["env VLLM_API_KEY"] == mask(KEY)
    assert flags["env VLLM_PLUGIN_AUTH"] == mask("x1")  # named by [agent] secret_env
    assert flags["env NCCL_DEBUG"] == "INFO"
    assert mask(TOKEN).startswith("***") and mask(TOKEN) != mask(KEY) and mask(TOKEN) == mask(TOKEN)
    shown = json.dumps(config_as_dict(cfg))
    assert TOKEN not in shown and KEY not in shown and mask(TOKEN) in shown
    assert prof.shown_env() == {"HF_TOKEN": mask(TOKEN), "VLLM_API_KEY": mask(KEY),
                                "VLLM_PLUGIN_AUTH": mask("x1"), "NCCL_DEBUG": "INFO"}


def test_switch_diff_shows_that_a_secret_changed_not_its_value():
    cfg = parse_config(_profile("a", env=f'{{ HF_TOKEN = "{TOKEN}" }}')
                       + _profile("b", env='{ HF_TOKEN = "hf_otherToken999" }'))
    a, b = (ProfileInfo(p.name, flags=p.flags()) for p in cfg.profiles)
    assert flag_diff(a, b) == [("env HF_TOKEN", mask(TOKEN), mask("hf_otherToken999"))]


def test_secret_env_names_are_checked():
    with pytest.raises(ConfigError) as exc:
        parse_config('[agent]\nsecret_env = ["1BAD"]\n')
    assert exc.value.problems == ["<config>: agent.secret_env: '1BAD' is not a valid environment variable name "
                                  "(letters, digits and _, not starting with a digit)"]


def test_env_file_lines_are_read_and_every_name_in_it_is_secret(tmp_path):
    env_file = _env_file(tmp_path, f'# gated weights\n\nHF_TOKEN={TOKEN}\r\nVLLM_API_KEY="{KEY}"\n'
                                   "HF_HUB_OFFLINE='1'\nVLLM_EMPTY=\n  # indented comment\n")
    cfg = load_config(str(_config(tmp_path, _profile(env_file=json.dumps(str(env_file))))), secrets=True)
    prof = cfg.profiles[0]
    assert prof.env == {"HF_TOKEN": TOKEN, "VLLM_API_KEY": KEY, "HF_HUB_OFFLINE": "1", "VLLM_EMPTY": ""}
    assert prof.flags()["env HF_HUB_OFFLINE"] == mask("1")  # kept out of the config: treated as secret
    # a client (status, the dashboard) never reads it
    assert load_config(str(tmp_path / "config.toml")).profiles[0].env == {}


@pytest.mark.parametrize("mode", [0o644, 0o604, 0o660, 0o400])
def test_env_file_readable_by_others_or_odd_mode_is_refused(tmp_path, mode):
    env_file = _env_file(tmp_path, f"HF_TOKEN={TOKEN}\n", mode)
    problems = _problems(_config(tmp_path, _profile(env_file=json.dumps(str(env_file)))))
    assert problems == [f"{tmp_path}/config.toml: profile[0] (p).env_file: {env_file}: has mode {mode:04o}; an "
                        f"env_file holds secrets: give it mode 0600 or 0640 (chmod 600 {env_file})"]


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a file to another user needs root")
def test_env_file_owned_by_another_user_is_refused(tmp_path):
    env_file = _env_file(tmp_path, f"HF_TOKEN={TOKEN}\n")
    os.chown(env_file, 65534, 65534)
    problems = _problems(_config(tmp_path, _profile(env_file=json.dumps(str(env_file)))))
    assert len(problems) == 1 and f"{env_file}: is owned by " in problems[0] and "uid 65534" in problems[0]
    assert "must be owned by the agent's user" in problems[0]


def test_env_file_that_is_missing_or_not_a_file_is_refused(tmp_path):
    fifo = tmp_path / "fifo.env"
    os.mkfifo(fifo, 0o600)  # opened without waiting for a writer
    for path, why in ((fifo, "is not a regular file"), (tmp_path / "absent.env", "cannot be read: No such file"),
                      (tmp_path, "cannot be read: Is a directory")):
        problems = _problems(_config(tmp_path, _profile(env_file=json.dumps(str(path)))))
        assert len(problems) == 1 and f".env_file: {path}: {why}" in problems[0], problems


def test_env_file_bad_lines_are_named_by_file_and_line_without_their_text(tmp_path):
    env_file = _env_file(tmp_path, f"HF_TOKEN={TOKEN}\nexport VLLM_X={KEY}\n{KEY}\n HF_A=1\nHF_TOKEN=again{KEY}\n"
                                   f"LD_PRELOAD=/tmp/{KEY}.so\nVLLM_B=a\x1bb{KEY}\n")
    problems = _problems(_config(tmp_path, _profile(env_file=json.dumps(str(env_file)))))
    where = f"{tmp_path}/config.toml: profile[0] (p).env_file: {env_file}"
    name_rule = ("the text before '=' is not an environment variable name (letters, digits and _ from the first "
                 "column, not starting with a digit; no spaces, no `export`)")
    assert problems == [
        f"{where}:2: {name_rule}",
        f"{where}:3: expected NAME=VALUE; this line has no '=' (it is not shown: it may hold a secret)",
        f"{where}:4: {name_rule}",
        f"{where}:5: HF_TOKEN is set again (first on line 1)",
        f"{where}:6: variable LD_PRELOAD is not allowed (allowed: CUDA_DEVICE_ORDER, CUDA_VISIBLE_DEVICES, "
        "OMP_NUM_THREADS, TMPDIR, TOKENIZERS_PARALLELISM and names starting with VLLM_, HF_, NCCL_, RAY_, "
        "TORCH_SYMM_MEM_, NVSHMEM_)",
        f"{where}:7: the value of VLLM_B holds the control character \\x1b; control characters are refused",
    ]
    assert not any(TOKEN in p or KEY in p for p in problems)


def test_a_variable_has_one_source(tmp_path):
    env_file = _env_file(tmp_path, f"HF_TOKEN={TOKEN}\n")
    problems = _problems(_config(tmp_path, _profile(env=f'{{ HF_TOKEN = "{KEY}" }}',
                                                    env_file=json.dumps(str(env_file)))))
    assert problems == [f"{tmp_path}/config.toml: profile[0] (p).env_file: {env_file}: HF_TOKEN is also set in env "
                        "or env_credentials: give a variable one source"]
    with pytest.raises(ConfigError) as exc:
        parse_config(_profile(env='{ VLLM_API_KEY = "x" }', env_credentials='{ VLLM_API_KEY = "k" }'))
    assert exc.value.problems == ["<config>: profile[0] (p).env_credentials: VLLM_API_KEY is also set in env: give a "
                                  "variable one source"]


def test_systemd_credential_is_read_from_the_credentials_directory(tmp_path, monkeypatch):
    creds = tmp_path / "creds"
    creds.mkdir()
    (creds / "vllm_key").write_text(KEY + "\n")
    path = _config(tmp_path, _profile(env_credentials='{ VLLM_API_KEY = "vllm_key", HF_TOKEN = "hf" }'))
    monkeypatch.delenv("CREDENTIALS_DIRECTORY", raising=False)
    problems = _problems(path)
    assert len(problems) == 2 and all("$CREDENTIALS_DIRECTORY is not set" in p for p in problems)
    assert "env_credentials.VLLM_API_KEY: " in problems[0] and "LoadCredential=vllm_key:PATH" in problems[0]
    monkeypatch.setenv("CREDENTIALS_DIRECTORY", str(creds))
    problems = _problems(path)
    assert problems == [f"{path}: profile[0] (p).env_credentials.HF_TOKEN: credential hf ({creds}/hf) cannot be "
                        "read: No such file or directory"]
    (creds / "hf").write_text(TOKEN)
    prof = load_config(str(path), secrets=True).profiles[0]
    assert prof.env == {"VLLM_API_KEY": KEY, "HF_TOKEN": TOKEN}  # the trailing newline dropped
    assert prof.flags()["env VLLM_API_KEY"] == mask(KEY)


def test_credential_name_must_be_a_file_name():
    with pytest.raises(ConfigError) as exc:
        parse_config(_profile(env_credentials='{ HF_TOKEN = "../etc/shadow" }'))
    assert "profile[0] (p).env_credentials: the credential of HF_TOKEN must be a systemd credential name" in \
        exc.value.problems[0]


def test_config_check_masks_secrets_and_refuses_a_bad_env_file_like_the_agent(tmp_path):
    env_file = _env_file(tmp_path, f"VLLM_API_KEY={KEY}\n")
    text = _profile(env=f'{{ HF_TOKEN = "{TOKEN}" }}', env_file=json.dumps(str(env_file)))
    path = _config(tmp_path, text.replace("/x/vllm", "/bin/true"))  # the host checks want an executable
    for args in ((), ("--json",)):
        r = subprocess.run([sys.executable, "-m", "lynxtop", "config", "check", *args, "--config", str(path)],
                           capture_output=True, text=True, timeout=60, check=False)
        assert r.returncode == 0, r.stderr
        assert TOKEN not in r.stdout + r.stderr and KEY not in r.stdout + r.stderr
        assert mask(TOKEN) in r.stdout and mask(KEY) in r.stdout
    env_file.chmod(0o644)
    for cmd in (("config", "check"), ("agent",)):
        r = subprocess.run([sys.executable, "-m", "lynxtop", *cmd, "--config", str(path)],
                           capture_output=True, text=True, timeout=60, check=False)
        assert r.returncode == 2 and "Traceback" not in r.stderr
        assert f"lynxtop: config error: {path}: profile[0] (p).env_file: {env_file}: has mode 0644" in r.stderr


@pytest.mark.parametrize("arg", ["--api-key", f"--api-key={KEY}", f"--api_key={KEY}", "--api-k", "--hf-token",
                                 f"--hf_token={TOKEN}"])
def test_a_secret_flag_in_extra_args_is_refused_for_its_variable(arg):
    with pytest.raises(ConfigError) as exc:
        parse_config(_profile(extra_args=json.dumps([arg, "x"])))
    (problem,) = exc.value.problems
    var = "VLLM_API_KEY" if "api" in arg else "HF_TOKEN"
    assert problem.startswith("<config>: profile[0] (p).extra_args: --") and f"set {var} in env" in problem
    assert TOKEN not in problem and KEY not in problem
    parse_config(_profile(extra_args='["--api-server-count", "2"]'))  # another flag of the same start is fine


def test_token_files_and_credentials_read_their_text_alike(tmp_path, monkeypatch):
    """One rule for a one-value secret file (contract/config.py's _secret_text): UTF-8, one trailing LF or CRLF
    dropped; bytes that are not UTF-8 are named by position, never shown."""
    from lynxtop.contract.config import read_credential, read_token_file

    monkeypatch.setenv("CREDENTIALS_DIRECTORY", str(tmp_path))
    secret = "0123456789abcdef0123"
    for end in ("", "\n", "\r\n"):
        (tmp_path / "tok").write_text(secret + end, newline="")
        (tmp_path / "tok").chmod(0o600)
        assert read_token_file(tmp_path / "tok") == (secret, None)
        assert read_credential("tok") == (secret, None)
    (tmp_path / "tok").write_bytes(b"0123456789abcdef\xff0123\n")
    assert read_token_file(tmp_path / "tok") == ("", f"{tmp_path / 'tok'}: is not UTF-8 text (byte 16)")
    assert read_credential("tok") == ("", f"credential tok ({tmp_path / 'tok'}) is not UTF-8 text (byte 16)")
