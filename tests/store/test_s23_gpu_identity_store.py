"""Which board was behind each NVML index, across agent restarts (s23).

History is keyed by NVML index. A board replaced while the agent was down (a failed GPU swapped: the node is
powered off, so the agent always restarts), or the indices shifting because a board fell off the bus, must be
told once, and the `gpus` table must keep what each index was over time instead of overwriting it.

Real parts: the GPU sampler over the fake NVML gives the static rows, as the agent's `_open_gpus` passes them to
`StoreWriter.upsert_gpus`; the store is a real SQLite file, written by one writer per agent process and read by
`StoreReader`. An agent restart is a new sampler and a new writer on the same file.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

from support.gpu_boards import BoardsNode, identity_events

from lynxtop.agent.gpu.fake import FakeNvml
from lynxtop.agent.gpu.protocol import FakeGpuSpec
from lynxtop.agent.gpu.sampler import GpuSampler
from lynxtop.contract.events import EventKind
from lynxtop.store.reader import StoreReader
from lynxtop.store.writer import StoreWriter

UUID_A = "GPU-aaaaaaaa-0000-4000-8000-000000000000"
UUID_B = "GPU-bbbbbbbb-0000-4000-8000-000000000000"
UUID_C = "GPU-cccccccc-0000-4000-8000-000000000000"
UUID_0 = "GPU-00000000-0000-4000-8000-000000000000"  # sorts before the others: a replacement listed first by uuid


class Agent:
    """One agent process as far as GPU identity goes: its sampler opens NVML, its writer stores static()."""

    def __init__(self, db: Path, node: BoardsNode, wall_s: float):
        self.wall = [wall_s]
        self.sampler_events: list[tuple] = []
        self.writer = StoreWriter(db, clock=lambda: self.wall[0])
        self.writer.start()
        self.sampler = GpuSampler(lambda: FakeNvml(node), xid_events=False, retry_initial_s=1.0,
                                  on_event=lambda *e: self.sampler_events.append(e))
        self.sampler.open()
        self.writer.upsert_gpus(self.sampler.static())  # as agent/node.py's _open_gpus does
        assert self.writer.flush(30)

    def close(self) -> None:
        self.sampler.close()
        self.writer.close()


def test_a_board_replaced_while_the_agent_was_down_is_told_once_at_the_next_start(tmp_path):
    db = tmp_path / "lynxtop.db"
    a = Agent(db, BoardsNode([UUID_A, UUID_B]), 1000.0)
    a.close()
    assert identity_events(db) == []  # a first start: nothing to compare with

    b = Agent(db, BoardsNode([UUID_C, UUID_B]), 2000.0)  # GPU 0's board swapped while the node was down
    assert not [e for e in b.sampler_events if e[0] is EventKind.GPU_IDENTITY_CHANGED]  # the sampler cannot know
    b.close()
    told = identity_events(db)
    assert len(told) == 1, told
    ev = told[0]
    assert str(ev.severity) == "warning"
    assert f"GPU 0: {UUID_A} -> {UUID_C}" in ev.message and "GPU 1" not in ev.message
    assert ev.details["changes"] == [{"gpu": 0, "old_uuid": UUID_A, "new_uuid": UUID_C}]
    assert ev.ts_ms == 2_000_000

    c = Agent(db, BoardsNode([UUID_C, UUID_B]), 3000.0)  # the same boards again: nothing more
    c.close()
    assert len(identity_events(db)) == 1


def test_shifted_indices_keep_what_each_index_was_over_time(tmp_path):
    """Board A (index 0) falls off the bus: at the next start B is index 0 and C index 1. The `gpus` table kept
    one index per UUID and overwrote it, so index 1's history before the shift read as C's (it was B's)."""
    db = tmp_path / "lynxtop.db"
    Agent(db, BoardsNode([UUID_A, UUID_B, UUID_C]), 1000.0).close()
    Agent(db, BoardsNode([UUID_B, UUID_C]), 2000.0).close()
    told = identity_events(db)
    assert len(told) == 1
    assert told[0].details["changes"] == [{"gpu": 0, "old_uuid": UUID_A, "new_uuid": UUID_B},
                                          {"gpu": 1, "old_uuid": UUID_B, "new_uuid": UUID_C},
                                          {"gpu": 2, "old_uuid": UUID_C, "new_uuid": None}]  # as lost.py says it
    r = StoreReader(db)
    try:
        segs = r.gpu_identities()
        at = {i: [(s["uuid"], s["since_ms"], s["until_ms"]) for s in segs if s["gpu"] == i] for i in (0, 1, 2)}
        assert at[0] == [(UUID_A, 1_000_000, 2_000_000), (UUID_B, 2_000_000, None)]
        assert at[1] == [(UUID_B, 1_000_000, 2_000_000), (UUID_C, 2_000_000, None)]
        assert at[2] == [(UUID_C, 1_000_000, 2_000_000)]  # not enumerated since: ends where C moved
        # which board a sample was read from: index 1 before the shift is B's, after it C's
        assert r.gpu_uuid_at(1, 1_500_000) == UUID_B and r.gpu_uuid_at(1, 2_500_000) == UUID_C
        assert r.gpu_uuid_at(0, 999_000) is None  # before anything was recorded: unknown, not guessed
        # the current facts per index (as the replayed status and the TUI build {idx: facts}): B at 0, C at 1
        facts = {g["idx"]: g["uuid"] for g in r.gpus()}
        assert facts[0] == UUID_B and facts[1] == UUID_C
    finally:
        r.close()


def test_the_current_board_wins_an_index_over_the_one_it_replaced(tmp_path):
    """reader.gpus() is read as {idx: facts} (tui/source.py's replay): the replaced board, still a row at the same
    index, must not come last (it did whenever its UUID sorted after the new one's)."""
    db = tmp_path / "lynxtop.db"
    Agent(db, BoardsNode([UUID_A]), 1000.0).close()
    Agent(db, BoardsNode([UUID_0]), 2000.0).close()
    r = StoreReader(db)
    try:
        facts = {g["idx"]: g for g in r.gpus()}
        assert facts[0]["uuid"] == UUID_0
    finally:
        r.close()


def test_a_reload_in_one_process_is_told_once_not_again_by_the_store(tmp_path):
    """Within one agent process the sampler tells a reordering (lost.py); the store records the new segments
    without a second event."""
    db = tmp_path / "lynxtop.db"
    node = BoardsNode([UUID_A, UUID_B])
    a = Agent(db, node, 1000.0)
    node.specs = [FakeGpuSpec(index=0, uuid=UUID_B), FakeGpuSpec(index=1, uuid=UUID_A)]
    a.sampler.close()
    a.sampler.open()  # a new initialisation in the same process (the sampler remembers the indices)
    told = [e for e in a.sampler_events if e[0] is EventKind.GPU_IDENTITY_CHANGED]
    assert len(told) == 1
    a.wall[0] = 1500.0
    a.writer.upsert_gpus(a.sampler.static())
    assert a.writer.flush(30)
    a.close()
    assert identity_events(db) == []  # the agent records the sampler's event (not done here): not twice
    r = StoreReader(db)
    try:
        assert r.gpu_uuid_at(0, 1_200_000) == UUID_A and r.gpu_uuid_at(0, 1_600_000) == UUID_B
    finally:
        r.close()


def test_an_older_file_without_the_identity_columns_is_read_and_upgraded(tmp_path):
    """A file whose `gpus` table predates the identity columns: the reader answers from first_seen_ms, the
    writer adds the columns in place (no migration, no floor moved)."""
    db = tmp_path / "lynxtop.db"
    Agent(db, BoardsNode([UUID_A]), 1000.0).close()
    c = sqlite3.connect(db)
    c.execute("ALTER TABLE gpus DROP COLUMN idx_since_ms")
    c.execute("ALTER TABLE gpus DROP COLUMN idx_history")
    compat = c.execute("SELECT value FROM meta WHERE key = 'compat_version'").fetchone()[0]
    c.commit()
    c.close()
    r = StoreReader(db)
    try:
        assert r.gpu_uuid_at(0, 1_500_000) == UUID_A
    finally:
        r.close()
    Agent(db, BoardsNode([UUID_B]), 2000.0).close()
    assert len(identity_events(db)) == 1
    r = StoreReader(db)
    try:
        assert r.gpu_uuid_at(0, 1_500_000) == UUID_A and r.gpu_uuid_at(0, 2_500_000) == UUID_B
    finally:
        r.close()
    c = sqlite3.connect(db)
    assert c.execute("SELECT value FROM meta WHERE key = 'compat_version'").fetchone()[0] == compat
    c.close()


def _csv_rows(text: str) -> list[dict[str, str]]:
    import csv
    import io

    return list(csv.DictReader(io.StringIO(text)))


def test_the_gpu_export_names_the_board_of_each_row_and_a_bucket_that_mixes_two(tmp_path):
    """Index 0's readings before the replacement are A's, after it C's: each exported row names its board; a
    rollup bucket holding both boards' readings names both, so a mixed line is never silent."""
    from lynxtop.store.export import _query, write_csv

    db = tmp_path / "lynxtop.db"
    a = Agent(db, BoardsNode([UUID_A, UUID_B]), 1000.0)
    rows = lambda g: {"gpu": g, "util_gpu_pct": 10 * (g + 1)}  # noqa: E731
    for i in range(0, 200, 10):  # 1000 s .. 1190 s, A at index 0
        a.writer.submit_tick(1_000_000 + i * 1000, [rows(0), rows(1)], None, None)
    assert a.writer.flush(30)
    a.close()
    b = Agent(db, BoardsNode([UUID_C, UUID_B]), 1230.0)  # C replaces A at 1230 s (mid-minute 1200..1260)
    for i in range(230, 400, 10):
        b.writer.submit_tick(1_000_000 + i * 1000, [rows(0), rows(1)], None, None)
    assert b.writer.flush(30)
    b.close()
    r = StoreReader(db)
    try:
        out = io_text(lambda f: write_csv(r, _query(r, "gpu", "raw", 0, 2_000_000, False), f))
        got = [(int(x["ts_ms"]), int(x["gpu"]), x["uuid"]) for x in _csv_rows(out)]
        assert (1_190_000, 0, UUID_A) in got and (1_230_000, 0, UUID_C) in got
        assert all(u == UUID_B for _, g, u in got if g == 1)
        assert all(u == (UUID_A if t < 1_230_000 else UUID_C) for t, g, u in got if g == 0)
        assert list(_csv_rows(out)[0])[-1] == "uuid"  # appended: the other columns keep their places
        roll = _csv_rows(io_text(lambda f: write_csv(r, _query(r, "gpu", "1m", 0, 2_000_000, False), f)))
        by = {(int(x["ts_ms"]), int(x["gpu"])): x["uuid"] for x in roll}
        assert by[(1_200_000, 0)] == f"{UUID_A}+{UUID_C}"  # the minute the board changed in: both named
        assert by[(1_140_000, 0)] == UUID_A and by[(1_260_000, 0)] == UUID_C and by[(1_200_000, 1)] == UUID_B
    finally:
        r.close()


def io_text(write) -> str:
    import io

    buf = io.StringIO()
    write(buf)
    return buf.getvalue()
