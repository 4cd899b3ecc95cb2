"""Quantiles from cumulative buckets, checked by hand and against raw observations through prometheus_client."""

from __future__ import annotations

import bisect
import math
import random

import pytest
from agent_io_helpers import TTFT_BUCKETS
from prom_reference import Series, promtool_eval
from prometheus_client import CollectorRegistry, Histogram, generate_latest
from support.real import needs_tools

from lynxtop.agent.metrics.histogram import HistogramSnapshot, SlidingHistogram, bucket_quantile
from lynxtop.agent.metrics.scrape import parse_text

INF = math.inf
B = [(0.1, 10.0), (0.5, 30.0), (1.0, 40.0), (INF, 40.0)]


@pytest.mark.parametrize(("q", "expected"), [
    (0.5, 0.1 + 0.4 * (10 / 20)),   # rank 20 falls in (0.1, 0.5], 10 of its 20
    (0.99, 0.5 + 0.5 * (9.6 / 10)),  # rank 39.6 in (0.5, 1]
    (0.1, 0.0 + 0.1 * (4 / 10)),    # first bucket: lower bound 0
    (1.0, 1.0),                      # rank 40 reaches the last finite bucket
])
def test_quantile_by_hand(q, expected):
    assert bucket_quantile(q, B) == pytest.approx(expected)


def test_quantile_edge_cases_like_prometheus():
    # rank in the +Inf bucket: the upper bound of the last finite bucket
    assert bucket_quantile(0.5, [(0.1, 1), (0.5, 2), (INF, 10)]) == 0.5
    # no observations, no +Inf bucket, a single bucket: NaN (the row shows NULL)
    assert math.isnan(bucket_quantile(0.5, [(0.1, 0), (INF, 0)]))
    assert math.isnan(bucket_quantile(0.5, [(0.1, 1), (0.5, 2)]))
    assert math.isnan(bucket_quantile(0.5, [(INF, 3)]))
    # q out of range
    assert bucket_quantile(-0.1, B) == -INF
    assert bucket_quantile(1.1, B) == INF
    assert math.isnan(bucket_quantile(math.nan, B))
    # first bucket with a non-positive upper bound returns that bound
    assert bucket_quantile(0.1, [(-1.0, 5), (0.5, 10), (INF, 10)]) == -1.0
    # unsorted input and a non-monotonic scrape (a bucket caught mid-update) are repaired like Prometheus
    assert bucket_quantile(0.5, list(reversed(B))) == pytest.approx(0.3)
    # (0.5, 8) becomes (0.5, 10): rank 15 -> 0.5 + 0.5 * 5/10; unrepaired it would be 0.5 + 0.5 * 7/12
    assert bucket_quantile(0.75, [(0.1, 10), (0.5, 8), (1.0, 20), (INF, 20)]) == pytest.approx(0.75)
    # q = 0 with an empty first bucket: the bucket's start, not 0/0
    assert bucket_quantile(0.0, [(0.1, 0), (0.5, 4), (INF, 4)]) == 0.0


def _page_quantiles(observations: list[float], engines: int) -> tuple[HistogramSnapshot, dict[float, float]]:
    """Observations spread over engines in a real prometheus_client Histogram, read back through our parser."""
    reg = CollectorRegistry()
    h = Histogram("vllm:time_to_first_token_seconds", "ttft", ["model_name", "engine"], buckets=TTFT_BUCKETS,
                  registry=reg)
    for i, x in enumerate(observations):
        h.labels("m", str(i % engines)).observe(x)
    snap = parse_text(generate_latest(reg).decode()).histograms["ttft"]
    return snap, {q: bucket_quantile(q, snap.buckets) for q in (0.5, 0.9, 0.99)}


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_quantile_against_raw_observations(seed):
    rnd = random.Random(seed)
    obs = [rnd.lognormvariate(math.log(0.3), 0.9) for _ in range(5000)]
    snap, got = _page_quantiles(obs, engines=3)
    assert snap.count == len(obs)
    assert snap.sum == pytest.approx(sum(obs))
    # brute force: bucket counts straight from the raw observations, interpolated by hand
    bounds = [*TTFT_BUCKETS, INF]
    counts = [sum(1 for x in obs if x <= le) for le in bounds]
    assert [c for _, c in snap.buckets] == counts
    s = sorted(obs)
    for q, est in got.items():
        rank = q * len(obs)
        b = next(i for i, c in enumerate(counts) if c >= rank)
        lo = bounds[b - 1] if b else 0.0
        brute = lo + (bounds[b] - lo) * (rank - (counts[b - 1] if b else 0)) / (counts[b] - (counts[b - 1] if b else 0))
        assert est == pytest.approx(brute)
        # the true order statistic lies in the same bucket as the estimate
        true = s[math.ceil(rank) - 1]
        i_true = bisect.bisect_left(bounds, true)
        i_est = bisect.bisect_left(bounds, est)
        assert i_true == i_est, (q, true, est)


