"""Issue 24.3, the store's side: a run's flags never put a secret-looking env value into the database (the agent
masks them already; the writer masks whatever a caller hands it), and a row written before values were masked is
served masked by the reader (`lynxtop runs`, GET /v1/runs)."""

from __future__ import annotations

import json
import sqlite3

from lynxtop.contract.redact import mask
from lynxtop.store.reader import StoreReader
from lynxtop.store.writer import StoreWriter

from .helpers import T0

TOKEN = "hf_rawTokenInFlags42"


def test_writer_masks_secret_env_values_in_a_runs_flags(tmp_path):
    db = tmp_path / "l.db"
    flags = {"--tensor-parallel-size": "8", "env HF_TOKEN": TOKEN, "env NCCL_DEBUG": "INFO"}
    with StoreWriter(db) as w:
        rid = w.create_run(profile="p", argv=["/x/vllm", "serve", "m"], model="m", host="n", started_ms=T0,
                           flags=flags)
        w.update_run(rid, flags=flags)
        assert w.flush(10)
    dump = "\n".join(sqlite3.connect(db).iterdump())
    assert TOKEN not in dump
    stored = json.loads(sqlite3.connect(db).execute("SELECT flags FROM runs").fetchone()[0])
    assert stored == {"--tensor-parallel-size": "8", "env HF_TOKEN": mask(TOKEN), "env NCCL_DEBUG": "INFO"}


def test_reader_masks_a_row_written_before_values_were_masked(tmp_path):
    db = tmp_path / "l.db"
    with StoreWriter(db) as w:
        rid = w.create_run(profile="p", argv=["/x/vllm"], model="m", host="n", started_ms=T0, flags={})
        assert w.flush(10)
    with sqlite3.connect(db) as c:  # as an older agent wrote it
        c.execute("UPDATE runs SET flags = ? WHERE id = ?", (json.dumps({"env VLLM_API_KEY": TOKEN}), rid))
    r = StoreReader(db)
    assert r.runs()[0].flags == {"env VLLM_API_KEY": mask(TOKEN)}
    assert r.run(rid).flags == {"env VLLM_API_KEY": mask(TOKEN)}


def test_opening_a_database_an_older_agent_wrote_masks_its_stored_secrets(tmp_path):
    db = tmp_path / "l.db"
    with StoreWriter(db) as w:
        rid = w.create_run(profile="p", argv=["/x/vllm"], model="m", host="n", started_ms=T0, flags={})
        assert w.flush(10)
    with sqlite3.connect(db) as c:  # as an older agent wrote it
        c.execute("UPDATE runs SET flags = ? WHERE id = ?",
                  (json.dumps({"env HF_TOKEN": TOKEN, "env NCCL_DEBUG": "INFO"}), rid))
    assert TOKEN.encode() in db.read_bytes() + (tmp_path / "l.db-wal").read_bytes()
    with StoreWriter(db) as w:  # the next agent
        assert w.flush(10)
    stored = json.loads(sqlite3.connect(db).execute("SELECT flags FROM runs").fetchone()[0])
    assert stored == {"env HF_TOKEN": mask(TOKEN), "env NCCL_DEBUG": "INFO"}
    files = b"".join(f.read_bytes() for f in tmp_path.iterdir() if f.name.startswith("l.db"))
    assert TOKEN.encode() not in files  # not in the page's free space nor in a -wal either
