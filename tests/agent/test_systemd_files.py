"""The shipped unit, sysusers file and example config: checked the way CI checks them."""

from __future__ import annotations

import configparser
import dataclasses
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from lynxtop.agent.serving.supervisor import preflight
from lynxtop.contract.config import load_config

ROOT = Path(__file__).resolve().parents[2]
UNIT = ROOT / "systemd" / "lynxtop-agent.service"
EXAMPLE = ROOT / "systemd" / "config.example.toml"
SYSUSERS = ROOT / "systemd" / "lynxtop.sysusers.conf"

H200 = [{"index": i, "name": "NVIDIA H200", "cc_major": 9, "cc_minor": 0} for i in range(8)]
B200 = [{"index": i, "name": "NVIDIA B200", "cc_major": 10, "cc_minor": 0} for i in range(8)]


def _unit() -> configparser.ConfigParser:
    cp = configparser.ConfigParser(strict=False, interpolation=None)
    cp.optionxform = str  # type: ignore[assignment]
    cp.read_string(UNIT.read_text())
    return cp


def test_unit_has_the_decisions_the_agent_relies_on():
    u = _unit()
    s = u["Service"]
    assert s["Type"] == "notify" and s["KillMode"] == "process" and s["Restart"] == "on-failure"
    assert "WatchdogSec" in s and s["StateDirectoryMode"] == "0750" and s["RuntimeDirectoryMode"] == "0750"
    assert "StartLimitBurst" in u["Unit"] and "StartLimitIntervalSec" in u["Unit"]
    assert "PrivateDevices" not in s and "MemoryDenyWriteExecute" not in s  # GPUs and JIT keep working
    assert "KillMode=process, deliberately" in UNIT.read_text()  # the reason is written down
    # vLLM outlives the unit's stop (KillMode=process): RemoveIPC=yes would unlink its shared memory then
    assert s.get("RemoveIPC", "no") == "no" and "RemoveIPC=no, deliberately" in UNIT.read_text()
    # the private /tmp goes with the unit's stop, which vLLM outlives: a run's TMPDIR is in StateDirectory instead
    assert s["PrivateTmp"] == "yes" and s["StateDirectory"] == "lynxtop"
    assert "PrivateTmp=yes, deliberately" in UNIT.read_text() and "/var/lib/lynxtop/run-tmp/" in UNIT.read_text()
    # vLLM's threads count against the unit's task limit: DefaultTasksMax refused a thread or fork mid-load
    assert s["TasksMax"] == "infinity"


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze not installed")
def test_unit_passes_systemd_analyze_verify_and_security(tmp_path):
    # verify needs ExecStart's binary to exist: check a copy that points at one that does (as CI does)
    copy = tmp_path / "lynxtop-agent.service"
    copy.write_text(UNIT.read_text().replace("/opt/lynxtop/bin/lynxtop", sys.executable + " -m lynxtop"))
    r = subprocess.run(["systemd-analyze", "verify", str(copy)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout == "" and r.stderr == "", r.stdout + r.stderr
    # systemd compares --threshold with the exposure on its internal 0-100 scale and prints it as 0-10:
    # "exposure <= 4" (the threshold) is --threshold=40; --threshold=4 would demand <= 0.4.
    r = subprocess.run(["systemd-analyze", "security", "--offline=yes", "--threshold=40", str(copy)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr
    level = float(re.search(r"Overall exposure level for \S+: ([0-9.]+)", r.stdout).group(1))
    assert level <= 4.0
    assert re.search(r"^✓ PrivateTmp=", r.stdout, re.MULTILINE), r.stdout  # the agent's own /tmp stays private


@pytest.mark.skipif(shutil.which("systemd-sysusers") is None, reason="systemd-sysusers not installed")
def test_sysusers_file_creates_user_and_group(tmp_path):
    r = subprocess.run(["systemd-sysusers", "--dry-run", f"--root={tmp_path}", str(SYSUSERS)],
                       capture_output=True, text=True, timeout=60)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    assert "group 'lynxtop'" in out and "user 'lynxtop'" in out


def test_example_config_is_valid_and_its_profiles_fit_their_hardware():
    cfg = load_config(str(EXAMPLE))
    names = [p.name for p in cfg.profiles]
    assert names == ["v4-tp8-h200", "v4-tp8pp2-ray", "v4-tp8-b200", "v4-dp8ep-h200"]
    assert cfg.agent.live_restore and cfg.agent.default_profile == "v4-tp8-h200"
    real = {p.name: dataclasses.replace(p, executable=sys.executable) for p in cfg.profiles}
    # TP8 on 8xH200 with dense FlashMLA: nothing to say
    assert preflight(real["v4-tp8-h200"], H200) == ([], [])
    # TP8xPP2 through Ray: 8 of 16 GPUs here is a warning, not a refusal
    problems, warnings = preflight(real["v4-tp8pp2-ray"], H200)
    assert problems == [] and any("Ray cluster" in w for w in warnings)
    # DP8 + EP, one engine per GPU: the 8 H200s, nothing to say; 4 GPUs are too few
    assert preflight(real["v4-dp8ep-h200"], H200) == ([], [])
    problems, _ = preflight(real["v4-dp8ep-h200"], H200[:4])
    assert any("needs 8 GPUs" in x for x in problems)
    # the B200 profile fits B200s; dense FlashMLA would not: vLLM refuses the backend, so the start is refused
    assert preflight(real["v4-tp8-b200"], B200) == ([], [])
    problems, _ = preflight(real["v4-tp8-h200"], B200)
    assert any("SM90" in p for p in problems)
    problems, _ = preflight(real["v4-tp8-b200"], H200)
    assert any("CUTLASS_MLA" in p for p in problems)
    # as shipped the executable is the node's vllm: refused with the reason where it is absent
    problems, _ = preflight(cfg.profiles[0], H200)
    if not Path(cfg.profiles[0].executable).exists():
        assert problems == [f"executable {cfg.profiles[0].executable} does not exist"]


def test_preflight_refuses_too_few_gpus_and_a_non_executable(tmp_path):
    cfg = load_config(str(EXAMPLE))
    script = tmp_path / "vllm"
    script.write_text("#!/bin/sh\n")
    script.chmod(0o644)
    p = dataclasses.replace(cfg.profiles[0], executable=str(script))
    problems, _ = preflight(p, H200[:4])
    assert any("not an executable" in x for x in problems)
    assert any("needs 8 GPUs" in x and "4 visible" in x for x in problems)
    p = dataclasses.replace(p, env={"CUDA_VISIBLE_DEVICES": "0,1"})
    problems, _ = preflight(p, H200)
    assert any("2 visible" in x for x in problems)
