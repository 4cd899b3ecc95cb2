"""Units by magnitude, durations, times in local or UTC, and the words behind NVML bitmasks.

One place for every human-readable number the dashboard, `lynxtop status` and the agent's event texts print,
so a value reads the same everywhere. Every formatter takes None and returns "N/A" (or the `na` it is given):
a missing reading is never drawn as 0. Imports nothing else of the project.
"""

from __future__ import annotations

import math
import time
from datetime import UTC, datetime

NA = "N/A"

_BIN_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")
_SI_UNITS = ("", "k", "M", "G", "T")

# nvmlClocksEventReason* bits (see NVML docs); idle and sync boost are benign, the rest cost clocks.
THROTTLE_REASONS: tuple[tuple[int, str, bool], ...] = (
    (0x1, "idle", False),
    (0x2, "app clocks", False),
    (0x4, "SW power cap", True),
    (0x8, "HW slowdown", True),
    (0x10, "sync boost", False),
    (0x20, "SW thermal", True),
    (0x40, "HW thermal", True),
    (0x80, "power brake", True),
    (0x100, "display clocks", False),
)


def _scaled(value: float) -> str:
    # Precision by magnitude: 3 significant digits reads well and keeps columns narrow.
    if abs(value) < 10:
        return f"{value:.2f}"
    if abs(value) < 100:
        return f"{value:.1f}"
    return f"{value:.0f}"


def fmt_bytes(n: float | None, decimals: int | None = None, largest: str = "PiB") -> str:
    """Binary units; 3 significant digits by default, or a fixed number of `decimals` (the CLI's 1).

    `largest` caps the unit (the CLI stops at TiB).
    """
    if n is None:
        return NA
    value = float(n)
    units = _BIN_UNITS[:_BIN_UNITS.index(largest) + 1]
    for unit in units:
        if abs(value) < 1024 or unit == units[-1]:
            if unit == "B":
                return f"{value:.0f} B"
            return f"{_scaled(value) if decimals is None else f'{value:.{decimals}f}'} {unit}"
        value /= 1024
    return NA  # pragma: no cover


def fmt_rate(n: float | None) -> str:
    """Bytes per second."""
    return NA if n is None else f"{fmt_bytes(n)}/s"


def fmt_si(n: float | None, unit: str = "") -> str:
    """Decimal magnitudes for rates (tokens/s, requests/s): 3 significant digits."""
    if n is None:
        return NA
    value = float(n)
    for prefix in _SI_UNITS:
        if abs(value) < 1000 or prefix == _SI_UNITS[-1]:
            return f"{_scaled(value)}{prefix}" + (f" {unit}" if unit else "")
        value /= 1000
    return NA  # pragma: no cover


def fmt_int(n: float | None) -> str:
    return NA if n is None or n != n or n in (math.inf, -math.inf) else f"{int(n):,}"


def fmt_pct(v: float | None, decimals: int = 0) -> str:
    return NA if v is None else f"{float(v):.{decimals}f}%"


def fmt_ms(v: float | None, decimals: int | None = None) -> str:
    """Latency: milliseconds below a second, seconds with 2 decimals above.

    By default 1 decimal below 100 ms (the dashboard's columns); `decimals=0` gives whole milliseconds
    (the CLI and the SLA event texts).
    """
    if v is None:
        return NA
    v = float(v)
    if v >= 1000:
        return f"{v / 1000:.2f} s"
    if decimals is not None:
        return f"{v:.{decimals}f} ms"
    if v >= 100:
        return f"{v:.0f} ms"
    return f"{v:.1f} ms"


def fmt_watts(v: float | None) -> str:
    return NA if v is None else f"{float(v):.0f} W"


def fmt_temp(v: float | None) -> str:
    return NA if v is None else f"{float(v):.0f}°C"


def fmt_duration(seconds: float | None, na: str = NA) -> str:
    """Two units at most (1h02m, 1d01h): an uptime, not a stopwatch. The CLI passes na="-"."""
    if seconds is None or seconds != seconds or seconds in (math.inf, -math.inf):
        return na
    s = max(0, int(seconds))
    days, rem = divmod(s, 86400)
    hours, rem = divmod(rem, 3600)
    minutes, secs = divmod(rem, 60)
    if days:
        return f"{days}d{hours:02d}h"
    if hours:
        return f"{hours}h{minutes:02d}m"
    if minutes:
        return f"{minutes}m{secs:02d}s"
    return f"{secs}s"


def _dt(ms: float, utc: bool) -> datetime:
    dt = datetime.fromtimestamp(ms / 1000, tz=UTC)
    return dt if utc else dt.astimezone()


def fmt_clock(ms: float | None, utc: bool = False) -> str:
    """HH:MM:SS, with a Z suffix in UTC so the two can never be confused."""
    if ms is None:
        return NA
    return _dt(ms, utc).strftime("%H:%M:%S") + ("Z" if utc else "")


def fmt_datetime(ms: float | None, utc: bool = False, seconds: bool = False) -> str:
    """Date and minute (the CLI asks for seconds too)."""
    if ms is None:
        return NA
    pattern = "%Y-%m-%d %H:%M:%S" if seconds else "%Y-%m-%d %H:%M"
    return _dt(ms, utc).strftime(pattern) + (" UTC" if utc else "")


def now_ms() -> int:
    return int(time.time() * 1000)


def throttle_words(mask: int | None, include_benign: bool = False) -> list[str]:
    """Throttle reasons as words; idle and sync boost are left out unless asked for (they cost nothing)."""
    if mask is None:
        return [NA]
    words = [name for bit, name, costly in THROTTLE_REASONS if mask & bit and (costly or include_benign)]
    known = 0
    for bit, _, _ in THROTTLE_REASONS:
        known |= bit
    if mask & ~known:
        words.append(f"other 0x{mask & ~known:x}")
    return words
