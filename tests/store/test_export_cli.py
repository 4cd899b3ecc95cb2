"""`lynxtop export` and `lynxtop runs` through the real CLI entry point, on a real database."""

from __future__ import annotations

import csv
import io
import json
import sqlite3
import subprocess
import sys
import tracemalloc

import pytest

from lynxtop.__main__ import main
from lynxtop.contract.events import Event, EventKind
from lynxtop.store.export import build_query, export_table
from lynxtop.store.reader import StoreReader
from lynxtop.store.times import iso, parse_time
from lynxtop.store.writer import StoreWriter

from .helpers import T0, gpu_row, submit


@pytest.fixture
def db(tmp_path):
    path = tmp_path / "h.db"
    with StoreWriter(path, queue_max=5000) as w:
        rid = w.create_run(profile="dsv4-tp8", model="deepseek-ai/DeepSeek-V4.1", started_ms=T0 + 10_000,
                           simulated=True)
        w.update_run(rid, ready_ms=T0 + 20_000, ended_ms=T0 + 29_000, exit_code=0, end_reason="stopped")
        submit(w, 61, gpus=2, null_every=3, run_id=rid)  # minute 0 complete: rolled up
        w.record(Event(EventKind.SERVING_READY, "info", "ready, with a comma", {"a": 1}, run_id=rid, ts_ms=T0 + 20_000))
    return path


def _csv(text: str) -> list[list[str]]:
    return list(csv.reader(io.StringIO(text)))


def test_export_stdout_header_iso_and_empty_nulls(db, capsys):
    assert main(["export", "--database", str(db), "--from", str(T0), "--to", iso(T0 + 3000)]) == 0
    rows = _csv(capsys.readouterr().out)
    head = rows[0]
    assert head[:4] == ["time_utc", "ts_ms", "gpu", "lost"]
    assert len(rows) == 1 + 3 * 2
    first = dict(zip(head, rows[1], strict=True))
    assert first["time_utc"] == iso(T0) and first["time_utc"].endswith(".000Z") and first["ts_ms"] == str(T0)
    assert first["sm_active_pct"] == "" and first["temp_c"] == ""  # tick 0 has NULLs: empty, not 0
    assert first["power_w"].isdigit()


def test_export_file_refuses_overwrite_without_force(db, tmp_path, capsys):
    out = tmp_path / "gpu.csv"
    args = ["export", "--database", str(db), "--from", str(T0), "--to", str(T0 + 60_000), "-o", str(out)]
    assert main(args) == 0
    assert len(_csv(out.read_text())) == 1 + 120
    assert "100%" in capsys.readouterr().err  # the progress bar's last state
    out.write_text("keep me")
    assert main(args) == 2
    assert f"{out} already exists; use --force" in capsys.readouterr().err
    assert out.read_text() == "keep me"
    assert main([*args, "--force"]) == 0
    assert len(_csv(out.read_text())) == 121
    assert not list(tmp_path.glob(".gpu.csv.*"))  # no temporary file left behind


def test_export_run_span_tables_and_resolution(db, tmp_path, capsys):
    assert main(["export", "--database", str(db), "--run", "1", "--table", "serving"]) == 0
    rows = _csv(capsys.readouterr().out)
    assert [r[1] for r in rows[1:]] == [str(T0 + i * 1000) for i in range(10, 30)]
    assert main(["export", "--database", str(db), "--run", "1", "--table", "events"]) == 0
    ev = _csv(capsys.readouterr().out)
    assert ev[1][ev[0].index("message")] == "ready, with a comma"
    assert json.loads(ev[1][ev[0].index("details")]) == {"a": 1}
    assert main(["export", "--database", str(db), "--from", str(T0), "--table", "gpu", "--resolution", "1m"]) == 0
    m = _csv(capsys.readouterr().out)
    assert m[0][:5] == ["time_utc", "ts_ms", "gpu", "samples", "lost_min"] and len(m) == 1 + 2  # minute 0, 2 GPUs
    d = tmp_path / "all"
    assert main(["export", "--database", str(db), "--from", str(T0), "--table", "all", "-o", str(d)]) == 0
    assert sorted(p.name for p in d.iterdir()) == ["events.csv", "gpu.csv", "host.csv", "runs.csv", "serving.csv"]
    assert _csv((d / "runs.csv").read_text())[1][2] == "1"
    assert main(["export", "--database", str(db), "--from", str(T0), "--table", "all", "-o", str(d)]) == 2
    assert "already exist" in capsys.readouterr().err


