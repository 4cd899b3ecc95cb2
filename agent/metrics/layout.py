"""A server's page layout, remembered between scrapes: a page laid out as the last one is read by position.

vLLM's page has the same lines in the same order scrape after scrape; only the values change. `PageLayout`
(one per scraper) keeps where the last page's lines were: the TYPE lines (which families start where), what each
line of a family we read starts with up to its value, and which of them are the samples we use with the plan that
adds them up (agent/metrics/page.py's `_Plan`). A page that matches it exactly is read without the TYPE-line
search, the per-family selection or a Python step per line: a DP=8 page's parse 3.4 -> 2.2 ms, a whole scrape's
bookkeeping 5.0 -> 3.7 ms (minimum of 40 rounds of 40 pages on the shared 2-core machine, issue 29.3).

Invariant: the result is what `parse_text` gives for the same text, to the last digit. The match is exact, not
a guess: the same TYPE lines and no other, the same number of lines in each family we read, and each of those
lines starting with what it started with up to its last space (so it is selected, or not, as before: a wanted name
has no space but the one after it) or, without a space, equal to it (tests/agent/io/test_io_layout.py). Anything
else (a new or vanished series, lines reordered, a changed TYPE line, a value that is no reading or not a plain
number) takes the full parse and is learnt from.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Sequence
from itertools import chain
from typing import Any

from lynxtop.agent.metrics import page as _page
from lynxtop.agent.metrics.families import TYPED_FAMILIES
from lynxtop.agent.metrics.page import HUGE, MAX_BUCKETS, ParsedPage, parse_text

LEARN_WAIT_MAX = 63  # pages read by the full parse, at most, between two learnings of a layout never met again
_MARK = "\n# TYPE "  # where the full parse's search finds a TYPE line (page.py `_TYPE_LINE`)


def _picker(idx: list[int]) -> Callable[[Sequence[Any]], tuple[Any, ...]]:
    """The items at `idx` of a sequence, as a tuple, gathered in C (an empty tuple for none)."""
    if not idx:
        return lambda seq: ()
    if len(idx) == 1:
        i = idx[0]
        return lambda seq: (seq[i],)
    return operator.itemgetter(*idx)


class PageLayout:
    """The last page's layout (none before a page is read); `parse` reads a page through it when it matches."""

    __slots__ = ("_skip", "_wait", "_chunks", "_heads", "_pick_chunks", "_counts", "_pick_checked", "_starts",
                 "_pick_exact", "_exact", "_pick_wanted", "_series", "_series_chars", "_keys", "_plan")

    def __init__(self) -> None:
        self._skip = 0  # full parses left before the next page is learnt from
        self._wait = 0  # what `_skip` starts at after the next learning: grows while what is learnt is not met
        self._chunks = -1  # the page's parts, one per TYPE line and the part before the first (-1: none learnt)

    def parse(self, text: str) -> ParsedPage:
        """What `parse_text(text)` gives (PageError alike); a page laid out as the last is read by position."""
        t = self._known(text)
        if t is not None:
            self._skip = self._wait = 0
            return _page._page_of("\nvllm:" in text, t)
        page = parse_text(text)
        if self._skip:
            self._skip -= 1
        else:  # learning costs about a full parse: a server whose layout changes every scrape learns ever less often
            self._learn(text)
            self._skip, self._wait = self._wait, min(2 * self._wait + 1, LEARN_WAIT_MAX)
        return page

    def _known(self, text: str) -> Any:
        """The page's totals through the remembered plan, or None when it is not laid out exactly as learnt.

        One C split at the TYPE lines (the full parse's search finds the same ones), the TYPE lines compared,
        then only the parts of the families we read split into lines: each line starts with what it did."""
        if self._chunks < 0 or not text.startswith("#"):
            return None
        chunks = text.split(_MARK)
        if len(chunks) != self._chunks or not all(map(str.startswith, chunks, self._heads)):
            return None
        parts = [chunk.split("\n") for chunk in self._pick_chunks(chunks)]
        if list(map(len, parts)) != self._counts:  # each line where it was: a TYPE line's rest stays one
            return None
        lines = list(chain.from_iterable(parts))
        if not all(map(str.startswith, self._pick_checked(lines), self._starts)):
            return None
        if self._exact and self._pick_exact(lines) != self._exact:
            return None
        wanted = self._pick_wanted(lines)
        vals = list(map(str.removeprefix, wanted, self._series))  # each line's value, when it starts as before
        if sum(map(len, vals)) != sum(map(len, wanted)) - self._series_chars:  # one did not: it kept its length
            return None
        joined = "".join(vals)
        if "_" in joined or " " in joined:  # not Prometheus' number, or not the plain `series value` form
            return None
        try:
            values = list(map(float, vals))
        except ValueError:
            return None
        if any(map(math.isnan, values)) or not (min(values) > -HUGE and max(values) < HUGE):
            return None  # no reading: the full parse counts it
        t = self._plan.totals(self._keys, values)
        t.refused = []
        return t

    def _learn(self, text: str) -> None:
        """Remember the layout of a page `parse_text` just read, if its samples were added up by a plan."""
        self._chunks = -1
        if not text.startswith("#"):  # its first line would be a TYPE line to the full parse's search
            return
        chunks = text.split(_MARK)
        heads = [""]
        picked: list[int] = []
        counts: list[int] = []
        lines: list[str] = []
        wanted: list[int] = []
        keys: list[str] = []
        for n, chunk in enumerate(chunks):
            family = ""
            if n:
                head, newline, _ = chunk.partition("\n")
                if not newline:
                    return  # the page ends on a TYPE line: no layout worth a fast path
                heads.append(head + newline)
                family = head.partition(" ")[0]  # as the search reads it: up to a space or the line's end
                if family not in TYPED_FAMILIES:
                    continue  # a family we do not read: none of its lines is
            part = chunk.split("\n")
            picked.append(n)
            counts.append(len(part))
            prefixes = _page._prefixes(family)
            first = len(lines) + (1 if n else 0)  # a TYPE line's rest (a part's first line) is never a sample
            before = len(wanted)
            for i, line in enumerate(part[1:] if n else part, start=first):
                if line.startswith(prefixes):
                    if " " not in line:
                        return  # not the `series value` form: never planned
                    wanted.append(i)
                    keys.append(line.rpartition(" ")[0])
            if len(wanted) - before > MAX_BUCKETS:  # the full parse may have cut a wide histogram out
                return
            lines += part
        plan = _page._PLANS.get(tuple(keys))
        if plan is None:
            return  # not planned (a line the plan cannot take): every page of it takes the full parse
        is_wanted = set(wanted)
        checked = [i for i, line in enumerate(lines) if " " in line and i not in is_wanted]
        exact = [i for i, line in enumerate(lines) if " " not in line]
        self._heads = tuple(heads)
        self._pick_chunks, self._counts = _picker(picked), counts
        self._pick_checked = _picker(checked)
        self._starts = [lines[i][:lines[i].rfind(" ") + 1] for i in checked]
        self._pick_exact = _picker(exact)
        self._exact = self._pick_exact(lines)
        self._pick_wanted = _picker(wanted)
        self._series = [k + " " for k in keys]
        self._series_chars = sum(map(len, self._series))
        self._keys, self._plan = tuple(keys), plan
        self._chunks = len(chunks)
