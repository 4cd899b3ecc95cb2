"""A page laid out as the last one is read by position (agent/metrics/layout.py): always what the full parse gives.

Each page of a sequence (values moved; a series appearing, vanishing, lines reordered, a TYPE line changed, a
line moved between families, a value that is no reading, ...) is read through one `PageLayout` and compared with
`parse_text` of the same text, field by field, and with prometheus_client's reading (the reference).
"""

from __future__ import annotations

import operator
import random
import re
import sys
from functools import reduce

import pytest
from support.vllm_pages import sim_page
from test_io_promtext import _perturb, page_texts, reference_parse, same

from lynxtop.agent.metrics import layout as layout_mod
from lynxtop.agent.metrics import page as page_mod
from lynxtop.agent.metrics.layout import PageLayout
from lynxtop.agent.metrics.page import PageError, parse_text
from lynxtop.agent.metrics.scrape import MetricsScraper


def identical(a: page_mod.ParsedPage, b: page_mod.ParsedPage) -> None:
    same(a, b)
    assert a.engines == b.engines
    assert (a.bad_values, a.bad_example, a.refused, a.stale) == (b.bad_values, b.bad_example, b.refused, b.stale)


def _wanted(text: str, prefix: str) -> list[str]:
    return [line for line in text.split("\n") if line.startswith(prefix)]


def _variants(first: str, rng: random.Random) -> list[tuple[str, str, bool | None]]:
    """(what changed, page, whether it is laid out as the last page learnt: None for either) for a sequence."""
    out: list[tuple[str, str, bool | None]] = []
    cur = first

    def add(what: str, text: str, same_layout: bool | None) -> None:
        nonlocal cur
        out.append((what, text, same_layout))
        cur = text

    add("values moved", _perturb(cur, rng), True)
    add("values moved again", _perturb(cur, rng), True)
    bucket = _wanted(cur, "vllm:time_to_first_token_seconds_bucket{")[0]
    extra = bucket.rpartition(" ")[0].replace("{", '{new="1",', 1) + " 3.0"
    add("a series appears", cur.replace(bucket, f"{bucket}\n{extra}", 1), False)
    add("values moved after it", _perturb(cur, rng), True)
    add("it vanishes", re.sub(f"\n{re.escape(extra.rpartition(' ')[0])} [^\n]*", "", cur), False)
    lines = cur.split("\n")
    a, b = [i for i, line in enumerate(lines) if line.startswith("vllm:e2e_request_latency_seconds_")][:2]
    lines[a], lines[b] = lines[b], lines[a]
    add("two lines swapped", "\n".join(lines), False)
    add("values moved", _perturb(cur, rng), True)
    typed = cur
    add("a TYPE line changed", cur.replace("# TYPE vllm:num_requests_running gauge",
                                           "# TYPE vllm:num_requests_running counter"), False)
    running = re.search(r"\n# TYPE vllm:num_requests_running \w+\n", cur)
    assert running
    add("its TYPE names a family not read", cur.replace(running.group(0), "\n# TYPE vllm:unread gauge\n"), False)
    waiting = "\n# HELP vllm:num_requests_waiting"
    add("an extra TYPE line", cur.replace(waiting, "\n# TYPE vllm:num_requests_waiting gauge" + waiting, 1), False)
    add("the TYPE lines as they were", _perturb(typed, rng), False)
    add("values moved", _perturb(cur, rng), True)
    base = cur
    line = _wanted(base, "vllm:generation_tokens_total")[0]
    key = line.rpartition(" ")[0]
    for what, changed in (("a value is NaN", f"{key} NaN"), ("a value is past 2**63", f"{key} 1e300"),
                          ("a timestamp after a value", f"{line} 1700000000000"), ("a value written 1_0", f"{key} 1_0"),
                          ("a series key changed", line.replace("vllm:", "vllm:x", 1)),
                          ("a sample line without its value", key), ("a space after a value", f"{line} "),
                          ("a sample line reduced to its value", line.rpartition(" ")[2]),
                          ("a count below 0", f"{key} -5")):
        assert base.count(line) == 1
        add(what, base.replace(line, changed), False)
        add("back as it was", base, None)  # the layout read by position next is the base's again
    gauge = _wanted(base, "vllm:num_requests_running{")[0]
    add("a gauge below 0", base.replace(gauge, gauge.rpartition(" ")[0] + " -3"), False)  # read: its column decides
    add("back as it was", base, None)
    add("values moved", _perturb(cur, rng), True)
    running, plain = "\n# TYPE vllm:num_requests_running gauge\n", cur
    add("a blank line in a family read", cur.replace(running, running + "\n", 1), False)
    add("the blank line holds a sample", cur.replace(running + "\n", running + "vllm:num_requests_running\t5\n", 1),
        False)
    add("the blank line gone", _perturb(plain, rng), False)
    add("values moved", _perturb(cur, rng), True)
    help_line = re.search(r"\n(# HELP vllm:e2e_request_latency_seconds [^\n]*)\n", cur)
    assert help_line
    moved = cur.replace(help_line.group(0), "\n", 1)
    moved = moved.replace("\n# TYPE vllm:num_requests_running gauge\n",
                          f"\n# TYPE vllm:num_requests_running gauge\n{help_line.group(1)}\n", 1)
    add("a line moved from one family to another", moved, False)
    add("values moved", _perturb(cur, rng), True)
    add("not starting with a comment", cur.split("\n", 1)[1], False)
    add("values moved", _perturb(first, rng), False)
    add("the same page again", cur, True)
    return out


