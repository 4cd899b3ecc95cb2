"""`lynxtop status` on a full disk (audit, session 17): the operator at 3 a.m. must read that history is not being
written, where the database is, how full its file system is and how many ticks wait or were lost; and why the
run's log is not kept (`serving.log_problem`, in the JSON but never printed before).

The status is answered on a real unix socket and read by the real command; every foreign string stays escaped.
"""

from __future__ import annotations

from support.status import status_json
from support.status_socket import status_text

DB = "/var/lib/lynxtop/lynxtop.db"
LOG_PROBLEM = "the file system of the run's log /var/log/lynxtop/runs/3.log is full (0 bytes free)"
FULL = {"path": DB, "queued": 1234, "dropped": 56, "rejected": 0, "last_error": "database or disk is full",
        "retrying": True, "free_bytes": 0}


def _line(out: str, start: str) -> str:
    return next((ln for ln in out.splitlines() if ln.startswith(start)), f"<no line starting {start!r}>\n{out}")


def test_a_full_disk_says_history_is_not_written_where_and_what_is_lost(sock_dir, capsys):
    out = status_text(sock_dir, capsys, status_json(agent={"store": FULL}))
    line = _line(out, "history")
    assert f"NOT WRITING - disk full: {DB} (0 B free), 1,234 ticks queued, 56 dropped" in line, line


def test_the_run_log_problem_is_printed(sock_dir, capsys):
    out = status_text(sock_dir, capsys, status_json(agent={"store": FULL}, log_problem=LOG_PROBLEM))
    assert LOG_PROBLEM in out, out
    assert LOG_PROBLEM in _line(out, "run log"), out



def test_a_failing_store_that_is_not_full_names_its_error(sock_dir, capsys):
    locked = {**FULL, "last_error": "database is locked", "free_bytes": 50 * 1024**3, "queued": 3, "dropped": 0}
    line = _line(status_text(sock_dir, capsys, status_json(agent={"store": locked})), "history")
    assert f"NOT WRITING - database locked: {DB} (50.0 GiB free), 3 ticks queued, 0 dropped" in line, line


def test_history_written_prints_no_alarm(sock_dir, capsys):
    ok = {"path": DB, "queued": 0, "dropped": 0, "last_error": None, "retrying": False, "free_bytes": 10**12}
    out = status_text(sock_dir, capsys, status_json(agent={"store": ok}))
    assert "NOT WRITING" not in out and "run log" not in out, out


def test_foreign_text_of_the_store_and_the_log_is_escaped(sock_dir, capsys):
    evil = {**FULL, "path": "/var/lib/\x1b[2Jlynxtop.db", "last_error": "database or disk is full\x1b]0;pwned\x07"}
    out = status_text(sock_dir, capsys, status_json(agent={"store": evil}, log_problem="log \u202efull\x1b[31m"))
    assert "\x1b" not in out and "\x07" not in out and "\u202e" not in out, repr(out)
    assert "/var/lib/\\x1b[2Jlynxtop.db" in _line(out, "history"), out
    assert "log \\u202efull\\x1b[31m" in out, out
