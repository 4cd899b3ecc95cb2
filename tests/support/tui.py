"""The dashboard under test: an app with a frozen clock and fast polls, and its screen read as plain text."""

from __future__ import annotations

import io
import os
from pathlib import Path
from typing import Any

from rich.console import Console

from lynxtop.tui.app import LynxtopApp
from lynxtop.tui.backoff import Backoff
from support.status import T0
from support.waits import wait_for_async


def make_app(socket: Path, database: Path | None = None, **kw: Any) -> LynxtopApp:
    kw.setdefault("poll_interval_s", 0.25)
    kw.setdefault("backoff", Backoff(base_s=0.05, cap_s=0.2))
    kw.setdefault("clock", lambda: T0 / 1000 + 2)
    kw.setdefault("backfill", False)
    # the drawing under test whatever the runner's locale (tui/app.py ascii_default); LYNXTOP_ASCII still decides
    kw.setdefault("ascii_only", None if "LYNXTOP_ASCII" in os.environ else False)
    return LynxtopApp(socket, database, **kw)


Notices = list[tuple[str, str, str]]


def app_with_notices(socket: Path, **kw: Any) -> tuple[LynxtopApp, Notices]:
    """The app and every notification it shows, as (title, message, severity)."""
    app = make_app(socket, **kw)
    notices: Notices = []
    original = app.notify

    def spy(message: str, *a: Any, **kw: Any) -> None:
        notices.append((kw.get("title", ""), str(message), kw.get("severity", "information")))
        original(message, *a, **kw)

    app.notify = spy  # type: ignore[method-assign]
    return app, notices


def plain(renderable: Any, width: int = 200) -> str:
    """A widget's content as plain text, as a user would read it."""
    console = Console(width=width, file=io.StringIO(), color_system=None, force_terminal=False)
    console.print(renderable)
    return console.file.getvalue()


def text_of(widget: Any) -> str:
    from textual.widget import Widget

    if not isinstance(widget, Widget):
        return plain(widget)
    return plain(widget.content if hasattr(widget, "content") else widget.render())


async def wait_for(pilot: Any, predicate: Any, timeout_s: float = 30.0) -> None:
    """Pause the app under test until predicate() is true (the app keeps processing its messages meanwhile).

    The deadline is generous: it only bounds a failure, and CI's loaded 2-core machine runs the app slowly."""
    await wait_for_async(predicate, timeout_s, 0.03, "a condition on the dashboard", sleep=pilot.pause)


def words(text: str) -> str:
    """The text as one line of words: a wrapped sentence reads whole, wherever the screen's width broke it."""
    return " ".join(text.split())


def screen_text(app: Any) -> str:
    """The whole screen as plain text lines, as an operator sees it (modal layers included)."""
    strips = app.screen._compositor.render_strips()
    return "\n".join("".join(seg.text for seg in strip).rstrip() for strip in strips)
