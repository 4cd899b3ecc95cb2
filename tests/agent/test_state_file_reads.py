"""The agent's state files when something else stands at their path or they hold what no agent wrote: a symlink
(to a file the service user must not touch), a FIFO (a plain read blocks forever, on the event loop at start),
non-finite or huge numbers, fields of the wrong type. Each is refused with a message naming the path, never
followed, never blocking, never fatal. Real files, FIFOs and symlinks."""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from support.agent_config import agent_toml

from lynxtop.agent.cluster.raynode import RayNode
from lynxtop.agent.node import AgentStartError, lock_state_dir
from lynxtop.agent.serving.statefiles import Marker
from lynxtop.agent.serving.switching import ActionIntent
from lynxtop.contract.config import parse_config
from lynxtop.contract.events import EventKind

pytestmark = pytest.mark.timeout(60)


def finishes(fn: Callable[[], Any], within: float = 5.0) -> Any:
    """fn()'s result, asserting it returned within `within` s (a read blocked on a FIFO never does)."""
    out: list[Any] = []
    errors: list[BaseException] = []

    def call() -> None:
        try:
            out.append(fn())
        except BaseException as exc:  # noqa: BLE001 - raised again in the test's thread
            errors.append(exc)

    t = threading.Thread(target=call, daemon=True)
    t.start()
    t.join(within)
    if errors:
        raise errors[0]
    assert out, f"still blocked after {within} s"
    return out[0]


def release(fifo: Path) -> None:
    """Unblock a reader the old code left waiting on `fifo` (so a failing test does not hang its thread)."""
    if fifo.exists():
        os.close(os.open(fifo, os.O_RDWR | os.O_NONBLOCK))  # a writer: a reader blocked in open() goes on


# ------------------------------------------------------------------------------------- Marker.read


def test_marker_read_of_a_fifo_returns_at_once_and_says_what_is_there(tmp_path):
    fifo = tmp_path / "crash-loop.json"
    os.mkfifo(fifo)
    try:
        data, err = finishes(lambda: Marker(fifo).read())
    finally:
        release(fifo)
    assert data is None and err == "it is a FIFO (named pipe), not a regular file"  # the caller names the path


def test_marker_read_does_not_follow_a_symlink(tmp_path):
    secret = tmp_path / "secret.json"
    secret.write_text('{"profile": "from-the-link"}')
    link = tmp_path / "switch.json"
    link.symlink_to(secret)
    data, err = Marker(link).read()
    assert data is None and err == "it is a symbolic link, not a regular file"


@pytest.mark.parametrize("text, words", [
    ('{"since_ms": 1e999}', "not finite"),
    ('{"since_ms": -1e999}', "not finite"),
    ('{"since_ms": Infinity}', "Infinity"),
    ('{"since_ms": NaN}', "NaN"),
    ('{"run": ' + "9" * 5000 + "}", "out of range"),
    ('{"run": 18446744073709551616}', "out of range"),
    ("[" * 100_000 + "]" * 100_000, "nested"),
    ('{"a": ' + "[" * 40 + "]" * 40 + "}", "nested"),
], ids=["1e999", "-1e999", "Infinity", "NaN", "5000-digits", "2**64", "deep-100000", "deep-40"])
def test_marker_read_refuses_numbers_and_nesting_no_agent_writes(tmp_path, text, words):
    p = tmp_path / "switch.json"
    p.write_text(text)
    data, err = Marker(p).read()
    assert data is None and err is not None and words in err, err


def test_marker_read_refuses_a_huge_file_and_reads_a_normal_one(tmp_path):
    p = tmp_path / "crash-loop.json"
    p.write_text('{"profile": "a", "reason": "' + "x" * (2 << 20) + '"}')
    data, err = Marker(p).read()
    assert data is None and err is not None and "too large" in err
    Marker(p).save({"profile": "a", "reason": "r", "since_ms": 1_700_000_000_000})
    assert Marker(p).read() == ({"profile": "a", "reason": "r", "since_ms": 1_700_000_000_000}, None)
    p.unlink()
    assert Marker(p).read() == (None, None)


