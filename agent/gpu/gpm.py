"""GPM (Hopper+) readers: true SM/tensor/DRAM activity and PCIe/NVLink rates from two samples, no sleeping.

Each tick takes one new sample and diffs it against the previous one, so the figures are the average over
the whole tick interval; the per-link NVLink rates are diffed against the sample of the last per-link read
(about a second before). The sample buffers and the `c_nvmlGpmMetricsGet_t` structs are allocated once:
building the struct costs ~10 µs a tick against ~1.6 µs when reused (reference/nvml.md).

A metric that fails, is NaN, below 0, or past its bound (a percentage past `PCT_SLACK`, a rate past
`MAX_BYTES_PER_S` once scaled to bytes/s) is no reading: None, on that metric of that GPU alone.
"""

from __future__ import annotations

import ctypes
import math
import struct
from operator import mul
from typing import Any

import pynvml

from lynxtop.agent.gpu.protocol import GpuBackend
from lynxtop.contract.columns import NVLINK_MAX_LINKS


class _Metric(ctypes.Structure):
    """pynvml's c_nvmlGpmMetric_t layout as a plain struct: pynvml's printable structs route every field
    access through Python-level __getattribute__, ~3 µs each, which alone would cost ~0.3 ms a tick."""

    _fields_ = [("metricId", ctypes.c_uint), ("nvmlReturn", ctypes.c_uint), ("value", ctypes.c_double),
                ("metricInfo", ctypes.c_char_p * 3)]


_CAPACITY = len(pynvml.c_nvmlGpmMetricsGet_t().metrics)  # differs between binding versions (98, 166, 333…)


class _MetricsGet(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint), ("numMetrics", ctypes.c_uint),
                ("sample1", pynvml.c_nvmlGpmSample_t), ("sample2", pynvml.c_nvmlGpmSample_t),
                ("metrics", _Metric * _CAPACITY)]


# the library reads our struct through the binding's function: the layouts must match byte for byte
assert ctypes.sizeof(_MetricsGet) == ctypes.sizeof(pynvml.c_nvmlGpmMetricsGet_t)
assert ctypes.sizeof(_Metric) == ctypes.sizeof(pynvml.c_nvmlGpmMetric_t) == struct.calcsize("<IId24x")
_METRICS_OFFSET = _MetricsGet.metrics.offset
_ROUND = float.__round__  # every GPM value is a C double: round() without the per-value method lookup

# (GPU_METRICS column, GPM metric id, scale to the column's unit). GPM rates are MiB/s.
MIB = 1024 * 1024
# What a GPM answer may be, in its column's unit; past it (or below 0, or NaN) it is no reading (NULL): a garbage
# or wrapped counter must not reach a row, where an int past 2**63 makes SQLite refuse the whole tick.
PCT_SLACK = 100.5  # a percentage a hair over 100 (GPM's rounding) reads 100; past this, none
MAX_BYTES_PER_S = 1e14  # 100 TB/s: ~50x an NVLink 5 GPU's 1.8 TB/s; the bound is on the scaled (bytes/s) figure
SCALAR_METRICS: tuple[tuple[str, int, float], ...] = (
    ("sm_active_pct", pynvml.NVML_GPM_METRIC_SM_UTIL, 1.0),
    ("sm_occupancy_pct", pynvml.NVML_GPM_METRIC_SM_OCCUPANCY, 1.0),
    ("tensor_active_pct", pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL, 1.0),
    ("dram_bw_pct", pynvml.NVML_GPM_METRIC_DRAM_BW_UTIL, 1.0),
    ("fp16_active_pct", pynvml.NVML_GPM_METRIC_FP16_UTIL, 1.0),
    ("fp32_active_pct", pynvml.NVML_GPM_METRIC_FP32_UTIL, 1.0),
    ("pcie_tx_bytes_per_s", pynvml.NVML_GPM_METRIC_PCIE_TX_PER_SEC, MIB),
    ("pcie_rx_bytes_per_s", pynvml.NVML_GPM_METRIC_PCIE_RX_PER_SEC, MIB),
)
NVLINK_TOTALS: tuple[tuple[str, int, float], ...] = (
    ("nvlink_tx_bytes_per_s", pynvml.NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC, MIB),
    ("nvlink_rx_bytes_per_s", pynvml.NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC, MIB),
)


def link_metrics(nvlink_count: int) -> tuple[tuple[str, int, float], ...]:
    """Per-link (column, id, scale) for the links a GPU has, named as NVLINK_METRICS names them."""
    out = []
    for i in range(min(nvlink_count, NVLINK_MAX_LINKS)):
        out.append((f"l{i}_tx_bytes_per_s", getattr(pynvml, f"NVML_GPM_METRIC_NVLINK_L{i}_TX_PER_SEC"), MIB))
        out.append((f"l{i}_rx_bytes_per_s", getattr(pynvml, f"NVML_GPM_METRIC_NVLINK_L{i}_RX_PER_SEC"), MIB))
    return tuple(out)