def test_sliding_window_uses_only_recent_observations():
    reg = CollectorRegistry()
    h = Histogram("vllm:time_to_first_token_seconds", "t", ["engine"], buckets=TTFT_BUCKETS, registry=reg)
    h.labels("0")  # the series exists at zero from the start, as vLLM prints it

    def snap() -> HistogramSnapshot:
        return parse_text(generate_latest(reg).decode()).histograms["ttft"]

    sh = SlidingHistogram(window_s=60)
    sh.add(0.0, snap())
    assert sh.quantile(0.5) is None  # one scrape: no window yet
    for _ in range(100):
        h.labels("0").observe(5.0)  # slow requests long ago
    sh.add(30.0, snap())
    assert 2.5 < sh.quantile(0.5) <= 5.0
    for _ in range(100):
        h.labels("0").observe(0.03)
    sh.add(95.0, snap())  # the baseline is now t=30: only the fast requests are in the window
    assert 0.02 < sh.quantile(0.99) <= 0.04
    assert sh.mean() == pytest.approx(0.03)
    sh.add(200.0, snap())  # nothing new for a whole window: empty
    assert sh.quantile(0.5) is None and sh.mean() is None


def test_sliding_window_counter_reset_counts_from_zero():
    sh = SlidingHistogram(window_s=60)
    big = HistogramSnapshot(((0.1, 500.0), (1.0, 900.0), (INF, 1000.0)), 300.0, 1000.0)
    small = HistogramSnapshot(((0.1, 0.0), (1.0, 10.0), (INF, 10.0)), 5.0, 10.0)  # server restarted
    sh.add(0.0, big)
    assert sh.add(1.0, small) is True
    w = sh.window()
    assert w is not None and w.count == 10 and all(c >= 0 for _, c in w.buckets)
    assert 0.1 < sh.quantile(0.5) <= 1.0


TTFT = "vllm:time_to_first_token_seconds"


def _restart_pages() -> list[tuple[int, str]]:
    """Scrapes every 5 s of a 2-engine vLLM whose TTFT histogram is a real prometheus_client one: 8 requests in
    48 take 17.5 s until t=30, vLLM restarts behind the agent at t=35 (every series back at zero), then only
    fast requests."""

    def fresh() -> Histogram:
        reg = CollectorRegistry()
        h = Histogram(TTFT, "ttft", ["model_name", "engine"], buckets=TTFT_BUCKETS, registry=reg)
        for e in ("0", "1"):
            h.labels("m", e)  # vLLM prints every series from the start, at zero
        h.registry = reg  # type: ignore[attr-defined]
        return h

    h = fresh()
    pages = []
    for t in range(0, 180, 5):
        if t == 35:
            h = fresh()
        elif t > 0:
            for i in range(40):
                h.labels("m", str(i % 2)).observe(0.04 + 0.0005 * i)
            if t <= 30:
                for i in range(8):
                    h.labels("m", str(i % 2)).observe(17.5)
        pages.append((t, generate_latest(h.registry).decode()))  # type: ignore[attr-defined]
    return pages


