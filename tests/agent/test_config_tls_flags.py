"""A profile's extra_args cannot turn on vLLM's HTTPS (`--ssl-keyfile`, `--ssl-certfile`, in any spelling vLLM's
parser reads as them: `_` for `-`, `=value`, an unambiguous prefix). The agent's health probe and metrics scrape speak
plain HTTP to the run, so such a run never became ready and was killed at readiness_timeout_s (30 min by default).
The config refuses it, so `config check` and the agent say the same, naming TLS termination as unsupported. Other
`--ssl-` options (which do nothing without a key and certificate) stay accepted."""

from __future__ import annotations

import json

import pytest

from lynxtop.contract.config import ConfigError, parse_config

pytestmark = pytest.mark.timeout(60)

PROFILE = """
[[profile]]
name = "a"
executable = "/x/vllm"
model = "m"
host = "127.0.0.1"
"""


def parse(args: list[str]):
    return parse_config(PROFILE + f"extra_args = {json.dumps(args)}\n", source="/etc/lynxtop/config.toml")


@pytest.mark.parametrize("args", [
    ["--ssl-keyfile", "/etc/k.pem"],
    ["--ssl-certfile", "/etc/c.pem"],
    ["--ssl-keyfile=/etc/k.pem", "--ssl-certfile=/etc/c.pem"],
    ["--ssl_keyfile", "/etc/k.pem"],
    ["--ssl-k", "/etc/k.pem"],
    ["--ssl-certf", "/etc/c.pem"],
])
def test_extra_args_that_turn_on_https_are_refused(args):
    with pytest.raises(ConfigError) as exc:
        parse(args)
    text = "\n".join(exc.value.problems)
    assert "extra_args" in text and "TLS termination is not supported" in text and "health probe" in text, text


@pytest.mark.parametrize("args", [
    ["--ssl-ca-certs", "/etc/ca.pem"], ["--ssl-ciphers", "ECDHE"], ["--ssl-cert-reqs", "0"],
])
def test_other_ssl_options_stay_accepted(args):
    assert parse(args).profiles[0].extra_args == tuple(args)
