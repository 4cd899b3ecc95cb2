"""Secret env values written into the runs table by an agent from before they were masked (issue 24.3).

Profile.flags() shows a run's env as "env NAME": value, and those flags are kept with the run. An agent now masks a
secret's value before it is written (contract/redact.py); a database an older agent wrote still holds them, in the
file and in every backup made from it. Opening it for writing masks them in place, with SQLite's secure_delete on
so that the old text is overwritten on its page, not left in the page's free space, and the -wal truncated.
"""

from __future__ import annotations

import json
import sqlite3

from lynxtop.contract.redact import redact_flags


def mask_run_flags(conn: sqlite3.Connection) -> int:
    """Mask every secret env value in runs.flags; the number of rows rewritten (0 on any database written since)."""
    rows = conn.execute("SELECT id, flags FROM runs WHERE flags LIKE '%\"env %'").fetchall()
    changed = []
    for run_id, text in rows:
        try:
            flags = json.loads(text)
        except ValueError:
            continue
        masked = redact_flags(flags)
        if masked != flags:
            changed.append((json.dumps(masked), run_id))
    if not changed:
        return 0
    before = conn.execute("PRAGMA secure_delete").fetchone()[0]
    conn.execute("PRAGMA secure_delete = ON")
    try:
        with conn:
            conn.executemany("UPDATE runs SET flags = ? WHERE id = ?", changed)
    finally:
        conn.execute(f"PRAGMA secure_delete = {int(before)}")
    # the -wal still holds the frames the old text was written in: copied into the file and cut to 0 bytes
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    return len(changed)
