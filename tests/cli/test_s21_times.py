"""Times the CLI prints: a corrupt stored time is a marker, never a traceback; a printed local time carries its UTC
offset and reads back into --since as the very same instant (any TZ, the repeated DST hour too); a non-ASCII digit
in --since is the ordinary "is not a time" message.

Real SQLite databases written by StoreWriter, the real CLI in a subprocess with TZ set (the zone is read at start).
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lynxtop.contract.events import Event, EventKind, Severity
from lynxtop.contract.format import fmt_clock, fmt_datetime
from lynxtop.store.times import MAX_MS, iso, parse_time
from lynxtop.store.writer import StoreWriter

NOW = int(time.time() * 1000)
BAD = 2**62  # past year 9999: what a node with a wild clock could have stored
T_EVENT = 1_796_119_200_000  # 2026-12-01T10:00:00Z = 15:30:00 in Asia/Kolkata
FALLBACK_A = 1_793_511_000_000  # 2026-11-01T05:30:00Z = 01:30 EDT
FALLBACK_B = FALLBACK_A + 3_600_000  # 2026-11-01T06:30:00Z = 01:30 EST (the repeated hour)


def _cli(*argv: str, tz: str = "UTC") -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "TZ": tz}
    return subprocess.run([sys.executable, "-m", "lynxtop", *argv], capture_output=True, text=True, timeout=60,
                          env=env)


def _db(path: Path, *stamps: int) -> Path:
    with StoreWriter(path) as w:
        for i, ts in enumerate(stamps):
            w.record(Event(EventKind.SERVING_READY, Severity.INFO, f"event {i}", ts_ms=ts))
    return path


def _time_field(out: str, message: str) -> str:
    """The TIME column of the line holding `message`, as an operator would select it (columns are 2 spaces apart)."""
    line = next(x for x in out.splitlines() if x.endswith(message))
    return line.split("  ")[0].strip()


# ------------------------------------------------------------------------------------------- corrupt times

@pytest.fixture
def bad_db(tmp_path: Path) -> Path:
    path = tmp_path / "h.db"
    with StoreWriter(path) as w:
        run = w.create_run(profile="p", model="m", started_ms=BAD)
        w.record(Event(EventKind.SERVING_READY, Severity.INFO, "good", ts_ms=NOW - 60_000))
        w.record(Event(EventKind.SERVING_READY, Severity.INFO, "corrupt", run_id=run, ts_ms=BAD))
    return path


@pytest.mark.parametrize("ms", [BAD, -1, -BAD, MAX_MS + 1, 1e300, math.nan, math.inf, -math.inf])
@pytest.mark.parametrize("utc", [True, False])
def test_a_time_that_cannot_be_written_as_a_date_is_a_marker(ms, utc):
    for text in (fmt_datetime(ms, utc), fmt_datetime(ms, utc, seconds=True, zone=True), fmt_clock(ms, utc), iso(ms)):
        assert text.startswith("<bad time ") and text.endswith(">"), (ms, text)
    assert fmt_datetime(BAD, utc) == f"<bad time {BAD}>"
    assert len(fmt_datetime(1e300, utc)) < 40  # a float's exponent, not 300 digits


def test_the_edges_of_the_range_still_format():
    assert iso(0) == "1970-01-01T00:00:00.000Z"
    assert iso(MAX_MS) == "9999-12-31T23:59:59.999Z"
    assert fmt_datetime(MAX_MS, utc=True, seconds=True) == "9999-12-31 23:59:59 UTC"


def test_events_lists_the_good_event_and_marks_the_corrupt_one(bad_db):
    res = _cli("events", "--database", str(bad_db))
    assert res.returncode == 0 and "Traceback" not in res.stderr, res.stderr[-600:]
    assert _time_field(res.stdout, "corrupt") == f"<bad time {BAD}>", res.stdout
    assert "good" in res.stdout
    res = _cli("events", "--database", str(bad_db), "--utc")
    assert res.returncode == 0 and f"<bad time {BAD}>" in res.stdout, res.stderr[-600:]


def test_runs_marks_a_corrupt_start(bad_db):
    res = _cli("runs", "--database", str(bad_db))
    assert res.returncode == 0 and "Traceback" not in res.stderr, res.stderr[-600:]
    row = res.stdout.splitlines()[1]
    assert f"<bad time {BAD}>" in row, res.stdout


def test_export_of_a_run_with_a_corrupt_start_says_so_in_one_line(bad_db, tmp_path):
    res = _cli("export", "--database", str(bad_db), "--run", "1", "-o", str(tmp_path / "o.csv"))
    assert "Traceback" not in res.stderr, res.stderr[-600:]
    assert res.returncode == 2, res.stderr
    assert len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert f"<bad time {BAD}>" in res.stderr and "--from" in res.stderr, res.stderr


def test_export_of_events_over_a_window_keeps_the_corrupt_row_with_an_empty_time(bad_db, tmp_path):
    out = tmp_path / "ev.csv"
    res = _cli("export", "--database", str(bad_db), "--table", "events", "--from", "-1h", "--to", "now", "-o",
               str(out))
    assert res.returncode == 0 and "Traceback" not in res.stderr, res.stderr[-600:]
    assert "good" in out.read_text()


# ------------------------------------------------------------------------------------- printed == parsed back

@pytest.mark.parametrize("tz", ["Asia/Kolkata", "America/New_York", "UTC", "Pacific/Chatham"])
def test_a_printed_local_time_typed_back_into_since_is_that_very_instant(tmp_path, tz):
    db = _db(tmp_path / "h.db", T_EVENT, T_EVENT + 1000)
    shown = _cli("events", "--database", str(db), tz=tz)
    assert shown.returncode == 0, shown.stderr
    printed = _time_field(shown.stdout, "event 1")
    assert printed[19] in "+-", f"no UTC offset on a local time: {printed!r}"
    if tz == "Asia/Kolkata":
        assert printed == "2026-12-01 15:30:01+05:30", shown.stdout
    assert parse_time(printed) == T_EVENT + 1000
    again = _cli("events", "--database", str(db), "--since", printed, tz=tz)
    assert again.returncode == 0, again.stderr
    assert "event 1" in again.stdout and "event 0" not in again.stdout, again.stdout


def test_a_printed_utc_time_typed_back_into_since_is_that_very_instant(tmp_path):
    db = _db(tmp_path / "h.db", T_EVENT, T_EVENT + 1000)
    shown = _cli("events", "--database", str(db), "--utc", tz="Asia/Kolkata")
    assert shown.stdout.splitlines()[0].startswith("TIME (UTC)"), shown.stdout
    printed = _time_field(shown.stdout, "event 1")
    assert printed == "2026-12-01 10:00:01 UTC", shown.stdout
    again = _cli("events", "--database", str(db), "--since", printed, tz="Asia/Kolkata")
    assert "event 1" in again.stdout and "event 0" not in again.stdout, (again.stdout, again.stderr)


def test_the_repeated_dst_hour_prints_two_instants_differently_and_each_reads_back(tmp_path):
    db = _db(tmp_path / "h.db", FALLBACK_A, FALLBACK_B)
    shown = _cli("events", "--database", str(db), tz="America/New_York").stdout
    a, b = _time_field(shown, "event 0"), _time_field(shown, "event 1")
    assert (a, b) == ("2026-11-01 01:30:00-04:00", "2026-11-01 01:30:00-05:00"), shown
    assert (parse_time(a), parse_time(b)) == (FALLBACK_A, FALLBACK_B)


# -------------------------------------------------------------------------------------------- parse_time

@pytest.mark.parametrize("text", ["2026-12-01 10:00:00 UTC", "2026-12-01 10:00:00 utc", "2026-12-01T10:00:00Z",
                                  "2026-12-01 15:30:00+05:30", "2026-12-01T10:00", str(T_EVENT)])
def test_parse_time_reads_the_forms_printed_and_documented(text):
    assert parse_time(text) == T_EVENT


@pytest.mark.parametrize("text", ["1735689600000\u00b2", "\u0661\u0667\u0663\u0665\u0666\u0668\u0669\u0666\u0660"
                                  "\u0660\u0660\u0660\u0660"])
def test_a_non_ascii_digit_is_not_a_time_not_a_python_message(text):
    with pytest.raises(ValueError, match="is not a time") as info:
        parse_time(text)
    assert "invalid literal" not in str(info.value)


def test_since_with_a_superscript_digit_is_one_line_exit_2(tmp_path):
    db = _db(tmp_path / "h.db", T_EVENT)
    res = _cli("events", "--database", str(db), "--since", "1735689600000\u00b2")
    assert res.returncode == 2 and "is not a time" in res.stderr and "invalid literal" not in res.stderr, res.stderr
    assert len(res.stderr.strip().splitlines()) == 1, res.stderr


def test_status_times_carry_their_offset_and_read_back(monkeypatch):
    """`lynxtop status`'s full times (an action in progress, a WAL or database swap, a dead node) are what an
    operator pastes into --since: with their UTC offset they read back to the same instant."""
    from lynxtop.cli.ctl import _agent_lines
    from lynxtop.contract.status import ActionInfo, AgentStatus

    monkeypatch.setenv("TZ", "Asia/Kolkata")
    time.tzset()
    try:
        since = 1_764_590_400_000  # 2025-12-01 12:00:00 UTC
        line = next(x for x in _agent_lines(AgentStatus(action=ActionInfo("restart", "p", since_ms=since, by="u")))
                    if x.startswith("action"))
        printed = line.split("since ")[1].split(" by")[0]
        assert printed == "2025-12-01 17:30:00+05:30", line
        assert parse_time(printed) == since
    finally:
        monkeypatch.delenv("TZ")
        time.tzset()
