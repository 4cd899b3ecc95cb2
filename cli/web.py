"""`lynxtop dashboard --web HOST:PORT`: the same dashboard in a browser, served by textual-serve.

Each browser tab gets its own dashboard process (textual-serve's model), run as the invoking user with Textual's
web driver. What differs from textual-serve's defaults, on purpose:
- no shell: textual-serve starts its app with `create_subprocess_shell(command)`; here the dashboard is an argv
  started with `create_subprocess_exec` (project rule: no shell ever starts a process, so no quoting of a path
  with a space or a `;` in it can run anything);
- loopback only: `--web` refuses an address that is not loopback (reach it with `ssh -L`); a name is resolved and
  refused unless every address it resolves to is loopback, and those addresses are bound, never the name; another
  address must be named with `--web-listen`, since anyone who reaches the port sees the node;
- only the page's own origin: a web page the operator visits can reach a loopback port (through the `ssh -L`
  tunnel too: browsers apply no CORS to websockets, and a DNS-rebound name arrives as `Host: evil.example`). A
  request whose Host is not a loopback name (or the one --web-listen named) is refused, and so is a websocket
  whose Origin is not the page's own; both before any dashboard process starts;
- read-only: anyone who can reach the port acts as the invoking user, so the served dashboard cannot start, stop,
  restart or switch, nor write an export, unless `--web-control` is given and the invoking user passes the control
  socket's own check (root, the agent's user, or the operators' group). With --web-control the page address
  holds a random token, printed once on the terminal (as Jupyter does), which the page and its websocket need;
- bounded: at most MAX_SESSIONS dashboards at once, the terminal size a tab asks for clamped, and the listener has
  a header timeout and a connection cap (the agent's ConnectionGuard, agent/api/connguard.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import ipaddress
import os
import secrets
import shlex
import signal
import socket
import sys
from argparse import Namespace
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

READONLY_REASON = "web: read-only unless --web-control"
STOP_GRACE_S = 5.0  # a dashboard that has not left this long after its tab closed is killed
MAX_SESSIONS = 4  # dashboards (one process, ~50 MB and a poll of the agent a second, each) at once
MAX_COLUMNS, MAX_ROWS = 500, 200  # the largest terminal a tab may ask for: 1500x1500 took 80 MiB, 1 MB/s of frames
WEB_REQUEST_TIMEOUT_S = 10.0  # a connection without a complete request this long is closed (the agent's default)
WEB_MAX_CONNECTIONS = 32  # connections at once: a page load takes a few, each tab's websocket one
TOKEN_BYTES = 24  # --web-control's page token: 32 URL-safe characters


class WebUsageError(Exception):
    """A bad --web/--web-listen/--web-control: the message says what and how to fix it."""


def is_loopback(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    """Loopback, counting the IPv4-mapped form (::ffff:127.0.0.1), which Python 3.11's is_loopback does not."""
    if ip.is_loopback:
        return True
    mapped = getattr(ip, "ipv4_mapped", None)
    return mapped is not None and mapped.is_loopback


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
        return host, port  # resolved and checked by listen_addresses
    try:
        loopback = is_loopback(ipaddress.ip_address(host))
    except ValueError:
        raise WebUsageError(f"{option} {text!r}: give a loopback IP address (127.0.0.1 or [::1]); to serve on "
                            f"another address name it with --web-listen {text}") from None
    if not loopback:
        raise WebUsageError(f"{option} {text!r} is not a loopback address: the web dashboard listens on loopback "
                            f"only (reach it over `ssh -L {port}:127.0.0.1:{port} NODE`); to serve on {host} anyway "
                            f"name it with --web-listen {text}")
    return host, port


def _bindable(address: str) -> str:
    """An IPv4-mapped address as its IPv4 form: a v6-only socket cannot bind ::ffff:127.0.0.1."""
    try:
        mapped = getattr(ipaddress.ip_address(address), "ipv4_mapped", None)
    except ValueError:
        return address
    return str(mapped) if mapped is not None else address


