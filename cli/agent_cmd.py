"""`lynxtop agent`: load and check the config, set up logging and sd_notify, run the Node until a signal."""

from __future__ import annotations

import ctypes
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
from lynxtop.contract.terminal import terminal_safe


class _OneLineFormatter(logging.Formatter):
    """Each record one line with its control characters escaped (`terminal_safe`): messages carry foreign text
    (a board's UUID, a process title, vLLM's version or log lines), and a newline in one forged a journal line,
    an escape sequence reached the terminal `journalctl` runs in. A traceback, appended after, keeps its lines."""

    def formatMessage(self, record: logging.LogRecord) -> str:  # noqa: N802 - logging's name
        return terminal_safe(super().formatMessage(record))


def _setup_logging() -> None:
    # under systemd the journal adds timestamps; on a terminal we do
    fmt = "%(levelname)s %(name)s: %(message)s" if os.environ.get("JOURNAL_STREAM") else \
        "%(asctime)s %(levelname)s %(name)s: %(message)s"
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_OneLineFormatter(fmt))
    logging.basicConfig(level=logging.INFO, handlers=[handler])
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)


_M_ARENA_MAX = -8  # glibc's mallopt() parameter


def bound_malloc_arenas(arenas: int = 2) -> bool:
    """Let every thread share `arenas` malloc arenas (glibc; elsewhere nothing happens). True if set.

    glibc gives each thread that allocates an arena of its own (up to 8 per core) and each arena keeps what it
    held at its peak: the soak's agent climbed 55 -> 124 MB in 3 minutes that way while holding 27 MB of
    Python objects; with 2 arenas it stayed at 68 MB (docs/performance.md). Must run before threads start.
    An operator's MALLOC_ARENA_MAX is left to glibc.
    """
    if os.environ.get("MALLOC_ARENA_MAX"):
        return False
    try:
        return bool(ctypes.CDLL(None).mallopt(_M_ARENA_MAX, arenas))
    except (OSError, AttributeError):  # no C library with mallopt (not glibc)
        return False


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
    bound_malloc_arenas()  # before the node starts its threads
    notifier = Notifier.from_env()  # also removes the variables: no child inherits them
    node = Node(cfg, notifier)
    try:
        return run_loop(node.main())
    except AgentStartError as exc:
        print(f"lynxtop agent: {exc}", file=sys.stderr)
        notifier.stopping(f"failed to start: {exc}")
        return exc.exit_code  # 2: started the wrong way (as a configuration error), else 1
    except KeyboardInterrupt:
        return 130
