"""Two runs side by side: profile and flag differences, throughput, latency, GPU activity."""

from __future__ import annotations

import re
from dataclasses import fields
from typing import Any

from rich.console import Console, ConsoleOptions, RenderResult
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

from lynxtop.contract.change import RULE, change_pct
from lynxtop.contract.format import (
    NA,
    fmt_bytes,
    fmt_datetime,
    fmt_duration,
    fmt_ms,
    fmt_pct,
    fmt_si,
    fmt_temp,
    fmt_watts,
)
from lynxtop.contract.quantile import fmt_quantile, lowest_bucket_column
from lynxtop.contract.records import ProfileInfo, RunInfo
from lynxtop.tui.control_text import flag_diff
from lynxtop.tui.history_source import HistoryUnavailable
from lynxtop.tui.screens import VIEWS_CSS

SKIP = {"id", "flags", "argv", "summary", "pid_start_time", "gpus"}


# A run's own `*_ms` fields are times (started, ready, ended); every other `*_ms` (the summary's) is a latency or
# a duration. Read from the record, so a time the runs table gains is shown as one without a list to keep in step.
RUN_TIMES = frozenset(f.name for f in fields(RunInfo) if f.name.endswith("_ms"))


# A summary percentile of a latency series (`serving.tpot_p99_ms`, its worst tick `serving.tpot_p99_max_ms`): read
# with the series' lowest-bucket bound, as the Serving panel reads it (contract/quantile.py).
_QUANTILE = re.compile(r"serving\.(?P<series>[a-z0-9_]+?)_p\d+(?:_max)?_ms")
BOUND_SUFFIX = lowest_bucket_column("")  # "_lowest_bucket_ms": the bounds format their rows, no rows of their own
# Above the latency rows, so they read as what they are: means of windowed percentiles, not the run's percentiles.
LATENCY_HEADING = "latency: run mean of per-tick windowed pNN; _max: worst tick; <x: at most x"


class _Heading:
    """A heading in the label column that wraps to the width the rows' labels give that column instead of
    widening it (a long Text would take width from the values at 80 columns)."""

    def __init__(self, text: Text, width: int):
        self.text, self.width = text, width

    def __rich_measure__(self, console: Console, options: ConsoleOptions) -> Measurement:
        m = Measurement.get(console, options, self.text)
        return Measurement(min(m.minimum, self.width), min(m.maximum, self.width))

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        yield self.text


def _bound_key(key: str) -> str | None:
    """The summary key of the lowest-bucket bound a latency percentile row is read with; None for other rows."""
    m = _QUANTILE.fullmatch(key)
    return f"serving.{lowest_bucket_column(m['series'])}" if m else None


def _fmt_energy(joules: float) -> str:
    """Energy in J, kJ, MJ or GJ, 3 significant digits (a GPU's run is ~MJ: 700 W for an hour is 2.5 MJ)."""
    value = float(joules)
    for unit in ("J", "kJ", "MJ", "GJ"):
        if abs(value) < 1000 or unit == "GJ":
            return f"{value:.0f} J" if unit == "J" else f"{value:.3g} {unit}"
        value /= 1000
    return NA  # pragma: no cover


def _label(key: str) -> str:
    """A run's time by what it is ("ready at"), not its column: a `*_ms` row holds milliseconds of latency."""
    return f"{key.removesuffix('_ms')} at" if key in RUN_TIMES else key


