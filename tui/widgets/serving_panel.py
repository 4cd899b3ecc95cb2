"""Throughput, queue, KV cache and latency of the serving process, with sparklines of the last minutes."""

from __future__ import annotations

from rich.console import Group
from rich.table import Table
from rich.text import Text
from textual.widgets import Static

from lynxtop.tui.format import NA, fmt_int, fmt_ms, fmt_pct, fmt_si
from lynxtop.tui.live_state import LiveState
from lynxtop.tui.plot import sparkline


class ServingPanel(Static):
    DEFAULT_CSS = "ServingPanel { height: auto; border: round $primary-darken-2; padding: 0 1; }"

    def __init__(self, ascii_only: bool = False, **kwargs):
        super().__init__(**kwargs)
        self.ascii_only = ascii_only
        self.border_title = "Serving"

    def show(self, state: LiveState) -> None:
        sm = state.section("serving_metrics")
        sla = state.section("sla")
        width = max(8, self.size.width - 2)
        stats = Text(no_wrap=True, overflow="ellipsis")

        def stat(label: str, value: str, style: str = "") -> None:
            stats.append(f"{label} ", style="dim")
            stats.append(value, style=style or ("dim" if value == NA else "bold"))
            stats.append("   ")

        if sm and not sm.get("scrape_ok", 1):
            stats.append("✗ /metrics not readable ", style="bold red")
        stat("req/s", fmt_si(sm.get("requests_per_s")))
        stat("gen tok/s", fmt_si(sm.get("generation_tokens_per_s")))
        stat("run/wait", f"{fmt_int(sm.get('requests_running'))}/{fmt_int(sm.get('requests_waiting'))}")
        kv = sm.get("kv_cache_usage_pct")
        stat("KV", fmt_pct(kv, 1), "bold red" if kv is not None and kv >= 95 else "")
        pre = sm.get("preemptions")
        stat("preempt", fmt_int(pre), "bold yellow" if pre else "")
        stat("prefix hit", fmt_pct(sm.get("prefix_cache_hit_pct"), 1))
        spark_w = max(4, width - 38)
        table = Table.grid(padding=(0, 1))
        table.add_column(width=5)
        table.add_column(justify="right", width=9)
        table.add_column(justify="right", width=11)
        table.add_column(width=9)
        table.add_column(width=spark_w)
        thresholds = {"ttft": sla.get("ttft_threshold_ms"), "tpot": sla.get("tpot_threshold_ms")}
        for series in ("ttft", "tpot", "itl"):
            p50, p99 = sm.get(f"{series}_p50_ms"), sm.get(f"{series}_p99_ms")
            limit = thresholds.get(series)
            over = limit is not None and p99 is not None and p99 > limit
            p99_text = Text(fmt_ms(p99) + (" ✗" if over else ""), style="bold red" if over else "")
            values = [v for _, v in state.serving_series(f"{series}_p99_ms")]
            spark = Text(sparkline(values, spark_w, ascii_only=self.ascii_only), style="cyan")
            table.add_row(Text(series.upper(), style="bold"), Text(f"p50 {fmt_ms(p50)}"),
                          Text("p99 ") + p99_text, Text(f"≤{fmt_ms(limit)}" if limit else "", style="dim"), spark)
        tok = [v for _, v in state.serving_series("generation_tokens_per_s")]
        table.add_row(Text("tok/s", style="bold"), Text(fmt_si(sm.get("generation_tokens_per_s"))), Text(""),
                      Text(""), Text(sparkline(tok, spark_w, ascii_only=self.ascii_only), style="green"))
        self.update(Group(stats, table))
