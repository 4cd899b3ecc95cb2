"""The systemd keep-alive after SIGSTOP/SIGCONT of a real agent, read from a fake NOTIFY_SOCKET (issue 24.5)."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time

import pytest
from support.agent_proc import e2e_config, terminate

WATCHDOG_SEC = 20.0  # the agent pings every 10 s
PAUSE_S = 12.0  # longer than the ping interval and the agent's 10 s tick-age limit


class NotifySocket:
    """systemd's end of NOTIFY_SOCKET: every datagram with the monotonic time it arrived."""

    def __init__(self, path: str):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(path)
        self.sock.setblocking(False)
        self.got: list[tuple[float, str]] = []

    def drain(self) -> None:
        while True:
            try:
                self.got.append((time.monotonic(), self.sock.recv(4096).decode()))
            except BlockingIOError:
                return

    def pings(self) -> list[float]:
        self.drain()
        return [t for t, m in self.got if "WATCHDOG=1" in m.split("\n")]

    async def wait(self, pred, timeout: float, agent: subprocess.Popen, what: str):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.drain()
            got = pred()
            if got:
                return got
            assert agent.poll() is None, f"agent exited {agent.returncode}"
            await asyncio.sleep(0.02)
        raise AssertionError(f"no {what} in {timeout} s: {self.got}")


@pytest.mark.timeout(120)
async def test_keepalive_goes_out_at_once_after_sigcont(tmp_path, cleanup):
    """Stopped for 12 s right after a keep-alive, then continued: the next WATCHDOG=1 comes within a few seconds
    of SIGCONT, so the gap stays under WatchdogSec (before: the first check after the pause failed on the stale
    tick age and the next ping came a whole interval later, 22 s after the last one)."""
    cfg = e2e_config(tmp_path, autostart=False)
    notify = NotifySocket(str(tmp_path / "notify"))
    env = dict(os.environ, NOTIFY_SOCKET=str(tmp_path / "notify"), WATCHDOG_USEC=str(int(WATCHDOG_SEC * 1e6)),
               LYNXTOP_SIM_STATE_DIR=str(tmp_path / "sim-state"))
    with open(tmp_path / "agent.log", "wb") as out:
        agent = subprocess.Popen([sys.executable, "-m", "lynxtop", "agent", "--config", str(cfg)], stdout=out,
                                 stderr=subprocess.STDOUT, env=env)
    try:
        await notify.wait(lambda: any("READY=1" in m for _, m in notify.got), 30, agent, "READY=1")
        first = await notify.wait(notify.pings, 15, agent, "a first WATCHDOG=1")
        last = first[-1]
        agent.send_signal(signal.SIGSTOP)
        stopped = time.monotonic()
        await asyncio.sleep(PAUSE_S)
        agent.send_signal(signal.SIGCONT)
        resumed = time.monotonic()
        after = await notify.wait(lambda: [t for t in notify.pings() if t > resumed], 2 * WATCHDOG_SEC, agent,
                                  "a WATCHDOG=1 after SIGCONT")
        assert stopped - last < 1.0  # stopped right after a keep-alive: the pause made most of the gap
        gap = after[0] - last
        assert after[0] - resumed < 5.0, f"first keep-alive {after[0] - resumed:.1f} s after SIGCONT"
        assert gap < WATCHDOG_SEC, f"{gap:.1f} s without a keep-alive (WatchdogSec={WATCHDOG_SEC:g})"
    finally:
        if agent.poll() is None:
            agent.send_signal(signal.SIGCONT)
        assert terminate(agent) == 0, (tmp_path / "agent.log").read_text()[-3000:]
        notify.sock.close()
