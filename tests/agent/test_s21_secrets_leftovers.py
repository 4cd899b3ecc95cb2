"""Session 21: leftovers of the secrets audit.

1. A URL's userinfo of any kind in a profile's or [ray]'s extra_args (`https://TOKEN@host`, not only
   `https://USER:PASSWORD@host`) is refused by the one validation `config check` and the agent share: lynxtop masks
   it in its own output, but it sat in vLLM's /proc/PID/cmdline (every local user) and serving.json.
2. (tests/cli/test_s21_config_check_json.py: `config check --json` carries the warnings.)
3. A SIGHUP reload says the new config's secret-exposure warnings, as the agent's start does: gone once fixed,
   said once a file became readable by others.
4. The open TCP `GET /v1/status` (Prometheus, the fleet view; no token) does not serve who asked for an action
   (`by`: uid, user name, pid); the unix socket's status keeps it.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
import pytest
from support.agent_config import SIM, profile, sim_profile, write_agent_config
from support.agent_proc import Agent
from support.ports import free_port, short_dir

from lynxtop.contract.config import ConfigError, load_config, parse_config

pytestmark = pytest.mark.timeout(120)

TOKEN = "ghp_s21TokenAsTheUser0123456789abcdef"
WARNING_PREFIX = "lynxtop: config warning: "


def _lynxtop(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "lynxtop", *args], capture_output=True, text=True, timeout=60,
                          check=False)


def _config(tmp_path: Path, **kw) -> Path:
    return write_agent_config(tmp_path / "config.toml", tmp_path / "state" / "lynxtop.db", tmp_path / "agent.sock",
                              **kw)


# ------------------------------------------------------------------------------- 1. any URL userinfo is refused

@pytest.mark.parametrize(("args", "where"), [
    (["--otlp-traces-endpoint", f"https://{TOKEN}@otel.example:4318"],
     "item 2 (the value of --otlp-traces-endpoint)"),
    ([f"--otlp-traces-endpoint=https://{TOKEN}@otel.example"], "item 1 (the value of --otlp-traces-endpoint)"),
    (["--kv-transfer-config", f'{{"url": "http://{TOKEN}@h/x"}}'], "item 2 (the value of --kv-transfer-config)"),
    (["--otlp-traces-endpoint", f"https://{TOKEN}:@otel.example"], "item 2 (the value of --otlp-traces-endpoint)"),
], ids=["token-as-user", "attached", "in-json", "empty-password"])
def test_a_token_as_a_urls_user_in_a_profiles_extra_args_is_refused_without_quoting_it(tmp_path, args, where):
    cfg = _config(tmp_path, profiles=profile("p", SIM, extra_args=args))
    with pytest.raises(ConfigError) as exc:
        load_config(str(cfg))
    [problem] = exc.value.problems
    assert problem.startswith(f"{cfg}: profile[0] (p).extra_args: {where} holds a URL with credentials"), problem
    assert TOKEN not in problem
    assert "env_file" in problem and "env_credentials" in problem  # where it goes instead
    check = _lynxtop("config", "check", "--config", str(cfg))
    agent = _lynxtop("agent", "--config", str(cfg))
    assert check.returncode == agent.returncode == 2
    assert check.stderr == agent.stderr == f"lynxtop: config error: {problem}\n"  # the one validation
    assert TOKEN not in check.stdout + check.stderr + agent.stdout
    assert not (tmp_path / "state").exists()  # the agent opened nothing


def test_a_token_as_a_urls_user_in_ray_extra_args_is_refused():
    with pytest.raises(ConfigError) as exc:
        parse_config(f'[ray]\nextra_args = ["--tracing-startup-hook", "x", "--storage=https://{TOKEN}@h/b"]\n')
    [problem] = exc.value.problems
    assert problem.startswith("<config>: ray.extra_args: item 3 (the value of --storage) holds a URL with "
                              "credentials"), problem
    assert TOKEN not in problem and "[ray] env" in problem


@pytest.mark.parametrize("arg", ["https://otel.example:4318", "user@example.com", "s3://bucket/key@v2",
                                 "https://host:8443/path@x", "https://@host"])
def test_urls_without_userinfo_stay_accepted(arg):
    cfg = parse_config(f'[[profile]]\nname = "p"\nexecutable = "/bin/true"\nmodel = "m"\n'
                       f'extra_args = ["--otlp-traces-endpoint", "{arg}"]\n')
    assert cfg.profiles[0].extra_args[-1] == arg


# ------------------------------------------------------------------- 3. a reload says the new config's warnings

def _log(a: Agent) -> str:
    """The agent's whole log (Agent.output() keeps its last 3000 characters)."""
    a.log.flush()
    return (a.tmp / Path(a.log.name).name).read_text(errors="replace")


