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
else (a new or vanished series, lines reordered, a changed TYPE line, a value that is no reading, below 0 or not a plain
number) takes the full parse and is learnt from. A family's part equal to the one last read at its place was
checked and read then: its values are taken as they were (the same text reads the same), so a server whose
families stand still costs a compare per family (tests/agent/io/test_io_layout.py, random page sequences).
"""

from __future__ import annotations

import math
from itertools import accumulate, chain
from typing import Any

from lynxtop.agent.metrics import page as _page
from lynxtop.agent.metrics.families import TYPED_FAMILIES
from lynxtop.agent.metrics.page import HUGE, MAX_BUCKETS, ParsedPage, parse_text, picker

LEARN_WAIT_MAX = 63  # pages read by the full parse, at most, between two learnings of a layout never met again
_MARK = "\n# TYPE "  # where the full parse's search finds a TYPE line (page.py `_TYPE_LINE`)


def _type_starts(text: str, most: int) -> list[int] | None:
    """Where each part of the page starts, as `text.split(_MARK)` cuts it: 0, then after each TYPE line's mark;
    None past `most` "#" (the walk is a Python step per "#": a page of them takes the full parse instead)."""
    starts = [0]
    find, at = text.find, text.startswith
    i = 0
    while (i := find("#", i + 1)) > 0:  # the page starts with "#": no mark there (none before it)
        most -= 1
        if most < 0:
            return None
        if at(_MARK, i - 1):  # marks never overlap (one newline each): the split's cuts, in order
            starts.append(i - 1 + len(_MARK))
    return starts


def _spec(lines: list[str], counts: list[int], wanted: set[int], first: int, series: list[str]) -> tuple[Any, ...]:
    """How `PageLayout._read` reads `lines` (parts of `counts` lines; `wanted` the sample lines, numbered from
    `first`, with their `series`): the other lines' starts up to their last space, those without one exactly."""
    ix = range(len(lines))
    checked = [i for i in ix if " " in lines[i] and i + first not in wanted]
    exact = [i for i in ix if " " not in lines[i]]
    return (counts, picker(checked), [lines[i][:lines[i].rfind(" ") + 1] for i in checked], picker(exact),
            picker(exact)(lines), picker([i for i in ix if i + first in wanted]), series, sum(map(len, series)),
            picker([i for i in ix if i + first not in wanted]))


