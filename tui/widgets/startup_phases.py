"""The serving line under the header: start-up progress phase by phase (a 284B model spends minutes in
each, and operators want to see which) with the most it may take (readiness_timeout_s), a stop's drain (what it
drains, for how long so far, against which timeouts), why serving is in trouble (backoff, crash loop, degraded),
or what a Ray head still waits for before it starts vLLM (waiting: the GPUs Ray does not report yet), or who stopped
serving (an operator's stop holds the agent's autostart across its restarts: the line says until when), or that a
vLLM the previous agent left serves unsupervised (`serving.held`: what it is and that Stop ends it); and why the
run's log is not kept (`serving.log_problem`: a full disk), after the rest or alone.

While a run loads, the line also says how far the checkpoint shards are (`27/60 shards (45%)`), that its log went
silent (a hung load otherwise looked like a slow one until the readiness timeout), and how long the profile's
loads usually take (its last ready runs, read from the history in a worker: never on the UI thread)."""

from __future__ import annotations

from typing import Any

from rich.text import Text

from lynxtop.contract.format import fmt_duration
from lynxtop.contract.status import LOG_SILENT_SHOW_S, ServingState, ServingStatus, load_phase, log_silent_s
from lynxtop.tui.glyphs import app_ascii, ascii_text
from lynxtop.tui.widgets.text_panel import TextPanel

PHASES = ("loading weights", "kv cache", "cuda graphs", "api up")
TROUBLE_STATES = (ServingState.BACKOFF, ServingState.CRASH_LOOP, ServingState.DEGRADED)
STOPPED_BY = "stopped by "  # the agent's reason for serving an operator stopped ("stopped by uid 1000 (alice) ...")


class StartupPhases(TextPanel):
    DEFAULT_CSS = """
    StartupPhases { height: 1; display: none; }
    StartupPhases.-visible { display: block; }
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._usual_key: tuple[str, int | None] | None = None  # the (profile, run) the usual load time was asked for
        self._usual_ms: int | None = None
        self._last_show: tuple[ServingStatus, int, tuple[int, float, float] | None] | None = None

    def on_resize(self) -> None:
        # The start-up line's form depends on the width: drawn again once the layout has given the line its size.
        if self._last_show is not None:
            self.show(*self._last_show)

    def show(self, serving: ServingStatus, now_ms: int, reading: tuple[int, float, float] | None = None) -> None:
        """`reading`: (ts_ms, running, waiting) as last read before a stop began (LiveState.reading_at_stop)."""
        self._last_show = (serving, now_ms, reading)
        state = serving.state
        if state == ServingState.STARTING and serving.profile:
            self._ask_usual(serving.profile, serving.run_id)
        trouble = state in TROUBLE_STATES and bool(serving.reason)
        waiting = state == ServingState.WAITING and bool(serving.reason)
        stopping = state == ServingState.STOPPING
        stopped = state == ServingState.STOPPED and serving.reason.startswith(STOPPED_BY)
        held = serving.held is not None and not stopping  # its stop under way: the stopping line says it
        log = bool(serving.log_problem)
        visible = state == ServingState.STARTING or trouble or waiting or stopping or stopped or held or log
        if self.has_class("-visible") != visible:
            self.set_class(visible, "-visible")
        if not visible:
            return
        if stopping:
            t = stopping_line(serving, now_ms, reading)
        elif waiting:
            t = Text(f"⧗ {serving.reason}", style="bold yellow", no_wrap=True, overflow="ellipsis")
        elif trouble:
            t = Text(f"✗ {state}: {serving.reason}", style="bold red", no_wrap=True, overflow="ellipsis")
        elif held:
            t = held_line(serving, bool(getattr(self.app, "readonly_reason", None)))
        elif stopped:
            t = Text(f"■ {serving.reason}", style="bold", no_wrap=True, overflow="ellipsis")
        elif state == ServingState.STARTING:
            usual = self._usual_ms if self._usual_key == (serving.profile, serving.run_id) else None
            t = _progress(serving, now_ms, usual, self.size.width)
        else:
            t = Text(no_wrap=True, overflow="ellipsis")
        self.update(ascii_text(_log_problem(t, serving.log_problem) if serving.log_problem else t, app_ascii(self)))


    def _ask_usual(self, profile: str, run_id: int | None) -> None:
        """How long `profile` usually loads, asked once per run from the app's history (`usual_load_ms`) in a
        thread: the database may be slow or another node's (a network read)."""
        key = (profile, run_id)
        history = getattr(self.app, "history", None)
        if key == self._usual_key or history is None:
            return
        self._usual_key, self._usual_ms = key, None

        def read() -> None:
            from lynxtop.store.reader import usual_load_ms

            try:
                with history.reader() as reader:
                    ms = usual_load_ms(reader, profile, exclude_run=run_id)
            except Exception:  # noqa: BLE001 - no history (none kept, unreadable, elsewhere): no figure, no error
                return
            self.app.call_from_thread(self._got_usual, key, ms)

        self.run_worker(read, thread=True, exclusive=True, group="usual-load", exit_on_error=False)

    def _got_usual(self, key: tuple[str, int | None], ms: int | None) -> None:
        if key == self._usual_key:
            self._usual_ms = ms


