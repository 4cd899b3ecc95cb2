"""Session 21: `lynxtop config check --json` carries the secret-exposure warnings (`Config.warnings`).

They were printed to stderr only, so a script or a fleet check that reads the JSON saw a clean config while every
local user could read its token. The JSON has a `warnings` list (empty when none), each line as stderr words it
without the `lynxtop: config warning: ` prefix; stderr keeps saying them, in both forms.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from support.agent_config import SIM, profile, write_agent_config

TOKEN = "hf_s21JsonWarningsToken0123456789"
PREFIX = "lynxtop: config warning: "


def _check(cfg: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "lynxtop", "config", "check", "--config", str(cfg), *args],
                          capture_output=True, text=True, timeout=60, check=False)


def _config(tmp_path: Path, mode: int) -> Path:
    cfg = write_agent_config(tmp_path / "config.toml", tmp_path / "lynxtop.db", tmp_path / "agent.sock",
                             profiles=profile("p", SIM, env={"HF_TOKEN": TOKEN}))
    os.chmod(cfg, mode)
    return cfg


def test_config_check_json_carries_the_secret_warnings(tmp_path):
    cfg = _config(tmp_path, 0o644)  # every local user reads the token written in it
    plain = _check(cfg)
    assert plain.returncode == 0 and plain.stderr.startswith(PREFIX), plain.stderr
    said = [line.removeprefix(PREFIX) for line in plain.stderr.splitlines()]
    assert said and all("HF_TOKEN" in w and "mode 0644" in w for w in said)

    r = _check(cfg, "--json")
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert data["warnings"] == said  # the same words as stderr's, without the prefix
    assert r.stderr == plain.stderr  # still said on stderr too
    assert TOKEN not in r.stdout + r.stderr


@pytest.mark.parametrize("mode", [0o600, 0o640])
def test_config_check_json_has_an_empty_warnings_list_when_none(tmp_path, mode):
    cfg = _config(tmp_path, mode)  # the agent's alone (0640: group root, no operators' group configured)
    r = _check(cfg, "--json")
    assert r.returncode == 0 and r.stderr == "", r.stderr
    assert json.loads(r.stdout)["warnings"] == []
