"""Stopping the control API removes the socket file only if the path still names the very file this agent bound:
same device and inode, read with lstat (the path itself, never what a symlink points to). A file that replaced it
(another agent's socket, a symlink, a file on another filesystem that happens to reuse the inode number) is left
where it is: unlinking it would cut that agent off from `lynxtop`."""

from __future__ import annotations

import os
import socket

import pytest

from lynxtop.agent.api.routes import ApiServer

pytestmark = pytest.mark.timeout(60)


class Ctl:
    pass


async def started(sock_dir) -> ApiServer:
    server = ApiServer(Ctl(), sock_dir / "agent.sock", group="users", log=lambda m: None)
    await server.start()
    return server


async def test_stop_removes_the_socket_it_bound(sock_dir):
    server = await started(sock_dir)
    await server.stop()
    assert not os.path.lexists(sock_dir / "agent.sock")


async def test_stop_leaves_a_symlink_in_its_place_even_to_its_own_socket(sock_dir):
    """stat() follows the link to the agent's own (moved) socket and sees its inode; lstat sees the link."""
    path = sock_dir / "agent.sock"
    server = await started(sock_dir)
    os.rename(path, sock_dir / "moved.sock")
    os.symlink(sock_dir / "moved.sock", path)
    await server.stop()
    assert os.path.islink(path)


async def test_stop_leaves_a_file_with_the_same_inode_on_another_device(sock_dir):
    """Identity is (device, inode): the inode number alone repeats across filesystems."""
    path = sock_dir / "agent.sock"
    server = await started(sock_dir)
    st = os.lstat(path)
    server._ident = (st.st_dev + 1, st.st_ino)  # the agent's socket was on another filesystem, same inode number
    await server.stop()
    assert os.path.lexists(path)


async def test_stop_leaves_another_agents_socket_that_replaced_it(sock_dir):
    path = sock_dir / "agent.sock"
    server = await started(sock_dir)
    os.unlink(path)
    other = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        other.bind(str(path))
        await server.stop()
        assert os.path.lexists(path)
    finally:
        other.close()
