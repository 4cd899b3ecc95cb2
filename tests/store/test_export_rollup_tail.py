"""`lynxtop export --resolution 1m|1h` exports the stored rollups only (docs/store.md, "lynxtop export").

What must hold (the documented behaviour, pinned): a rollup export has the complete buckets the writer has rolled
up, up to the rollup watermark, with the same samples as the dashboard's series() gives for them; the newest
buckets not rolled up yet (the current minute, the current hour) are not in it, while series() adds them on the
fly from raw rows, and the raw export has every sample, the newest included.
"""

from __future__ import annotations

import io

from lynxtop.store.export import export_table
from lynxtop.store.reader import StoreReader
from lynxtop.store.writer import StoreWriter

from .helpers import T0, submit

TICKS = 150  # one a second, 2 GPUs: minutes 0 and 1 complete (a later sample exists), minute 2 not


def _csv(path) -> list[dict[str, str]]:
    head, *rows = [line.split(",") for line in path.read_text().splitlines()]
    return [dict(zip(head, r, strict=True)) for r in rows]


def test_rollup_export_has_the_rolled_up_buckets_only(tmp_path):
    db = tmp_path / "h.db"
    w = StoreWriter(db, queue_max=10_000, maintenance_interval_s=3600, clock=lambda: T0 / 1000 + TICKS)
    w.start()
    submit(w, TICKS, gpus=2)
    assert w.flush(60)
    w.close()
    end = T0 + 3_600_000
    with StoreReader(db) as r:
        for res in ("1m", "1h"):
            export_table(r, "gpu", res, T0, end, tmp_path / f"{res}.csv", progress_stream=io.StringIO())
        export_table(r, "gpu", "raw", T0, end, tmp_path / "raw.csv", progress_stream=io.StringIO())
        _, minutes = r.series("gpu", ["util_gpu_pct"], T0, end, resolution="1m")
        _, hours = r.series("gpu", ["util_gpu_pct"], T0, end, resolution="1h")
    # series(): every minute and the hour, the newest from raw rows
    assert [(x["ts_ms"] - T0, x["gpu"], x["samples"]) for x in minutes] == [
        (0, 0, 60), (0, 1, 60), (60_000, 0, 60), (60_000, 1, 60), (120_000, 0, 30), (120_000, 1, 30)]
    assert [(x["ts_ms"] - T0, x["samples"]) for x in hours] == [(0, TICKS), (0, TICKS)]
    # export: the rolled-up minutes only, the same samples; no hour is complete, so no 1h row at all
    exported = [(int(x["ts_ms"]) - T0, int(x["gpu"]), int(x["samples"])) for x in _csv(tmp_path / "1m.csv")]
    assert exported == [(t - T0, g, n) for t, g, n in ((x["ts_ms"], x["gpu"], x["samples"]) for x in minutes)
                        if t < T0 + 120_000]
    assert _csv(tmp_path / "1h.csv") == []
    # the raw export has every sample, the newest included
    assert len(_csv(tmp_path / "raw.csv")) == 2 * TICKS