def listen_addresses(host: str, port: int, option: str, *, loopback_only: bool) -> list[str]:
    """The IP addresses to bind for `host`: itself if it is one, else what it resolves to. With `loopback_only`,
    a name that resolves to any address that is not loopback is refused (an /etc/hosts that maps localhost
    elsewhere): binding the name would listen there."""
    try:
        ipaddress.ip_address(host)
    except ValueError:
        pass
    else:
        return [_bindable(host)]
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError) as exc:
        raise WebUsageError(f"{option}: cannot resolve {host!r}: {getattr(exc, 'strerror', None) or exc}") from None
    found: list[str] = []
    for *_, sockaddr in infos:
        if str(sockaddr[0]) not in found:
            found.append(str(sockaddr[0]))
    if loopback_only:
        bad = [a for a in found if not is_loopback(ipaddress.ip_address(a.partition("%")[0]))]
        if bad:
            raise WebUsageError(f"{option} {host!r} resolves to {', '.join(bad)}, which is not loopback (check "
                                f"/etc/hosts or the resolver); give 127.0.0.1 or [::1], or name an address to serve "
                                f"on with --web-listen")
    addresses: list[str] = []
    for a in map(_bindable, found):
        if a not in addresses:
            addresses.append(a)
    if not addresses:
        raise WebUsageError(f"{option}: {host!r} resolves to no address")
    return addresses


def split_authority(text: str) -> tuple[str, int | None] | None:
    """(host, port or None) of a Host header or an Origin's host[:port], lower-cased, a trailing dot dropped;
    None when it is not one."""
    text = text.strip().lower()
    if text.startswith("["):
        close = text.find("]")
        if close < 0:
            return None
        host, rest = text[1:close], text[close + 1:]
        if rest and not rest.startswith(":"):
            return None
        port_text = rest[1:]
    else:
        host, _, port_text = text.partition(":")
        if ":" in port_text:
            return None  # an IPv6 address without brackets is no Host
    port = None
    if port_text:
        if not (port_text.isascii() and port_text.isdigit() and len(port_text) <= 5):
            return None
        port = int(port_text)
    host = host.rstrip(".")
    return (host, port) if host else None


def _browser_like(headers: Mapping[str, str]) -> bool:
    """A browser's request: a page's websocket always carries an Origin, so one without is forged or broken."""
    if any(k in headers for k in ("Sec-Fetch-Site", "Sec-Fetch-Mode", "Sec-Fetch-Dest")):
        return True
    return headers.get("User-Agent", "").startswith("Mozilla/")


def _default_port(scheme: str) -> int:
    return 443 if scheme in ("https", "wss") else 80


class RequestGate:
    """Who reaches the served dashboard: the Host a request names, a websocket's Origin, --web-control's token.

    Why: a web page in the operator's browser can reach a loopback port (through `ssh -L` too). A DNS-rebound
    name (evil.example resolved to 127.0.0.1) arrives as its own Host, which no loopback name matches; a
    cross-site page's websocket carries its own Origin, which is not the Host the page was served from. A loopback
    name is served on any port: a tunnel's local port (`ssh -L 9000:127.0.0.1:8765`) differs from the served one,
    and no page of another site can make a browser send it. IP literals cannot be rebound either: --web-listen
    accepts any, --web loopback ones.
    """

    def __init__(self, names: Iterable[str], *, any_ip: bool, token: str | None):
        self.names = frozenset(n.lower().rstrip(".") for n in names if n)
        self.any_ip = any_ip
        self.token = token

    def host_refusal(self, host_header: str | None) -> str | None:
        """Why a request naming `host_header` is refused (the text says nothing of what it named), or None."""
        parsed = split_authority(host_header) if host_header else None
        if parsed is not None and self._host_ok(parsed[0]):
            return None
        other = ", or this node's IP address" if self.any_ip else ""
        return ("refused: the request's Host is not this dashboard's address: open it as http://localhost:PORT, "
                f"http://127.0.0.1:PORT or http://[::1]:PORT (over `ssh -L` from another machine){other}. A page of "
                "another site may not reach the dashboard.")

    def _host_ok(self, host: str) -> bool:
        if host in self.names:
            return True
        try:
            ip = ipaddress.ip_address(host)
        except ValueError:
            return False
        return self.any_ip or is_loopback(ip)

    def websocket_refusal(self, headers: Mapping[str, str], scheme: str, token: str | None) -> tuple[str, str] | None:
        """(kind, what) of a websocket refused, or None: not from the page's own origin, or without the token."""
        origin = headers.get("Origin")
        if origin is None:
            if _browser_like(headers):
                return "origin", "a browser's websocket without an Origin header"
        elif not self.same_origin(origin, headers.get("Host", ""), scheme):
            return "origin", (f"a websocket from another origin ({ascii(origin[:100])}): only the dashboard's own "
                              "page may open one")
        if self.token is not None and not self.token_ok(token):
            return "token", ("a websocket without the token: this dashboard serves controls (--web-control), open "
                             "the address printed where `lynxtop dashboard --web` runs")
        return None

    @staticmethod
    def same_origin(origin: str, host_header: str, scheme: str) -> bool:
        """The Origin names the Host the request was sent to (scheme-less host and port, default ports filled in;
        a Host without a port takes any default, for a TLS proxy in front)."""
        o_scheme, sep, rest = origin.partition("://")
        o_scheme = o_scheme.lower()
        if not sep or o_scheme not in ("http", "https"):
            return False
        o, h = split_authority(rest), split_authority(host_header)
        if o is None or h is None or o[0] != h[0]:
            return False
        if o[1] is None and h[1] is None:
            return True
        return (o[1] or _default_port(o_scheme)) == (h[1] or _default_port(scheme))

    def token_ok(self, given: str | None) -> bool:
        """The token matches (compared in constant time), or none is needed."""
        if self.token is None:
            return True
        return given is not None and hmac.compare_digest(given.encode(), self.token.encode())


