"""`GET /metrics?name[]=...` on the agent's exporter returns the named series, as prometheus_client's own endpoint
does, through the real listener: it answered an empty page for every name (the collector declared no names, so
prometheus_client's name filter found no collector to ask)."""

from __future__ import annotations

import aiohttp
import pytest
from agent_io_helpers import FakeController
from prometheus_client.parser import text_string_to_metric_families

from lynxtop.agent.metrics.exporter import MetricsExporter

OPENMETRICS = "application/openmetrics-text; version=1.0.0"


@pytest.fixture
async def get():
    state = {"snapshot": FakeController().status()}
    exp = MetricsExporter("127.0.0.1:0", lambda: state["snapshot"], log=lambda _: None, last_tick=lambda: 1.7e9)
    await exp.start()
    session = aiohttp.ClientSession()

    async def fetch(query: str, accept: str | None = None) -> tuple[int, str, str]:
        headers = {"Accept": accept} if accept else {}
        async with session.get(f"http://127.0.0.1:{exp.bound_port}/metrics?{query}", headers=headers) as resp:
            return resp.status, resp.headers.get("Content-Type", ""), await resp.text()

    yield fetch
    await session.close()
    await exp.stop()


def names(text: str) -> set[str]:
    return {s.name for fam in text_string_to_metric_families(text) for s in fam.samples}


async def test_one_name_gives_that_series_only(get):
    code, _, text = await get("name[]=lynxtop_gpu_power_watts")
    assert code == 200
    assert names(text) == {"lynxtop_gpu_power_watts"}, text
    fams = list(text_string_to_metric_families(text))
    assert len(fams) == 1 and len(fams[0].samples) == 8  # every GPU's
    assert "# HELP lynxtop_gpu_power_watts" in text and "# TYPE lynxtop_gpu_power_watts gauge" in text


async def test_several_names_and_a_counter_by_its_sample_or_family_name(get):
    _, _, text = await get("name[]=lynxtop_gpu_power_watts&name[]=lynxtop_gpu_energy_joules_total"
                           "&name[]=lynxtop_agent_last_tick_timestamp_seconds")
    assert names(text) == {"lynxtop_gpu_power_watts", "lynxtop_gpu_energy_joules_total",
                           "lynxtop_agent_last_tick_timestamp_seconds"}, text
    _, _, by_family = await get("name[]=lynxtop_gpu_energy_joules")  # the family's name: all of its samples
    assert names(by_family) == {"lynxtop_gpu_energy_joules_total"}, by_family


async def test_an_unknown_name_is_an_empty_page_and_openmetrics_is_kept(get):
    code, _, text = await get("name[]=no_such_series")
    assert code == 200 and names(text) == set()
    code, ctype, om = await get("name[]=lynxtop_gpu_power_watts", accept=OPENMETRICS)
    assert code == 200 and ctype.startswith("application/openmetrics-text"), ctype
    assert om.rstrip().endswith("# EOF") and "lynxtop_gpu_power_watts{" in om, om
