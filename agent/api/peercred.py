"""Who is on the other end of a unix socket, and may they change what the node serves.

The kernel's SO_PEERCRED answer cannot be forged by the client, unlike anything in the request. Group
membership counts through the peer's primary gid, its supplementary groups as the kernel holds them for the
process (/proc/<pid>/status), or the group database, so `usermod -aG lynxtop alice` works without a re-login
being required for the agent to notice.
"""

from __future__ import annotations

import grp
import pwd
import socket
import struct
from dataclasses import dataclass
from pathlib import Path

_UCRED = struct.Struct("3i")  # struct ucred {pid_t pid; uid_t uid; gid_t gid;}


@dataclass(frozen=True)
class Peer:
    pid: int
    uid: int
    gid: int

    @property
    def user(self) -> str:
        try:
            return pwd.getpwuid(self.uid).pw_name
        except KeyError:
            return "?"

    def describe(self) -> str:
        """For event logs: 'uid 1000 (alice) pid 4242'."""
        return f"uid {self.uid} ({self.user}) pid {self.pid}"


def peer_of(sock: socket.socket | None) -> Peer | None:
    """The peer credentials of a connected unix socket; None when they cannot be read."""
    if sock is None or getattr(sock, "family", None) != socket.AF_UNIX:
        return None
    try:
        raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size)
    except OSError:
        return None
    pid, uid, gid = _UCRED.unpack(raw)
    return Peer(pid=pid, uid=uid, gid=gid)


def group_gid(group: str) -> int | None:
    try:
        return grp.getgrnam(group).gr_gid
    except KeyError:
        return None


def proc_groups(pid: int) -> set[int]:
    """Supplementary groups of a live process (empty when it is gone or unreadable)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("Groups:"):
                return {int(g) for g in line.split()[1:]}
    except (OSError, ValueError):
        pass
    return set()


def in_group(peer: Peer, gid: int) -> bool:
    if peer.gid == gid or gid in proc_groups(peer.pid):
        return True
    try:
        return peer.user in grp.getgrgid(gid).gr_mem
    except KeyError:
        return False


def may_control(peer: Peer | None, agent_uid: int, group: str) -> bool:
    """Root, the agent's own user, or a member of the operators' group."""
    if peer is None:
        return False
    if peer.uid in (0, agent_uid):
        return True
    gid = group_gid(group)
    return gid is not None and in_group(peer, gid)
