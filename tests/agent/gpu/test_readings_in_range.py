"""Every value of a GPU row is a reading an SQLite INTEGER holds, or NULL: NVML's "not available" sentinels
(0xFFFFFFFF, 0xFFFFFFFFFFFFFFFF), GPM answers no GPU can give (a percentage past 100, a negative or absurd rate)
and field counters that jump to the u64 sentinel are no reading on that metric of that GPU alone.

One int past 2**63 in one GPU's row made SQLite refuse the whole tick (an OverflowError at bind): every GPU's row,
the host row and the serving row with it, on every tick while the reading was kept, and the agent read unhealthy.
"""

from __future__ import annotations

import logging
from types import SimpleNamespace

from gpu_fakes import ConstantNode, make

from lynxtop.agent.gpu.fake import FakeNvml, h200_specs
from lynxtop.agent.gpu.nvlink import NvlinkCounters
from lynxtop.agent.gpu.protocol import FakeGpuState
from lynxtop.agent.gpu.sampler import GPU_COLUMNS
from lynxtop.store.writer import StoreWriter

U32_NA = 0xFFFFFFFF
U64_NA = 0xFFFFFFFFFFFFFFFF
INT64_MAX = 2**63 - 1


def _ticks(s, clock, n=3, dt=1.0) -> list:
    out = []
    for _ in range(n):
        clock.advance(dt)
        out.append(s.sample(frozenset()))
    return out


def _rows(states, clock, events, backend=None) -> list:
    """GPU 0 in `states[0]`, GPU 1 in `states[1]`: the ticks of three seconds at 1 Hz."""
    node = ConstantNode(h200_specs(len(states)), states)
    s, _ = make(node, clock, events)
    if backend is not None:
        s._factory = lambda: backend(node, clock=clock)
    s.open()
    ticks = _ticks(s, clock)
    s.close()
    return ticks


def _stored(tmp_path, ticks) -> dict:
    """The ticks through a real store writer, each with a host row: the writer's stats."""
    w = StoreWriter(tmp_path / "db.sqlite")
    w.start()
    try:
        for i, t in enumerate(ticks):
            w.submit_tick(1_700_000_000_000 + 100 * i, gpu_rows=t.gpu_rows, nvlink_rows=t.nvlink_rows,
                          process_rows=t.process_rows, host_row={"cpu_pct": 5.0})
        assert w.flush()
        return w.stats()
    finally:
        w.close()


def _fits(row: dict) -> bool:
    return all(v is None or (type(v) is int and 0 <= v <= INT64_MAX) for v in row.values())


# ---------------------------------------------------------------------- GPM


def test_gpm_percentages_outside_0_100_are_no_reading(clock, events):
    """GPM answering SUCCESS with 250 % SM activity or -40 % DRAM bandwidth (a garbage or wrapped counter) gives
    NULL; a hair over 100 (GPM's rounding) reads 100; the other GPU and the other metrics are untouched."""
    rows = _rows([FakeGpuState(sm_active_pct=250.0, dram_bw_pct=-40.0, tensor_active_pct=100.4,
                               sm_occupancy_pct=55.0), FakeGpuState(sm_active_pct=42.0)], clock, events)[-1].gpu_rows
    assert rows[0]["sm_active_pct"] is None and rows[0]["dram_bw_pct"] is None
    assert rows[0]["tensor_active_pct"] == 100 and rows[0]["sm_occupancy_pct"] == 55
    assert rows[1]["sm_active_pct"] == 42


def test_a_gpm_rate_no_link_can_carry_is_no_reading(clock, events):
    """1e14 MiB/s from GPM passed a bound checked before the MiB scale: x 2**20 it is ~1e20 bytes/s, past int64."""
    rows = _rows([FakeGpuState(pcie_tx_bytes_per_s=1e20, pcie_rx_bytes_per_s=30e9), FakeGpuState()],
                 clock, events)[-1].gpu_rows
    assert rows[0]["pcie_tx_bytes_per_s"] is None
    assert abs(rows[0]["pcie_rx_bytes_per_s"] - 30e9) < 1e6
    assert all(_fits(r) for r in rows)


def test_one_gpus_absurd_gpm_rate_costs_no_tick_in_the_store(clock, events, tmp_path):
    ticks = _rows([FakeGpuState(pcie_tx_bytes_per_s=1e20), FakeGpuState()], clock, events)
    st = _stored(tmp_path, ticks)
    assert st["rejected"] == 0, st["last_error"]


# ---------------------------------------------------------------------- NVLink field counters (no GPM)


class _Field:
    def __init__(self, kib: int, ts_us: int):
        self.nvmlReturn = 0
        self.timestamp = ts_us
        self.value = SimpleNamespace(ullVal=kib)


class _Counters:
    def __init__(self):
        self.answers: list[tuple[int, int]] = []

    def nvmlDeviceGetFieldValues(self, handle, ids):
        kib, ts = self.answers.pop(0)
        return [_Field(kib, ts) for _ in ids]


def test_an_nvlink_field_counter_that_jumps_to_the_u64_sentinel_gives_no_rate():
    """Without GPM (A100): a counter read as 0xFFFFFFFFFFFFFFF (N/A) after a normal reading was a rate of
    ~1.9e22 bytes/s, past int64; a real rate next to it is still read."""
    b = _Counters()
    c = NvlinkCounters(b, object(), 1)
    b.answers = [(1_000, 1_000_000), (U64_NA, 2_000_000)]
    c.read()
    rates, _, _ = c.read()
    assert rates == [None, None], rates
    b.answers = [(0, 3_000_000), (50_000_000, 4_000_000)]  # after the reset: 50 GB a second
    c.read()
    rates, _, _ = c.read()
    assert rates == [50_000_000 * 1024, 50_000_000 * 1024]