def _fmt_value(key: str, v: Any, utc: bool = False, bound: float | None = None) -> str:
    """A value for the operator: a run's time to the second in the dashboard's zone, any other `*_ms` in ms (s
    from 1000 ms) as everywhere in the dashboard; it was a date ("1970-01-01 00:00") unless its name held one of
    five words. A percentile with its series' lowest-bucket `bound` reads `<10.0 ms` where it lies in that bucket
    (s22: it read 9.9 ms, interpolated from 0, where the Serving panel says <10.0 ms); GPU power and energy with
    their units."""
    if v is None:
        return NA
    if isinstance(v, float | int) and not isinstance(v, bool):
        if key in RUN_TIMES:
            return fmt_datetime(v, utc, seconds=True)
        if key.endswith("_ms"):
            return fmt_quantile(v, bound) if _bound_key(key) else fmt_ms(v)
        if key.startswith("gpus.power_w"):
            return fmt_watts(v)
        if key.startswith("gpus.energy_j"):
            return _fmt_energy(v)
        if key.startswith("gpus.temp_"):
            return fmt_temp(v)
        if "bytes" in key:
            return fmt_bytes(v)
        if "_pct" in key:
            return fmt_pct(v, 1)
        if key.endswith("_per_s"):
            return fmt_si(v)
        if key.endswith("_s"):
            return fmt_duration(v)
        if key.startswith("gpus.") and isinstance(v, float):
            return f"{v:.1f}"
        return f"{v:,.4g}" if isinstance(v, float) else str(v)
    if isinstance(v, list | tuple):
        return ", ".join(map(str, v))
    return str(v)


def _flatten(run: dict[str, Any]) -> dict[str, Any]:
    out = {k: v for k, v in run.items() if k not in SKIP and not isinstance(v, dict)}
    summary = run.get("summary")
    if isinstance(summary, dict):
        for k, v in summary.items():
            if k == "gpus" and isinstance(v, list):
                out.update(_gpu_activity(v))
            elif isinstance(v, dict):
                for k2, v2 in v.items():
                    out[f"{k}.{k2}"] = v2
            else:
                out[k] = v
    return out


def _gpu_activity(gpus: list[dict[str, Any]]) -> dict[str, Any]:
    """Per-GPU summaries -> mean activity across GPUs and the extremes an operator compares."""
    def mean(key: str) -> float | None:
        vals = [g[key] for g in gpus if g.get(key) is not None]
        return sum(vals) / len(vals) if vals else None

    def top(key: str) -> float | None:
        vals = [g[key] for g in gpus if g.get(key) is not None]
        return max(vals) if vals else None

    return {
        "gpus.count": len(gpus),
        "gpus.sm_active_pct (mean)": mean("sm_active_pct"),
        "gpus.util_gpu_pct (mean)": mean("util_gpu_pct"),
        "gpus.power_w (mean)": mean("power_w"),
        "gpus.temp_max_c (max)": top("temp_max_c"),
        "gpus.mem_used_max_bytes (max)": top("mem_used_max_bytes"),
        "gpus.energy_j (sum)": sum(g.get("energy_j") or 0 for g in gpus) or None,
    }


def compare_table(a: dict[str, Any], b: dict[str, Any], utc: bool = False) -> Table:
    """Every field and summary value of two runs, one row each, in bold where they differ."""
    table = Table(show_header=True, header_style="bold", expand=True)
    # A label too long wraps whole: cut, "serving.prompt_tokens_per_s" and "serving.prompt_tokens" read the same
    table.add_column("", overflow="fold")
    table.add_column(f"run {a.get('id')}")
    table.add_column(f"run {b.get('id')}")
    fa, fb = _flatten(a), _flatten(b)
    keys = [k for k in [k for k in fa if k in fb] + [k for k in fb if k not in fa] if not k.endswith(BOUND_SUFFIX)]
    heading = _Heading(Text(LATENCY_HEADING, style="italic"), max((len(_label(k)) for k in keys), default=24))
    in_latency = False
    for key in keys:
        latency = key.startswith("serving.") and key.endswith("_ms")
        if latency != in_latency and table.row_count:
            table.add_section()
        if latency and not in_latency:
            table.add_row(heading, "", "")
        in_latency = latency
        bound = _bound_key(key)
        va = _fmt_value(key, fa.get(key), utc, fa.get(bound) if bound else None)
        vb = _fmt_value(key, fb.get(key), utc, fb.get(bound) if bound else None)
        style = "bold" if va != vb else ""
        table.add_row(Text(_label(key), style="dim"), Text(va, style=style), Text(vb, style=style))
    return table


