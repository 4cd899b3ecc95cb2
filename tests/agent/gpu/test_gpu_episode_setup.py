"""A GPU, or one of its facilities (GPM, XID events), left out of an NVML initialisation by a failure that is no
NVMLError (a bug, an odd answer) is an event the operator sees, not only a log line: `gpu.setup_failed`, naming
the GPU, the facility and the error (escaped and cut: foreign text), once per occurrence, not on every tick nor on
every re-initialisation it persists through; set up fine again later, it is `gpu.recovered` and a later failure is
told again."""

from __future__ import annotations

from typing import Any

import pynvml
from gpu_fakes import ConstantNode, Events, ManualClock

from lynxtop.agent.gpu.fake import FakeNvml, h200_specs
from lynxtop.agent.gpu.sampler import GpuSampler
from lynxtop.contract.events import Event


class _Bugs:
    """What the fakes the factory makes fail with: GPU -> exception, per facility (changed by the test)."""

    def __init__(self) -> None:
        self.name: dict[int, Exception] = {}  # nvmlDeviceGetName: the GPU's whole setup
        self.gpm: dict[int, Exception] = {}  # nvmlGpmSampleAlloc after the GPU's support query: its GPM
        self.register: dict[int, Exception] = {}  # nvmlDeviceRegisterEvents: its XID events
        self.event_set: Exception | None = None  # nvmlEventSetCreate: every GPU's XID events


