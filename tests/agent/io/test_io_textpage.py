"""GET /metrics' text format is prometheus_client's `generate_latest` to the byte, with each series' escaped name
and labels built once, not at every render (issue 27: the page was rendered five times a second at 0.2 s
sampling, 16 us a sample, most of it escaping what had not changed)."""

from __future__ import annotations

import math
from dataclasses import replace

import aiohttp
from agent_io_helpers import FakeController
from prometheus_client import CollectorRegistry, Counter, Enum, Gauge, Histogram, Info, Summary, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.openmetrics import exposition as om
from prometheus_client.registry import Collector

from lynxtop.agent.metrics.exporter import MetricsExporter
from lynxtop.agent.metrics.textpage import TextPage


class _Odd(Collector):
    """Families as the exporter builds them, with every character the escaping must get right."""

    def __init__(self) -> None:
        self.value = 1.0

    def collect(self):
        g = GaugeMetricFamily("odd:gauge_x", 'help with \\ backslash,\nnewline and "quotes"',
                              labels=["gpu", "bad-label", "model_name"])
        for v in (self.value, math.nan, math.inf, -math.inf, 1e-300, 123456789012345.0, -0.0):
            g.add_metric(["0", 'a "q" \\ b\nc', "deepseek-ai/DeepSeek-V4.1 ✓"], v)
            g.add_metric([str(v), "", "é"], v)
        yield g
        c = CounterMetricFamily("odd_requests", "finished", labels=["reason"])
        c.add_metric(["stop"], self.value * 3)
        yield c
        yield GaugeMetricFamily("odd_nolabels", "", value=self.value)
        t = GaugeMetricFamily("odd_stamped", "with a timestamp")
        t.add_metric([], self.value, timestamp=1700000000.5)
        yield t


def _registry() -> tuple[CollectorRegistry, _Odd, list]:
    r = CollectorRegistry()
    odd = _Odd()
    r.register(odd)
    live = [Counter("x_total_things", "c", ["a"], registry=r), Gauge("x_g", "g", registry=r),
            Histogram("x_h_seconds", "h", ["model_name"], registry=r), Info("x_build", "i", registry=r),
            Enum("x_state", "e", states=["a", "b"], registry=r), Summary("x_s", "s", registry=r)]
    return r, odd, live


def test_every_render_is_generate_latest_to_the_byte():
    registry, odd, (counter, gauge, hist, info, enum, summary) = _registry()
    page = TextPage()
    counter.labels(a='x"y').inc()
    hist.labels(model_name="m").observe(0.3)
    info.info({"version": "1\n2"})
    assert page(registry) == generate_latest(registry)
    for step in range(3):  # new values, the same series: the kept texts are used
        odd.value += 0.5
        gauge.set(step - 1.25)
        hist.labels(model_name="m").observe(step)
        enum.state("b" if step % 2 else "a")
        summary.observe(step)
        assert page(registry) == generate_latest(registry)
    counter.labels(a="new series").inc(2)  # a series first seen now
    assert page(registry) == generate_latest(registry)


async def test_a_render_after_a_tick_escapes_no_series_again(monkeypatch):
    base = FakeController().status()
    state = {"st": base}
    exp = MetricsExporter("127.0.0.1:0", lambda: state["st"], log=lambda _: None)
    await exp.start()
    try:
        async with aiohttp.ClientSession() as session:
            async def get() -> bytes:
                async with session.get(f"http://127.0.0.1:{exp.bound_port}/metrics") as resp:
                    return await resp.read()

            await get()
            escaped = []
            real = om.escape_label_name
            monkeypatch.setattr(om, "escape_label_name", lambda *a: escaped.append(a) or real(*a))
            gpus = tuple(replace(g, metrics={k: (v + 1 if isinstance(v, (int, float)) else v)
                                             for k, v in g.metrics.items()}) for g in base.gpus)
            state["st"] = replace(base, gpus=gpus)  # a tick: new readings of the same series
            body = await get()
            assert exp.renders == 2
            assert escaped == []  # was every label of every sample on the page, at every render
            assert body == generate_latest(exp.registry)
    finally:
        await exp.stop()
