"""A board gone while no agent ran, with no other board taking its index (s24).

The node had 8 GPUs and NVML now lists 7: index 7's board is gone (pulled, or off the bus while the node was
down). The store's start-up comparison (store/gpu_identity.py `changes`) told only indices whose board changed or
whose board now answers elsewhere: a board simply gone was told nothing, and its row kept claiming index 7.

Real parts, as tests/store/test_s23_gpu_identity_store.py: the GPU sampler over the fake NVML gives the static rows
that agent/node.py's `_open_gpus` passes to `StoreWriter.upsert_gpus`, into a real SQLite file read by
`StoreReader`. An agent restart is a new sampler and a new writer on the same file.
"""

from __future__ import annotations

from pathlib import Path

from support.gpu_boards import BoardsNode, identity_events, segments_at

from lynxtop.agent.gpu.fake import FakeNvml
from lynxtop.agent.gpu.sampler import GpuSampler
from lynxtop.contract.events import EventKind
from lynxtop.store.reader import StoreReader
from lynxtop.store.times import iso
from lynxtop.store.writer import StoreWriter

UUIDS = [f"GPU-{i:08x}-0000-4000-8000-000000000000" for i in range(8)]
UUID_NEW = "GPU-eeeeeeee-0000-4000-8000-000000000000"


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
        # as agent/node.py's _upsert_gpus does: NVML's count from the sampler's open
        self.writer.upsert_gpus(self.sampler.static(), enumerated=self.sampler.enumerated)
        assert self.writer.flush(30)

    def ticks(self, from_s: float, to_s: float, gpus: int) -> None:
        """Samples every 10 s, as the clock thread writes them (the last one: when each index was last seen)."""
        t = from_s
        while t <= to_s:
            self.writer.submit_tick(int(t * 1000), [{"gpu": g, "util_gpu_pct": 5.0} for g in range(gpus)],
                                    None, None)
            t += 10.0
        assert self.writer.flush(30)

    def close(self) -> None:
        self.sampler.close()
        self.writer.close()


def test_the_last_of_eight_boards_gone_while_the_agent_was_down_is_told_once(tmp_path):
    db = tmp_path / "lynxtop.db"
    a = Agent(db, BoardsNode(UUIDS), 1000.0)
    a.ticks(1000.0, 1500.0, 8)  # index 7 last read at 1500 s
    a.close()
    assert identity_events(db) == []

    b = Agent(db, BoardsNode(UUIDS[:7]), 2000.0)  # index 7's board gone; 0..6 the same boards at the same indices
    assert not [e for e in b.sampler_events if e[0] is EventKind.GPU_IDENTITY_CHANGED]  # a new process: unknown
    b.close()
    told = identity_events(db)
    assert len(told) == 1, told
    ev = told[0]
    assert str(ev.severity) == "warning"
    assert ev.ts_ms == 2_000_000
    assert f"GPU 7 ({UUIDS[7]}, seen until {iso(1_500_000)}) is not present now" in ev.message, ev.message
    assert all(f"GPU {i}" not in ev.message for i in range(7))
    assert "another board's readings" not in ev.message  # nothing continues at index 7
    ch = ev.details["changes"]
    assert [(c["gpu"], c["old_uuid"], c["new_uuid"]) for c in ch] == [(7, UUIDS[7], None)]
    assert ch[0]["seen_until_ms"] == 1_500_000

    # the stored state records that index 7's board left: its segment ends at its last sample (s25)
    assert segments_at(db, 7) == [(UUIDS[7], 1_000_000, 1_500_000)]
    r = StoreReader(db)
    try:
        assert r.gpu_uuid_at(7, 1_200_000) == UUIDS[7] and r.gpu_uuid_at(7, 2_500_000) is None
        assert {g["uuid"]: g["idx"] for g in r.gpus()}[UUIDS[7]] is None  # no index claimed any more
    finally:
        r.close()

    Agent(db, BoardsNode(UUIDS[:7]), 3000.0).close()  # the same 7 boards again: not told twice
    assert len(identity_events(db)) == 1


