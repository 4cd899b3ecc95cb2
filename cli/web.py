"""`lynxtop dashboard --web HOST:PORT`: the same dashboard in a browser, served by textual-serve.

Each browser tab gets its own dashboard process (textual-serve's model), run as the invoking user with Textual's
web driver. Three things differ from textual-serve's defaults, on purpose:
- no shell: textual-serve starts its app with `create_subprocess_shell(command)`; here the dashboard is an argv
  started with `create_subprocess_exec` (project rule: no shell ever starts a process, so no quoting of a path
  with a space or a `;` in it can run anything);
- loopback only: `--web` refuses an address that is not loopback (reach it with `ssh -L`); another address must
  be named with `--web-listen`, since anyone who reaches the port sees the node;
- read-only: anyone who can reach the port acts as the invoking user, so the served dashboard cannot start, stop,
  restart or switch unless `--web-control` is given and the invoking user passes the control socket's own check
  (root, the agent's user, or the operators' group).
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import os
import shlex
import signal
import sys
from argparse import Namespace
from pathlib import Path
from typing import Any

WEB_DRIVER = "textual.drivers.web_driver:WebDriver"  # what textual-serve sets TEXTUAL_DRIVER to in the app's env
READONLY_REASON = "web: read-only unless --web-control"
STOP_GRACE_S = 5.0  # a dashboard that has not left this long after its tab closed is killed


class WebUsageError(Exception):
    """A bad --web/--web-listen/--web-control: the message says what and how to fix it."""


def served_by_web() -> bool:
    """True in a dashboard that textual-serve started: its terminal is the browser, stdin a pipe."""
    return os.environ.get("TEXTUAL_DRIVER") == WEB_DRIVER


def parse_address(text: str, option: str, *, loopback_only: bool) -> tuple[str, int]:
    """(host, port) of HOST:PORT or [IPv6]:PORT; WebUsageError names what is wrong."""
    host, sep, port_text = text.rpartition(":")
    if not sep or not host or not port_text.isdigit():
        raise WebUsageError(f"{option} {text!r} is not HOST:PORT (for example 127.0.0.1:8765)")
    port = int(port_text)
    if not 0 < port < 65536:
        raise WebUsageError(f"{option} {text!r}: port {port} is out of range (1..65535)")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not loopback_only:
        return host, port
    if host == "localhost":
        return host, port
    try:
        loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:
        raise WebUsageError(f"{option} {text!r}: give a loopback IP address (127.0.0.1 or [::1]); to serve on "
                            f"another address name it with --web-listen {text}") from None
    if not loopback:
        raise WebUsageError(f"{option} {text!r} is not a loopback address: the web dashboard listens on loopback "
                            f"only (reach it over `ssh -L {port}:127.0.0.1:{port} NODE`); to serve on {host} anyway "
                            f"name it with --web-listen {text}")
    return host, port


def control_refusal(socket_path: Path, group: str) -> str | None:
    """Why the invoking user may not control the agent on `socket_path` (the socket's own rule: root, the agent's
    user, or a member of `group`), or None when they may."""
    from lynxtop.agent.api.peercred import Peer, may_control

    try:
        agent_uid = socket_path.stat().st_uid  # the agent made the socket: it owns it
    except OSError as exc:
        return f"cannot tell who runs the agent: {socket_path}: {exc.strerror or exc}"
    me = Peer(pid=os.getpid(), uid=os.getuid(), gid=os.getgid())
    if may_control(me, agent_uid, group):
        return None
    return (f"{me.describe()} may not control the agent on {socket_path} (control needs root, the agent's user "
            f"uid {agent_uid}, or group {group!r})")


def dashboard_argv(args: Namespace, socket_path: Path, database: Path, *, control: bool) -> list[str]:
    """The served dashboard as an argv: this Python, the same config, socket and database, read-only unless
    `control`."""
    argv = [sys.executable, "-m", "lynxtop", "dashboard", "--socket", str(socket_path), "--database", str(database)]
    if getattr(args, "config", None):
        argv += ["--config", str(args.config)]
    if getattr(args, "utc", False):
        argv.append("--utc")
    if getattr(args, "node_port", None):
        argv += ["--node-port", str(args.node_port)]
    if getattr(args, "node_token_file", None):  # the path only: the served dashboard reads the token itself
        argv += ["--node-token-file", str(args.node_token_file)]
    if not control:
        argv.append("--readonly")
    return argv


def make_server(argv: list[str], host: str, port: int, title: str = "lynxtop") -> Any:
    """A textual-serve Server that starts `argv` without a shell (imported here: only --web pays for it)."""
    from textual_serve.app_service import AppService
    from textual_serve.server import Server

    class ArgvAppService(AppService):
        """textual-serve's app process, started from an argv with no shell in between."""

        async def _open_app_process(self, width: int = 80, height: int = 24) -> asyncio.subprocess.Process:
            env = self._build_environment(width=width, height=height)
            self._process = process = await asyncio.create_subprocess_exec(
                *argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE, env=env)
            assert process.stdin is not None
            self._stdin = process.stdin
            return process

        async def stop(self) -> None:
            """textual-serve asks the app to quit and waits for its reader; a dashboard that does not leave is
            killed, so a closed tab never leaves a process behind."""
            with contextlib.suppress(Exception):
                await asyncio.wait_for(super().stop(), STOP_GRACE_S)
            proc = self._process
            if proc is not None and proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                await proc.wait()

    class ArgvServer(Server):
        async def run_until_stopped(self) -> None:
            """Listen, say where (only once bound), serve until SIGINT or SIGTERM, then end every tab's dashboard
            (textual-serve's serve() prints its banner before binding and sets up logging of its own)."""
            from aiohttp import web

            runner = web.AppRunner(await self._make_app(), handle_signals=False, access_log=None)
            await runner.setup()
            try:
                await web.TCPSite(runner, host, port).start()
                print(f"lynxtop: serving the dashboard on http://{_url_host(host)}:{port} (Ctrl-C stops)",
                      flush=True)
                stop = asyncio.Event()
                loop = asyncio.get_running_loop()
                for sig in (signal.SIGINT, signal.SIGTERM):
                    loop.add_signal_handler(sig, stop.set)
                await stop.wait()
            finally:
                await runner.cleanup()

        async def on_startup(self, app: Any) -> None:
            self.sockets: set[Any] = set()  # textual-serve's banner is not printed

        async def on_shutdown(self, app: Any) -> None:
            # Open tabs end now (each then stops its dashboard), not after aiohttp's minute of grace.
            from aiohttp import WSCloseCode

            for ws in list(self.sockets):
                await ws.close(code=WSCloseCode.GOING_AWAY, message=b"lynxtop dashboard server stopping")

        async def handle_websocket(self, request: Any) -> Any:
            # textual-serve's handler with ArgvAppService in place of AppService (it has no hook for the class)
            from aiohttp import web
            from textual_serve.server import to_int

            websocket = web.WebSocketResponse(heartbeat=15)
            width = to_int(request.query.get("width", "80"), 80)
            height = to_int(request.query.get("height", "24"), 24)
            service: ArgvAppService | None = None
            self.sockets.add(websocket)
            try:
                await websocket.prepare(request)
                service = ArgvAppService(shlex.join(argv), write_bytes=websocket.send_bytes,
                                         write_str=websocket.send_str, close=websocket.close,
                                         download_manager=self.download_manager, debug=self.debug)
                await service.start(width, height)
                await self._process_messages(websocket, service)
            except asyncio.CancelledError:
                await websocket.close()
            except Exception as exc:  # noqa: BLE001 - one tab's failure is logged, the server goes on
                print(f"lynxtop: web session ended: {type(exc).__name__}: {exc}", file=sys.stderr)
            finally:
                self.sockets.discard(websocket)
                if service is not None:
                    await service.stop()
            return websocket

        async def handle_index(self, request: Any) -> Any:
            # The page's websocket URL from the address the browser used (an `ssh -L 9000:127.0.0.1:8765` tunnel
            # reaches it as localhost:9000), not from the address the server listens on.
            self.public_url = f"{request.scheme}://{request.host}"
            return await super().handle_index(request)

    return ArgvServer(shlex.join(argv), host=host, port=port, title=title)


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def serve(args: Namespace, socket_path: Path, database: Path, group: str) -> int:
    """Check the options, then serve until Ctrl-C or SIGTERM. Exit 2 for a usage error, 1 when it cannot listen."""
    try:
        if getattr(args, "web_listen", None):
            host, port = parse_address(args.web_listen, "--web-listen", loopback_only=False)
        else:
            host, port = parse_address(args.web, "--web", loopback_only=True)
        control = bool(getattr(args, "web_control", False))
        if control and getattr(args, "readonly", False):
            raise WebUsageError("--web-control and --readonly contradict each other; give one")
        if control and (why := control_refusal(socket_path, group)) is not None:
            raise WebUsageError(f"--web-control refused: {why}; serve read-only (leave out --web-control)")
    except WebUsageError as exc:
        print(f"lynxtop dashboard: error: {exc}", file=sys.stderr)
        return 2
    argv = dashboard_argv(args, socket_path, database, control=control)
    if getattr(args, "web_listen", None):
        print(f"lynxtop: warning: serving on {host}, not loopback: anyone who reaches port {port} sees this node"
              + ("" if control else " (read-only)"), file=sys.stderr)
    server = make_server(argv, host, port)
    try:
        asyncio.run(server.run_until_stopped())
    except OSError as exc:
        print(f"lynxtop dashboard: cannot listen on {_url_host(host)}:{port}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    return 0
