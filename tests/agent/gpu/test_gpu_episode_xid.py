"""XIDs told once per episode of (GPU, XID), through the sampler's tick and the fake NVML's event set.

A GPU in trouble can raise the same XID hundreds of times a minute; one event each buried everything else in the
event list. What must hold: the first XID of an episode is an event at once (a critical one too), repeats are
counted and the count is told (a closing event once the XID has been quiet, a summary while a flood goes on), the
XID coming back after the episode closed is a new event, every XID is counted by exactly one event's `count`
(what the node's per-GPU XID counter adds), the open episodes stay bounded, and time is the sampler's monotonic
clock."""

from __future__ import annotations

from typing import Any

import pytest
from gpu_fakes import ConstantNode, Events, ManualClock

from lynxtop.agent.gpu import xid as xid_mod
from lynxtop.agent.gpu.fake import FakeNvml, h200_specs
from lynxtop.agent.gpu.sampler import GpuSampler
from lynxtop.contract.events import Event


def _sampler(clock: ManualClock, events: Events, gpus: int = 4, **kw: Any) -> tuple[GpuSampler, list[FakeNvml]]:
    made: list[FakeNvml] = []

    def factory() -> FakeNvml:
        made.append(FakeNvml(ConstantNode(h200_specs(gpus)), clock=clock))
        return made[-1]

    s = GpuSampler(factory, clock=clock, on_event=events, **kw)
    s.open()
    return s, made


def _tick(s: GpuSampler, clock: ManualClock, dt: float = 1.0) -> None:
    clock.advance(dt)
    s.sample(set())


def _xid_events(events: Events) -> list[tuple[str, str, dict]]:
    return [(e[1], e[2], e[3]) for e in events if e[0] == "gpu.xid"]


def _counted(events: Events, gpu: int | None = None) -> int:
    """The XIDs the events account for, as the node's counter adds them (`count`, 1 where absent)."""
    return sum(int(d.get("count", 1)) for _, _, d in _xid_events(events) if gpu is None or d["gpu"] == gpu)


def test_a_flood_of_one_xid_on_one_gpu_is_one_event_then_one_count_when_it_quiets(clock, events):
    s, made = _sampler(clock, events)
    try:
        for _ in range(20):  # XID 13 five times a second for 20 s
            for _ in range(5):
                made[0].inject_xid(1, 13)
            _tick(s, clock)
        got = _xid_events(events)
        assert len(got) == 1, got  # told when the episode opened, the 99 repeats only counted
        assert got[0][2] == {"gpu": 1, "xid": 13}  # the first XID's event, as one XID always gave
        for _ in range(int(xid_mod.XID_QUIET_S)):  # quiet: the episode ends and its count is told
            _tick(s, clock)
        got = _xid_events(events)
        assert len(got) == 2, got
        closing = got[1][2]
        assert closing["episode"] == "closed" and closing["times"] == 100 and closing["count"] == 99
        assert closing["span_s"] == pytest.approx(19.0)  # first to last XID, on the sampler's clock
        assert "100 times" in got[1][1]
        assert _counted(events) == 100  # every XID counted exactly once
        for e in events:
            Event(e[0], e[1], e[2], e[3])  # a valid event for the store (kind, severity)
        made[0].inject_xid(1, 13)  # back after the episode closed: a new episode, told at once
        _tick(s, clock)
        got = _xid_events(events)
        assert len(got) == 3 and got[2][2] == {"gpu": 1, "xid": 13}
    finally:
        s.close()


def test_a_single_xid_is_one_event_and_no_closing_count(clock, events):
    s, made = _sampler(clock, events)
    try:
        made[0].inject_xid(2, 31)
        for _ in range(int(xid_mod.XID_QUIET_S) + 5):
            _tick(s, clock)
        assert len(_xid_events(events)) == 1
        assert _counted(events) == 1
    finally:
        s.close()


