"""Issue 25.3: control characters are refused in every string of the config (not only NUL, CR and LF), and the
errors that quote the file reach the terminal escaped: `config check` through a real process."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from lynxtop.contract.config import (
    _AGENT_SPEC,
    _MODEL_SPEC,
    _PROFILE_SPEC,
    _RAY_SPEC,
    ConfigError,
    parse_config,
)

BASE = '[[profile]]\nname = "a"\nexecutable = "/x/vllm"\nmodel = "m"\n'
CONTROLS = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
# one of each kind: C0 (ESC, BEL, TAB), DEL, C1 (CSI), a bidi override and an isolate
FOREIGN = ["\x1b", "\x07", "\t", "\x7f", "\x9b", "\u202e", "\u2067"]


def _problems(text: str) -> list[str]:
    with pytest.raises(ConfigError) as exc:
        parse_config(text, source="c.toml")
    return exc.value.problems


def _toml(value: str) -> str:
    return json.dumps(value)  # a JSON string is a TOML basic string: \u escapes for every control character


def _snippet(table: str, key: str, value: str) -> str:
    """A config with `value` under `key` of `table`, every other key there valid (a profile's required ones)."""
    if table in ("profile", "model"):
        keys = ({"name": '"a"', "executable": '"/x/vllm"', "model": '"m"'} if table == "profile" else
                {"name": '"x"'}) | {key: _toml(value)}
        return f"[[{table}]]\n" + "".join(f"{k} = {v}\n" for k, v in keys.items())
    return f"[{table}]\n{key} = {_toml(value)}\n"


# every key whose value is a string (a path, a name, a free text); the others refuse a string anyway
STRING_KEYS = [("agent", k) for k in ("database", "socket", "socket_group", "log_dir", "metrics_listen",
                                      "default_profile", "role", "fake_nvml")] + \
              [("ray", k) for k in ("executable", "head_address", "node_ip_address", "temp_dir")] + \
              [("profile", k) for k in ("name", "description", "executable", "model", "served_model_name", "host",
                                        "kv_cache_dtype", "attention_backend", "quantization",
                                        "distributed_executor_backend")] + \
              [("model", k) for k in ("name", "native_quantization")]


def test_the_list_of_string_keys_is_complete():
    specs = {"agent": _AGENT_SPEC, "ray": _RAY_SPEC, "profile": _PROFILE_SPEC, "model": _MODEL_SPEC}
    for table, spec in specs.items():
        for key in spec:
            problems = _problems(_snippet(table, key, "/ok\x1bx"))
            assert any(f"{key}:" in p for p in problems) or (table, key) in STRING_KEYS, (table, key, problems)


@pytest.mark.parametrize(("table", "key"), STRING_KEYS)
@pytest.mark.parametrize("char", FOREIGN)
def test_every_string_key_refuses_control_characters(table, key, char):
    problems = _problems(_snippet(table, key, "/a" + char + "b"))
    mine = [p for p in problems if f"{key}:" in p]
    assert mine, problems
    assert all(not CONTROLS.search(p) for p in problems), problems  # the error itself quotes it escaped
    if key in ("description", "model", "served_model_name", "default_profile", "database", "executable", "name"):
        shown = "\\t" if char == "\t" else f"\\x{ord(char):02x}" if ord(char) < 0x100 else f"\\u{ord(char):04x}"
        assert f"holds the control character {shown}" in mine[0], mine


@pytest.mark.parametrize("key", ["extra_args", "env"])
def test_arguments_and_environment_values_refuse_control_characters(key):
    value = '["--x", "a\\u001b[2J"]' if key == "extra_args" else '{ VLLM_X = "s3cr3t\\u001b" }'
    problems = _problems(BASE + f"{key} = {value}\n") + _problems(f"[ray]\n{key} = {value}\n")
    assert len(problems) == 2 and all("holds the control character \\x1b" in p for p in problems), problems
    assert not any("s3cr3t" in p for p in problems)  # an environment value is never quoted: it may be a secret


def test_printable_unicode_stays_accepted():
    cfg = parse_config(BASE.replace('model = "m"', 'model = "模型/ünï [/] [bold]"') + 'description = "a — b"\n')
    assert cfg.profiles[0].model == "模型/ünï [/] [bold]"


def test_config_check_prints_its_errors_escaped(tmp_path):
    f = tmp_path / "c.toml"
    f.write_text('[agent]\n"x\\u001b]0;owned\\u0007" = 1\n\n' + BASE.replace('name = "a"', 'name = "a\\u001b[2J"')
                 + 'description = "d\\u202e"\n', encoding="utf-8")
    r = subprocess.run([sys.executable, "-m", "lynxtop", "config", "check", "--config", str(f)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert not CONTROLS.search(r.stderr + r.stdout), repr(r.stderr)
    assert "agent.x\\x1b]0;owned\\x07: unknown key" in r.stderr  # a key the file made up, quoted escaped
    assert "profile[0] (a\\x1b[2J).name: " in r.stderr and "description: holds the control character \\u202e" \
        in r.stderr
