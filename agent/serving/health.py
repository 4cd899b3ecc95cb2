"""Is the served engine healthy: hang detection from the scraped counters and the `/health` probe.

Both turn raw readings into a `Verdict` (hung, unhealthy, or healthy again) and leave the consequences to the
supervisor, which only marks the run degraded, clears it, or restarts it. Every GET the agent makes to vLLM goes
through one `HttpClient` (one aiohttp session, one connection pool): the scrape, the readiness and `/health`
probes and `/version`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import statistics
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import aiohttp

from lynxtop.agent.coalesce import Recurring

PROBE_TIMEOUT_S = 3.0
GAPS_KEPT = 8  # gaps between readings the hang detector learns its usual one from
# What vLLM answers to /version ({"version": "0.11.0"}) and /health (empty) is a few bytes; a body past this is
# not read at all (docs/sampling.md, Caps): a 20 MB /version once ended up in the run, its event and every status.
MAX_BODY_BYTES = 64 * 1024
MAX_VERSION_CHARS = 128  # "0.11.1rc2.dev123+g0123abcd.cu128" is 32
_REFUSAL_QUIET_S = 60.0  # a body over the cap is told once per episode (agent/coalesce.py)


async def read_capped(resp: aiohttp.ClientResponse, limit: int = MAX_BODY_BYTES) -> bytes | None:
    """The body of an answer, or None when it is (or announces itself) larger than `limit` bytes."""
    if (resp.content_length or 0) > limit:
        return None
    chunks: list[bytes] = []
    size = 0
    async for chunk in resp.content.iter_chunked(1 << 14):
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
    return b"".join(chunks)


def version_of(body: Any) -> str | None:
    """vLLM's version from a /version answer: a short printable string, or None (nothing else is kept)."""
    version = body.get("version") if isinstance(body, dict) else None
    if not isinstance(version, str) or not version or len(version) > MAX_VERSION_CHARS or not version.isprintable():
        return None
    return version


class HttpClient:
    """The agent's one HTTP session to the served engine, opened on first use (it needs the running loop).

    Bodies are read up to MAX_BODY_BYTES; a larger one is refused, and `drain_events` gives one
    `scrape.over_limit` event per episode of such answers (the scrape source records them with its own)."""

    def __init__(self) -> None:
        self._session: aiohttp.ClientSession | None = None
        # when the scrape last saw the served engine move (monotonic; agent/sampling.py): a /health silent that
        # long is judged frozen only if the engine stands still too (HealthProbe)
        self.engine_moved_at: float | None = None
        # since when the scrape has read the engine idle (no request running or waiting, no token; monotonic), None
        # while it works or before any reading: the idle probe (idleprobe.py) asks an engine idle that long
        self.engine_idle_since: float | None = None
        # resumes of the agent after a pause (SIGSTOP, a VM pause), told by the scrape (ScrapeSource.resumed): the
        # /health probe's silence over one was never observed (HealthProbe._unwatched)
        self.resumes = 0
        self._refusals: dict[str, Recurring] = {}  # per path (/version, /health)
        self._events: list[dict[str, Any]] = []

    def session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession()
        return self._session

    async def get(self, url: str, timeout_s: float = PROBE_TIMEOUT_S) -> tuple[int | None, Any]:
        """(HTTP status, JSON body or None); (None, None) when nothing answered in time."""
        try:
            async with self.session().get(url, timeout=aiohttp.ClientTimeout(total=timeout_s)) as resp:
                body: Any = None
                if resp.content_type == "application/json":
                    raw = await read_capped(resp)
                    if raw is None:
                        self._refused(url)
                    else:
                        with contextlib.suppress(ValueError):
                            body = json.loads(raw)
                return resp.status, body
        except (TimeoutError, aiohttp.ClientError, OSError):
            return None, None

    def _refused(self, url: str) -> None:
        path = "/" + url.split("://", 1)[-1].partition("/")[2]
        ep = self._refusals.setdefault(path, Recurring(_REFUSAL_QUIET_S))
        now = time.monotonic()
        for other in self._refusals.values():
            other.close(now)
        if ep.hit(now):
            self._events.append({"kind": "scrape.over_limit", "severity": "warning",
                                 "message": f"GET {path} answered more than {MAX_BODY_BYTES} bytes: not read "
                                            "(docs/sampling.md, Caps); told once while it goes on",
                                 "details": {"url": url, "limit_bytes": MAX_BODY_BYTES}})

    def drain_events(self) -> list[dict[str, Any]]:
        """Events of refused answers since the last call (event dicts: kind, severity, message, details)."""
        out, self._events = self._events, []
        return out

    @property
    def closed(self) -> bool:
        return self._session is None or self._session.closed

    async def close(self) -> None:
        if self._session is not None and not self._session.closed:
            await self._session.close()


