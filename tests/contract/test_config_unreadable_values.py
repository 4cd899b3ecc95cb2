"""A TOML value that Python cannot take as written (a float key given an integer past 1.8e308, an integer of more
than 4300 digits, arrays nested past the recursion limit, `~user` for an unknown user) is a config problem like any
other: a ConfigError naming the file (and the key where TOML tells it), so `config check` and the agent's start
exit 2 with the message, and a reload or a poll of the changed file keeps what it had, never a traceback."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from lynxtop.agent.config_source import ConfigSource
from lynxtop.contract.config import ConfigError, load_config, parse_config

PROFILE = '[[profile]]\nname = "a"\nexecutable = "/bin/true"\nmodel = "m"\n'
HUGE_FLOAT = "[agent]\nsample_interval_s = 1" + "0" * 400 + "\n"  # float() overflows
TOO_MANY_DIGITS = "[agent]\nsample_interval_s = 1" + "0" * 5000 + "\n"  # tomllib raises a plain ValueError
TOO_DEEP = "[agent]\nsecret_env = " + "[" * 5000 + "]" * 5000 + "\n"  # tomllib raises RecursionError
UNKNOWN_USER = PROFILE.replace("/bin/true", "~nosuchuser_lynxtop_test/bin/vllm")  # expanduser() raises

CASES = {
    "float-overflow": (HUGE_FLOAT, "c.toml: agent.sample_interval_s: an integer of 401 digits is too large"),
    "int-digit-limit": (TOO_MANY_DIGITS, "c.toml: not valid TOML here: a value cannot be read (an integer has more "
                                         "than 4300 digits)"),
    "nested-too-deep": (TOO_DEEP, "c.toml: not valid TOML here: arrays or tables nested too deep"),
    "tilde-unknown-user": (UNKNOWN_USER, "c.toml: profile[0] (a).executable: '~nosuchuser_lynxtop_test/bin/vllm' "
                                         "starts with ~nosuchuser_lynxtop_test, but there is no user"),
}


@pytest.mark.parametrize("name", CASES)
def test_odd_values_are_config_errors_naming_file_and_key(name):
    text, message = CASES[name]
    with pytest.raises(ConfigError) as err:
        parse_config(text, source="c.toml")
    assert len(err.value.problems) == 1
    assert err.value.problems[0].startswith(message), err.value.problems


def test_float_keys_of_every_table_refuse_an_integer_too_large_for_a_float():
    big = "1" + "0" * 400
    for text in (f"[sla]\nwindow_s = {big}\n", PROFILE + f"readiness_timeout_s = {big}\n",
                 f"[ray]\nview_interval_s = {big}\n", f"[agent.retention]\nraw_days = {big}\n"):
        with pytest.raises(ConfigError, match="too large"):
            parse_config(text, source="c.toml")


@pytest.mark.parametrize("name", ["float-overflow", "int-digit-limit", "tilde-unknown-user"])
def test_config_check_exits_2_with_the_message_and_no_traceback(tmp_path, name):
    text, message = CASES[name]
    f = tmp_path / "c.toml"
    f.write_text(text)
    r = subprocess.run([sys.executable, "-m", "lynxtop", "config", "check", "--config", str(f)],
                       capture_output=True, text=True, timeout=60)
    assert "Traceback" not in r.stderr, r.stderr[-600:]
    assert r.returncode == 2
    assert message.removeprefix("c.toml") in r.stderr


def test_agent_socket_override_for_an_unknown_user_is_a_problem_not_a_traceback(tmp_path):
    from argparse import Namespace

    from lynxtop.cli.config_cli import load_or_exit

    f = tmp_path / "c.toml"
    f.write_text(PROFILE)
    args = Namespace(config=str(f), socket="~nosuchuser_lynxtop_test/agent.sock")
    assert load_or_exit(args, host=True) is None


@pytest.mark.parametrize("name", ["float-overflow", "int-digit-limit", "tilde-unknown-user"])
def test_agent_reload_refuses_and_poll_keeps_the_previous_profiles(tmp_path, name):
    f = tmp_path / "c.toml"
    f.write_text(PROFILE)
    source = ConfigSource(load_config(str(f)))
    assert source.poll().profiles[0].name == "a"  # the first poll notes the file's mtime
    f.write_text(PROFILE.replace('"a"', '"b"') + "\n" + CASES[name][0])
    st = f.stat()
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    assert [p.name for p in source.poll().profiles] == ["a"]
    with pytest.raises(ConfigError):
        source.reload()
    assert [p.name for p in source.current.profiles] == ["a"]
