"""The demo's own state directory leaves room for a run's temporary directory under it.

A run gets `<database dir>/run-tmp/<8 hex>` as TMPDIR, at most `runtmp.MAX_LEN` bytes (room for unix-socket paths
under it); the demo's `mkdtemp(prefix="lynxtop-demo-")` in /tmp made it 43, so every demo start's
`serving.starting` event said the run "keeps the agent's own temporary directory: ... would be 43 bytes": an
alarming line in the first thing a new user reads.
"""

from __future__ import annotations

import os
import shutil
import tempfile

from lynxtop.agent.serving import runtmp
from lynxtop.cli.demo import make_temp_root


def test_the_demos_temp_root_in_tmp_fits_a_runs_temp_dir(monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", "/tmp")
    root = make_temp_root()
    try:
        path, why = runtmp.make(runtmp.root_for(root / "lynxtop.db"), "0123abcd")
        assert why is None, why
        assert path is not None and os.path.isdir(path)
        assert len(os.fsencode(path)) <= runtmp.MAX_LEN
    finally:
        shutil.rmtree(root)
