"""Faults with real parts: SIGKILL of a writer process, a full database (max_page_count), damaged and
foreign files."""

from __future__ import annotations

import os
import re
import signal
import sqlite3
import subprocess
import sys
import time

import pytest
from support.writer_faults import disk_full

from lynxtop.__main__ import main
from lynxtop.store.reader import StoreReader
from lynxtop.store.writer import StoreWriter

from .helpers import T0, gpu_row, submit

CHILD = r"""
import sys, time
from lynxtop.store.writer import StoreWriter
sys.path.insert(0, sys.argv[2])
from helpers import gpu_row, host_row
T0 = int(sys.argv[3])  # the parent's: helpers' T0 moves to the next hour if an hour turns between the two imports
w = StoreWriter(sys.argv[1], queue_max=100_000)
w.start()
rows = [gpu_row(g, 0) for g in range(8)]
last = None
i = 0
while True:
    for _ in range(50):
        w.submit_tick(T0 + i * 1000, [dict(r) for r in rows], host_row(i))
        i += 1
    while w.stats()["queued"] > 2000:  # stay under the bound: a full queue drops ticks by design
        time.sleep(0.005)
    done = w.stats()["last_tick_ts_ms"]
    if done != last:
        print(done, flush=True)
        last = done
    time.sleep(0.01)
"""


def test_sigkill_mid_write_keeps_every_committed_tick(tmp_path):
    db = tmp_path / "k.db"
    proc = subprocess.Popen([sys.executable, "-c", CHILD, str(db), os.path.dirname(__file__), str(T0)],
                            stdout=subprocess.PIPE, text=True)
    committed = None
    try:
        deadline = time.monotonic() + 30
        reports = 0
        while reports < 6 and time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            if line.strip() != "None":
                committed = int(line)
                reports += 1
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)
    assert proc.returncode == -signal.SIGKILL
    assert committed is not None, "the child never reported a commit"
    c = sqlite3.connect(db)
    assert c.execute("PRAGMA quick_check").fetchall() == [("ok",)]
    per_tick = dict(c.execute("SELECT ts_ms, count(*) FROM gpu_samples GROUP BY ts_ms").fetchall())
    expected = range(T0, committed + 1, 1000)
    bad = [(ts, per_tick.get(ts)) for ts in expected if per_tick.get(ts) != 8]
    assert not bad, (bad[:5], len(bad), len(expected), committed, max(per_tick) if per_tick else None)
    assert set(per_tick.values()) == {8}  # and no half-written tick beyond it
    hosts = c.execute("SELECT count(*) FROM host_samples WHERE ts_ms <= ?", (committed,)).fetchone()[0]
    assert hosts == len(expected)
    StoreWriter(db).close()  # and the agent can carry on with it


def test_full_database_buffers_reports_and_resumes(tmp_path):
    db = tmp_path / "f.db"
    w = StoreWriter(db, queue_max=40, retry_interval_s=0.05)
    w.start()
    submit(w, 5, gpus=8)
    assert w.flush(10)
    disk_full(w, True)  # the "disk" is now full
    submit(w, 100, start_i=5, gpus=8)
    deadline = time.monotonic() + 10
    while not w.stats()["retrying"]:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    st = w.stats()
    assert "full" in st["last_error"] and st["dropped"] > 0
    assert w._thread.is_alive()
    assert not w.flush(0.3)  # still buffered
    # a run started while the disk is full gets its id at once and its row waits in memory for the space
    rid = w.create_run(profile="while-full", argv=["x" * 100_000])
    assert isinstance(rid, int) and not w.flush(0.3)
    disk_full(w, False)  # space returns
    assert w.flush(10)
    st = w.stats()
    w.close()
    assert st["last_error"] is None and not st["retrying"]
    c = sqlite3.connect(db)
    ts = [r[0] for r in c.execute("SELECT DISTINCT ts_ms FROM gpu_samples ORDER BY ts_ms")]
    assert len(ts) + st["dropped"] == 105
    assert ts[-40:] == [T0 + i * 1000 for i in range(105 - 40, 105)]  # the newest 40 were kept
    written_before_full = len(ts) - 40
    assert ts[:written_before_full] == [T0 + i * 1000 for i in range(written_before_full)]
    assert c.execute("SELECT id, profile FROM runs").fetchall() == [(rid, "while-full")]
    msgs = c.execute("SELECT kind, message FROM events WHERE kind LIKE 'store.%' ORDER BY id").fetchall()
    assert msgs[0][0] == "store.write_failed" and "cannot write history" in msgs[0][1] and "full" in msgs[0][1]
    assert msgs[1][0] == "store.writes_resumed"
    assert re.search(r"history writes resumed after \d+ s; \d+ ticks were dropped", msgs[1][1])


