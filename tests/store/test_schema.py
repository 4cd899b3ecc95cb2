"""Schema creation, forward migration, permissions, and refusing files that are not ours."""

from __future__ import annotations

import sqlite3
import stat

import pytest

from lynxtop.store import schema
from lynxtop.store.errors import NewerSchema, NotOurDatabase
from lynxtop.store.writer import StoreWriter

from .helpers import T0, submit


def test_fresh_database_layout(tmp_path):
    path = tmp_path / "state" / "lynxtop.db"
    w = StoreWriter(path)
    w.close()
    assert stat.S_IMODE(path.stat().st_mode) == 0o640
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o750
    c = sqlite3.connect(path)
    assert c.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert c.execute("PRAGMA application_id").fetchone()[0] == schema.APPLICATION_ID
    assert schema.schema_version(c) == schema.SCHEMA_VERSION
    tables = {r[0] for r in c.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    assert {"gpu_samples", "nvlink_samples", "host_samples", "serving_samples", "gpu_processes", "gpus", "runs",
            "events", "bench_results", "meta", "gpu_1m", "gpu_1h", "host_1m", "host_1h", "serving_1m",
            "serving_1h"} <= tables
    ddl = c.execute("SELECT sql FROM sqlite_master WHERE name='gpu_samples'").fetchone()[0]
    assert "WITHOUT ROWID" in ddl and "PRIMARY KEY (ts_ms, gpu)" in ddl
    cols = [r[1] for r in c.execute("PRAGMA table_info(gpu_1m)")]
    assert cols[:6] == ["ts_ms", "gpu", "samples", "lost_min", "lost_avg", "lost_max"]


def test_migration_from_version_1_keeps_data(tmp_path):
    path = tmp_path / "old.db"
    schema.create_file(path)
    c = sqlite3.connect(path, isolation_level=None)
    assert schema.migrate(c, target=1) == 1
    c.execute("INSERT INTO gpu_samples (ts_ms, gpu, util_gpu_pct) VALUES (?, 0, 42)", (T0,))
    c.execute("INSERT INTO runs (profile, started_ms) VALUES ('old', ?)", (T0,))
    assert "gpu_1m" not in {r[0] for r in c.execute("SELECT name FROM sqlite_master")}
    c.close()

    w = StoreWriter(path)
    w.close()
    c = sqlite3.connect(path)
    assert schema.schema_version(c) == schema.SCHEMA_VERSION
    assert c.execute("SELECT util_gpu_pct FROM gpu_samples").fetchall() == [(42,)]
    assert c.execute("SELECT profile FROM runs").fetchall() == [("old",)]
    assert c.execute("SELECT count(*) FROM gpu_1m").fetchone()[0] == 0  # the table now exists


def test_column_added_to_columns_py_is_added_in_place(tmp_path, monkeypatch):
    path = tmp_path / "h.db"
    StoreWriter(path).close()
    extra = schema.SAMPLE_TABLES["gpu"]
    monkeypatch.setitem(schema.SAMPLE_TABLES, "gpu", schema.SampleTable(
        extra.name, extra.metrics + (("new_metric_w", "INTEGER", "added later"),), True))
    c = sqlite3.connect(path, isolation_level=None)
    schema.migrate(c)
    assert "new_metric_w" in [r[1] for r in c.execute("PRAGMA table_info(gpu_samples)")]


def test_newer_schema_is_refused_and_left_untouched(tmp_path):
    path = tmp_path / "new.db"
    w = StoreWriter(path)
    submit(w, 3)
    w.close()
    c = sqlite3.connect(path)
    c.execute("UPDATE meta SET value = '99' WHERE key IN ('schema_version', 'compat_version')")  # needs 99
    c.commit()
    c.close()
    before = path.read_bytes()
    with pytest.raises(NewerSchema, match=str(path)):
        StoreWriter(path)
    assert path.read_bytes() == before
    assert not list(tmp_path.glob("*.corrupt-*"))


def test_foreign_sqlite_file_is_recognised(tmp_path):
    path = tmp_path / "other.db"
    c = sqlite3.connect(path)
    c.execute("CREATE TABLE customers (id INTEGER PRIMARY KEY, name TEXT)")
    c.commit()
    c.close()
    conn = sqlite3.connect(path)
    with pytest.raises(NotOurDatabase, match="another program.*customers"):
        schema.check_identity(conn, path)
