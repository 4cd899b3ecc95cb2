"""In-memory 1-minute rollups (issue 29.2) give exactly the rows the SQL path gives, and steady ingest no
longer reads the raw GPU rows back to roll them up.

Two writers get the same random ticks in the same batches: one rolls GPU minutes up in memory, the other
with the SQL that re-reads the table (the path before issue 29.2). Every rollup table must match value for
value (averages compared with ==, not approx), across late and out-of-order rows, repeated ticks, NULLs and
missing keys, odd readings (floats, negatives, NaN, text, huge), minute and hour boundaries, batches that
span several minutes, and an agent restart in the middle of a minute whose first rows were stored before.
"""

from __future__ import annotations

import json
import random
import sqlite3

import pytest

from lynxtop.store.rollup import Rollups
from lynxtop.store.schema import SAMPLE_TABLES
from lynxtop.store.writer import StoreWriter, _insert_sql_nulls

from .helpers import T0, gpu_row, host_row, serving_row

MIN = 60_000
ROLLUP_TABLES = ("gpu_1m", "gpu_1h", "host_1m", "host_1h", "serving_1m", "serving_1h")


def _writer(db, in_memory: bool, end_ms: int) -> StoreWriter:
    w = StoreWriter(db, queue_max=100_000, batch_max_ticks=100_000, clock=lambda: end_ms / 1000)
    if not in_memory:
        w.rollups = Rollups(w.conn, in_memory=False)  # the SQL path, as before issue 29.2
    return w


Tick = tuple[int, list[dict], dict | None, dict | None]


def _write_batch(w: StoreWriter, batch: list[Tick], roll: bool = True) -> None:
    """One batch = one transaction, then (with `roll`) the writer's rollup steps, as its thread does; run
    inline here so both writers see exactly the same batches. Without `roll` the batch is written as during a
    backlog, where rollups wait (minutes complete in memory wait for the next step)."""
    for ts, rows, host, serving in batch:
        w.submit_tick(ts, rows, host, serving)
    with w._inline_lock:
        if not roll:
            ticks = list(w._ticks)
            w._ticks.clear()
            assert w._write_ticks(ticks)
            return
        w._drain_once()
        while w.rollups.step():
            pass


def _odd(rng: random.Random, row: dict) -> None:
    """Readings the memory path must not get wrong: each is either reproduced exactly or left to SQL."""
    col = rng.choice(["util_gpu_pct", "power_w", "mem_used_bytes", "energy_j", "temp_c"])
    row[col] = rng.choice([-3, -2.5, 7.5, 0.49999, 2**52 + 1, 2**53 + 3, float("nan"), "41", True, 1e15, None])


def _host(rng: random.Random, i: int) -> dict:
    """REAL readings of any magnitude (their average depends on the order they are added in), and odd ones."""
    row = host_row(i)
    row.update(cpu_pct=rng.uniform(0, 100) * rng.choice([1, 1e-6, 1e9]), load1=rng.random() / 3,
               vllm_cpu_pct=rng.choice([None, rng.uniform(0, 800), 7]), mem_used_bytes=rng.randint(0, 2**40))
    if rng.random() < 0.05:
        row[rng.choice(["load5", "vllm_cpu_pct", "cpu_pct"])] = rng.choice(
            [float("nan"), float("inf"), -float("inf"), "12.5", 2**53 + 1, -0.0, True])
    return row


def _serving(rng: random.Random, i: int) -> dict:
    row = serving_row(i, run_id=1)
    row.update(requests_per_s=rng.uniform(0, 50), ttft_p99_ms=rng.expovariate(1 / 300), tpot_p50_ms=None,
               requests_running=rng.randint(0, 256), kv_cache_usage_pct=rng.uniform(0, 100))
    return row


