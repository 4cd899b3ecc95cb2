"""Which live changes make a control dialog stale (`control_text.run_change`): pure, without a terminal."""

from __future__ import annotations

import pytest

from lynxtop.contract.status import Role, ServingState
from lynxtop.tui.control_text import Seen, run_change

READY = Seen(3, "dsv41-tp8", ServingState.READY)


@pytest.mark.parametrize(("now", "words"), [
    (Seen(4, "dsv41-tp8-ep", ServingState.STARTING), "run 3 was replaced by run 4 (dsv41-tp8-ep, starting)"),
    (Seen(None, None, ServingState.STOPPED), "run 3 ended"),
    (Seen(3, "dsv41-tp8", ServingState.STOPPED), "run 3 ended"),
    (Seen(3, "dsv41-tp8", ServingState.STOPPING), "run 3 is stopping"),
    (Seen(3, "dsv41-tp8", ServingState.CRASH_LOOP), "run 3 went from ready to crash-loop"),
    (Seen(3, "dsv41-tp8-ep", ServingState.READY), "the profile changed from dsv41-tp8 to dsv41-tp8-ep"),
    (Seen(3, "dsv41-tp8", ServingState.READY, Role.WORKER), "role changed from single to worker"),
])
def test_a_change_of_run_profile_kind_of_state_or_role_is_stale(now, words):
    assert words in (run_change(READY, now) or "")


@pytest.mark.parametrize("state", [ServingState.STARTING, ServingState.READY, ServingState.DEGRADED])
def test_the_same_run_moving_on_is_not(state):
    assert run_change(READY, Seen(3, "dsv41-tp8", state)) is None


def test_no_run_then_a_run_is_stale():
    """Start confirmed on 'no run' must not start a second one beside the run someone else started."""
    assert "no run was replaced by run 5" in (run_change(Seen(None, None, ServingState.STOPPED),
                                                         Seen(5, "dsv41-tp8", ServingState.STARTING)) or "")
