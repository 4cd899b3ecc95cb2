"""A vLLM that refuses its command line at start (argparse: "unrecognized arguments", "ambiguous option", "invalid
choice"; exit 2) is a configuration error: every retry fails the same way, so the agent gives up at once, naming the
flag and the profile, instead of backing off into a crash loop. Under a real agent, with the real simulator (which
refuses what vLLM refuses, the same way) and a stand-in that prints argparse's "invalid choice".
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest
from support.agent_config import profile, sim_profile, write_agent_config
from support.agent_proc import Agent, reap_sims

from lynxtop.agent.serving.failures import argparse_refusal

INVALID_CHOICE = """\
import sys
sys.stderr.write("usage: vllm serve [-h] [--dtype {auto,half,float16,bfloat16,float,float32}] MODEL\\n")
sys.stderr.write("vllm serve: error: argument --dtype: invalid choice: 'fp7' (choose from 'auto', 'half', "
                 "'float16', 'bfloat16', 'float', 'float32')\\n")
sys.exit(2)
"""


def _config(tmp: Path, prof: str) -> Path:
    return write_agent_config(tmp / "config.toml", tmp / "state" / "lynxtop.db", tmp / "run" / "agent.sock",
                              fake_nvml="sim", sample_interval_s=0.5, default_profile="bad", autostart=True,
                              backoff_initial_s=0.2, backoff_max_s=0.5, crash_loop_failures=5, profiles=[prof])


async def _gave_up(tmp: Path, prof: str) -> tuple[dict, list[dict]]:
    agent = Agent(tmp, _config(tmp, prof))
    try:
        st = await agent.wait_state(lambda s: s["state"] in ("crash-loop", "stopped") and s.get("reason"), 60,
                                    "the agent to give up")
        await asyncio.sleep(2.0)  # a retry, were one scheduled (backoff 0.2-0.5 s), would have run by now
        st = await agent.status()
        _, body = await agent.api("GET", "/v1/events?since=0&limit=1000")
        return st["serving"], body["events"]
    finally:
        agent.stop()
        reap_sims(tmp / "sim-state")


@pytest.mark.parametrize(("flag", "args"), [("--no-such-flag", ("--no-such-flag",)),
                                            ("--enable-log", ("--enable-log",))])
def test_a_flag_the_simulated_vllm_refuses_is_not_retried_into_a_crash_loop(tmp_path, flag, args):
    serving, events = asyncio.run(_gave_up(tmp_path, sim_profile("bad", tp=8, sim_args=args)))
    kinds = [e["kind"] for e in events]
    assert kinds.count("serving.starting") == 1, kinds  # started once, never retried
    assert "serving.backoff" not in kinds, kinds
    assert serving["state"] == "crash-loop" and flag in serving["reason"] and "bad" in serving["reason"], serving
    assert serving["failures_in_window"] == 1, serving  # the one failure counted (the real-vLLM stage reads it)
    gave_up = [e for e in events if e["kind"] == "serving.crash_loop"]
    assert len(gave_up) == 1, kinds
    ev = gave_up[0]
    assert flag in ev["message"] and "profile bad" in ev["message"] and "extra_args" in ev["message"]
    assert ev["details"]["reason"] == "config_error" and ev["details"]["flag"] == flag
    assert ev["details"]["failures"] == 1


def test_an_invalid_choice_is_a_configuration_error_too(tmp_path):
    script = tmp_path / "vllm"
    script.write_text(f"#!{sys.executable}\n{INVALID_CHOICE}")
    script.chmod(0o755)
    serving, events = asyncio.run(_gave_up(tmp_path, profile("bad", script, tensor_parallel_size=8,
                                                             readiness_timeout_s=30, stop_grace_s=3,
                                                             shutdown_timeout_s=0)))
    kinds = [e["kind"] for e in events]
    assert kinds.count("serving.starting") == 1 and "serving.backoff" not in kinds, kinds
    ev = next(e for e in events if e["kind"] == "serving.crash_loop")
    assert ev["details"]["flag"] == "--dtype" and "invalid choice: 'fp7'" in ev["message"], ev
    assert serving["state"] == "crash-loop"


def test_what_is_and_is_not_an_argparse_refusal():
    """Only argparse's own line (`PROG: error: ...`) of the last lines; an engine's error that quotes a flag is a
    crash like any other."""
    assert argparse_refusal(["INFO starting", "vllm serve: error: unrecognized arguments: --swap-space 4"]) == (
        "--swap-space", "unrecognized arguments: --swap-space 4")
    assert argparse_refusal(["vllm serve: error: ambiguous option: --max-num could match --max-num-seqs, "
                             "--max-num-batched-tokens"])[0] == "--max-num"
    assert argparse_refusal(["api_server.py: error: argument --kv-cache-dtype: invalid choice: 'fp4' (choose "
                             "from 'auto', 'fp8')"])[0] == "--kv-cache-dtype"
    assert argparse_refusal(["ValueError: unrecognized arguments in the engine config", "RuntimeError: x"]) is None
    assert argparse_refusal(["torch.OutOfMemoryError: CUDA out of memory"]) is None
    assert argparse_refusal([]) is None
