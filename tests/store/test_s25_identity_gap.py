"""s25: a board gone while no agent ran is absent from its last sample, not from the start that found it gone.

Session 24 closed a gone board's segment (store/gpu_identity.py `gone`) at the time of the start that found it
missing, and its return ("present again", `absent_since_ms`) and a later board there ("no board there since")
read that time: an operator reading "absent from X to Y" took X for when the board went, though its last reading
was earlier (the agent was down in between). The gap now starts at the board's last sample at that index (its
last (re)initialisation when no sample was written), the time the "gone" message already named (`seen_until_ms`).

Real parts, as tests/store/test_s24_gpu_gone_at_start.py: the GPU sampler over the fake NVML gives the static
rows agent/node.py passes to `StoreWriter.upsert_gpus`, into a real SQLite file read by `StoreReader`.
"""

from __future__ import annotations

from pathlib import Path

from support.gpu_boards import BoardsNode, identity_events, segments_at

from lynxtop.agent.gpu.fake import FakeNvml
from lynxtop.agent.gpu.sampler import GpuSampler
from lynxtop.store.reader import StoreReader
from lynxtop.store.times import iso
from lynxtop.store.writer import StoreWriter

UUIDS = [f"GPU-{i:08x}-0000-4000-8000-000000000000" for i in range(3)]
UUID_NEW = "GPU-eeeeeeee-0000-4000-8000-000000000000"


def agent(db: Path, uuids: list[str], wall_s: float, ticks_to_s: float | None = None) -> None:
    """One agent process from `wall_s`: opens NVML, stores its boards, writes a sample of every GPU every 10 s up
    to `ticks_to_s` (the last: when each index was last read), stops."""
    writer = StoreWriter(db, clock=lambda: wall_s)
    writer.start()
    sampler = GpuSampler(lambda: FakeNvml(BoardsNode(uuids)), xid_events=False, retry_initial_s=1.0)
    try:
        sampler.open()
        writer.upsert_gpus(sampler.static(), enumerated=sampler.enumerated)
        t = wall_s
        while ticks_to_s is not None and t <= ticks_to_s:
            writer.submit_tick(int(t * 1000), [{"gpu": g, "util_gpu_pct": 5.0} for g in range(len(uuids))],
                               None, None)
            t += 10.0
        assert writer.flush(30)
    finally:
        sampler.close()
        writer.close()


def test_a_board_back_after_an_absence_is_absent_from_its_last_sample(tmp_path):
    db = tmp_path / "lynxtop.db"
    agent(db, UUIDS[:2], 1000.0, ticks_to_s=1500.0)  # index 1 last read at 1500 s; the agent stops
    agent(db, UUIDS[:1], 2000.0, ticks_to_s=2500.0)  # index 1's board gone (found at 2000 s)
    agent(db, UUIDS[:2], 3000.0)  # back (reseated)
    told = identity_events(db)
    assert len(told) == 2, [e.message for e in told]
    gone, back = told
    assert f"GPU 1 ({UUIDS[1]}, seen until {iso(1_500_000)}) is not present now" in gone.message
    # the gap starts where the gone message said the board was last seen, not at the start that found it gone
    assert f"GPU 1 ({UUIDS[1]}) is present again (not present since {iso(1_500_000)})" in back.message, back.message
    assert back.details["changes"] == [{"gpu": 1, "old_uuid": UUIDS[1], "new_uuid": UUIDS[1],
                                        "absent_since_ms": 1_500_000}]
    assert segments_at(db, 1) == [(UUIDS[1], 1_000_000, 1_500_000), (UUIDS[1], 3_000_000, None)]
    r = StoreReader(db)
    try:
        assert r.gpu_uuid_at(1, 1_490_000) == UUIDS[1]
        assert r.gpu_uuid_at(1, 1_700_000) is None  # after its last reading: not known to be there
        assert r.gpu_uuid_at(0, 1_700_000) == UUIDS[0]  # index 0 untouched
    finally:
        r.close()


def test_another_board_in_the_empty_slot_names_the_gone_ones_last_sample(tmp_path):
    db = tmp_path / "lynxtop.db"
    agent(db, UUIDS[:2], 1000.0, ticks_to_s=1200.0)
    agent(db, UUIDS[:1], 2000.0)
    agent(db, [UUIDS[0], UUID_NEW], 3000.0)
    told = identity_events(db)
    assert len(told) == 2, [e.message for e in told]
    assert f"GPU 1: {UUIDS[1]} -> {UUID_NEW} (no board there since {iso(1_200_000)})" in told[1].message
    assert told[1].details["changes"][0]["absent_since_ms"] == 1_200_000
    assert segments_at(db, 1) == [(UUIDS[1], 1_000_000, 1_200_000), (UUID_NEW, 3_000_000, None)]


def test_a_gone_board_never_sampled_is_absent_from_its_last_start(tmp_path):
    """No sample written at its index: its last (re)initialisation is the last time it was known there."""
    db = tmp_path / "lynxtop.db"
    agent(db, UUIDS[:2], 1000.0)
    agent(db, UUIDS[:2], 1400.0)  # seen again, still no sample
    agent(db, UUIDS[:1], 2000.0)
    agent(db, UUIDS[:2], 3000.0)
    told = identity_events(db)
    assert told[-1].details["changes"][0]["absent_since_ms"] == 1_400_000, told[-1].details
    assert segments_at(db, 1) == [(UUIDS[1], 1_000_000, 1_400_000), (UUIDS[1], 3_000_000, None)]


def test_a_sample_time_past_the_start_that_found_it_gone_is_not_taken(tmp_path):
    """The wall clock stepped back between the two agents: the last sample (1500 s) lies after the start that
    found the board gone (1300 s). The gap cannot start after it was found gone: it starts then."""
    db = tmp_path / "lynxtop.db"
    agent(db, UUIDS[:2], 1000.0, ticks_to_s=1500.0)
    agent(db, UUIDS[:1], 1300.0)
    assert segments_at(db, 1) == [(UUIDS[1], 1_000_000, 1_300_000)]
    agent(db, UUIDS[:2], 3000.0)
    assert identity_events(db)[-1].details["changes"][0]["absent_since_ms"] == 1_300_000
