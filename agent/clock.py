"""The agent's timeline: sample and event timestamps that never jump, whatever the wall clock does.

The wall clock can be stepped under a running agent (an NTP step after a bad RTC, a VM restored from a snapshot,
an operator's `date -s`). Samples stamped with it would jump a week ahead (and make a week of history look
expired) or a day back (interleaving with the rows of that day). So the agent stamps with the wall clock read
once at start plus the monotonic clock's elapsed time: strictly increasing, at the wall's rate (NTP slews both
clocks alike). A difference between the wall clock and this timeline of more than STEP_LIMIT_MS is a step:
the caller records it (an `agent.clock_step` event, shown in status) and the timeline goes on unmoved. A new
agent starts on the wall clock again (docs/reliability.md says what that means for retention).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

STEP_LIMIT_MS = 120_000  # a few minutes: smaller steps (NTP's first sync) are not worth an alarm


@dataclass(frozen=True)
class ClockStep:
    step_ms: int  # how far the wall clock moved against the timeline: positive forward
    wall_ms: int  # the wall clock when it was seen
    ts_ms: int  # the timeline when it was seen


class Timeline:
    """`now_ms()` for every timestamp the agent stores; `check()` once a tick to notice wall-clock steps."""

    def __init__(self, wall: Callable[[], float] | None = None, mono: Callable[[], float] = time.monotonic,
                 limit_ms: int = STEP_LIMIT_MS):
        self.wall = wall or (lambda: time.time())  # looked up at each call: whatever sets the clock is seen
        self._mono, self.limit_ms = mono, limit_ms
        self._base_ms = int(self.wall() * 1000) - int(mono() * 1000)
        self.offset_ms = 0  # wall clock minus timeline, as of the last step seen
        self.steps = 0
        self.last_step: ClockStep | None = None

    def now_ms(self) -> int:
        return self._base_ms + int(self._mono() * 1000)

    def time(self) -> float:
        """Seconds, like time.time(): the store writer's clock."""
        return self.now_ms() / 1000

    def check(self) -> ClockStep | None:
        """The step the wall clock made since the last one seen, if larger than the limit; else None."""
        ts = self.now_ms()
        wall = int(self.wall() * 1000)
        moved = wall - ts - self.offset_ms
        if abs(moved) < self.limit_ms:
            return None
        self.offset_ms += moved
        self.steps += 1
        self.last_step = ClockStep(moved, wall, ts)
        return self.last_step


def span(ms: int) -> str:
    """'8 d 0 h 0 min 0 s', to the nearest second, in the units an operator reads."""
    d, rest = divmod(round(abs(ms) / 1000), 86_400)
    h, rest = divmod(rest, 3600)
    m, sec = divmod(rest, 60)
    return " ".join([f"{d} d"] * bool(d) + [f"{h} h"] * bool(d or h) + [f"{m} min {sec} s"])


def describe(step: ClockStep) -> str:
    return f"the wall clock stepped {span(step.step_ms)} {'forward' if step.step_ms > 0 else 'back'}"
