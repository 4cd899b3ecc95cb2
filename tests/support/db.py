"""Reading a history database from a test, the way any outside reader must: read-only (mode=ro)."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any


def db_rows(path: str | Path, sql: str, args: tuple | list = ()) -> list[dict[str, Any]]:
    """The rows of one query as dicts; the connection is closed before returning (no read snapshot held)."""
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    conn.row_factory = sqlite3.Row
    try:
        return [dict(r) for r in conn.execute(sql, args)]
    finally:
        conn.close()
