"""An interrupted switch or restart that cannot be finished because of a bug (not an ActionError) must not end the
agent's start: the note stays on disk, so every later start would fail the same way, the model unsupervised."""

from __future__ import annotations

import json

import pytest

from lynxtop.contract.events import EventKind

pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize("action", ["switch", "restart"])
async def test_a_bug_while_finishing_an_interrupted_action_is_reported_and_the_note_cleared(make_sup, tmp_path,
                                                                                           action):
    sup = make_sup()
    note = tmp_path / "state" / "switch.json"
    note.parent.mkdir(parents=True, exist_ok=True)
    note.write_text(json.dumps({"action": action, "profile": "sim", "from": None, "run": None, "by": "alice",
                                "since_ms": 1}))
    events: list = []
    sup._event = lambda kind, sev, msg, **details: events.append((kind, sev, msg))

    async def broken(*args, **kwargs):
        raise RuntimeError("a bug")

    sup.switch = sup.restart = broken
    assert await sup.resume_switch() is False  # returned: the start goes on (autostart, hold...)
    assert not note.exists()  # and the next start does not meet the same note
    failed = [e for e in events if e[0] == EventKind.ACTION_FAILED]
    assert len(failed) == 1 and "RuntimeError: a bug" in failed[0][2], events
