"""s25: the Stop and Restart dialogs say the profile's shutdown timeout once.

With requests running, the sentence on how vLLM is stopped said "in-flight requests drain for the profile's shutdown
timeout, 5s" and the next line "they get vLLM's shutdown timeout (5s) to finish, then fail": the same figure twice
in back-to-back sentences, as if two timeouts applied. The drain sentence names it; the requests' line refers to it.
The Switch dialog has no drain sentence: its requests' line still names the figure.

Real parts: the dialog texts as the dashboard builds them (tui/control_text.py) from a status through its JSON
round trip, read as plain text; and the Restart dialog in Pilot against the fake agent over a real unix socket.
"""

from __future__ import annotations

import copy

import pytest
from support.status import status_json
from support.tui import make_app, plain
from support.tui_keys import open_screen

from lynxtop.contract.records import ProfileInfo
from lynxtop.contract.status import ServingMetrics, Status
from lynxtop.tui import control_text
from lynxtop.tui.screens.confirm import ConfirmScreen

PROFILE = ProfileInfo("dsv41-tp8", flags={"--shutdown-timeout": "5"})


def _ready(running: int, waiting: int) -> tuple[Status, ServingMetrics]:
    status = Status.from_json(status_json())
    metrics = ServingMetrics.from_json({**status_json()["serving_metrics"], "requests_running": running,
                                        "requests_waiting": waiting})
    return status, metrics


@pytest.mark.parametrize("build", [control_text.restart_text, control_text.stop_text], ids=["restart", "stop"])
@pytest.mark.parametrize(("running", "waiting"), [(3, 0), (3, 17)])
def test_the_shutdown_timeout_is_said_once(build, running, waiting):
    status, metrics = _ready(running, waiting)
    assert status.serving.state.value == "ready"
    text = " ".join(plain(build(status.serving, metrics, PROFILE)).split())
    assert text.count("5s") == 1, text
    assert "drain for the profile's shutdown timeout, 5s" in text, text
    # the running requests still hear what they get, without the figure again
    assert f"{running} request(s) are running now" in text and "shutdown timeout to finish, then fail" in text, text


def test_the_switch_dialog_still_names_the_figure_in_its_requests_line():
    status, metrics = _ready(3, 0)
    text = " ".join(plain(control_text.switch_text(status.serving, PROFILE, ProfileInfo("other"), metrics)).split())
    assert "get vLLM's shutdown timeout (5s) to finish, then fail" in text, text
    assert text.count("5s") == 1, text


async def test_the_restart_dialog_on_screen_says_it_once(agent):
    agent.profiles = copy.deepcopy(agent.profiles)
    next(p for p in agent.profiles["profiles"] if p["name"] == "dsv41-tp8")["flags"]["--shutdown-timeout"] = "5"
    agent.status["serving_metrics"] = {**agent.status["serving_metrics"], "requests_running": 3,
                                       "requests_waiting": 2}
    app = make_app(agent.socket_path)
    async with app.run_test(size=(120, 40)) as pilot:
        dialog = await open_screen(pilot, app, "R", ConfirmScreen)
        text = " ".join(plain(dialog.body).split())
        assert text.count("5s") == 1 and "shutdown timeout, 5s" in text, text
