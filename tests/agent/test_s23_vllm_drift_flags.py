"""`vllm serve` flags a profile written for an older vLLM still carries: `lynxtop check` (and the preflight of every
start) names the flag, the vLLM version that no longer takes it and what replaced it, before vLLM exits with
"unrecognized arguments" at every start (a crash loop). The simulator runs each profile as vLLM 0.32 parses it.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from lynxtop.agent.gpu.fake import h200_specs
from lynxtop.agent.serving.check import REMOVED_FLAGS, Level, check_profile, facts_from_info
from lynxtop.contract.config import load_config
from lynxtop.contract.models import find_model
from lynxtop.sim.vllm_options import VLLM_SERVE_OPTIONS

EXAMPLE = Path(__file__).resolve().parents[2] / "systemd" / "config.example.toml"
PROFILE = {p.name: p for p in load_config(str(EXAMPLE)).profiles}["v4-tp8-h200"]
H200 = facts_from_info([{"index": s.index, "name": s.name, "cc_major": s.cc[0], "cc_minor": s.cc[1],
                         "mem_total_bytes": s.mem_total_bytes, "nvlink_count": s.nvlink_count}
                        for s in h200_specs()], "580.159.04")


def flag_verdicts(*extra: str):
    prof = dataclasses.replace(PROFILE, extra_args=extra)
    return [v for v in check_profile(prof, H200, find_model(prof.model)).verdicts if v.check == "flags"]


@pytest.mark.parametrize(("args", "flag", "fix"), [
    (("--swap-space", "4"), "--swap-space", "remove it"),
    (("--disable-log-requests",), "--disable-log-requests", "--enable-log-requests"),
    (("--speculative-model", "x", "--num-speculative-tokens", "2"), "--speculative-model", "--speculative-config"),
    (("--num_scheduler_steps=8",), "--num-scheduler-steps", "remove it"),  # `_` and `=value`, as vLLM reads them
    (("--guided-decoding-backend", "xgrammar"), "--guided-decoding-backend", "--structured-outputs-config"),
    (("--task", "generate"), "--task", "--runner"),
    (("--max-seq-len-to-capture", "8192"), "--max-seq-len-to-capture", "--max-cudagraph-capture-size"),
])
def test_a_flag_newer_vllm_dropped_is_named_with_the_version_and_its_replacement(args, flag, fix):
    found = [v for v in flag_verdicts(*args) if flag in v.reason]
    assert len(found) == 1, flag_verdicts(*args)
    v = found[0]
    assert v.level == Level.WARNING  # the node may still run an older vLLM that takes it
    assert "vLLM 0.32" in v.reason and "unrecognized arguments" in v.reason and fix in v.fix


def test_the_flags_of_the_table_are_really_gone_from_vllm_032():
    """Each flag named as dropped is no `vllm serve` option of 0.32 (nor a prefix argparse would expand)."""
    for flag in REMOVED_FLAGS:
        assert not any(opt.startswith(flag) for opt in VLLM_SERVE_OPTIONS), flag
    for _flag, (_, replacement) in REMOVED_FLAGS.items():  # and each replacement named is one
        for word in replacement.split():
            if word.startswith("--"):
                assert word.rstrip(".,;:)").split(".")[0] in VLLM_SERVE_OPTIONS, word


def test_current_flags_and_values_are_not_taken_for_old_ones():
    assert flag_verdicts("--enable-log-requests", "--max-cudagraph-capture-size", "512") == []
    # an old flag's name inside a value (`--flag=value`) is no flag; nor is a current flag it is a prefix of
    assert flag_verdicts("--chat-template=--task", "--tasks-x") == []


# ------------------------------------------------------------------ the vLLM installed beside the profile's executable


def venv_with_vllm(root: Path, version: str | None) -> str:
    """A virtual environment as pip lays it out: bin/vllm, and vLLM's dist-info (its METADATA) when `version`."""
    (root / "bin").mkdir(parents=True)
    exe = root / "bin" / "vllm"
    exe.write_text("#!/bin/sh\nexit 0\n")
    exe.chmod(0o755)
    if version is not None:
        info = root / "lib" / "python3.12" / "site-packages" / f"vllm-{version}.dist-info"
        info.mkdir(parents=True)
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\nSummary: x\n")
    return str(exe)


def verdicts_with(executable: str, **changes):
    prof = dataclasses.replace(PROFILE, executable=executable, **changes)
    return [v for v in check_profile(prof, H200, find_model(prof.model)).verdicts if v.check == "flags"]


def test_the_default_shutdown_timeout_is_refused_on_a_vllm_before_018(tmp_path):
    """shutdown_timeout_s (default 30) passes --shutdown-timeout, which vLLM takes from 0.18 (reference notes): on
    an older vLLM every start exits 'unrecognized arguments'. With the installed version known the start is
    refused before it, naming the key, the flag and both versions, never started into a crash loop."""
    exe = venv_with_vllm(tmp_path / "v010", "0.10.2")
    [v] = [v for v in verdicts_with(exe, shutdown_timeout_s=30) if "--shutdown-timeout" in v.reason]
    assert v.level == Level.BLOCKING
    assert "0.10.2" in v.reason and "0.18" in v.reason and "shutdown_timeout_s = 0" in v.fix
    assert verdicts_with(exe, shutdown_timeout_s=0) == []
    newer = venv_with_vllm(tmp_path / "v032", "0.32.0")
    assert verdicts_with(newer, shutdown_timeout_s=30) == []
    unknown = venv_with_vllm(tmp_path / "none", None)  # no dist-info: the version is not known, nothing guessed
    assert verdicts_with(unknown, shutdown_timeout_s=30) == []


def test_a_dropped_flag_is_refused_where_the_installed_vllm_is_032_or_newer(tmp_path):
    new = venv_with_vllm(tmp_path / "new", "0.33.1")
    [v] = verdicts_with(new, extra_args=("--swap-space", "4"))
    assert v.level == Level.BLOCKING and "0.33.1" in v.reason and "--swap-space" in v.reason
    old = venv_with_vllm(tmp_path / "old", "0.10.2")
    [w] = verdicts_with(old, extra_args=("--swap-space", "4"), shutdown_timeout_s=0)
    assert w.level == Level.WARNING and "0.10.2" in w.reason  # that vLLM may still take it


def test_preflight_refuses_the_start_instead_of_a_crash_loop(tmp_path):
    from lynxtop.agent.serving.supervisor import preflight

    exe = venv_with_vllm(tmp_path / "v010", "0.10.2")
    prof = dataclasses.replace(PROFILE, executable=exe, shutdown_timeout_s=30)
    gpus = [{"index": s.index, "name": s.name, "cc_major": s.cc[0], "cc_minor": s.cc[1],
             "mem_total_bytes": s.mem_total_bytes, "nvlink_count": s.nvlink_count, "driver_version": "580.159.04"}
            for s in h200_specs()]
    problems, _warnings = preflight(prof, gpus)
    assert any("--shutdown-timeout" in p and "0.10.2" in p for p in problems), problems