async def _wait_count(a: Agent, text: str, n: int, timeout: float = 60) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        a.drain()  # the notify queue is small
        out = _log(a)
        if out.count(text) >= n:
            return out
        assert a.proc.poll() is None, out[-3000:]
        await asyncio.sleep(0.05)
    raise AssertionError(f"{text!r} not {n} times in the agent's output:\n{a.output()}")


async def test_a_sighup_reload_says_the_new_configs_secret_warnings(tmp_path, cleanup):
    cfg = _config(tmp_path, fake_nvml="sim", sample_interval_s=0.5, autostart=False,
                  profiles=sim_profile("p", tp=1, env={"HF_TOKEN": TOKEN}))
    os.chmod(cfg, 0o600)  # the agent's alone: no warning at start
    assert _lynxtop("config", "check", "--config", str(cfg)).stderr == ""
    a = Agent(tmp_path, cfg)
    cleanup.append(a)
    await a.wait_notify("READY=1")
    os.chmod(cfg, 0o644)  # now every local user reads the token
    told = _lynxtop("config", "check", "--config", str(cfg)).stderr
    assert told.startswith(WARNING_PREFIX), told
    warning = told.removeprefix(WARNING_PREFIX).strip()
    assert "HF_TOKEN" in warning and "mode 0644" in warning
    assert warning not in _log(a)

    a.proc.send_signal(signal.SIGHUP)
    await _wait_count(a, "config reloaded", 1)
    out = await _wait_count(a, warning, 1)  # said on the reload, as at a start
    assert "WARNING" in next(line for line in out.splitlines() if warning in line)

    os.chmod(cfg, 0o600)  # fixed: the next reload says nothing more
    a.proc.send_signal(signal.SIGHUP)
    out = await _wait_count(a, "config reloaded", 2)
    await asyncio.sleep(0.5)
    out = _log(a)
    assert out.count(warning) == 1, out[-3000:]
    assert TOKEN not in out
    assert a.stop() == 0


def test_reload_config_logs_the_warnings_of_the_file_it_read(tmp_path, caplog):
    from lynxtop.agent.config_source import ConfigSource
    from lynxtop.agent.reload import reload_config

    cfg = _config(tmp_path, profiles=profile("p", SIM, env={"HF_TOKEN": TOKEN}))
    os.chmod(cfg, 0o600)
    source = ConfigSource(load_config(str(cfg), secrets=True))
    assert source.current.warnings == ()
    os.chmod(cfg, 0o644)
    with caplog.at_level("INFO", logger="lynxtop.agent"):
        msg = reload_config(source, None, lambda: "idle")
    assert "config reloaded" in msg
    [warning] = source.current.warnings  # the reloaded file's warnings, not the start's
    said = [r for r in caplog.records if warning in r.getMessage()]
    assert len(said) == 1 and said[0].levelname == "WARNING"
    assert TOKEN not in caplog.text
    os.chmod(cfg, 0o600)
    caplog.clear()
    with caplog.at_level("INFO", logger="lynxtop.agent"):
        reload_config(source, None, lambda: "idle")
    assert source.current.warnings == () and "warning" not in caplog.text.lower()


# ------------------------------------------------------------------------- 4. no `by` in the TCP /v1/status

def _callers(tree: object, path: str = "") -> list[str]:
    """Paths of every `by` key in a JSON tree."""
    if isinstance(tree, dict):
        return [f"{path}.{k}" for k in tree if k == "by"] + \
            [p for k, v in tree.items() for p in _callers(v, f"{path}.{k}")]
    if isinstance(tree, list):
        return [p for i, v in enumerate(tree) for p in _callers(v, f"{path}[{i}]")]
    return []


