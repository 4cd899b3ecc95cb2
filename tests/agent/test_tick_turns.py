"""What a tick costs the event loop in tasks (issue 29.3): each stage's last sampler (the host, the scrape, the SLA)
runs in the tick's own task, the others (the GPU source) as tasks beside it, no gather for a stage of one or two.
At 10 Hz every loop turn taken while the GPU sample runs in the executor is a GIL hand-over between the two
threads; the tick still carries every row, a failing sampler still fails its tick with the others' rows and
events kept, and a cancelled tick cancels the stage's other samplers."""

from __future__ import annotations

import asyncio

import pytest
from support.node import close_node, open_node, run_clock

from lynxtop.agent.sampling import NOT_NOW, Tick, sample_stages, stages_now

pytestmark = pytest.mark.timeout(90)


def _count_tasks() -> list[int]:
    """Tasks created on the running loop from now on (its task factory counts them)."""
    loop = asyncio.get_running_loop()
    made = [0]

    def factory(loop: asyncio.AbstractEventLoop, coro, **kwargs):  # noqa: ANN001, ANN003, ANN202
        made[0] += 1
        return asyncio.Task(coro, loop=loop, **kwargs)

    loop.set_task_factory(factory)
    return made


async def test_a_tick_at_10_hz_makes_three_tasks_and_keeps_its_rows(tmp_path, h):
    node = open_node(h.write_config(tmp_path, 'sample_interval_s = 0.1\nfake_nvml = "h200x8"'))
    made = _count_tasks()
    try:
        await run_clock(node, 2.0)
        t = node.ticker
        assert t.ticks >= 10 and t.failed_ticks == 0, (t.ticks, t.missed_ticks, t.last_tick_error)
        # at most 3 a tick (six before: the host, GPU, scrape and SLA samplers each had a task); since the clock
        # thread, none when no scrape is awaited (test_tick_handoff.py holds that); +2 for run_clock's own task
        assert made[0] <= 3 * t.ticks + 2, (made[0], t.ticks)
        node.writer.flush()
        assert h.db_rows(node.writer.path, "SELECT count(DISTINCT ts_ms) AS n FROM host_samples")[0]["n"] >= t.ticks - 1
    finally:
        asyncio.get_running_loop().set_task_factory(None)
        close_node(node)


class _Sampler:
    def __init__(self, rows: dict, fail: Exception | None = None, wait: asyncio.Event | None = None):
        self.rows, self.fail, self.wait, self.calls, self.cancelled = rows, fail, wait, 0, False

    async def sample(self, tick: Tick):  # noqa: ANN201
        self.calls += 1
        if self.wait is not None:
            try:
                await self.wait.wait()
            except asyncio.CancelledError:
                self.cancelled = True
                raise
        if self.fail is not None:
            raise self.fail
        return self.rows, [f"event of {sorted(self.rows)}"]


async def test_a_single_sampler_stage_fails_its_tick_as_a_gathered_one_did():
    first, bad, never = _Sampler({"host_row": {"x": 1}}), _Sampler({}, ValueError("no /proc")), _Sampler({"y": 2})
    tick = Tick(ts_ms=1, t0=0.0, deadline=1.0, root=None, run_id=None)
    error = await sample_stages([[first], [bad], [never]], tick)
    assert isinstance(error, ValueError) and str(error) == "no /proc"
    assert tick.rows == {"host_row": {"x": 1}} and never.calls == 0
    tick = Tick(ts_ms=2, t0=0.0, deadline=1.0, root=None, run_id=None)
    assert await sample_stages([[first], [never]], tick) is None and tick.rows == {"host_row": {"x": 1}, "y": 2}


