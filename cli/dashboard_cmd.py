"""`lynxtop` / `lynxtop dashboard`: load the config, check for a terminal, run the dashboard app (or serve it to a
browser with --web, cli/web.py)."""

from __future__ import annotations

import gc
import os
import sys
from argparse import Namespace
from collections.abc import Mapping
from pathlib import Path
from types import ModuleType

from lynxtop.cli.config_cli import load_or_exit


def run(args: Namespace) -> int:
    """`lynxtop` / `lynxtop dashboard`: open the dashboard on the configured socket and database."""
    cfg = load_or_exit(args)
    if cfg is None:
        return 2
    socket_path = Path(args.socket) if getattr(args, "socket", None) else cfg.agent.socket
    database = Path(args.database) if getattr(args, "database", None) else cfg.agent.database
    if getattr(args, "web", None) or getattr(args, "web_listen", None):
        from lynxtop.cli import web

        return web.serve(args, socket_path, database, cfg.agent.socket_group)
    if getattr(args, "web_control", False):
        print("lynxtop dashboard: error: --web-control applies only with --web or --web-listen", file=sys.stderr)
        return 2
    # textual-serve started this one: the browser is the terminal (tui/served.py: stdlib only)
    from lynxtop.tui.served import served_by_web

    in_browser = served_by_web()
    if not in_browser and not (sys.stdin.isatty() and sys.__stderr__ is not None and sys.__stderr__.isatty()):
        print("lynxtop: the dashboard needs a terminal (stdin and stderr); for plain text use "
              "`lynxtop status` or `lynxtop runs`", file=sys.stderr)
        return 2
    problem = None if in_browser else term_problem(os.environ)
    if problem:
        print(f"lynxtop: {problem}: the full-screen dashboard cannot be drawn there; for plain text use "
              "`lynxtop status` or `lynxtop runs`, or set TERM to the terminal's type (TERM=xterm-256color, "
              "TERM=vt100; LYNXTOP_ASCII=1 where it has no UTF-8)", file=sys.stderr)
        return 2
    # The first status is asked for now, in a thread, and answered while Textual and the views import; the garbage
    # collector waits until the first frame is painted (the app resumes it): docs/dashboard.md, "Speed".
    gc.disable()
    try:
        from lynxtop.tui.source import LiveSource

        source = LiveSource(socket_path)
        source.prefetch_status()
        from lynxtop.tui.app import LynxtopApp

        readonly = bool(getattr(args, "readonly", False))
        app = LynxtopApp(socket_path, database, readonly=readonly, utc=bool(getattr(args, "utc", False)),
                         node_port=node_port(args, cfg.agent.metrics_listen), source=source, gc_paused=True,
                         node_token_file=getattr(args, "node_token_file", None) or cfg.agent.tcp_token_file)
        if in_browser and readonly:
            app.readonly_reason = _web().READONLY_REASON
        app.run()
    finally:
        gc.enable()
    return int(app.return_code or 0)


# Terminal types that say the terminal moves no cursor and clears nothing (terminfo's `dumb`; an unknown type is what
# some login paths set where none was passed)
DUMB_TERMS = frozenset({"dumb", "unknown"})


def term_problem(environ: Mapping[str, str]) -> str | None:
    """Why a terminal on stdin and stderr still cannot show the dashboard (None: it can): TERM unset or dumb (Emacs'
    shell, `ssh host cmd` under some wrappers, a CI runner's pty). The app would draw escape codes it has no
    right to send, kilobytes a second of garbage, and read keys as text."""
    term = environ.get("TERM", "").strip()
    if not term:
        return "TERM is not set"
    if term.lower() in DUMB_TERMS:
        return f"TERM={term}"
    return None


def _web() -> ModuleType:
    """cli/web.py, imported only where the web is involved."""
    from lynxtop.cli import web

    return web


def node_port(args: Namespace, metrics_listen: str) -> int | None:
    """Where the cluster view reads other nodes: --node-port, else the port of this config's metrics_listen (a
    fleet shares one config), else nowhere (the view says how to set it)."""
    if getattr(args, "node_port", None):
        return int(args.node_port)
    port = metrics_listen.rpartition(":")[2]
    return int(port) if port.isdigit() else None
