"""An empty history database (the agent created the file, then stopped before making its tables): `lynxtop export`
says there is no history and exits 0, as `lynxtop runs` says there are no runs; never "no such table", which reads
like damage."""
from __future__ import annotations

import pytest

from lynxtop.__main__ import main


@pytest.mark.parametrize("extra", [[], ["--table", "runs"], ["--table", "events", "-o", "{dir}/events.csv"],
                                   ["--table", "all", "-o", "{dir}/out"]])
def test_export_of_an_empty_database_says_there_is_no_history(tmp_path, capsys, extra):
    db = tmp_path / "h.db"
    db.touch()
    assert main(["runs", "--database", str(db)]) == 0
    assert "no runs recorded" in capsys.readouterr().out
    extra = [a.format(dir=tmp_path) for a in extra]
    rc = main(["export", "--database", str(db), "--from", "-1h", *extra])
    out, err = capsys.readouterr()
    assert rc == 0, err
    assert "no history recorded yet" in err and "no such table" not in err
    assert out == ""
    assert not (tmp_path / "events.csv").exists() and not list(tmp_path.glob("out/*"))