@pytest.mark.parametrize("name", list(page_texts()))
def test_a_sequence_of_pages_reads_as_the_full_parse_every_time(name, monkeypatch):
    first = page_texts()[name]
    taken: list[bool] = []
    real = PageLayout._known

    def spy(self, text):
        t = real(self, text)
        taken.append(t is not None)
        return t

    monkeypatch.setattr(PageLayout, "_known", spy)
    monkeypatch.setattr(layout_mod, "LEARN_WAIT_MAX", 0)  # every page the full parse reads is learnt from
    layout = PageLayout()
    identical(layout.parse(first), parse_text(first))
    for what, text, same_layout in _variants(first, random.Random(3)):
        try:
            full = parse_text(text)
        except PageError as exc:
            with pytest.raises(PageError, match=re.escape(str(exc))):
                layout.parse(text)
            taken.append(False)
            continue
        ours = layout.parse(text)
        identical(ours, full)
        if same_layout:  # prometheus_client's reading too (it skips TYPE lines: only where they are as before)
            same(ours, reference_parse(text))
        assert same_layout is None or taken[-1] == same_layout, what  # matched only when laid out as learnt
    assert taken.count(True) >= 6  # the short path was really taken, not only the full parse


def test_a_line_moved_between_families_read_is_not_read_by_position():
    """A line that left one family's part (its last line: the next family's HELP) for another's, both families
    read: the same lines in all, every line between them one place off; the full parse reads that page."""
    first = page_texts()["sim-dp8"]
    layout = PageLayout()
    layout.parse(first)
    nxt = _perturb(first, random.Random(1))
    assert layout._known(nxt) is not None  # learnt: the values alone moved
    running = "\n# TYPE vllm:num_requests_running gauge\n"
    end = nxt.index("\n# TYPE ", nxt.index(running) + 1)
    last = nxt[nxt.rindex("\n", 0, end) + 1:end]
    assert last.startswith("# HELP ")
    e2e = "\n# TYPE vllm:e2e_request_latency_seconds histogram\n"
    moved = nxt[:end - len(last) - 1] + nxt[end:]
    moved = moved.replace(e2e, e2e + last + "\n", 1)
    assert len(moved.split("\n")) == len(nxt.split("\n")) and moved != nxt
    assert layout._known(moved) is None
    identical(layout.parse(moved), parse_text(moved))


