"""Session 23: the GPU faults the events told and no alert could see, and one event as one journal line.

A real Node with the fake NVML driver and the real exporter, read with prometheus_client's parser: a GPU whose every
reading fails (gpu.unreadable) is `lynxtop_gpu_unreadable 1` on the page, the other GPUs 0, and 0 again once it reads
(LynxtopGpuUnreadable alerts on it); NVML's state is exported, so a node without a driver (nvml.unavailable,
warning) is told apart from a failing library (error) as the events do. And `gpu.setup_failed` went to the journal
twice (left_out.py logged it, then the event sink did): one line now, at the event's severity.
"""

from __future__ import annotations

import logging

import pynvml
import pytest
from prometheus_client.parser import text_string_to_metric_families
from support.node import close_node, open_node, run_clock

from lynxtop.agent.events import EventSink
from lynxtop.agent.gpu.fake import FakeNvml
from lynxtop.agent.gpu.sampler import GpuSampler
from lynxtop.agent.gpu.scripted import scripted_scenario
from lynxtop.agent.metrics.exporter import MetricsExporter
from lynxtop.agent.sampling import EventCollector

pytestmark = pytest.mark.timeout(120)
TEXT = "text/plain; version=0.0.4; charset=utf-8"


def _page(node) -> dict[tuple[str, tuple], float]:  # noqa: ANN001
    exp = MetricsExporter("127.0.0.1:0", node.status, totals=node.view.serving_totals,
                          last_tick=lambda: node.ticker.last_tick_unix)
    text = exp.page(exp._text, TEXT).decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def _unreadable(page: dict[tuple[str, tuple], float]) -> dict[str, float]:
    return {dict(labels)["gpu"]: v for (name, labels), v in page.items() if name == "lynxtop_gpu_unreadable"}


class _FailGpu(dict):
    """FakeNvml.errors: every call on one GPU answers UNKNOWN (not lost) while `on`."""

    def __init__(self, gpu: int):
        super().__init__()
        self.gpu, self.on = gpu, False

    def __bool__(self) -> bool:
        return self.on

    def get(self, key, default=None):  # noqa: ANN001, ANN201
        return pynvml.NVML_ERROR_UNKNOWN if self.on and key[0] == self.gpu else default


async def test_a_gpu_whose_readings_fail_is_a_series_the_alert_reads(tmp_path, h):
    node = open_node(h.write_config(tmp_path, 'sample_interval_s = 0.1\nfake_nvml = "h200x8"'))
    try:
        await run_clock(node, 30, until=lambda: len(_unreadable(_page(node))) == 8, what="every GPU on the page")
        assert set(_unreadable(_page(node)).values()) == {0.0}  # every GPU reads
        fail = _FailGpu(3)
        node.sampler._c.b.errors = fail
        fail.on = True
        await run_clock(node, 30, until=lambda: _unreadable(_page(node)).get("3") == 1.0,
                        what="GPU 3 unreadable on the page")
        page = _unreadable(_page(node))
        assert page["3"] == 1.0 and all(v == 0.0 for g, v in page.items() if g != "3"), page
        assert page.keys() == {str(i) for i in range(8)}
        assert _page(node)[("lynxtop_gpu_lost", (("gpu", "3"), ("uuid", node.status().gpus[3].uuid)))] == 0.0
        fail.on = False
        await run_clock(node, 30, until=lambda: _unreadable(_page(node)).get("3") == 0.0,
                        what="GPU 3 readable again")
    finally:
        close_node(node)


@pytest.mark.parametrize(("scenario", "state"), [("h200x8", "ok"), ("nodriver", "no-driver")])
async def test_nvmls_state_is_on_the_page(tmp_path, h, scenario, state):
    """No driver (nvml.unavailable warning: LynxtopNvmlNoDriver) is not a failing library (error: LynxtopNvmlDown),
    and no GPU of such a node is said unreadable."""
    node = open_node(h.write_config(tmp_path, f'sample_interval_s = 0.1\nfake_nvml = "{scenario}"'))
    try:
        await run_clock(node, 30, until=lambda: ("lynxtop_nvml_ok", ()) in _page(node), what="NVML's state")
        page = _page(node)
        states = {dict(labels)["state"]: v for (name, labels), v in page.items() if name == "lynxtop_nvml_state"}
        assert states == {s: float(s == state) for s in ("ok", "error", "no-driver")}
        assert page[("lynxtop_nvml_ok", ())] == float(state == "ok")
        if state != "ok":
            assert _unreadable(page) == {}
    finally:
        close_node(node)


class _Clock:
    """Seconds pass only when the test says so."""

    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


class _GpmAllocBug(FakeNvml):
    """GPU 1's GPM sample allocation fails with a bug, not an NVMLError."""

    def nvmlGpmQueryDeviceSupport(self, handle):  # noqa: ANN001, ANN201
        self._gpm_query_gpu = self.nvmlDeviceGetIndex(handle)
        return super().nvmlGpmQueryDeviceSupport(handle)

    def nvmlGpmSampleAlloc(self):  # noqa: ANN201
        if getattr(self, "_gpm_query_gpu", None) == 1:
            raise RuntimeError("GPM allocation bug")
        return super().nvmlGpmSampleAlloc()


def test_gpu_setup_failed_is_one_journal_line_at_its_severity(caplog):
    """Through the agent's path (the tick's collector, then the event sink): one line, at the event's level."""
    caplog.set_level(logging.DEBUG)
    clock = _Clock()
    node = scripted_scenario("h200x8")
    collector = EventCollector()
    s = GpuSampler(lambda: _GpmAllocBug(node, clock=clock), clock=clock, on_event=collector, xid_events=False)
    for _ in range(3):
        clock.t += 1.0
        s.sample(set())
    s.close()
    stored: list = []

    class Writer:
        def record(self, ev) -> None:  # noqa: ANN001
            stored.append(ev)

    sink = EventSink(Writer())
    for ev in collector.drain():
        sink.put(ev)
    assert [e.kind for e in stored if e.kind == "gpu.setup_failed"] == ["gpu.setup_failed"]
    lines = [(r.levelname, r.getMessage()) for r in caplog.records if "setting up GPM failed" in r.getMessage()]
    assert [level for level, _ in lines] == ["WARNING"], lines  # gpm's event is a warning


def test_gpu_setup_failed_without_a_sink_is_still_one_line(caplog):
    caplog.set_level(logging.DEBUG)
    clock = _Clock()
    node = scripted_scenario("h200x8")
    s = GpuSampler(lambda: _GpmAllocBug(node, clock=clock), clock=clock, on_event=None, xid_events=False)
    for _ in range(3):
        clock.t += 1.0
        s.sample(set())
    s.close()
    lines = [r.levelname for r in caplog.records if "setting up GPM failed" in r.getMessage()]
    assert lines == ["WARNING"], lines