def _log_problem(t: Text, problem: str) -> Text:
    """The run's output is not kept (a full disk, a log directory that cannot be made): the line alone for a
    serving run, after what the line says otherwise (the serving state matters more, and is cut last)."""
    if t.plain:
        t.append(" · ")
    t.append(f"⚠ run log not kept: {problem}", style="bold yellow")
    return t


def _progress(serving: ServingStatus, now_ms: int, usual_ms: int | None = None, width: int = 0) -> Text:
    """Each phase done (with its duration), the one under way (with its time so far and the shards' progress), the
    ones to come; first a silent log, and how long the profile usually takes (`usual_ms`).

    Where that does not fit `width` (80 columns: the phase's detail was cut, the header's short form kept it), the
    phase under way comes first after the time so far, the limit in fewer words after it, then the phases to come
    (those done left out): what is cut is the least important, never where the load is."""
    seen = {p.phase: p.ts_ms for p in serving.phases if p.phase}
    current = serving.phase
    started = serving.started_ms or serving.state_since_ms or now_ms
    head = Text(f"{fmt_duration((now_ms - started) / 1000)} ")
    silent_s = log_silent_s(serving, now_ms)
    silent = (Text(f"⚠ log silent {fmt_duration(silent_s)} ", style="bold red")
              if silent_s is not None and silent_s >= LOG_SILENT_SHOW_S else Text())
    late = False
    if serving.ready_timeout_s is not None:
        # the most it may take before the agent stops it (an older agent's status does not say: nothing shown);
        # red in its last tenth, when a slow load is about to be stopped
        left_s = (serving.ready_deadline_ms - now_ms) / 1000 if serving.ready_deadline_ms else None
        late = left_s is not None and left_s < serving.ready_timeout_s / 10
    order = list(PHASES) + [p for p in seen if p not in PHASES]
    times = [seen.get(p) for p in order]
    phases: list[Text] = []  # in order, the one under way included
    now_phase: Text | None = None
    for i, phase in enumerate(order):
        ts = times[i]
        if phase == current:
            shown = load_phase(serving) if phase == "loading weights" else phase
            now_phase = Text(f"▶ {shown} {fmt_duration((now_ms - (ts or now_ms)) / 1000)}", style="bold")
            phases.append(now_phase)
        elif ts is not None:
            nxt = next((x for x in times[i + 1:] if x is not None), now_ms)
            phases.append(Text(f"✓ {phase} {fmt_duration((nxt - ts) / 1000)}", style="green"))
        else:
            phases.append(Text(f"· {phase}", style="dim"))

    def limit(short: bool) -> Text:
        if serving.ready_timeout_s is None:
            return Text()
        words = "at most {}" if short else "of at most {} (readiness_timeout_s)"
        return Text(words.format(fmt_duration(serving.ready_timeout_s)), style="bold red" if late else "dim")

    t = Text("start-up: ", style="bold yellow", no_wrap=True, overflow="ellipsis")
    t.append_text(head)
    t.append_text(silent)
    if usual_ms is not None:
        t.append(f"usually ready in ~{fmt_duration(usual_ms / 1000)} ", style="dim")
    if serving.ready_timeout_s is not None:
        t.append_text(limit(False))
        t.append(" ")
    t.append_text(Text("  ").join(phases))
    if not width or t.cell_len <= width or now_phase is None:
        return t
    t = Text("start-up: ", style="bold yellow", no_wrap=True, overflow="ellipsis")
    t.append_text(head)
    if late:  # about to be stopped: that before anything else
        t.append("of ", style="bold red")
        t.append_text(limit(True))
        t.append(" ")
    t.append_text(silent)
    t.append_text(now_phase)
    if not late and serving.ready_timeout_s is not None:
        t.append(" · ")
        t.append_text(limit(True))
    if usual_ms is not None:
        t.append(f" · usually ~{fmt_duration(usual_ms / 1000)}", style="dim")
    later = [p for p, ts in zip(order, times, strict=True) if p != current and ts is None]
    if later:  # the phases done go (the one under way says where the load is): those to come, in few words
        t.append(f" · next {', '.join(later)}", style="dim")
    return t


