"""Why a sweep was NOT stored reaches the terminal escaped, on one line.

`lynxtop bench`'s closing "NOT stored: ..." line carries the agent's refusal message or an unreachable error: text
from the other end, so its control characters (a screen clear, an OSC title, a bidi override, a line break forging
another line) must be printed escaped (contract/terminal.py).
"""

from __future__ import annotations

import re
from argparse import Namespace

import pytest

from lynxtop.cli.bench import Store, _report
from lynxtop.cli.bench_load import Level, LevelRun, RequestResult
from lynxtop.cli.bench_stats import summarize
from lynxtop.cli.bench_sweep import SweepResult
from lynxtop.contract.client import AgentRefused, AgentUnreachable

EVIL = "\x1b[2J\x1b]0;owned\x07\u202e\nforged line"
SHOWN = "\\x1b[2J\\x1b]0;owned\\x07\\u202e\\nforged line"
CONTROLS = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


class _Agent:
    def __init__(self, exc: Exception):
        self.exc = exc

    def request(self, *args, **kwargs):
        raise self.exc


@pytest.mark.parametrize("exc", [AgentRefused(400, "bad_result", "refused" + EVIL),
                                 AgentUnreachable("unreachable" + EVIL)], ids=["refused", "unreachable"])
def test_not_stored_line_shows_the_agents_words_escaped(exc, capsys):
    """The NOT stored line keeps the other end's words, escaped, and forges no line of its own."""
    summary = summarize(LevelRun(Level(concurrency=1), results=[RequestResult(error="x")], duration_s=1.0))
    store = Store(_Agent(exc), {"bench_id": "sweep-a"})
    store(summary)
    assert store.stored == 0 and store.problem
    _report(SweepResult(), {"bench_id": "sweep-a"}, store, Namespace(json=None))
    err = capsys.readouterr().err
    line = next(x for x in err.splitlines() if x.startswith("NOT stored"))
    assert SHOWN in line
    assert not CONTROLS.search(err)
    assert not any(x.startswith("forged") for x in err.splitlines())
