"""Strict JSON (RFC 8259) for everything lynxtop prints or serves: NaN and Infinity are not JSON.

`json.dumps` writes them as the bare tokens `NaN` / `Infinity`, which jq, Go and JavaScript refuse: one stored
NaN (a detail of an old event, a benchmark level) would make a whole `--json` line unreadable. Shared by the
agent's API (agent/api/routes.py) and the command line's --json outputs, so both write the same text.
"""

from __future__ import annotations

import json
import math
from typing import Any


def finite(v: Any) -> Any:
    """`v` with every non-finite float made None (JSON's null), walking dicts, lists and tuples."""
    if isinstance(v, float):
        return v if math.isfinite(v) else None
    if isinstance(v, dict):
        return {k: finite(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [finite(x) for x in v]
    return v


def strict_dumps(data: Any, **kw: Any) -> str:
    """`json.dumps(data, **kw)` that never writes NaN/Infinity: a non-finite float is written as null. The common
    case (all finite) pays one dumps; only data with such a value is walked and written again."""
    try:
        return json.dumps(data, allow_nan=False, **kw)
    except ValueError:
        return json.dumps(finite(data), allow_nan=False, **kw)
