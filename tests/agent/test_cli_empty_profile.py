"""`lynxtop start ""` (an unset $PROFILE in a script) is refused, and never starts the default profile (it did)."""

from __future__ import annotations

import io
import sys

import pytest

sys.path.insert(0, str(__import__("pathlib").Path(__file__).parent / "io"))
from agent_io_helpers import FakeController, ThreadedApi  # noqa: E402
from support.ports import short_dir  # noqa: E402

from lynxtop.__main__ import main  # noqa: E402
from lynxtop.contract.client import AgentClient  # noqa: E402


@pytest.fixture
def agent(monkeypatch):
    monkeypatch.setattr(sys, "stdin", io.StringIO(""))
    with short_dir() as d:
        fake = FakeController()
        fake.serving["state"] = "stopped"
        with ThreadedApi(fake, d / "agent.sock"):
            yield fake, str(d / "agent.sock")


def test_cli_start_with_an_empty_profile_name_starts_nothing(agent, capsys):
    fake, path = agent
    code = main(["start", "", "--socket", path])
    out = capsys.readouterr()
    print(code, out)
    assert fake.calls == [], f"an empty profile name started {fake.calls}"
    assert code == 2


def test_client_action_with_an_empty_profile_is_not_sent_as_no_profile(agent):
    fake, path = agent
    try:
        AgentClient(path).action("start", "")
    except Exception:
        pass
    assert fake.calls == [], f"an empty profile name started {fake.calls}"
