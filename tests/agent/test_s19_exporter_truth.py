"""What /metrics and the status say when the agent's readings are not current (session 19, exporter audit).

A real Node with the fake NVML driver, the real exporter and prometheus_client's own parser: while NVML is down
(or hangs) the GPU readings are absent, never the last ones frozen; at 10 Hz with NVML answering they never
blink out; the last tick's time is exported so a fleet can tell a stalled sampler; the contrib rules alert on an
unhealthy agent. Also the counters' bounds: failed scrapes across runs, finish reasons per model.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from pathlib import Path

import pynvml
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families
from support.node import close_node, open_node, run_clock
from support.waits import wait_for_async

from lynxtop.agent.gpu.fake import FakeNvml
from lynxtop.agent.metrics.exporter import MetricsExporter
from lynxtop.agent.metrics.lifetime import MAX_REASONS, OTHER_REASON, ServingTotals
from lynxtop.agent.metrics.scrape import MetricsScraper

pytestmark = pytest.mark.timeout(120)
ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "contrib" / "prometheus" / "lynxtop-rules.yml"
TEXT = "text/plain; version=0.0.4; charset=utf-8"
# every GPU series is a reading but the XID counter: the agent's own count, it keeps each GPU's gpu and uuid
KEPT = {"lynxtop_gpu_xid_errors_total"}


def _exporter(node) -> MetricsExporter:  # noqa: ANN001
    return MetricsExporter("127.0.0.1:0", node.status, totals=node.view.serving_totals,
                           last_tick=lambda: node.ticker.last_tick_unix)


def _page(exp: MetricsExporter) -> dict[tuple[str, tuple], float]:
    text = exp.page(exp._text, TEXT).decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def _gpu_readings(page: dict[tuple[str, tuple], float]) -> set[str]:
    return {n for n, _ in page if n.startswith("lynxtop_gpu_") and n not in KEPT}


async def test_gpu_readings_vanish_while_nvml_is_down_and_come_back_with_it(tmp_path, h):
    node = open_node(h.write_config(tmp_path, 'sample_interval_s = 0.1\nfake_nvml = "h200x8"'))
    exp = _exporter(node)
    try:
        await run_clock(node, 30, until=lambda: "lynxtop_gpu_temperature_celsius" in _gpu_readings(_page(exp)),
                        what="GPU readings on the page")
        uuids = {g.index: g.uuid for g in node.status().gpus}
        assert len(uuids) == 8 and all(uuids.values())
        real = node.sampler._c.b
        factory = node.sampler._factory

        def dead_driver() -> FakeNvml:  # every nvmlInit fails while the driver is gone
            f = FakeNvml(real.scenario, clock=real.clock)
            f.init_error = pynvml.NVML_ERROR_DRIVER_NOT_LOADED
            return f

        node.sampler._factory = dead_driver
        real.fail_all = pynvml.NVML_ERROR_DRIVER_NOT_LOADED  # the driver goes mid-run: re-init, then no driver
        await run_clock(node, 30, until=lambda: node.status().agent.nvml.state not in ("", "ok"),
                        what="NVML reported down")
        await run_clock(node, 1.0)  # more ticks with NVML down
        page, st = _page(exp), node.status()
        assert page[("lynxtop_nvml_ok", ())] == 0.0
        assert _gpu_readings(page) == set(), f"NVML is {st.agent.nvml.state}, yet GPU readings are served"
        # the GPUs are still named (status and the XID counter's labels); their readings are absent, not 0
        assert {g.index: g.uuid for g in st.gpus} == uuids
        assert all(v is None for g in st.gpus for v in g.metrics.values()), "a reading of a GPU NVML cannot read"
        xids = {dict(labels)["uuid"] for n, labels in page if n == "lynxtop_gpu_xid_errors_total"}
        assert xids == set(uuids.values())

        node.sampler._factory = factory  # the driver is back: the next try opens NVML again
        await run_clock(node, 60, until=lambda: "lynxtop_gpu_temperature_celsius" in _gpu_readings(_page(exp)),
                        what="GPU readings back once NVML opens again")
        assert _page(exp)[("lynxtop_nvml_ok", ())] == 1.0
        assert all(g.metric("power_w") is not None for g in node.status().gpus)
    finally:
        close_node(node)


async def test_at_10hz_with_nvml_answering_the_gpu_series_never_blink_out(tmp_path, h):
    """The reason the ticker once kept the last rows: every tick on time carries every GPU's row (quiet ticks and
    field rates included), and a late tick keeps the last rows a moment; the page never loses a GPU series."""
    node = open_node(h.write_config(tmp_path, 'sample_interval_s = 0.1\nfake_nvml = "h200x8"'))
    exp = _exporter(node)
    seen: list[int] = []
    stop = asyncio.Event()

    async def watch() -> None:
        while not stop.is_set():
            page = _page(exp)
            seen.append(sum(1 for n, _ in page if n == "lynxtop_gpu_power_watts"))
            await asyncio.sleep(0.03)

    t = node.ticker
    try:
        await run_clock(node, 30, until=lambda: t.quiet_ticks >= 3 and node.status().gpus[0].metric("power_w")
                        is not None, what="quiet ticks with GPU readings")
        watcher = asyncio.create_task(watch())
        before = t.ticks
        await run_clock(node, 60, until=lambda: t.ticks >= before + 30, what="30 more ticks")
        stop.set()
        await watcher
        assert t.quiet_ticks >= 3
        assert len(seen) >= 10 and set(seen) == {8}, f"GPU series per page over 30 ticks: {sorted(set(seen))}"
    finally:
        close_node(node)


async def test_gpu_readings_of_a_hung_nvml_are_not_served_for_ever(tmp_path, h, monkeypatch):
    """NVML hanging (a call that does not return): each tick is late and carries no GPU rows; the last rows stay
    a moment (GPU_ROWS_STALE_S), then the readings are absent until NVML answers again."""
    node = open_node(h.write_config(tmp_path, 'sample_interval_s = 0.1\nfake_nvml = "h200x8"'))
    exp = _exporter(node)
    release, hang = threading.Event(), threading.Event()
    real = node.sampler.sample

    def sample(pids):  # noqa: ANN001, ANN202 - the driver's call that does not return
        if hang.is_set():
            release.wait(30)
        return real(pids)

    monkeypatch.setattr(node.sampler, "sample", sample)
    t = node.ticker
    task = asyncio.create_task(t.run())
    try:
        await wait_for_async(lambda: "lynxtop_gpu_power_watts" in _gpu_readings(_page(exp)), 30,
                             what="GPU readings on the page")
        hang.set()
        hung_at = time.monotonic()
        await wait_for_async(lambda: not _gpu_readings(_page(exp)), 30, what="the hung NVML's readings gone")
        assert time.monotonic() - hung_at >= 1.5, "one late tick must not blank the GPUs"
        assert node.gpu_source.late >= 1
        assert all(v is None for g in node.status().gpus for v in g.metrics.values())
        release.set()
        hang.clear()
        await wait_for_async(lambda: "lynxtop_gpu_power_watts" in _gpu_readings(_page(exp)), 30,
                             what="GPU readings back once NVML answers")
    finally:
        release.set()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        close_node(node)


async def test_the_last_ticks_time_is_exported_and_stops_with_the_sampler(tmp_path, h):
    node = open_node(h.write_config(tmp_path, 'sample_interval_s = 0.1\nfake_nvml = "h200x8"'))
    exp = _exporter(node)
    key = ("lynxtop_agent_last_tick_timestamp_seconds", ())
    try:
        assert key not in _page(exp)  # no tick yet: no time to claim
        await run_clock(node, 30, until=lambda: node.ticker.ticks >= 3, what="three ticks")
        first = _page(exp)[key]
        assert abs(time.time() - first) < 5.0
        before = node.ticker.ticks
        await run_clock(node, 30, until=lambda: node.ticker.ticks >= before + 3, what="three more ticks")
        second = _page(exp)[key]
        assert second > first
        await asyncio.sleep(0.5)  # the clock stopped (a stalled sampler): the page no longer moves
        assert _page(exp)[key] == second and time.time() - second >= 0.5
    finally:
        close_node(node)


def test_the_contrib_rules_alert_on_an_unhealthy_agent_that_still_answers():
    rules = [r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]]
    alert = next((r for r in rules if r.get("alert") == "LynxtopAgentUnhealthy"), None)
    assert alert is not None, "no alert reads lynxtop_agent_healthy: a stalled sampler is served with up=1"
    assert alert["expr"].strip() == "lynxtop_agent_healthy == 0" and alert["for"] == "2m"
    assert "lynxtop status" in alert["annotations"]["description"]  # what to check
    docs = (ROOT / "docs" / "prometheus.md").read_text()
    assert "`LynxtopAgentUnhealthy`" in docs and "lynxtop_agent_last_tick_timestamp_seconds" in docs


async def test_failed_scrapes_count_since_the_agent_started_across_runs():
    """A new run gets a new scraper: the count of failed scrapes goes on (contract/columns.py: since the agent
    started), so lynxtop_serving_scrape_errors_total never falls back to 0 at a vLLM restart."""
    from support.ports import free_port

    from lynxtop.agent.sampling import ScrapeSource, ScrapeTarget, Tick

    class Http:
        def session(self):  # noqa: ANN202 - a plain http:// page is read over the scraper's own connection
            return None

    url = f"http://127.0.0.1:{free_port()}/metrics"  # nobody listens: every scrape fails
    target = [ScrapeTarget(url, 1, "a")]
    src = ScrapeSource(Http(), lambda: target[0], window_s=60, timeout_s=1.0, hang_timeout_s=30,
                       on_new_run=lambda: None, on_verdict=lambda v: None, interval_s=0.0)
    counts = []
    try:
        for i, run in enumerate((1, 1, 2, 3)):
            target[0] = ScrapeTarget(url, run, str(run))
            now = time.monotonic()
            rows, _ = await src.sample(Tick(ts_ms=1000 + i, t0=now, deadline=now + 5.0, root=None, run_id=run))
            row = rows["serving_row"]
            assert row["scrape_ok"] == 0 and row["run_id"] == run
            counts.append(row["scrape_errors"])
        assert counts == [1, 2, 3, 4], f"failed scrapes per tick across runs 1, 1, 2, 3: {counts}"
    finally:
        src.close()


def _requests_page(reasons: list[str]) -> str:
    lines = ["# TYPE vllm:request_success_total counter"]
    lines += [f'vllm:request_success_total{{engine="0",finished_reason="{r}",model_name="m"}} 1' for r in reasons]
    return "\n".join(lines) + "\n"


def test_finish_reasons_per_model_are_capped_the_rest_counted_as_other():
    scraper = MetricsScraper("http://127.0.0.1:9/metrics")
    totals = ServingTotals()
    odd = [f"odd{i}" for i in range(100)]  # a server inventing reasons
    pages = (["stop"], ["stop", "stop", "length"], ["stop", "stop", "length", *odd],
             ["stop", "stop", "length", *odd, "late"])
    for t, reasons in enumerate(pages):
        counts = {r: reasons.count(r) for r in reasons}
        lines = ["# TYPE vllm:request_success_total counter"]
        lines += [f'vllm:request_success_total{{engine="0",finished_reason="{r}",model_name="m"}} {n}'
                  for r, n in counts.items()]
        scraper.parse_page("\n".join(lines) + "\n", float(t))
        totals.observe(scraper)  # the first page: the baseline
        if t == 2:
            finished = dict(totals.models["m"].finished)
    assert len(finished) == MAX_REASONS, f"{len(finished)} finished_reason values kept for one model"
    assert finished["stop"] == 1.0 and finished["length"] == 1.0  # the reasons seen first keep their own
    assert sum(finished.values()) == 102  # nothing lost: every increase counted, named or folded
    named = MAX_REASONS - 3  # room for stop, length and OTHER_REASON
    assert finished[OTHER_REASON] == len(odd) - named
    last = totals.models["m"].finished
    assert len(last) == MAX_REASONS and "late" not in last
    assert last[OTHER_REASON] == len(odd) - named + 1
