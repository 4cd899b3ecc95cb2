"""`lynxtop` / `lynxtop dashboard`: load the config, check for a terminal, run the dashboard app."""

from __future__ import annotations

import sys
from argparse import Namespace
from pathlib import Path

from lynxtop.cli.config_cli import load_or_exit
from lynxtop.tui.app import LynxtopApp


def run(args: Namespace) -> int:
    """`lynxtop` / `lynxtop dashboard`: open the dashboard on the configured socket and database."""
    cfg = load_or_exit(args)
    if cfg is None:
        return 2
    if not (sys.stdin.isatty() and sys.__stderr__ is not None and sys.__stderr__.isatty()):
        print("lynxtop: the dashboard needs a terminal (stdin and stderr); for plain text use "
              "`lynxtop status` or `lynxtop runs`", file=sys.stderr)
        return 2
    socket_path = Path(args.socket) if getattr(args, "socket", None) else cfg.agent.socket
    database = Path(args.database) if getattr(args, "database", None) else cfg.agent.database
    app = LynxtopApp(socket_path, database, readonly=bool(getattr(args, "readonly", False)),
                     utc=bool(getattr(args, "utc", False)))
    app.run()
    return int(app.return_code or 0)
