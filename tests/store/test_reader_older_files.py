"""A history database written by an older lynxtop, not yet opened by a newer agent (an archived copy, another
node's file), read by `lynxtop export` and the dashboard's history.

Readers open the file read-only, so the columns a newer contract added are not added to it (only the writer
does that): such a column reads as NULL everywhere, with the header and the rows' shape those of a current
file, never as a "cannot read the history database" error.
"""
from __future__ import annotations

import csv
import io
import shutil
import sqlite3

import pytest

from lynxtop.__main__ import main
from lynxtop.store import compact, schema
from lynxtop.store.reader import StoreReader
from lynxtop.store.writer import StoreWriter

from .helpers import T0, submit

NEWEST = schema.SAMPLE_TABLES["gpu"].metrics[-1][0]  # the contract's newest GPU metric, say
SPAN = (T0, T0 + 200_000)


def _v1(tmp_path):
    path = tmp_path / "old.db"
    schema.create_file(path)
    c = sqlite3.connect(path, isolation_level=None)
    schema.migrate(c, target=1)
    c.execute("INSERT INTO gpu_samples (ts_ms, gpu, util_gpu_pct) VALUES (?, 0, 42)", (T0,))
    c.execute("INSERT INTO runs (profile, started_ms, ended_ms) VALUES ('old', ?, ?)", (T0, T0 + 5000))
    c.close()
    return path


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """(current, older): the same history, the older file without NEWEST in its raw and rollup tables."""
    d = tmp_path_factory.mktemp("older")
    current, older = d / "current.db", d / "older.db"
    with StoreWriter(current) as w:
        submit(w, 200, gpus=2)  # 3 minutes rolled up, then a raw tail
    shutil.copy(current, older)
    c = sqlite3.connect(older, isolation_level=None)
    c.execute(f"ALTER TABLE gpu_samples DROP COLUMN {NEWEST}")
    for res in schema.RESOLUTIONS:
        for stat in ("min", "avg", "max", "n"):
            c.execute(f"ALTER TABLE {schema.rollup_table('gpu', res)} DROP COLUMN {NEWEST}_{stat}")
    c.close()
    return current, older


def _export(path, capsys, *extra) -> list[list[str]]:
    rc = main(["export", "--database", str(path), "--from", str(SPAN[0]), "--to", str(SPAN[1]), *extra])
    out, err = capsys.readouterr()
    assert rc == 0, err
    return list(csv.reader(io.StringIO(out)))


def _without(rows: list[list[str]]) -> tuple[list[list[str]], set[str]]:
    """The rows without NEWEST's columns (the metric, or its rollup stats), and the values those held."""
    drop = {i for i, name in enumerate(rows[0]) if name == NEWEST or name.startswith(f"{NEWEST}_")}
    assert drop
    return [[v for i, v in enumerate(r) if i not in drop] for r in rows], {r[i] for r in rows[1:] for i in drop}


def test_export_of_a_schema_1_database(tmp_path, capsys):
    rc = main(["export", "--database", str(_v1(tmp_path)), "--from", str(T0), "--to", str(T0 + 1000)])
    out, err = capsys.readouterr()
    assert rc == 0, err
    assert out.count("\n") == 2


@pytest.mark.parametrize("resolution", ["raw", "1m"])
def test_export_of_a_file_from_before_a_metric_was_added_exports_it_empty(files, capsys, resolution):
    current, older = files
    want = _export(current, capsys, "--resolution", resolution)
    got = _export(older, capsys, "--resolution", resolution)
    assert got[0] == want[0]  # the header of a current file
    assert len(got) == len(want) > 2 and all(len(r) == len(got[0]) for r in got)
    rest, values = _without(got)
    assert values == {""}  # not in the file: empty, as NULL
    assert rest == _without(want)[0]  # every other cell as exported from a current file


@pytest.mark.parametrize("resolution", ["raw", "1m", "1h"])
def test_history_series_of_a_file_from_before_a_metric_was_added(files, resolution):
    current, older = files
    with StoreReader(current) as r:
        want = r.series("gpu", None, *SPAN, resolution=resolution)[1]
    with StoreReader(older) as r:
        got = r.series("gpu", None, *SPAN, resolution=resolution)[1]  # every column: the dashboard's history
        some = r.series("gpu", ["util_gpu_pct"], *SPAN, resolution=resolution)[1]  # a column the file has
    assert len(got) == len(want) > 1 and len(some) == len(want)
    newest = [k for k in want[0] if k == NEWEST or k.startswith(f"{NEWEST}_")]
    assert newest
    for g, w in zip(got, want, strict=True):
        assert g.keys() == w.keys()
        assert all(g[k] is None for k in newest)
        assert {k: v for k, v in g.items() if k not in newest} == {k: v for k, v in w.items() if k not in newest}


def test_compacted_rows_of_a_file_from_before_a_metric_was_added(files, tmp_path, capsys):
    current, older = files
    for src in (current, older):  # both compacted as an older writer did it: chunks of the file's own columns
        shutil.copy(src, tmp_path / src.name)
        c = sqlite3.connect(tmp_path / src.name, isolation_level=None)
        assert compact.compact_interval(c, "gpu_samples", T0) == 400
        c.close()
    current, older = tmp_path / current.name, tmp_path / older.name
    want, got = _export(current, capsys), _export(older, capsys)
    assert got[0] == want[0] and len(got) == 401
    assert _without(got) == (_without(want)[0], {""})
    with StoreReader(older) as r:
        rows = r.series("gpu", None, *SPAN, resolution="raw")[1]
    assert len(rows) == 400 and all(row[NEWEST] is None for row in rows)


def test_a_column_a_writer_adds_later_is_read_without_reopening(files, tmp_path):
    path = tmp_path / "h.db"
    shutil.copy(files[1], path)
    with StoreReader(path) as r:
        assert r.series("gpu", None, *SPAN, resolution="raw")[1][0][NEWEST] is None
        c = sqlite3.connect(path, isolation_level=None)  # a newer agent opens the file: the column is added
        c.execute(f"ALTER TABLE gpu_samples ADD COLUMN {NEWEST} INTEGER")
        c.execute(f"UPDATE gpu_samples SET {NEWEST} = 1")
        c.close()
        assert r.series("gpu", None, *SPAN, resolution="raw")[1][0][NEWEST] == 1