def held_line(serving: ServingStatus, readonly: bool = False) -> Text:
    """`⚠ held: vLLM left by the previous agent serves unsupervised · X Stop ends it · profile dsv41 · no start
    while it lives`: the header's `held run 12 pid 4242` in words. The header alone said STOPPED and
    `no profile` while a model served on the GPUs; what it is and what ends it come first (80 columns keep them).
    `readonly`: the dashboard refuses X, so the command is named."""
    held = serving.held
    ends = "`lynxtop stop` ends it" if readonly else "X Stop ends it"
    t = Text(f"⚠ held: vLLM left by the previous agent serves unsupervised · {ends}", style="bold yellow",
             no_wrap=True, overflow="ellipsis")
    if held is not None and held.profile:
        t.append(f" · profile {held.profile}", style="bold")
    t.append(" · no start while it lives", style="dim")
    return t


def stopping_line(serving: ServingStatus, now_ms: int, reading: tuple[int, float, float] | None) -> Text:
    """`draining 3 running, 0 waiting · 12s of 30s shutdown timeout · killed at 1m00s · counts read 20s ago, before
    the stop · why` (80 columns hold the counts and the timeouts).

    The counts are the last read before the stop (the agent reads none while a run stops), and say how old they are:
    the Serving panel shows them with the same age (`reading_age`); the timeouts are the run's, served while it stops
    (an older agent's status has none: no limit is made up)."""
    t = Text(no_wrap=True, overflow="ellipsis")
    if reading is not None:
        _, running, waiting = reading
        t.append(f"draining {running:g} running, {waiting:g} waiting", style="bold yellow")
    else:
        t.append("stopping", style="bold yellow")
    since = serving.state_since_ms
    elapsed = (now_ms - since) / 1000 if since else None
    for part in _drain_time(elapsed, serving.shutdown_timeout_s, serving.stop_grace_s):
        t.append(" · ")
        t.append_text(part)
    if reading is not None:
        t.append(f" · counts read {reading_age(reading[0], now_ms)}, before the stop", style="dim")
    if serving.reason:
        t.append(f" · {serving.reason}", style="dim")
    return t


def reading_age(ts_ms: int, now_ms: int) -> str:
    """`20s ago`: how old the last reading before a stop is, one wording for the serving line and the panel."""
    return f"{fmt_duration(max(0, now_ms - ts_ms) / 1000)} ago"


def _drain_time(elapsed: float | None, drain: float | None, grace: float | None) -> list[Text]:
    """The stop's time so far against vLLM's drain window (red once past it), then the agent's kill."""
    so_far = fmt_duration(elapsed)
    if drain is None:
        parts = [Text(so_far)]
    elif drain <= 0:
        parts = [Text(f"{so_far}, no shutdown timeout: requests aborted")]
    elif elapsed is not None and elapsed > drain:
        parts = [Text(f"{so_far}: past the {fmt_duration(drain)} shutdown timeout", style="bold red")]
    else:
        parts = [Text(f"{so_far} of {fmt_duration(drain)} shutdown timeout")]
    if grace is not None:
        late = elapsed is not None and elapsed > grace
        parts.append(Text(f"killed at {fmt_duration(grace)}" + (": waiting for its processes and GPU memory to go"
                                                                if late else ""), style="bold red" if late else ""))
    return parts
