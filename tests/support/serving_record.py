"""serving.json records not as this agent writes them (a hand edit, another version's format), for the tests of
what the next agent adopts, holds or leaves alone. Each takes the record as read (a dict) and returns the file's
new text."""

from __future__ import annotations

import json


def start_and_argv(rec: dict) -> str:
    """Start time and argv both wrong: the live pid carries the token but cannot be proven the server (held)."""
    rec["start_ticks"] += 1
    rec["argv"] = [*rec["argv"], "--an-edited-flag"]
    return json.dumps(rec)


def format_2(rec: dict) -> str:
    """A record no agent of this version reads (written by a newer one): nothing adopted, the server a stray."""
    rec["format"] = 2
    return json.dumps(rec)
