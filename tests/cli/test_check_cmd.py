"""`lynxtop check`: the shipped profiles on the fake nodes, the exit codes, and errors without tracebacks."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pynvml
import pytest

from lynxtop.__main__ import main
from lynxtop.agent.gpu import backend
from lynxtop.agent.gpu.fake import FakeNvml, ScriptedNode, scripted_scenario
from lynxtop.cli.parser import build_parser

EXAMPLE = Path(__file__).resolve().parents[2] / "systemd" / "config.example.toml"


def config(tmp_path: Path, fake: str) -> str:
    text = EXAMPLE.read_text()
    profiles = text[text.index("[[profile]]"):]
    path = tmp_path / "config.toml"
    path.write_text(f'[agent]\ndatabase = "{tmp_path}/l.db"\nsocket = "{tmp_path}/a.sock"\nfake_nvml = "{fake}"\n\n'
                    + profiles)
    return str(path)


def check(capsys, *args: str) -> tuple[int, str, str]:
    code = main(["check", *args])
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.mark.parametrize(("fake", "profile", "code", "levels"), [
    # the profile on the node it was written for: everything fits, but not 256 full-context sequences (warning)
    ("h200x8", "v4-tp8-h200", 1, {"attention": "ok", "memory": "warning"}),
    ("h200x8", "v4-dp8ep-h200", 1, {"attention": "ok", "parallelism": "ok", "memory": "warning"}),
    ("b200x8", "v4-tp8-b200", 1, {"attention": "ok", "driver": "ok", "memory": "warning"}),
    # 16 GPUs over Ray, 8 here: a warning (the rest from the Ray cluster), Ray not beside /opt/vllm/bin/vllm here
    ("h200x8", "v4-tp8pp2-ray", 1, {"parallelism": "warning", "ray": "warning"}),
    # dense FlashMLA is SM90 only; CUTLASS MLA SM100 only; A100 (SM80) runs neither
    ("b200x8", "v4-tp8-h200", 2, {"attention": "blocking"}),
    ("h200x8", "v4-tp8-b200", 2, {"attention": "blocking"}),
    ("a100x8", "v4-tp8-h200", 2, {"attention": "blocking"}),
    ("a100x8", "v4-dp8ep-h200", 2, {"attention": "blocking"}),
])
def test_shipped_profiles_on_the_fake_nodes(tmp_path, capsys, fake, profile, code, levels):
    rc, out, err = check(capsys, "--config", config(tmp_path, fake), "--profile", profile, "--json")
    assert rc == code and err == ""
    data = json.loads(out)
    [report] = data["reports"]
    got = {v["check"]: v["level"] for v in report["verdicts"]}
    assert {k: got[k] for k in levels} == levels
    assert data["exit_code"] == code and len(data["gpus"]) == 8


def test_text_output_names_reason_and_fix(tmp_path, capsys):
    rc, out, _ = check(capsys, "--config", config(tmp_path, "b200x8"), "--profile", "v4-tp8-h200")
    assert rc == 2
    assert "8 x NVIDIA B200 (simulated) (SM100, 179.1 GiB); driver 570.133.20" in out
    assert "BLOCKING attention   attention backend FLASHMLA does not fit" in out
    assert "fix: attention_backend = CUTLASS_MLA" in out and "--attention-backend" in out
    assert "25 of 256 sequences" in out  # 3,323,986 KV tokens // 131,072 (tests/agent/test_check.py)
    assert out.rstrip().endswith("result: exit 2 (blocking problems)")


def test_every_profile_by_default_worst_exit_code(tmp_path, capsys):
    rc, out, _ = check(capsys, "--config", config(tmp_path, "h200x8"), "--json")
    data = json.loads(out)
    assert [r["profile"] for r in data["reports"]] == ["v4-tp8-h200", "v4-tp8pp2-ray", "v4-tp8-b200", "v4-dp8ep-h200"]
    assert rc == 2 == data["exit_code"]  # the B200 profile blocks on H200s


def test_all_good_is_exit_0(tmp_path, capsys):
    path = Path(config(tmp_path, "h200x8"))
    path.write_text(path.read_text().replace("max_num_seqs = 256", "max_num_seqs = 16"))
    rc, out, _ = check(capsys, "--config", str(path), "--profile", "v4-tp8-h200")
    assert rc == 0 and "WARNING" not in out and "BLOCKING" not in out and "result: exit 0 (all good)" in out


def test_unknown_profile(tmp_path, capsys):
    rc, out, err = check(capsys, "--config", config(tmp_path, "h200x8"), "--profile", "nope")
    assert rc == 7 and out == ""  # could not check (s22), not "blocking"
    assert err == ("lynxtop check: unknown profile 'nope' (known: v4-tp8-h200, v4-tp8pp2-ray, v4-tp8-b200, "
                   "v4-dp8ep-h200)\n")


def test_bad_config_is_reported_not_raised(tmp_path, capsys):
    path = tmp_path / "bad.toml"
    path.write_text("[[profile]]\nname = 1\n")
    rc, _, err = check(capsys, "--config", str(path))
    assert rc == 7 and "config error" in err and "Traceback" not in err


@pytest.mark.parametrize(("nvml", "message"), [
    (lambda: FakeNvml(scripted_scenario("h200x8"), init_error=pynvml.NVML_ERROR_LIBRARY_NOT_FOUND),
     "no NVIDIA driver"),
    (lambda: FakeNvml(ScriptedNode([])), "NVML reports no GPUs on this node"),
    (lambda: _failing(), "enumerating GPUs failed: NVML_ERROR_UNKNOWN"),
])
def test_gpu_errors_are_one_clear_line(tmp_path, capsys, monkeypatch, nvml, message):
    monkeypatch.setattr(backend, "open_backend", lambda *a, **k: nvml())
    rc, out, err = check(capsys, "--config", config(tmp_path, "h200x8"))
    assert rc == 7 and out == "" and err.startswith("lynxtop check: ") and message in err
    assert "Traceback" not in err and err.count("\n") == 1


def _failing() -> FakeNvml:
    nvml = FakeNvml(scripted_scenario("h200x8"))
    nvml.fail_all = pynvml.NVML_ERROR_UNKNOWN
    return nvml


def test_check_is_a_command():
    args = build_parser().parse_args(["check", "--profile", "x", "--json"])
    assert (args.handler, args.profile, args.json) == ("lynxtop.cli.check_cmd:run", "x", True)


def test_no_driver_as_a_process_prints_one_line(tmp_path):
    # a process, so no test harness catches the sampler's log lines: the reason is said once, on stderr
    r = subprocess.run([sys.executable, "-m", "lynxtop", "check", "--config", config(tmp_path, "nodriver")],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 7 and r.stdout == ""
    assert r.stderr == ("lynxtop check: no NVIDIA driver (nvmlInit failed: NVML_ERROR_LIBRARY_NOT_FOUND (NVML "
                        "Shared Library Not Found))\n")


def test_deepseek_options_from_extra_args_are_checked(tmp_path, capsys):
    # -dcp 3 does not divide TP8, and DeepSeek-V4.1's draft layers are DSpark, not MTP: vLLM refuses both
    path = Path(config(tmp_path, "h200x8"))
    path.write_text(path.read_text().replace(
        "max_num_seqs = 256", 'max_num_seqs = 256\nextra_args = ["-dcp", "3", "--speculative-config", '
                              '"{\\"method\\": \\"deepseek_mtp\\", \\"num_speculative_tokens\\": 1}"]', 1))
    rc, out, err = check(capsys, "--config", str(path), "--profile", "v4-tp8-h200")
    assert rc == 2 and err == ""
    assert "  BLOCKING dcp         decode context parallel 3 (-dcp 3) does not divide tensor parallel 8" in out
    assert "fix: -dcp one of 1, 2, 4, 8" in out
    assert "  BLOCKING speculative deepseek-ai/DeepSeek-V4.1's draft layers are dspark, not mtp" in out
    assert "  ok       quantization fp8 weights (as shipped) run natively on NVIDIA H200 (simulated) (SM90)" in out
    rc, out, _ = check(capsys, "--config", str(path), "--profile", "v4-tp8-h200", "--json")
    levels = {v["check"]: v["level"] for v in json.loads(out)["reports"][0]["verdicts"]}
    assert (levels["dcp"], levels["speculative"], levels["quantization"]) == ("blocking", "blocking", "ok")
