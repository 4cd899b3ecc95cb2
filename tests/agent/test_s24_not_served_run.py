"""The status never pairs one run's list of quantities not served with another run.

A new run becomes ready (serving again, a new run id) a tick or more before the sampling path makes that run's
scraper: until then the source's scraper is the previous run's, and its list (and its version) would be shown as
the new run's: "not served by vLLM 0.10.2: TPOT" on a 0.32 run that serves it, or the old list under the new run's
version. The list is the run's whose page it was read from (ScrapeSource's target), and only the current run's is
shown.

Real parts: the sampling path's ScrapeSource and the agent's scraper reading the simulator's vLLM pages (0.10: no
per-request TPOT histogram; 0.32: every family) from a real HTTP server; the status built as StatusView builds it.
"""

from __future__ import annotations

import asyncio
import time

import pytest
from prometheus_client import generate_latest
from support.web_app import metrics_app, serving

from lynxtop.agent.sampling import ScrapeSource, ScrapeTarget, Tick
from lynxtop.agent.serving.health import HttpClient
from lynxtop.agent.status_view import with_not_served
from lynxtop.contract.status import ServingState, ServingStatus, not_served_text
from lynxtop.sim.metrics import VllmMetrics

pytestmark = pytest.mark.timeout(120)


def engine(version: tuple[int, int]) -> VllmMetrics:
    return VllmMetrics(model_name="m", version=version, max_model_len=4096, spec_decode=False,
                       cache_info={"block_size": "16"})


def finish(m: VllmMetrics, n: int) -> None:
    """`n` requests of 8 tokens."""
    for _ in range(n):
        m.on_step({"running": 1, "waiting": 0, "kv": 0.25, "gen": 8, "pq": 100, "ph": 50, "first": [(1, 0.05)],
                   "itl": [0.03] * 3,
                   "fin": [{"reason": "length", "e2e_s": 0.9, "queue_s": 0.1, "inference_s": 0.8, "prefill_s": 0.1,
                            "decode_s": 0.7, "prompt_tokens": 100, "generation_tokens": 8, "max_tokens": 8,
                            "tpot_s": 0.03}]})


async def _scrape(src: ScrapeSource, m: VllmMetrics, page: list[str], t: float, n: int) -> float:
    """`n` scrapes through the sampling path, the page rewritten before each."""
    for _ in range(n):
        finish(m, 2)
        page[0] = generate_latest(m.registry).decode()
        rows, _ = await src.sample(Tick(ts_ms=int(t * 1000), t0=t, deadline=time.monotonic() + 20, root=None,
                                        run_id=None))
        assert rows["serving_row"]["scrape_ok"] == 1, rows
        t += 1.0
    return t


def _status(src: ScrapeSource, run_id: int, token: str, version: str | None) -> ServingStatus:
    """The run's serving status as StatusView builds it: the supervisor's (ready, this run), then the list."""
    return with_not_served(ServingStatus(state=ServingState.READY, run_id=run_id, vllm_version=version), src, token)


@pytest.mark.parametrize("run_knows_version", [True, False], ids=["version-known", "version-unknown"])
def test_a_new_run_ready_before_its_first_scrape_shows_no_list_of_the_previous_run(run_knows_version):
    """Run 1 (vLLM 0.10) lacks TPOT; run 2 (0.32) serves every family. Between run 2's readiness and its first
    scrape the status says nothing of TPOT for run 2 (neither run 1's list with run 1's version, nor with run 2's
    version where run 1's was unknown: "not served by vLLM 0.32.0: TPOT"); once
    read, run 2's own (empty) list; a run 3 of 0.10 again is named with its own version after its own page."""
    v1 = "0.10.2" if run_knows_version else None  # unknown: the old scraper's version is None, the new run's known
    v2 = "0.32.0"

    async def go() -> list[ServingStatus]:
        old, new = engine((0, 10)), engine((0, 32))
        page = [""]
        http = HttpClient()
        seen: list[ServingStatus] = []
        try:
            async with serving(metrics_app(page)) as url:
                target = [ScrapeTarget(url + "/metrics", 1, "run-1", vllm_version=v1)]
                src = ScrapeSource(http, lambda: target[0], window_s=60, timeout_s=5.0, hang_timeout_s=600.0,
                                   on_new_run=lambda: None, on_verdict=lambda v: None)
                t = await _scrape(src, old, page, 1000.0, 3)
                seen.append(_status(src, 1, "run-1", v1))
                # run 2 is ready (the supervisor says so) and its page is up; no tick has reached the source yet
                target[0] = ScrapeTarget(url + "/metrics", 2, "run-2", vllm_version="0.32.0")
                page[0] = generate_latest(new.registry).decode()
                seen.append(_status(src, 2, "run-2", v2))
                t = await _scrape(src, new, page, t, 2)
                seen.append(_status(src, 2, "run-2", v2))
                # run 3: 0.10 again, the same URL; before its page and after it
                target[0] = ScrapeTarget(url + "/metrics", 3, "run-3", vllm_version="0.10.3")
                seen.append(_status(src, 3, "run-3", "0.10.3"))
                await _scrape(src, engine((0, 10)), page, t, 2)
                seen.append(_status(src, 3, "run-3", "0.10.3"))
                # a status whose run is no one the source read (the store gave no id: told apart by the token)
                seen.append(_status(src, 3, "run-3-restarted", "0.10.3"))
                src.close()
        finally:
            await http.close()
        return seen

    run1, run2_before, run2_read, run3_before, run3_read, other = asyncio.run(go())
    assert run1.not_served == ("tpot",), run1
    assert run1.not_served_version == v1
    # the stale pairing: run 1's list shown as run 2's, under either run's version
    assert run2_before.not_served == () and run2_before.not_served_version is None, not_served_text(run2_before)
    assert run2_read.not_served == () and run2_read.not_served_version is None, not_served_text(run2_read)
    assert run3_before.not_served == (), not_served_text(run3_before)
    assert run3_read.not_served == ("tpot",) and run3_read.not_served_version == "0.10.3", run3_read
    assert other.not_served == (), not_served_text(other)


def test_a_stopped_source_or_none_shows_no_list():
    """Nothing scraped yet (no source, or a source with no scraper): the status as the supervisor gives it."""
    st = ServingStatus(state=ServingState.READY, run_id=1, vllm_version="0.10.2")
    assert with_not_served(st, None, "run-1") == st
    src = ScrapeSource(HttpClient(), lambda: None, window_s=60, timeout_s=5.0, hang_timeout_s=600.0,
                       on_new_run=lambda: None, on_verdict=lambda v: None)
    assert with_not_served(st, src, "run-1") == st
