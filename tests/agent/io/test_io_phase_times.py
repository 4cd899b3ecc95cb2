"""Prefill and decode time: read from vLLM's own `vllm:request_prefill_time_seconds` / `…decode_time_seconds`
histograms when the page has them, derived as means (TTFT - queue, e2e - TTFT) when it does not, and the row and
the exporter's page say which (`phase_times_derived`, `lynxtop_serving_phase_times_derived`).

The observations are chosen so the two ways disagree: a reading that came from the derivation where vLLM's
histogram was on the page (or the other way round) fails."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml
from agent_io_helpers import REQ_BUCKETS, VllmPage
from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from support.real import needs_tools
from support.status import make_status

from lynxtop.agent.metrics.exporter import SnapshotCollector
from lynxtop.agent.metrics.histogram import bucket_quantile
from lynxtop.agent.metrics.lifetime import ServingTotals
from lynxtop.agent.metrics.scrape import MetricsScraper

N = 5  # requests per engine
TTFT_S, QUEUE_S, E2E_S = 2.0, 1.0, 10.0  # derived: prefill 1.0 s, decode 8.0 s
PREFILL_S, DECODE_S = 0.4, 3.0  # what vLLM measured


def page_with(phases: bool) -> tuple[VllmPage, Histogram | None, Histogram | None]:
    page = VllmPage(engines=2)
    if not phases:
        return page, None, None
    pre = Histogram("vllm:request_prefill_time_seconds", "prefill", ["model_name", "engine"], buckets=REQ_BUCKETS,
                    registry=page.registry)
    dec = Histogram("vllm:request_decode_time_seconds", "decode", ["model_name", "engine"], buckets=REQ_BUCKETS,
                    registry=page.registry)
    for e in range(2):  # vLLM prints every series from the start, at zero
        pre.labels(*page.lab(e))
        dec.labels(*page.lab(e))
    return page, pre, dec


def scrape_traffic(phases: bool) -> tuple[dict, ServingTotals]:
    """Two scrapes with 2N requests between them; the agent-lifetime totals observe both (the first is a baseline)."""
    page, pre, dec = page_with(phases)
    s, totals = MetricsScraper("http://127.0.0.1:8000/metrics"), ServingTotals()
    s.parse_page(page.text(), now=0.0)
    totals.observe(s)
    for e in range(2):
        lab = page.lab(e)
        for _ in range(N):
            page.ttft.labels(*lab).observe(TTFT_S)
            page.queue.labels(*lab).observe(QUEUE_S)
            page.e2e.labels(*lab).observe(E2E_S)
            if pre is not None and dec is not None:
                pre.labels(*lab).observe(PREFILL_S)
                dec.labels(*lab).observe(DECODE_S)
    row = s.parse_page(page.text(), now=1.0)
    totals.observe(s)
    return row, totals


def exported_page(row: dict, totals: ServingTotals) -> dict[str, dict]:
    """The exporter's page for a status carrying this row and these agent-lifetime totals, by family."""
    status = make_status(metrics=row)
    reg = CollectorRegistry(auto_describe=False)
    reg.register(SnapshotCollector(lambda: status, lambda: totals.models))
    out: dict[str, dict] = {}
    for fam in text_string_to_metric_families(generate_latest(reg).decode()):
        for smp in fam.samples:
            out.setdefault(fam.name, {})[(smp.name, tuple(sorted(smp.labels.items())))] = smp.value
    return out


def one(page: dict[str, dict], family: str) -> float:
    [value] = page[family].values()
    return value


def test_prefill_and_decode_come_from_vllms_histograms_when_the_page_has_them():
    row, totals = scrape_traffic(phases=True)
    assert row["phase_times_derived"] == 0
    assert row["prefill_mean_ms"] == pytest.approx(PREFILL_S * 1000)  # not TTFT - queue (1000)
    assert row["decode_mean_ms"] == pytest.approx(DECODE_S * 1000)  # not e2e - TTFT (8000)
    # the percentiles are vLLM's buckets' (a difference of two histograms has none to give)
    cumulative = [(b, float(2 * N) if b >= PREFILL_S else 0.0) for b in [*REQ_BUCKETS, float("inf")]]
    assert row["prefill_p99_ms"] == pytest.approx(bucket_quantile(0.99, cumulative) * 1000)
    assert row["decode_p50_ms"] is not None and row["decode_p99_ms"] >= row["decode_p50_ms"]

    page = exported_page(row, totals)
    assert one(page, "lynxtop_serving_phase_times_derived") == 0
    assert one(page, "lynxtop_serving_prefill_mean_seconds") == pytest.approx(PREFILL_S)
    assert one(page, "lynxtop_serving_decode_p99_seconds") == pytest.approx(row["decode_p99_ms"] / 1000)
    # vLLM's histograms, carried over the agent's life like the others (what the Grafana panel reads)
    hist = page["lynxtop_serving_prefill_seconds"]
    assert [v for (name, _), v in hist.items() if name.endswith("_count")] == [2 * N]
    assert [v for (name, _), v in hist.items() if name.endswith("_sum")] == [pytest.approx(2 * N * PREFILL_S)]
    assert "lynxtop_serving_decode_seconds" in page


