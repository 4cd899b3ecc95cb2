"""NVLink rates without GPM (Ampere and older): cumulative field-value counters and their own µs timestamps.

Each field carries the time the driver read it, so the rate is Δvalue/Δtimestamp of that very field: the
tick's own jitter never skews it. A counter that goes backwards (driver reload, wrap) yields None once.
"""

from __future__ import annotations

from typing import Any

import pynvml

from lynxtop.agent.gpu.protocol import GpuBackend
from lynxtop.contract.columns import NVLINK_MAX_LINKS

_TX = pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX
_RX = pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX


class NvlinkCounters:
    """Per-link TX/RX data counters (KiB) of one GPU read in one nvmlDeviceGetFieldValues call."""

    def __init__(self, backend: GpuBackend, handle: Any, nvlink_count: int):
        self._b = backend
        self._h = handle
        n = min(nvlink_count, NVLINK_MAX_LINKS)
        self._ids = [(fid, link) for link in range(n) for fid in (_TX, _RX)]
        self._cols = [f"l{link}_{d}_bytes_per_s" for link in range(n) for d in ("tx", "rx")]
        self._prev: list[tuple[int, int] | None] = [None] * len(self._ids)  # (KiB, µs)

    def read(self) -> tuple[list[tuple[str, float | None]], bool]:
        """(column, bytes/s) per link, and whether any field was supported at all."""
        values = self._b.nvmlDeviceGetFieldValues(self._h, self._ids)
        out: list[tuple[str, float | None]] = []
        any_ok = False
        prev = self._prev
        for k, col in enumerate(self._cols):
            v = values[k]
            rate = None
            if v.nvmlReturn == 0:
                any_ok = True
                cur = (v.value.ullVal, v.timestamp)
                p = prev[k]
                if p is not None and cur[1] > p[1] and cur[0] >= p[0]:
                    rate = (cur[0] - p[0]) * 1024 * 1e6 / (cur[1] - p[1])
                prev[k] = cur
            else:
                prev[k] = None
            out.append((col, rate))
        return out, any_ok