def test_a_scraper_reads_a_steady_server_by_position_and_gives_the_same_rows(monkeypatch):
    """The scraper's rows over a sequence of DP8 pages are those of the full parse of every page."""
    rng = random.Random(9)
    pages = [page_texts()["sim-dp8-ep-served"]]
    for _ in range(6):
        pages.append(_perturb(pages[-1], rng))
    ours = MetricsScraper("http://x:1", window_s=60.0)
    rows = [ours.parse_page(p, now=float(i)) for i, p in enumerate(pages)]
    monkeypatch.setattr(layout_mod.PageLayout, "_known", lambda self, text: None)  # the full parse every time
    ref = MetricsScraper("http://x:1", window_s=60.0)
    assert [ref.parse_page(p, now=float(i)) for i, p in enumerate(pages)] == rows
    assert any(v not in (None, 0, 0.0) for v in rows[-1].values())


def test_a_server_whose_layout_changes_every_scrape_is_learnt_from_ever_less_often(monkeypatch):
    """Learning a layout costs about a full parse: a page that never matches the last (a label changing every
    scrape) is learnt from on fewer and fewer pages, at least every LEARN_WAIT_MAX + 1; one that matches again is
    read by position from the next page on."""
    learnt: list[int] = []
    real = PageLayout._learn
    monkeypatch.setattr(PageLayout, "_learn", lambda self, text: (learnt.append(1), real(self, text))[1])
    base = page_texts()["sim-dp8"]
    layout = PageLayout()
    pages = 300
    for i in range(pages):
        text = base.replace('engine="0"', f'engine="0",scrape="{i}"')
        identical(layout.parse(text), parse_text(text))
    assert len(learnt) <= 2 + pages // (layout_mod.LEARN_WAIT_MAX + 1) + 6  # was one per page
    assert len(learnt) >= pages // (layout_mod.LEARN_WAIT_MAX + 1)  # still learns now and then
    steady = _perturb(base, random.Random(2))
    for _ in range(layout_mod.LEARN_WAIT_MAX + 1):  # learnt again within LEARN_WAIT_MAX + 1 pages
        layout.parse(steady)
    assert layout._known(_perturb(steady, random.Random(3))) is not None


def _wide_page(buckets: int, engines: int = 8) -> str:
    """A page of one latency histogram with `buckets` bounds per engine and one counter, as prometheus_client
    writes it."""
    from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

    r = CollectorRegistry()
    bounds = [0.001 * (i + 1) for i in range(buckets - 1)]
    h = Histogram("vllm:time_to_first_token_seconds", "ttft", ["engine"], buckets=bounds, registry=r)
    c = Counter("vllm:generation_tokens", "gen", ["engine"], registry=r)
    for e in range(engines):
        for i in range(40):
            h.labels(str(e)).observe(0.0007 * i * (e + 1))
        c.labels(str(e)).inc(100 + e)
    return generate_latest(r).decode()


def _c_calls(fn) -> int:
    n = [0]

    def count(frame, event, arg):
        if event in ("call", "c_call"):
            n[0] += 1

    sys.setprofile(count)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return n[0]


def test_a_planned_page_is_added_up_in_calls_that_do_not_grow_with_its_buckets():
    """A planned layout's sums are added up by line rank (one `map(add)` over every sum of one size), not one
    `reduce` per bucket bound: reading a page of 100 bounds per histogram takes the calls a page of 10 takes (the
    per-bound reading took two calls more per bound, ~180 more here)."""
    calls = []
    for buckets in (10, 100):  # within what a layout learns (MAX_BUCKETS lines a family)
        first = _wide_page(buckets)
        layout = PageLayout()
        layout.parse(first)
        nxt = _perturb(first, random.Random(buckets))
        assert layout._known(nxt) is not None
        calls.append(_c_calls(lambda: layout.parse(nxt)))  # noqa: B023
        identical(layout.parse(nxt), parse_text(nxt))
    assert abs(calls[1] - calls[0]) <= 4, calls


