"""One level's numbers: the keys `vllm bench serve --save-result` writes, plus p90, goodput and failures.

Percentiles interpolate linearly between order statistics (numpy's default, which vLLM's client uses), so the
two clients' numbers are comparable to the last digit on the same samples.
"""

from __future__ import annotations

import math
import statistics
from collections import Counter
from collections.abc import Sequence
from typing import Any

from lynxtop.cli.bench_load import LevelRun

METRICS = ("ttft", "tpot", "itl", "e2el")
# the keys `vllm bench serve --save-result` writes for a level (the list, and the medians)
VLLM_KEYS = (
    "duration", "completed", "failed", "max_concurrency", "request_rate", "request_throughput",
    "output_throughput", "total_token_throughput", "total_input_tokens", "total_output_tokens",
    "request_goodput", "max_output_tokens_per_s", "max_concurrent_requests",
    *(f"{s}_{m}_ms" for m in METRICS for s in ("mean", "median", "std", "p90", "p99")),
)


def percentile(xs: Sequence[float], q: float) -> float | None:
    """The q-th percentile (0..100) with linear interpolation; None for no samples."""
    if not xs:
        return None
    s = sorted(xs)
    pos = (len(s) - 1) * q / 100
    lo, hi = math.floor(pos), math.ceil(pos)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def describe(name: str, xs: Sequence[float]) -> dict[str, float | None]:
    """mean, median, std, p90, p99 of seconds, in ms, under vLLM's key names."""
    ms = [x * 1000 for x in xs]
    return {
        f"mean_{name}_ms": statistics.fmean(ms) if ms else None,
        f"median_{name}_ms": percentile(ms, 50),
        f"std_{name}_ms": statistics.pstdev(ms) if ms else None,
        f"p90_{name}_ms": percentile(ms, 90),
        f"p99_{name}_ms": percentile(ms, 99),
    }


def summarize(run: LevelRun, sla_ttft_ms: float | None = None, sla_tpot_ms: float | None = None) -> dict[str, Any]:
    """The level's summary; `partial` marks a level stopped early, `failures` counts reasons."""
    ok = [r for r in run.results if r.ok]
    failed = [r for r in run.results if not r.ok]
    dur = run.duration_s or 1e-9
    out_tokens = sum(r.output_tokens for r in ok)
    in_tokens = sum(r.prompt_tokens for r in ok)
    tpots = [t for r in ok if (t := r.tpot) is not None]
    good = sum(1 for r in ok if _meets(r, sla_ttft_ms, sla_tpot_ms))
    out: dict[str, Any] = {
        "duration": run.duration_s, "completed": len(ok), "failed": len(failed),
        "max_concurrency": run.level.concurrency, "request_rate": run.level.rate or "inf",
        "request_throughput": len(ok) / dur, "output_throughput": out_tokens / dur,
        "total_token_throughput": (in_tokens + out_tokens) / dur,
        "total_input_tokens": in_tokens, "total_output_tokens": out_tokens,
        "request_goodput": good / dur if sla_ttft_ms or sla_tpot_ms else None,
    }
    out["max_output_tokens_per_s"], out["max_concurrent_requests"] = peaks(ok)
    out |= describe("ttft", [r.ttft for r in ok])
    out |= describe("tpot", tpots)
    out |= describe("itl", [g for r in ok for g in r.itl])
    out |= describe("e2el", [r.e2e for r in ok])
    out["partial"] = run.interrupted or bool(run.error)
    failures = Counter(_reason(r.error) for r in failed)
    if run.error:  # the level's driver died: its requests not sent are nowhere else, so the level says so
        failures[_reason(f"lynxtop bench stopped the level: {run.error}")] += 1
    out["failures"] = dict(failures.most_common(10))
    return out


def peaks(ok: Sequence[Any]) -> tuple[float, int]:
    """The busiest second of output tokens and of requests in flight, as vLLM's calculate_metrics counts them:
    one-second buckets from the first start, each token at start + ttft + its gaps, each request in every bucket
    from its start's to its end's."""
    if not ok:
        return 0.0, 0
    first = min(r.start for r in ok)
    n = int(math.ceil(max(r.start + r.e2e for r in ok) - first)) + 1
    tokens, running = [0] * n, [0] * n
    for r in ok:
        t = r.start + r.ttft
        for gap in (0.0, *r.itl):
            t += gap
            if 0 <= (b := int(t - first)) < n:
                tokens[b] += 1
        for b in range(int(r.start - first), min(int(r.start + r.e2e - first), n - 1) + 1):
            running[b] += 1
    return float(max(tokens)), max(running)


def _meets(r: Any, ttft_ms: float | None, tpot_ms: float | None) -> bool:
    if ttft_ms and r.ttft * 1000 > ttft_ms:
        return False
    tpot = r.tpot
    return not (tpot_ms and tpot is not None and tpot * 1000 > tpot_ms)


def _reason(error: str) -> str:
    """A failure's reason, short enough that 500 of them group into a few lines."""
    return error[:120] if error else "unknown"


# ---------------------------------------------------------------------------------------------- storage

def db_row(summary: dict[str, Any], meta: dict[str, Any]) -> dict[str, Any]:
    """A level as one bench_results row (store/schema.py BENCH_COLUMNS); the vLLM keys go whole into details."""
    return {
        **{k: meta.get(k) for k in ("bench_id", "run_id", "profile", "model", "name", "input_len", "output_len",
                                    "vllm_version", "simulated")},
        "concurrency": summary.get("max_concurrency"), "num_prompts": summary["completed"] + summary["failed"],
        "duration_s": summary["duration"], "requests_per_s": summary["request_throughput"],
        "output_tokens_per_s": summary["output_throughput"], "total_tokens_per_s": summary["total_token_throughput"],
        "goodput_per_s": summary.get("request_goodput"),
        "ttft_p50_ms": summary["median_ttft_ms"], "ttft_p99_ms": summary["p99_ttft_ms"],
        "tpot_p50_ms": summary["median_tpot_ms"], "tpot_p99_ms": summary["p99_tpot_ms"],
        "itl_p50_ms": summary["median_itl_ms"], "itl_p99_ms": summary["p99_itl_ms"],
        "e2e_p50_ms": summary["median_e2el_ms"], "e2e_p99_ms": summary["p99_e2el_ms"],
        "errors": summary["failed"], "partial": int(bool(summary.get("partial"))),
        "details": {"summary": summary, "flags": meta.get("flags")},
    }


def from_db_row(row: dict[str, Any]) -> dict[str, Any]:
    """A stored level back as its summary (the vLLM keys), for `bench compare` and the history view."""
    details = row.get("details") or {}
    summary = dict(details.get("summary") or {})
    summary.setdefault("max_concurrency", row.get("concurrency"))
    summary.setdefault("output_throughput", row.get("output_tokens_per_s"))
    summary.setdefault("p99_ttft_ms", row.get("ttft_p99_ms"))
    summary.setdefault("p99_tpot_ms", row.get("tpot_p99_ms"))
    summary.setdefault("partial", bool(row.get("partial")))
    return summary
