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


def bad_time(ms: float) -> str:
    """The text for a stored time no date can show: a wild node clock or a corrupt row must read as what it is,
    with its value for the bug report, not stop the table it is in (see utc_datetime)."""
    if isinstance(ms, int) or (isinstance(ms, float) and ms.is_integer() and abs(ms) < 1e18):
        return f"<bad time {int(ms)}>"
    return f"<bad time {ms!r}>"  # nan, inf, 1e+300: not 300 digits


def utc_datetime(ms: float) -> datetime | None:
    """Epoch ms as an aware UTC datetime; None for one no date can show: negative (before 1970: no stored time
    is), not finite, or past year 9999, where datetime.fromtimestamp raises. Every formatter of a stored time goes
    through here (or `_dt`), so no such value can raise in a CLI table or a dashboard worker."""
    if isinstance(ms, bool) or not isinstance(ms, int | float) or not math.isfinite(ms) or ms < 0:
        return None
    try:
        return datetime.fromtimestamp(ms / 1000, tz=UTC)
    except (ValueError, OverflowError, OSError):
        return None


def _dt(ms: float, utc: bool) -> datetime | None:
    dt = utc_datetime(ms)
    if dt is None or utc:
        return dt
    try:
        return dt.astimezone()  # 9999-12-31T23:00Z is year 10000 east of UTC
    except (ValueError, OverflowError, OSError):
        return None


def fmt_clock(ms: float | None, utc: bool = False) -> str:
    """HH:MM:SS, with a Z suffix in UTC so the two can never be confused."""
    if ms is None:
        return NA
    dt = _dt(ms, utc)
    return bad_time(ms) if dt is None else dt.strftime("%H:%M:%S") + ("Z" if utc else "")


def fmt_datetime(ms: float | None, utc: bool = False, seconds: bool = False, zone: bool = False) -> str:
    """Date and minute (the CLI asks for seconds too).

    `zone=True` (text an operator copies back into --since) writes a local time with its UTC offset,
    `2026-12-01 15:30:00+05:30`: a zone-less time is read as UTC, and in a DST fall-back the repeated hour is told
    apart only by its offset. UTC is always ` UTC`, which store/times.py's parse_time reads back too.
    """
    if ms is None:
        return NA
    dt = _dt(ms, utc)
    if dt is None:
        return bad_time(ms)
    pattern = "%Y-%m-%d %H:%M:%S" if seconds else "%Y-%m-%d %H:%M"
    if utc:
        return dt.strftime(pattern) + " UTC"
    if not zone:
        return dt.strftime(pattern)
    # "+05:30" (an old LMT offset such as "+00:17:30" is still ISO and still read back)
    return dt.strftime(pattern) + dt.replace(microsecond=0).isoformat()[19:]


def fmt_when(ms: float | None, now_ms: float, utc: bool = False, short: bool = False) -> str:
    """When something happened, in a list of recent things: the clock alone (fmt_clock) for an instant on today's
    date in the displayed zone (UTC, else local), its date too for any other day. By the calendar date, not
    `now - ms < 24 h`: yesterday 10:00 seen today at 09:00 must not read as an hour ahead, and a 23- or 25-hour DST
    day is one day. `short` (narrow columns) gives `12-03 10:00` (`12-03 10:00Z` in UTC), else fmt_datetime's
    `2026-12-03 10:00`. A bad `ms` reads as bad_time; a bad `now_ms` (a wild clock) gives the date, the safe side."""
    if ms is None:
        return NA
    dt = _dt(ms, utc)
    if dt is None:
        return bad_time(ms)
    now = _dt(now_ms, utc)
    if now is not None and dt.date() == now.date():
        return dt.strftime("%H:%M:%S") + ("Z" if utc else "")
    if short:
        return dt.strftime("%m-%d %H:%M") + ("Z" if utc else "")
    return fmt_datetime(ms, utc)


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