def test_a_planned_pages_series_come_as_one_keys_tuple_per_family_without_a_dict():
    """Each family's series of a planned page are (keys, values), the keys the plan's own tuple on every page;
    the reset correction reads them so and no dict per family is built for a scrape (0.3 ms a DP8 page)."""
    first = page_texts()["sim-dp8"]
    layout = PageLayout()
    layout.parse(first)
    a = layout.parse(_perturb(first, random.Random(1)))
    b = layout.parse(_perturb(first, random.Random(2)))
    assert a.series_lists and a.series_lists.keys() == b.series_lists.keys()
    for sk, (keys, values) in b.series_lists.items():
        assert type(keys) is tuple and keys is a.series_lists[sk][0]
        assert list(b.series[sk]) == list(keys) and list(b.series[sk].values()) == list(values)
    scraper = MetricsScraper("http://x:1")
    pages = [scraper._layout.parse(p) for p in (first, _perturb(first, random.Random(3)))]
    rows = [scraper._accept(p, float(i)) for i, p in enumerate(pages)]
    assert rows[-1]["scrape_ok"] == 1
    assert pages[-1]._series is None  # the scrape read the page without building a dict per family


def test_a_series_written_twice_on_a_planned_page_reads_as_the_full_parse():
    """The same series twice keeps its first place and its last value, as the full parse's dict does."""
    first = page_texts()["sim-dp8"]
    line = _wanted(first, "vllm:generation_tokens_total")[0]
    twice = first.replace(line, f"{line}\n{line.rpartition(' ')[0]} 12345.0", 1)
    layout = PageLayout()
    layout.parse(twice)
    nxt = _perturb(twice, random.Random(4))
    assert layout._known(nxt) is not None
    ours, full = layout.parse(nxt), parse_text(nxt)
    identical(ours, full)
    assert ours.series_lists == full.series_lists


@pytest.mark.parametrize("name", list(page_texts()))
def test_a_plans_pages_are_built_as_the_reading_by_name_builds_them(name):
    """A plan's pages are built from the shape found on its first page (which name each quantity is read from):
    the same page, engines, series and all, as `_page_of` reading every quantity by name."""
    first = page_texts()[name]
    parse_text(first)  # planned
    for seed in (5, 6):
        seen, t = page_mod._scan(_perturb(first, random.Random(seed)))
        assert t.plan is not None
        ours = page_mod._page_of(seen, t)
        assert t.plan.shape is not None
        t.plan = None  # read by name
        identical(ours, page_mod._page_of(seen, t))
        assert ours.series_lists == page_mod._page_of(seen, t).series_lists


def test_type_lines_are_found_everywhere_and_a_page_of_hashes_takes_the_full_parse():
    """The TYPE lines are found by a walk over every "#": one added inside a family not read (naming a family
    read, so the full parse reads a new part) is found; "#" in label values within the walk's bound are walked
    over, a page holding far more "#" than the learnt one is not walked at all: it takes the full parse."""
    first = page_texts()["sim-dp8"]
    unread = re.search(r"\n# TYPE process_open_fds gauge\nprocess_open_fds [^\n]*\n", first)
    assert unread
    layout = PageLayout()
    layout.parse(first)
    extra = first.replace(unread.group(0), unread.group(0) + "# TYPE vllm:num_requests_running gauge\n"
                          'vllm:num_requests_running{engine="9"} 7.0\n', 1)
    assert layout._known(extra) is None
    identical(layout.parse(extra), parse_text(extra))
    assert parse_text(extra).engines["9"] == {"running": 7.0}
    layout = PageLayout()
    layout.parse(first)
    few = first.replace("python_gc_objects_collected_total{", 'python_gc_objects_collected_total{x="#",', 3)
    assert layout._known(_perturb(few, random.Random(7))) is not None
    many = first.replace(unread.group(0), unread.group(0) + 'process_x{x="' + "#" * (2 * first.count("#") + 65)
                         + '"} 1.0\n', 1)
    assert layout._known(many) is None
    identical(layout.parse(many), parse_text(many))