def test_reset_keeps_the_increases_before_it_like_prometheus():
    """The p99 across a restart is Prometheus' histogram_quantile over per-series counter-corrected increases
    (computed here from the raw samples, not by lynxtop): the slow requests before the reset stay in the p99
    until they leave the window. Before the fix the window started over and the p99 fell to ~60 ms at once."""
    sh = SlidingHistogram(window_s=60)
    ref = Series()
    p99: dict[int, float | None] = {}
    for t, text in _restart_pages():
        ref.add_page(t, text)
        assert sh.add(float(t), parse_text(text).histograms["ttft"]) is (t == 35)
        for q in (0.5, 0.9, 0.99):
            expected = ref.histogram_quantile(q, TTFT, t - 60, t)
            got = sh.quantile(q)
            assert (got is None) if math.isnan(expected) else got == pytest.approx(expected, rel=1e-12), (t, q)
        p99[t] = sh.quantile(0.99)
        w = sh.window()
        assert w is None or all(c >= 0 for _, c in w.buckets) and w.count >= 0 and w.sum >= 0
    # the slow requests (increases up to t=30) are in every window whose baseline is before t=30
    assert all(p99[t] is not None and 10 < p99[t] <= 20 for t in range(5, 90, 5))
    assert all(p99[t] is not None and p99[t] <= 0.06 for t in range(90, 180, 5))
    # the mean over the window is the corrected increase of _sum over that of _count, across the reset too
    total = ref.increase(TTFT + "_sum", 175 - 60, 175) / ref.increase(TTFT + "_count", 175 - 60, 175)
    assert sh.mean() == pytest.approx(total, rel=1e-9)


def test_reset_in_some_buckets_only_is_corrected_per_bucket():
    """Each `le` bucket is its own counter, as in Prometheus: after a restart a bucket that reads at least its
    old value (here the 1.0 bucket) is an ordinary increase, one that went down contributes its new value."""
    sh = SlidingHistogram(window_s=60)
    sh.add(0.0, HistogramSnapshot(((0.1, 0.0), (1.0, 0.0), (INF, 0.0)), 0.0, 0.0))
    sh.add(1.0, HistogramSnapshot(((0.1, 5.0), (1.0, 6.0), (INF, 8.0)), 10.0, 8.0))
    assert sh.add(2.0, HistogramSnapshot(((0.1, 1.0), (1.0, 7.0), (INF, 7.0)), 2.0, 7.0)) is True
    w = sh.window()
    assert w is not None
    assert w.buckets == ((0.1, 5.0 + 1.0), (1.0, 7.0), (INF, 8.0 + 7.0))
    assert (w.sum, w.count) == (10.0 + 2.0, 8.0 + 7.0)


def test_bucket_layout_change_starts_the_window_over():
    """A restart with other bucket bounds cannot be merged with the window before it: it counts from zero."""
    sh = SlidingHistogram(window_s=60)
    sh.add(0.0, HistogramSnapshot(((0.1, 5.0), (INF, 9.0)), 3.0, 9.0))
    sh.add(1.0, HistogramSnapshot(((0.1, 9.0), (INF, 20.0)), 9.0, 20.0))
    assert sh.add(2.0, HistogramSnapshot(((0.5, 2.0), (INF, 3.0)), 1.0, 3.0)) is True
    w = sh.window()
    assert w is not None and w.buckets == ((0.5, 2.0), (INF, 3.0)) and w.count == 3.0


def test_corrected_window_never_takes_float_noise_for_a_reset():
    """Fed sums the scraper already corrected per engine, a _sum added up in another order (an ulp lower) is noise,
    not a reset that would add the whole previous sum back; the plain window would follow Prometheus' rule."""
    a = HistogramSnapshot(((1.0, 3.0), (INF, 3.0)), 0.1 + 0.2, 3.0)  # 0.30000000000000004
    b = HistogramSnapshot(((1.0, 3.0), (INF, 3.0)), 0.3, 3.0)
    corrected = SlidingHistogram(window_s=60, corrected=True)
    corrected.add(0.0, a)
    assert corrected.add(1.0, b) is False
    w = corrected.window()
    assert w is not None and abs(w.sum) < 1e-15
    plain = SlidingHistogram(window_s=60)
    plain.add(0.0, a)
    assert plain.add(1.0, b) is True


@needs_tools("promtool")
def test_reset_figures_match_a_real_prometheus():
    """The same pages evaluated by a real Prometheus (promtool): histogram_quantile over rate() per series.
    Evaluated where the range starts on a sample, so Prometheus does not extrapolate."""
    pages = _restart_pages()
    ref = Series()
    sh = SlidingHistogram(window_s=60)
    ours: dict[int, float | None] = {}
    for t, text in pages:
        ref.add_page(t, text)
        sh.add(float(t), parse_text(text).histograms["ttft"])
        ours[t] = sh.quantile(0.99)
    times = [60, 70, 85, 90, 120, 175]
    exprs = [(f"histogram_quantile(0.99, sum by (le) (rate({TTFT}_bucket[60s])))", t) for t in times]
    for t, prom in zip(times, promtool_eval(ref, {TTFT + "_bucket"}, 5, exprs), strict=True):
        assert ours[t] == pytest.approx(prom, rel=1e-9), t


