"""The writer's insert path (issues 29.2, 29.3): few statements per batch, no row-by-row NULL scan of rows that
have no missing reading, and every value stored exactly as a one-row INSERT of the same row stores it.

Counted, not timed: statement executions through SQLite's trace callback, rows through the NULL-pattern path.
"""

from __future__ import annotations

import json
import random
import re
import sqlite3
from collections import Counter

from lynxtop.contract.columns import NVLINK_METRICS, names
from lynxtop.store import writer as writer_mod
from lynxtop.store.schema import PROCESS_COLUMNS, SAMPLE_TABLES
from lynxtop.store.writer import StoreWriter, _insert_sql

from .helpers import T0, gpu_row, host_row, serving_row

TABLES = ("gpu_samples", "nvlink_samples", "host_samples", "serving_samples", "gpu_processes")
# kind -> (table, key columns, metric names and types): a row's values in the table's column order
LAYOUT = {**{kind: (t.name, t.key, t.metrics) for kind, t in SAMPLE_TABLES.items()},
          "processes": ("gpu_processes", ("ts_ms", "gpu", "pid"), tuple((n, t, "") for n, t in PROCESS_COLUMNS))}


def _nvlink_row(gpu: int, rng: random.Random, missing: bool = False) -> dict:
    row = {"gpu": gpu, **{c: rng.randint(0, 3_000_000_000) for c in names(NVLINK_METRICS)}}
    if missing:
        row["l17_rx_bytes_per_s"] = None  # a link NVML did not answer for this tick
    return row


def _tick(i: int, rng: random.Random, step_ms: int = 100, gpus: int = 8, null_gpu: bool = False) -> tuple:
    rows = [gpu_row(g, i, rng) for g in range(gpus)]
    if null_gpu:
        rows[3]["sm_active_pct"] = None
    links = [_nvlink_row(g, rng, missing=null_gpu and g == 5) for g in range(gpus)]
    procs = [{"gpu": g, "pid": 1000 + g, "used_mem_bytes": None if g % 2 else 70_000_000_000.4 + i,
              "in_vllm_tree": 1} for g in range(gpus)]  # two NULL patterns
    return T0 + i * step_ms, rows, host_row(i), serving_row(i, 1), links, procs


def _write(w: StoreWriter, ticks: list[tuple]) -> None:
    """One batch, one transaction, as the writer thread writes a lingering second."""
    for ts, rows, host, serving, links, procs in ticks:
        w.submit_tick(ts, rows, host, serving, links, procs)
    with w._inline_lock:
        batch = list(w._ticks)
        w._ticks.clear()
        assert w._write_ticks(batch)


def _reference(tmp_path, ticks: list[tuple]) -> sqlite3.Connection:
    """The same rows, one row per statement, None bound as it is: what the store held before any batching."""
    StoreWriter(tmp_path / "one.db").close()
    ref = sqlite3.connect(tmp_path / "one.db")
    ref.execute("BEGIN")
    for ts, rows, host, serving, links, procs in ticks:
        for kind, group in (("gpu", rows), ("nvlink", links), ("host", [host]), ("serving", [serving]),
                            ("processes", procs)):
            table, key, metrics = LAYOUT[kind]
            cols = [m[0] for m in metrics]
            sql = _insert_sql(table, key, metrics)  # one row, one statement, None bound as it is
            for row in group:
                vals = [ts] + [row[k] for k in key[1:]] + [row.get(n) for n in cols]
                if kind == "host" and row["cpu_per_core_pct"] is not None:  # a missing list stays NULL
                    vals[1 + cols.index("cpu_per_core_pct")] = json.dumps(row["cpu_per_core_pct"])
                ref.execute(sql, vals)
    ref.execute("COMMIT")
    return ref


def _same(db, ref: sqlite3.Connection, least: int) -> None:
    got = sqlite3.connect(db)
    try:
        for table in TABLES:
            want = ref.execute(f"SELECT * FROM {table} ORDER BY 1, 2, 3").fetchall()
            have = got.execute(f"SELECT * FROM {table} ORDER BY 1, 2, 3").fetchall()
            assert len(have) == len(want) >= least, table
            for a, b in zip(have, want, strict=True):  # type and repr: a float where an int was is a difference
                assert [(type(v), repr(v)) for v in a] == [(type(v), repr(v)) for v in b], (table, a, b)
    finally:
        got.close()


