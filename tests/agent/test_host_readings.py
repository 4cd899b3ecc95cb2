"""Each group of host readings (CPU, load, memory, disk, network, the vLLM tree) stands alone: one that fails or
reads oddly leaves its own columns NULL, never the whole host row, and never the tick's GPU rows; figures stay
what they can be (CPU 0-100, memory and swap used never below 0)."""

from __future__ import annotations

import logging
import os

from lynxtop.agent import host as host_mod
from lynxtop.agent.host import HostSampler
from lynxtop.agent.sampling import HostSource, Tick


class _Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def _unobtainable():
    raise OSError("Load averages are unobtainable")  # what os.getloadavg raises where /proc/loadavg can't be read


def test_an_unreadable_load_average_leaves_only_the_load_columns_empty(tmp_path, monkeypatch):
    monkeypatch.setattr(os, "getloadavg", _unobtainable)
    clock = _Clock()
    s = HostSampler(tmp_path / "db.sqlite", clock=clock)
    s.sample(None)
    clock.t += 1.0
    row = s.sample(None)  # raised before: no CPU, memory, disk, network or vLLM tree either
    assert row["load1"] is None and row["load5"] is None and row["load15"] is None
    assert row["mem_total_bytes"] and row["disk_total_bytes"] and row["cpu_pct"] is not None


def test_a_failing_reading_is_logged_when_it_starts_and_when_it_ends(tmp_path, monkeypatch, caplog):
    caplog.set_level(logging.INFO, logger="lynxtop.agent")
    real = os.getloadavg
    monkeypatch.setattr(os, "getloadavg", _unobtainable)
    clock = _Clock()
    s = HostSampler(tmp_path / "db.sqlite", clock=clock)
    for _ in range(5):
        clock.t += 1.0
        assert s.sample(None)["load1"] is None
    monkeypatch.setattr(os, "getloadavg", real)
    clock.t += 1.0
    assert s.sample(None)["load1"] is not None
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("host readings")]
    assert len(lines) == 2 and "load unreadable" in lines[0] and "load readable again" in lines[1], lines


def _over_stats(stats: list[bytes], tmp_path, monkeypatch) -> tuple[HostSampler, _Clock]:
    """A sampler reading `stats[0]` as /proc/stat, after its first sample."""
    real = host_mod._read
    monkeypatch.setattr(host_mod, "_read", lambda p: stats[0] if p == "/proc/stat" else real(p))
    clock = _Clock()
    s = HostSampler(tmp_path / "db.sqlite", clock=clock)
    s.sample(None)
    return s, clock


def _next(s: HostSampler, stats: list[bytes], clock: _Clock) -> dict:
    """The sample a second later, over the next /proc/stat."""
    stats.pop(0)
    clock.t += 1.0
    return s.sample(None)


def test_an_unparsable_proc_stat_leaves_only_the_cpu_columns_empty(tmp_path, monkeypatch):
    stats = [b"cpu  0 0 0 0\ncpu0 100 0 0 1000 0 0 0 0\nintr 1\n", b"cpu  0 0 0 0\ncpu0 12 x\nintr 1\n",
             b"cpu  0 0 0 0\ncpu0 150 0 0 1050 0 0 0 0\nintr 1\n"]
    s, clock = _over_stats(stats, tmp_path, monkeypatch)
    row = _next(s, stats, clock)
    assert row["cpu_pct"] is None and row["cpu_per_core_pct"] is None and row["mem_total_bytes"]
    assert _next(s, stats, clock)["cpu_pct"] == 50.0  # read again: the rate since the last reading that parsed


class _Gpu:
    """A GPU source that records whether the tick got to NVML."""

    def __init__(self) -> None:
        self.reads = 0
        self.gate = None

    def read(self, tick: Tick) -> None:
        self.reads += 1
        tick.rows["gpu_rows"] = [{"gpu": 0}]


class _Raising:
    tree_pids: frozenset[int] = frozenset()

    def sample(self, root):
        raise RuntimeError("a host sampler bug")


def test_a_host_reading_failure_does_not_cost_the_tick_its_gpu_rows(tmp_path, monkeypatch):
    monkeypatch.setattr(os, "getloadavg", _unobtainable)
    gpu = _Gpu()
    src = HostSource(HostSampler(tmp_path / "db.sqlite", clock=_Clock()), lambda: set(), gpu=gpu)
    tick = Tick(ts_ms=0, t0=0.0, deadline=1.0, root=None, run_id=None)
    src.read(tick)
    assert gpu.reads == 1 and tick.rows["gpu_rows"] and tick.rows["host_row"]["load1"] is None


def test_a_host_row_that_raises_still_has_nvml_read_before_the_tick_fails():
    """Whatever is left to raise (a bug): the GPU sample is still taken (its GPM intervals, XIDs and lost GPUs keep
    their cadence), and the error still reaches the ticker, which counts the tick failed."""
    gpu = _Gpu()
    src = HostSource(_Raising(), lambda: set(), gpu=gpu)
    tick = Tick(ts_ms=0, t0=0.0, deadline=1.0, root=None, run_id=None)
    try:
        src.read(tick)
    except RuntimeError:
        pass
    else:
        raise AssertionError("the host row's error must fail the tick")
    assert gpu.reads == 1 and tick.rows.get("gpu_rows")


def test_meminfo_with_available_above_total_gives_no_negative_used(tmp_path, monkeypatch):
    """lxcfs / container /proc/meminfo has been seen with MemAvailable > MemTotal and SwapFree > SwapTotal."""
    meminfo = (b"MemTotal:        1048576 kB\nMemFree:          900000 kB\nMemAvailable:    2097152 kB\n"
               b"SwapTotal:             0 kB\nSwapFree:         524288 kB\n")
    real = host_mod._read
    monkeypatch.setattr(host_mod, "_read", lambda p: meminfo if p == "/proc/meminfo" else real(p))
    row = HostSampler(tmp_path / "db.sqlite", clock=_Clock()).sample(None)
    assert row["mem_used_bytes"] == 0 and row["swap_used_bytes"] == 0
    assert row["mem_total_bytes"] == 1 << 30 and row["mem_available_bytes"] == 2 << 30


def test_total_cpu_pct_stays_within_0_100_when_a_cores_idle_steps_back(tmp_path, monkeypatch):
    """The per-core figures were clamped to 0-100 when /proc/stat's counters step back (idle or iowait going
    backwards: NO_HZ idle accounting, a VM's vCPU), the total was not: 500 % here."""
    stats = [b"cpu  0 0 0 0\ncpu0 100 0 0 1000 0 0 0 0\ncpu1 100 0 0 1000 0 0 0 0\nintr 1\n",
             b"cpu  0 0 0 0\ncpu0 200 0 0 910 0 0 0 0\ncpu1 100 0 0 1010 0 0 0 0\nintr 1\n"]
    s, clock = _over_stats(stats, tmp_path, monkeypatch)
    row = _next(s, stats, clock)
    assert row["cpu_pct"] == 100.0, (row["cpu_pct"], row["cpu_per_core_pct"])
