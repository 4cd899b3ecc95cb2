"""GPM (Hopper+) readers: true SM/tensor/DRAM activity and PCIe/NVLink rates from two samples, no sleeping.

Each tick takes one new sample and diffs it against the previous one, so the figures are the average over
the whole tick interval. The two sample buffers and the `c_nvmlGpmMetricsGet_t` struct are allocated once:
building the struct costs ~10 µs a tick against ~1.6 µs when reused (reference/nvml.md).
"""

from __future__ import annotations

import ctypes
import struct
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

# (GPU_METRICS column, GPM metric id, scale to the column's unit). GPM rates are MiB/s.
MIB = 1024 * 1024
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


class GpmReader:
    """Two alternating GPM samples of one GPU and a reused metrics struct."""

    def __init__(self, backend: GpuBackend, handle: Any, nvlink_count: int):
        self._b = backend
        self._h = handle
        mg = _MetricsGet()
        metrics = SCALAR_METRICS + (NVLINK_TOTALS + link_metrics(nvlink_count) if nvlink_count else ())
        self.metrics = metrics[: len(mg.metrics)]  # never more than this binding's struct holds
        self._samples = [backend.nvmlGpmSampleAlloc(), backend.nvmlGpmSampleAlloc()]
        self._cur = 0
        self._have_prev = False
        mg.version = pynvml.NVML_GPM_METRICS_GET_VERSION
        mg.numMetrics = len(self.metrics)
        for i, (_, mid, _) in enumerate(self.metrics):
            mg.metrics[i].metricId = mid
        self._mg = mg
        # all entries in one C call (metricId, nvmlReturn, value per entry): reading them field by field through
        # ctypes costs ~0.15 µs a field, ~14 µs a GPU a tick with 46 metrics
        self._unpack = struct.Struct("<" + "IId24x" * len(self.metrics)).unpack_from
        self._scales = [scale for _, _, scale in self.metrics]
        self.columns = [col for col, _, _ in self.metrics]
        # where the scalar columns end and the per-link ones (NVLINK_METRICS names) begin
        self.n_scalar = len(SCALAR_METRICS) + (len(NVLINK_TOTALS) if nvlink_count else 0)

    def read(self) -> list[float | None] | None:
        """Values aligned with `self.metrics` (in the columns' units) over the interval since the previous
        read; None on the first read. Raises pynvml.NVMLError when the sample itself fails; a single metric
        failing reads None.
        """
        cur = self._samples[self._cur]
        self._b.nvmlGpmSampleGet(self._h, cur)
        if not self._have_prev:
            self._have_prev = True
            self._cur ^= 1
            return None
        mg = self._mg
        mg.sample1 = self._samples[self._cur ^ 1]
        mg.sample2 = cur
        self._cur ^= 1
        self._b.nvmlGpmMetricsGet(mg)
        # seen on a real H200: a metric can come back SUCCESS with NaN (two samples too close together)
        flat = self._unpack(mg, _METRICS_OFFSET)
        return [v * scale if r == 0 and -1e18 < v < 1e18 else None
                for r, v, scale in zip(flat[1::3], flat[2::3], self._scales, strict=True)]

    def reset(self) -> None:
        """Forget the previous sample (after the GPU came back or NVML was re-initialised)."""
        self._have_prev = False

    def close(self) -> None:
        for s in self._samples:
            try:
                self._b.nvmlGpmSampleFree(s)
            except pynvml.NVMLError:
                pass
        self._samples = []