def _completed(row: dict[str, Any]) -> int | None:
    """Requests a stored level completed: its vLLM summary's count, else prompts less errors."""
    summary = (row.get("details") or {}).get("summary") or {}
    if isinstance(summary.get("completed"), int):
        return summary["completed"]
    if row.get("num_prompts") is None:
        return None
    return int(row["num_prompts"]) - int(row.get("errors") or 0)


def bench_table(a: dict[str, Any], b: dict[str, Any], bench: list[dict[str, Any]]) -> Table:
    """Benchmark curves side by side: per concurrency each run's requests completed (n), throughput with a bar,
    TTFT p99 over those requests, and the second run's throughput against the first's in percent only where both
    sides completed enough requests (contract/change.py). Rows come newest first; a run with several sweeps shows
    its newest."""
    table = Table(title="benchmark curves (lynxtop bench)", show_header=True, header_style="bold", expand=False,
                  caption=f"n: requests completed at the level, TTFT p99 over them; {RULE}")
    table.add_column("concurrency", justify="right")
    top = max((r.get("output_tokens_per_s") or 0 for r in bench), default=0) or 1
    newest: dict[int, Any] = {}
    by_key: dict[tuple[int, int], dict[str, Any]] = {}
    for r in bench:
        sweep = newest.setdefault(r["run_id"], r.get("bench_id"))
        if r.get("bench_id") == sweep:
            by_key.setdefault((r["run_id"], r.get("concurrency") or 0), r)
    for run in (a, b):
        table.add_column(f"run {run.get('id')} n", justify="right")
        table.add_column("out tok/s", justify="right")
        table.add_column("", no_wrap=True)
        table.add_column("TTFT p99", justify="right")
    table.add_column(f"run {b.get('id')} vs {a.get('id')}", justify="right")
    for conc in sorted({c for _, c in by_key}):
        cells: list[Any] = [str(conc)]
        toks, counts = [], []
        for run in (a, b):
            r = by_key.get((run.get("id"), conc), {})
            tok = r.get("output_tokens_per_s")
            toks.append(tok)
            counts.append(_completed(r) if r else None)
            mark = " *" if r.get("partial") else ""
            cells += [NA if counts[-1] is None else str(counts[-1]), fmt_si(tok) + mark,
                      Text("█" * int((tok or 0) / top * 12), style="cyan"), fmt_ms(r.get("ttft_p99_ms"))]
        cells.append(change_pct(toks[0], toks[1], counts[0], counts[1]))
        table.add_row(*cells)
    return table


def _as_dict(record: Any) -> dict[str, Any]:
    """A run or bench row as a dict, whether the reader gives dicts or typed records (contract/records.py)."""
    return record if isinstance(record, dict) else record.to_json()


def _statistics(a: dict[str, Any], b: dict[str, Any]) -> Text:
    """What the numbers below are and how many readings each rests on: no percentages here, two runs' means say
    nothing about a difference when one run holds a handful of samples."""
    def n(run: dict[str, Any], part: str) -> str:
        summary = run.get("summary") or {}
        if part == "serving":
            count = (summary.get("serving") or {}).get("samples")
        else:
            gpus = summary.get("gpus") or []
            count = min((g.get("samples") or 0 for g in gpus), default=None)
        return NA if count is None else str(count)

    t = Text(f"n (stored samples, one a poll): serving run {a.get('id')} {n(a, 'serving')}, run {b.get('id')} "
             f"{n(b, 'serving')}; GPU run {a.get('id')} {n(a, 'gpu')}, run {b.get('id')} {n(b, 'gpu')} "
             "(fewest of its GPUs)\n", style="bold")
    t.append("serving.*: mean over the run's samples of each reading (a *_p99_ms is vLLM's p99 of each interval, "
             "averaged; *_max_ms the worst interval); gpus.*: each GPU's mean over the run, then across GPUs",
             style="dim")
    return t


