"""A raw row on the key of a compacted row (a clock stepped back, before the next compaction pass merged it).

What must hold: the reader serves such a key once, as the raw row, in every path that reads raw rows and chunks
together: series() at raw resolution (all GPUs and one GPU), the on-the-fly rollup tail of series() at 1m, and
the raw CSV export (its rows and the row count its progress line shows). That is the rule compaction's merge
and the rollups' re-roll follow (store/compact.py merge, store/rollup.py Rollups._roll_with_chunks), so the
dashboard, export and rollups agree, before and after the next compaction pass.
"""

from __future__ import annotations

import io

from lynxtop.store import compact
from lynxtop.store.export import export_table
from lynxtop.store.reader import StoreReader
from lynxtop.store.schema import connect_rw
from lynxtop.store.writer import StoreWriter

from .helpers import T0, submit

TICKS = 100  # one a second, 2 GPUs: all inside the first ten-minute interval
LATE = T0 + 65_000  # the late raw row's key (gpu 0): in the minute the 1m tail aggregates from raw rows


def _build(db) -> None:
    w = StoreWriter(db, queue_max=10_000, maintenance_interval_s=3600, clock=lambda: T0 / 1000 + 4 * 3600)
    w.start()
    submit(w, TICKS, gpus=2)
    assert w.flush(60)
    w.close()
    conn = connect_rw(db)
    try:
        compact.compact_interval(conn, "gpu_samples", T0)
        compact.compact_interval(conn, "host_samples", T0)
        assert conn.execute("SELECT count(*) FROM gpu_samples").fetchone()[0] == 0
        # a clock stepped back: the agent writes again a key the chunk already holds, with other readings
        conn.execute("INSERT INTO gpu_samples (ts_ms, gpu, util_gpu_pct) VALUES (?, 0, 4242)", (LATE,))
        conn.execute("INSERT INTO host_samples (ts_ms, cpu_pct) VALUES (?, 4242.5)", (LATE,))
    finally:
        conn.close()


def test_series_serves_the_raw_row_once_over_a_compacted_row(tmp_path):
    """series() at raw: one row per key; on the duplicated key, the raw row's readings."""
    db = tmp_path / "h.db"
    _build(db)
    with StoreReader(db) as r:
        _, rows = r.series("gpu", ["util_gpu_pct"], T0, T0 + TICKS * 1000, resolution="raw")
        keys = [(x["ts_ms"], x["gpu"]) for x in rows]
        assert len(keys) == len(set(keys)) == 2 * TICKS
        assert [x["util_gpu_pct"] for x in rows if (x["ts_ms"], x["gpu"]) == (LATE, 0)] == [4242]
        _, one = r.series("gpu", ["util_gpu_pct"], T0, T0 + TICKS * 1000, gpu=0, resolution="raw")
        assert len(one) == TICKS and [x["util_gpu_pct"] for x in one if x["ts_ms"] == LATE] == [4242]
        _, host = r.series("host", ["cpu_pct"], T0, T0 + TICKS * 1000, resolution="raw")
        assert len(host) == TICKS and [x["cpu_pct"] for x in host if x["ts_ms"] == LATE] == [4242.5]


def test_series_tail_counts_the_duplicated_key_once(tmp_path):
    """The 1m tail aggregated from raw rows and chunks: the minute holding the late key has its 40 samples, not
    41, and its max is the raw row's reading."""
    db = tmp_path / "h.db"
    _build(db)
    with StoreReader(db) as r:
        _, rows = r.series("gpu", ["util_gpu_pct"], T0, T0 + TICKS * 1000, gpu=0, resolution="1m")
    minute = [x for x in rows if x["ts_ms"] == T0 + 60_000]
    assert len(minute) == 1 and minute[0]["samples"] == TICKS - 60 and minute[0]["util_gpu_pct_max"] == 4242


def test_raw_export_writes_the_raw_row_once(tmp_path):
    """Raw CSV export: one line per key, the raw row's on the duplicated key, and the same count as progress."""
    db = tmp_path / "h.db"
    _build(db)
    out = tmp_path / "gpu.csv"
    progress = io.StringIO()
    with StoreReader(db) as r:
        n = export_table(r, "gpu", "raw", T0, T0 + TICKS * 1000, out, progress_stream=progress)
    lines = out.read_text().splitlines()
    header, body = lines[0].split(","), [line.split(",") for line in lines[1:]]
    ts, gpu, util = header.index("ts_ms"), header.index("gpu"), header.index("util_gpu_pct")
    keys = [(int(x[ts]), int(x[gpu])) for x in body]
    assert n == len(keys) == len(set(keys)) == 2 * TICKS
    assert [x[util] for x in body if (int(x[ts]), int(x[gpu])) == (LATE, 0)] == ["4242"]
    assert f" {2 * TICKS}/{2 * TICKS} rows" in progress.getvalue()
