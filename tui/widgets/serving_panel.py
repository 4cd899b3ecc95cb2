"""Throughput, queue, KV cache and latency of the serving process, with sparklines of the last minutes."""

from __future__ import annotations

from rich.text import Text
from textual.content import Content

from lynxtop.contract.format import NA, fmt_int, fmt_ms, fmt_pct, fmt_si
from lynxtop.contract.quantile import fmt_series, lowest_bucket_column, over
from lynxtop.contract.status import FEW_OBSERVATIONS, ServingState, ServingStatus, SlaStatus, not_served_text
from lynxtop.tui.engine_lag import lagging, summary
from lynxtop.tui.glyphs import glyph
from lynxtop.tui.live_state import LiveState
from lynxtop.tui.plot import sparkline
from lynxtop.tui.widgets.node_header import sla_limit
from lynxtop.tui.widgets.startup_phases import reading_age
from lynxtop.tui.widgets.text_panel import TextPanel, set_border
from lynxtop.tui.window_stats import RATE_WINDOW_MS, span_label, window_mean

EXTRA_SERIES = ("e2e", "queue")
NOT_SERVED = "n/s"  # a figure whose family this vLLM's page lacks (ServingStatus.not_served)


class ServingPanel(TextPanel):
    DEFAULT_CSS = "ServingPanel { height: 7; border: round $primary-darken-2; padding: 0 1; }"

    def __init__(self, ascii_only: bool = False, **kwargs):
        super().__init__(**kwargs)
        self.ascii_only = ascii_only
        self.border_title = "Serving"
        self._state: LiveState | None = None
        self._now_ms: int | None = None
        self._tip = ""  # the tooltip set (each assignment of one costs a refresh)

    def on_resize(self) -> None:
        # The rows shown depend on the height: drawn again once the layout has given the panel its size.
        if self._state is not None:
            self.show(self._state, self._now_ms)

    def show(self, state: LiveState, now_ms: int | None = None) -> None:
        """`now_ms`: now on the node's clock, for the age of what is shown as last read (the status' time where
        not given)."""
        self._state, self._now_ms = state, now_ms
        sm = state.serving_metrics
        width = max(8, self.size.width - 2)
        spark_w = max(4, width - 46)
        asc = self.ascii_only
        missing = state.serving.not_served
        lines = [stats_line(state, width < 100, asc, now_ms)]
        # E2E and queue p99 where the panel has rows to spare (it takes the Node view's free rows at 80x24)
        spare = max(0, self.size.height - 5)  # size is inside the border
        few: list[str] = []  # the rows whose percentiles come from few observations, as `TTFT n=1`
        for series in ("ttft", "tpot", "itl", *EXTRA_SERIES[:spare]):
            # a percentile in the histogram's lowest bucket reads as its bound (`<300 ms`): interpolated from 0,
            # the figure is made up (p50 150 ms of queueing with nothing queued)
            p50, p99 = fmt_series(sm.metric, series, "p50"), fmt_series(sm.metric, series, "p99")
            if series in missing:  # this vLLM has no such histogram: not "no traffic"
                p50 = p99 = NOT_SERVED
            limit = sla_limit(state.sla, series)
            breach = over(sm.metric(f"{series}_p99_ms"), sm.metric(lowest_bucket_column(series)), limit)
            line = Text(no_wrap=True, overflow="crop")
            line.append(f"{series.upper():<5}", style="bold")
            line.append(f" p50 {p50:>8}  p99 ")
            line.append(f"{p99 + (' ' + glyph('✗', asc) if breach else ''):>10}", style="bold red" if breach else "")
            line.append(f" {(glyph('≤', asc) + fmt_ms(limit)) if limit else '':>9} ", style="dim")
            # a p99 of a handful of requests says so (`n=1`), its cells taken from this row's sparkline: no wider
            n = few_count(state.serving, series, sm.metric(f"{series}_p99_ms"))
            note = "" if n is None else f"n={n} "
            if note:
                line.append(note, style="bold yellow")
                few.append(f"{series.upper()} {note.strip()}")
            values = [v for _, v in state.serving_series(f"{series}_p99_ms")]
            line.append(sparkline(values, max(1, spark_w - len(note)), ascii_only=self.ascii_only), style="cyan")
            lines.append(line)
        tok = [v for _, v in state.serving_series("generation_tokens_per_s")]
        line = Text(no_wrap=True, overflow="crop")
        line.append(f"{'tok/s':<5}", style="bold")
        line.append(f" {fmt_si(sm.metric('generation_tokens_per_s')):>12}{'':>25} ")
        line.append(sparkline(tok, spark_w, ascii_only=self.ascii_only), style="green")
        lines.append(line)
        out = Text("\n", no_wrap=True, overflow="crop").join(lines)
        out.no_wrap, out.overflow = True, "crop"
        window = state.sla.window_s
        # The SLA badge judges p99 over this same window: say it, so the two figures can be compared.
        title = f"Serving {glyph('·', asc)} p50/p99 over {window:g}s" if window is not None else "Serving"
        # engine labels are vLLM's: text, never markup; both set only when changed (each repaints the panel)
        set_border(self, title, Content(glyph(_engines_hint(state), asc)))
        # the panel has no row to spare: the quantities this vLLM does not serve are said in its tooltip
        hint = not_served_text(state.serving)
        if hint:
            hint += f" ({NOT_SERVED} in the panel: its figures stay empty for this run)"
        if few:
            hint = "\n".join(filter(None, (hint, few_text(few, state.serving, state.sla))))
        if self._tip != hint:  # set only when changed
            self._tip = hint
            self.tooltip = Text(hint) if hint else None  # text, never markup: the version is vLLM's
        self.update(out)


