"""Another node's words in the History and Events views' banner reach the terminal escaped.

`RemoteHistory` (tui/cluster_source.py) turns another node's refusal or an unreachable error into the
`HistoryUnavailable` text those views show as it is: the refusal's message is foreign text (that node's agent wrote
it), so its control characters (a screen clear, an OSC title, a C1 CSI, a bidi override) must come out escaped
(contract/terminal.py), never raw.
"""

from __future__ import annotations

import pytest

from lynxtop.contract.client import AgentRefused, AgentUnreachable
from lynxtop.contract.terminal import first_control
from lynxtop.tui.cluster_source import RemoteHistory, refusal_text
from lynxtop.tui.history_source import HistoryUnavailable

HOSTILE = "reads off\x1b[2J\x1b]0;owned\x07\x9b31m\u202eevil"


class _Answers:
    """The node's client: every request raises `exc`."""

    def __init__(self, exc: Exception):
        self.exc = exc

    def request(self, *args, **kwargs):
        raise self.exc


def _history_text(exc: Exception) -> str:
    history = RemoteHistory("gpu-2", "http://127.0.0.1:1", "token")
    history._client = _Answers(exc)
    with pytest.raises(HistoryUnavailable) as got, history.reader() as reader:
        reader.runs()
    return str(got.value)


@pytest.mark.parametrize("status", [403, 500])
def test_a_refusals_message_is_shown_escaped(status):
    """A refusal's message from another node's agent keeps its words but none of its control characters."""
    text = _history_text(AgentRefused(status, "reads_off", HOSTILE))
    assert first_control(text) is None, text
    assert "reads off\\x1b[2J" in text and "\\u202eevil" in text


def test_refusal_text_escapes_the_message():
    """refusal_text, used for any refusal of another node's reads, never hands back a raw control character."""
    for status in (403, 418):
        assert first_control(refusal_text("gpu-2", AgentRefused(status, "x", HOSTILE))) is None


def test_an_unreachable_nodes_error_is_shown_escaped():
    """An unreachable error (which can carry what the other end sent) is shown escaped too."""
    text = _history_text(AgentUnreachable(f"bad answer: {HOSTILE}"))
    assert first_control(text) is None, text
    assert "\\x1b[2J" in text