def terminal_size(query: Mapping[str, str]) -> tuple[int, int] | str:
    """(columns, rows) a tab asks for, clamped to MAX_COLUMNS x MAX_ROWS; what is wrong when one is not a number."""
    size: list[int] = []
    for key, default, top in (("width", 80, MAX_COLUMNS), ("height", 24, MAX_ROWS)):
        text = query.get(key)
        if text is None:
            size.append(default)
            continue
        if not (text.isascii() and text.isdigit()):
            return f"refused: {key} {ascii(text[:20])} is not a whole number of cells"
        size.append(max(1, min(top, top if len(text) > 6 else int(text))))
    return size[0], size[1]


def clamp_size(width: object, height: object) -> tuple[int, int] | None:
    """A resize message's size clamped to 1..MAX_COLUMNS x 1..MAX_ROWS; None when it is not two integers."""
    if type(width) is not int or type(height) is not int:
        return None
    return max(1, min(MAX_COLUMNS, width)), max(1, min(MAX_ROWS, height))


def _web_words(text: str) -> str:
    """The agent's connection guard names its [agent] settings; here they are this module's constants."""
    text = text.replace("[agent] request_timeout_s", "cli/web.py WEB_REQUEST_TIMEOUT_S")
    return text.replace("[agent] ", "cli/web.py ")


def _say(message: str) -> None:
    print(f"lynxtop: {_web_words(message)}", file=sys.stderr, flush=True)


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


