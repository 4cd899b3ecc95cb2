"""Foreign traffic during a bench level: the server's own request counters on /metrics, read just before and
just after each level, against the requests bench itself sent.

A level's numbers are only the server's capacity when bench is its only client; another client's load makes
them look worse (and bench would not say so). vLLM counts every finished request in
`vllm:request_success_total` (each finished_reason, each engine) and shows those in flight in
`vllm:num_requests_running`: finished beyond bench's own, or running before bench sent anything, are someone
else's. A server without /metrics gives no count (None), never a guess.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from lynxtop.cli.bench_load import COUNT_LIMIT, LevelRun, metrics_page
from lynxtop.cli.bench_sweep import LevelHook

SUCCESS, RUNNING = "vllm:request_success_total", "vllm:num_requests_running"


def sample_value(line: str) -> float | None:
    """A sample line's value: the first field after the name and its labels (label values may hold spaces; a
    timestamp may follow the value); None when there is none that parses."""
    rest = line[line.rfind("}") + 1:] if "{" in line else line.partition(" ")[2]
    try:
        return float(rest.split()[0])
    except (IndexError, ValueError):
        return None


def request_counters(page: str) -> tuple[float, float] | None:
    """(finished requests, running requests) summed over labels and engines; None without the success counter,
    or when a value is no count (NaN, inf, negative, 2^63 or more): the counters are then absent, not a guess."""
    done = running = 0.0
    seen = False
    for line in page.splitlines():
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name not in (SUCCESS, RUNNING):
            continue
        value = sample_value(line)
        if value is None:
            continue
        if not math.isfinite(value) or not 0 <= value < COUNT_LIMIT:
            return None
        if name == SUCCESS:
            done, seen = done + value, True
        else:
            running += value
    if not (done < COUNT_LIMIT and running < COUNT_LIMIT):
        return None
    return (done, running) if seen else None


def foreign(before: tuple[float, float] | None, after: tuple[float, float] | None, sent: int) -> int | None:
    """Requests the server handled during the level that bench did not send (None: no counters to tell)."""
    if before is None or after is None:
        return None
    finished_extra = (after[0] - before[0]) - sent
    return int(max(0.0, finished_extra, before[1]))


def material(n: int | None, sent: int) -> bool:
    """Worth a warning: beyond one stray request and 2% of bench's own (a scrape racing a request's end)."""
    return n is not None and n > max(1, sent // 50)


class TrafficWatch(LevelHook):
    """Reads the counters around each level; sets the level's `foreign_requests` (None when unknown)."""

    def __init__(self, url: str, api_key: str | None = None):
        self.url, self.api_key = url, api_key
        self._before: tuple[float, float] | None = None

    async def _counters(self) -> tuple[float, float] | None:
        page = await metrics_page(self.url)
        return request_counters(page) if page is not None else None

    async def before(self) -> None:
        self._before = await self._counters()

    async def after(self, run: LevelRun, summary: dict[str, Any]) -> None:
        summary["foreign_requests"] = foreign(self._before, await self._counters(), len(run.results))


class Hooks(LevelHook):
    """Several hooks around each level, in order."""

    def __init__(self, hooks: Sequence[LevelHook]):
        self.hooks = list(hooks)

    async def before(self) -> None:
        for h in self.hooks:
            await h.before()

    async def after(self, run: LevelRun, summary: dict[str, Any]) -> None:
        for h in self.hooks:
            await h.after(run, summary)


def warnings(levels: Sequence[dict[str, Any]]) -> list[str]:
    """One line per level that saw material foreign traffic, for the table."""
    from lynxtop.cli.bench_view import level_label

    return [f"  {level_label(s)}: WARNING {s['foreign_requests']} request(s) from other clients hit the server "
            f"during this level; its numbers include their load" for s in levels
            if material(s.get("foreign_requests"), int(s.get("completed", 0)) + int(s.get("failed", 0)))]
