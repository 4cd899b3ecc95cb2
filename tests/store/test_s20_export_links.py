"""Session 20: `export --table all -o DIR` writes each table only as a regular file it creates or replaces by
rename. A symbolic link or a special file (FIFO, device, socket) at a table's name is someone else's choice of
target (a shared DIR): refused by name, exit non-zero, nothing written through it and no file of the export left.
A path named with `-o` for one table keeps its documented behaviour (a FIFO, /dev/stdout, written as it is).
"""

from __future__ import annotations

import os
import socket
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from lynxtop.__main__ import main
from lynxtop.contract.events import Event, EventKind
from lynxtop.store.writer import StoreWriter

from .helpers import T0, submit


@pytest.fixture
def db(tmp_path) -> Path:
    path = tmp_path / "h.db"
    with StoreWriter(path, queue_max=5000) as w:
        rid = w.create_run(profile="p", model="m", started_ms=T0, ended_ms=T0 + 120_000, exit_code=0)
        submit(w, 30, gpus=2, run_id=rid)
        w.record(Event(EventKind.SERVING_READY, "info", "ready", run_id=rid, ts_ms=T0 + 1000))
    return path


def _export(db: Path, *args: str) -> list[str]:
    return ["export", "--database", str(db), "--from", str(T0), "--to", str(T0 + 200_000), *args]


def _plant(out: Path, kind: str, victim: Path) -> Path:
    target = out / "gpu.csv"
    if kind == "link-to-device":
        target.symlink_to("/dev/null")
    elif kind == "link-to-file":
        target.symlink_to(victim)
    elif kind == "dangling-link":
        target.symlink_to(out / "nowhere.csv")
    elif kind == "fifo":
        os.mkfifo(target)
    elif kind == "socket":
        s = socket.socket(socket.AF_UNIX)
        s.bind(str(target))
        s.close()
    return target


@pytest.mark.parametrize("force", [False, True])
@pytest.mark.parametrize("kind", ["link-to-device", "link-to-file", "dangling-link", "fifo", "socket"])
def test_export_all_refuses_a_link_or_special_file_at_a_tables_name(tmp_path, db, kind, force):
    out = tmp_path / "shared-exports"
    out.mkdir()
    victim = tmp_path / "victim.txt"
    victim.write_text("the operator's file\n")
    target = _plant(out, kind, victim)
    before = os.lstat(target)
    # a subprocess: the old code blocked for ever opening a FIFO nobody reads
    r = subprocess.run([sys.executable, "-m", "lynxtop", *_export(db, "--table", "all", "-o", str(out)),
                        *(["--force"] if force else [])], capture_output=True, text=True, timeout=60)
    assert r.returncode != 0, f"exit 0 with {target} a {kind}:\n{r.stderr}"
    assert str(target) in r.stderr and "regular file" in r.stderr, r.stderr
    after = os.lstat(target)
    assert (stat.S_IFMT(after.st_mode), after.st_ino) == (stat.S_IFMT(before.st_mode), before.st_ino)
    assert victim.read_text() == "the operator's file\n"
    assert sorted(p.name for p in out.iterdir()) == ["gpu.csv"]  # no other table written, no temporary left


def test_export_all_still_replaces_regular_files_by_rename_with_force(tmp_path, db, capsys):
    out = tmp_path / "exports"
    out.mkdir()
    (out / "gpu.csv").write_text("old\n")
    other = tmp_path / "hardlink.csv"
    os.link(out / "gpu.csv", other)  # another name of the same file: a rename leaves its content as it was
    assert main(_export(db, "--table", "all", "-o", str(out))) != 0  # without --force: refused, as before
    assert main(_export(db, "--table", "all", "-o", str(out), "--force")) == 0, capsys.readouterr().err
    assert (out / "gpu.csv").read_text().startswith("time_utc,ts_ms,gpu")
    assert other.read_text() == "old\n"
    assert {p.name for p in out.iterdir()} >= {"gpu.csv", "host.csv", "serving.csv", "events.csv", "runs.csv"}


def test_one_table_to_a_device_named_with_o_is_still_written_as_it_is(db, capsys):
    assert main(_export(db, "--table", "gpu", "-o", "/dev/null")) == 0, capsys.readouterr().err