def _blocks(text: str) -> list[str]:
    """A page cut before each HELP line: one block a family (its HELP, TYPE and samples), the head first."""
    head, *rest = text.split("\n# HELP ")
    return [head] + ["# HELP " + b for b in rest]


def _grow_block(block: str, rng: random.Random, how: str) -> str:
    """One family's block with its samples moved as `how` says: grown, reset (below before), a NaN or an
    infinity in one sample, or a value at the edge of what is read (past 2**63)."""
    lines = block.split("\n")
    samples = [i for i, line in enumerate(lines) if line.startswith("vllm:") and " " in line]
    if not samples:
        return block
    for i in samples:
        key, _, value = lines[i].rpartition(" ")
        v = float(value)
        lines[i] = f"{key} {v * 0.25 if how == 'reset' else v + rng.randint(0, 8) * 0.5}"
    one = rng.choice(samples)
    key = lines[one].rpartition(" ")[0]
    odd = {"nan": "NaN", "inf": "+Inf", "-inf": "-Inf", "huge": "1e300", "exp": "1.5e3", "int": "7", "neg": "-2.5",
           "-huge": "-1e300", "-zero": "-0.0"}
    if how in odd:
        lines[one] = f"{key} {odd[how]}"
    return "\n".join(lines)


def _family_sequence(first: str, rng: random.Random, n: int) -> list[str]:
    """`n` pages after `first`, each moving a random few families (most kept as they were, as an idle engine's
    histograms are), now and then with a reset, a NaN or an infinity in one family, a series with escaped label
    values added or dropped, two families swapped or one left out and back."""
    base = _blocks(first)
    cur = list(base)
    out = []
    escaped = 'vllm:num_requests_waiting{engine="0",model_name="a\\"b\\\\c\\nd"} 2.0'
    for _ in range(n):
        page = list(cur)
        for j in rng.sample(range(1, len(page)), k=rng.choice((0, 1, 2, 5))):
            how = rng.choice(("grow",) * 20 + ("reset", "reset", "exp", "int", "nan", "inf", "-inf", "huge", "neg",
                                               "-huge", "-zero"))
            page[j] = _grow_block(page[j], rng, how)
        shape = rng.random()
        if shape < 0.05:
            a, b = rng.sample(range(1, len(page)), k=2)
            page[a], page[b] = page[b], page[a]
        elif shape < 0.1:
            del page[rng.randrange(1, len(page))]
        elif shape < 0.15:
            page = [b.replace("# TYPE vllm:num_requests_waiting gauge\n",
                              f"# TYPE vllm:num_requests_waiting gauge\n{escaped}\n", 1) for b in page]
        out.append("\n".join(page))
        # what stays for the next page: the values moved (bad ones too, so a family can stay NaN), not the shape
        if shape >= 0.15 or rng.random() < 0.5:
            cur = page if shape >= 0.05 else cur
        if rng.random() < 0.05:
            cur = list(base)
    return out


