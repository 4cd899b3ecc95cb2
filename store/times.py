"""Time parsing and formatting for the command line: ISO-8601 (UTC unless an offset is given; a trailing ` UTC`
is UTC too), epoch milliseconds, `now`, or a relative `-24h`. Whatever `lynxtop events` prints in its TIME column
(`2026-12-01 15:30:00+05:30`, or `2026-12-01 10:00:00 UTC` with --utc) reads back as that very instant.
Stored times are always integer epoch milliseconds UTC."""

from __future__ import annotations

import re
import time
from datetime import UTC, datetime

from lynxtop.contract.format import bad_time, utc_datetime

_REL = re.compile(r"-(\d+(?:\.\d+)?)([smhd])")
_UNIT_MS = {"s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
MIN_MS = 946_684_800_000  # 2000-01-01: an epoch value below this is almost surely seconds, not ms
MAX_MS = 253_402_300_799_999  # 9999-12-31T23:59:59.999Z: the last time Python (and so iso()) can write


def _in_range(text: str, value: int) -> int:
    """ValueError for a time before 1970 or after 9999 (a typo, not a request: it would fail deeper in)."""
    if not 0 <= value <= MAX_MS:
        raise ValueError(f"{text!r} is out of range (times from 1970-01-01 to 9999-12-31 UTC)")
    return value


def parse_time(text: str, now_ms: int | None = None) -> int:
    """Epoch ms from user text; ValueError with a message that says what is accepted."""
    s = text.strip()
    now = int(time.time() * 1000) if now_ms is None else now_ms
    if s == "now":
        return now
    m = _REL.fullmatch(s)
    if m:
        ago = float(m.group(1)) * _UNIT_MS[m.group(2)]  # inf for 400 digits: refused below, not int(inf)
        return _in_range(text, now - int(ago)) if ago <= now else _in_range(text, -1)
    if s.isascii() and s.isdigit():  # not "…²" or other Unicode digits: int() refuses or misreads them
        value = int(s)
        if value < MIN_MS:
            raise ValueError(f"{text!r} looks like epoch seconds or a typo; give epoch milliseconds "
                             f"(13 digits) or an ISO-8601 time")
        return _in_range(text, value)
    if s[-4:].upper() == " UTC":  # what `lynxtop events --utc` prints ("2026-12-01 10:00:00 UTC"), read back
        s = s[:-4].rstrip() + "+00:00"
    try:
        dt = datetime.fromisoformat(s.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        raise ValueError(f"{text!r} is not a time (use ISO-8601 like 2026-12-01T10:00 or 2026-12-01T10:00+02:00, "
                         "epoch milliseconds, 'now', or a relative time like -24h, -30m, -7d)") from None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)
    return _in_range(text, int(dt.timestamp() * 1000))  # 9999-12-31T23:59-01:00 is past year 9999 in UTC


def iso(ms: int | None) -> str:
    """ISO-8601 UTC to the millisecond; a stored time no date can show (past 9999, negative) is contract/format's
    `<bad time N>` marker, never a ValueError in the middle of a message or a table."""
    if ms is None:
        return ""
    dt = utc_datetime(ms)
    if dt is None:
        return bad_time(ms)
    return dt.strftime("%Y-%m-%dT%H:%M:%S.") + f"{int(ms) % 1000:03d}Z"
