"""`lynxtop runs` and `export` on a real database: numbers and times out of range, special output files, a
read-only directory, and a -wal/-shm that is not a regular file. A user's mistake is one clear line and exit 2,
never a traceback; the database and the outputs are left as they were."""

from __future__ import annotations

import subprocess
import sys

import pytest

from lynxtop.store.writer import StoreWriter

from .helpers import T0, submit


def _lynxtop(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "lynxtop", *args], capture_output=True, text=True, timeout=60)


@pytest.fixture
def db(tmp_path):
    path = tmp_path / "state" / "h.db"
    with StoreWriter(path) as w:
        rid = w.create_run(profile="p1", model="m", started_ms=T0)
        w.update_run(rid, ended_ms=T0 + 5_000, end_reason="stopped")
        submit(w, 5, gpus=1, run_id=rid)
    return path


@pytest.mark.parametrize(("argv", "said"), [
    (["export", "--from", "99999999999999999"], "--from: '99999999999999999' is out of range"),
    (["export", "--from", "2026-01-01", "--to", "99999999999999999999999"], "--to: '99999999999999999999999' is out"),
    (["export", "--from=-99999999999999999d"], "--from: '-99999999999999999d' is out of range"),
    (["export", "--from=-" + "9" * 400 + "d"], "is out of range"),
    (["export", "--from", "9999-12-31T23:59-01:00"], "is out of range"),
    (["export", "--run", "99999999999999999999"], "argument --run: must be a whole number from 1 to"),
    (["export", "--run", "-3"], "argument --run: must be a whole number from 1 to"),
    (["runs", "--limit", "100000000000000000000"], "argument --limit: must be a whole number from 1 to"),
    (["runs", "--limit", "-1"], "argument --limit: must be a whole number from 1 to"),
])
def test_numbers_and_times_out_of_range_are_a_clear_usage_error(db, argv, said):
    before = db.read_bytes()
    r = _lynxtop(*argv, "--database", str(db))
    assert r.returncode == 2, r.stderr
    assert said in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert r.stdout == "" and db.read_bytes() == before