class _Query:
    """One reused metrics struct for a fixed list of metrics, and how its answer is read back."""

    def __init__(self, metrics: tuple[tuple[str, int, float], ...]):
        mg = _MetricsGet()
        self.metrics = metrics[: len(mg.metrics)]  # never more than this binding's struct holds
        mg.version = pynvml.NVML_GPM_METRICS_GET_VERSION
        mg.numMetrics = len(self.metrics)
        for i, (_, mid, _) in enumerate(self.metrics):
            mg.metrics[i].metricId = mid
        self.mg = mg
        # the returns, then the values, of all entries in one C call each: reading them field by field through
        # ctypes costs ~0.15 µs a field, ~14 µs a GPU a tick with 46 metrics; two unpacks of the fields wanted
        # cost half of one unpack of every field and two slices
        self._returns = struct.Struct("<" + "4xI32x" * len(self.metrics)).unpack_from
        self._values = struct.Struct("<" + "8xd24x" * len(self.metrics)).unpack_from
        self._scales = [scale for _, _, scale in self.metrics]
        self.columns = [col for col, _, _ in self.metrics]
        # the bound of each raw value (GPM's unit, before the scale): a percentage up to PCT_SLACK (`values` clamps
        # it to 100, `rounded` rounds it to 100 at most), a rate up to MAX_BYTES_PER_S once scaled
        pct = [col.endswith("_pct") for col in self.columns]
        self._limits = [PCT_SLACK if p else MAX_BYTES_PER_S / scale for p, scale in zip(pct, self._scales,
                                                                                        strict=True)]
        self._caps = [100.0 if p else top for p, top in zip(pct, self._limits, strict=True)]
        # the usual answer's check in C passes: the largest of the leading values that hold every percentage (the
        # percentages come first in SCALAR_METRICS) against the percentage bound; with none below 0, the sum of all
        # within the smallest rate bound holds every rate within its own (a whole GPU's figures are ~1e6 MiB/s
        # against ~1e8) and fails on a NaN or an infinity. An answer these miss takes the per-metric pass
        self._n_pct = max((i + 1 for i, p in enumerate(pct) if p), default=0)
        self._rates_top = min((top for p, top in zip(pct, self._limits, strict=True) if not p), default=math.inf)

    def values(self, b: GpuBackend, first: Any, second: Any) -> list[float | None]:
        mg = self.mg
        mg.sample1 = first
        mg.sample2 = second
        b.nvmlGpmMetricsGet(mg)
        # seen on a real H200: a metric can come back SUCCESS with NaN (two samples too close together)
        returns, raw = self._returns(mg, _METRICS_OFFSET), self._values(mg, _METRICS_OFFSET)
        # the usual answer, checked and scaled by C-level passes: every metric SUCCESS, none below 0, none past its
        # bound (a percentage past 100 takes the per-metric pass, which clamps it up to PCT_SLACK)
        n = self._n_pct
        if (not any(returns) and min(raw) >= 0.0 and sum(raw) <= self._rates_top
                and (not n or max(raw[:n]) <= 100.0)):
            return list(map(mul, raw, self._scales))
        return [min(v, cap) * scale if r == 0 and 0.0 <= v <= top else None
                for r, v, scale, top, cap in zip(returns, raw, self._scales, self._limits, self._caps, strict=True)]

    def rounded(self, b: GpuBackend, first: Any, second: Any) -> Any:
        """`values` as the rows store them, whole numbers (None where `values` has None), as an iterable.

        The usual answer is scaled and rounded by C-level passes over the values, lazily: `float.__round__`
        is `round` on a float without `round`'s per-value method lookup (about half its cost)."""
        mg = self.mg
        mg.sample1 = first
        mg.sample2 = second
        b.nvmlGpmMetricsGet(mg)
        returns, raw = self._returns(mg, _METRICS_OFFSET), self._values(mg, _METRICS_OFFSET)
        # as `values`; a percentage up to PCT_SLACK rounds to 100 at most (round half to even: 100.5 is 100)
        n = self._n_pct
        if (not any(returns) and min(raw) >= 0.0 and sum(raw) <= self._rates_top
                and (not n or max(raw[:n]) <= PCT_SLACK)):
            return map(_ROUND, map(mul, raw, self._scales))
        return [_ROUND(v * scale) if r == 0 and 0.0 <= v <= top else None
                for r, v, scale, top in zip(returns, raw, self._scales, self._limits, strict=True)]