# ---------------------------------------------------------------------- NVML's "not available"


def test_a_u64_not_available_ecc_count_is_null_not_2_to_the_64(clock, events):
    rows = _rows([FakeGpuState(ecc_corrected=U64_NA, ecc_uncorrected=3), FakeGpuState(ecc_corrected=7)],
                 clock, events)[-1].gpu_rows
    assert rows[0]["ecc_corrected"] is None and rows[0]["ecc_uncorrected"] == 3
    assert rows[1]["ecc_corrected"] == 7


def test_a_u32_not_available_power_reading_is_null_not_4_megawatts(clock, events):
    rows = _rows([FakeGpuState(power_w=U32_NA / 1000), FakeGpuState(power_w=512.0)], clock, events)[-1].gpu_rows
    assert rows[0]["power_w"] is None and rows[0]["power_limit_w"] == 700
    assert rows[1]["power_w"] == 512


def test_u32_not_available_temperature_clocks_and_utilisation_are_null(clock, events):
    na = FakeGpuState(temp_c=float(U32_NA), sm_clock_mhz=U32_NA, mem_clock_mhz=U32_NA, util_gpu_pct=float(U32_NA),
                      util_mem_pct=37.0)
    rows = _rows([na, FakeGpuState()], clock, events)[-1].gpu_rows
    assert [rows[0][c] for c in ("temp_c", "sm_clock_mhz", "mem_clock_mhz", "util_gpu_pct")] == [None] * 4
    assert rows[0]["util_mem_pct"] == 37
    assert rows[1]["temp_c"] == 30 and rows[1]["sm_clock_mhz"] == 1980 and rows[1]["mem_clock_mhz"] == 2619


class _EnergyNotAvailable(FakeNvml):
    def nvmlDeviceGetTotalEnergyConsumption(self, handle):
        if handle.index == 0:
            return U64_NA
        return super().nvmlDeviceGetTotalEnergyConsumption(handle)


def test_a_u64_not_available_energy_counter_is_null(clock, events):
    rows = _rows([FakeGpuState(), FakeGpuState()], clock, events, backend=_EnergyNotAvailable)[-1].gpu_rows
    assert rows[0]["energy_j"] is None and rows[1]["energy_j"] is not None


def test_one_gpus_not_available_ecc_count_does_not_drop_every_tick_of_the_node(clock, events, tmp_path):
    """The kept ECC count is copied into every row until read again, and read again the same: every tick (both
    GPUs, the host row) was refused by SQLite, and the agent's health check failed on the refusals."""
    node = ConstantNode(h200_specs(2), [FakeGpuState(ecc_uncorrected=U64_NA), FakeGpuState()])
    s, _ = make(node, clock, events)
    s.open()
    ticks = _ticks(s, clock, n=10, dt=0.1)
    s.close()
    st = _stored(tmp_path, ticks)
    assert st["rejected"] == 0, (st["rejected"], st["last_error"])


# ---------------------------------------------------------------------- the last line: the finished row


def test_a_value_no_integer_column_can_hold_is_null_whichever_reader_let_it_through(clock, events, caplog):
    """Readings no reader checks (the clock-event bitmask, memory used) at 0xFFFFFFFFFFFFFFFF become NULL in the
    finished row, logged once per GPU and column; the row's other values and the other GPU's row are kept."""
    caplog.set_level(logging.WARNING, logger="lynxtop.gpu")
    odd = FakeGpuState(throttle_reasons=U64_NA, mem_used_bytes=U64_NA, power_w=300.0)
    node = ConstantNode(h200_specs(2), [odd, FakeGpuState(mem_used_bytes=5 << 30)])
    s, _ = make(node, clock, events)
    s.open()
    ticks = _ticks(s, clock, n=12, dt=0.1)  # 10 Hz: rows copied from the kept readings between reads
    s.close()
    for t in ticks:
        assert all(_fits(r) for r in t.gpu_rows)
        a, b = t.gpu_rows
        assert a["throttle_reasons"] is None and a["mem_used_bytes"] is None and a["power_w"] == 300
        assert list(a) == list(b) and set(a) == {"gpu", *GPU_COLUMNS}  # the keys, in the order, of any row
        assert b["mem_used_bytes"] == 5 << 30 and b["throttle_reasons"] == 1
    lines = [r.getMessage() for r in caplog.records if "no reading" in r.getMessage()]
    assert len(lines) == 2 and all(m.startswith("GPU 0:") for m in lines), lines


def test_the_check_of_a_finished_row_changes_no_row_that_fits(clock, events):
    """A steady node: the rows are the readings, zeros and None included (the check filters, never rewrites)."""
    node = ConstantNode(h200_specs(2), [FakeGpuState(util_gpu_pct=0.0, sm_active_pct=97.0), FakeGpuState()])
    s, _ = make(node, clock, events)
    s.open()
    row = _ticks(s, clock)[-1].gpu_rows[0]
    s.close()
    assert row["util_gpu_pct"] == 0 and row["sm_active_pct"] == 97 and row["lost"] == 0 and row["gpu"] == 0
    assert row["mem_reserved_bytes"] is not None and row["energy_j"] is not None