@pytest.mark.parametrize("argv, message", [
    (["--from", "yesterday"], "'yesterday' is not a time"),
    (["--from", "1700000000"], "epoch seconds"),
    (["--from", "2026-12-01T10:00", "--to", "2026-12-01T09:00"], "must be after --from"),
    (["--run", "42"], "no run 42"),
    (["--run", "1", "--to", "now"], "--to goes with --from"),
    (["--from", "2026-01-01", "--table", "all"], "give a directory with -o DIR"),
])
def test_export_user_mistakes_exit_2_with_a_message(db, capsys, argv, message):
    assert main(["export", "--database", str(db), *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_missing_or_foreign_database(tmp_path, capsys):
    missing = tmp_path / "none.db"
    assert main(["runs", "--database", str(missing)]) == 2
    assert f"{missing}: no history database here" in capsys.readouterr().err
    foreign = tmp_path / "notes.txt"
    foreign.write_text("hello" * 100)
    assert main(["export", "--database", str(foreign), "--from=-1h"]) == 2
    assert f"{foreign}: not an SQLite database" in capsys.readouterr().err


def test_runs_listing(db, capsys):
    assert main(["runs", "--database", str(db)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split()[:3] == ["RUN", "PROFILE", "MODEL"]
    assert "dsv4-tp8" in out[1] and "(simulated)" in out[1] and "stopped, exit 0" in out[1]
    assert " 10s " in out[1] and " 19s " in out[1]  # load time, duration (contract.format, as everywhere)
    assert main(["runs", "--database", str(db), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data[0]["profile"] == "dsv4-tp8" and data[0]["simulated"] is True


def test_export_is_streamed(tmp_path):
    path = tmp_path / "big.db"
    with StoreWriter(path, queue_max=10_000) as w:
        row = gpu_row(0, 0)
        for i in range(2400):
            w.submit_tick(T0 + i * 1000, [{**row, "gpu": g} for g in range(8)])
    r = StoreReader(path)
    peaks = {}
    for ticks in (300, 2400):
        out = tmp_path / f"{ticks}.csv"
        tracemalloc.start()
        n = export_table(r, "gpu", "raw", T0, T0 + ticks * 1000, out, progress_stream=io.StringIO())
        peaks[ticks] = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        assert n == ticks * 8
    # 8x the rows, same memory: a chunk at a time, not the whole export
    assert peaks[2400] < 1.3 * peaks[300] and peaks[2400] < (tmp_path / "2400.csv").stat().st_size / 3


def test_parse_time_forms():
    assert parse_time("2026-12-01T10:00") == parse_time("2026-12-01T11:00+01:00") == 1796119200000
    assert parse_time("2026-12-01T10:00Z") == 1796119200000
    assert parse_time("-1h", now_ms=10_000_000) == 6_400_000
    assert parse_time("1796119200000") == 1796119200000


FORMULAS = ["=HYPERLINK(\"http://x\",\"y\")", "+1+1", "-2+3", "@SUM(A1:A2)", "\tcmd", "\rcmd", "=1,2"]


def test_export_neutralises_formula_text_cells_unless_raw(tmp_path, capsys):
    """OWASP "CSV Injection": a text cell a spreadsheet would run as a formula gets a leading quote."""
    path = tmp_path / "f.db"
    with StoreWriter(path) as w:
        rid = w.create_run(profile="=cmd|' /C calc'!A0", argv=["-m", "x"], model="@evil", started_ms=T0,
                           simulated=True)
        w.update_run(rid, ended_ms=T0 + 5000, exit_code=-1, exit_signal=-9, end_reason="-crashed")
        for i, m in enumerate(FORMULAS):
            w.record(Event(EventKind.SERVING_PHASE, "info", m, ts_ms=T0 + i))
        w.record(Event(EventKind.SERVING_PHASE, "info", "plain, text", ts_ms=T0 + 100))
    span = ["--from", str(T0 - 1000), "--to", str(T0 + 10_000)]

    def export(table: str, *extra: str) -> list[list[str]]:
        assert main(["export", "--database", str(path), *span, "--table", table, *extra]) == 0
        return list(csv.reader(io.StringIO(capsys.readouterr().out, newline="")))

    events = export("events")
    assert [r[6] for r in events[1:]] == ["'" + m for m in FORMULAS] + ["plain, text"]
    runs = export("runs")
    run = dict(zip(runs[0], runs[1], strict=True))
    assert run["profile"] == "'=cmd|' /C calc'!A0" and run["model"] == "'@evil"
    assert run["end_reason"] == "'-crashed"
    assert run["argv"] == '["-m", "x"]'
    assert run["exit_code"] == "-1" and run["exit_signal"] == "-9"  # numbers stay numbers, negative ones too
    assert run["ts_ms"] == str(T0)
    raw_events = export("events", "--raw")
    assert [r[6] for r in raw_events[1:]] == [*FORMULAS, "plain, text"]
    raw_run = dict(zip(*export("runs", "--raw")[:2], strict=True))
    assert raw_run["profile"] == "=cmd|' /C calc'!A0" and raw_run["exit_code"] == "-1"


def test_export_to_a_full_stdout_names_stdout(db):
    """`lynxtop export > /dev/full`: one line naming stdout, exit 1, no traceback, no second error at exit."""
    with open("/dev/full", "w") as full:
        r = subprocess.run([sys.executable, "-m", "lynxtop", "export", "--database", str(db), "--from", str(T0),
                            "--to", str(T0 + 60_000)], stdout=full, stderr=subprocess.PIPE, text=True, timeout=60)
    assert r.returncode == 1, r.stderr
    assert r.stderr == "lynxtop export: cannot write to stdout: No space left on device\n", r.stderr


def test_export_of_events_uses_the_dotted_kinds(tmp_path, capsys):
    """Events an older agent stored as `xid` export as `gpu.xid`, like StoreReader.events reads them."""
    path = tmp_path / "k.db"
    with StoreWriter(path) as w:
        w.record(Event("serving.ready", "info", "new", ts_ms=T0 + 1))
    c = sqlite3.connect(path)
    c.executemany("INSERT INTO events (ts_ms, kind, severity, message) VALUES (?, ?, ?, ?)",
                  [(T0, "xid", "error", "old"), (T0 + 2, "=odd", "info", "unknown")])
    c.commit()
    c.close()
    q = build_query("events", "raw", T0 - 1, T0 + 10)
    with StoreReader(path) as r:
        plain = [row[4] for row in r.stream(q.plain_sql, q.params)[1]]
    assert plain == ["gpu.xid", "serving.ready", "=odd"]
    assert main(["export", "--database", str(path), "--from", str(T0 - 1000), "--table", "events"]) == 0
    rows = list(csv.reader(io.StringIO(capsys.readouterr().out, newline="")))
    assert [r[rows[0].index("kind")] for r in rows[1:]] == ["gpu.xid", "serving.ready", "'=odd"]
