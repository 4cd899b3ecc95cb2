"""The banner shown while the agent is unreachable; hidden otherwise."""

from __future__ import annotations

from rich.text import Text

from lynxtop.contract.format import fmt_clock, fmt_duration
from lynxtop.tui.glyphs import app_ascii, glyph
from lynxtop.tui.live_state import LiveState
from lynxtop.tui.widgets.text_panel import TextPanel


class OutageBanner(TextPanel):
    DEFAULT_CSS = """
    OutageBanner { height: 1; display: none; background: $error; color: $text; text-style: bold; }
    OutageBanner.-visible { display: block; }
    """

    def show(self, state: LiveState, now_ms: int, utc: bool, retry_in_s: float | None) -> None:
        outage = state.outage
        if self.has_class("-visible") != (outage is not None):
            self.set_class(outage is not None, "-visible")
        if outage is None:
            return
        age = state.age_s(now_ms)
        text = f"⚠ agent unreachable since {fmt_clock(outage.since_ms, utc)}"
        text += f" — last values shown greyed, {fmt_duration(age)} old" if age is not None else " — no data yet"
        if retry_in_s is not None:
            text += f"; retrying in {fmt_duration(retry_in_s)}"
        text += f"  [{outage.error}]"
        self.update(Text(glyph(text, app_ascii(self))))  # drawn again only when the text changes