@pytest.mark.parametrize("seed", range(6))
def test_quantile_equals_prometheus_bucket_quantile_on_any_buckets(seed):
    """Sorted or not, repeated bounds, counts that dip (a scrape mid-update), zeros, negative bounds: Prometheus'
    bucketQuantile (the reference in prom_reference.py, which rounds its last step in another order), NaN where
    it gives NaN."""
    from prom_reference import quantile as reference

    rng = random.Random(seed)
    for _ in range(300):
        n = rng.randint(1, 30)
        les = sorted(rng.sample([-1.0, 0.0] + [round(rng.uniform(0.001, 100), 3) for _ in range(60)], n - 1))
        les.append(INF if rng.random() < 0.9 else 500.0)
        counts, c = [], 0.0
        for _ in les:
            c += rng.choice([0, 0, 1, 5, 37.5]) if rng.random() < 0.9 else -rng.randint(1, 3)  # a dip now and then
            counts.append(max(c, 0.0) if rng.random() < 0.95 else 0.0)
        buckets = list(zip(les, counts, strict=True))
        if rng.random() < 0.3:
            buckets += rng.sample(buckets, rng.randint(1, len(buckets)))  # the same bound twice: summed
        if rng.random() < 0.3:
            rng.shuffle(buckets)
        summed: dict[float, float] = {}
        for le, x in buckets:
            summed[le] = summed.get(le, 0.0) + x
        for q in (0.01, 0.5, 0.9, 0.99, 1.0):
            got, want = bucket_quantile(q, buckets), reference(q, summed)
            assert got == pytest.approx(want, rel=1e-12, nan_ok=True), (q, buckets)


def test_quantiles_of_a_window_take_no_python_step_per_bucket():
    """A window's three percentiles and mean (7 histograms a scrape) cost the same Python lines for 20 buckets as
    for 200: sorting, coalescing, the monotonic pass and the rank's search run in C (issue 29.3)."""
    import sys

    def lines_run(n: int) -> int:
        les = [0.01 * (i + 1) for i in range(n - 1)] + [INF]
        sh = SlidingHistogram(60.0, corrected=True)
        sh.add(0.0, HistogramSnapshot(tuple((le, 0.0) for le in les), 0.0, 0.0))
        sh.add(1.0, HistogramSnapshot(tuple((le, float(3 * i)) for i, le in enumerate(les)), 9.0, 3.0 * (n - 1)))
        count = [0]
        here = sys.modules[SlidingHistogram.__module__].__file__

        def trace(frame, event, arg):  # noqa: ANN001, ANN202
            if frame.f_code.co_filename == here:
                if event == "line":
                    count[0] += 1
                return trace
            return None

        sys.settrace(trace)
        try:
            values = [sh.quantile(q) for q in (0.25, 0.5, 0.75)] + [sh.mean()]  # ranks inside a finite bucket
        finally:
            sys.settrace(None)
        assert None not in values
        return count[0]

    assert lines_run(200) == lines_run(20)


def _reference_window(snaps: list[HistogramSnapshot]) -> HistogramSnapshot | None:
    """`minus` of the newest and the baseline, each count at least 0 (a count that dipped is no increase)."""
    if len(snaps) < 2:
        return None
    d = snaps[-1].minus(snaps[0])
    assert d is not None
    return HistogramSnapshot(tuple((le, max(c, 0.0)) for le, c in d.buckets), d.sum, max(d.count, 0.0))