def few_count(serving: ServingStatus, series: str, p99: float | None) -> int | None:
    """The observations behind `series`' shown p99 where fewer than FEW_OBSERVATIONS (then `n=` beside it); None
    where there is no figure, the count is unknown (an older agent) or enough."""
    n = serving.window_count(series)
    if p99 is None or n is None or n >= FEW_OBSERVATIONS or series in serving.not_served:
        return None
    return n


def few_text(few: list[str], serving: ServingStatus, sla: SlaStatus) -> str:
    """The tooltip's line for the rows marked `n=`: what n is, the rule, and what the SLA judged."""
    window = f" {serving.window_s:g} s" if serving.window_s is not None else ""
    text = (f"n = requests in the{window} window a row's p50/p99 come from, shown below {FEW_OBSERVATIONS} (a p99 "
            f"of fewer than 100 is no 99th percentile): {', '.join(few)}")
    if any(f.startswith("ITL ") for f in few):
        text += " (ITL: inter-token intervals)"
    if sla.window_requests is not None:
        what = ("request(s) given a first token (no finished-request counter on the page)"
                if sla.window_requests_source == "ttft" else "finished request(s)")
        text += (f"; the SLA judged {sla.window_requests} {what}"
                 + (f" (no breach opens on fewer than {FEW_OBSERVATIONS})"
                    if sla.window_requests < FEW_OBSERVATIONS else ""))
    return text


def stopping_stats(state: LiveState, short: bool, now_ms: int | None) -> Text:
    """`not read while vLLM stops · run/wait 3/1 read 20s ago, before the stop`: the agent reads no metrics while
    a run stops, so the panel says why its figures are empty instead of a row of N/A, and shows the drain's counts
    as the serving line does (the same reading, the same age), never N/A beside them."""
    t = Text(no_wrap=True, overflow="ellipsis")
    t.append("not read while vLLM stops", style="bold yellow")
    reading = state.reading_at_stop()
    if reading is not None:
        ts, running, waiting = reading
        t.append("  " if short else "   ")
        t.append("r/w " if short else "run/wait ", style="dim")
        t.append(f"{running:g}/{waiting:g}", style="bold")
        age = f"read {reading_age(ts, now_ms)}" if now_ms is not None else "as last read"
        t.append(f" {age}, before the stop", style="dim")
    return t


def _engines_hint(state: LiveState) -> str:
    """With data-parallel engines, the border says whether one lags even while the totals are shown."""
    engines = state.engines
    if len(engines) < 2:
        return ""
    return f"{summary(engines, lagging(engines))} · e shows each"


def stats_line(state: LiveState, short: bool, ascii_only: bool = False, now_ms: int | None = None) -> Text:
    """Throughput, queue, KV cache, preemptions and prefix hits; short labels below 100 columns. While vLLM
    stops, what the agent does not read then (`stopping_stats`). `now_ms`: as ServingPanel.show's."""
    sm = state.serving_metrics
    stats = Text(no_wrap=True, overflow="ellipsis")
    gap = "  " if short else "   "
    if state.serving.state == ServingState.STOPPING and all(
            sm.metric(k) is None for k in ("requests_running", "requests_waiting", "generation_tokens_per_s")):
        return stopping_stats(state, short, state.ts_ms if now_ms is None else now_ms)

    def stat(label: str, value: str, style: str = "", note: str = "") -> None:
        stats.append(f"{label} ", style="dim")
        stats.append(value, style=style or ("dim" if value in (NA, NOT_SERVED) else "bold"))
        if note:
            stats.append(f" {note}", style="dim")
        stats.append(gap)

    if sm.metric("scrape_ok") == 0:
        stats.append(f"{glyph('✗', ascii_only)} /metrics not readable ", style="bold red")
    # Finished requests per tick read 0 for minutes when requests take longer than a tick: the mean
    # over the last minutes is shown, and says so.
    interval_ms = int(float(state.agent.sample_interval_s or 1.0) * 1000)
    end = state.ts_ms
    # Over this run only: after a switch, the last run's requests and the downtime are not this run's rate.
    srv = state.serving
    rate, span_ms = window_mean(state.serving_series("requests_per_s"), end, RATE_WINDOW_MS, interval_ms,
                                start_ms=srv.ready_ms or srv.started_ms)
    if state.status is None or not state.serving.state.serving:
        rate = None  # nothing serves: the last run's average is not this moment's rate
    stat("req/s", fmt_si(rate), note=f"avg {span_label(span_ms)}" if rate is not None else "")
    missing = state.serving.not_served

    def served(text: str, *quantities: str) -> str:
        """`text`, or n/s where the page lacks a family it is read from."""
        return NOT_SERVED if any(q in missing for q in quantities) else text

    stat("tok/s" if short else "gen tok/s", served(fmt_si(sm.metric("generation_tokens_per_s")), "generation_tokens"))
    stat("r/w" if short else "run/wait",
         f"{fmt_int(sm.metric('requests_running'))}/{fmt_int(sm.metric('requests_waiting'))}")
    kv = sm.metric("kv_cache_usage_pct")
    stat("KV", served(fmt_pct(kv, 1), "kv_usage"), "bold red" if kv is not None and kv >= 95 else "")
    pre = sm.metric("preemptions")
    stat("preempt", served(fmt_int(pre), "preemptions"), "bold yellow" if pre else "")
    stat("hit" if short else "prefix hit", served(fmt_pct(sm.metric("prefix_cache_hit_pct"), 1), "prefix_queries",
                                                  "prefix_hits"))
    return stats
