"""The agent's log (stderr: the journal under systemd) is one line per record with foreign text escaped.

Event messages carry foreign text (a board's UUID from NVML, a process title, a vLLM version or log line): a
newline in one forged a second journal line of the operator's choosing, an escape sequence reached whoever reads
`journalctl` on a terminal. The agent's formatter escapes each record's message as `terminal_safe` does; a
traceback (ours) keeps its lines.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap


def _agent_logging(code: str, env: dict[str, str] | None = None) -> str:
    """stderr of a fresh interpreter that sets up logging as `lynxtop agent` does, then runs `code`."""
    prog = textwrap.dedent("""
        import logging
        from lynxtop.cli.agent_cmd import _setup_logging
        _setup_logging()
        log = logging.getLogger("lynxtop.test")
    """) + textwrap.dedent(code)
    out = subprocess.run([sys.executable, "-c", prog], capture_output=True, text=True, timeout=60,
                         env=env)
    assert out.returncode == 0, out.stderr
    return out.stderr


def test_a_foreign_newline_or_escape_in_a_message_stays_one_escaped_line():
    err = _agent_logging("""
        log.warning("%s: %s", "gpu.identity_changed", "GPU 0: GPU-\\x1b[2Jx\\nINFO lynxtop.agent: forged line")
    """, env={"JOURNAL_STREAM": "8:1", "PATH": "/usr/bin:/bin"})
    lines = err.splitlines()
    assert len(lines) == 1, lines
    assert "\x1b" not in err
    assert lines[0] == ("WARNING lynxtop.test: gpu.identity_changed: GPU 0: GPU-\\x1b[2Jx\\nINFO lynxtop.agent: "
                        "forged line")


def test_a_traceback_keeps_its_lines_and_its_message_is_escaped():
    err = _agent_logging("""
        try:
            raise ValueError("bad")
        except ValueError:
            log.exception("reading %s failed", "a\\nb")
    """, env={"JOURNAL_STREAM": "8:1", "PATH": "/usr/bin:/bin"})
    lines = err.splitlines()
    assert lines[0] == "ERROR lynxtop.test: reading a\\nb failed"
    assert lines[1] == "Traceback (most recent call last):"
    assert lines[-1] == "ValueError: bad"


def test_on_a_terminal_the_time_is_kept():
    err = _agent_logging("""log.info("plain %d", 1)""", env={"PATH": "/usr/bin:/bin"})
    line = err.rstrip()
    assert "\n" not in line and line.endswith(" INFO lynxtop.test: plain 1")
    assert line[:4].isdigit()  # asctime first: no journal to add it