def test_statement_sizes_cover_every_row_in_few_statements():
    from lynxtop.store.writer import _statements

    for n in range(0, 700):
        sizes = _statements(n, 128)
        assert sum(sizes) == n
        assert len(sizes) <= n // 128 + 7  # full statements, then at most one per power of two below 128
        assert all(s == 128 or s & (s - 1) == 0 for s in sizes)
    assert _statements(80, 128) == [64, 16] and _statements(8, 128) == [8] and _statements(1, 128) == [1]


def test_a_lingering_second_at_10_hz_is_written_in_a_few_statements_per_table(tmp_path):
    """10 ticks of 8 GPUs (GPU, NVLink and process rows, a host and a serving row each) in one transaction:
    each table's rows go in at most two INSERT executions per NULL pattern (80 = 64 + 16, 10 = 8 + 2; process
    rows have two patterns of 40 = 32 + 8); they went one row per execution before (a batch under 128 rows
    was never grouped): 80 + 80 + 10 + 10 + 80."""
    rng = random.Random(3)
    ticks = [_tick(i, rng) for i in range(10)]
    db = tmp_path / "w.db"
    w = StoreWriter(db, queue_max=1000, clock=lambda: (T0 + 60_000) / 1000)
    executed: list[str] = []
    w.conn.set_trace_callback(executed.append)
    _write(w, ticks)
    w.conn.set_trace_callback(None)
    w.close()
    per_table = Counter(m.group(1) for s in executed if (m := re.match(r"INSERT OR REPLACE INTO (\w+)", s)))
    assert set(per_table) == set(TABLES)
    assert per_table.pop("gpu_processes") <= 4 and all(n <= 2 for n in per_table.values()), per_table
    _same(db, _reference(tmp_path, ticks), 10)


def test_rows_without_a_missing_reading_skip_the_row_by_row_null_path(tmp_path, monkeypatch):
    """GPU and NVLink rows without a None are checked a statement at a time (one sum over its values). A
    statement holding a None (or text) is tried whole with its first row's NULL pattern (issue 29.2): host rows
    (a JSON text) and serving rows (the same readings missing every tick) take one pattern a statement of 16 rows
    or more, not one a row as before (300 each here); only a statement whose rows differ, or a small one, goes
    row by row, grouped by pattern (the GPU statement holding one None; process rows, whose two patterns
    alternate). Every value lands as a one-row INSERT of the same row lands it."""
    seen: Counter = Counter()
    real = writer_mod._null_mask

    def counted(row):
        seen[len(row)] += 1  # rows are told apart by width: each table's is its own
        return real(row)

    monkeypatch.setattr(writer_mod, "_null_mask", counted)
    rng = random.Random(5)
    ticks = [_tick(i, rng, step_ms=1_000, null_gpu=(i == 150)) for i in range(300)]  # 2400 GPU rows
    db = tmp_path / "w.db"
    w = StoreWriter(db, queue_max=1000, clock=lambda: (T0 + 400_000) / 1000)
    _write(w, ticks)
    w.close()
    width = {kind: len(key) + len(metrics) for kind, (_, key, metrics) in LAYOUT.items()}
    assert width["gpu"] != width["nvlink"]
    # 2400 rows each: only the one statement (<= 128 rows, and its first row once more) holding the None went
    # row by row
    assert 1 <= seen[width["gpu"]] <= 129 and 1 <= seen[width["nvlink"]] <= 129, seen
    # 128 + 128 + 32 + 8 + 4: one first row a statement; statements under PATTERN_MIN_ROWS row by row
    sizes = writer_mod._statements(300, 128)
    want = sum(1 if n >= writer_mod.PATTERN_MIN_ROWS else n for n in sizes)
    assert want == 3 + 12 and seen[width["host"]] == seen[width["serving"]] == want, seen
    assert seen[width["processes"]] >= 2400  # alternating patterns: row by row, as before
    _same(db, _reference(tmp_path, ticks), 300)


def test_a_reading_past_a_floats_range_refuses_its_tick_alone(tmp_path):
    """The statement's sum check meets an int too large for a float beside a float reading: the check steps
    aside (the row-by-row path binds and refuses it), the tick is refused alone, its neighbours are stored."""
    rng = random.Random(9)
    ticks = [_tick(i, rng, step_ms=1_000) for i in range(40)]
    ticks[17][1][2]["energy_j"] = 2**1100  # power_w before it is a float
    db = tmp_path / "w.db"
    w = StoreWriter(db, queue_max=1000, clock=lambda: (T0 + 60_000) / 1000)
    _write(w, ticks)
    assert w.stats()["rejected"] == 1
    w.close()
    _same(db, _reference(tmp_path, ticks[:17] + ticks[18:]), 39)