def test_without_vllms_phase_histograms_the_means_are_derived_and_said_so():
    row, totals = scrape_traffic(phases=False)
    assert row["phase_times_derived"] == 1
    assert row["prefill_mean_ms"] == pytest.approx((TTFT_S - QUEUE_S) * 1000)
    assert row["decode_mean_ms"] == pytest.approx((E2E_S - TTFT_S) * 1000)
    for phase in ("prefill", "decode"):  # percentiles do not subtract: none rather than a wrong one
        assert all(row[f"{phase}_{q}_ms"] is None for q in ("p50", "p90", "p99")), row

    page = exported_page(row, totals)
    assert one(page, "lynxtop_serving_phase_times_derived") == 1
    assert one(page, "lynxtop_serving_decode_mean_seconds") == pytest.approx(E2E_S - TTFT_S)
    assert "lynxtop_serving_prefill_p99_seconds" not in page
    assert "lynxtop_serving_prefill_seconds" not in page and "lynxtop_serving_decode_seconds" not in page


def test_no_traffic_yet_is_no_reading_not_zero():
    """Before any request finished there is no mean to read or derive: NULL, never a fake 0."""
    for phases in (True, False):
        page, _, _ = page_with(phases)
        s = MetricsScraper("http://127.0.0.1:8000/metrics")
        s.parse_page(page.text(), now=0.0)
        row = s.parse_page(page.text(), now=1.0)
        assert row["prefill_mean_ms"] is None and row["decode_mean_ms"] is None
        assert row["phase_times_derived"] == (0 if phases else 1)


# ---------------------------------------------------------------------------------------------------- Grafana

DASHBOARD = Path(__file__).resolve().parents[3] / "contrib" / "grafana" / "lynxtop-dashboard.json"
PANEL = "Prefill and decode time (mean per request)"


def _phase_targets() -> dict[str, str]:
    """The panel's prefill and decode queries, by the last word of their legend, "All" nodes selected."""
    dash = json.loads(DASHBOARD.read_text())
    [panel] = [p for top in dash["panels"] for p in (top, *top.get("panels", ())) if p.get("title") == PANEL]
    return {t["legendFormat"].split()[-1]: t["expr"].replace("$node", ".*") for t in panel["targets"]}


def _series(node: str, name: str, per_min: float) -> dict[str, str]:
    return {"series": f'{name}{{node="{node}", model_name="m"}}', "values": f"0+{per_min:g}x6"}


@needs_tools("promtool")
def test_the_dashboard_shows_vllms_phase_times_where_exported_and_the_derived_ones_labelled_elsewhere(tmp_path):
    """promtool evaluates the panel's own queries over two nodes: n1's vLLM exports the phase histograms (the
    agent passes them on as lynxtop_serving_{prefill,decode}_seconds), n2's does not. n1 shows vLLM's means,
    labelled source="vLLM"; n2 the derived ones, labelled source="derived"; neither node shows both."""
    exprs = _phase_targets()
    assert {"prefill", "decode"} <= set(exprs), exprs
    series = []
    for node in ("n1", "n2"):  # 60 requests a minute on each node
        for name, mean_s in (("ttft", TTFT_S), ("queue", QUEUE_S), ("e2e", E2E_S)):
            series += [_series(node, f"lynxtop_serving_{name}_seconds_sum", 60 * mean_s),
                       _series(node, f"lynxtop_serving_{name}_seconds_count", 60)]
    for name, mean_s in (("prefill", PREFILL_S), ("decode", DECODE_S)):
        series += [_series("n1", f"lynxtop_serving_{name}_seconds_sum", 60 * mean_s),
                   _series("n1", f"lynxtop_serving_{name}_seconds_count", 60)]
    want = {"prefill": (PREFILL_S, TTFT_S - QUEUE_S), "decode": (DECODE_S, E2E_S - TTFT_S)}
    tests = [{"expr": exprs[phase], "eval_time": "6m", "exp_samples": [
        {"labels": '{node="n1", source="vLLM"}', "value": vllm_s},
        {"labels": '{node="n2", source="derived"}', "value": derived_s}]}
        for phase, (vllm_s, derived_s) in want.items()]
    case = tmp_path / "phases.test.yml"
    case.write_text(yaml.safe_dump({"rule_files": [], "evaluation_interval": "1m", "tests": [
        {"interval": "1m", "input_series": series, "promql_expr_test": tests}]}))
    proc = subprocess.run(["promtool", "test", "rules", str(case)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
