"""Which readings a tick takes at which rate (agent/gpu/refresh.py): counted on the fake NVML and on the host's /proc.

At 10 Hz the fast readings (utilisation, power, SM clock, clock-event reasons, GPM) are taken every tick; memory,
power limit, temperature, memory clock, ECC, remapped rows, the process list and the per-link NVLink rates about
once a second, never older than a second in any row; every row stays complete. At 1 Hz every reading is taken
every tick.
"""

from __future__ import annotations

import random

import pytest
from gpu_fakes import ConstantNode, ManualClock, make

from lynxtop.agent import host as host_mod
from lynxtop.agent.gpu.fake import a100_specs, h200_specs
from lynxtop.agent.gpu.protocol import FakeGpuState
from lynxtop.agent.gpu.refresh import Refresh
from lynxtop.agent.host import HOST_COLUMNS, HostSampler
from lynxtop.contract.columns import NVLINK_METRICS, names

MIB = 1024 * 1024
FAST = ("nvmlDeviceGetUtilizationRates", "nvmlDeviceGetPowerUsage", "nvmlDeviceGetCurrentClocksEventReasons",
        "nvmlGpmSampleGet")
KEPT = ("nvmlDeviceGetMemoryInfo_v2", "nvmlDeviceGetEnforcedPowerLimit", "nvmlDeviceGetTemperature",
        "nvmlDeviceGetRemappedRows", "nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetProcessUtilization")


def state(links: int = 18, **kw) -> FakeGpuState:
    base = dict(util_gpu_pct=90, sm_active_pct=70.0, power_w=600.0, temp_c=70, mem_used_bytes=100 << 30,
                nvlink_tx_bytes_per_s=[100 * MIB] * links, nvlink_rx_bytes_per_s=[50 * MIB] * links,
                processes=[(4242, 80 << 30)], process_sm_pct={4242: 60.0})
    base.update(kw)
    return FakeGpuState(**base)


def ticks(sampler, clock, n, dt, pids=frozenset()):
    out = []
    for _ in range(n):
        clock.advance(dt)
        out.append(sampler.sample(pids))
    return out


def test_at_10hz_slow_fields_are_read_once_a_second_fast_ones_every_tick(clock):
    node = ConstantNode(h200_specs(2), [state(), state()])
    s, made = make(node, clock)
    s.open()
    s.sample({4242})  # t = 0: the first tick reads everything
    got = ticks(s, clock, 100, 0.1, {4242})  # 10 s at 10 Hz
    calls = made[0].gpu_calls
    for gpu in (0, 1):
        for fn in FAST:
            assert calls[(gpu, fn)] == 101, fn
        assert calls[(gpu, "nvmlDeviceGetClockInfo")] == 101 + 11  # SM clock every tick, memory clock kept
        for fn in KEPT:
            assert calls[(gpu, fn)] == 11, fn  # t = 0, 1, ... 10 s
        assert calls[(gpu, "nvmlDeviceGetTotalEccErrors")] == 2 * 11  # corrected and uncorrected
    # every row of every tick is complete: the kept readings are copied into the ticks between (the per-link
    # rates from t = 1 s on: the first per-link read is the base the second one measures from)
    for k, tick in enumerate(got, start=1):
        assert len(tick.gpu_rows) == 2 and len(tick.process_rows) == 2
        assert len(tick.nvlink_rows) == (2 if k >= 10 else 0)
        for row in tick.gpu_rows:
            assert row["temp_c"] == 70 and row["mem_used_bytes"] == 100 << 30 and row["power_limit_w"] == 700
            assert row["ecc_corrected"] == 0 and row["remapped_rows_failed"] == 0 and row["util_gpu_pct"] == 90
            assert row["mem_clock_mhz"] == 2619 and row["sm_clock_mhz"] == 1980
        assert {(p["gpu"], p["pid"], p["in_vllm_tree"], p["sm_util_pct"]) for p in tick.process_rows} == {
            (0, 4242, True, 60), (1, 4242, True, 60)}
    rows = [r for t in got for r in t.process_rows]
    # one set of dicts per read, the same objects in the ticks between: the store writes a reading once, when a
    # new object comes (store/writer.py SlowRows); 11 reads (t = 0 .. 10 s) of 2 GPUs
    assert len({id(r) for r in rows}) == 11 * 2
    links = [r for t in got for r in t.nvlink_rows]
    assert len({id(r) for r in links}) == 10 * 2  # per-link rates from the second read on