def make_server(argv: list[str], host: str, port: int, title: str = "lynxtop", *,
                addresses: list[str] | None = None, token: str | None = None, public: bool = False,
                max_sessions: int = MAX_SESSIONS) -> Any:
    """A textual-serve Server that starts `argv` without a shell, for requests that pass a RequestGate, at most
    `max_sessions` at once (imported here: only --web pays for it). `addresses` are bound (default: `host`);
    `public` (--web-listen) accepts any IP literal and this node's name as Host; `token` (--web-control) is needed
    by the page and its websocket."""
    import aiohttp_jinja2
    import jinja2
    from aiohttp import WSCloseCode, web
    from textual_serve.app_service import AppService
    from textual_serve.server import Server, to_int

    from lynxtop.agent.api.connguard import ConnectionGuard, GuardedSite, handler_args

    names = {"localhost", host} | ({socket.gethostname()} if public else set())
    gate = RequestGate(names, any_ip=public, token=token)
    full = f"lynxtop: {max_sessions} dashboard tabs are open, the most this server runs; close one and reload"

    class WebGuard(ConnectionGuard):
        """The agent's connection guard; its 503 names this module's constants, not the agent's settings."""

        def refusal(self, why: str) -> bytes:
            return super().refusal(_web_words(why))

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

        async def set_terminal_size(self, width: Any, height: Any) -> None:
            """A tab's resize, clamped as its first size was; one that is not two integers is dropped."""
            size = clamp_size(width, height)
            if size is not None:
                await super().set_terminal_size(*size)

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
        def __init__(self) -> None:
            super().__init__(shlex.join(argv), host=host, port=port, title=title)
            self.gate = gate
            self.sessions = 0  # dashboards running or stopping: a slot is freed once its process has ended
            self.sockets: set[Any] = set()
            self.guard = WebGuard("lynxtop web dashboard", WEB_MAX_CONNECTIONS, WEB_REQUEST_TIMEOUT_S,
                                  "WEB_MAX_CONNECTIONS", json_refusal=False, log=_say,
                                  per_client=WEB_MAX_CONNECTIONS)  # a tunnel's connections all come from loopback

        def note(self, kind: str, message: str) -> None:
            """A refusal said on stderr once per episode (a page that retries in a loop does not flood it)."""
            episodes = self.guard.episodes
            key = f"web.refused.{kind}"
            if not episodes.again(key):
                episodes.hit(key, message, quiet_single=True)
                self.guard._want(self.guard.clock() + episodes.quiet_s)  # its end is said by a sweep

        async def _make_app(self) -> Any:
            """textual-serve's routes behind the connection guard and the gate; the websocket route holds the
            token when there is one."""

            @web.middleware
            async def check_host(request: web.Request, handler: Any) -> web.StreamResponse:
                why = self.gate.host_refusal(request.headers.get("Host"))
                if why is not None:
                    self.note("host", "refusing requests whose Host is not this dashboard's address (a page of "
                              f"another site, DNS rebinding); the first named {ascii(request.headers.get('Host'))}")
                    return web.Response(status=403, text=f"lynxtop: {why}\n")
                return await handler(request)

            app = web.Application(middlewares=[self.guard.middleware, check_host])
            aiohttp_jinja2.setup(app, loader=jinja2.FileSystemLoader(self.templates_path))
            app.add_routes([
                web.get("/", self.handle_index),
                web.get("/ws", self.handle_websocket),
                web.get("/ws/{token}", self.handle_websocket),
                web.get("/download/{key}", self.handle_download),
                web.static("/static", self.statics_path),
            ])
            app.on_shutdown.append(self.on_shutdown)
            return app

        async def start(self) -> Any:
            """Bind every address through the connection guard (header timeout, cap); the runner to clean up."""
            runner = web.AppRunner(await self._make_app(), handle_signals=False, access_log=None,
                                   **handler_args(WEB_REQUEST_TIMEOUT_S))
            await runner.setup()
            try:
                for address in addresses or [host]:
                    await GuardedSite(runner, self.guard, host=address, port=port).start()
            except BaseException:
                await runner.cleanup()
                raise
            return runner

        async def run_until_stopped(self) -> None:
            """Listen, say where (only once bound), serve until SIGINT or SIGTERM, then end every tab's dashboard
            (textual-serve's serve() prints its banner before binding and sets up logging of its own)."""
            runner = await self.start()
            try:
                where = f"http://{_url_host(host)}:{port}"
                if token is None:
                    print(f"lynxtop: serving the dashboard on {where} (Ctrl-C stops)", flush=True)
                else:  # the one place the token is written: the terminal of who started it
                    print(f"lynxtop: serving the dashboard with controls; open {where}/?token={token} (the token "
                          "is the key to the controls: keep it to yourself; Ctrl-C stops)", flush=True)
                stop = asyncio.Event()
                loop = asyncio.get_running_loop()
                for sig in (signal.SIGINT, signal.SIGTERM):
                    loop.add_signal_handler(sig, stop.set)
                await stop.wait()
            finally:
                await runner.cleanup()

        async def on_shutdown(self, app: Any) -> None:
            # Open tabs end now (each then stops its dashboard), not after aiohttp's minute of grace.
            for ws in list(self.sockets):
                with contextlib.suppress(Exception):
                    await ws.close(code=WSCloseCode.GOING_AWAY, message=b"lynxtop dashboard server stopping")

        async def handle_websocket(self, request: web.Request) -> web.StreamResponse:
            """textual-serve's handler with ArgvAppService (it has no hook for the class), behind the gate's
            Origin and token checks, a clamped size and the session cap: a refused one starts no process."""
            if self.gate.token is None and "token" in request.match_info:
                raise web.HTTPNotFound()
            refused = self.gate.websocket_refusal(request.headers, request.scheme, request.match_info.get("token"))
            if refused is not None:
                kind, what = refused
                self.note(kind, f"refused {what}")
                return web.Response(status=403, text=f"lynxtop: refused {what}\n")
            size = terminal_size(request.query)
            if isinstance(size, str):
                return web.Response(status=400, text=f"lynxtop: {size}\n")
            websocket = web.WebSocketResponse(heartbeat=15)
            if self.sessions >= max_sessions:
                self.note("full", f"refusing tabs: {max_sessions} dashboards are running (cli/web.py MAX_SESSIONS)")
                await websocket.prepare(request)
                await websocket.close(code=WSCloseCode.TRY_AGAIN_LATER, message=full.encode())
                return websocket
            self.sessions += 1
            service: ArgvAppService | None = None
            self.sockets.add(websocket)
            try:
                await websocket.prepare(request)
                service = ArgvAppService(shlex.join(argv), write_bytes=websocket.send_bytes,
                                         write_str=websocket.send_str, close=websocket.close,
                                         download_manager=self.download_manager, debug=self.debug)
                await service.start(*size)
                await self._process_messages(websocket, service)
            except asyncio.CancelledError:
                await websocket.close()
            except Exception as exc:  # noqa: BLE001 - one tab's failure is logged, the server goes on
                print(f"lynxtop: web session ended: {type(exc).__name__}: {exc}", file=sys.stderr)
            finally:
                self.sockets.discard(websocket)
                try:
                    if service is not None:
                        await service.stop()
                finally:
                    self.sessions -= 1
            return websocket

        async def handle_index(self, request: web.Request) -> web.StreamResponse:
            """textual-serve's page, its websocket URL from the address the browser used (an `ssh -L
            9000:127.0.0.1:8765` tunnel reaches it as localhost:9000; the gate has checked that Host), with the
            token when there is one. Never framed, never cached, no Referer (the address may hold the token)."""
            headers = {"Cache-Control": "no-store", "Referrer-Policy": "no-referrer", "X-Frame-Options": "DENY",
                       "Content-Security-Policy": "frame-ancestors 'none'"}
            if not self.gate.token_ok(request.query.get("token")):
                return web.Response(status=403, headers=headers, text=(
                    "lynxtop: this dashboard serves controls (--web-control): open the address printed where "
                    "`lynxtop dashboard --web` was started; it holds ?token=...\n"))
            if self.sessions >= max_sessions:
                return web.Response(status=503, headers={**headers, "Retry-After": "5"}, text=full + "\n")
            base = f"{request.scheme}://{request.headers['Host']}"
            ws_base = ("wss" if request.scheme == "https" else "ws") + base[base.index(":"):]
            context = {
                "font_size": max(6, min(64, to_int(request.query.get("fontsize", "16"), 16))),
                "app_websocket_url": ws_base + ("/ws" if self.gate.token is None else f"/ws/{self.gate.token}"),
                "config": {"static": {"url": f"{base}/static/"}},
                "application": {"name": self.title},
            }
            response = aiohttp_jinja2.render_template("app_index.html", request, context)
            response.headers.update(headers)
            return response

    return ArgvServer()


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def serve(args: Namespace, socket_path: Path, database: Path, group: str) -> int:
    """Check the options, then serve until Ctrl-C or SIGTERM. Exit 2 for a usage error, 1 when it cannot listen."""
    public = bool(getattr(args, "web_listen", None))
    try:
        text, option = (args.web_listen, "--web-listen") if public else (args.web, "--web")
        host, port = parse_address(text, option, loopback_only=not public)
        addresses = listen_addresses(host, port, option, loopback_only=not public)
        control = bool(getattr(args, "web_control", False))
        if control and getattr(args, "readonly", False):
            raise WebUsageError("--web-control and --readonly contradict each other; give one")
        if control and (why := control_refusal(socket_path, group)) is not None:
            raise WebUsageError(f"--web-control refused: {why}; serve read-only (leave out --web-control)")
    except WebUsageError as exc:
        print(f"lynxtop dashboard: error: {exc}", file=sys.stderr)
        return 2
    argv = dashboard_argv(args, socket_path, database, control=control)
    if public:
        print(f"lynxtop: warning: serving on {host}, not loopback: anyone who reaches port {port} sees this node"
              + ("" if control else " (read-only)"), file=sys.stderr)
    # read-only needs no token: the gate keeps other sites out, and a local user who reaches the port sees what
    # `lynxtop status` shows them; controls need the token, so that no one but who started it can drive them
    token = secrets.token_urlsafe(TOKEN_BYTES) if control else None
    server = make_server(argv, host, port, addresses=addresses, token=token, public=public)
    try:
        asyncio.run(server.run_until_stopped())
    except OSError as exc:
        print(f"lynxtop dashboard: cannot listen on {_url_host(host)}:{port}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    return 0