BENCH_READ = 1000  # bench results read for the two runs: ten sweeps of a hundred levels a side


def _bench_of(reader: Any, run_ids: tuple[int, int]) -> list[Any]:
    """The two runs' bench results, newest first, chosen by the database: the newest BENCH_READ of all runs,
    filtered here, lost both runs' curves once others had run 1,000 levels since (s21). Another node's reader
    chooses them in that node's database too (tui/cluster_source.py); one that takes no `run_ids` (a node whose
    agent is older than s21: FiltersUnsupported, a TypeError) gives its newest, filtered by the caller."""
    try:
        return reader.bench_results(limit=BENCH_READ, run_ids=run_ids)
    except TypeError as exc:
        if "unexpected keyword" not in str(exc):
            raise
    return reader.bench_results(limit=BENCH_READ)


class CompareScreen(ModalScreen[None]):
    CSS_PATH = VIEWS_CSS
    BINDINGS = [Binding("escape,q", "close", "Close", id="compare.close")]

    def __init__(self, run_a: int, run_b: int):
        super().__init__()
        self.run_a, self.run_b = run_a, run_b

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="dialog", classes="wide"):
            yield Static(f"Compare run {self.run_a} with run {self.run_b}", id="dialog-title", markup=False)
            yield Static("loading…", id="compare-body")
            yield Static("Esc closes", id="dialog-hint")

    def on_mount(self) -> None:
        self.load()

    @work(thread=True, exit_on_error=False)
    def load(self) -> None:
        app: Any = self.app
        try:
            with app.history.reader() as reader:
                a, b = reader.run(self.run_a), reader.run(self.run_b)
                bench = [r for r in _bench_of(reader, (self.run_a, self.run_b))
                         if r.get("run_id") in (self.run_a, self.run_b)]
        except HistoryUnavailable as exc:
            self.app.call_from_thread(self._show_error, str(exc))
            return
        except Exception as exc:  # a damaged database: say so in the dialog, keep the app alive
            self.app.call_from_thread(self._show_error, str(exc))
            return
        self.app.call_from_thread(self._show, a, b, bench)

    def _show_error(self, message: str) -> None:
        self.query_one("#compare-body", Static).update(Text(f"✗ {message}", style="bold red"))

    def _show(self, a: dict[str, Any] | None, b: dict[str, Any] | None, bench: list[dict[str, Any]]) -> None:
        if a is None or b is None:
            missing = self.run_a if a is None else self.run_b
            self._show_error(f"run {missing} is not in the database")
            return
        from rich.console import Group

        a, b = _as_dict(a), _as_dict(b)
        bench = [_as_dict(r) for r in bench]

        diff = flag_diff(ProfileInfo(str(a.get("profile")), flags=a.get("flags") or {}),
                         ProfileInfo(str(b.get("profile")), flags=b.get("flags") or {}))
        flags = Table(show_header=True, header_style="bold", box=None)
        flags.add_column("flag")  # the database's words as Text: a str cell or header would be parsed as markup
        flags.add_column(Text(f"run {a.get('id')} ({a.get('profile')})"))
        flags.add_column(Text(f"run {b.get('id')} ({b.get('profile')})"))
        for flag, va, vb in diff:
            flags.add_row(Text(flag), Text(va), Text(vb))
        head = Text(f"{len(diff)} flag difference(s)" if diff else "same flags", style="bold")
        utc = bool(getattr(self.app, "utc", False))  # the run's times in the zone the rest of the dashboard uses
        parts = [head, flags, Text(""), _statistics(a, b), compare_table(a, b, utc)]
        if bench:
            parts += [Text(""), bench_table(a, b, bench)]
        self.query_one("#compare-body", Static).update(Group(*parts))

    def action_close(self) -> None:
        self.dismiss(None)