class _Buggy(FakeNvml):
    def __init__(self, bugs: _Bugs, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.bugs = bugs
        self._gpm_gpu: int | None = None

    def nvmlDeviceGetName(self, handle: Any) -> Any:
        if handle.index in self.bugs.name:
            raise self.bugs.name[handle.index]
        return super().nvmlDeviceGetName(handle)

    def nvmlGpmQueryDeviceSupport(self, handle: Any) -> Any:
        self._gpm_gpu = handle.index
        return super().nvmlGpmQueryDeviceSupport(handle)

    def nvmlGpmSampleAlloc(self) -> Any:
        if self._gpm_gpu in self.bugs.gpm:
            raise self.bugs.gpm[self._gpm_gpu]
        return super().nvmlGpmSampleAlloc()

    def nvmlDeviceRegisterEvents(self, handle: Any, event_types: int, event_set: Any) -> None:
        if handle.index in self.bugs.register:
            raise self.bugs.register[handle.index]
        super().nvmlDeviceRegisterEvents(handle, event_types, event_set)

    def nvmlEventSetCreate(self) -> Any:
        if self.bugs.event_set is not None:
            raise self.bugs.event_set
        return super().nvmlEventSetCreate()


def _sampler(clock: ManualClock, events: Events, bugs: _Bugs, **kw: Any) -> tuple[GpuSampler, list[_Buggy]]:
    node = ConstantNode(h200_specs(4))
    made: list[_Buggy] = []

    def factory() -> _Buggy:
        made.append(_Buggy(bugs, node, clock=clock))
        return made[-1]

    kw.setdefault("retry_initial_s", 1.0)
    kw.setdefault("settle_s", 1.0)  # each driver reload below is its own outage: NVML settles between two
    return GpuSampler(factory, clock=clock, on_event=events, **kw), made


def _run(s: GpuSampler, clock: ManualClock, n: int = 3) -> Any:
    tick = None
    for _ in range(n):
        clock.advance(1.0)
        tick = s.sample(set())
    return tick


def _reinit(s: GpuSampler, clock: ManualClock, made: list[_Buggy]) -> Any:
    """A driver reload under the agent: NVML asks to be re-initialised, and is, with a fresh backend."""
    made[-1].fail_all = pynvml.NVML_ERROR_UNINITIALIZED
    n = len(made)
    tick = _run(s, clock, 3)
    assert len(made) == n + 1 and s.status()["state"] == "ok"
    return tick


def _left_out(events: Events) -> list[tuple[str, str, dict]]:
    return [(e[1], e[2], e[3]) for e in events if e[0] == "gpu.setup_failed"]


def _valid(events: Events) -> None:
    for e in events:
        Event(e[0], e[1], e[2], e[3])  # the store takes it: a kind of EventKind, a severity of Severity


def test_a_gpu_left_out_by_a_setup_bug_is_one_event_naming_the_gpu_and_the_error(clock, events):
    bugs = _Bugs()
    bugs.name[2] = RuntimeError("odd name answer")
    s, made = _sampler(clock, events, bugs)
    try:
        tick = _run(s, clock, 5)
        assert [r["gpu"] for r in tick.gpu_rows] == [0, 1, 3]  # GPU 2 left out, the others sampled
        got = _left_out(events)
        assert len(got) == 1, events  # once, not every tick
        sev, msg, d = got[0]
        assert sev == "error" and d["gpu"] == 2 and d["facility"] == "gpu"
        assert d["error"] == "RuntimeError: odd name answer"
        assert "GPU 2" in msg and "odd name answer" in msg
        _valid(events)
    finally:
        s.close()


def test_told_once_per_occurrence_and_recovered_after_a_reinit_that_sets_it_up(clock, events):
    bugs = _Bugs()
    bugs.name[2] = RuntimeError("odd name answer")
    s, made = _sampler(clock, events, bugs)
    try:
        _run(s, clock)
        _reinit(s, clock, made)  # still failing: the same occurrence, not told again
        assert len(_left_out(events)) == 1
        bugs.name.clear()  # a driver fix: GPU 2 sets up fine at the next re-initialisation
        tick = _reinit(s, clock, made)
        assert [r["gpu"] for r in tick.gpu_rows] == [0, 1, 2, 3]
        back = [e for e in events if e[0] == "gpu.recovered"]
        assert len(back) == 1 and back[0][1] == "info" and back[0][3]["gpu"] == 2, events
        _reinit(s, clock, made)  # fine again: nothing more to tell
        assert len([e for e in events if e[0] == "gpu.recovered"]) == 1
        bugs.name[2] = ValueError("odd again")  # failing again later: a new occurrence, told again
        _reinit(s, clock, made)
        got = _left_out(events)
        assert len(got) == 2 and got[1][2]["gpu"] == 2 and got[1][2]["error"] == "ValueError: odd again"
        _valid(events)
    finally:
        s.close()


def test_the_error_text_is_escaped_and_cut(clock, events):
    bugs = _Bugs()
    bugs.name[1] = RuntimeError("\x1b[2J\x1b]0;owned\x07" + "x" * 5000 + "\u202e")
    s, made = _sampler(clock, events, bugs)
    try:
        _run(s, clock)
        (sev, msg, d), = _left_out(events)
        for text in (msg, d["error"]):
            assert "\x1b" not in text and "\x07" not in text and "\u202e" not in text
            assert "\\x1b[2J" in text
        assert len(d["error"]) <= 300 and len(msg) <= 600
    finally:
        s.close()


def test_a_gpm_setup_bug_is_a_warning_naming_the_facility_and_the_gpu_keeps_sampling(clock, events):
    bugs = _Bugs()
    bugs.gpm[1] = RuntimeError("GPM allocation bug")
    s, made = _sampler(clock, events, bugs, xid_events=False)
    try:
        tick = _run(s, clock)
        assert [r["gpu"] for r in tick.gpu_rows] == [0, 1, 2, 3]
        (sev, msg, d), = _left_out(events)
        assert sev == "warning" and d["gpu"] == 1 and d["facility"] == "gpm" and "GPM allocation bug" in d["error"]
        bugs.gpm.clear()
        _reinit(s, clock, made)
        back = [e[3] for e in events if e[0] == "gpu.recovered"]
        assert [(b["gpu"], b["facility"]) for b in back] == [(1, "gpm")]
        _valid(events)
    finally:
        s.close()


def test_one_gpus_xid_registration_bug_leaves_only_its_xids_out_and_is_told(clock, events):
    bugs = _Bugs()
    bugs.register[1] = RuntimeError("register bug")
    s, made = _sampler(clock, events, bugs)
    try:
        _run(s, clock)
        (sev, msg, d), = _left_out(events)
        assert d["gpu"] == 1 and d["facility"] == "xid" and "register bug" in d["error"]
        made[-1].inject_xid(3, 48)  # the other GPUs' XIDs are still read
        _run(s, clock, 1)
        assert [(e[3]["gpu"], e[3]["xid"]) for e in events if e[0] == "gpu.xid"] == [(3, 48)]
        _valid(events)
    finally:
        s.close()


def test_an_event_set_bug_is_told_for_every_gpu(clock, events):
    bugs = _Bugs()
    bugs.event_set = RuntimeError("event set bug")
    s, made = _sampler(clock, events, bugs)
    try:
        tick = _run(s, clock)
        assert len(tick.gpu_rows) == 4
        (sev, msg, d), = _left_out(events)
        assert d["gpu"] is None and d["facility"] == "xid" and "event set bug" in d["error"]
        _reinit(s, clock, made)  # still failing: told once
        assert len(_left_out(events)) == 1
        _valid(events)
    finally:
        s.close()
