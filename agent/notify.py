"""sd_notify without libsystemd: one datagram per message to $NOTIFY_SOCKET.

The protocol is a few `KEY=value` lines in a datagram, so a library would add a dependency for ten lines.
The variables are read once and removed from the agent's environment, so no child (vLLM above all) can
inherit them and confuse systemd by notifying as the agent.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable, MutableMapping

log = logging.getLogger(__name__)

NOTIFY_VARS = ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID")


class Notifier:
    """Sends READY/STATUS/WATCHDOG/STOPPING; every method is a no-op when not run by systemd."""

    def __init__(self, address: str | None, watchdog_usec: int | None = None):
        self.address = address or None
        self.watchdog_usec = watchdog_usec if watchdog_usec and watchdog_usec > 0 else None
        self.sent = 0
        self.errors = 0
        self.last_error: OSError | None = None
        self._last_status = ""

    @classmethod
    def from_env(cls, environ: MutableMapping[str, str] | None = None, consume: bool = True) -> Notifier:
        """Read the systemd variables (and, with `consume`, delete them so children never see them)."""
        env = os.environ if environ is None else environ
        address = env.get("NOTIFY_SOCKET")
        usec: int | None = None
        raw = env.get("WATCHDOG_USEC", "")
        wd_pid = env.get("WATCHDOG_PID", "")
        # WATCHDOG_PID names the process the watchdog is meant for; another pid means it is not ours
        if raw.isdigit() and (not wd_pid or wd_pid == str(os.getpid())):
            usec = int(raw)
        if consume:
            for var in NOTIFY_VARS:
                env.pop(var, None)
        return cls(address, usec)

    @property
    def enabled(self) -> bool:
        return self.address is not None

    @property
    def watchdog_interval_s(self) -> float | None:
        """Half of WatchdogSec, as sd_watchdog_enabled(3) recommends; None when no watchdog is set."""
        return self.watchdog_usec / 2e6 if self.watchdog_usec else None

    def send(self, *lines: str) -> bool:
        if not self.address:
            return False
        addr = self.address
        if addr.startswith("@"):
            addr = "\0" + addr[1:]  # abstract namespace
        payload = "\n".join(lines).encode()
        try:
            # never wait: this runs on the agent's event loop, and a receiver that stopped reading (its queue
            # full) once cost a 1 s stall per message, i.e. missed ticks; a message it cannot take is dropped
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC | socket.SOCK_NONBLOCK) \
                    as sock:
                sock.sendto(payload, addr)
        except OSError as exc:
            self.errors += 1
            self.last_error = exc
            if self.errors == 1 or self.errors % 100 == 0:
                log.warning("sd_notify to %s failed (%d failures so far): %s", self.address, self.errors, exc)
            return False
        self.sent += 1
        return True

    def ready(self, status: str = "") -> bool:
        lines = ["READY=1"] + ([f"STATUS={status}"] if status else [])
        if status:
            self._last_status = status
        return self.send(*lines)

    def status(self, text: str) -> bool:
        """STATUS= only when it changed: `systemctl status` shows the latest, repeats are noise."""
        text = text.replace("\n", " ")
        if text == self._last_status:
            return False
        self._last_status = text
        return self.send(f"STATUS={text}")

    def watchdog(self) -> bool:
        return self.send("WATCHDOG=1")

    def stopping(self, status: str = "") -> bool:
        return self.send("STOPPING=1", *([f"STATUS={status}"] if status else []))


class WatchdogThread:
    """WATCHDOG=1 every `interval_s` while `healthy()`, sent from a thread of its own.

    Why a thread: on the event loop the keep-alive waited behind whatever was due when the agent resumed after a
    SIGSTOP or a VM pause (a backlog of ticks, connections and probes), and the stale tick age made the first
    check after the pause fail, so the next ping came a whole interval later: a 37 s gap for WatchdogSec=30, and
    systemd would have killed a healthy agent. This thread wakes every `step_s`; a wake much later than asked
    means the process was stopped, and `on_resume` tells the agent so (its ticks get a fresh grace) and the
    keep-alive goes out at once, if the agent was healthy when it was stopped. Health is still the agent's:
    a loop that really hangs stops its ticks, and the pings stop with them.
    """

    def __init__(self, notifier: Notifier, healthy: Callable[[], bool], interval_s: float,
                 on_resume: Callable[[float], None] | None = None, on_unhealthy: Callable[[], None] | None = None,
                 step_s: float | None = None, clock: Callable[[], float] = time.monotonic):
        self.notifier, self.healthy, self.interval_s = notifier, healthy, interval_s
        self.on_resume, self.on_unhealthy, self.clock = on_resume, on_unhealthy, clock
        self.step_s = step_s if step_s is not None else max(0.05, min(1.0, interval_s / 4))
        self.resumes = 0  # times the thread found it had been stopped
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="watchdog", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(5)

    def _run(self) -> None:
        last_wake = self.clock()
        next_ping = last_wake  # the first keep-alive at once
        was_healthy = True
        late_s = self.step_s + 2.0  # a wake later than this means the process did not run meanwhile
        while not self._stop.wait(self.step_s):
            now = self.clock()
            if now - last_wake > late_s:
                self.resumes += 1
                if was_healthy:  # a hung agent stopped and continued stays hung: no grace for it
                    if self.on_resume is not None:
                        self.on_resume(now)
                    next_ping = now
            last_wake = now
            try:
                ok = self.healthy()
            except Exception:  # noqa: BLE001 - a failing check is an unhealthy agent, not a dead watchdog
                log.exception("the watchdog's health check failed")
                ok = False
            if not ok and was_healthy and self.on_unhealthy is not None:
                self.on_unhealthy()  # said once per episode, not once per interval
            was_healthy = ok
            if ok and now >= next_ping:
                self.notifier.watchdog()
                next_ping = now + self.interval_s
