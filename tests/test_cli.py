"""The command line: help is complete for every command, `python -m lynxtop` and the console script agree."""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from lynxtop.parser import build_parser

COMMANDS = ["dashboard", "demo", "agent", "status", "start", "stop", "restart", "switch", "runs", "export",
            "config"]


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
