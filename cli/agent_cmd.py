"""`lynxtop agent`: load and check the config, set up logging and sd_notify, run the Node until a signal."""

from __future__ import annotations

import dataclasses
import logging
import os
import sys
from argparse import Namespace
from pathlib import Path
from typing import Any

from lynxtop.agent.node import AgentStartError, Node
from lynxtop.agent.notify import Notifier
from lynxtop.cli.config_cli import load_or_exit
from lynxtop.contract.loop import run_loop


def _setup_logging() -> None:
    # under systemd the journal adds timestamps; on a terminal we do
    fmt = "%(levelname)s %(name)s: %(message)s" if os.environ.get("JOURNAL_STREAM") else \
        "%(asctime)s %(levelname)s %(name)s: %(message)s"
    logging.basicConfig(level=logging.INFO, format=fmt, stream=sys.stderr)
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)


def run(args: Namespace) -> int:
    """Handler of `lynxtop agent`."""
    cfg = load_or_exit(args)
    if cfg is None:
        return 2
    overrides: dict[str, Any] = {}
    if getattr(args, "socket", None):
        overrides["socket"] = Path(args.socket).expanduser().absolute()
    if getattr(args, "database", None):
        overrides["database"] = Path(args.database).expanduser().absolute()
    if overrides:
        cfg = dataclasses.replace(cfg, agent=dataclasses.replace(cfg.agent, **overrides))
    _setup_logging()
    notifier = Notifier.from_env()  # also removes the variables: no child inherits them
    node = Node(cfg, notifier)
    try:
        return run_loop(node.main())
    except AgentStartError as exc:
        print(f"lynxtop agent: {exc}", file=sys.stderr)
        notifier.stopping(f"failed to start: {exc}")
        return 1
    except KeyboardInterrupt:
        return 130
