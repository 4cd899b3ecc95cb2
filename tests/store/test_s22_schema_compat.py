"""Version skew across a rollback (s22): a file whose newer schema keeps this code's tables as they were opens.

Each migration declares the oldest schema whose code may still read and write a file that has it; migrate()
stores that floor as meta.compat_version. A file with a newer schema opens when its floor is at most this code's
SCHEMA_VERSION (the writer and the readers alike, nothing migrated down); a file whose floor is above it is refused
with what to do on a rollback, and left byte for byte as it was. A file written before the floor existed has none:
its floor is its schema version (refused as before).
"""

from __future__ import annotations

import hashlib
import logging
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from lynxtop.store import schema
from lynxtop.store.errors import NewerSchema
from lynxtop.store.reader import StoreReader
from lynxtop.store.writer import StoreWriter

from .helpers import T0, submit

NEXT = schema.SCHEMA_VERSION + 1


def _meta(path: Path, key: str) -> str | None:
    c = sqlite3.connect(path)
    try:
        row = c.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return None if row is None else row[0]
    finally:
        c.close()


def _future_db(path: Path, floor: int | None, ticks: int = 3) -> Path:
    """What a one-release-newer lynxtop leaves: schema NEXT, a table of its own, floor `floor` (None: no floor)."""
    with StoreWriter(path) as w:
        submit(w, ticks, gpus=1)
    c = sqlite3.connect(path, isolation_level=None)
    c.execute("CREATE TABLE future_additive (k TEXT PRIMARY KEY) WITHOUT ROWID")
    c.execute("UPDATE meta SET value = ? WHERE key = 'schema_version'", (str(NEXT),))
    if floor is None:
        c.execute("DELETE FROM meta WHERE key = 'compat_version'")
    else:
        c.execute("INSERT OR REPLACE INTO meta (key, value) VALUES ('compat_version', ?)", (str(floor),))
    c.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    c.close()
    return path


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _cli_runs(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "lynxtop", "runs", "--database", str(path)], capture_output=True,
                          text=True, timeout=60)


# ---------------------------------------------------------------------------------------------- the floors


def test_each_migration_declares_a_floor_no_newer_than_itself_and_m3_m4_need_schema_3():
    floors = [m.floor for m in schema.MIGRATIONS]
    assert all(1 <= f <= v for v, f in enumerate(floors, start=1)), floors
    assert floors == sorted(floors)  # a migration never lowers the floor of the ones before it
    assert floors[2] == 3  # m3 moves raw rows into chunks that schema-2 code cannot read
    assert floors[3] == 3  # m4 only adds rollup_dirty, which schema-3 code never touches


def test_migrate_writes_the_floor_of_the_applied_migrations(tmp_path):
    path = tmp_path / "h.db"
    c = sqlite3.connect(path, isolation_level=None)
    assert schema.migrate(c, target=2) == 2
    assert _meta(path, "compat_version") == str(schema.MIGRATIONS[1].floor)
    schema.migrate(c)
    assert _meta(path, "compat_version") == "3"
    c.execute("DELETE FROM meta WHERE key = 'compat_version'")  # a file from before the floor existed
    schema.migrate(c)
    assert _meta(path, "compat_version") == "3"  # recomputed on the next open
    c.close()
    with StoreWriter(tmp_path / "fresh.db"):
        pass
    assert _meta(tmp_path / "fresh.db", "compat_version") == "3"


# ---------------------------------------------------------------------------------------------- opened