def test_marker_save_replaces_a_symlink_instead_of_writing_through_it(tmp_path):
    victim = tmp_path / "victim.conf"
    victim.write_text("important=1\n")
    link = tmp_path / "switch.json"
    link.symlink_to(victim)
    assert Marker(link).save({"profile": "a"}) is None
    assert victim.read_text() == "important=1\n" and not link.is_symlink()
    assert json.loads(link.read_text()) == {"profile": "a"}


# ------------------------------------------------------------------------------------- switch.json


class Events:
    def __init__(self) -> None:
        self.calls: list[tuple[Any, Any, str]] = []

    def __call__(self, kind: Any, severity: Any, message: str, **details: Any) -> None:
        self.calls.append((kind, severity, message))


GOOD = {"action": "switch", "profile": "v4-tp4", "from": "v4-tp8", "run": 3, "by": "uid 0",
        "since_ms": 1_700_000_000_000}


BAD_NOTES = {
    "since_ms-1e999": '{"action": "switch", "profile": "v4-tp4", "from": "v4-tp8", "run": 1, "since_ms": 1e999}',
    "since_ms-NaN": '{"action": "switch", "profile": "v4-tp4", "from": "v4-tp8", "run": 1, "by": "x", "since_ms": NaN}',
    "since_ms-1e300": '{"action": "switch", "profile": "v4-tp4", "since_ms": 1e300}',  # finite: clock() raised
    "since_ms-int64": '{"action": "switch", "profile": "v4-tp4", "since_ms": 9223372036854775807}',
    "since_ms-negative": '{"action": "switch", "profile": "v4-tp4", "since_ms": -5}',
    "since_ms-bool": '{"action": "switch", "profile": "v4-tp4", "since_ms": true}',
    "since_ms-str": '{"action": "switch", "profile": "v4-tp4", "since_ms": "soon"}',
    "since_ms-float": '{"action": "switch", "profile": "v4-tp4", "since_ms": 1.7e12}',
    "run-1e999": '{"action": "switch", "profile": "v4-tp4", "run": 1e999}',
    "run-str": '{"action": "switch", "profile": "v4-tp4", "run": "3"}',
    "run-negative": '{"action": "switch", "profile": "v4-tp4", "run": -1}',
    "run-bool": '{"action": "switch", "profile": "v4-tp4", "run": false}',
    "profile-list": '{"action": "switch", "profile": ["v4-tp4"]}',
    "profile-int": '{"action": "switch", "profile": 4}',
    "profile-empty": '{"action": "switch", "profile": ""}',
    "profile-missing": '{"action": "switch"}',
    "from-int": '{"action": "switch", "profile": "v4-tp4", "from": 8}',
    "by-object": '{"action": "switch", "profile": "v4-tp4", "by": {"uid": 0}}',
    "action-unknown": '{"action": "reboot", "profile": "v4-tp4"}',
    "action-int": '{"action": 1, "profile": "v4-tp4"}',
    "not-an-object": '["v4-tp4"]',
    "cut-short": '{"action": "switch", "profile": "v4-tp4", "since_ms": 1e999',
}


@pytest.mark.parametrize("raw", BAD_NOTES.values(), ids=BAD_NOTES.keys())
def test_a_malformed_switch_note_is_reported_removed_and_ignored(tmp_path, raw):
    p = tmp_path / "switch.json"
    p.write_text(raw)
    ev = Events()
    assert ActionIntent(p, ev).interrupted() is None
    assert len(ev.calls) == 1, ev.calls
    kind, _, message = ev.calls[0]
    assert kind == EventKind.AGENT_STATE_FILE and str(p) in message and "not finished" in message
    assert not p.exists()  # reported once: the next agent start does not trip on it again


def test_a_switch_note_on_a_fifo_is_reported_without_blocking(tmp_path):
    p = tmp_path / "switch.json"
    os.mkfifo(p)
    ev = Events()
    try:
        assert finishes(lambda: ActionIntent(p, ev).interrupted()) is None
    finally:
        release(p)
    assert [c[0] for c in ev.calls] == [EventKind.AGENT_STATE_FILE] and "FIFO" in ev.calls[0][2]


