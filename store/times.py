"""Time parsing and formatting for the command line: ISO-8601 (UTC unless an offset is given), epoch
milliseconds, `now`, or a relative `-24h`. Stored times are always integer epoch milliseconds UTC."""

from __future__ import annotations

import re
import time
from datetime import UTC, datetime

_REL = re.compile(r"-(\d+(?:\.\d+)?)([smhd])")
_UNIT_MS = {"s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
MIN_MS = 946_684_800_000  # 2000-01-01: an epoch value below this is almost surely seconds, not ms


def parse_time(text: str, now_ms: int | None = None) -> int:
    """Epoch ms from user text; ValueError with a message that says what is accepted."""
    s = text.strip()
    now = int(time.time() * 1000) if now_ms is None else now_ms
    if s == "now":
        return now
    m = _REL.fullmatch(s)
    if m:
        return now - int(float(m.group(1)) * _UNIT_MS[m.group(2)])
    if s.isdigit():
        value = int(s)
        if value < MIN_MS:
            raise ValueError(f"{text!r} looks like epoch seconds or a typo; give epoch milliseconds "
                             f"(13 digits) or an ISO-8601 time")
        return value
    try:
        dt = datetime.fromisoformat(s.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        raise ValueError(f"{text!r} is not a time (use ISO-8601 like 2026-12-01T10:00 or 2026-12-01T10:00+02:00, "
                         "epoch milliseconds, 'now', or a relative time like -24h, -30m, -7d)") from None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)
    return int(dt.timestamp() * 1000)


def iso(ms: int | None) -> str:
    if ms is None:
        return ""
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%S.") + f"{ms % 1000:03d}Z"
