"""Secrets in a profile's env (issue 24.3), end to end: a real agent serves a profile with HF_TOKEN and VLLM_API_KEY
in its env, then switches to one that takes them from an env_file and a systemd credential. The values reach the
simulated vLLM's environment and nothing else: every API answer, /metrics, the database (its dump and its files),
the CSV exports, `config check` and the agent's log show `***<short hash>` at most."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
import pytest
from support.agent_config import sim_profile, write_agent_config
from support.agent_proc import Agent
from support.ports import free_port

from lynxtop.contract.records import ProfileInfo
from lynxtop.contract.redact import mask
from lynxtop.tui.control_text import flag_diff

pytestmark = pytest.mark.timeout(120)

HF_INLINE = "hf_inlineE2eToken4Qz8"
API_INLINE = "sk-inline-e2e-apikey-7Wm"
HF_FILE = "hf_fromEnvFileE2e91Kx"
API_CRED = "sk-fromCredentialE2e-P04"
URL_PASSWORD = "mirrorPassE2e-3vT"  # in a URL's userinfo, under a name that is not secret-looking
SECRETS = (HF_INLINE, API_INLINE, HF_FILE, API_CRED, URL_PASSWORD)


def _environ(pid: int) -> list[bytes]:
    return Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")


def _lynxtop(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "lynxtop", *args], capture_output=True, text=True, timeout=60,
                          env=dict(os.environ, **(env or {})), check=False)


def _secret_config(tmp: Path, metrics_port: int) -> Path:
    env_file = tmp / "secret.env"
    env_file.write_text(f"# the gated weights' token\nHF_TOKEN={HF_FILE}\n")
    env_file.chmod(0o600)
    creds = tmp / "creds"
    creds.mkdir()
    (creds / "vllm_api_key").write_text(API_CRED + "\n")
    profiles = [
        sim_profile("inline", startup_s=0.3, stop_grace_s=5,
                    env={"HF_TOKEN": HF_INLINE, "VLLM_API_KEY": API_INLINE, "NCCL_DEBUG": "WARN",
                         "HF_ENDPOINT": f"https://mirror:{URL_PASSWORD}@hf-mirror.example"}),
        sim_profile("fromfiles", startup_s=0.3, stop_grace_s=5, env={"NCCL_DEBUG": "WARN"}, env_file=env_file,
                    env_credentials={"VLLM_API_KEY": "vllm_api_key"}),
    ]
    return write_agent_config(tmp / "config.toml", tmp / "state" / "lynxtop.db", tmp / "run" / "agent.sock",
                              fake_nvml="sim", sample_interval_s=0.2, default_profile="inline", autostart=True,
                              gpu_release_timeout_s=10, metrics_listen=f"127.0.0.1:{metrics_port}",
                              profiles=profiles)


async def test_profile_secrets_reach_the_server_and_are_found_nowhere_else(tmp_path, cleanup):
    metrics_port = free_port()
    cfg = _secret_config(tmp_path, metrics_port)
    creds_env = {"CREDENTIALS_DIRECTORY": str(tmp_path / "creds")}  # what systemd's LoadCredential= sets
    a = Agent(tmp_path, cfg, env=creds_env)
    cleanup.append(a)
    st = await a.wait_state(lambda s: s["state"] == "ready" and s["profile"] == "inline", what="inline ready")
    first_run, first_pid = st["serving"]["run_id"], st["serving"]["pid"]
    environ = _environ(first_pid)
    assert f"HF_TOKEN={HF_INLINE}".encode() in environ and f"VLLM_API_KEY={API_INLINE}".encode() in environ
    assert f"HF_ENDPOINT=https://mirror:{URL_PASSWORD}@hf-mirror.example".encode() in environ

    # the switch diff (the dashboard's, from /v1/profiles) shows that both secrets change, not to what
    code, profiles = await a.api("GET", "/v1/profiles")
    assert code == 200
    by_name = {p["name"]: p for p in profiles["profiles"]}
    diff = {flag: (now, new) for flag, now, new in flag_diff(ProfileInfo.from_json(by_name["inline"]),
                                                             ProfileInfo.from_json(by_name["fromfiles"]))}
    assert diff["env HF_TOKEN"] == (mask(HF_INLINE), mask(HF_FILE))
    assert diff["env VLLM_API_KEY"] == (mask(API_INLINE), mask(API_CRED))
    assert by_name["inline"]["env"]["NCCL_DEBUG"] == "WARN"  # what is not secret is shown as it is

    code, body = await a.api("POST", "/v1/switch", {"profile": "fromfiles"})
    assert code == 202, body
    st = await a.wait_state(lambda s: s["state"] == "ready" and s["profile"] == "fromfiles", what="switched")
    pid = st["serving"]["pid"]
    environ = _environ(pid)
    assert f"HF_TOKEN={HF_FILE}".encode() in environ and f"VLLM_API_KEY={API_CRED}".encode() in environ

    seen: dict[str, str] = {}
    for path in ("/v1/status", "/v1/profiles", "/v1/runs?limit=100", "/v1/events?since=0&limit=10000",
                 "/v1/logs?lines=10000", f"/v1/logs?run={first_run}&lines=10000"):
        code, body = await a.api("GET", path)
        assert code == 200, (path, body)
        seen[f"GET {path}"] = json.dumps(body)
    runs = {r["id"]: r for r in json.loads(seen["GET /v1/runs?limit=100"])["runs"]}
    assert runs[first_run]["flags"]["env HF_TOKEN"] == mask(HF_INLINE)
    assert runs[st["serving"]["run_id"]]["flags"]["env VLLM_API_KEY"] == mask(API_CRED)
    async with aiohttp.ClientSession() as s, s.get(f"http://127.0.0.1:{metrics_port}/metrics") as r:
        assert r.status == 200
        seen["GET /metrics"] = await r.text()

    assert a.stop() == 0  # a clean stop (serving goes on: live restore); the database is closed and whole
    assert f"HF_TOKEN={HF_FILE}".encode() in _environ(pid)
    db = tmp_path / "state" / "lynxtop.db"
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
        seen["database dump"] = "\n".join(conn.iterdump())
    assert mask(HF_INLINE) in seen["database dump"]  # the runs' flags are there, masked
    out = tmp_path / "export"
    hour_ago = str(int(time.time() * 1000) - 3_600_000)
    r = _lynxtop("export", "--database", str(db), "--table", "all", "--from", hour_ago, "-o", str(out))
    assert r.returncode == 0, r.stderr
    seen["export output"] = r.stdout + r.stderr
    for f in sorted(out.iterdir()):
        seen[f"export {f.name}"] = f.read_text()
    assert any(mask(API_CRED) in seen[k] for k in seen if k.startswith("export runs"))
    for args in (("config", "check", "--config", str(cfg)), ("config", "check", "--json", "--config", str(cfg))):
        r = _lynxtop(*args, env=creds_env)
        assert r.returncode == 0, r.stderr
        seen[" ".join(args[:3])] = r.stdout + r.stderr
    assert mask(HF_FILE) in seen["config check --json"]
    seen["agent log"] = (tmp_path / "agent.log").read_text(errors="replace")
    for f in sorted((tmp_path / "state").rglob("*")):  # the database, its -wal, serving.json, the runs' logs
        if f.is_file():
            seen[f"file {f.relative_to(tmp_path)}"] = f.read_bytes().decode("latin-1")

    leaks = [(where, secret) for where, text in seen.items() for secret in SECRETS if secret in text]
    assert not leaks, leaks
