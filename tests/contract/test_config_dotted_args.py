"""`--flag.a.b v` in extra_args after `--flag.a` gave `a` a value that is not a JSON object (vLLM would replace that
value with a table, so one of the two is lost): `config check` refuses it as a problem of the profile's extra_args,
and `lynxtop check` and the agent's preflight, which read --speculative-config's dotted keys themselves, say so as a
blocking verdict instead of raising."""

from __future__ import annotations

import subprocess
import sys

import pytest

from lynxtop.agent.serving.supervisor import preflight
from lynxtop.agent.serving.vllm_options import extra_options
from lynxtop.contract.config import ConfigError, Profile, parse_config

H200 = [{"index": i, "name": "NVIDIA H200", "cc_major": 9, "cc_minor": 0} for i in range(8)]
CONFLICT = ("--speculative-config.method", "ngram", "--speculative-config.method.x", "1")
CONFLICTS = {
    "under-a-value": CONFLICT,
    "under-a-value-in-an-object": ("--speculative-config.a", '{"b": 1}', "--speculative_config.a.b.c=2"),
    "other-flag": ("--compilation-config.level", "3", "--compilation-config.level.mode", "1"),
}


def _text(args) -> str:
    quoted = ", ".join(f"'{a}'" for a in args)
    return f'[agent]\nfake_nvml = "h200x8"\n[[profile]]\nname = "a"\nexecutable = "{sys.executable}"\nmodel = "m"\n' \
           f"extra_args = [{quoted}]\n"


@pytest.mark.parametrize("name", CONFLICTS)
def test_config_refuses_a_key_set_inside_a_value(name):
    with pytest.raises(ConfigError) as err:
        parse_config(_text(CONFLICTS[name]), source="c.toml")
    (problem,) = err.value.problems
    assert problem.startswith("c.toml: profile[0] (a).extra_args: ") and "not a JSON object" in problem


@pytest.mark.parametrize("args", [
    ("--speculative-config.method.x", "1", "--speculative-config.method", "ngram"),  # the later value replaces it
    ("--speculative-config.a", '{"b": 1}', "--speculative-config.a.c", "2"),  # keys merge into an object
    ("--speculative-config.a.b", "1", "--speculative-config.a", "{}", "--speculative-config.a.b.c", "2"),
], ids=["value-after-table", "merge-into-object", "replaced-then-nested"])
def test_config_accepts_dotted_keys_that_merge(args):
    assert parse_config(_text(args)).profiles[0].extra_args == args


def test_check_reads_the_conflict_as_an_error_not_a_type_error():
    opts = extra_options(CONFLICT)
    assert opts.spec is None and "--speculative-config.method.x sets a key inside method" in opts.spec_error
    deep = extra_options(("--speculative-config", "[" * 5000))  # json.loads raises RecursionError
    assert deep.spec is None and "nested too deep" in deep.spec_error


def test_agent_preflight_refuses_a_profile_with_the_conflict():
    prof = Profile(name="a", executable=sys.executable, model="m", extra_args=CONFLICT)
    problems, _ = preflight(prof, H200)
    assert any("sets a key inside method" in p for p in problems), problems


def test_lynxtop_check_says_the_config_problem_without_a_traceback(tmp_path):
    f = tmp_path / "c.toml"
    f.write_text(_text(CONFLICT))
    r = subprocess.run([sys.executable, "-m", "lynxtop", "check", "--config", str(f)],
                       capture_output=True, text=True, timeout=60)
    assert "Traceback" not in r.stderr, r.stderr[-600:]
    assert r.returncode == 7 and "sets a key inside method" in r.stderr  # check: 7, could not check (s22)
