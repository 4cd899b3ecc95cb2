"""The command line: help is complete for every command, `python -m lynxtop` and the console script agree."""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from support.agent_config import profile, write_agent_config

from lynxtop.cli.parser import build_parser

COMMANDS = ["dashboard", "demo", "agent", "status", "start", "stop", "restart", "switch", "runs", "export",
            "config", "check", "bench"]


def _lynxtop(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "lynxtop", *args], capture_output=True, text=True, timeout=60)


def test_top_help_lists_every_command():
    r = _lynxtop("--help")
    assert r.returncode == 0
    for cmd in COMMANDS:
        assert f"\n    {cmd} " in r.stdout, cmd
    assert "lynxtop demo" in r.stdout


@pytest.mark.parametrize("cmd", COMMANDS)
def test_every_subcommand_has_help_for_every_option(cmd):
    parser = build_parser()
    sub = parser._subparsers._group_actions[0].choices[cmd]  # noqa: SLF001 - walking argparse's tree
    for action in sub._actions:
        if isinstance(action, argparse._SubParsersAction):  # noqa: SLF001
            for choice in action.choices.values():
                assert choice.description, f"{cmd}: a sub-action has no description"
        elif action.option_strings or action.dest != "help":
            assert action.help, f"{cmd}: {action.dest} has no help text"
    r = _lynxtop(cmd, "--help")
    assert r.returncode == 0
    assert f"usage: lynxtop {cmd}" in r.stdout


def test_console_script_matches_module():
    exe = Path(sys.executable).parent / "lynxtop"
    if not exe.exists():
        exe = Path(shutil.which("lynxtop") or "")
    assert exe.is_file(), "the lynxtop console script is not installed"
    a = subprocess.run([str(exe), "--version"], capture_output=True, text=True, timeout=60)
    b = _lynxtop("--version")
    assert a.stdout == b.stdout and a.stdout.startswith("lynxtop ")


def test_bad_arguments_exit_2_with_usage():
    r = _lynxtop("export", "--run", "notanumber")
    assert r.returncode == 2
    assert "invalid int value" in r.stderr and "Traceback" not in r.stderr
    r = _lynxtop("frobnicate")
    assert r.returncode == 2 and "invalid choice" in r.stderr


def test_relative_time_value_is_not_taken_for_an_option(tmp_path):
    db = tmp_path / "none.db"
    r = _lynxtop("export", "--database", str(db), "--from", "-24h")
    assert "expected one argument" not in r.stderr
    assert r.returncode == 2 and str(db) in r.stderr  # reached the export handler: the database is missing


# ---------------------------------------------------------------------------------------------- one validation

def _config(tmp_path: Path, executable: str, socket: str | None = None, extra: str = "") -> Path:
    return write_agent_config(tmp_path / "c.toml", tmp_path / "state" / "lynxtop.db", socket or tmp_path / "agent.sock",
                              fake_nvml="sim", extra=extra, profiles=profile("a", executable, model="m", port=None))


def _agent_and_check(path: Path) -> tuple[subprocess.CompletedProcess, subprocess.CompletedProcess]:
    check = _lynxtop("config", "check", "--config", str(path))
    try:
        agent = subprocess.run([sys.executable, "-m", "lynxtop", "agent", "--config", str(path)],
                               capture_output=True, text=True, timeout=30)
    except subprocess.TimeoutExpired:
        pytest.fail("the agent started with a config that `config check` refuses")
    return check, agent


def _exe_cases(tmp_path: Path) -> dict[str, tuple[str, str]]:
    plain = tmp_path / "plain-vllm"
    plain.write_text("#!/bin/sh\n")
    plain.chmod(0o644)
    missing = tmp_path / "venv" / "bin" / "vllm"
    return {
        "missing": (str(missing), f"{missing} does not exist"),
        "not executable": (str(plain), f"{plain} is not executable by "),
        "a directory": (str(tmp_path), f"{tmp_path} is a directory, not an executable file"),
    }


@pytest.mark.parametrize("case", ["missing", "not executable", "a directory"])
def test_bad_executable_same_refusal_from_config_check_and_agent(tmp_path, case):
    """`config check` said valid and the agent then refused: now both run host_problems and print the same."""
    exe, words = _exe_cases(tmp_path)[case]
    path = _config(tmp_path, exe)
    check, agent = _agent_and_check(path)
    want = f"lynxtop: config error: {path}: profile[0] (a).executable: {words}"
    assert check.returncode == 2 and agent.returncode == 2, (check.stderr, agent.stderr)
    assert check.stderr.startswith(want), check.stderr
    assert agent.stderr == check.stderr
    assert "Traceback" not in check.stderr + agent.stderr
    assert not (tmp_path / "state").exists()  # the agent refused before opening anything


def test_long_socket_path_same_refusal_from_config_check_and_agent(tmp_path):
    exe = tmp_path / "vllm"
    exe.write_text("#!/bin/sh\n")
    exe.chmod(0o755)
    sock = str(tmp_path / ("s" * max(1, 110 - len(str(tmp_path)) - 1)))
    path = _config(tmp_path, str(exe), socket=sock)
    check, agent = _agent_and_check(path)
    assert check.returncode == 2 and agent.returncode == 2, (check.stderr, agent.stderr)
    assert check.stderr.startswith(f"lynxtop: config error: {path}: agent.socket: control socket path "), check.stderr
    assert agent.stderr == check.stderr


def test_nan_refused_by_config_check_and_agent(tmp_path):
    exe = tmp_path / "vllm"
    exe.write_text("#!/bin/sh\n")
    exe.chmod(0o755)
    path = _config(tmp_path, str(exe), extra="sample_interval_s = nan")
    check, agent = _agent_and_check(path)
    assert check.returncode == 2 and agent.returncode == 2
    assert check.stderr == f"lynxtop: config error: {path}: agent.sample_interval_s: nan is not a finite number " \
                           "(nan and inf are refused)\n"
    assert agent.stderr == check.stderr


def test_agent_socket_override_gets_the_same_length_check(tmp_path):
    """`lynxtop agent --socket PATH` replaces [agent] socket: a path it cannot bind is refused up front, exit 2."""
    exe = tmp_path / "vllm"
    exe.write_text("#!/bin/sh\n")
    exe.chmod(0o755)
    path = _config(tmp_path, str(exe))
    long = tmp_path / ("s" * max(1, 110 - len(str(tmp_path)) - 1))
    try:
        r = subprocess.run([sys.executable, "-m", "lynxtop", "agent", "--config", str(path), "--socket", str(long)],
                           capture_output=True, text=True, timeout=30)
    except subprocess.TimeoutExpired:
        pytest.fail("the agent started with a socket path it cannot bind")
    assert r.returncode == 2, r.stderr
    assert r.stderr.startswith(f"lynxtop: config error: --socket: control socket path '{long}' is "), r.stderr
    assert not (tmp_path / "state").exists()
