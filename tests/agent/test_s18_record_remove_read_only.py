"""serving.json on a file system that went read-only (ext4 remounts so after an I/O error): removing the record
when the run ends fails with EROFS, not ENOENT. That must not raise out of the run's end (the supervisor stayed in
`stopping` for good, its failure counting never ran): the run ends, the operator is told the stale record stays."""

from __future__ import annotations

import subprocess

from support.small_fs import mounted

from lynxtop.agent.serving.statefiles import ServerState
from lynxtop.contract.events import EventKind


def test_a_record_that_cannot_be_removed_is_told_not_raised(tmp_path):
    told = []
    with mounted(tmp_path / "small", "1m") as fs:
        path = fs / "serving.json"
        path.write_text("{}")
        missing = ServerState(fs / "other.json", lambda *a, **k: told.append((a, k)))
        state = ServerState(path, lambda *a, **k: told.append((a, k)))
        r = subprocess.run(["mount", "-o", "remount,ro", str(fs)], capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        try:
            missing.remove()  # none there: nothing to tell, even where unlink says EROFS
            assert told == []
            state.remove()  # raised OSError(EROFS) before
            assert path.exists()
            assert len(told) == 1, told
            (kind, _sev, message), details = told[0]
            assert kind == EventKind.AGENT_STATE_FILE and str(path) in message and "stale" in message, told
            assert "Read-only" in message and details.get("path") == str(path), told
        finally:
            subprocess.run(["mount", "-o", "remount,rw", str(fs)], capture_output=True)
