"""A `meta.schema_version` that is not a whole number ('3.1', a blob): refused as a newer schema is, naming the file
and the value (the store's NewerSchema), never int()'s ValueError; the CLI exits 2 with one line, the agent refuses
with that message, and the file is not changed."""

from __future__ import annotations

import hashlib
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

from .helpers import submit

BAD = [("'3.1'", "'3.1'"), ("x'00ff'", r"b'\x00\xff'"), ("'-1'", "'-1'"), ("' 3'", "' 3'")]


def _db(tmp_path: Path, value_sql: str) -> Path:
    path = tmp_path / "state" / "lynxtop.db"
    with StoreWriter(path) as w:
        submit(w, 3, gpus=1)
    c = sqlite3.connect(path)
    c.execute(f"UPDATE meta SET value = {value_sql} WHERE key = 'schema_version'")
    c.commit()
    c.close()
    return path


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.parametrize(("value_sql", "shown"), BAD)
def test_a_schema_version_that_is_not_a_whole_number_is_refused_naming_file_and_value(tmp_path, value_sql, shown):
    path = _db(tmp_path, value_sql)
    before = _digest(path)
    for open_it in (lambda: StoreWriter(path), lambda: StoreReader(path), lambda: schema.connect_rw(path)):
        with pytest.raises(NewerSchema) as err:
            open_it()
        assert str(err.value).startswith(f"{path}: ") and shown in str(err.value)
        assert "not a whole number" in str(err.value)
    assert _digest(path) == before
    assert sorted(p.name for p in path.parent.iterdir() if "corrupt" in p.name) == []  # never moved aside


def test_a_whole_number_still_reads_as_before(tmp_path):
    path = _db(tmp_path, f"'{schema.SCHEMA_VERSION}'")
    with StoreReader(path) as r:
        assert schema.schema_version(r.conn) == schema.SCHEMA_VERSION
    c = sqlite3.connect(path)
    c.execute("UPDATE meta SET value = 99 WHERE key IN ('schema_version', 'compat_version')")  # TEXT affinity: '99'
    c.commit()
    with pytest.raises(NewerSchema, match="schema 99"):
        schema.check_identity(c, path, integrity=False)
    c.close()


def test_the_cli_says_it_in_one_line_and_exits_2(tmp_path):
    path = _db(tmp_path, "'3.1'")
    before = _digest(path)
    for cmd in (["runs"], ["export", "--from", "-30d"]):
        r = subprocess.run([sys.executable, "-m", "lynxtop", *cmd, "--database", str(path)], capture_output=True,
                           text=True, timeout=60)
        assert r.returncode == 2, r.stderr
        assert "Traceback" not in r.stderr and len(r.stderr.splitlines()) == 1, r.stderr
        assert r.stderr.startswith(f"lynxtop {cmd[0]}: {path}: ") and "'3.1'" in r.stderr
    assert _digest(path) == before


def test_the_agent_refuses_with_that_message(tmp_path):
    path = _db(tmp_path, "'3.1'")
    before = _digest(path)
    cfg = tmp_path / "c.toml"
    sock = Path(f"/tmp/lxv-{os.getpid()}.sock")
    cfg.write_text(f'[agent]\ndatabase = "{path}"\nsocket = "{sock}"\nfake_nvml = "sim"\n')
    r = subprocess.run([sys.executable, "-m", "lynxtop", "agent", "--config", str(cfg)], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode != 0
    last = r.stderr.strip().splitlines()[-1]
    assert "Traceback" not in r.stderr, r.stderr
    assert str(path) in last and "meta.schema_version" in last and "'3.1'" in last, r.stderr
    assert "invalid literal" not in r.stderr
    assert _digest(path) == before
