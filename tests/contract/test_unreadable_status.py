"""A status the CLI cannot read (a field of another type: a newer, older or foreign agent) is AgentUnreadable
naming the field, which `lynxtop status` reports as a message, never a RecordError traceback; the formatters show
a number that is not finite as N/A instead of raising."""

from __future__ import annotations

import math

import pytest

from lynxtop.contract.client import AgentUnreadable, parse_status
from lynxtop.contract.format import NA, fmt_duration, fmt_int


def test_a_status_field_of_another_type_is_unreadable_naming_it():
    with pytest.raises(AgentUnreadable, match="host"):
        parse_status({"agent": {"host": 7}, "serving": {}}, "/run/lynxtop/agent.sock")


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_formatters_show_a_number_that_is_not_finite_as_na(value):
    assert fmt_int(value) == NA
    assert fmt_duration(value) == NA
    assert fmt_duration(value, na="-") == "-"
