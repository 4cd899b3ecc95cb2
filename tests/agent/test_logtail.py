"""The streamed log tail serves the same lines as `startup.tail_lines`, read from real files in small blocks."""

from __future__ import annotations

import json

import pytest

from lynxtop.agent.api import logtail
from lynxtop.agent.api.logtail import LogTail
from lynxtop.agent.serving.startup import tail_lines

CASES = {
    "plain": b"one\ntwo\nthree\n",
    "no final newline": b"one\ntwo\nthree",
    "blank and cr lines": b"a\r\n\n   \r\nb\n\n\nc\r\n",
    "utf-8 and a bad byte": "héllo ✓\n".encode() * 30 + b"bad \xff byte\n",
    "long": b"".join(f"line {i} ".encode() + b"y" * (i % 37) + b"\n" for i in range(400)),
}


@pytest.mark.parametrize("name", CASES)
@pytest.mark.parametrize(("n", "max_bytes"), [(1, 10**6), (5, 10**6), (50, 200), (1000, 1000), (3, 9)])
def test_same_lines_as_tail_lines(tmp_path, monkeypatch, name, n, max_bytes):
    monkeypatch.setattr(logtail, "BLOCK", 7)  # lines and the window cross block edges
    path = tmp_path / "run.log"
    path.write_bytes(CASES[name])
    tail = LogTail(str(path), n, max_bytes)
    tail.locate()
    assert json.loads("[" + "".join(tail.reader()) + "]") == tail_lines(path, n, max_bytes)


def test_a_huge_line_is_cut_and_says_so(tmp_path, monkeypatch):
    monkeypatch.setattr(logtail, "LINE_CAP", 10)
    path = tmp_path / "run.log"
    path.write_bytes(b"short\n" + b"x" * 25 + b"\nend\n")
    tail = LogTail(str(path), 10, 10**6)
    tail.locate()
    assert json.loads("[" + "".join(tail.reader()) + "]") == [
        "short", "xxxxxxxxxx [... 15 more bytes of this line not shown]", "end"]


def test_missing_file_is_an_empty_tail(tmp_path):
    tail = LogTail(str(tmp_path / "gone.log"), 10, 10**6)
    tail.locate()
    assert list(tail.reader()) == []
