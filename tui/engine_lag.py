"""Which data-parallel engine falls behind the others, judged from one status, independent of Textual.

In a DP deployment vLLM's front end spreads requests over the engines; one engine that queues while the others
do not, runs nothing while the others run, or fills its KV cache far above the rest is what an operator hunts
(a slow GPU, a stuck engine, an unlucky run of long prompts). Each engine is compared with the median of the
OTHERS, so that a node busy everywhere (every engine queueing alike) flags nothing.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from statistics import median

from lynxtop.contract.status import EngineLoad

WAITING_MIN_GAP = 2  # waiting at least this many above the others' median, and at least twice it
KV_GAP_PCT = 25.0  # KV cache usage this many points above the others' median
IDLE_BUSY_MEDIAN = 2  # running 0 while the others' median runs at least this many


def engine_order(label: str) -> tuple[int, int, str]:
    """Engines in numeric order ("10" after "9"), odd labels after them."""
    return (0, int(label), "") if label.isdigit() else (1, 0, label)


def sorted_engines(engines: Iterable[EngineLoad]) -> list[EngineLoad]:
    return sorted(engines, key=lambda e: engine_order(e.engine))


def lagging(engines: Sequence[EngineLoad]) -> dict[str, str]:
    """engine label -> why it lags (several reasons joined); empty with fewer than two engines."""
    if len(engines) < 2:
        return {}
    out: dict[str, str] = {}
    for i, eng in enumerate(engines):
        others = [e for j, e in enumerate(engines) if j != i]
        # An idle engine's own queue is already in its idle reason.
        reasons = [r for r in (_idle(eng, others) or _queueing(eng, others), _kv_high(eng, others)) if r]
        if reasons:
            out[eng.engine] = "; ".join(reasons)
    return out


def _values(engines: Iterable[EngineLoad], attr: str) -> list[float]:
    return [float(v) for v in (getattr(e, attr) for e in engines) if v is not None]


def _idle(eng: EngineLoad, others: list[EngineLoad]) -> str:
    # Under light load some engines idle by design: only a queue it does not serve, or a node busy enough
    # that every engine should run something, makes an idle engine suspect.
    if eng.running != 0:
        return ""
    if eng.waiting:
        return f"runs nothing, {eng.waiting} waiting"
    rest = _values(others, "running")
    if rest and median(rest) >= IDLE_BUSY_MEDIAN:
        return f"runs nothing, others {median(rest):g}"
    return ""


def _queueing(eng: EngineLoad, others: list[EngineLoad]) -> str:
    rest = _values(others, "waiting")
    if eng.waiting is None or not rest:
        return ""
    med = median(rest)
    if eng.waiting - med >= WAITING_MIN_GAP and eng.waiting >= 2 * med:
        return f"{eng.waiting} waiting, others {med:g}"
    return ""


def _kv_high(eng: EngineLoad, others: list[EngineLoad]) -> str:
    rest = _values(others, "kv_cache_usage_pct")
    if eng.kv_cache_usage_pct is None or not rest:
        return ""
    med = median(rest)
    if eng.kv_cache_usage_pct - med >= KV_GAP_PCT:
        return f"KV {eng.kv_cache_usage_pct:.0f}%, others {med:.0f}%"
    return ""


def summary(engines: Sequence[EngineLoad], lags: dict[str, str], detail: bool = True) -> str:
    """One line for a panel's border: who lags (and why, when it is one engine and `detail`), or that none does."""
    if not lags:
        return f"{len(engines)} engines, none lagging"
    if len(lags) == 1:
        (name, why), = lags.items()
        return f"⚠ engine {name} lagging" + (f": {why}" if detail else "")
    return f"⚠ engines {', '.join(lags)} lagging"
