"""An unexpected error met while watching a run is `serving.watch_error`, not `action.failed` (session 22).

It was told as `action.failed` (with `details.where`): an operator filtering the Events view for failed actions
read it as their own start or restart having failed, and one looking for the watch's troubles had no kind to ask
for. The watch still resumes and the run stays served.

An in-process supervisor serving the stand-in vLLM (a real process), the real history database; the watch's own
`check_log` made to fail once, the only stand-in (the real causes are bugs and the OS refusing a thread).
"""

from __future__ import annotations

import json

import pytest
from support.db import db_rows

from lynxtop.agent.serving.watch import RunWatch

pytestmark = pytest.mark.timeout(120)


async def test_a_watch_error_has_its_own_kind_and_the_run_stays_served(make_sup, store, h, monkeypatch):
    real = RunWatch.check_log
    failed: list[int] = []

    def check_log(self) -> None:
        if self._lc.state == "ready" and not failed:
            failed.append(1)
            raise RuntimeError("a bug in the watch")
        real(self)

    monkeypatch.setattr(RunWatch, "check_log", check_log)
    sup = make_sup()
    await sup.start("alpha", by="test")
    try:
        await h.wait_for(lambda: failed, 30, what="the watch's error")

        def kinds() -> list[tuple[str, dict]]:
            assert store.flush(10)
            return [(r["kind"], json.loads(r["details"]) if r["details"] else {})
                    for r in db_rows(store.path, "SELECT kind, details FROM events ORDER BY id")]

        await h.wait_for(lambda: any(k == "serving.watch_error" for k, _ in kinds()), 30, what="the event")
        found = [d for k, d in kinds() if k == "serving.watch_error"]
        assert found[0]["where"] == "run watch" and "a bug in the watch" in found[0]["error"]
        assert not [k for k, _ in kinds() if k == "action.failed"]
        assert sup.state == "ready"
    finally:
        await sup.shutdown(stop_serving=True)