class GpmReader:
    """GPM samples of one GPU and two reused metrics structs: the tick's figures and the per-link rates.

    Each `sample` takes one GPM sample. The scalar columns and the NVLink totals are the average since the
    previous sample (the tick); the per-link rates, asked for about once a second (agent/gpu/refresh.py), are the
    average since the sample of the last per-link read, so a per-link figure carried over the ticks in between
    is that whole second's, not one tick's. Three buffers: the previous sample, the per-link base, the new one.
    """

    def __init__(self, backend: GpuBackend, handle: Any, nvlink_count: int):
        self._b = backend
        self._h = handle
        self._fast = _Query(SCALAR_METRICS + (NVLINK_TOTALS if nvlink_count else ()))
        links = link_metrics(nvlink_count)
        self._links = _Query(links) if links else None
        # both in one struct, for a per-link read whose base is the previous sample (per-link reads on every tick:
        # 1 Hz or slower): the two lists are then over the same interval, and one call answers them
        both = self._fast.metrics + links
        self._both = _Query(both) if links and len(both) <= _CAPACITY else None
        self._samples = [backend.nvmlGpmSampleAlloc() for _ in range(3 if links else 2)]
        n = len(self._samples)
        seen = (None, *range(n))
        self._next = {(p, q): next(i for i in range(n) if i != p and i != q) for p in seen for q in seen
                      if len({p, q} - {None}) < n}  # (previous, base) -> the buffer the next sample goes into
        self._get = backend.nvmlGpmSampleGet
        self._prev: int | None = None  # index of the previous sample
        self._base: int | None = None  # index of the sample the next per-link rates are measured from
        self.metrics = self._fast.metrics + (self._links.metrics if self._links else ())
        self.columns = self._fast.columns  # what `sample`'s first list is aligned with
        self.link_columns = self._links.columns if self._links else []  # NVLINK_METRICS names
        self.n_scalar = len(self._fast.columns)

    def sample(self, links: bool = False) -> tuple[list[float | None] | None, list[float | None] | None]:
        """(values aligned with `columns` over the interval since the previous sample, None on the first;
        with `links`, per-link values aligned with `link_columns` since the last per-link read, None on the first
        such read or without NVLinks). Raises pynvml.NVMLError when the sample itself fails; a single metric
        failing reads None.
        """
        prev, base, cur = self._take()
        s = self._samples
        link_vals = None
        if links and self._links is not None:
            self._base = cur
            if base is not None:
                link_vals = self._links.values(self._b, s[base], s[cur])
        return (None if prev is None else self._fast.values(self._b, s[prev], s[cur])), link_vals

    def sample_rounded(self, links: bool = False) -> tuple[Any, Any]:
        """`sample` with its values as the rows store them (`_Query.rounded`): iterables of whole numbers or
        None, aligned with `columns` and `link_columns`, each None where `sample` answers None. Where the per-link
        base is the previous sample (per-link rates read every tick) both come from one metrics call, as each
        metric is a function of the two samples alone: the same figures for one call less a tick."""
        prev, base = self._prev, self._base  # `_take` written out: this runs for every GPU every tick
        cur = self._next[prev, base]
        s = self._samples
        self._get(self._h, s[cur])  # raises on a failed sample: nothing moved
        self._prev = cur
        link_vals = None
        if links and self._links is not None:
            self._base = cur
            if base is not None:
                if base == prev and self._both is not None:  # one interval: one nvmlGpmMetricsGet for both lists
                    vals = list(self._both.rounded(self._b, s[prev], s[cur]))
                    return vals[:self.n_scalar], vals[self.n_scalar:]
                link_vals = self._links.rounded(self._b, s[base], s[cur])
        return (None if prev is None else self._fast.rounded(self._b, s[prev], s[cur])), link_vals

    def _take(self) -> tuple[int | None, int | None, int]:
        """One new sample into the buffer that is neither the previous sample nor the per-link base (a table
        look-up, worked out once): (previous, base, new), the new one now the previous."""
        prev, base = self._prev, self._base
        cur = self._next[prev, base]
        self._get(self._h, self._samples[cur])
        self._prev = cur
        return prev, base, cur

    def read(self) -> list[float | None] | None:
        """The scalar columns and NVLink totals since the previous sample (None on the first)."""
        return self.sample()[0]

    def reset(self) -> None:
        """Forget the previous samples (after the GPU came back or NVML was re-initialised)."""
        self._prev = self._base = None

    def close(self) -> None:
        for s in self._samples:
            try:
                self._b.nvmlGpmSampleFree(s)
            except pynvml.NVMLError:
                pass
        self._samples = []
