"""`lynxtop start|stop|restart|switch` name the run they read (`expect_run`) on the real API (fake controller);
an agent older than the field (still running after an upgrade) is asked again without it, with a warning."""

from __future__ import annotations

import io
import sys

import pytest
from agent_io_helpers import FakeController, ThreadedApi
from support.cli import run_cli
from support.ports import short_dir

from lynxtop.agent.api import routes
from lynxtop.agent.api.control import ANY_RUN as CONTROL_ANY
from lynxtop.cli import ctl
from lynxtop.contract.client import ANY_RUN, AgentClient, _action_body


@pytest.fixture
def agent(monkeypatch):
    monkeypatch.setattr(sys, "stdin", io.StringIO(""))
    with short_dir() as d:
        fake = FakeController()
        with ThreadedApi(fake, d / "agent.sock"):
            yield fake, str(d / "agent.sock")


def test_every_serving_action_sends_the_run_it_read(agent, capsys):
    fake, path = agent
    for argv in (("restart", "--yes"), ("switch", "tp8-fp8kv", "--yes"), ("stop", "--yes")):
        code, _, err = run_cli(capsys, *argv, "--socket", path)
        assert code == 0, err
    fake.serving.update(state="stopped", run_id=None)
    code, _, err = run_cli(capsys, "start", "--socket", path)
    assert code == 0, err
    assert [c[0] for c in fake.calls] == ["restart", "switch", "stop", "start"]
    assert fake.expect_runs == [7, 7, 7, None]  # None: it read no run, sent as null


def test_an_agent_without_the_field_is_asked_again_without_it(agent, capsys, monkeypatch):
    fake, path = agent
    monkeypatch.setitem(routes._BODY_SPEC, "stop", {"cluster": (bool, False)})  # as before the field
    code, _, err = run_cli(capsys, "stop", "--yes", "--socket", path)
    assert code == 0 and "predates the run check" in err, err
    assert [c[0] for c in fake.calls] == ["stop"] and fake.expect_runs == [CONTROL_ANY]


def test_a_run_changed_refusal_has_its_own_exit_code(agent, capsys, monkeypatch):
    from lynxtop.agent.api.control import ActionError

    fake, path = agent

    async def refuse(by, expect_run=None):
        raise ActionError("run_changed", "the run changed since you looked: you saw run 7, now run 8 (profile "
                          "tp8, starting); nothing done", 409, {"expected_run": 7, "run_id": 8})

    monkeypatch.setattr(fake, "restart", refuse)
    code, _, err = run_cli(capsys, "restart", "--yes", "--socket", path)
    assert code == ctl.EXIT_RUN_CHANGED == 5 and "run_changed: the run changed since you looked" in err


def test_the_body_carries_null_and_leaves_the_field_out_by_default():
    assert _action_body("stop", None, {}, None) == {"expect_run": None}
    assert _action_body("switch", "b", {}, 3) == {"profile": "b", "expect_run": 3}
    assert _action_body("stop", None, {"cluster": None}) == {}
    assert _action_body("restart", None, {}, ANY_RUN) == {}
    with pytest.raises(ValueError):
        _action_body("ray/stop", None, {}, 3)
    assert AgentClient.action.__kwdefaults__["expect_run"] is ANY_RUN
