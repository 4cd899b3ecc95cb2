"""sd_notify without libsystemd: one datagram per message to $NOTIFY_SOCKET.

The protocol is a few `KEY=value` lines in a datagram, so a library would add a dependency for ten lines.
The variables are read once and removed from the agent's environment, so no child (vLLM above all) can
inherit them and confuse systemd by notifying as the agent.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import MutableMapping

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