class Health(StrEnum):
    HUNG = "hung"
    PROGRESSING = "progressing"  # tokens flow again (or nothing is asked): a hang is over
    UNHEALTHY = "unhealthy"
    HEALTHY = "healthy"


@dataclass(frozen=True)
class Verdict:
    health: Health
    reason: str
    unanswered: bool = False  # about `GET /health` giving no answer at all, not the engine's counters
    repeat: bool = False  # the probe's last finding again, only re-counted: nothing new to tell
    at: float | None = None  # when the probe judged it (its clock): a "health" episode settles on it

    @property
    def condition(self) -> str:
        """What the verdict is about: "hang" (the engine's counters stand still), "unresponsive" (`GET /health`
        unanswered for hang_timeout_s) or "health" (`GET /health` failing).

        Each condition is ended only by its own source: with several API servers (api_server_count > 1) a wedged
        one leaves /health silent while another serves an idle /metrics page, which once "recovered" the silence.
        """
        if self.unanswered:
            return "unresponsive"
        return "hang" if self.health in (Health.HUNG, Health.PROGRESSING) else "health"

    @property
    def bad(self) -> bool:
        return self.health in (Health.HUNG, Health.UNHEALTHY)


# Per-scrape counts in the tick's serving row (agent/metrics/windows.py): any of them above 0 is work done.
_WORK_DONE = (("generation_tokens", "tokens generated"), ("prompt_tokens", "prompt tokens"),
              ("requests_finished", "requests finishing"), ("preemptions", "preemptions"))


