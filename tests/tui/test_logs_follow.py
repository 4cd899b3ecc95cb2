"""The Logs view (6) follows the run's log through the real control API over a real file (issue 28.4):
new lines while following, scrolling up stops following, End and f follow again, / n N search, WARNING and
ERROR coloured, a partial line never shown twice, rotation and a restart's new run continue the view, foreign
text shown literally, and at most MAX_LINES kept."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from support.log_agent import LogAgent
from support.tui import make_app, screen_text, wait_for

from lynxtop.tui.screens import logs as logs_screen
from lynxtop.tui.screens.logs import LogsScreen
from lynxtop.tui.widgets.follow_log import FollowLog


@pytest.fixture
def log_agent(sock_dir: Path, tmp_path: Path):
    path = tmp_path / "run-3.log"
    path.write_text("".join(f"INFO loading shard {i}/64\n" for i in range(100)))
    agent = LogAgent(sock_dir / "agent.sock", path).start()
    yield agent
    agent.stop()


def _append(path: Path, text: str) -> None:
    with open(path, "a") as f:
        f.write(text)


async def _open(pilot) -> tuple[LogsScreen, FollowLog]:
    await pilot.press("6")
    await wait_for(pilot, lambda: isinstance(pilot.app.screen, LogsScreen))
    screen = pilot.app.screen
    log = screen.query_one(FollowLog)
    await wait_for(pilot, lambda: len(log.lines) >= 100)
    return screen, log


def _at_end(log: FollowLog) -> bool:
    return log.max_scroll_y > 0 and log.scroll_y == log.max_scroll_y


def _title(screen: LogsScreen) -> str:
    return str(screen.query_one("#logs-title").render())


async def test_follows_stops_when_scrolled_up_and_resumes_on_end_and_f(log_agent):
    path = log_agent.controller.log_path
    app = make_app(log_agent.socket_path)
    async with app.run_test(size=(120, 40)) as pilot:
        screen, log = await _open(pilot)
        await wait_for(pilot, lambda: _at_end(log))
        _append(path, "INFO new 1\nINFO new 2\n")
        await wait_for(pilot, lambda: log.lines[-1] == "INFO new 2" and _at_end(log))
        assert log.following and "following" in _title(screen)

        await pilot.press("pageup")
        assert not log.following
        top = log.scroll_y
        _append(path, "".join(f"INFO later {i}\n" for i in range(30)))
        await wait_for(pilot, lambda: log.lines[-1] == "INFO later 29")
        await wait_for(pilot, lambda: "30 new below" in _title(screen))  # the 30 lines are taken in, counted
        assert log.scroll_y == top and not _at_end(log)  # new lines did not move the view

        await pilot.press("end")
        assert log.following and _at_end(log)
        _append(path, "INFO after end\n")
        await wait_for(pilot, lambda: log.lines[-1] == "INFO after end" and _at_end(log))

        await pilot.press("up")
        assert not log.following
        await pilot.press("f")
        assert log.following and _at_end(log)
        _append(path, "INFO after f\n")
        await wait_for(pilot, lambda: log.lines[-1] == "INFO after f" and _at_end(log))
        assert log.lines.count("INFO new 1") == 1  # each line once: only the new ones are read


async def test_search_next_prev_and_severity_colours(log_agent):
    path = log_agent.controller.log_path
    _append(path, "WARNING 12-02 kv cache nearly full\nERROR 12-02 engine died\nINFO loading shard 7/64 again\n")
    app = make_app(log_agent.socket_path)
    async with app.run_test(size=(120, 40)) as pilot:
        screen, log = await _open(pilot)
        await wait_for(pilot, lambda: log.lines[-1] == "INFO loading shard 7/64 again")
        await pilot.press("slash")
        await pilot.press(*"shard 7/")
        await pilot.press("enter")
        found = [i for i, line in enumerate(log.lines) if "shard 7/" in line]
        assert len(found) == 2
        assert screen.match_at == found[-1] and not log.following  # the newest match first
        await wait_for(pilot, lambda: "2/2 lines" in _title(screen))
        await pilot.press("N")
        assert screen.match_at == found[0]
        await pilot.press("n")
        assert screen.match_at == found[1]
        await pilot.press("n")  # wraps
        assert screen.match_at == found[0]

        def styles_of(line: str) -> list:
            strip = log._render_line_strip(log.lines.index(line), log.rich_style)
            return [seg.style for seg in strip if seg.text.strip()]

        assert all(s.color and s.color.name == "red" and s.bold for s in styles_of("ERROR 12-02 engine died"))
        assert all(s.color and s.color.name == "yellow" for s in styles_of("WARNING 12-02 kv cache nearly full"))
        needle = [s for s in styles_of("INFO loading shard 7/64 again") if s.reverse]
        assert needle  # the search term shown reversed
        await pilot.press("escape")
        assert screen.needle == "" and not [s for s in styles_of("INFO loading shard 7/64 again") if s.reverse]
        at = screen.match_at
        await pilot.press("n")  # without a search n and N are not the view's: nothing moves
        assert screen.match_at == at and screen.check_action("match", (1,)) is False


async def test_partial_line_rotation_and_a_new_run_continue_the_view(log_agent, tmp_path):
    ctl = log_agent.controller
    path = ctl.log_path
    app = make_app(log_agent.socket_path)
    async with app.run_test(size=(120, 40)) as pilot:
        screen, log = await _open(pilot)
        _append(path, "INFO half")
        await wait_for(pilot, lambda: log.lines[-1] == "INFO half")
        _append(path, " done\nINFO next\n")
        await wait_for(pilot, lambda: log.lines[-1] == "INFO next")
        assert log.lines[-2] == "INFO half done" and "INFO half" not in log.lines

        os.rename(path, path.with_suffix(".log.1"))  # logrotate: renamed, and a new file created
        path.write_text("INFO first line of the new file\n")
        await wait_for(pilot, lambda: log.lines[-1] == "INFO first line of the new file")
        assert "was rotated" in log.lines[-2] and "INFO next" in log.lines  # the earlier lines stay

        new = tmp_path / "run-4.log"  # a restart: a new run, its own log
        new.write_text("INFO run 4 starting\n")
        ctl.log_path, ctl.run_id = new, 4
        await wait_for(pilot, lambda: log.lines[-1] == "INFO run 4 starting")
        assert log.lines[-2].startswith("── run 4 started") and "run 4" in _title(screen)
        _append(new, "INFO run 4 ready\n")
        await wait_for(pilot, lambda: log.lines[-1] == "INFO run 4 ready")


async def test_foreign_text_is_shown_literally(log_agent):
    _append(log_agent.controller.log_path, "[bold]not bold\nred \x1b[31mESC\nlone [ bracket\n")
    app = make_app(log_agent.socket_path)
    async with app.run_test(size=(120, 40)) as pilot:
        _, log = await _open(pilot)
        await wait_for(pilot, lambda: log.lines[-1] == "lone [ bracket")
        assert log.lines[-3:] == ["[bold]not bold", "red \\x1b[31mESC", "lone [ bracket"]
        shown = ("[bold]not bold", "red \\x1b[31mESC", "lone [ bracket")
        await wait_for(pilot, lambda: all(s in screen_text(pilot.app) for s in shown))  # drawn as they are


async def test_memory_is_bounded(log_agent, monkeypatch):
    monkeypatch.setattr(logs_screen, "MAX_LINES", 50)
    app = make_app(log_agent.socket_path)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.press("6")
        await wait_for(pilot, lambda: isinstance(pilot.app.screen, LogsScreen))
        log = pilot.app.screen.query_one(FollowLog)
        await wait_for(pilot, lambda: log.lines and log.lines[-1] == "INFO loading shard 99/64")
        _append(log_agent.controller.log_path, "".join(f"INFO more {i}\n" for i in range(200)))
        await wait_for(pilot, lambda: log.lines[-1] == "INFO more 199")
        assert len(log.lines) == 50 and log.lines[0] == "INFO more 150"


async def test_a_log_the_agent_will_not_read_says_why(log_agent, tmp_path):
    """A run log replaced by a symbolic link is not read through (agent/serving/safefile.py): the agent answers no
    lines and an `error`; the view says why in its title instead of showing an empty log as if nothing was
    written (session 20)."""
    path = log_agent.controller.log_path
    secret = tmp_path / "shadow"
    secret.write_text("root:SECRET-HASH\n")
    app = make_app(log_agent.socket_path)
    async with app.run_test(size=(160, 40)) as pilot:
        screen, log = await _open(pilot)
        path.unlink()
        path.symlink_to(secret)
        screen.next = None  # read from the start again, as after a new run
        await wait_for(pilot, lambda: "cannot be read" in _title(screen))
        assert "symbolic link" in _title(screen)
        assert not any("SECRET" in line for line in log.lines)
