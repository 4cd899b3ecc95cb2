"""A pending retry outlives the agent: SIGKILLed (the OOM killer, the watchdog's abort) while a crashed run waits for
its retry and restarted as systemd restarts it, the next agent carries the retry out (backoff.json) and counts the
earlier failures toward the crash-loop limit. Once it forgot both: "stopped (agent started)" for good with autostart
off, and with autostart on a fresh start with the failure count at zero, undoing the crash-loop protection.

Real agents (`lynxtop agent` processes) supervising the simulated vLLM, whose load fails (`--sim-fail oom`).
"""

from __future__ import annotations

import signal

import pytest
from support.agent_config import sim_profile, write_agent_config
from support.agent_proc import Agent

pytestmark = pytest.mark.timeout(150)


def config(tmp_path, crash_loop_failures: int):
    prof = sim_profile("alpha", tp=8, startup_s=0.5, sim_args=("--sim-fail", "oom"))
    return write_agent_config(tmp_path / "config.toml", tmp_path / "state" / "lynxtop.db",
                              tmp_path / "run" / "agent.sock", fake_nvml="sim", sample_interval_s=0.2,
                              backoff_initial_s=5, backoff_max_s=10, crash_loop_failures=crash_loop_failures,
                              gpu_release_timeout_s=5, profiles=[prof])


async def killed_in_backoff(tmp_path, cleanup, cfg) -> tuple[Agent, dict]:
    """An agent whose run crashed, SIGKILLed during the backoff, and the agent systemd starts next."""
    first = Agent(tmp_path, cfg, "first")
    cleanup.append(first)
    await first.wait_notify("READY=1", 30)
    code, body = await first.api("POST", "/v1/start", {"profile": "alpha", "expect_run": None})
    assert code in (200, 202), body
    st = await first.wait_state(lambda s: s["state"] == "backoff", 40, "backoff after the load failed")
    first.stop(signal.SIGKILL)  # the OOM killer, mid-backoff
    second = Agent(tmp_path, cfg, "second")
    cleanup.append(second)
    await second.wait_notify("READY=1", 30)
    return second, st


async def test_a_retry_pending_when_the_agent_is_killed_is_not_forgotten(tmp_path, cleanup, reap):
    """autostart off (the default): the next agent shows the backoff and carries the retry out."""
    second, st = await killed_in_backoff(tmp_path, cleanup, config(tmp_path, 5))
    seen: list[tuple[str, str]] = []

    def note(s: dict) -> bool:
        seen.append((s["state"], s["reason"]))
        return s["state"] in ("starting", "backoff", "crash-loop")

    try:
        await second.wait_state(note, 20, "the retry honoured or the failure held")
    except AssertionError:
        pass
    assert seen and seen[-1][0] in ("starting", "backoff", "crash-loop"), (
        f"the first agent was in backoff ({st['serving']['reason']}) when it was killed; the next agent shows "
        f"{seen[-1] if seen else None} for 20 s: the retry is forgotten and serving stays down")
    # the retry is carried out: a new load (which fails again here) follows
    await second.wait_state(lambda s: s["state"] in ("starting", "crash-loop")
                            or s["state"] == "backoff" and "retry 2" in s["reason"], 40, "the retry carried out")


async def test_the_failures_before_the_agent_was_killed_count_toward_the_crash_loop(tmp_path, cleanup, reap):
    """crash_loop_failures = 2: one failure before the kill, one after it is a crash loop, not a fresh backoff."""
    second, _ = await killed_in_backoff(tmp_path, cleanup, config(tmp_path, 2))
    seen: list[tuple[str, str]] = []

    def settled(s: dict) -> bool:
        seen.append((s["state"], s["reason"]))
        return s["state"] == "crash-loop" or s["state"] == "backoff" and "retry 1 " in s["reason"] and \
            "agent restarted" not in s["reason"]

    await second.wait_state(settled, 60, "the retry's failure counted")
    assert seen[-1][0] == "crash-loop", (
        f"the retry after the agent's restart failed and the agent shows {seen[-1]}: the failure before the "
        "restart was not counted (crash_loop_failures = 2)")
    assert not (tmp_path / "state" / "backoff.json").exists(), "a crash loop leaves no retry pending"
