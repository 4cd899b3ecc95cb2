"""The control socket's path taken by someone's live socket is reported once and left alone while it answers; once
that process dies and leaves its socket file behind, dead, the agent reclaims its path within
TOLD_SOCKET_RECHECK checks (30 s), as it replaces any dead socket, so `lynxtop` and the dashboard reach it again
without a restart."""
from __future__ import annotations

import socket
import stat

from lynxtop.agent.api.routes import TOLD_SOCKET_RECHECK, ApiServer


def _answers(path) -> bool:
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(1)
    try:
        s.connect(str(path))
        return True
    except OSError:
        return False
    finally:
        s.close()


async def test_a_live_intruder_that_dies_leaves_a_dead_socket_the_agent_reclaims(sock_dir):
    path = sock_dir / "agent.sock"
    server = ApiServer(object(), path, group="nogroup-lynxtop-test", log=lambda m: None)
    await server.start()
    try:
        path.unlink()
        other = socket.socket(socket.AF_UNIX)  # someone's live socket in the agent's place
        other.bind(str(path))
        other.listen(8)
        ident = path.stat().st_ino
        res = server.check_socket()
        assert res is not None and res[0] is False and "another process" in res[1], res  # reported once
        for _ in range(3 * TOLD_SOCKET_RECHECK):  # probed again now and then, but still answering: left alone
            assert server.check_socket() is None
        assert path.stat().st_ino == ident and _answers(path)
        other.close()  # that process exits: its socket file stays, nobody listens on it any more
        assert not _answers(path)
        results = [server.check_socket() for _ in range(TOLD_SOCKET_RECHECK)]
        rebound = [r for r in results if r is not None]
        assert len(rebound) == 1 and rebound[0][0] is True and "no longer answers" in rebound[0][1], results
        assert _answers(path) and stat.S_IMODE(path.stat().st_mode) == 0o660  # the agent's own socket again
        assert server.check_socket() is None
    finally:
        await server.stop()


async def test_a_regular_file_in_the_sockets_place_is_never_removed(sock_dir):
    path = sock_dir / "agent.sock"
    server = ApiServer(object(), path, group="nogroup-lynxtop-test", log=lambda m: None)
    await server.start()
    try:
        path.unlink()
        path.write_text("someone's file\n")
        res = server.check_socket()
        assert res is not None and res[0] is False and "is not a socket" in res[1], res
        assert all(server.check_socket() is None for _ in range(3 * TOLD_SOCKET_RECHECK))
        assert path.read_text() == "someone's file\n"
    finally:
        await server.stop()