async def test_a_stage_of_two_keeps_both_rows_and_either_error_in_order():
    gpu, scrape = _Sampler({"gpu_rows": [1]}), _Sampler({"serving_row": {"ok": 1}})
    tick = Tick(ts_ms=1, t0=0.0, deadline=1.0, root=None, run_id=None)
    assert await sample_stages([[gpu, scrape]], tick) is None
    assert tick.rows == {"gpu_rows": [1], "serving_row": {"ok": 1}}
    assert tick.events == ["event of ['gpu_rows']", "event of ['serving_row']"]  # the stage's order
    for failing in (0, 1):
        pair = [_Sampler({"gpu_rows": [1]}), _Sampler({"serving_row": {}})]
        pair[failing].fail = OSError(f"sampler {failing}")
        tick = Tick(ts_ms=2, t0=0.0, deadline=1.0, root=None, run_id=None)
        error = await sample_stages([pair], tick)
        assert isinstance(error, OSError) and str(error) == f"sampler {failing}"
        kept = pair[1 - failing]
        assert tick.rows == kept.rows and tick.events == [f"event of {sorted(kept.rows)}"]  # the other's kept
    both = [_Sampler({}, OSError("first")), _Sampler({}, OSError("second"))]
    error = await sample_stages([both], Tick(ts_ms=3, t0=0.0, deadline=1.0, root=None, run_id=None))
    assert str(error) == "first"  # the first in the stage's order, as gather's results gave it


async def test_a_cancelled_tick_cancels_the_other_samplers_of_its_stage():
    never = asyncio.Event()
    for waiting in (0, 1):  # the tick cancelled while its own sampler waits, or while it waits for the other
        pair = [_Sampler({"gpu_rows": []}, wait=never if waiting == 0 else None), _Sampler({"serving_row": {}})]
        pair[waiting].wait = never
        tick = Tick(ts_ms=1, t0=0.0, deadline=1.0, root=None, run_id=None)
        task = asyncio.create_task(sample_stages([pair], tick))
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await asyncio.sleep(0)
        assert pair[waiting].cancelled, waiting


class _Now(_Sampler):
    """A sampler that answers without waiting (`sample_now`), or says it must be awaited (NOT_NOW)."""

    def __init__(self, rows: dict, fail: Exception | None = None, later: bool = False):
        super().__init__(rows, fail)
        self.later, self.now_calls = later, 0

    def sample_now(self, tick: Tick):  # noqa: ANN201
        self.now_calls += 1
        if self.later:
            return NOT_NOW
        if self.fail is not None:
            raise self.fail
        return self.rows, [f"now {sorted(self.rows)}"]


async def test_stages_that_answer_at_once_run_without_a_task_and_the_rest_keep_the_stage_order():
    gpu, scrape, sla = _Now({"gpu_rows": [1]}), _Now({"serving_row": {}}), _Now({"sla": 1})
    tick = Tick(ts_ms=1, t0=0.0, deadline=1.0, root=None, run_id=None)
    assert stages_now([[gpu, scrape], [sla]], tick) == (2, None, None)  # all answered here: nothing to await
    assert tick.events == ["now ['gpu_rows']", "now ['serving_row']", "now ['sla']"] and scrape.calls == 0
    # the scrape must be awaited: the GPU's answer already given is kept, in the stage's order, with the awaited one
    scrape.later = True
    tick = Tick(ts_ms=2, t0=0.0, deadline=1.0, root=None, run_id=None)
    done, answered, error = stages_now([[gpu, scrape], [sla]], tick)
    assert (done, error) == (0, None) and answered[1] is NOT_NOW and tick.events == []
    assert await sample_stages([[gpu, scrape], [sla]], tick, answered) is None
    assert tick.events == ["now ['gpu_rows']", "event of ['serving_row']", "event of ['sla']"] and gpu.now_calls == 2
    # an error answered at once fails the tick as gather's did: the stage's other rows kept, the next stage not run
    bad, sla_calls = _Now({}, OSError("NVML")), sla.now_calls
    tick = Tick(ts_ms=3, t0=0.0, deadline=1.0, root=None, run_id=None)
    done, answered, error = stages_now([[bad, _Now({"serving_row": {}})], [sla]], tick)
    assert str(error) == "NVML" and tick.rows == {"serving_row": {}} and sla.now_calls == sla_calls