def test_at_1hz_every_reading_is_taken_every_tick(clock):
    s, made = make(ConstantNode(h200_specs(1), [state()]), clock)
    s.open()
    ticks(s, clock, 10, 1.0)
    for fn in FAST + KEPT:
        assert made[0].gpu_calls[(0, fn)] == 10, fn


def test_a_change_in_a_slow_field_shows_within_a_second(clock):
    """ECC counts, remapped rows, temperature and the process list: in the rows within 1 s of the change."""
    node = ConstantNode(h200_specs(1), [state()])
    s, _ = make(node, clock)
    s.open()
    rng = random.Random(7)
    for _ in range(5):
        ticks(s, clock, rng.randrange(1, 15), 0.1)
        changed_at = clock.t
        st = node.states[0]
        st.ecc_corrected += 1
        st.ecc_uncorrected += 1
        st.remapped_pending = not st.remapped_pending
        st.temp_c += 1
        st.processes = [*st.processes, (5000 + len(st.processes), 1 << 30)]
        seen = None
        for _ in range(11):
            clock.advance(0.1)
            tick = s.sample(set())
            row = tick.gpu_rows[0]
            if (row["ecc_corrected"], row["ecc_uncorrected"], row["remapped_rows_pending"], row["temp_c"],
                    len(tick.process_rows)) == (st.ecc_corrected, st.ecc_uncorrected, int(st.remapped_pending),
                                                st.temp_c, len(st.processes)):
                seen = clock.t
                break
        assert seen is not None and seen - changed_at <= 1.0 + 1e-9


@pytest.mark.parametrize("specs", [h200_specs(1), a100_specs(1)], ids=["gpm", "field-counters"])
def test_per_link_rates_are_the_seconds_average_carried_in_every_row(clock, specs):
    """Links alternate between 100 and 300 MiB/s tick by tick: the totals follow each tick, the per-link row
    (renewed once a second) holds the second's average, 200, in every tick's row."""
    links = specs[0].nvlink_count

    class Alternating(ConstantNode):
        def state(self, index: int, now: float) -> FakeGpuState:
            rate = 100 * MIB if round(now * 10) % 2 else 300 * MIB
            return state(links, nvlink_tx_bytes_per_s=[rate] * links, nvlink_rx_bytes_per_s=[rate] * links)

    s, _ = make(Alternating(specs), clock)
    s.open()
    ticks(s, clock, 21, 0.1)  # past two per-link reads: the second one has a whole second behind it
    got = ticks(s, clock, 30, 0.1)
    totals = {round(t.gpu_rows[0]["nvlink_tx_bytes_per_s"] / (links * MIB)) for t in got}
    assert totals == {100, 300}  # the totals are each tick's
    cols = names(NVLINK_METRICS)[: 2 * links]
    for t in got:
        assert len(t.nvlink_rows) == 1
        per_link = t.nvlink_rows[0]
        assert all(per_link[c] == pytest.approx(200 * MIB, rel=0.01) for c in cols), per_link


def test_refresh_never_lets_a_reading_age_past_a_second():
    """Ticks at several rates with jitter: a reading is renewed about once a second, and no tick that reuses one
    sees it older than a second."""
    rng = random.Random(3)
    for period in (0.1, 0.2, 0.25, 0.5, 1.0, 2.0):
        r = Refresh(1.0)
        t, read_at, reads = 1000.0, None, 0
        for _ in range(400):
            t += period + rng.uniform(-0.04, 0.04) * period
            r.tick(t)
            if r.due(read_at, t):
                read_at, reads = t, reads + 1
            assert t - read_at < 1.0
        per_s = reads / (t - 1000.0)
        assert per_s <= 1.0 / max(1.0, period) * 1.11 and per_s >= 1.0 / max(1.0, period) * 0.9, (period, per_s)


def test_host_row_is_read_once_a_second_at_10hz_and_every_row_is_complete(tmp_path, monkeypatch):
    reads = []
    real = host_mod._per_core
    monkeypatch.setattr(host_mod, "_per_core", lambda: reads.append(1) or real())  # /proc/stat: one a read
    clock = ManualClock()
    h = HostSampler(tmp_path / "db.sqlite", clock=clock)
    rows = [h.sample(None)]
    for _ in range(100):
        clock.advance(0.1)
        rows.append(h.sample(None))
    assert len(reads) == 11
    assert all(set(r) == set(HOST_COLUMNS) for r in rows)
    assert all(r["mem_total_bytes"] > 0 and r["cpu_pct"] is not None for r in rows[10:])
    assert len({id(r) for r in rows}) == len(rows)
    h.sample(12345)  # another root: read at once, whatever the time
    assert len(reads) == 12
