"""Two test hosts on one machine: network namespaces joined by a veth pair, each with its own address.

A process run under `Hosts.prefix(i)` sees only its namespace's network (its own loopback and its end of the
link), so Ray's head and worker talk over a real link between two addresses, as two nodes do. The file system
is shared (unix sockets, state directories). Where namespaces cannot be made (not root, no iproute2), `Hosts`
falls back to one host on loopback and says why in `fallback`.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager


def _ip(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=10)


class Hosts:
    def __init__(self, names: tuple[str, str], addrs: tuple[str, str], fallback: str | None):
        self.names, self.addrs, self.fallback = names, addrs, fallback

    def prefix(self, i: int) -> tuple[str, ...]:
        return () if self.fallback else ("ip", "netns", "exec", self.names[i])

    def run(self, i: int, *argv: str) -> subprocess.CompletedProcess:
        return subprocess.run([*self.prefix(i), *argv], capture_output=True, text=True, timeout=30)


def _why_not() -> str | None:
    if os.geteuid() != 0:
        return "not root: network namespaces need CAP_SYS_ADMIN"
    if shutil.which("ip") is None:
        return "no `ip` command (iproute2)"
    return None


@contextmanager
def two_hosts() -> Iterator[Hosts]:
    """Two namespaces `lt<pid>a`/`lt<pid>b` on 10.231.N.1 and .2 (N from the pid), removed afterwards."""
    why = _why_not()
    tag = f"lt{os.getpid() % 100000}"
    names = (f"{tag}a", f"{tag}b")
    net = f"10.231.{os.getpid() % 250 + 1}"
    addrs = (f"{net}.1", f"{net}.2")
    made: list[str] = []
    try:
        if why is None:
            why = _make(names, addrs, tag, made)
        if why is not None:
            yield Hosts(names, ("127.0.0.1", "127.0.0.1"), fallback=why)
        else:
            yield Hosts(names, addrs, fallback=None)
    finally:
        for ns in made:
            _ip("netns", "del", ns)


def _make(names: tuple[str, str], addrs: tuple[str, str], tag: str, made: list[str]) -> str | None:
    ends = (f"{tag}x", f"{tag}y")
    for ns in names:  # left by an earlier run killed before its clean-up (a pid is reused)
        _ip("netns", "del", ns)
    _ip("link", "del", ends[0])
    for ns in names:
        r = _ip("netns", "add", ns)
        if r.returncode != 0:
            return f"ip netns add failed: {r.stderr.strip()}"
        made.append(ns)
    steps = [("link", "add", ends[0], "type", "veth", "peer", "name", ends[1])]
    for ns, end, addr in zip(names, ends, addrs, strict=True):
        steps += [("link", "set", end, "netns", ns), ("-n", ns, "addr", "add", f"{addr}/24", "dev", end),
                  ("-n", ns, "link", "set", end, "up"), ("-n", ns, "link", "set", "lo", "up")]
    for step in steps:
        r = _ip(*step)
        if r.returncode != 0:
            return f"ip {' '.join(step)} failed: {r.stderr.strip()}"
    return None
