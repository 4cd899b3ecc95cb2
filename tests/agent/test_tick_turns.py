"""What a tick costs the event loop in tasks (issue 29.3): a stage of one sampler (the host, the SLA) is awaited in
the tick's own task, not wrapped in a task and a gather of its own. At 10 Hz every loop turn taken while the GPU
sample runs in the executor is a GIL hand-over between the two threads; the tick still carries every row and a
failing single sampler still fails its tick."""

from __future__ import annotations

import asyncio

import pytest
from support.node import close_node, open_node, run_clock

from lynxtop.agent.sampling import Tick, sample_stages

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


async def test_a_tick_at_10_hz_makes_four_tasks_and_keeps_its_rows(tmp_path, h):
    node = open_node(h.write_config(tmp_path, 'sample_interval_s = 0.1\nfake_nvml = "h200x8"'))
    made = _count_tasks()
    try:
        await run_clock(node, 2.0)
        t = node.ticker
        assert t.ticks >= 10 and t.failed_ticks == 0, (t.ticks, t.missed_ticks, t.last_tick_error)
        # the tick, its GPU job, the two samplers of the GPU and scrape stage (six before: the host and SLA
        # stages each had a task); +2 for run_clock's own task and a tick cut off at the end
        assert made[0] <= 4 * t.ticks + 2, (made[0], t.ticks)
        node.writer.flush()
        assert h.db_rows(node.writer.path, "SELECT count(DISTINCT ts_ms) AS n FROM host_samples")[0]["n"] >= t.ticks - 1
    finally:
        asyncio.get_running_loop().set_task_factory(None)
        close_node(node)


class _Sampler:
    def __init__(self, rows: dict, fail: Exception | None = None):
        self.rows, self.fail, self.calls = rows, fail, 0

    async def sample(self, tick: Tick):  # noqa: ANN201
        self.calls += 1
        if self.fail is not None:
            raise self.fail
        return self.rows, []


async def test_a_single_sampler_stage_fails_its_tick_as_a_gathered_one_did():
    first, bad, never = _Sampler({"host_row": {"x": 1}}), _Sampler({}, ValueError("no /proc")), _Sampler({"y": 2})
    tick = Tick(ts_ms=1, t0=0.0, deadline=1.0, root=None, run_id=None)
    error = await sample_stages([[first], [bad], [never]], tick)
    assert isinstance(error, ValueError) and str(error) == "no /proc"
    assert tick.rows == {"host_row": {"x": 1}} and never.calls == 0
    tick = Tick(ts_ms=2, t0=0.0, deadline=1.0, root=None, run_id=None)
    assert await sample_stages([[first], [never]], tick) is None and tick.rows == {"host_row": {"x": 1}, "y": 2}
