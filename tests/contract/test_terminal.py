"""terminal_safe: every control character a foreign string may hold is shown escaped, the rest kept as is."""

from __future__ import annotations

from lynxtop.contract.terminal import terminal_safe, terminal_safe_json


def test_c0_del_c1_and_bidi_controls_are_shown_escaped():
    raw = "0.99\x1b[2J\x1b]0;title\x07\x00\x7f\x9b1m\x85\u202eabc\u2066\u200f\t\r\n"
    assert terminal_safe(raw) == ("0.99\\x1b[2J\\x1b]0;title\\x07\\x00\\x7f\\x9b1m\\x85\\u202eabc\\u2066\\u200f"
                                  "\\t\\r\\n")
    assert all(c.isprintable() for c in terminal_safe(raw))


def test_plain_text_and_markup_look_alikes_are_kept():
    text = "DeepSeek-V4.1 [/] [bold] ünïcode 模型 \\x1b"
    assert terminal_safe(text) == text


def test_lines_keeps_line_breaks_only():
    assert terminal_safe("a\x1bb\nc\rd", lines=True) == "a\\x1bb\nc\\rd"


def test_json_every_string_and_key_escaped():
    data = {"serving": {"model": "m\x1b", "run_id": 7, "phases": ["p\n"]}, "k\x07": None}
    assert terminal_safe_json(data) == {"serving": {"model": "m\\x1b", "run_id": 7, "phases": ["p\\n"]},
                                        "k\\x07": None}
