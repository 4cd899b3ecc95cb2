"""Quiet ticks (agent/ticker.py, issue 29.3): a tick on time with nothing for the loop (no event, no scrape due or
running, no failure episode, the loop had a tick less than a second ago) is written by the clock thread itself and
never wakes the event loop; at 10 Hz that is 9 ticks in 10 (each wake-up ~0.2 ms of CPU on a small VM). The loop
still gets a tick once a second, at once for an event (an XID, a GPU lost), and every tick is still written in
order, the status still shows the newest, and an NVML call that hangs after quiet ticks is still found."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time

import pytest
from support.node import close_node, count_loop_turns, open_node, run_clock
from support.waits import wait_for_async

from lynxtop.contract.events import EventKind
from lynxtop.contract.status import HostStatus

pytestmark = pytest.mark.timeout(90)
CONFIG = 'sample_interval_s = 0.1\nfake_nvml = "h200x8"'


def _ts(h, node, table: str) -> list[int]:
    node.writer.flush()
    return [r["ts_ms"] for r in h.db_rows(node.writer.path, f"SELECT DISTINCT ts_ms FROM {table} ORDER BY ts_ms")]


async def test_quiet_ticks_at_10_hz_do_not_wake_the_loop_and_every_tick_is_written_in_order(tmp_path, h):
    node = open_node(h.write_config(tmp_path, CONFIG))
    loop = asyncio.get_running_loop()
    submitted: list[tuple[int, dict]] = []
    real_submit = node.writer.submit_tick

    def submit(ts_ms, **rows):  # noqa: ANN001, ANN003, ANN202
        submitted.append((ts_ms, rows["host_row"]))
        real_submit(ts_ms, **rows)

    node.writer.submit_tick = submit
    turns = count_loop_turns(loop)
    try:
        await run_clock(node, 4.0, settle_s=0.0)  # one sleep: no polling turns of the test's own
        t = node.ticker
        assert t.ticks >= 20 and t.failed_ticks == 0, (t.ticks, t.missed_ticks, t.last_tick_error)
        # about one tick a second reaches the loop (+ run_clock's start, sleep and cancellation): a turn a tick
        # or more before (the clock thread's hand-off of every tick)
        assert turns[0] <= t.ticks // 3 + 6, (turns[0], t.ticks, t.quiet_ticks)
        assert t.quiet_ticks >= t.ticks // 2, (t.quiet_ticks, t.ticks)
        # the writer got every tick, once, in order, with its host and GPU rows
        stamps = [ts for ts, _ in submitted]
        assert len(stamps) == t.ticks and stamps == sorted(set(stamps))
        assert _ts(h, node, "host_samples") == stamps
        assert _ts(h, node, "gpu_samples") == stamps
        # the status shows the newest tick, written by the clock thread or the loop alike
        assert t.latest_host is submitted[-1][1]
        assert node.status().host == HostStatus.from_json(submitted[-1][1])
    finally:
        del loop._run_once  # type: ignore[attr-defined]
        close_node(node)


async def test_quiet_ticks_go_on_while_the_loop_is_busy(tmp_path, h):
    node = open_node(h.write_config(tmp_path, CONFIG))
    t = node.ticker
    task = asyncio.create_task(t.run())
    try:
        await wait_for_async(lambda: t.quiet_ticks >= 3, 20, what="the first quiet ticks")
        before = t.ticks
        # the loop busy (a long callback that never yields) until the clock thread has ticked 3 more times: it
        # writes on (it waited on the loop before, and then no tick would come). A deadline, not a fixed sleep: a
        # loaded machine may run the clock thread late, never the loop meanwhile.
        deadline = time.monotonic() + 30
        while t.ticks < before + 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert t.ticks >= before + 3, (t.ticks, before, t.missed_ticks)
        await wait_for_async(lambda: t.ticks >= before + 12, 20, what="ticks after the busy loop")
        assert t.failed_ticks == 0
        assert len(_ts(h, node, "host_samples")) >= t.ticks - 1
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        close_node(node)


async def test_an_xid_between_quiet_ticks_reaches_the_loop_with_the_next_tick(tmp_path, h):
    node = open_node(h.write_config(tmp_path, CONFIG))
    t = node.ticker
    got: list[tuple[int, str, bool]] = []  # (ticks when put, kind, on the loop's thread)
    real_put = node.event_sink.put
    main = threading.get_ident()

    def put(ev):  # noqa: ANN001, ANN202
        got.append((t.ticks, str(ev.kind), threading.get_ident() == main))
        real_put(ev)

    node.event_sink.put = put
    task = asyncio.create_task(t.run())
    try:
        await wait_for_async(lambda: t.quiet_ticks >= 3, 20, what="the first quiet ticks")
        for n in range(3):
            sent = t.ticks
            # the driver queues it between ticks; the next tick's GPU sample polls it (clock thread)
            node.sampler._c.b.inject_xid(2, (79, 48, 95)[n])  # each opens its own episode: an event each
            await wait_for_async(lambda n=n: any(k == str(EventKind.GPU_XID) for _, k, _ in got[n:]), 20,
                                 what="the XID on the loop")
            at, _, on_loop = next(g for g in got[n:] if g[1] == str(EventKind.GPU_XID))
            assert on_loop and at <= sent + 2, (at, sent)  # the tick after it, not the next once-a-second one
            await wait_for_async(lambda s=t.quiet_ticks: t.quiet_ticks >= s + 2, 20, what="quiet ticks again")
        assert node.xid_errors[2] == 3
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        close_node(node)


async def test_nvml_hanging_after_quiet_ticks_is_found_and_the_host_rows_go_on(tmp_path, h, monkeypatch):
    node = open_node(h.write_config(tmp_path, CONFIG))
    release, hang = threading.Event(), threading.Event()
    real = node.sampler.sample

    def sample(pids):  # noqa: ANN001, ANN202
        if hang.is_set():
            release.wait(20)  # NVML hung
        return real(pids)

    monkeypatch.setattr(node.sampler, "sample", sample)
    t = node.ticker
    task = asyncio.create_task(t.run())
    try:
        await wait_for_async(lambda: t.quiet_ticks >= 5, 20, what="the first quiet ticks")
        hang.set()
        before = t.ticks
        await wait_for_async(lambda: node.gpu_source.late >= 1 and t.ticks >= before + 10, 30,
                             what="ticks without GPU rows once NVML hangs")
        assert t.failed_ticks == 0
        assert len(_ts(h, node, "host_samples")) >= t.ticks - 1  # every tick written has its host row
        release.set()
        hang.clear()
        quiet = t.quiet_ticks
        await wait_for_async(lambda: t.quiet_ticks >= quiet + 3, 30, what="quiet ticks again once NVML answers")
    finally:
        release.set()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        close_node(node)