class PageLayout:
    """The last page's layout (none before a page is read); `parse` reads a page through it when it matches."""

    __slots__ = ("_skip", "_wait", "_chunks", "_hashes", "_heads", "_pick_bounds", "_all", "_parts", "_size",
                 "_sizes", "_cuts", "_last_texts", "_last_values", "_last_totals", "_plan", "parts_read")

    def __init__(self) -> None:
        self._skip = 0  # full parses left before the next page is learnt from
        self._wait = 0  # what `_skip` starts at after the next learning: grows while what is learnt is not met
        self._chunks = -1  # the page's parts, one per TYPE line and the part before the first (-1: none learnt)
        self.parts_read = 0  # family parts split and read by position (one equal to its last read is not)

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

        The TYPE lines are found by a `find("#")` walk (memchr: the full parse's search for "\n# TYPE " is a C
        loop per character, 0.2 ms of a DP8 page) and compared; only the parts of the families we read are read
        (`_read_part`), and a part equal to the one last read there (one memcmp: an idle engine's histograms, a
        gauge that did not move) is not even split: its values are those read then, checked then."""
        if self._chunks < 0 or not text.startswith("#"):
            return None
        starts = _type_starts(text, self._hashes)
        if starts is None or len(starts) != self._chunks or not all(map(text.startswith, self._heads, starts)):
            return None
        ends = starts[1:]
        ends.append(len(text) + len(_MARK))
        texts = [text[a:b - len(_MARK)] for a, b in self._pick_bounds(list(zip(starts, ends, strict=True)))]
        last, kept = self._last_texts, self._last_values
        moved = [j for j, (new, old) in enumerate(zip(texts, last, strict=True)) if new != old]  # memcmp each
        if not moved and self._last_totals is not None:
            return self._last_totals  # every part as last read (an idle server): the same values, the same sums
        self._last_totals = None  # parts below may be kept before a later one fails: those sums are gone
        if 2 * sum(self._sizes[j] for j in moved) > self._size:  # most values moved: one pass over all parts
            values = self._read(self._all, texts)
            if values is None:
                return None
            self._last_texts, self._last_values = texts, [values[a:b] for a, b in self._cuts]
        else:  # only the parts that moved are split and read; the others' values are those read then
            for j in moved:
                vals = self._read(self._parts[j], [texts[j]])
                if vals is None:
                    return None
                last[j], kept[j] = texts[j], vals
            values = list(chain.from_iterable(kept))
        self.parts_read += len(moved)
        t = self._plan.totals(values)
        t.refused = []
        self._last_totals = t
        return t

    @staticmethod
    def _read(spec: tuple[Any, ...], texts: list[str]) -> list[float] | None:
        """The values of family parts laid out as learnt (`spec`: one part's or all of them), or None where they
        are not so laid out or a value is no plain reading: each line starts with what it did; each wanted line's
        value is its rest after the series, and that every line had its series is checked by one length over all
        of them, not one check per line."""
        counts, pick_checked, starts, pick_exact, exact, pick_wanted, series, series_chars, pick_other = spec
        parts = [part.split("\n") for part in texts]
        if list(map(len, parts)) != counts:  # each line where it was: a TYPE line's rest stays one
            return None
        lines = parts[0] if len(parts) == 1 else list(chain.from_iterable(parts))
        if not all(map(str.startswith, pick_checked(lines), starts)):
            return None
        if exact and pick_exact(lines) != exact:
            return None
        vals = list(map(str.removeprefix, pick_wanted(lines), series))  # each value, if it had its series
        joined = "".join(vals)
        # the wanted lines' characters: the parts' less their newlines and the other lines'; a line that did not
        # start with its series kept it, and the values would be longer than that less the series
        chars = sum(map(len, texts)) - len(lines) + len(parts)
        if len(joined) != chars - sum(map(len, pick_other(lines))) - series_chars:
            return None
        if "_" in joined or " " in joined:  # not Prometheus' number, or not the plain `series value` form
            return None
        # A loaded DP8 page writes its 1,424 values in ~110 strings (0.0 and small counts): each distinct string is
        # read and checked once, every value then looked up (the same string reads the same float)
        distinct = set(vals)
        try:
            floats = dict(zip(distinct, map(float, distinct), strict=True))
        except ValueError:
            return None
        read = floats.values()
        # NaN and infinities carry into the sum; below HUGE it bounds each value (a larger sum: check one by one).
        # A value below 0 (a negative count is no reading, a negative gauge is not): the full parse tells them apart
        if min(read, default=0.0) < 0.0 or not sum(map(abs, read)) < HUGE and (
                any(map(math.isnan, read)) or not (min(read) > -HUGE and max(read) < HUGE)):
            return None  # no reading: the full parse counts it
        return list(map(floats.__getitem__, vals))

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
        series = [k + " " for k in keys]
        parts: list[tuple[Any, ...]] = []
        sizes: list[int] = []
        first = done = 0
        for count in counts:  # each part's own spec: its lines' indices within it
            own = sum(1 for i in range(first, first + count) if i in is_wanted)
            parts.append(_spec(lines[first:first + count], [count], is_wanted, first, series[done:done + own]))
            sizes.append(own)
            first += count
            done += own
        cuts = [0, *accumulate(sizes)]
        self._all = _spec(lines, counts, is_wanted, 0, series)
        self._size, self._sizes, self._cuts = len(series), sizes, list(zip(cuts, cuts[1:], strict=False))
        self._hashes = 2 * text.count("#") + 64  # "#" in label values may come and go; far more: the full parse
        self._heads = tuple(heads)
        self._pick_bounds = picker(picked)
        self._parts = parts
        self._last_texts: list[str | None] = [None] * len(parts)  # each part as last read, and its values
        self._last_values: list[list[float]] = [[] for _ in parts]
        self._last_totals: Any = None  # the sums of the last page read by position (read, never changed, by _page_of)
        self._plan = plan
        self._chunks = len(chunks)
