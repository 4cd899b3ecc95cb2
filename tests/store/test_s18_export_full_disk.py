"""`lynxtop export` on a full disk leaves nothing half-made (session 18).

`export --table all -o DIR` created DIR and then failed at its first file: an empty DIR was left behind (or, with
space for some tables only, some of the files: with --force the old ones already replaced). Now every file is
written aside and put in place only when all are complete; on any failure what the export created is removed,
nothing that existed before is touched, and one line names the path and the error (exit 1, no traceback).
Real small tmpfs (root only: support/small_fs.py), filled to the last byte.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from support.small_fs import fill, mounted

from lynxtop.__main__ import main
from lynxtop.contract.events import Event, EventKind
from lynxtop.store.writer import StoreWriter

from .helpers import T0, submit

PAGE = 4096
FILES = ["events.csv", "gpu.csv", "host.csv", "runs.csv", "serving.csv"]


@pytest.fixture
def db(tmp_path) -> Path:
    """A database (on the ordinary disk) whose gpu.csv is some pages long and every other table has rows."""
    path = tmp_path / "h.db"
    with StoreWriter(path, queue_max=5000) as w:
        rid = w.create_run(profile="p", model="m", started_ms=T0, ended_ms=T0 + 120_000, exit_code=0)
        submit(w, 120, gpus=2, run_id=rid)
        w.record(Event(EventKind.SERVING_READY, "info", "ready", run_id=rid, ts_ms=T0 + 1000))
    return path


@pytest.fixture
def small_fs(tmp_path):
    with mounted(tmp_path / "small", "2m") as mnt:
        yield mnt


def _export(db: Path, out: Path, *more: str) -> list[str]:
    return ["export", "--database", str(db), "--from", str(T0), "--to", str(T0 + 200_000), "--table", "all",
            "-o", str(out), *more]


def _one_error_line(err: str, path_part: str) -> None:
    lines = [ln for ln in err.splitlines() if ln.startswith("lynxtop export:")]
    assert len(lines) == 1, err
    assert path_part in lines[0] and "No space left on device" in lines[0], err
    assert "Traceback" not in err, err


def _free_pages(filler: Path, pages: int) -> None:
    """Give back `pages` pages of the full file system (tmpfs counts whole pages)."""
    os.truncate(filler, max(0, filler.stat().st_size - pages * PAGE))


@pytest.mark.timeout(120)
def test_export_all_to_a_new_dir_on_a_full_disk_leaves_no_dir(db, small_fs, capsys):
    filler = fill(small_fs)
    out = small_fs / "exports" / "run3"  # its parent is made too (and removed again)
    assert main(_export(db, out)) == 1
    _one_error_line(capsys.readouterr().err, str(out))
    assert sorted(p.name for p in small_fs.iterdir()) == ["filler"]  # no DIR, no parent, no temporary sibling
    filler.unlink()
    assert main(_export(db, out)) == 0  # with space: every file, nothing aside
    assert sorted(p.name for p in out.iterdir()) == FILES
    assert [p.name for p in small_fs.iterdir()] == ["exports"] and [p.name for p in out.parent.iterdir()] == ["run3"]


@pytest.mark.timeout(120)
def test_export_all_into_an_existing_dir_fails_whole_and_keeps_old_files(db, small_fs, tmp_path, capsys):
    ref = tmp_path / "ref"
    assert main(_export(db, ref)) == 0
    gpu_pages = -(-(ref / "gpu.csv").stat().st_size // PAGE)
    assert gpu_pages >= 3 and all((ref / f).stat().st_size > 0 for f in FILES)
    capsys.readouterr()

    out = small_fs / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    (out / "gpu.csv").write_text("old export")  # replaced only with --force, and only by a complete export
    filler = fill(small_fs)
    _free_pages(filler, gpu_pages)  # room for the new gpu.csv, not for the tables after it
    assert main(_export(db, out, "--force")) == 1
    _one_error_line(capsys.readouterr().err, str(out))
    assert sorted(p.name for p in out.iterdir()) == ["gpu.csv", "notes.txt"]  # no new file, no temporary one
    assert (out / "gpu.csv").read_text() == "old export" and (out / "notes.txt").read_text() == "mine"

    filler.unlink()
    assert main(_export(db, out, "--force")) == 0
    assert sorted(p.name for p in out.iterdir()) == sorted([*FILES, "notes.txt"])
    for f in FILES:
        assert (out / f).read_bytes() == (ref / f).read_bytes(), f


@pytest.mark.timeout(120)
def test_export_to_one_file_on_a_full_disk_leaves_nothing(db, small_fs, capsys):
    filler = fill(small_fs)
    out = small_fs / "gpu.csv"
    args = ["export", "--database", str(db), "--from", str(T0), "--to", str(T0 + 200_000), "-o", str(out)]
    assert main(args) == 1
    _one_error_line(capsys.readouterr().err, str(out))
    assert sorted(p.name for p in small_fs.iterdir()) == ["filler"]
    _free_pages(filler, 2)
    out.write_text("old")  # one page; the other is room for a start, not for the whole file
    assert main([*args, "--force"]) == 1
    _one_error_line(capsys.readouterr().err, str(out))
    assert out.read_text() == "old" and sorted(p.name for p in small_fs.iterdir()) == ["filler", "gpu.csv"]


@pytest.mark.timeout(120)
def test_export_to_stdout_on_a_full_disk_says_so_once(db, small_fs):
    """`> file` on a full disk: the shell made the file (export cannot remove it); one line, exit 1."""
    fill(small_fs)
    with open(small_fs / "shell.csv", "w") as out:
        r = subprocess.run([sys.executable, "-m", "lynxtop", "export", "--database", str(db), "--from", str(T0),
                            "--to", str(T0 + 200_000)], stdout=out, stderr=subprocess.PIPE, text=True, timeout=60)
    assert r.returncode == 1, r.stderr
    assert r.stderr == "lynxtop export: cannot write to stdout: No space left on device\n", r.stderr