def test_a_critical_xid_is_told_at_once_during_another_xids_flood(clock, events):
    s, made = _sampler(clock, events)
    try:
        for _ in range(5):
            for _ in range(10):
                made[0].inject_xid(0, 13)
            _tick(s, clock)
        before = len(events)
        made[0].inject_xid(0, 79)  # fallen off the bus, on the flooding GPU
        made[0].inject_xid(3, 48)  # a double-bit ECC error on another
        _tick(s, clock)
        new = [(sev, d["gpu"], d["xid"]) for sev, _, d in _xid_events(Events(events[before:]))]
        assert new == [("critical", 0, 79), ("critical", 3, 48)]
        made[0].inject_xid(0, 79)  # a repeat within the episode: counted, not told again
        _tick(s, clock)
        assert len(events) == before + 2
    finally:
        s.close()


def test_a_flood_that_never_quiets_tells_its_count_periodically(clock, events):
    s, made = _sampler(clock, events)
    total = 0
    try:
        seconds = int(xid_mod.XID_SUMMARY_S * 2.5)
        for _ in range(seconds // 5):  # XID 43 every tick, ticks 5 s apart: never quiet
            made[0].inject_xid(0, 43)
            total += 1
            _tick(s, clock, 5.0)
        got = _xid_events(events)
        summaries = [d for _, _, d in got if d.get("episode") == "ongoing"]
        assert len(got) == 1 + 2 and len(summaries) == 2, got  # opened, then a summary each XID_SUMMARY_S
        assert summaries[-1]["times"] < total  # the last repeats are not told yet...
        s.close()  # ...until the sampler stops: its untold repeats are told then
        assert _counted(events, gpu=0) == total
        assert _xid_events(events)[-1][2]["times"] == total
    finally:
        s.close()


def test_episodes_are_per_gpu_and_per_xid(clock, events):
    s, made = _sampler(clock, events)
    try:
        for _ in range(3):
            for gpu in range(4):
                for x in (13, 31):
                    made[0].inject_xid(gpu, x)
            _tick(s, clock)
        got = _xid_events(events)
        assert sorted((d["gpu"], d["xid"]) for _, _, d in got) == [(g, x) for g in range(4) for x in (13, 31)]
    finally:
        s.close()


def test_open_episodes_are_capped_and_every_new_one_is_still_told(clock, events, monkeypatch):
    monkeypatch.setattr(xid_mod, "MAX_XID_EPISODES", 8)
    s, made = _sampler(clock, events)
    try:
        codes = list(range(100, 130))  # 30 distinct XIDs on GPU 0, each twice: more episodes than the cap
        for x in codes:
            made[0].inject_xid(0, x)
            made[0].inject_xid(0, x)
        for _ in range(2):
            _tick(s, clock)
        book = s._xid_episodes
        assert book is not None and len(book) <= 8
        opened = [d["xid"] for _, _, d in _xid_events(events) if "episode" not in d]
        assert opened == codes  # each told when it came, none held back by the cap
        s.close()
        assert _counted(events) == 60  # an episode pushed out by the cap told its count then
    finally:
        s.close()


def test_a_burst_is_still_read_at_most_the_limit_a_tick(clock, events):
    s, made = _sampler(clock, events, xid_per_tick=16)
    try:
        for _ in range(40):
            made[0].inject_xid(0, 31)
        _tick(s, clock)
        assert s._xid is not None and s._xid.delivered == 16
        _tick(s, clock)
        _tick(s, clock)
        assert s._xid.delivered == 40
        assert len(_xid_events(events)) == 1
    finally:
        s.close()


def test_an_episode_goes_on_across_a_driver_reinit(clock, events):
    """The episodes are the sampler's, not the event set's: a flood on both sides of a re-initialisation is one
    episode, told once."""
    import pynvml

    s, made = _sampler(clock, events, retry_initial_s=1.0)
    try:
        made[0].inject_xid(2, 94)
        _tick(s, clock)
        made[0].fail_all = pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH
        _tick(s, clock)
        _tick(s, clock, 2.0)
        assert len(made) == 2 and s.status()["state"] == "ok"
        made[1].inject_xid(2, 94)
        _tick(s, clock)
        assert [d for _, _, d in _xid_events(events)] == [{"gpu": 2, "xid": 94}]
    finally:
        s.close()
    assert _counted(events) == 2
