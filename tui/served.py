"""Whether this dashboard runs in a browser tab: textual-serve starts it with its web driver named in the
environment (cli/web.py serves it). Stdlib only, so a key press that asks pays nothing else."""

from __future__ import annotations

import os

WEB_DRIVER = "textual.drivers.web_driver:WebDriver"  # what textual-serve sets TEXTUAL_DRIVER to in the app's env


def served_by_web() -> bool:
    """True in a dashboard that textual-serve started: its terminal is the browser, stdin a pipe."""
    return os.environ.get("TEXTUAL_DRIVER") == WEB_DRIVER
