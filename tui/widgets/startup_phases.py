"""Start-up progress phase by phase: a 284B model spends minutes in each, and operators want to see which."""

from __future__ import annotations

from rich.text import Text

from lynxtop.tui.format import fmt_duration
from lynxtop.tui.widgets.text_panel import TextPanel

PHASES = ("loading weights", "kv cache", "cuda graphs", "api up")


class StartupPhases(TextPanel):
    DEFAULT_CSS = """
    StartupPhases { height: 1; display: none; }
    StartupPhases.-visible { display: block; }
    """

    def show(self, serving: dict, now_ms: int) -> None:
        starting = serving.get("state") == "starting"
        if self.has_class("-visible") != starting:
            self.set_class(starting, "-visible")
        if not starting:
            return
        seen = {p.get("phase"): p.get("ts_ms") for p in serving.get("phases") or [] if p.get("phase")}
        current = serving.get("phase")
        started = serving.get("started_ms") or serving.get("state_since_ms") or now_ms
        t = Text("start-up: ", style="bold yellow", no_wrap=True, overflow="ellipsis")
        t.append(f"{fmt_duration((now_ms - started) / 1000)} ")
        order = list(PHASES) + [p for p in seen if p not in PHASES]
        times = [seen.get(p) for p in order]
        for i, phase in enumerate(order):
            ts = times[i]
            if phase == current:
                t.append(f"▶ {phase} {fmt_duration((now_ms - (ts or now_ms)) / 1000)}", style="bold")
            elif ts is not None:
                nxt = next((x for x in times[i + 1:] if x is not None), now_ms)
                t.append(f"✓ {phase} {fmt_duration((nxt - ts) / 1000)}", style="green")
            else:
                t.append(f"· {phase}", style="dim")
            if i < len(order) - 1:
                t.append("  ")
        self.update(t)