def test_a_newer_schema_whose_floor_is_this_one_opens_in_the_writer_and_is_written(tmp_path, caplog):
    path = _future_db(tmp_path / "lynxtop.db", floor=schema.SCHEMA_VERSION)
    caplog.set_level(logging.INFO, logger="lynxtop.store.schema")
    w = StoreWriter(path)
    try:
        said = [r for r in caplog.records if r.levelno >= logging.WARNING and str(path) in r.getMessage()]
        assert any(f"schema {NEXT}, this build knows {schema.SCHEMA_VERSION}: opened" in r.getMessage()
                   for r in said), [r.getMessage() for r in caplog.records]
        w.start()  # the agent's writer: its thread writes the ticks
        run_id = w.create_run(profile="rollback", model="m", started_ms=T0 + 10_000)
        submit(w, 5, start_i=100, gpus=1)
        assert w.flush(30)
    finally:
        w.close()
    assert _meta(path, "schema_version") == str(NEXT)  # nothing migrated down
    assert _meta(path, "compat_version") == str(schema.SCHEMA_VERSION)  # the newer release's floor kept
    c = sqlite3.connect(path)
    assert c.execute("SELECT COUNT(*) FROM sqlite_master WHERE name = 'future_additive'").fetchone()[0] == 1
    assert c.execute("SELECT profile FROM runs WHERE id = ?", (run_id,)).fetchone()[0] == "rollback"
    assert c.execute("SELECT COUNT(*) FROM gpu_samples").fetchone()[0] == 8  # 3 of the newer release's + 5
    c.close()
    with StoreReader(path) as r:
        assert [x.profile for x in r.runs()] == ["rollback"]
    p = _cli_runs(path)
    assert p.returncode == 0, p.stderr
    assert "rollback" in p.stdout and "newer lynxtop" not in p.stderr


def test_a_file_at_this_schema_without_a_floor_opens_and_gets_one(tmp_path):
    path = tmp_path / "h.db"
    with StoreWriter(path):
        pass
    c = sqlite3.connect(path)
    c.execute("DELETE FROM meta WHERE key = 'compat_version'")  # as this session's schema-4 files before the floor
    c.commit()
    c.close()
    with StoreReader(path) as r:
        assert r.runs() == []
    with StoreWriter(path):
        pass
    assert _meta(path, "compat_version") == "3"


# ---------------------------------------------------------------------------------------------- refused


def _assert_rollback_advice(msg: str, path: Path, needs: int) -> None:
    assert msg.startswith(f"{path}: "), msg
    assert f"schema {needs}" in msg and f"knows {schema.SCHEMA_VERSION}" in msg, msg
    assert f"keep a lynxtop that knows schema {needs}" in msg, msg
    assert "move" in msg and "starts empty" in msg, msg
    assert "upgrade lynxtop or point" not in msg, msg  # the old advice: wrong after a rollback


@pytest.mark.parametrize("floor", [NEXT, None], ids=["floor-above", "no-floor"])
def test_a_newer_schema_whose_floor_is_above_this_one_is_refused_and_untouched(tmp_path, floor):
    path = _future_db(tmp_path / "lynxtop.db", floor=floor)
    before = _digest(path)
    for open_it in (lambda: StoreWriter(path), lambda: schema.connect_rw(path)):
        with pytest.raises(NewerSchema) as err:
            open_it()
        _assert_rollback_advice(str(err.value), path, NEXT)
        assert "keeps serving" in str(err.value)  # the agent's open: serving is not stopped by the refusal
    with pytest.raises(NewerSchema) as err:
        StoreReader(path)
    _assert_rollback_advice(str(err.value), path, NEXT)
    p = _cli_runs(path)
    assert p.returncode == 2 and len(p.stderr.splitlines()) == 1, p.stderr
    _assert_rollback_advice(p.stderr.removeprefix("lynxtop runs: ").strip(), path, NEXT)
    assert _digest(path) == before
    assert [p.name for p in tmp_path.iterdir() if "corrupt" in p.name] == []  # never moved aside


def test_the_agent_refuses_a_floor_above_it_saying_serving_keeps_running(tmp_path):
    path = _future_db(tmp_path / "state" / "lynxtop.db", floor=NEXT)
    before = _digest(path)
    cfg = tmp_path / "c.toml"
    sock = Path(f"/tmp/lxc22-{os.getpid()}.sock")
    cfg.write_text(f'[agent]\ndatabase = "{path}"\nsocket = "{sock}"\nfake_nvml = "sim"\n')
    r = subprocess.run([sys.executable, "-m", "lynxtop", "agent", "--config", str(cfg)], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode != 0
    assert "Traceback" not in r.stderr, r.stderr
    last = r.stderr.strip().splitlines()[-1]
    assert str(path) in last and f"keep a lynxtop that knows schema {NEXT}" in last, r.stderr
    assert "keeps serving" in last, r.stderr
    assert _digest(path) == before
