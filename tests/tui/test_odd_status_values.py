"""A status holding numbers no view can draw (NaN, Infinity: Python's JSON reads both; huge values), or a field of
another JSON type (an older, newer or buggy agent), never takes the dashboard down: a metric that is not a finite
number reads as not read (N/A, a gap in a chart), and a field of another type is an agent the dashboard cannot
read, shown as the outage it is and naming the field (contract/status.py, tui/foreign.py). Driven by Pilot."""

from __future__ import annotations

import math

import pytest
from support.tui import make_app, wait_for
from tui_fake_agent import gpu_row, make_status

NAN, INF = math.nan, math.inf


def _gpu_over(**over):
    return {"gpu_rows": [gpu_row(i, **over) for i in range(8)]}


ODD_NUMBERS = {
    "gpu_sm_nan": _gpu_over(sm_active_pct=NAN),
    "gpu_sm_inf": _gpu_over(sm_active_pct=INF),
    "gpu_power_nan": _gpu_over(power_w=NAN),
    "gpu_temp_inf": _gpu_over(temp_c=INF),
    "gpu_mem_inf": _gpu_over(mem_used_bytes=INF),
    "gpu_mem_total_zero": _gpu_over(mem_total_bytes=0),
    "gpu_throttle_neg": _gpu_over(throttle_reasons=-1),
    "running_nan": {"metrics": {"requests_running": NAN}},
    "waiting_inf": {"metrics": {"requests_waiting": INF}},
    "kv_nan": {"metrics": {"kv_cache_usage_pct": NAN}},
    "ttft_inf": {"metrics": {"ttft_p99_ms": INF}},
    "ttft_nan": {"metrics": {"ttft_p50_ms": NAN}},
    "tok_inf": {"metrics": {"generation_tokens_per_s": INF}},
    "rps_nan": {"metrics": {"requests_per_s": NAN}},
    "preempt_inf": {"metrics": {"preemptions": INF}},
    "uptime_nan": {"agent": {"uptime_s": NAN}},
    "started_huge": {"started_ms": 10**20, "state_since_ms": 10**20},
    "state_since_nan": {"state_since_ms": NAN},
    "sla_thr_nan": {"sla": {"ttft_threshold_ms": NAN}},
    "sla_thr_inf": {"sla": {"ttft_threshold_ms": INF}},
    "sla_since_huge": {"sla": {"since_ms": 10**20}},
    "cpu_inf": {"host": {"cpu_pct": INF}},
}


async def _walk_views(pilot, app) -> None:
    for key in ("1", "2", "3", "1"):  # Node, GPU, Latency and back: every view that draws the status
        await pilot.press(key)
        await pilot.pause(0.3)
        assert app._exception is None, repr(app._exception)
    assert app.is_running


@pytest.mark.parametrize("case", sorted(ODD_NUMBERS))
async def test_numbers_no_view_can_draw_leave_every_view_up(agent, case):
    agent.status = make_status(**ODD_NUMBERS[case])
    app = make_app(agent.socket_path)
    async with app.run_test(size=(200, 48)) as pilot:
        await wait_for(pilot, lambda: app.state.connected)
        await _walk_views(pilot, app)


# case -> the field the dashboard says it cannot read; None: read (a metric of another type is "not read")
WRONG_TYPES = {
    "sla_window_str": ({"sla": {"window_s": "60"}}, "SlaStatus.window_s"),
    "sla_thr_str": ({"sla": {"ttft_threshold_ms": "2000"}}, "SlaStatus.ttft_threshold_ms"),
    "uptime_str": ({"agent": {"uptime_s": "86400"}}, "AgentStatus.uptime_s"),
    "started_str": ({"started_ms": "1796215200000"}, "ServingStatus.started_ms"),
    "gpus_dict": ({"gpu_rows": {"0": {}}}, "Status.gpus"),
    "nvml_str": ({"agent": {"nvml": "ok"}}, "NvmlStatus"),
    "phases_str": ({"phases": "loading"}, "ServingStatus.phases"),
    "host_agent_int": ({"agent": {"host": 7}}, "AgentStatus.host"),
    "model_int": ({"model": 7}, "ServingStatus.model"),
    "gpu_sm_str": (_gpu_over(sm_active_pct="60"), None),
    "gpu_temp_str": (_gpu_over(temp_c="60"), None),
    "running_str": ({"metrics": {"requests_running": "12"}}, None),
    "kv_str": ({"metrics": {"kv_cache_usage_pct": "37.5"}}, None),
    "action_str": ({"agent": {"action": "restart"}}, None),  # not an action object: no action in progress
}


@pytest.mark.parametrize("case", sorted(WRONG_TYPES))
async def test_a_field_of_another_type_is_an_agent_the_dashboard_cannot_read(agent, case):
    over, field = WRONG_TYPES[case]
    agent.status = make_status(**over)
    app = make_app(agent.socket_path)
    async with app.run_test(size=(200, 48)) as pilot:
        await wait_for(pilot, lambda: app.state.status is not None or app.state.outage is not None
                       or app._exception is not None)
        if field is None:
            assert app.state.connected
        else:
            assert app.state.outage is not None
            assert "cannot read" in app.state.outage.error and f"{field}:" in app.state.outage.error
        await _walk_views(pilot, app)