@pytest.mark.parametrize("name", list(page_texts()))
def test_random_page_sequences_moving_some_families_read_as_the_full_parse(name, monkeypatch):
    """Pages where only some families moved (the others' parts equal to the last read, taken as read then) give
    the full parse's page and, through a scraper, the full parse's rows: values kept or moved, resets, NaN and
    infinities, escaped label values, families added, dropped and reordered."""
    monkeypatch.setattr(layout_mod, "LEARN_WAIT_MAX", 0)  # every page the full parse reads is learnt from
    known = 0
    for seed in range(3):
        pages = [page_texts()[name], *_family_sequence(page_texts()[name], random.Random(seed), 40)]
        layout = PageLayout()
        for text in pages:
            known += layout._known(text) is not None
            try:
                full = parse_text(text)
            except PageError as exc:
                with pytest.raises(PageError, match=re.escape(str(exc))):
                    layout.parse(text)
                continue
            identical(layout.parse(text), full)
        ours = MetricsScraper("http://x:1", window_s=30.0)
        rows = [ours.parse_page(p, now=float(i)) for i, p in enumerate(pages)]
        with monkeypatch.context() as m:
            m.setattr(layout_mod.PageLayout, "_known", lambda self, text: None)
            ref = MetricsScraper("http://x:1", window_s=30.0)
            assert [ref.parse_page(p, now=float(i)) for i, p in enumerate(pages)] == rows
            assert ref.events(float(len(pages))) == ours.events(float(len(pages)))
    assert known >= 15  # the parts were really read by position, not only by the full parse


def _splits(fn) -> int:
    n = [0]

    def count(frame, event, arg):
        if event == "c_call" and getattr(arg, "__name__", "") == "split":
            n[0] += 1

    sys.setprofile(count)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return n[0]


def test_a_family_part_as_last_read_is_not_split_or_read_again():
    """On a page laid out as the last, a family read whose part is equal to the one last read (an idle engine's
    histograms) is taken with its values as read then: only the families that moved are split into lines."""
    first = page_texts()["sim-dp8"]
    layout = PageLayout()
    layout.parse(first)
    assert layout._known(_perturb(first, random.Random(1))) is not None
    nxt = _perturb(first, random.Random(2))
    assert _splits(lambda: layout.parse(nxt)) > 10  # every part moved: each split
    blocks = _blocks(nxt)
    j = next(i for i, b in enumerate(blocks) if "# TYPE vllm:generation_tokens_total counter" in b)
    blocks[j] = _grow_block(blocks[j], random.Random(2), "grow")
    one = "\n".join(blocks)
    assert _splits(lambda: layout.parse(one)) == 1  # one family moved: one part split (every part before)
    identical(layout.parse(one), parse_text(one))
    assert _splits(lambda: layout.parse(one)) == 0  # nothing moved
    summed = []
    real = page_mod._Plan.totals
    full_one, full_nxt = parse_text(one), parse_text(nxt)
    with pytest.MonkeyPatch.context() as m:
        m.setattr(page_mod._Plan, "totals", lambda plan, values: summed.append(1) or real(plan, values))
        ours_one = layout.parse(one)
        assert summed == []  # nothing moved: nor added up again (an idle server's page)
        ours_nxt = layout.parse(nxt)
        assert summed == [1]
    identical(ours_one, full_one)
    identical(ours_nxt, full_nxt)


def test_a_part_kept_from_a_page_that_failed_later_is_not_answered_with_older_sums():
    """A page whose first moved family is read and kept, then a later family holds a value that is no number (the
    full parse refuses the page), then a page of those kept parts: its sums are added up again, not the sums of
    the page before."""
    first = page_texts()["sim-dp8"]
    layout = PageLayout()
    layout.parse(first)
    a = _perturb(first, random.Random(1))
    layout.parse(a)
    layout.parse(a)
    blocks = _blocks(a)
    one, bad = (next(i for i, b in enumerate(blocks) if f"# TYPE vllm:{name}_total counter" in b)
                for name in ("prompt_tokens", "generation_tokens"))
    assert one < bad
    blocks[one] = _grow_block(blocks[one], random.Random(2), "grow")
    moved = "\n".join(blocks)
    line = _wanted(blocks[bad], "vllm:")[0]
    blocks[bad] = blocks[bad].replace(line, line.rpartition(" ")[0] + " x1", 1)
    with pytest.raises(PageError):
        parse_text("\n".join(blocks))
    with pytest.raises(PageError):
        layout.parse("\n".join(blocks))
    identical(layout.parse(moved), parse_text(moved))