def test_the_last_of_two_boards_gone_is_told(tmp_path):
    db = tmp_path / "lynxtop.db"
    Agent(db, BoardsNode(UUIDS[:2]), 1000.0).close()  # no samples written: seen until its last start
    Agent(db, BoardsNode(UUIDS[:1]), 2000.0).close()
    told = identity_events(db)
    assert len(told) == 1, told
    assert f"GPU 1 ({UUIDS[1]}, seen until {iso(1_000_000)}) is not present now" in told[0].message
    assert [(c["gpu"], c["old_uuid"], c["new_uuid"]) for c in told[0].details["changes"]] == [(1, UUIDS[1], None)]
    Agent(db, BoardsNode(UUIDS[:1]), 3000.0).close()
    assert len(identity_events(db)) == 1


def test_the_board_back_at_its_index_later_is_told_as_a_return_once(tmp_path):
    db = tmp_path / "lynxtop.db"
    Agent(db, BoardsNode(UUIDS[:2]), 1000.0).close()
    Agent(db, BoardsNode(UUIDS[:1]), 2000.0).close()  # gone
    Agent(db, BoardsNode(UUIDS[:2]), 3000.0).close()  # back (reseated)
    told = identity_events(db)
    assert len(told) == 2, told
    back = told[1]
    assert str(back.severity) == "warning" and back.ts_ms == 3_000_000
    assert f"GPU 1 ({UUIDS[1]}) is present again" in back.message, back.message
    assert [(c["gpu"], c["old_uuid"], c["new_uuid"]) for c in back.details["changes"]] == [(1, UUIDS[1], UUIDS[1])]
    # a new segment from its return: the gap (from its last start: no sample written) is no board's
    assert segments_at(db, 1) == [(UUIDS[1], 1_000_000, 1_000_000), (UUIDS[1], 3_000_000, None)]
    Agent(db, BoardsNode(UUIDS[:2]), 4000.0).close()
    assert len(identity_events(db)) == 2


def test_another_board_in_the_empty_slot_later_is_told_as_a_change(tmp_path):
    db = tmp_path / "lynxtop.db"
    Agent(db, BoardsNode(UUIDS[:2]), 1000.0).close()
    Agent(db, BoardsNode(UUIDS[:1]), 2000.0).close()
    Agent(db, BoardsNode([UUIDS[0], UUID_NEW]), 3000.0).close()  # a replacement board fitted in the empty slot
    told = identity_events(db)
    assert len(told) == 2, told
    assert f"GPU 1: {UUIDS[1]} -> {UUID_NEW}" in told[1].message
    assert segments_at(db, 1) == [(UUIDS[1], 1_000_000, 1_000_000), (UUID_NEW, 3_000_000, None)]


def test_a_shift_is_told_as_before_not_as_a_board_gone(tmp_path):
    """Board 0 off the bus, the others shift down: told as session 23 tells it (the last index's board answers
    elsewhere), not as index 2 gone."""
    db = tmp_path / "lynxtop.db"
    Agent(db, BoardsNode(UUIDS[:3]), 1000.0).close()
    Agent(db, BoardsNode(UUIDS[1:3]), 2000.0).close()
    told = identity_events(db)
    assert len(told) == 1
    assert told[0].details["changes"] == [{"gpu": 0, "old_uuid": UUIDS[0], "new_uuid": UUIDS[1]},
                                          {"gpu": 1, "old_uuid": UUIDS[1], "new_uuid": UUIDS[2]},
                                          {"gpu": 2, "old_uuid": UUIDS[2], "new_uuid": None}]
    assert "is not present now" not in told[0].message


def test_a_gone_board_within_one_process_is_recorded_not_told_by_the_store(tmp_path):
    """A re-initialisation in the same process that enumerates one board fewer: the sampler tells it (lost.py);
    the store closes index 1's segment without a second event, and a later start does not tell it again."""
    db = tmp_path / "lynxtop.db"
    node = BoardsNode(UUIDS[:2])
    a = Agent(db, node, 1000.0)
    node.specs = node.specs[:1]
    a.sampler.close()
    a.sampler.open()
    assert len([e for e in a.sampler_events if e[0] is EventKind.GPU_IDENTITY_CHANGED]) == 1
    a.wall[0] = 1500.0
    a.writer.upsert_gpus(a.sampler.static())
    assert a.writer.flush(30)
    a.close()
    assert identity_events(db) == []
    assert segments_at(db, 1) == [(UUIDS[1], 1_000_000, 1_000_000)]  # no sample: its last (re)initialisation
    Agent(db, BoardsNode(UUIDS[:1]), 2000.0).close()
    assert identity_events(db) == []