def _batches(seed: int) -> list[list[Tick]]:
    """About 40 minutes of ticks every 5 s, for 3 GPUs, cut into random batches, with disorder mixed in."""
    rng = random.Random(seed)
    start = T0 - 20 * MIN + rng.randrange(0, MIN, 5_000)  # crosses an hour boundary
    ticks = []
    for i in range(480):
        ts = start + i * 5_000
        gpus = [0, 1, 2] if rng.random() > 0.05 else [0, 2]  # a GPU missing from a tick
        rows = [gpu_row(g, i, rng, null_every=rng.choice([0, 3])) for g in gpus]
        if rng.random() < 0.05:
            _odd(rng, rows[0])
        ticks.append((ts, rows, _host(rng, i) if i % 2 else None, _serving(rng, i) if i % 3 else None))
    batches, i = [], 0
    while i < len(ticks):
        n = rng.choice([1, 1, 2, 5, 12, 30, 70])  # up to several minutes in one transaction
        batch = ticks[i:i + n]
        i = min(i + n, len(ticks))
        r = rng.random()
        if r < 0.15 and i > 30:  # a late tick: seconds to minutes old, into a minute already rolled up or not
            ts = ticks[rng.randrange(max(0, i - 30), i - 1)][0] + rng.choice([1, 2_500, 0])
            batch.append((ts, [gpu_row(1, i, rng)], _host(rng, i), None))  # +0: the same tick again (replaced)
        elif r < 0.25:
            rng.shuffle(batch)  # out of order inside one batch
        batches.append(batch)
    return batches


def _dump(db) -> dict:
    c = sqlite3.connect(db)
    try:
        out = {t: c.execute(f"SELECT * FROM {t} ORDER BY 1, 2").fetchall() for t in ROLLUP_TABLES}
        out["meta"] = c.execute("SELECT key, value FROM meta WHERE key LIKE 'rollup_wm_%' ORDER BY 1").fetchall()
        return out
    finally:
        c.close()


