"""A slow reading (per-link NVLink rates, the process list: about once a second) is stored once, at the tick that
read it, and the store's "newest at or before T" gives every tick's time what that tick showed live.

The GPU sampler on the fake NVML at 10 Hz, its ticks written by the real StoreWriter into a SQLite file and read
back by the StoreReader (store/writer.py SlowRows, store/reader.py slow_at, docs/store.md).
"""

from __future__ import annotations

import sqlite3

from gpu_fakes import ConstantNode, make
from test_field_rates import MIB, state

from lynxtop.agent.gpu.fake import h200_specs
from lynxtop.contract.columns import NVLINK_METRICS, names
from lynxtop.store.reader import StoreReader
from lynxtop.store.writer import StoreWriter

T0 = 1_764_000_000_000
LINKS = names(NVLINK_METRICS)


def _procs(rows) -> list[tuple]:
    return sorted((r["gpu"], r["pid"], r["used_mem_bytes"], int(bool(r["in_vllm_tree"]))) for r in rows)


def _links(rows) -> list[tuple]:
    return sorted((r["gpu"], *(r[c] for c in LINKS)) for r in rows)


def test_at_10hz_each_slow_reading_is_stored_once_and_read_back_as_shown_live(clock, tmp_path):
    node = ConstantNode(h200_specs(2), [state(), state()])
    s, _ = make(node, clock)
    s.open()
    db = tmp_path / "h.db"
    shown: list[tuple[int, list, list]] = []  # (ts, process rows, link rows) as each tick carried them
    link_objs, proc_objs = set(), set()
    with StoreWriter(db) as w:
        for k in range(60):  # 6 s at 10 Hz
            if k == 25:  # GPU 1's process exits, GPU 0's links change: seen at the next read
                node.states[1] = state(processes=[], process_sm_pct={})
                node.states[0] = state(nvlink_tx_bytes_per_s=[300 * MIB] * 18)
            tick = s.sample({4242})
            ts = T0 + 100 * k
            w.submit_tick(ts, tick.gpu_rows, None, None, tick.nvlink_rows, tick.process_rows)
            shown.append((ts, _procs(tick.process_rows), _links(tick.nvlink_rows)))
            link_objs |= {id(r) for r in tick.nvlink_rows}
            proc_objs |= {id(r) for r in tick.process_rows}
            clock.advance(0.1)
    # the exit and the change were read and shown (the scenario does what it says)
    assert shown[-1][1] == [(0, 4242, 80 << 30, 1)]
    assert shown[5][1] == [(0, 4242, 80 << 30, 1), (1, 4242, 80 << 30, 1)]
    assert shown[-1][2] != shown[20][2] and shown[20][2]
    con = sqlite3.connect(db)
    n_links = con.execute("SELECT count(*) FROM nvlink_samples WHERE "
                          + " OR ".join(f"{c} IS NOT NULL" for c in LINKS)).fetchone()[0]
    n_procs = con.execute("SELECT count(*) FROM gpu_processes WHERE pid >= 0").fetchone()[0]
    exits = con.execute("SELECT ts_ms, gpu FROM gpu_processes WHERE pid < 0").fetchall()
    con.close()
    # rows == readings, not ticks: about one a second a GPU (60 ticks would be 120 rows a table)
    assert n_links == len(link_objs) <= 2 * 6
    assert n_procs == len(proc_objs) <= 2 * 7
    # the exit is stored at the tick whose read saw the empty list
    first_empty = next(ts for ts, procs, _ in shown if (1, 4242, 80 << 30, 1) not in procs)
    assert exits == [(first_empty, 1)]
    # at every tick's time (and between ticks) the store gives what that tick showed live
    r = StoreReader(db)
    try:
        for ts, procs, links in shown:
            for t in (ts, ts + 50):
                assert _procs(r.slow_at("processes", t)) == procs, t
                assert _links(r.slow_at("nvlink", t)) == links, t
        assert _procs(r.latest("processes")) == shown[-1][1]
        assert _links(r.latest("nvlink")) == shown[-1][2]
    finally:
        r.close()
