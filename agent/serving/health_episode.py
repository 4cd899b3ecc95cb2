"""The "health" condition of the current run (`GET /health` failing) as one episode, however much it flaps.

The probe (health.py) says at each 200 that /health answers again; taken at its word, a /health failing 3 probes
then answering one (probe every 1 s) ended and opened the condition at every flap: 1,800 events with the run's
log tail and 3,600 journal lines an hour (audit s22). As the scrape's outages do (agent/metrics/episodes.py,
ScrapeEpisodes), an episode ends only once /health has answered 200 in time for `settle_s`; a failure meanwhile is
a flap of the same episode, counted in its one closing event. The run stays degraded while it settles.

A steady failure (no 200 since it opened, for at least `settle_s`) that is not a recurrence (no episode of this
run ended within `recur_s` before it opened) still ends at its first 200, as before: a server that was down a
while and is back is back at once. A failure that keeps coming back after such ends never earns it again, so a
"down 40 s, up 1 s" /health is at most 3 events, not 2 per flap.

Only verdicts of the "health" condition go through here: "hang" and "unresponsive" keep their own ends, and a
"health" episode never restarts anything (policy.py restarts only a hang).
"""

from __future__ import annotations

import dataclasses
import time

from lynxtop.agent.serving.health import Verdict

SETTLE_S = 30.0  # 200s in time this long end an episode: 30 probes at the default health_poll_s of 1 s
RECUR_S = 600.0  # an episode opening this soon after the run's last one ended is a recurrence (no quick end)


class HealthEpisode:
    """Holds the "health" condition's episode of one run: `judge` passes a verdict on, or None while settling."""

    def __init__(self, settle_s: float = SETTLE_S, recur_s: float = RECUR_S):
        self.settle_s = settle_s
        self.recur_s = recur_s
        self._forget(None)

    def _forget(self, run_id: int | None) -> None:
        """Another run: nothing of the previous one's episodes counts."""
        self._run_id = run_id
        self.opened_at: float | None = None  # None: no episode open
        self.healthy_since: float | None = None  # the first 200 of the healthy stretch now under way
        self.flaps = 0  # times /health answered again and failed again within the open episode
        self._recurring = False  # the open episode began soon after the run's previous one ended
        self._closed_at: float | None = None  # when the run's last episode ended

    def judge(self, run_id: int | None, verdict: Verdict) -> Verdict | None:
        """The verdict to act on: a "health" one opens, counts or ends the episode; None holds a 200 that does not
        end it yet (the run stays degraded); any other condition's verdict passes unchanged."""
        if verdict.condition != "health":
            return verdict
        if run_id != self._run_id:
            self._forget(run_id)
        now = verdict.at if verdict.at is not None else time.monotonic()
        if verdict.bad:
            if self.opened_at is None:
                self.opened_at, self.flaps = now, 0
                self._recurring = self._closed_at is not None and now - self._closed_at < self.recur_s
            elif self.healthy_since is not None:
                self.flaps += 1
            self.healthy_since = None
            return verdict
        if self.opened_at is None:
            return verdict
        if self.healthy_since is None:
            self.healthy_since = now
        steady = not self.flaps and not self._recurring and self.healthy_since - self.opened_at >= self.settle_s
        held = now - self.healthy_since
        if not steady and held < self.settle_s:
            return None
        reason = f"{verdict.reason}: recovered after {now - self.opened_at:.0f} s"
        if not steady:
            reason += f" (200 in time for the last {held:.0f} s)"
        if self.flaps:
            reason += f"; it failed and answered again {self.flaps} times"
        self.opened_at, self.healthy_since, self._closed_at = None, None, now
        return dataclasses.replace(verdict, reason=reason)
