"""The agent a command reaches is the one named on its command line, wherever --socket or --config is written,
and a mutating command says which agent it acted on (socket, node, profile).

Two real API servers (fake controllers) on unix sockets: the default config ($LYNXTOP_CONFIG) names one, the
command line the other. Before, `lynxtop --socket A stop -y` stopped the agent of the default config.
"""

from __future__ import annotations

import io
import sys

import pytest
from agent_io_helpers import FakeController, ThreadedApi
from support.agent_config import profile, write_agent_config
from support.ports import short_dir

from lynxtop.__main__ import main


@pytest.fixture
def two_agents(monkeypatch):
    with short_dir() as d:
        named, default = FakeController(), FakeController()
        named.serving["profile"], default.serving["profile"] = "named-profile", "default-profile"
        with ThreadedApi(named, d / "a.sock"), ThreadedApi(default, d / "b.sock"):
            env_cfg = write_agent_config(d / "default.toml", d / "default.db", d / "b.sock")
            monkeypatch.setenv("LYNXTOP_CONFIG", str(env_cfg))
            monkeypatch.setattr(sys, "stdin", io.StringIO(""))
            yield d, named, default


@pytest.mark.parametrize("where", ["before", "after"])
@pytest.mark.parametrize("argv", [["stop", "-y"], ["restart", "-y"], ["start"], ["switch", "tp8-fp8kv", "-y"]])
def test_a_mutating_command_acts_on_the_socket_given_and_says_which(two_agents, capsys, where, argv):
    d, named, default = two_agents
    if argv[0] == "start":
        named.serving["state"] = "stopped"
    sock = ["--socket", str(d / "a.sock")]
    code = main([*sock, *argv] if where == "before" else [*argv, *sock])
    out = capsys.readouterr().out
    assert code == 0, out
    assert [c[0] for c in named.calls] == [argv[0]] and default.calls == []
    shown = "tp8-fp8kv" if argv[0] == "switch" else "named-profile"
    assert f"agent: {d / 'a.sock'}, node node1, profile {shown}" in out


@pytest.mark.parametrize("where", ["before", "after"])
def test_config_given_anywhere_chooses_the_agent(two_agents, capsys, where):
    d, named, default = two_agents
    cfg = write_agent_config(d / "named.toml", d / "named.db", d / "a.sock")
    opt = ["--config", str(cfg)]
    assert main([*opt, "status"] if where == "before" else ["status", *opt]) == 0
    assert "profile named-profile" in capsys.readouterr().out
    assert main([*opt, "stop", "-y"] if where == "before" else ["stop", "-y", *opt]) == 0
    assert f"agent: {d / 'a.sock'}" in capsys.readouterr().out
    assert [c[0] for c in named.calls] == ["stop"] and default.calls == []


@pytest.mark.parametrize("where", ["before", "after"])
def test_config_check_reads_the_config_given(two_agents, capsys, where):
    d, _, _ = two_agents
    cfg = write_agent_config(d / "named.toml", d / "named.db", d / "a.sock",
                             profiles=profile("from-the-command-line", sys.executable, port=None))
    opt = ["--config", str(cfg)]
    assert main([*opt, "config", "check"] if where == "before" else ["config", "check", *opt]) == 0
    assert "from-the-command-line" in capsys.readouterr().out
