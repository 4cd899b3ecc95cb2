"""The `lynxtop` command run in the test's process (its real `main`), its output as the user reads it, and a stdin
that says it is a terminal (where a command asks before it acts)."""

from __future__ import annotations

import io
from typing import Any

from lynxtop.__main__ import main


class Tty(io.StringIO):
    """A stdin holding the user's answer that reports itself as a terminal: the command asks, as it does there."""

    def isatty(self) -> bool:
        return True


def run_cli(capsys: Any, *argv: str) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of `lynxtop *argv`. capsys is read (so emptied) after each command: a test's
    second call returns its own output, not the first one's too."""
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err
