"""The families lynxtop reads that the vLLM behind a page does not serve, named once per run with its version.

vLLM adds, renames and drops families between versions (vLLM < 0.11 has no per-request TPOT histogram; a vLLM
from before 0.9.2 restarted under a run has no `prefix_cache_*`...). A quantity whose family is not on the page
leaves its columns empty, which an operator cannot tell from "no traffic": this names what is missing, the names
looked for, the columns that stay empty and the vLLM version, once per run (a scraper), not once per scrape.
Only a clean page is judged (no sample that is no reading, no part left out over a cap): a family with a bad
sample is on the page, only unreadable there.
"""

from __future__ import annotations

from lynxtop.agent.metrics.families import COUNTERS, GAUGES_MAX, GAUGES_SUM, HISTOGRAMS, QUANTILES
from lynxtop.agent.metrics.page import ParsedPage

# quantity -> (what it is, in words; the row columns it fills). Speculative decoding (only with a draft model or
# MTP configured) and the deferred waiting requests (0.12+, a refinement the hang rule does without) are not
# needed: their absence says nothing about the version.
_COUNTER_NEEDS: dict[str, tuple[str, str]] = {
    "requests": ("finished requests counter", "requests_per_s, requests_finished"),
    "prompt_tokens": ("prompt tokens counter", "prompt_tokens_per_s, prompt_tokens"),
    "generation_tokens": ("generation tokens counter", "generation_tokens_per_s, generation_tokens (and the hang "
                                                       "rule's progress)"),
    "preemptions": ("preemptions counter", "preemptions"),
    "prefix_queries": ("prefix cache queries counter", "prefix_cache_hit_pct"),
    "prefix_hits": ("prefix cache hits counter", "prefix_cache_hit_pct"),
}
_GAUGE_NEEDS: dict[str, tuple[str, str]] = {
    "running": ("running requests gauge", "requests_running"),
    "waiting": ("waiting requests gauge", "requests_waiting"),
    "kv_usage": ("KV-cache usage gauge", "kv_cache_usage_pct"),
}
_HIST_WORDS = {"ttft": "time to first token", "itl": "inter-token latency", "tpot": "per-request time per output "
               "token", "e2e": "end-to-end request latency", "queue": "queue time", "prefill": "prefill time",
               "decode": "decode time"}
# what stands in for a missing histogram, where something does
_STAND_IN = {"tpot": "; the SLA judges the inter-token latency in its place",
             "prefill": "; its mean is derived from TTFT minus queue time",
             "decode": "; its mean is derived from e2e latency minus TTFT"}


def _hist_columns(key: str) -> str:
    return ", ".join([f"{key}_{stat}_ms" for stat, _ in QUANTILES] + [f"{key}_mean_ms"])


class NotServed:
    """Per run: the needed quantities the last clean page lacked (`missing`, quantity -> message) and those told."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.version: str | None = None  # the vLLM version serving the page (GET /version), when known
        self.missing: dict[str, str] = {}
        self.pending: list[str] = []  # missing and not told yet: what the caller logs (`messages`)
        self._told: set[str] = set()

    def check(self, page: ParsedPage) -> None:
        """Judge one read page; a quantity missing for the first time in this run becomes `pending`."""
        if page.bad_values or page.refused:
            return  # a family may be on the page, only unreadable there: not judged
        gone = [k for k in _COUNTER_NEEDS if k not in page.counters and k not in page.stale]
        gone += [k for k in _GAUGE_NEEDS if k not in page.gauges]
        gone += [k for k in HISTOGRAMS if k not in page.histograms and k not in page.stale]
        self.missing = {k: self.missing.get(k, "") for k in gone}
        self.pending += [k for k in gone if k not in self._told and k not in self.pending]

    def messages(self) -> list[tuple[str, str]]:
        """(quantity, message) of each pending quantity, with the version as known now; they count as told."""
        out = []
        for key in self.pending:
            self.missing[key] = msg = self._message(key)
            out.append((key, msg))
            self._told.add(key)
        self.pending = []
        for key in self.missing:  # told before: its message, with the version as known now
            self.missing[key] = self.missing[key] or self._message(key)
        return out

    def details(self, key: str) -> dict[str, object]:
        """What an event about a missing quantity carries: the names looked for, the columns left empty, the version
        (None: unknown), so an alert rule or the dashboard need not parse the message."""
        _what, columns, names, _note = _described(key)
        empty = columns.split(" (")[0].split(", ")  # the column names, without the note in brackets
        return {"url": self.url, "quantity": key, "families": list(names), "columns": empty,
                "vllm_version": self.version}

    def _message(self, key: str) -> str:
        what, columns, names, note = _described(key)
        version = f"version {self.version}" if self.version else "version unknown"
        return (f"vLLM page at {self.url} has no {what} ({' or '.join(names)}): not served by this vLLM ({version}); "
                f"{columns} stay empty for this run{note}")


def _described(key: str) -> tuple[str, str, tuple[str, ...], str]:
    """A needed quantity in words: (what it is, the columns it fills, the family names looked for, a note on what
    stands in for it)."""
    if key in _COUNTER_NEEDS:
        what, columns = _COUNTER_NEEDS[key]
        return what, columns, tuple(COUNTERS[key]), ""
    if key in _GAUGE_NEEDS:
        what, columns = _GAUGE_NEEDS[key]
        return what, columns, tuple((GAUGES_SUM | GAUGES_MAX)[key]), ""
    return (f"{_HIST_WORDS.get(key, key)} histogram", _hist_columns(key), tuple(HISTOGRAMS[key]),
            _STAND_IN.get(key, ""))