def test_a_board_nvml_enumerates_but_gave_no_uuid_is_not_told_gone_when_the_count_is_given(tmp_path):
    """NVML enumerates 2 GPUs but index 1 was lost before its UUID was read (absent from static()): with the
    enumerated count the store knows index 1 is still there (gpu.lost tells it), not gone."""
    db = tmp_path / "lynxtop.db"
    Agent(db, BoardsNode(UUIDS[:2]), 1000.0).close()
    w = StoreWriter(db, clock=lambda: 2000.0)
    w.start()
    w.upsert_gpus([{"uuid": UUIDS[0], "idx": 0, "name": "NVIDIA H200"}], enumerated=2)
    assert w.flush(30)
    w.close()
    assert identity_events(db) == []
    assert segments_at(db, 1) == [(UUIDS[1], 1_000_000, None)]


def test_the_sampler_gives_nvmls_count_for_the_store(tmp_path):
    """What node.py passes as `enumerated`: the device count of the sampler's last open (None before any)."""
    s = GpuSampler(lambda: FakeNvml(BoardsNode(UUIDS[:3])), xid_events=False, retry_initial_s=1.0)
    assert s.enumerated is None
    s.open()
    try:
        assert s.enumerated == 3
    finally:
        s.close()


def test_a_gone_board_that_had_replaced_another_is_told_once_not_the_replaced_one_next(tmp_path):
    """Index 1's board was swapped (the replaced board's row still says index 1, behind the newer one), then the
    replacement is gone: told once; the next start must not find the replaced board missing there instead."""
    db = tmp_path / "lynxtop.db"
    Agent(db, BoardsNode(UUIDS[:2]), 1000.0).close()
    Agent(db, BoardsNode([UUIDS[0], UUID_NEW]), 2000.0).close()  # swapped
    Agent(db, BoardsNode(UUIDS[:1]), 3000.0).close()  # the replacement gone
    Agent(db, BoardsNode(UUIDS[:1]), 4000.0).close()
    told = identity_events(db)
    assert len(told) == 2, [e.message for e in told]
    assert f"GPU 1 ({UUID_NEW}, seen until" in told[1].message and UUIDS[1] not in told[1].message
    assert segments_at(db, 1) == [(UUIDS[1], 1_000_000, 2_000_000), (UUID_NEW, 2_000_000, 2_000_000)]
    Agent(db, BoardsNode(UUIDS[:2]), 5000.0).close()  # the first board refitted: told against the last one there
    told = identity_events(db)
    assert len(told) == 3 and f"GPU 1: {UUID_NEW} -> {UUIDS[1]}" in told[2].message, told[2].message


def test_a_replaced_board_found_elsewhere_keeps_its_new_index_when_the_index_it_left_is_gone(tmp_path):
    """Board X was at index 1, swapped for B; B is gone and X is now fitted at index 0: X's row must say index 0
    (closing index 1's rows must not take the one just written)."""
    db = tmp_path / "lynxtop.db"
    Agent(db, BoardsNode([UUIDS[0], UUIDS[1]]), 1000.0).close()
    Agent(db, BoardsNode([UUIDS[0], UUID_NEW]), 2000.0).close()
    Agent(db, BoardsNode([UUIDS[1]]), 3000.0).close()  # B gone, X at index 0 in place of board 0
    r = StoreReader(db)
    try:
        at = {g["uuid"]: g["idx"] for g in r.gpus()}
        assert at[UUIDS[1]] == 0 and at[UUID_NEW] is None
        assert r.gpu_uuid_at(0, 3_500_000) == UUIDS[1] and r.gpu_uuid_at(1, 3_500_000) is None
    finally:
        r.close()
    told = identity_events(db)
    assert f"GPU 1 ({UUID_NEW}, seen until" in told[-1].message
    assert f"GPU 0: {UUIDS[0]} -> {UUIDS[1]}" in told[-1].message