@pytest.mark.parametrize("note, expect", [
    (GOOD, ("v4-tp4", "v4-tp8", "uid 0", 1_700_000_000_000, "switch", 3)),
    ({"action": "restart", "profile": "a", "from": "a", "run": None, "by": "x", "since_ms": 1_600_000_000_000},
     ("a", "a", "x", 1_600_000_000_000, "restart", None)),
    ({"profile": "a", "from": None}, ("a", None, "?", None, "switch", None)),  # an older agent's note
])
def test_a_well_formed_switch_note_is_read(tmp_path, note, expect):
    p = tmp_path / "switch.json"
    p.write_text(json.dumps(note))
    ev = Events()
    left = ActionIntent(p, ev).interrupted()
    assert left is not None and not ev.calls
    target, old, by, since_ms, action, run = expect
    assert (left.target, left.old, left.by, left.action, left.run) == (target, old, by, action, run)
    if since_ms is None:  # none recorded: taken as now
        assert left.since_ms > 1_700_000_000_000
    else:
        assert left.since_ms == since_ms
    assert "UTC" in left.describe()


# ------------------------------------------------------------------------------------- ray-stopped.json


def ray_node(tmp_path: Path) -> RayNode:
    text = agent_toml(tmp_path / "state" / "lynxtop.db", tmp_path / "run" / "agent.sock", role="worker")
    text += '\n[ray]\nexecutable = "/bin/true"\nhead_address = "10.0.0.1:6379"\n'
    (tmp_path / "state").mkdir(exist_ok=True)
    return RayNode(parse_config(text), lambda e: None, state_dir=tmp_path / "state")


def test_the_ray_hold_note_on_a_fifo_or_symlink_is_ignored_without_blocking(tmp_path, caplog):
    rn = ray_node(tmp_path)
    os.mkfifo(rn.held_path)
    try:
        assert finishes(rn._held) is None
    finally:
        release(rn.held_path)
    assert "FIFO" in caplog.text and str(rn.held_path) in caplog.text
    rn.held_path.unlink()
    target = tmp_path / "elsewhere.json"
    target.write_text('{"reason": "read through a link"}')
    rn.held_path.symlink_to(target)
    assert rn._held() is None and "symbolic link" in caplog.text


@pytest.mark.parametrize("raw", ['{"reason": 1e999}', '{"reason": ' + "[" * 100_000 + "]" * 100_000 + "}",
                                 '{"reason": {"a": 1}}', '{"reason": null}', '"stopped"'],
                         ids=["1e999", "deep", "object", "null", "string"])
def test_a_malformed_ray_hold_note_is_ignored(tmp_path, raw):
    rn = ray_node(tmp_path)
    rn.held_path.write_text(raw)
    assert rn._held() is None


def test_a_ray_hold_note_is_read(tmp_path):
    rn = ray_node(tmp_path)
    rn.held_path.write_text(json.dumps({"reason": "stopped by uid 0", "since_ms": 1}))
    assert rn._held() == "stopped by uid 0"


# ------------------------------------------------------------------------------------- agent.lock


def test_the_agent_lock_is_never_taken_through_a_symlink(tmp_path):
    state = tmp_path / "state"
    state.mkdir()
    victim = tmp_path / "victim.conf"  # as root: /etc/shadow
    victim.write_text("important=1\n" * 100)
    (state / "agent.lock").symlink_to(victim)
    with pytest.raises(AgentStartError) as err:
        lock_state_dir(state)
    assert victim.read_text() == "important=1\n" * 100
    msg = str(err.value)
    assert str(state / "agent.lock") in msg and "symbolic link" in msg and "rm " in msg
    dangling = state / "agent.lock"  # a link to a file not there yet: O_CREAT would have created it
    dangling.unlink()
    dangling.symlink_to(tmp_path / "created-by-root")
    with pytest.raises(AgentStartError, match="symbolic link"):
        lock_state_dir(state)
    assert not (tmp_path / "created-by-root").exists()


def test_the_agent_lock_as_a_fifo_is_refused_at_once(tmp_path):
    state = tmp_path / "state"
    state.mkdir()
    os.mkfifo(state / "agent.lock")
    with pytest.raises(AgentStartError, match="FIFO"):
        finishes(lambda: lock_state_dir(state))


def test_the_agent_lock_holds_the_pid_and_refuses_a_second_agent(tmp_path):
    state = tmp_path / "state"
    fd = lock_state_dir(state)
    try:
        assert (state / "agent.lock").read_text() == f"{os.getpid()} running\n"
        with pytest.raises(AgentStartError, match=f"pid {os.getpid()}"):
            lock_state_dir(state)
    finally:
        os.close(fd)
