"""Session 22: a lost GPU that keeps coming back is one episode, and every GPU event is one journal line.

1. A GPU lost for 12 s and back for 12 s, over and over, used to be a `gpu.lost` (critical) and a `gpu.recovered`
   per flap: ~300 events an hour burying the rest. Now `gpu.recovered` is told once the GPU has answered for the
   settle time, a loss within it continues the episode, and the recovery counts the flaps. The lost flag (rows,
   exporter, status) still says lost exactly while NVML cannot read the GPU: only the events are merged.
2. `Reporter.event` logged every GPU event and `EventSink.put` logged it again (WARNING, then ERROR for a
   critical one): now the sink's line is the only one, at the level of the event's severity.
"""

from __future__ import annotations

import logging

from gpu_fakes import ConstantNode, Events, ManualClock, make

from lynxtop.agent.events import EventSink
from lynxtop.agent.gpu.calls import Reporter
from lynxtop.agent.gpu.fake import h200_specs
from lynxtop.agent.gpu.protocol import FakeGpuState
from lynxtop.agent.sampling import EventCollector
from lynxtop.contract.events import EventKind

SETTLE = 60.0


def _flap(s, node, clock, seconds: int, lost_for: int, back_for: int) -> list[tuple[bool, int]]:
    """1 s ticks with GPU 1 lost for `lost_for` s then back for `back_for` s, repeated: (lost in NVML, row lost)."""
    seen = []
    for t in range(seconds):
        lost = t % (lost_for + back_for) < lost_for
        node.states[1] = FakeGpuState(lost=lost)
        clock.advance(1.0)
        row = s.sample(set()).gpu_rows[1]
        seen.append((lost, row["lost"]))
    return seen


def test_a_flapping_gpu_is_one_lost_and_one_recovered_with_the_flaps_counted(clock: ManualClock, events: Events):
    node = ConstantNode(h200_specs(2), [FakeGpuState(), FakeGpuState()])
    s, _ = make(node, clock, events, lost_probe_s=1.0, lost_settle_s=SETTLE)
    s.open()
    seen = _flap(s, node, clock, 612, lost_for=12, back_for=12)  # 10 minutes of flapping, ending lost
    # the flag is truthful at every tick: lost while NVML cannot read it, read again at the first probe back
    assert all(row == 1 for lost, row in seen if lost)
    assert sum(1 for lost, row in seen if not lost and row == 0) >= 25 * 10
    assert events.kinds() == ["gpu.lost"], events.kinds()
    assert events[0][1] == "critical"
    node.states[1] = FakeGpuState()  # it stays back
    came_back_at = None
    for _ in range(int(SETTLE) + 5):
        clock.advance(1.0)
        row = s.sample(set()).gpu_rows[1]
        if came_back_at is None and row["lost"] == 0:
            came_back_at = clock.t
            assert row["temp_c"] is not None  # readings flow as soon as it answers: only the event waits
        if "gpu.recovered" in events.kinds():
            break
    assert came_back_at is not None and clock.t - came_back_at >= SETTLE  # told only after the settle time
    assert events.kinds() == ["gpu.lost", "gpu.recovered"]
    kind, severity, message, details = events[1]
    assert severity == "info" and details["gpu"] == 1
    assert details["flaps"] == 25 and "25" in message, message  # came back and was lost again 25 times
    assert details["lost_s"] >= 600
    # a loss after the recovery was told is a new episode
    node.states[1] = FakeGpuState(lost=True)
    clock.advance(1.0)
    assert s.sample(set()).gpu_rows[1]["lost"] == 1
    assert events.kinds() == ["gpu.lost", "gpu.recovered", "gpu.lost"]
    s.close()


def test_one_loss_is_told_lost_then_recovered_after_the_settle_time_without_flaps(clock, events):
    node = ConstantNode(h200_specs(2), [FakeGpuState(), FakeGpuState()])
    s, _ = make(node, clock, events, lost_probe_s=2.0, lost_settle_s=30.0)
    s.open()
    node.states[1] = FakeGpuState(lost=True)
    clock.advance(1.0)
    assert s.sample(set()).gpu_rows[1]["lost"] == 1
    node.states[1] = FakeGpuState()
    for _ in range(29):
        clock.advance(1.0)
        s.sample(set())
    assert events.kinds() == ["gpu.lost"]  # answering, but not for 30 s yet
    for _ in range(5):
        clock.advance(1.0)
        s.sample(set())
    assert events.kinds() == ["gpu.lost", "gpu.recovered"]
    assert events[1][3]["flaps"] == 0 and "lost again" not in events[1][2]
    s.close()


def test_a_gpu_gone_from_enumeration_is_never_told_recovered(clock, events):
    """Lost, answering briefly, then NVML re-initialises with it left out: its episode must not settle."""
    import pynvml

    node = ConstantNode(h200_specs(2), [FakeGpuState(), FakeGpuState()])
    s, made = make(node, clock, events, lost_probe_s=1.0, lost_settle_s=10.0, retry_initial_s=1.0)
    s.open()
    node.states[1] = FakeGpuState(lost=True)
    clock.advance(1.0)
    s.sample(set())
    node.states[1] = FakeGpuState()
    clock.advance(1.0)
    assert s.sample(set()).gpu_rows[1]["lost"] == 0
    node.specs = node.specs[:1]  # a driver reload without the board
    made[-1].fail_all = pynvml.NVML_ERROR_UNINITIALIZED
    for _ in range(30):
        clock.advance(1.0)
        s.sample(set())
    assert s.status()["state"] == "ok" and len(made) >= 2
    assert "gpu.recovered" not in events.kinds(), events.kinds()
    s.close()


def test_a_gpu_event_through_the_sink_is_one_journal_line_at_its_severity(clock, caplog):
    caplog.set_level(logging.DEBUG)
    collector = EventCollector()
    node = ConstantNode(h200_specs(2), [FakeGpuState(), FakeGpuState()])
    s, _ = make(node, clock, collector)
    s.open()
    node.states[1] = FakeGpuState(lost=True)
    clock.advance(1.0)
    s.sample(set())
    s.close()
    stored: list = []

    class Writer:
        def record(self, ev) -> None:
            stored.append(ev)

    sink = EventSink(Writer())
    for ev in collector.drain():
        sink.put(ev)
    assert [e.kind for e in stored] == [EventKind.GPU_LOST]
    lines = [r.levelname for r in caplog.records if "is lost" in r.getMessage()]
    assert lines == ["ERROR"], lines  # critical: one line, at ERROR


def test_without_a_sink_the_reporter_logs_the_event_at_its_severity(caplog):
    caplog.set_level(logging.DEBUG)
    r = Reporter(None)
    r.event(EventKind.GPU_LOST, "critical", "GPU 3 is lost (test)")
    r.event(EventKind.GPU_RECOVERED, "info", "GPU 3 answers again (test)")
    assert [(r.levelname, r.getMessage()) for r in caplog.records] == [
        ("ERROR", "GPU 3 is lost (test)"), ("INFO", "GPU 3 answers again (test)")]


def test_a_failing_sink_still_leaves_the_event_in_the_log(caplog):
    caplog.set_level(logging.DEBUG)

    def broken(*_a) -> None:
        raise RuntimeError("sink down")

    Reporter(broken).event(EventKind.GPU_LOST, "critical", "GPU 2 is lost (test)")
    assert any(r.levelname == "ERROR" and "GPU 2 is lost (test)" in r.getMessage() for r in caplog.records)