class HangDetector:
    """A run whose requests wait or run while the engine shows no sign of moving for `timeout_s` is hung.

    Fed with the scraper's readings every scrape of one run (a new run gets a new detector). Requests that only
    wait (none running) count too: an engine hung before it scheduled them shows 0 running and N waiting. Not
    those vLLM defers (`waiting_by_reason{reason="deferred"}`, 0.12+): they wait on something outside the engine
    (a prefill node's KV for a decode instance, a grammar compiling, a LoRA budget), and a healthy server holding
    one was taken for hung (and restarted, with restart_on_hang). They are read per engine (`deferred` of
    `engines`); a page without that family counts every waiting request, as before.

    Any sign that the engine moves is progress, not only a generated token: vLLM v1 counts a request's prompt and
    generation tokens only once its prefill produced the first token, so one long (chunked) prefill showed
    "1 running, no token" for minutes and was taken for a hang (a restart with restart_on_hang). While it
    prefills, the scheduler's gauges move (KV cache usage grows chunk by chunk; requests go from waiting to
    running); a hung engine (an NCCL deadlock) publishes no new scheduler stats, so all of them stand still.
    """

    def __init__(self, timeout_s: float, slack_s: float | None = None):
        """With `slack_s` (the scrape's timeout), a gap between two readings longer than twice the usual one (the
        low median of the last GAPS_KEPT) plus `slack_s` is time the agent did not watch (it was stopped, the VM
        paused: CLOCK_MONOTONIC jumps on resume) and counts nothing: the first page after a 2-minute pause read
        "no token for 121 s" and restarted a busy server. Learned, not configured: the cadence is the scrape
        interval or the sample interval (0.1 to 60 s), and a lasting slowdown becomes the usual gap in a few."""
        self.timeout_s = timeout_s
        self.slack_s = slack_s
        self._gaps: deque[float] = deque(maxlen=GAPS_KEPT)
        self.hung = False
        self.moved_at: float | None = None  # when the engine last showed it moves (not idle, not a first reading)
        # since when the readings show nothing asked and nothing moving (None: work, or no reading yet); a failed
        # reading keeps it. An idle page is all a hang in the first step after an idle spell shows (idleprobe.py)
        self.idle_since: float | None = None
        self._last_tokens: float | None = None
        self._stalled = 0.0  # stall time observed since the last progress, failed readings not counted
        self._last_seen: float | None = None  # the last reading, None after a failed one (a pause)
        self._last_gauges: tuple[Any, ...] | None = None
        # resumes told (`resumed`, from the watchdog's thread) and how many the last reading had seen: a count, not
        # a reset of _last_seen, which the loop's reading in progress could overwrite and so lose the resume
        self._resumes = 0
        self._resumes_seen = 0
        self.resumed_at: float | None = None  # when the last resume was found (monotonic)

    def _watched(self, gap: float) -> bool:
        """Whether a gap between two readings was watched (see __init__); every gap joins the usual ones after."""
        usual = statistics.median_low(self._gaps) if self._gaps else None
        self._gaps.append(gap)
        return self.slack_s is None or usual is None or gap <= 2 * usual + self.slack_s

    def resumed(self, now: float) -> None:
        """The agent was stopped and runs again: the time until the next reading was not watched.

        Told by the watchdog thread (agent/notify.py, through the ticker) when it wakes far later than it asked:
        the gap from the reading before the pause to the one after it counts nothing, even one the learned-gap
        rule would take as watched (a pause shorter than twice the usual gap plus the slack, which with slow
        scrapes and a short hang_timeout_s was judged a hang and restarted a busy server). Safe from any thread.
        """
        self.resumed_at = now
        self._resumes += 1  # one writer (the watchdog thread): no lost update

    def observe(self, running: float | None, tokens_total: float | None, waiting: float | None = None,
                now: float | None = None, *, row: Mapping[str, Any] | None = None,
                engines: Sequence[Mapping[str, Any]] = ()) -> Verdict | None:
        """`row`: the scrape's serving row (per-scrape counts, KV cache usage); `engines`: the per-engine load of
        a data-parallel server (a prefill on one engine moves its KV cache, not the busiest engine's), with each
        engine's deferred requests where the page has them."""
        if running is None or tokens_total is None:
            # a gap in the readings (/metrics down, a page cut off) pauses the clock: it neither adds stall time
            # (the first request after a long idle outage is not hung at once) nor erases the stall observed
            # before (scrapes cut off now and then must not keep a real hang from ever being judged)
            self._last_seen = None
            return None
        now = time.monotonic() if now is None else now
        seen, self._last_seen = self._last_seen, now
        resumes = self._resumes
        if resumes != self._resumes_seen:
            seen = None  # the agent was stopped since the last reading: the gap was not watched
        self._resumes_seen = resumes
        gap = None if seen is None else now - seen
        watched = gap is not None and self._watched(gap)  # learned from every reading, progress or not
        deferred = _deferred(engines)
        pending = running + max((waiting or 0) - deferred, 0)  # what should move: running, or waiting for room
        gauges = _gauges(running, waiting, row, engines)
        moved = _moved(row, gauges, self._last_gauges)
        self._last_gauges = gauges
        tokens_moved = self._last_tokens is not None and tokens_total != self._last_tokens
        if tokens_moved or moved is not None:
            self.moved_at = now
        if running > 0 or (waiting or 0) > 0 or tokens_moved or moved is not None:  # deferred ones count here
            self.idle_since = None
        elif self.idle_since is None:
            self.idle_since = now
        if self._last_tokens is None or tokens_moved or moved is not None or pending <= 0:
            self._last_tokens, self._stalled = tokens_total, 0.0
            self.hung = False
            if moved is None or tokens_moved:
                return Verdict(Health.PROGRESSING, "tokens are being generated again")
            return Verdict(Health.PROGRESSING, f"the engine is moving again ({moved})")
        if watched and gap is not None:
            self._stalled += max(gap, 0.0)
        stalled = self._stalled
        if stalled < self.timeout_s or self.hung:
            return None
        self.hung = True
        what = (f"{running:g} requests running" + (f", {waiting:g} waiting" if waiting else "")
                + (f" ({deferred:g} deferred)" if deferred else ""))
        return Verdict(Health.HUNG, f"hang: {what} and no token generated for {stalled:.0f} s")


def _deferred(engines: Sequence[Mapping[str, Any]]) -> float:
    """The waiting requests vLLM defers, engine by engine: at most that engine's waiting ones (one engine's odd
    reading never hides another's queue), none where an engine has no such reading (a page before 0.12)."""
    total = 0.0
    for e in engines:
        d, w = e.get("deferred"), e.get("waiting")
        if isinstance(d, int | float) and isinstance(w, int | float) and d > 0 and w > 0:  # NaN fails both
            total += min(d, w)
    return total


def _gauges(running: float, waiting: float | None, row: Mapping[str, Any] | None,
            engines: Sequence[Mapping[str, Any]]) -> tuple[Any, ...]:
    """What the scheduler last published: request counts and KV cache usage, the node's and each engine's."""
    per_engine = tuple(sorted(((str(e.get("engine")), e.get("running"), e.get("waiting"), e.get("deferred"),
                                e.get("kv_cache_usage_pct")) for e in engines), key=lambda x: x[0]))
    kv = row.get("kv_cache_usage_pct") if row is not None else None
    return running, waiting, kv, per_engine


