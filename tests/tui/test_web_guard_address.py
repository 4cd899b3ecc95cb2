"""`lynxtop dashboard --web HOST:PORT`: what "loopback" means (cli/web.py).

- a name is resolved and refused unless every address it resolves to is loopback; the server then binds those
  addresses, never the name (an /etc/hosts that maps localhost elsewhere made it listen there);
- the IPv4-mapped form of a loopback address ([::ffff:127.0.0.1]) is loopback (Python 3.11's is_loopback says no).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import aiohttp
import psutil
import pytest
from support.ports import free_port

from lynxtop.cli import web
from lynxtop.cli.web import WebUsageError, parse_address

pytestmark = pytest.mark.timeout(120)


def _cmd(tmp_path: Path, *extra: str) -> list[str]:
    cfg = tmp_path / "config.toml"
    cfg.write_text("")
    return [sys.executable, "-m", "lynxtop", "dashboard", "--config", str(cfg), "--socket",
            str(tmp_path / "no-agent.sock"), "--database", str(tmp_path / "none.db"), *extra]


def _stop(proc: subprocess.Popen) -> str:
    proc.terminate()
    try:
        _, err = proc.communicate(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate()
    return err


def test_the_ipv4_mapped_loopback_form_is_loopback():
    assert parse_address("[::ffff:127.0.0.1]:8765", "--web", loopback_only=True) == ("::ffff:127.0.0.1", 8765)
    assert parse_address("[::ffff:127.9.9.9]:8765", "--web", loopback_only=True)[1] == 8765
    with pytest.raises(WebUsageError, match="not a loopback address.*--web-listen"):
        parse_address("[::ffff:10.0.0.7]:8765", "--web", loopback_only=True)


def test_a_name_is_refused_unless_all_its_addresses_are_loopback(monkeypatch):
    """Resolution is checked, and what is bound is the addresses, never the name."""
    answers = {"localhost": ["127.0.0.1", "::1"], "twisted": ["127.0.0.1", "192.0.2.2"], "elsewhere": ["192.0.2.2"]}

    def fake(host, port, *a, **kw):
        if host not in answers:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return [(socket.AF_INET6 if ":" in a_ else socket.AF_INET, socket.SOCK_STREAM, 6, "",
                 (a_, port, 0, 0) if ":" in a_ else (a_, port)) for a_ in answers[host]]

    monkeypatch.setattr(web.socket, "getaddrinfo", fake)
    assert web.listen_addresses("localhost", 8765, "--web", loopback_only=True) == ["127.0.0.1", "::1"]
    for name in ("twisted", "elsewhere"):
        with pytest.raises(WebUsageError, match=f"{name}.*192.0.2.2.*not loopback.*/etc/hosts"):
            web.listen_addresses(name, 8765, "--web", loopback_only=True)
    with pytest.raises(WebUsageError, match="cannot resolve 'nowhere'"):
        web.listen_addresses("nowhere", 8765, "--web-listen", loopback_only=False)
    assert web.listen_addresses("elsewhere", 8765, "--web-listen", loopback_only=False) == ["192.0.2.2"]
    assert web.listen_addresses("::ffff:127.0.0.1", 8765, "--web", loopback_only=True) == ["127.0.0.1"]
    assert web.listen_addresses("::1", 8765, "--web", loopback_only=True) == ["::1"]


def _unshare_ok() -> str | None:
    if os.getuid() != 0:
        return "needs root for a private mount of /etc/hosts"
    if not shutil.which("unshare"):
        return "needs unshare(1)"
    probe = subprocess.run(["unshare", "-m", "true"], capture_output=True, timeout=10)
    return None if probe.returncode == 0 else f"unshare -m fails here: {probe.stderr.decode()[:200]}"


@pytest.mark.parametrize("hosts", ["192.0.2.2 localhost\n",
                                   "127.0.0.1 localhost\n::1 localhost\n192.0.2.2 localhost\n"])
def test_web_localhost_is_refused_when_etc_hosts_maps_it_elsewhere(tmp_path, hosts):
    """The auditors' case, for real: in a private mount namespace /etc/hosts maps localhost to 192.0.2.2. Refused
    with exit 2 naming the address, and nothing is served."""
    if (why := _unshare_ok()) is not None:
        pytest.skip(why)
    fake = tmp_path / "hosts"
    fake.write_text(hosts)
    port = free_port()
    argv = _cmd(tmp_path, "--web", f"localhost:{port}")
    script = 'mount --bind "$1" /etc/hosts && shift && exec "$@"'
    proc = subprocess.run(["unshare", "-m", "sh", "-c", script, "sh", str(fake), *argv], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    assert "192.0.2.2" in proc.stderr and "not loopback" in proc.stderr and "Traceback" not in proc.stderr
    assert "serving" not in proc.stdout


async def test_web_localhost_binds_its_loopback_addresses_only(tmp_path):
    port = free_port()
    expected = {info[4][0] for info in socket.getaddrinfo("localhost", port, type=socket.SOCK_STREAM)}
    proc = subprocess.Popen(_cmd(tmp_path, "--web", f"localhost:{port}"), stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        assert f"http://localhost:{port}" in line, line + (proc.stderr.read() if proc.poll() is not None else "")
        listening = {c.laddr.ip for c in psutil.Process(proc.pid).net_connections("tcp")
                     if c.status == psutil.CONN_LISTEN and c.laddr.port == port}
        assert listening == expected, (listening, expected)
    finally:
        err = _stop(proc)
    assert "Traceback" not in err


async def test_web_serves_on_the_ipv4_mapped_loopback_form(tmp_path):
    """`--web [::ffff:127.0.0.1]:PORT` was refused as not loopback; it serves on 127.0.0.1, and a browser that
    used that form in its address (Host: [::ffff:127.0.0.1]:PORT) gets the page."""
    port = free_port()
    proc = subprocess.Popen(_cmd(tmp_path, "--web", f"[::ffff:127.0.0.1]:{port}"), stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        assert f":{port}" in line and "serving" in line, line + (proc.stderr.read() if proc.poll() is not None else "")
        async with aiohttp.ClientSession() as s, \
                s.get(f"http://127.0.0.1:{port}/", headers={"Host": f"[::ffff:127.0.0.1]:{port}"}) as r:
            assert r.status == 200
    finally:
        err = _stop(proc)
    assert "Traceback" not in err