def _same_bits(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for table in a:
        assert len(a[table]) == len(b[table]), table
        for ra, rb in zip(a[table], b[table], strict=True):
            # repr: NaN-free rows compare equal only when every value, float bits and type included, is the same
            assert [(type(v), repr(v)) for v in ra] == [(type(v), repr(v)) for v in rb], (table, ra, rb)


@pytest.mark.parametrize("seed", range(6))
def test_memory_rollups_equal_the_sql_path_with_a_restart_mid_minute(tmp_path, seed):
    batches = _batches(seed)
    end = max(t[0] for b in batches for t in b) + 1
    cut = len(batches) // 2  # the agent restarts here: the minute in progress has rows stored before
    dbs = {mem: tmp_path / f"{'memory' if mem else 'sql'}.db" for mem in (True, False)}
    rng = random.Random(seed + 100)
    rolls = [rng.random() < 0.6 for _ in batches]
    for mem, db in dbs.items():
        for lo, hi in ((0, cut), (cut, len(batches))):
            w = _writer(db, mem, end)
            for i in range(lo, hi):
                _write_batch(w, batches[i], rolls[i])
            w.close()
    got, want = _dump(dbs[True]), _dump(dbs[False])
    for kind in ("gpu", "host", "serving"):  # the comparison covers real data
        assert len(want[f"{kind}_1m"]) > 30 and len(want[f"{kind}_1h"]) >= 1, kind
    _same_bits(got, want)


def test_steady_ingest_does_not_read_raw_gpu_rows_back(tmp_path):
    """The minutes a writer saw whole are rolled from memory: no SELECT over raw rows after the first step."""
    db = tmp_path / "h.db"
    w = _writer(db, True, T0 + 10 * MIN)
    statements: list[str] = []
    _write_batch(w, [(T0 + i * 1_000, [gpu_row(g, i) for g in range(2)], None, None) for i in range(90)])
    w.conn.set_trace_callback(statements.append)
    for k in range(1, 6):
        _write_batch(w, [(T0 + i * 1_000, [gpu_row(g, i) for g in range(2)], host_row(i), serving_row(i))
                         for i in range(90 * k, 90 * (k + 1))])
    w.conn.set_trace_callback(None)
    w.close()
    assert any("INSERT OR REPLACE INTO gpu_1m" in s for s in statements)  # minutes were rolled up meanwhile
    assert not [s for s in statements if "_samples WHERE" in s and "GROUP BY" in s]  # no aggregate of raw rows
    c = sqlite3.connect(db)
    wm = int(c.execute("SELECT value FROM meta WHERE key = 'rollup_wm_gpu_1m'").fetchone()[0])
    n, samples = c.execute("SELECT count(*), sum(samples) FROM gpu_1m").fetchone()
    c.close()
    last = T0 + 539 * 1_000
    assert wm == last - last % MIN and n == 2 * (wm - T0) // MIN and samples == 2 * (wm - T0) // 1_000


def test_many_rows_per_insert_store_what_one_row_inserts_store(tmp_path):
    """GPU rows go in ROWS_PER_INSERT to a statement: every value (rounded, NULL, replaced) lands as a one-row
    INSERT of the same row would land it, and a poisoned tick in the batch is still refused alone."""
    rng = random.Random(7)
    ticks = []
    for i in range(300):  # 2 statements of 128 rows per kind... and the rest one by one
        rows = [gpu_row(g, i, rng, null_every=5) for g in range(3)]
        if i % 11 == 0:
            _odd(rng, rows[1])
        if i == 77:
            rows.append(dict(rows[0], power_w=1.5))  # the same GPU twice in a tick: the later row wins
        ticks.append((T0 + i * 1_000, rows, _host(rng, i), _serving(rng, i)))
    ticks[150][1][2]["energy_j"] = 2**63  # too big for SQLite: this tick is refused, its neighbours are not
    db = tmp_path / "many.db"
    w = _writer(db, True, T0 + 400_000)
    _write_batch(w, ticks)
    assert w.stats()["rejected"] == 1
    w.close()

    ref = sqlite3.connect(tmp_path / "one.db")
    StoreWriter(tmp_path / "one.db").close()
    ref.execute("BEGIN")
    for ts, rows, host, serving in ticks[:150] + ticks[151:]:
        for kind, row in [("gpu", r) for r in rows] + [("host", host), ("serving", serving)]:
            t = SAMPLE_TABLES[kind]
            names = [m[0] for m in t.metrics]
            vals = [ts] + ([row["gpu"]] if t.per_gpu else []) + [row.get(n) for n in names]
            if kind == "host":
                vals[1 + names.index("cpu_per_core_pct")] = json.dumps(row["cpu_per_core_pct"])
            ref.execute(_insert_sql_nulls(kind, None), vals)  # one row, one statement
    ref.execute("COMMIT")
    got = sqlite3.connect(db)
    for table in ("gpu_samples", "host_samples", "serving_samples"):
        want = ref.execute(f"SELECT * FROM {table} ORDER BY 1, 2").fetchall()
        have = got.execute(f"SELECT * FROM {table} ORDER BY 1, 2").fetchall()
        assert len(have) == len(want) > 250
        for a, b in zip(have, want, strict=True):
            assert [(type(v), repr(v)) for v in a] == [(type(v), repr(v)) for v in b], (table, a, b)


def test_an_hour_not_yet_complete_is_not_looked_for_at_every_batch(tmp_path):
    """Before its first complete hour a database has no 1-hour watermark; the writer used to run a rollup
    transaction (and a min() over the 1-minute table) after every batch for it. Now once per new minute."""
    db = tmp_path / "h.db"
    w = _writer(db, True, T0 + 10 * MIN)
    statements: list[str] = []
    w.conn.set_trace_callback(statements.append)
    for i in range(240):  # 4 minutes, one tick per batch as the agent writes them
        w.submit_tick(T0 + i * 1_000, [gpu_row(0, i)])
        with w._inline_lock:
            w._drain_once()  # writes the tick, then the rollup step when pending() says there is work
    w.conn.set_trace_callback(None)
    w.close()
    looks = [s for s in statements if s.startswith("SELECT min(ts_ms) FROM gpu_1m")]
    assert 1 <= len(looks) <= 4, len(looks)
    c = sqlite3.connect(db)
    assert c.execute("SELECT count(*) FROM gpu_1m").fetchone()[0] == 3  # the minutes were still rolled
    c.close()


# (column, the readings of one minute cycled over its ticks): unchanged readings take _stats' shortcut (one
# count() instead of sum, min and max) only as plain ints in range; equal floats and bools beside an int, a
# negative or a float must still come out as SQLite stores and averages them. Odd minutes hold each
# column's first reading all minute long.
_STEADY = [("util_gpu_pct", [0]), ("mem_total_bytes", [150_754_820_096]), ("sm_clock_mhz", [1980, 1980.0, 1980]),
           ("ecc_corrected", [1, True, 1.0]), ("ecc_uncorrected", [1.0, 1, True]), ("temp_c", [-3]),
           ("mem_used_bytes", [2**47]), ("throttle_reasons", [True]), ("sm_active_pct", [None]),
           ("fp16_active_pct", [7.5]), ("fp32_active_pct", [7, 7, 7, 8]), ("util_mem_pct", [2**47 + 1, 2**47 + 1.0])]


def _memory_and_sql(tmp_path, batches: list) -> tuple[dict, dict]:
    """The same batches written by a writer rolling up in memory and by one rolling up by SQL: both dumps."""
    end = T0 + 10 * MIN
    dbs = {mem: tmp_path / f"{'memory' if mem else 'sql'}.db" for mem in (True, False)}
    for mem, db in dbs.items():
        w = _writer(db, mem, end)
        for batch in batches:
            _write_batch(w, batch)
        w.close()
    return _dump(dbs[True]), _dump(dbs[False])


def test_unchanged_readings_roll_up_as_the_sql_path_does(tmp_path):
    batches = []
    for m in range(4):
        batch = []
        for s in range(0, 60, 2):
            ts = T0 - T0 % MIN + m * MIN + s * 1_000
            rows = [gpu_row(g, s) for g in range(2)]
            for k, (col, cycle) in enumerate(_STEADY):
                rows[0][col] = cycle[(s // 2 + k) % len(cycle)] if m % 2 == 0 else cycle[0]
            batch.append((ts, rows, None, None))
        batches.append(batch)
    got, want = _memory_and_sql(tmp_path, batches)
    assert len(want["gpu_1m"]) == 2 * 3  # the last minute has no later sample yet
    _same_bits(got, want)


def test_ticks_of_the_same_gpus_roll_up_column_by_column_as_the_sql_path_does(tmp_path):
    """Every tick holds the same GPUs in the same (unsorted) order, as the sampler writes them: the memory path
    then slices each GPU's readings out of the bucket's columns and rolls a column unchanged on every GPU with
    one count(). Readings equal across GPUs but for one float, bool, None or out-of-range value must still come
    out as SQLite stores and averages them; a bucket whose ticks change their GPUs is grouped row by row."""
    order = [5, 0, 7, 2, 1, 6, 3, 4]
    cases = {"sm_clock_mhz": 1980.0, "ecc_corrected": True, "ecc_uncorrected": None, "mem_clock_mhz": -1,
             "remapped_rows_pending": 2**52, "power_limit_w": 700.5, "lost": 1}
    batches = []
    for m in range(5):
        batch = []
        for s in range(0, 60, 3):
            ts = T0 - T0 % MIN + m * MIN + s * 1_000
            rows = []
            for g in order[:7] if (m == 3 and s == 30) else order:  # minute 3: one tick lacks a GPU
                row = gpu_row(g, s)
                row.update(mem_total_bytes=150_754_820_096, sm_clock_mhz=1980, ecc_corrected=1, ecc_uncorrected=0,
                           mem_clock_mhz=3201, remapped_rows_pending=0, power_limit_w=700, lost=0)
                rows.append(row)
            if m % 2 == 1 and s == 57:  # one odd reading on one GPU, in the last tick of the minute
                for k, (col, value) in enumerate(cases.items()):
                    rows[k][col] = value
            batch.append((ts, rows, None, None))
        batches.append(batch)
    got, want = _memory_and_sql(tmp_path, batches)
    assert len(want["gpu_1m"]) == 8 * 4  # the last minute has no later sample yet
    _same_bits(got, want)