async def test_the_tcp_status_leaves_out_who_asked_for_an_action(tmp_path, cleanup):
    with short_dir() as d:
        port = free_port()
        cfg = write_agent_config(tmp_path / "config.toml", tmp_path / "state" / "lynxtop.db", d / "a.sock",
                                 fake_nvml="sim", sample_interval_s=0.2, autostart=False, gpu_release_timeout_s=10,
                                 metrics_listen=f"127.0.0.1:{port}",
                                 profiles=[sim_profile("slow", tp=8, startup_s=60, readiness_timeout_s=600,
                                                       stop_grace_s=3)])
        a = Agent(tmp_path, cfg, sock=d / "a.sock")
        cleanup.append(a)
        await a.wait_notify("READY=1")
        code, body = await a.api("POST", "/v1/start", {"profile": "slow"})
        assert code in (200, 202), body
        st = await a.wait_state(lambda s: s["state"] == "starting", what="starting")
        deadline = time.monotonic() + 30
        while not (st["agent"].get("action") or {}).get("by"):
            assert time.monotonic() < deadline, st["agent"]
            await asyncio.sleep(0.05)
            st = await a.status()
        sock_action = st["agent"]["action"]
        assert sock_action["action"] == "start" and sock_action["by"].startswith(f"uid {os.getuid()} ")
        async with aiohttp.ClientSession() as s, s.get(f"http://127.0.0.1:{port}/v1/status") as r:
            assert r.status == 200
            tcp = await r.json()
        assert tcp["serving"]["state"] == "starting"
        assert tcp["agent"]["action"]["action"] == "start"  # what is in progress stays: only who asked goes
        assert tcp["agent"]["action"]["profile"] == "slow"
        assert _callers(tcp) == [], _callers(tcp)
        assert f"uid {os.getuid()} " not in str(tcp["agent"])
        assert "by" in (await a.status())["agent"]["action"]  # the socket's status keeps it
        code, _ = await a.api("POST", "/v1/stop", {})
        assert code in (200, 202)
        await a.wait_state(lambda s: s["state"] == "stopped", what="stopped")
        assert a.stop() == 0


async def test_the_exporters_own_status_leaves_out_callers_too():
    """The exporter's status without the agent's cached body (its snapshot's to_json)."""
    from lynxtop.agent.metrics.exporter import MetricsExporter
    from lynxtop.contract.status import ActionInfo, AgentStatus, Status

    st = Status(agent=AgentStatus(action=ActionInfo("stop", "p", 1, "uid 1000 (alice) pid 42")))
    exp = MetricsExporter("127.0.0.1:0", lambda: st, log=lambda _: None)
    await exp.start()
    try:
        async with aiohttp.ClientSession() as s, s.get(f"http://127.0.0.1:{exp.bound_port}/v1/status") as r:
            body = await r.json()
    finally:
        await exp.stop()
    assert body["agent"]["action"]["action"] == "stop" and _callers(body) == []
    assert st.to_json()["agent"]["action"]["by"] == "uid 1000 (alice) pid 42"


def test_an_action_without_its_caller_reads_as_no_caller_not_a_question_mark():
    """A remote node's TCP status carries no `by`: `lynxtop status` and the header show the action alone."""
    from rich.text import Text

    from lynxtop.cli.ctl import _agent_lines
    from lynxtop.contract.status import ActionInfo, AgentStatus
    from lynxtop.tui.widgets.node_header import _action

    for by, want in ((None, "restart alpha"), ("uid 1000 (alice) pid 42", "by uid 1000 (alice) pid 42")):
        agent = AgentStatus(action=ActionInfo("restart", "alpha", since_ms=1_700_000_000_000, by=by))
        line = next(x for x in _agent_lines(agent) if x.startswith("action"))
        assert "?" not in line and (want in line if by else " by" not in line), line
        t = Text()
        _action(t, agent)
        assert "?" not in t.plain and (want in t.plain), t.plain
