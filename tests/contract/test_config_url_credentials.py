"""A URL's credentials (`https://USER:PASSWORD@host`, `https://TOKEN@host`) in a profile's env values or extra_args
(there any userinfo is refused since session 21: tests/agent/test_s21_secrets_leftovers.py; an argv built
otherwise is still masked), or in [ray]'s, are secret whatever the variable's or the flag's name: vLLM gets them
as written (Profile.env, Profile.argv), but every shown or stored form (shown_env, shown_argv, flags and so the
runs table, config_as_dict, `config check` plain and --json) masks the password as `***<short hash>`.
`ray start --redis-password` in [ray] extra_args is refused like vLLM's --api-key, and a secret put into
env_credentials by mistake is not quoted back."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from lynxtop.__main__ import main
from lynxtop.contract.config import ConfigError, config_as_dict, parse_config
from lynxtop.contract.redact import mask, mask_url_credentials, redact_argv, redact_env, redact_flags

SECRET = "hf_s3cr3tPassw0rdValue"
TEXT = f'''[[profile]]
name = "a"
executable = "/bin/true"
model = "m"
[profile.env]
HF_ENDPOINT = "https://mirror:{SECRET}@hf-mirror.example"
NCCL_DEBUG = "WARN"
'''


@pytest.mark.parametrize(("text", "shown"), [
    (f"https://ops:{SECRET}@otel.example:4318/v1", f"https://ops:{mask(SECRET)}@otel.example:4318/v1"),
    (f"https://{SECRET}@github.com/x.git", f"https://{mask(SECRET)}@github.com/x.git"),  # a token as the user
    (f"redis://:{SECRET}@10.0.0.1:6379", f"redis://:{mask(SECRET)}@10.0.0.1:6379"),
    (f"https://ops:p@ss{SECRET}@host/a@b", f"https://ops:{mask('p@ss' + SECRET)}@host/a@b"),  # the last '@'
    (f"a=https://u:{SECRET}@h,b=http://v:{SECRET}@k", f"a=https://u:{mask(SECRET)}@h,b=http://v:{mask(SECRET)}@k"),
    ("https://host:8443/path@x", "https://host:8443/path@x"),  # an '@' past the authority is no credential
    ("https://user:@host", "https://user:@host"),
    ("user@example.com", "user@example.com"),
], ids=["password", "token-user", "no-user", "at-in-password", "two-urls", "at-in-path", "empty-password", "email"])
def test_url_credentials_are_masked(text, shown):
    assert mask_url_credentials(text) == shown
    assert mask_url_credentials(shown) == shown  # masking again changes nothing (rows read back, re-stored)


def test_vllm_gets_the_value_every_shown_form_masks_it():
    cfg = parse_config(TEXT)
    # extra_args refuse a URL's userinfo now: an argv that holds one anyway (built otherwise) is still masked
    cfg = replace(cfg, profiles=(replace(cfg.profiles[0], extra_args=(
        "--otlp-traces-endpoint", f"https://{SECRET}@otel.example:4318",
        f'--speculative-config={{"url": "http://{SECRET}@h/x"}}')),))
    prof = cfg.profiles[0]
    assert prof.env["HF_ENDPOINT"] == f"https://mirror:{SECRET}@hf-mirror.example"
    assert sum(SECRET in a for a in prof.argv()) == 2
    assert prof.shown_env() == {"HF_ENDPOINT": f"https://mirror:{mask(SECRET)}@hf-mirror.example",
                                "NCCL_DEBUG": "WARN"}
    assert f"https://{mask(SECRET)}@otel.example:4318" in prof.shown_argv()
    assert SECRET not in json.dumps(prof.shown_argv())
    assert SECRET not in json.dumps(prof.flags())  # what the runs table and the profile list keep
    assert prof.flags()["--otlp-traces-endpoint"] == f"https://{mask(SECRET)}@otel.example:4318"
    assert SECRET not in json.dumps(config_as_dict(cfg))  # `config check --json`, argv and extra_args both


def test_stored_flags_and_argv_are_masked_by_the_shared_redactions():
    flags = {"--otlp-traces-endpoint": f"https://ops:{SECRET}@otel", f"--x=https://u:{SECRET}@h": "on",
             "env HF_ENDPOINT": f"https://m:{SECRET}@hf", "env HF_TOKEN": SECRET, "--port": "8000"}
    shown = redact_flags(flags)  # the store's writer and reader call it on every run's flags
    assert SECRET not in json.dumps(shown) and shown["--port"] == "8000"
    assert shown["env HF_TOKEN"] == mask(SECRET) and redact_flags(shown) == shown
    assert redact_argv(["vllm", "serve", f"https://u:{SECRET}@h"]) == ["vllm", "serve", f"https://u:{mask(SECRET)}@h"]
    assert redact_env({"HF_ENDPOINT": f"https://u:{SECRET}@h"}) == {"HF_ENDPOINT": f"https://u:{mask(SECRET)}@h"}


def test_config_check_never_prints_a_url_password(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text(TEXT)
    for args in ((), ("--json",)):
        r = subprocess.run([sys.executable, "-m", "lynxtop", "config", "check", *args, "--config", str(path)],
                           capture_output=True, text=True, timeout=60, check=False)
        assert r.returncode == 0, r.stderr
        assert SECRET not in r.stdout + r.stderr and mask(SECRET) in r.stdout


def _ray_config(tmp_path: Path, ray: str) -> Path:
    path = tmp_path / "config.toml"
    path.write_text(f'[agent]\ndatabase = "{tmp_path}/l.db"\nsocket = "{tmp_path}/a.sock"\nrole = "worker"\n'
                    f'[ray]\nhead_address = "10.0.0.1:6379"\n{ray}\n')
    return path


def test_ray_env_and_extra_args_are_masked_in_config_check(tmp_path, capsys):
    path = _ray_config(tmp_path, f'env = {{ RAY_X = "https://u:{SECRET}@h" }}')  # extra_args: refused now
    for args in ((), ("--json",)):
        code = main(["config", "check", "--config", str(path), *args])
        out = capsys.readouterr()
        assert code == 0, out.err
        assert SECRET not in out.out + out.err and mask(SECRET) in out.out


@pytest.mark.parametrize("arg", ["--redis-password", f"--redis-password={SECRET}", f"--redis_password={SECRET}"])
def test_ray_redis_password_in_extra_args_is_refused_without_quoting_it(arg):
    with pytest.raises(ConfigError) as err:
        parse_config(f'[ray]\nextra_args = ["{arg}", "{SECRET}"]\n')
    (problem,) = err.value.problems
    assert problem.startswith("<config>: ray.extra_args: --redis-password would put a secret in")
    assert SECRET not in problem


def test_a_secret_given_as_a_credential_name_is_not_quoted():
    text = TEXT.split("[profile.env]")[0] + f'env_credentials = {{ HF_TOKEN = "{SECRET}/+=" }}\n'
    with pytest.raises(ConfigError) as err:
        parse_config(text)
    (problem,) = err.value.problems
    assert "the credential of HF_TOKEN must be a systemd credential name" in problem and SECRET not in problem


def test_the_runs_argv_and_the_processes_view_mask_a_url_password(tmp_path):
    """The runs table's argv column (the writer) and the processes view's command lines mask it too."""
    import sqlite3

    from lynxtop.agent.api.processes import redact_argv as processes_argv
    from lynxtop.store.writer import StoreWriter

    argv = ["vllm", "serve", "m", "--otlp-traces-endpoint", f"https://ops:{SECRET}@otel.example:4318"]
    with StoreWriter(tmp_path / "h.db") as w:
        w.create_run(profile="a", model="m", started_ms=1, argv=argv)
        w.flush(5)
    stored = sqlite3.connect(tmp_path / "h.db").execute("SELECT argv FROM runs").fetchone()[0]
    assert SECRET not in stored and "otel.example" in stored
    assert SECRET not in " ".join(processes_argv(argv))