def test_statements_of_one_null_pattern_and_of_mixed_ones_store_what_one_row_inserts_store(tmp_path):
    """The whole-statement NULL pattern (issue 29.2) must never bind a value where a row had a NULL nor drop
    one: random batches where a few rows break their statement's pattern (a reading missing, one answered,
    text in a number's place, a host row's per-core list missing or a text), each written in one transaction,
    land value for value (type included) as one-row INSERTs of the same rows do."""
    rng = random.Random(29)
    ticks = []
    for i in range(400):
        ts, rows, host, serving, links, procs = _tick(i, rng, step_ms=1_000)
        roll = rng.random()
        if roll < 0.03:
            serving["ttft_p50_ms"] = None  # one more reading missing than its neighbours
        elif roll < 0.06:
            serving["prompt_tokens_per_s"] = 12.5  # a reading the neighbours miss
        elif roll < 0.08:
            serving["requests_running"] = "7"  # text in a number's place (the column's affinity stores it)
        elif roll < 0.10:
            host["cpu_per_core_pct"] = None
        elif roll < 0.12:
            host["cpu_pct"] = None
        elif roll < 0.14:
            rows[1]["power_w"] = "312.5"
        ticks.append((ts, rows, host, serving, links, procs))
    db = tmp_path / "w.db"
    w = StoreWriter(db, queue_max=1000, clock=lambda: (T0 + 500_000) / 1000)
    _write(w, ticks)
    assert w.stats()["rejected"] == 0
    w.close()
    _same(db, _reference(tmp_path, ticks), 400)


def _int_gpu_row(gpu: int, i: int, rng: random.Random) -> dict:
    """A GPU row as the samplers make it: every reading an int (power and clocks already rounded)."""
    return {k: (round(v) if isinstance(v, float) else v) for k, v in gpu_row(gpu, i, rng).items()}


def test_statements_of_small_non_negative_ints_bind_every_value_plainly_and_store_what_rounding_stored(tmp_path):
    """GPU and NVLink rows of ints in [0, 2**52) (what the samplers hand over) go in without the rounding
    expression per INTEGER value (CAST(? + 0.5 AS INTEGER): ~30 % of an 80-row GPU insert, session 9); the old
    writer bound every such statement through it. Statements the shortcut must not take keep it: a float to
    round, a negative int (the rounding truncates -2.5 to -2), an int at 2**52 or past it (v + 0.5 is not exact
    there) and a sum reaching 2**52; a bool binds as 1 either way. Every table lands value for value (type
    included) as one-row INSERTs with the rounding store the same rows."""
    rng = random.Random(31)
    ticks = []
    for i in range(48):  # 48 one-second ticks of 8 GPUs in one batch: three 128-row statements a table
        ts, _, host, serving, links, procs = _tick(i, rng, step_ms=1_000)
        ticks.append((ts, [_int_gpu_row(g, i, rng) for g in range(8)], host, serving, links, procs))
    odd = [(0, "power_w", 312.5), (3, "temp_c", -3), (5, "energy_j", 2**52), (9, "energy_j", 2**52 - 1),
           (20, "lost", True), (40, "energy_j", 2**60)]  # statements of ticks 0-15 and 32-47: rounded
    for i, col, v in odd:
        ticks[i][1][i % 8][col] = v
    db = tmp_path / "w.db"
    w = StoreWriter(db, queue_max=1000, clock=lambda: (T0 + 60_000) / 1000)
    executed: list[str] = []
    w.conn.set_trace_callback(executed.append)
    _write(w, ticks)
    w.conn.set_trace_callback(None)
    w.close()
    plain: Counter = Counter()
    rounded: Counter = Counter()
    for s in executed:
        m = re.match(r"INSERT OR REPLACE INTO (gpu_samples|nvlink_samples) ", s)
        if m:
            (rounded if "CAST(" in s else plain)[m.group(1)] += 1
    assert plain == {"nvlink_samples": 3, "gpu_samples": 1}, (plain, rounded)
    assert rounded == {"gpu_samples": 2}, (plain, rounded)
    _same(db, _reference(tmp_path, ticks), 48)