def _moved(row: Mapping[str, Any] | None, gauges: tuple[Any, ...], before: tuple[Any, ...] | None) -> str | None:
    """What shows the engine moved since the last scrape (work counted, or the scheduler's gauges changed)."""
    for key, words in _WORK_DONE:
        value = row.get(key) if row is not None else None
        if isinstance(value, int | float) and value > 0:
            return words
    if before is None or gauges == before:
        return None
    if gauges[:2] != before[:2]:
        return "request counts change"
    return "KV cache usage changes" if gauges[2] != before[2] else "an engine's load changes"


# one wording for a probe still waiting past PROBE_TIMEOUT_S and a 200 that came that late: a busy server gives
# both in turn, and a reason that changes at each probe is logged at each probe (lifecycle.py, `repeat`)
_SLOW = f"slow to answer: no answer within {PROBE_TIMEOUT_S:g} s"
# Intermittent failures: a /health failing every other probe never failed `fail_threshold` times in a row and was
# never told (audit s22). Half of the last INTERMITTENT_WINDOW probes failing is "health" degraded too: half the
# answers failing is as bad for clients as an outage, while one blip or a few scattered ones (up to 5 of 12) never
# is. The window is at least 4 x fail_threshold probes (12 at the default 3), so an operator's larger allowance for
# failures in a row widens it too rather than being undercut by it.
INTERMITTENT_WINDOW = 12


def intermittent_window(fail_threshold: int) -> tuple[int, int]:
    """(probes in the window, failed ones among them that make /health degraded) for `fail_threshold`."""
    size = max(INTERMITTENT_WINDOW, 4 * fail_threshold)
    return size, size // 2


