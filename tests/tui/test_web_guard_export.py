"""The read-only web dashboard writes no file (tui/screens/history.py, cli/web.py).

Whoever reaches the web port acts as the user who started `--web`; History's `e` export wrote a CSV at any path
typed into it. Served to a browser without --web-control, the key only says why it is off. A local `--readonly`
terminal dashboard keeps export (it is the local user's own terminal), and so does a --web-control tab.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time

import aiohttp
import pytest
from support.ports import free_port
from support.tui import make_app, wait_for
from support.tui_keys import open_screen
from textual.widgets import DataTable, Input

from lynxtop.tui.screens.export_path import ExportPathScreen
from lynxtop.tui.screens.history import HistoryScreen
from lynxtop.tui.served import WEB_DRIVER

OFF = "export is off"  # the start of the notice


async def _press_export(app, pilot) -> HistoryScreen:
    screen = await open_screen(pilot, app, "4", HistoryScreen, connected=False)
    await wait_for(pilot, lambda: len(screen.runs) == 2)
    screen.query_one("#runs", DataTable).focus()
    await pilot.press("down", "e")
    return screen


async def test_the_web_served_read_only_dashboard_does_not_export(sock_dir, history_db, tmp_path, monkeypatch):
    monkeypatch.setenv("TEXTUAL_DRIVER", WEB_DRIVER)  # what textual-serve sets in the served dashboard's env
    db, _ = history_db
    app = make_app(sock_dir / "absent.sock", db, utc=True, readonly=True)
    async with app.run_test(size=(120, 36)) as pilot:
        await _press_export(app, pilot)
        await wait_for(pilot, lambda: any(OFF in n.message for n in app._notifications))
        await pilot.pause(0.3)
        assert not isinstance(app.screen, ExportPathScreen)
        notice = next(n.message for n in app._notifications if OFF in n.message)
        assert "--web-control" in notice and "terminal" in notice, notice
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("web, readonly", [(False, True), (True, False)])
async def test_a_local_read_only_terminal_and_a_web_control_tab_keep_export(sock_dir, history_db, tmp_path,
                                                                           monkeypatch, web, readonly):
    if web:
        monkeypatch.setenv("TEXTUAL_DRIVER", WEB_DRIVER)
    else:
        monkeypatch.delenv("TEXTUAL_DRIVER", raising=False)
    db, _ = history_db
    target = tmp_path / "run.csv"
    app = make_app(sock_dir / "absent.sock", db, utc=True, readonly=readonly)
    async with app.run_test(size=(120, 36)) as pilot:
        await _press_export(app, pilot)
        await wait_for(pilot, lambda: isinstance(app.screen, ExportPathScreen))
        app.screen.query_one("#export-path", Input).value = str(target)
        await pilot.press("enter")
        await wait_for(pilot, lambda: any("rows written" in n.message for n in app._notifications), timeout_s=10)
    assert target.exists()


@pytest.mark.timeout(150)
async def test_a_browser_tab_of_the_read_only_web_dashboard_writes_no_file(agent, history_db, tmp_path):
    """End to end: the real `lynxtop dashboard --web` against the FAKE agent and a real history; a websocket types
    4 (History), e (export), Enter (the default path, under $HOME). No CSV is written; the tab shows why."""
    db, _ = history_db
    home = tmp_path / "home"
    home.mkdir()
    cfg = tmp_path / "config.toml"
    cfg.write_text("")
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "lynxtop", "dashboard", "--config", str(cfg), "--socket",
                             str(agent.socket_path), "--database", str(db), "--web", f"127.0.0.1:{port}"],
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "HOME": str(home)})
    received = bytearray()
    try:
        line = await asyncio.wait_for(asyncio.to_thread(proc.stdout.readline), 60)
        assert f"127.0.0.1:{port}" in line, line + (proc.stderr.read() if proc.poll() is not None else "")
        async with aiohttp.ClientSession() as s, s.ws_connect(f"ws://127.0.0.1:{port}/ws?width=140&height=40",
                                                              origin=f"http://127.0.0.1:{port}") as ws:

            async def drain(seconds: float) -> None:
                end = time.monotonic() + seconds
                while time.monotonic() < end:
                    try:
                        msg = await asyncio.wait_for(ws.receive(), 0.2)
                    except TimeoutError:
                        continue
                    if msg.type == aiohttp.WSMsgType.BINARY:
                        received.extend(msg.data)
                    elif msg.type != aiohttp.WSMsgType.TEXT:
                        return

            async def until(text: str, seconds: float) -> bool:
                end = time.monotonic() + seconds
                while text.encode() not in received and time.monotonic() < end:
                    await drain(0.3)
                return text.encode() in received

            assert await until("READ-ONLY", 40), bytes(received[-2000:])
            await ws.send_json(["stdin", "4"])
            assert await until("c compare", 20), bytes(received[-3000:])  # the History status line
            await drain(3)  # the runs load
            await ws.send_json(["stdin", "e"])
            await drain(3)
            await ws.send_json(["stdin", "\r"])  # on the dialog (if any) this writes ~/lynxtop-run-N-gpu.csv
            await until(OFF, 10)
            await drain(3)
    finally:
        proc.terminate()
        try:
            _, err = proc.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            _, err = proc.communicate()
    assert not list(home.rglob("*.csv")), list(home.rglob("*"))
    assert OFF.encode() in received
    assert "Traceback" not in err