_SAMPLE_VALUE = re.compile(r"^(vllm:\S+?(?:_total|_bucket|_sum|_count)(?:\{[^}]*\})?) (\S+)$", re.MULTILINE)


def test_each_distinct_value_string_of_a_page_read_by_position_is_read_once(monkeypatch):
    """A loaded DP8 page writes its ~1,400 values in ~110 strings (0.0, small counts): a page read by position
    reads each distinct string once (a `float` per value before), and the page is still the full parse's, a
    value that is no reading included however often it is written."""
    first = page_texts()["sim-dp8"]
    layout = PageLayout()
    layout.parse(first)
    strings = ("1.0", "2.5", "1e3", "-0.0")
    turn = iter(range(10**6))
    nxt = _SAMPLE_VALUE.sub(lambda m: f"{m.group(1)} {strings[next(turn) % len(strings)]}", first)
    assert next(turn) > 100 * len(strings)  # many values, few strings
    read: list[str] = []
    with monkeypatch.context() as m:
        m.setattr(layout_mod, "float", lambda s: read.append(s) or float(s), raising=False)
        assert layout._known(nxt) is not None  # read by position
    # each string once (the gauges' few values too): not one `float` per value of the page's > 400
    assert len(read) == len(set(read)) < 40 and set(strings) <= set(read)
    identical(layout.parse(nxt), parse_text(nxt))
    for bad in ("NaN", "1e300", "+Inf", "x"):  # on many lines: the full parse's reading, every one counted
        for on in ("_total", "_sum", "_bucket"):  # a bad bucket may leave no +Inf bucket: the full parse's error
            def spoil(m: re.Match[str], bad: str = bad, on: str = on) -> str:
                key = m.group(1)
                return f"{key} {bad}" if on in key and next(turn) % 5 else m.group(0)

            worse = _SAMPLE_VALUE.sub(spoil, nxt)
            try:
                full = parse_text(worse)
            except PageError as exc:
                with pytest.raises(PageError, match=re.escape(str(exc))):
                    layout.parse(worse)
            else:
                ours = layout.parse(worse)
                identical(ours, full)
                assert ours.bad_values > 20
            identical(layout.parse(nxt), parse_text(nxt))


@pytest.mark.parametrize("engines", [8, 40])
def test_a_plans_sums_are_added_in_page_order_to_the_bit_whatever_the_engines(engines):
    """`_Plan.totals` chains its adds (no list a step) and makes a list every `_CHAIN` steps (40 engines: a sum
    of 40 lines, past it); every sum is still 0.0 plus each line in page order, bit for bit, NaN and infinities
    carried, as the step-by-step lists added it."""
    first = sim_page(engines, 5)
    layout = PageLayout()
    layout.parse(first)
    plan = layout._plan
    assert plan is not None and max(len(steps) for _, steps in plan._steps) == engines
    rng = random.Random(engines)
    size = len(layout._all[6])  # the plan's pickers index the list of every wanted line's value
    for _ in range(50):
        values = [rng.choice((0.0, -0.0, 1e-17, 0.1, 0.7, 3.0, 1e16, -2.5, 1e308, float("inf"), float("nan")))
                  for _ in range(size)]
        out: list[float] = []
        for width, steps in plan._steps:
            acc = [0.0] * width
            for step in steps:
                acc = list(map(operator.add, acc, step(values)))
            out += acc
        out += [reduce(operator.add, pick(values), 0.0) for pick in plan._alone]
        out += [max(pick(values)) for pick in plan._maxes]
        t = plan.totals(values)
        names, pick = plan._sums
        assert repr(t.sums) == repr(dict(zip(names, pick(out), strict=True)))
        assert repr(t.buckets) == repr({h: dict(zip(les, p(out), strict=True)) for h, les, p in plan._buckets})
        assert repr(t.engines) == repr({e: dict(zip(ns, p(out), strict=True)) for e, ns, p in plan._engines})
