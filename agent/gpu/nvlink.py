"""NVLink rates without GPM (Ampere and older): cumulative field-value counters and their own µs timestamps.

Each field carries the time the driver read it, so the rate is Δvalue/Δtimestamp of that very field: the
tick's own jitter never skews it. A counter that goes backwards (driver reload, wrap) yields None once, and so
does a jump past `MAX_BYTES_PER_S` (a counter read as the u64 "not available" 0xFFFFFFFFFFFFFFFF). The
totals are rates since the previous read (the tick); the per-link row's rates, asked for about once a second,
are rates since the last per-link read, so the figure carried over the ticks between is that second's.
"""

from __future__ import annotations

from typing import Any

import pynvml

from lynxtop.agent.gpu.gpm import MAX_BYTES_PER_S
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
        self.columns = [f"l{link}_{d}_bytes_per_s" for link in range(n) for d in ("tx", "rx")]
        self._prev: list[tuple[int, int] | None] = [None] * len(self._ids)  # (KiB, µs)
        self._base: list[tuple[int, int] | None] | None = None  # the readings of the last per-link read

    def read(self, links: bool = False) -> tuple[list[float | None], list[float | None] | None, bool]:
        """(bytes/s per column since the previous read, for the totals; with `links`, bytes/s per column since
        the last such read, for the per-link row, None on the first; whether any field was supported at all)."""
        values = self._b.nvmlDeviceGetFieldValues(self._h, self._ids)
        rates: list[float | None] = []
        any_ok = False
        prev = self._prev
        base = self._base if links else None
        link_rates: list[float | None] | None = [] if base is not None else None
        for k in range(len(self._ids)):
            v = values[k]
            cur = None
            if v.nvmlReturn == 0:
                any_ok = True
                cur = (v.value.ullVal, v.timestamp)
            rates.append(_rate(prev[k], cur))
            prev[k] = cur
            if link_rates is not None:
                link_rates.append(_rate(base[k], cur))  # type: ignore[index]
        if links:
            self._base = list(prev)
        return rates, link_rates, any_ok


def _rate(p: tuple[int, int] | None, cur: tuple[int, int] | None) -> float | None:
    """Bytes/s between two (KiB, µs) readings of one counter; None across a gap, a reset, a wrap or a jump to an
    impossible rate (past MAX_BYTES_PER_S)."""
    if p is None or cur is None or cur[1] <= p[1] or cur[0] < p[0]:
        return None
    rate = (cur[0] - p[0]) * 1024 * 1e6 / (cur[1] - p[1])
    return rate if rate <= MAX_BYTES_PER_S else None
