"""`lynxtop bench`'s parts without a server: the SSE reader, the statistics (vLLM's definitions), the stored row
and the levels of a sweep."""

from __future__ import annotations

import argparse

import pytest

from lynxtop.cli.bench import DEFAULT_CONCURRENCY, levels_of
from lynxtop.cli.bench_load import Level, LevelRun, RequestResult, StreamError, _Events, _finish
from lynxtop.cli.bench_stats import VLLM_KEYS, db_row, from_db_row, percentile, summarize
from lynxtop.cli.bench_view import chart, table
from lynxtop.cli.parser import build_parser
from lynxtop.store.schema import BENCH_COLUMNS


def ev(text: str = " a", finish: str | None = None) -> bytes:
    f = "null" if finish is None else f'"{finish}"'
    return f'data: {{"choices":[{{"index":0,"text":"{text}","finish_reason":{f}}}]}}\n\n'.encode()


def test_events_time_each_token_and_skip_the_empty_closing_event():
    res = RequestResult()
    e = _Events(res, t0=10.0)
    e.feed(ev(), 10.5)
    e.feed(ev() + ev()[:20], 10.75)  # one event and the start of the next in one read
    e.feed(ev()[20:], 11.0)
    e.feed(ev("", "length"), 11.1)  # closing event: no text, a finish reason: not a token
    e.feed(b'data: {"choices":[],"usage":{"prompt_tokens":4,"completion_tokens":3}}\n\ndata: [DONE]\n\n', 11.2)
    out = _finish(res, e)
    assert out.ok and out.output_tokens == 3
    assert out.ttft == pytest.approx(0.5) and out.itl == pytest.approx([0.25, 0.25]) and out.e2e == pytest.approx(1.0)
    assert out.tpot == pytest.approx(0.25)  # (e2e - ttft) / (tokens - 1)


def test_events_error_event_and_a_stream_without_done():
    e = _Events(RequestResult(), 0.0)
    with pytest.raises(StreamError, match="boom"):
        e.feed(b'data: {"error": {"message": "boom", "code": 500}}\n\n', 1.0)
    res = RequestResult()
    e = _Events(res, 0.0)
    e.feed(ev(), 1.0)
    assert not _finish(res, e).ok and "without [DONE]" in res.error


def test_percentile_interpolates_like_numpy():
    xs = [1.0, 2.0, 3.0, 4.0]
    assert percentile(xs, 50) == 2.5 and percentile(xs, 99) == pytest.approx(3.97) and percentile(xs, 0) == 1.0
    assert percentile([], 50) is None and percentile([7.0], 99) == 7.0


def _ok(ttft: float, tokens: int, gap: float) -> RequestResult:
    return RequestResult(ok=True, prompt_tokens=10, output_tokens=tokens, ttft=ttft, e2e=ttft + gap * (tokens - 1),
                         itl=[gap] * (tokens - 1))


def test_summary_has_vllm_keys_goodput_and_failure_reasons():
    run = LevelRun(Level(concurrency=2, requests=4), duration_s=2.0,
                   results=[_ok(0.1, 5, 0.02), _ok(0.3, 5, 0.2), RequestResult(error="HTTP 500: overload"),
                            RequestResult(error="HTTP 500: overload")])
    s = summarize(run, sla_ttft_ms=200, sla_tpot_ms=150)
    assert set(VLLM_KEYS) <= set(s)
    assert s["completed"] == 2 and s["failed"] == 2 and s["failures"] == {"HTTP 500: overload": 2}
    assert s["request_throughput"] == 1.0 and s["output_throughput"] == 5.0 and s["total_token_throughput"] == 15.0
    assert s["request_goodput"] == 0.5  # only the first meets TTFT <= 200 ms and TPOT <= 150 ms
    assert s["mean_tpot_ms"] == pytest.approx(110.0) and s["median_ttft_ms"] == pytest.approx(200.0)
    assert s["mean_itl_ms"] == pytest.approx(110.0) and s["max_concurrency"] == 2 and not s["partial"]


def test_db_row_fits_the_columns_and_reads_back():
    run = LevelRun(Level(concurrency=4, requests=1), results=[_ok(0.1, 3, 0.05)], duration_s=1.0)
    s = summarize(run)
    row = db_row(s, {"bench_id": "b1", "run_id": 7, "profile": "p", "input_len": 10, "output_len": 3})
    columns = {n for n, _ in BENCH_COLUMNS}
    assert set(row) <= columns
    assert row["concurrency"] == 4 and row["partial"] == 0 and row["ttft_p99_ms"] == pytest.approx(100.0)
    back = from_db_row({**row, "details": row["details"]})
    assert back["output_throughput"] == s["output_throughput"] and back["max_concurrency"] == 4


def test_levels_of_the_command_line():
    p = build_parser()
    args = p.parse_args(["bench"])
    assert [lv.concurrency for lv in levels_of(args)] == list(DEFAULT_CONCURRENCY)
    assert [lv.requests for lv in levels_of(args)][:3] == [8, 8, 16]
    args = p.parse_args(["bench", "--request-rate", "0.5", "2", "--max-concurrency", "8", "--duration", "30"])
    assert [(lv.rate, lv.concurrency, lv.duration_s, lv.requests) for lv in levels_of(args)] == \
        [(0.5, 8, 30.0, 0), (2.0, 8, 30.0, 0)]
    args = p.parse_args(["bench", "compare", "a", "run:3"])
    assert (args.run_a, args.run_b, args.handler) == ("a", "run:3", "lynxtop.cli.bench:compare")
    assert isinstance(args, argparse.Namespace)


def test_table_marks_partial_levels_and_lists_reasons():
    s = summarize(LevelRun(Level(concurrency=8), results=[_ok(0.1, 3, 0.05), RequestResult(error="stream cut: x")],
                           duration_s=1.0, interrupted=True))
    s["partial"] = True
    text = table([s])
    assert "8 *" in text and "1 failed: stream cut: x" in text and "partial" in text
    assert "#" in chart([s])


def test_request_counters_sum_reasons_and_engines_and_foreign_is_the_larger_excess() -> None:
    from lynxtop.cli.bench_traffic import foreign, request_counters

    page = "\n".join([
        "# HELP vllm:request_success_total Count of successfully processed requests.",
        'vllm:request_success_total{engine="0",finished_reason="stop",model_name="m"} 10.0',
        'vllm:request_success_total{engine="1",finished_reason="length",model_name="m"} 5.0',
        'vllm:request_success_created{engine="0",finished_reason="stop",model_name="m"} 1.7e9',
        'vllm:num_requests_running{engine="0",model_name="m"} 2.0',
        'vllm:num_requests_running{engine="1",model_name="m"} 1.0'])
    assert request_counters(page) == (15.0, 3.0)
    assert request_counters("vllm:num_requests_running 2.0") is None  # no success counter: no count, no guess
    assert foreign((15.0, 0.0), (39.0, 0.0), 24) == 0
    assert foreign((15.0, 0.0), (45.0, 0.0), 24) == 6  # finished beyond bench's own
    assert foreign((15.0, 3.0), (40.0, 0.0), 24) == 3  # running before bench sent any
    assert foreign(None, (40.0, 0.0), 24) is None