def test_a_lingering_writer_retries_a_refused_batch_without_lingering_again(tmp_path):
    """Ticks put back after a transient failure (a full disk) are due at once: the retries write them as soon as
    space returns, not a linger later (the agent lingers 1 s at 10 Hz; here 600 s, so a tick lingering again
    would never land within the test). The store's own events go to a sink that does not write them back here,
    so no queued event keeps the thread busy meanwhile."""
    db = tmp_path / "f.db"
    events: list = []
    w = StoreWriter(db, queue_max=1000, retry_interval_s=0.05, linger_s=600.0, on_event=events.append)
    w.start()
    try:
        submit(w, 5, gpus=8)
        assert w.flush(10)
        disk_full(w, True)  # the "disk" is now full
        submit(w, 100, start_i=5, gpus=8)
        assert not w.flush(0.5)  # the flush makes the thread try them: refused, kept
        assert w.stats()["retrying"]
        disk_full(w, False)  # space returns; nobody flushes
        deadline = time.monotonic() + 30
        while w.stats()["written_ticks"] < 105 and time.monotonic() < deadline:
            time.sleep(0.05)
        st = w.stats()
    finally:
        w.close()
    assert st["written_ticks"] == 105 and st["dropped"] == 0 and not st["retrying"]
    assert [str(e.kind) for e in events] == ["store.write_failed", "store.writes_resumed"]


def _damage(path, offset: int, size: int = 4096) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(os.urandom(size))


@pytest.mark.parametrize("kind", ["corrupt", "text", "foreign-sqlite"])
def test_bad_file_is_moved_aside_and_reported(tmp_path, kind):
    db = tmp_path / "lynxtop.db"
    if kind == "corrupt":
        with StoreWriter(db, queue_max=5000) as w:
            submit(w, 300, gpus=8)
        sqlite3.connect(db).execute("PRAGMA wal_checkpoint(TRUNCATE)").close()
        _damage(db, 4096 * 3, 4096 * 4)
        expect = "damaged"
    elif kind == "text":
        db.write_text("# not a database\n" * 50)
        expect = "not an SQLite database"
    else:
        c = sqlite3.connect(db)
        c.execute("CREATE TABLE invoices (id INTEGER PRIMARY KEY)")
        c.commit()
        c.close()
        expect = "another program"
    original = db.read_bytes()

    if kind == "text":  # a reader only reports; it never moves anything
        assert main(["runs", "--database", str(db)]) == 2
    w = StoreWriter(db)
    w.start()
    submit(w, 2, gpus=1)
    w.close()
    aside = w.moved_aside
    assert aside is not None and aside.name.startswith("lynxtop.db.corrupt-")
    assert aside.read_bytes() == original  # nothing lost: the old file is kept for inspection
    ev = StoreReader(db).events(kinds=["store.moved_aside"])
    assert len(ev) == 1 and ev[0].severity == "error"
    assert str(db) in ev[0].message and expect in ev[0].message and str(aside) in ev[0].message
    assert StoreReader(db).latest("gpu")[0]["ts_ms"] == T0 + 1000


def test_reader_reports_damage_with_the_path(tmp_path, capsys):
    db = tmp_path / "lynxtop.db"
    with StoreWriter(db, queue_max=5000) as w:
        w.create_run(profile="p", started_ms=T0)
        for i in range(300):
            w.submit_tick(T0 + i * 1000, [gpu_row(g, i) for g in range(8)])
    sqlite3.connect(db).execute("PRAGMA wal_checkpoint(TRUNCATE)").close()
    _damage(db, 4096 * 2, 4096 * 30)
    rc = main(["export", "--database", str(db), "--from", str(T0), "--to", str(T0 + 300_000)])
    err = capsys.readouterr().err
    assert rc == 2 and str(db) in err and "Traceback" not in err
