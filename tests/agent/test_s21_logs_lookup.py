"""`GET /v1/logs?run=N` looks up the run's log path only: it reads none of the run's history.

agent/controller.py looked the path up with `r.run(run_id)`, whose summary decodes every compacted serving chunk
the run spans and aggregates its GPU rows, on the agent's one history reader under its lock (every other history
call waited: 19 s and +190 MB for a 3-day run). These tests use a real database file and the real reader.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace

from lynxtop.agent.controller import NodeController
from lynxtop.store import codec, compact
from lynxtop.store.schema import chunk_table, connect_rw

T0 = 1_790_000_000_000
HOURS = 6


def _run_with_compacted_serving(db: Path, log: Path, *, damaged: bool = False) -> None:
    """Run 1 (ended, its log at `log`) with HOURS of compacted 1 Hz serving rows; run 2 after it."""
    c = connect_rw(db)
    end = T0 + HOURS * 3_600_000
    c.execute("INSERT INTO runs (id, profile, started_ms, ended_ms, log_path) VALUES (1, 'p', ?, ?, ?)",
              (T0, end, str(log)))
    c.execute("INSERT INTO runs (id, profile, started_ms) VALUES (2, 'p', ?)", (end + 1,))
    cols = compact.columns(c, "serving_samples")
    rows = []
    for k in range(HOURS * 6):
        start = T0 + k * compact.CHUNK_MS
        chunk = [tuple({"ts_ms": start + i * 1000, "run_id": 1, "scrape_ok": 1}.get(col) for col in cols)
                 for i in range(600)]
        blob = b"not a chunk" if damaged and k == 3 else codec.encode(cols, chunk)
        rows.append((start, 0, start + compact.CHUNK_MS, 600, blob))
    c.execute("BEGIN")
    c.executemany(f"INSERT INTO {chunk_table('serving_samples')} (start_ms, gpu, end_ms, rows, data) "
                  "VALUES (?, ?, ?, ?, ?)", rows)
    c.execute("COMMIT")
    c.close()


def _controller(db: Path) -> NodeController:
    writer = SimpleNamespace(stats=lambda: {}, flush=lambda timeout: True)
    node = SimpleNamespace(writer=writer, supervisor=SimpleNamespace(), interval=1.0,
                           cfg=SimpleNamespace(agent=SimpleNamespace(database=db)))
    return NodeController(node)  # type: ignore[arg-type]


def _decoded_serving_rows(reader) -> int:
    """Rows the reader holds decoded from serving chunks (its temp table), 0 when it decoded none."""
    if "serving_samples" not in reader._decoded:
        return 0
    return reader.conn.execute("SELECT count(*) FROM temp._dec_serving_samples").fetchone()[0]


def test_reading_an_old_runs_log_decodes_no_history(tmp_path):
    db, log = tmp_path / "lynxtop.db", tmp_path / "run1.log"
    log.write_text("INFO line one\nINFO line two\n")
    _run_with_compacted_serving(db, log)
    ctl = _controller(db)
    try:
        answer = asyncio.run(ctl.logs(1, 10))
        assert answer["path"] == str(log) and answer["run_id"] == 1
        assert _decoded_serving_rows(ctl._reader) == 0, "a log path lookup decoded run 1's serving rows"
    finally:
        ctl._reader.close()


def test_a_runs_log_is_served_even_when_its_history_cannot_be_decoded(tmp_path):
    """A chunk the reader cannot decode (damage, a newer format) fails a summary; it has nothing to do with the
    run's log, which is still served."""
    db, log = tmp_path / "lynxtop.db", tmp_path / "run1.log"
    log.write_text("INFO line one\nINFO line two\n")
    _run_with_compacted_serving(db, log, damaged=True)
    ctl = _controller(db)
    try:
        answer = asyncio.run(ctl.logs(1, 10))
        assert answer["path"] == str(log)
        assert answer["lines"] is not None
    finally:
        ctl._reader.close()
