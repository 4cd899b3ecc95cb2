"""The Prometheus text format (0.0.4) of the exporter's page, byte for byte prometheus_client's `generate_latest`,
with each sample's escaped name and labels kept from one render to the next.

Why: a tick changes the values on the page, never its series; `generate_latest` escapes and validates every
label name and value of every sample again (about 16 us a sample, 5 ms of the 8 GPUs' 300 samples on the event
loop, five times a second at 0.2 s sampling: slowloris.py's largest cost after the flood itself, issue 27). Here a
series' text up to its value is built once by the same helpers and reused; a family this does not cover (a
sample with a timestamp, an exemplar, a native histogram, or OpenMetrics' _created/_gsum/_gcount samples) is
encoded by `generate_latest` itself.
"""

from __future__ import annotations

from typing import Any

from prometheus_client.exposition import generate_latest
from prometheus_client.openmetrics import exposition as om
from prometheus_client.utils import floatToGoString

# generate_latest's renaming of OpenMetrics types for the text format: type -> (name suffix, type written)
_TYPES = {"counter": ("_total", "counter"), "info": ("_info", "gauge"), "stateset": ("", "gauge"),
          "gaugehistogram": ("", "histogram"), "unknown": ("", "untyped")}
_OM_SUFFIXES = ("_created", "_gsum", "_gcount")  # samples generate_latest moves into gauges of their own
MAX_KEPT = 50_000  # series' texts kept (a page has a few thousand); past that they start over


class _One:
    """One family as a registry, for `generate_latest` (which asks only `collect`)."""

    def __init__(self, family: Any):
        self.family = family

    def collect(self) -> list[Any]:
        return [self.family]


class TextPage:
    """`encoder(registry) -> bytes` as prometheus_client's `generate_latest`, remembering each family's HELP and TYPE
    lines and each series' text up to its value."""

    def __init__(self) -> None:
        self._heads: dict[tuple[str, str, str], str] = {}
        self._series: dict[tuple[Any, ...], str] = {}

    def __call__(self, registry: Any) -> bytes:
        out: list[str] = []
        heads, series = self._heads, self._series
        if len(series) > MAX_KEPT or len(heads) > MAX_KEPT:
            heads.clear()
            series.clear()
        for metric in registry.collect():
            if not self._plain(metric):
                out.append(generate_latest(_One(metric)).decode("utf-8"))
                continue
            hk = (metric.name, metric.type, metric.documentation)
            head = heads.get(hk)
            if head is None:
                head = heads[hk] = _head(metric)
            out.append(head)
            for s in metric.samples:
                key = (s.name, *s.labels.items())
                prefix = series.get(key)
                if prefix is None:
                    prefix = series[key] = _prefix(s.name, s.labels)
                out.append(f"{prefix}{floatToGoString(s.value)}\n")
        return "".join(out).encode("utf-8")

    @staticmethod
    def _plain(metric: Any) -> bool:
        """Only plain samples: value and labels, nothing that generate_latest writes another way."""
        moved = tuple(metric.name + suffix for suffix in _OM_SUFFIXES)
        return not any(s.timestamp is not None or s.exemplar or getattr(s, "native_histogram", None)
                       or s.name in moved for s in metric.samples)


def _head(metric: Any) -> str:
    suffix, mtype = _TYPES.get(metric.type, ("", metric.type))
    name = om.escape_metric_name(metric.name + suffix, om.UNDERSCORES)
    doc = metric.documentation.replace("\\", r"\\").replace("\n", r"\n")
    return f"# HELP {name} {doc}\n# TYPE {name} {mtype}\n"


def _prefix(name: str, labels: dict[str, str]) -> str:
    """A sample's line up to its value, as generate_latest's sample_line writes it (underscore escaping). A label
    value UTF-8 cannot encode (a lone surrogate from a foreign value: Ray's node_ip) is written with that character
    as a backslash escape (`\\ud800`, read back as text), where generate_latest would fail the whole page."""
    text = om.escape_metric_name(name, om.UNDERSCORES)
    if labels:
        pairs = [(om.escape_label_name(k, om.UNDERSCORES), om._escape(_utf8(v), om.ALLOWUTF8, False))
                 for k, v in sorted(labels.items())]
        text += "{" + ",".join([f'{k}="{v}"' for k, v in pairs]) + "}"
    return text + " "


def _utf8(value: str) -> str:
    """`value` with what UTF-8 cannot encode (lone surrogates) as backslash escapes, escaped again as label text."""
    if value.isascii():
        return value
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return value.encode("utf-8", "backslashreplace").decode("utf-8")
    return value