class HealthProbe:
    """`GET /health` of one run: unhealthy after `fail_threshold` failures in a row, or when half the probes of
    the window failed (`intermittent_window`: "failing intermittently"); healthy on a 200 in time (when that ends
    the "health" condition is the supervisor's call: health_episode.py holds a flapping /health as one episode).

    With `hang_timeout_s`, a server that gives no answer at all for that long is hung too ("unresponsive"): a
    frozen server (SIGSTOP, a wedged API process) generates no token, but its counters cannot be read either, so
    the counters' hang clock never ran and `restart_on_hang` did nothing for it. Only an answer ends it.

    A late answer is an answer: a busy API server (its event loop behind thousands of streams) may answer 200
    after more than PROBE_TIMEOUT_S, and abandoning each probe at 3 s took it for frozen and restarted a 20-minute
    load. One probe stays in flight up to hang_timeout_s; past PROBE_TIMEOUT_S it only counts as slow (the
    "health" condition: degraded, never restarted). Unresponsive is judged only when nothing answered for
    hang_timeout_s and the engine's counters do not move either (HttpClient.engine_moved_at, from the scrape).

    `period_s` is the caller's cadence: a gap between two probes longer than two periods plus PROBE_TIMEOUT_S is
    time the agent did not watch (it was stopped, the VM paused), and the silence is counted again from then.
    """

    def __init__(self, http: HttpClient, url: str, fail_threshold: int, hang_timeout_s: float | None = None,
                 clock: Callable[[], float] = time.monotonic, period_s: float | None = None):
        self.http = http
        self.url = url.rstrip("/") + "/health"
        self.fail_threshold = fail_threshold
        self.hang_timeout_s = hang_timeout_s
        self.clock = clock
        self.max_gap_s = None if period_s is None else 2 * period_s + PROBE_TIMEOUT_S
        self.fails = 0
        size, self._need = intermittent_window(fail_threshold)
        self._window: deque[bool] = deque(maxlen=size)  # the last probes: True for a failed one
        self.hung = False
        self.answered_at = clock()  # probing starts on a server that has just answered (it became ready)
        self._since = self.answered_at  # the engine's moves before this probe (another run's) say nothing
        self._failing: str | None = None  # how it failed in the last unhealthy verdict ("HTTP 500", "no answer")
        self._inflight: asyncio.Future[tuple[int | None, float, float]] | None = None
        self._last_call: float | None = None  # when the last probe() returned: a longer gap was not watched
        self._resumes_seen = getattr(http, "resumes", 0)

    async def ok(self) -> bool:
        """One probe that only says whether it answered 200 (readiness)."""
        status, _ = await self.http.get(self.url)
        return status == 200

    async def answered_200(self, cap_s: float) -> bool:
        """Whether the probe in flight (started if none is, kept up to `cap_s`) answered 200, waiting at most
        PROBE_TIMEOUT_S now: a late 200 counts (an adopted ready server that is only busy is not silent)."""
        res = await self._ask(cap_s)
        return res is not None and res[0] == 200

    async def _get(self, cap_s: float) -> tuple[int | None, float, float]:
        sent = self.clock()
        status, _ = await self.http.get(self.url, timeout_s=cap_s)
        return status, sent, self.clock()

    async def _ask(self, cap_s: float) -> tuple[int | None, float, float] | None:
        """(status, sent at, answered at) of the probe in flight once it ended, else None (still waiting after
        PROBE_TIMEOUT_S; it goes on, up to `cap_s`, and the next call takes its answer)."""
        if self._inflight is None:
            self._inflight = asyncio.ensure_future(self._get(cap_s))
        done, _ = await asyncio.wait({self._inflight}, timeout=PROBE_TIMEOUT_S)
        if not done:
            return None
        task, self._inflight = self._inflight, None
        return task.result()

    def close(self) -> None:
        """Abandons a probe in flight (the run is over, or the watch stops)."""
        if self._inflight is not None:
            self._inflight.cancel()
            self._inflight = None

    def _unwatched(self, now: float) -> None:
        """A gap since the last probe longer than the cadence allows: the agent was not running (SIGSTOP, a VM
        pause, a cgroup freeze), and the server's silence over it was never observed. Counted from now. So is a
        resume the watchdog found (HttpClient.resumes): a pause shorter than that gap but longer than
        hang_timeout_s read as a frozen server (a restart with restart_on_hang)."""
        resumes = getattr(self.http, "resumes", 0)
        told, self._resumes_seen = resumes != self._resumes_seen, resumes
        if told or (self._last_call is not None and self.max_gap_s is not None
                    and now - self._last_call > self.max_gap_s):
            self.answered_at = max(self.answered_at, now)

    async def probe(self) -> Verdict | None:
        self._unwatched(self.clock())
        cap = max(self.hang_timeout_s or 0.0, PROBE_TIMEOUT_S)
        res = await self._ask(cap)
        now = self.clock()
        self._unwatched(now)  # the wait itself may span a pause
        self._last_call = now
        if res is None:  # in flight past PROBE_TIMEOUT_S: slow so far, not yet silent
            status, late, what = None, True, _SLOW
        else:
            status, sent, at = res
            late = at - sent > PROBE_TIMEOUT_S
            what = ("no answer" if status is None else f"HTTP {status}" if status != 200
                    else _SLOW)
            if status is not None:
                self.answered_at = max(self.answered_at, at)
        ok = status == 200 and not late
        self._window.append(not ok)
        failed = sum(self._window)
        intermittent = failed >= self._need and not all(self._window)  # all failed: "in a row" says it better
        if ok:
            self.fails = 0
            if failed < self._need:  # not even intermittent now: the next failure is news
                self._failing = None
        else:
            self.fails += 1
        if status is not None and self.hung:  # any answer ends the silence; a failing one goes on as "health"
            self.hung = False
            code = "" if status == 200 else f" (HTTP {status})"
            return Verdict(Health.PROGRESSING, f"GET /health answers again{code}", unanswered=True)
        if ok:
            return Verdict(Health.HEALTHY, "GET /health answers 200 again", at=now)
        silent = now - self.answered_at
        if self.hang_timeout_s is not None and status is None and not self.hung and silent >= self.hang_timeout_s:
            moved_at = getattr(self.http, "engine_moved_at", None)
            if moved_at is not None and moved_at >= self._since and now - moved_at < self.hang_timeout_s:
                # the engine's counters move (tokens, KV usage): the server works, only its /health is silent
                what = "unanswered, while /metrics shows the engine moving"
            else:
                self.hung = True
                return Verdict(Health.HUNG, f"hang: GET /health unanswered for {silent:.0f} s (hang_timeout_s "
                                            f"{self.hang_timeout_s:g}): the server is frozen", unanswered=True)
        if intermittent:  # its count moves at every probe: the same finding while it stays intermittent
            repeat, self._failing = self._failing == "intermittent", "intermittent"
            return Verdict(Health.UNHEALTHY, f"GET /health failing intermittently: {failed} of the last "
                                             f"{len(self._window)} probes failed (last: {what})", repeat=repeat, at=now)
        if self.fails < self.fail_threshold:
            return None
        repeat, self._failing = what == self._failing, what  # the count alone changed: not news (no log line)
        return Verdict(Health.UNHEALTHY, f"GET /health failing ({what}, {self.fails} times in a row)", repeat=repeat,
                       at=now)
