"""`lynxtop runs` and `export` on a real database: numbers and times out of range, special output files, a
read-only directory, and a -wal/-shm that is not a regular file. A user's mistake is one clear line and exit 2,
never a traceback; the database and the outputs are left as they were."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

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


# ---------------------------------------------------------------------------------------------- special outputs

def _read_fifo_in_background(path):
    """A reader on the FIFO, as `-o >(gzip > x)` has: returns a function giving what it read."""
    import threading

    got: list[bytes] = []

    def drain() -> None:
        with open(path, "rb") as f:
            got.append(f.read())

    t = threading.Thread(target=drain, daemon=True)
    t.start()

    def result() -> bytes:
        t.join(30)
        return got[0] if got else b""
    return result


@pytest.mark.parametrize("force", [True, False])
def test_export_into_a_fifo_writes_through_it_and_leaves_it_a_fifo(db, tmp_path, force):
    import os
    import stat

    fifo = tmp_path / "out.fifo"
    os.mkfifo(fifo)
    read = _read_fifo_in_background(fifo)
    r = _lynxtop("export", "--database", str(db), "--run", "1", "--table", "runs", "-o", str(fifo),
                 *(["--force"] if force else []))
    assert r.returncode == 0, r.stderr
    data = read().decode()
    assert data.startswith("time_utc,ts_ms,id,") and ",p1," in data
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)  # before: --force replaced it with a regular file
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.fifo", "state"]  # no temporary file left


def test_export_force_into_a_character_device_keeps_the_device(db, tmp_path):
    import os
    import stat

    dev = tmp_path / "null"  # a node like /dev/null, made here so a regression cannot break the real one
    try:
        os.mknod(dev, stat.S_IFCHR | 0o666, os.makedev(1, 3))
    except PermissionError:
        pytest.skip("mknod needs root (CAP_MKNOD)")
    r = _lynxtop("export", "--database", str(db), "--run", "1", "-o", str(dev), "--force")
    assert r.returncode == 0, r.stderr
    st = os.lstat(dev)
    assert stat.S_ISCHR(st.st_mode) and st.st_rdev == os.makedev(1, 3)


def test_export_refuses_a_block_device_or_socket_even_with_force(db, tmp_path):
    import socket
    import stat

    sock_path = tmp_path / "s"
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(sock_path))
    try:
        r = _lynxtop("export", "--database", str(db), "--run", "1", "-o", str(sock_path), "--force")
    finally:
        s.close()
    assert r.returncode == 2 and f"{sock_path} is a socket: export writes a regular file" in r.stderr
    assert stat.S_ISSOCK(sock_path.lstat().st_mode)


# ---------------------------------------------------------------------------------------------- read-only directory

def _immutable(path):
    """`chattr +i` (root ignores chmod): the directory cannot get new entries, not even from root."""
    import shutil

    chattr = shutil.which("chattr")
    if chattr is None:
        pytest.skip("chattr not installed: cannot make a directory read-only for root")
    r = subprocess.run([chattr, "+i", str(path)], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"chattr +i not possible here ({r.stderr.strip()})")
    return lambda: subprocess.run([chattr, "-i", str(path)], check=True)


@pytest.mark.parametrize("argv", [["runs"], ["export", "--run", "1", "--table", "runs"]])
def test_a_clean_database_in_a_read_only_directory_is_read_and_says_how(db, argv):
    assert sorted(p.name for p in db.parent.iterdir()) == ["h.db"]  # clean: no -wal, no -shm
    undo = _immutable(db.parent)
    try:
        r = _lynxtop(*argv, "--database", str(db))
    finally:
        undo()
    assert r.returncode == 0, r.stderr  # before: "permission denied ... SQLite needs to create h.db-wal"
    assert "p1" in r.stdout
    assert f"note: {db}: opened read-only as an immutable file (the directory {db.parent} is not writable" in r.stderr
    assert sorted(p.name for p in db.parent.iterdir()) == ["h.db"]


# ---------------------------------------------------------------------------------------------- -wal / -shm

@pytest.mark.parametrize("side", ["-wal", "-shm"])
def test_a_directory_named_like_the_wal_or_shm_is_named_by_readers(db, side):
    (db.parent / f"h.db{side}").mkdir()
    before = db.read_bytes()
    r = _lynxtop("runs", "--database", str(db))
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert f"{db}{side} is a directory, not a regular file" in r.stderr
    assert db.read_bytes() == before and (db.parent / f"h.db{side}").is_dir()


@pytest.mark.parametrize("side", ["-wal", "-shm"])
@pytest.mark.parametrize("existing", [True, False])
def test_a_directory_named_like_the_wal_or_shm_is_named_by_the_writer(tmp_path, db, side, existing):
    """The agent's writer: a new database is not even created (before: "disk I/O error" and a 0-byte file)."""
    from lynxtop.store.errors import NotOurDatabase, StoreError

    path = db if existing else tmp_path / "new" / "h.db"
    path.parent.mkdir(exist_ok=True)
    Path(f"{path}{side}").mkdir()
    before = sorted(p.name for p in path.parent.iterdir())
    with pytest.raises(StoreError) as exc:
        StoreWriter(path)
    assert not isinstance(exc.value, NotOurDatabase)  # a healthy file is never moved aside for this
    assert f"{path}{side} is a directory, not a regular file" in str(exc.value)
    assert sorted(p.name for p in path.parent.iterdir()) == before
