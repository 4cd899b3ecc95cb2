"""The exporter's per-column families come from the column contract (issue 27.6): a column with no metric, or a
metric with no column, fails here; the names fleets already scrape stay as they were."""

from __future__ import annotations

import re

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from support.status import gpu_row, make_status

from lynxtop.agent.metrics.exporter import SnapshotCollector
from lynxtop.contract import exported as ex
from lynxtop.contract.columns import names

NAME = re.compile(r"^lynxtop_[a-z][a-z0-9_]*$")


@pytest.mark.parametrize("table", sorted(ex.TABLES))
def test_every_column_is_exported_or_says_why_not(table):
    done = {c.column for c in ex.exported(table)}
    skipped = {col for (t, col) in ex.NOT_EXPORTED if t == table}
    columns = set(names(ex.TABLES[table]))
    assert not done & skipped, f"{table}: both exported and not: {sorted(done & skipped)}"
    assert columns == done | skipped, f"{table}: columns without a metric: {sorted(columns - done - skipped)}"
    assert all(ex.NOT_EXPORTED[(table, col)].strip() for col in skipped)
    assert {col for (t, col) in ex.NOT_EXPORTED if t == table} <= columns, "a reason for a column that is gone"


def test_names_are_prometheus_names_unique_and_counters_end_in_total():
    every = [c for t in ex.TABLES for c in ex.exported(t)]
    assert len({c.name for c in every}) == len(every)
    for c in every:
        assert NAME.match(c.name), c.name
        assert c.name.endswith("_total") == c.counter, c.name
        assert c.help and c.scale > 0


def test_names_fleets_scrape_are_kept():
    by_col = {(c.table, c.column): c.name for t in ex.TABLES for c in ex.exported(t)}
    assert by_col[("gpu", "util_gpu_pct")] == "lynxtop_gpu_utilization_ratio"
    assert by_col[("gpu", "mem_used_bytes")] == "lynxtop_gpu_memory_used_bytes"
    assert by_col[("gpu", "sm_clock_mhz")] == "lynxtop_gpu_sm_clock_hertz"
    assert by_col[("gpu", "energy_j")] == "lynxtop_gpu_energy_joules_total"
    assert by_col[("host", "vllm_cpu_pct")] == "lynxtop_host_vllm_cpu_cores"
    assert by_col[("serving", "kv_cache_usage_pct")] == "lynxtop_serving_kv_cache_usage_ratio"
    # a column added to the contract is exported under the rule's name with no edit to the exporter
    assert by_col[("gpu", "fp16_active_pct")] == "lynxtop_gpu_fp16_active_ratio"


def _page(status) -> dict[str, float]:
    reg = CollectorRegistry()
    reg.register(SnapshotCollector(lambda: status))
    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(generate_latest(reg).decode()):
        for s in fam.samples:
            if s.labels.get("gpu", "0") == "0" and "reason" not in s.labels and "state" not in s.labels:
                out[s.name] = s.value
    return out


def test_the_page_has_every_exported_column_scaled_and_no_column_family_the_contract_lacks():
    host = {name: 7 for name, sql, _ in ex.TABLES["host"] if sql != "TEXT"}
    gpu = gpu_row(0, **{name: 7 for name in names(ex.TABLES["gpu"])})
    page = _page(make_status(gpu_rows=[gpu], host=host, metrics={name: 7 for name in names(ex.TABLES["serving"])}))
    for table in ("gpu", "host", "serving"):
        for c in ex.exported(table):
            assert page.get(c.name) == pytest.approx(7 * c.scale), (c.column, c.name)
    # families named after a table's columns that the contract does not give: only the ones documented elsewhere
    derived = {c.name for t in ex.TABLES for c in ex.exported(t)}
    extra = {n for n in page if n.startswith(("lynxtop_gpu_", "lynxtop_host_")) and n not in derived}
    assert extra == {"lynxtop_gpu_xid_errors_total", "lynxtop_gpu_unreadable"}, extra  # both in docs/api.md