@pytest.mark.parametrize("seed", range(6))
def test_a_window_reads_its_bounds_once_an_add_and_answers_as_minus_and_prepared(seed, monkeypatch):
    """A window's delta and quantiles come from the bounds read when a snapshot is added (every snapshot of a
    window shares them), not from `minus` and `prepared` comparing them again each scrape: the same answers as
    those two (each count of the window at least 0: a layout chosen again starts its counts low) on any bounds
    (increasing, repeated, out of order, NaN, -0.0 then 0.0) and across a change of bounds, which starts the
    window over."""
    from lynxtop.agent.metrics import histogram as hist_mod

    rng = random.Random(seed)
    layouts = [[0.1, 0.5, 1.0, math.inf], [0.5, 0.5, 2.0, math.inf], [1.0, 0.1, math.inf], [-0.0, 1.0, math.inf],
               [0.0, 1.0, math.inf], [math.nan, 1.0, math.inf], [0.25, math.inf]]
    calls = {"minus": 0, "prepared": 0}
    real_minus, real_prepared = HistogramSnapshot.minus, hist_mod.prepared

    def counted(name, fn):
        def wrapper(*args):
            calls[name] += 1
            return fn(*args)
        return wrapper

    sh = SlidingHistogram(10.0, corrected=True)
    kept: list[tuple[float, HistogramSnapshot]] = []
    les = rng.choice(layouts)
    counts = [0.0] * len(les)
    for step in range(60):
        if rng.random() < 0.15:
            les = rng.choice(layouts)
            counts = [0.0] * len(les)
        counts = [c + rng.randint(0, 5) for c in counts]
        snap = HistogramSnapshot(tuple(zip(les, counts, strict=True)), sum(counts) * 0.3, counts[-1])
        now = float(step)
        if kept and not snap.same_layout(kept[-1][1]):
            kept = [(kept[-1][0], HistogramSnapshot.zero_like(snap))]
        kept.append((now, snap))
        while len(kept) >= 2 and kept[1][0] <= now - 10.0:
            kept.pop(0)
        sh.add(now, snap)
        monkeypatch.setattr(HistogramSnapshot, "minus", counted("minus", real_minus))
        monkeypatch.setattr(hist_mod, "prepared", counted("prepared", real_prepared))
        if step % 2:  # the scraper's order: quantiles and mean, the window itself never asked
            answers = [*(sh.quantile(q) for q in (0.0, 0.5, 0.9, 0.99)), sh.mean()]
            got = [sh.window(), *answers]
        else:
            got = [sh.window(), *(sh.quantile(q) for q in (0.0, 0.5, 0.9, 0.99)), sh.mean()]
        monkeypatch.undo()
        want_delta = _reference_window([s for _, s in kept])
        want = [None if want_delta is None else
                (None if math.isnan(v := bucket_quantile(q, want_delta.buckets)) else v) for q in (0.0, 0.5, 0.9, 0.99)]
        assert repr(got[0]) == repr(want_delta)
        assert repr(got[1:5]) == repr(want)
        assert got[5] == (None if want_delta is None or want_delta.count <= 0 or want_delta.sum < 0
                          else want_delta.sum / want_delta.count)
        increasing = all(a < b for a, b in zip(les, les[1:], strict=False))
        if increasing:
            assert calls == {"minus": 0, "prepared": 0}, les
        calls.update(minus=0, prepared=0)


def test_the_quantiles_and_mean_of_a_window_of_increasing_bounds_build_no_snapshot(monkeypatch):
    """What the scraper asks of each latency window a scrape (three quantiles and the mean) is read from the
    newest and baseline snapshots without a window snapshot of (bound, count) pairs built for it (one a histogram
    a scrape before, every window moving under load); `window()` still gives it, and the answers are its own."""
    sh = SlidingHistogram(10.0, corrected=True)
    les = [0.1, 0.5, 1.0, math.inf]
    for step, counts in enumerate(([1.0, 2.0, 3.0, 4.0], [2.0, 5.0, 9.0, 10.0], [2.0, 7.0, 12.0, 15.0])):
        sh.add(float(step), HistogramSnapshot(tuple(zip(les, counts, strict=True)), sum(counts) * 0.3, counts[-1]))
    built = []
    real_init = HistogramSnapshot.__init__
    monkeypatch.setattr(HistogramSnapshot, "__init__",
                        lambda self, *a, **k: built.append(1) or real_init(self, *a, **k))
    answers = [sh.quantile(q) for q in (0.5, 0.9, 0.99)] + [sh.mean()]
    assert built == []
    monkeypatch.undo()
    window = sh.window()
    assert window is not None and window.count == 11.0 > 0
    assert window.buckets == ((0.1, 1.0), (0.5, 5.0), (1.0, 9.0), (math.inf, 11.0))
    assert answers == [bucket_quantile(q, window.buckets) for q in (0.5, 0.9, 0.99)] + [window.sum / window.count]
