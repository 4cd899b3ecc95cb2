"""What Prometheus computes, written from its source and independent of lynxtop: the expected values in tests.

- `increase`: promql/functions.go extrapolatedRate with isCounter, before extrapolation: last minus first plus,
  at every sample below the one before it (a counter reset), that previous value. With samples on both ends of
  the range (how the tests place them) Prometheus does not extrapolate, so this is `increase(x[range])` exactly.
- `quantile`: promql/quantile.go bucketQuantile (sorted buckets, monotonic repair, +Inf rule, interpolation).
- `Series`: raw per-series samples read from real exposition pages with prometheus_client (no summing first),
  so `increase` runs per series as Prometheus' `rate()` does, each `le` bucket on its own.
- `promtool_eval`: the same expressions evaluated by a real Prometheus (`promtool test rules`), when installed.
"""

from __future__ import annotations

import math
import re
import shutil
import subprocess
import tempfile
from collections import defaultdict
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families


def increase(values: list[float]) -> float:
    """Prometheus' counter-corrected increase over the samples of one series in a range."""
    result = values[-1] - values[0]
    last = 0.0
    for v in values:
        if v < last:
            result += last
        last = v
    return result


def quantile(q: float, buckets: dict[float, float]) -> float:
    """Prometheus' bucketQuantile over {upper bound: cumulative count}; NaN where Prometheus gives NaN."""
    bs = sorted(buckets.items())
    if len(bs) < 2 or not math.isinf(bs[-1][0]):
        return math.nan
    counts, top = [], -math.inf
    for _, c in bs:
        top = max(top, c)
        counts.append(top)
    total = counts[-1]
    if total == 0:
        return math.nan
    rank = q * total
    b = next((i for i in range(len(bs) - 1) if counts[i] >= rank), len(bs) - 1)
    if b == len(bs) - 1:
        return bs[-2][0]
    if b == 0 and bs[0][0] <= 0:
        return bs[0][0]
    start = 0.0 if b == 0 else bs[b - 1][0]
    below = 0.0 if b == 0 else counts[b - 1]
    return start + (bs[b][0] - start) * (rank - below) / (counts[b] - below)


Key = tuple[str, tuple[tuple[str, str], ...]]


class Series:
    """Every sample of every page fed, per series (name and labels), with the scrape time."""

    def __init__(self) -> None:
        self.samples: dict[Key, list[tuple[float, float]]] = defaultdict(list)

    def add_page(self, t: float, text: str) -> None:
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                if s.name.startswith("vllm:") and not s.name.endswith("_created"):
                    self.samples[(s.name, tuple(sorted(s.labels.items())))].append((t, float(s.value)))

    def _in_range(self, key: Key, start: float, end: float) -> list[float]:
        return [v for t, v in self.samples[key] if start <= t <= end]  # Prometheus 2.x: both ends included

    def increase(self, name: str, start: float, end: float, **match: str) -> float:
        """sum(increase(name[end - start])) at `end`, over every series of `name` matching the labels."""
        total = 0.0
        for key in self.samples:
            labels = dict(key[1])
            if key[0] == name and all(labels.get(k) == v for k, v in match.items()):
                vals = self._in_range(key, start, end)
                if len(vals) >= 2:
                    total += increase(vals)
        return total

    def histogram_quantile(self, q: float, name: str, start: float, end: float) -> float:
        """histogram_quantile(q, sum by (le) (increase(name_bucket[end - start]))) at `end`."""
        per_le: dict[float, float] = defaultdict(float)
        for key in self.samples:
            if key[0] == name + "_bucket":
                vals = self._in_range(key, start, end)
                if len(vals) >= 2:
                    per_le[float(dict(key[1])["le"])] += increase(vals)
        return quantile(q, per_le)

    def promtool_input(self, names: set[str], step: float) -> str:
        """input_series for `promtool test rules`, one value per step from t = 0 ('_' where absent)."""
        lines = []
        for (name, labels), pts in self.samples.items():
            if name not in names:
                continue
            by_t = {round(t / step): v for t, v in pts}
            values = " ".join(repr(by_t[i]) if i in by_t else "_" for i in range(max(by_t) + 1))
            sel = ",".join(f'{k}="{v}"' for k, v in labels)
            lines.append(f"      - series: '{name}{{{sel}}}'\n        values: '{values}'")
        return "\n".join(lines)


def promtool_eval(series: Series, names: set[str], step: float, exprs: list[tuple[str, float]]) -> list[float]:
    """Evaluate each (expr, eval_time) with a real Prometheus through `promtool test rules`: the test asks for an
    impossible value and reads what Prometheus got from the failure report (printed at full precision)."""
    promtool = shutil.which("promtool")
    assert promtool is not None
    tests = "\n".join(f"      - expr: '{e}'\n        eval_time: {t:g}s\n        exp_samples:\n"
                      f"          - labels: '{{}}'\n            value: -12345" for e, t in exprs)
    doc = (f"evaluation_interval: {step:g}s\ntests:\n  - interval: {step:g}s\n    input_series:\n"
           f"{series.promtool_input(names, step)}\n    promql_expr_test:\n{tests}\n")
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "t.yml"
        path.write_text(doc)
        out = subprocess.run([promtool, "test", "rules", str(path)], capture_output=True, text=True, timeout=60)
    got = re.findall(r"got: (.*)", out.stdout + out.stderr)
    assert len(got) == len(exprs), out.stdout + out.stderr
    return [float(g.split()[-1]) if g.strip() not in ("[]", "") else math.nan for g in got]
