"""Label values are read as the server meant them: its escapes read once, whatever characters they hold.

The page writes a label value escaped (`\\\\`, `\\"`, `\\n`); the exporter escapes what it writes. What must hold:
an engine or model label is the value prometheus_client's parser reads off the page (so the exporter's output
is vLLM's value again, not escaped twice), an escaped quote does not cut the value short, and no label value
(a Unicode digit included) makes a scrape fail.
"""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from lynxtop.agent.metrics.layout import PageLayout
from lynxtop.agent.metrics.lifetime import ServingTotals
from lynxtop.agent.metrics.page import parse_text
from lynxtop.agent.metrics.scrape import MetricsScraper


def _labels(text: str) -> list[dict[str, str]]:
    """Each sample's labels as prometheus_client's parser reads them (the reference)."""
    return [s.labels for f in text_string_to_metric_families(text) for s in f.samples]


def _running(*engines: str) -> str:
    """vllm:num_requests_running of each engine label (as written), engine n running n + 1."""
    return "# TYPE vllm:num_requests_running gauge\n" + "".join(
        f'vllm:num_requests_running{{engine="{e}",model_name="m"}} {n + 1}.0\n' for n, e in enumerate(engines))


def test_an_engine_label_of_unicode_digits_is_read_not_raised():
    """"²" passes str.isdigit() but int() refuses it: ordered after the numbered engines, the scrape read."""
    s = MetricsScraper("http://x:1/metrics")
    row = s.parse_page(_running("\u00b2", "10", "0", "\u0661"), now=0.0)  # superscript two, Arabic-Indic one
    assert row["scrape_ok"] == 1 and row["requests_running"] == 10, s.last_error
    assert [e["engine"] for e in s.engines] == ["0", "10", "\u00b2", "\u0661"]


def test_an_engine_label_with_an_escaped_quote_is_its_whole_value():
    """Two engines `a"b` and `a"c`: two engines, each with its own load, not one `a\\` with both."""
    text = _running('a\\"b', 'a\\"c', 'x\\\\y\\nz')
    assert [lab["engine"] for lab in _labels(text)] == ['a"b', 'a"c', "x\\y\nz"]
    for page in (parse_text(text), PageLayout().parse(text)):
        assert {e: v["running"] for e, v in page.engines.items()} == {'a"b': 1.0, 'a"c': 2.0, "x\\y\nz": 3.0}
    s = MetricsScraper("http://x:1/metrics")
    s.parse_page(text, now=0.0)
    assert [(e["engine"], e["running"]) for e in s.engines] == [('a"b', 1), ('a"c', 2), ("x\\y\nz", 3)]


_LABELS = r'engine="0",model_name="C:\\models\\llama \"q4\"",finished_reason="st\\op\nx"'


def _model_page(v: float) -> str:
    return ("# TYPE vllm:generation_tokens_total counter\n"
            f"vllm:generation_tokens_total{{{_LABELS}}} {v}\n"
            "# TYPE vllm:request_success_total counter\n"
            f"vllm:request_success_total{{{_LABELS}}} {v}\n")


def test_lifetime_totals_key_model_and_finished_reason_by_their_unescaped_values():
    """The lifetime totals (the exporter's lynxtop_serving_*_total{model_name, finished_reason}) carry vLLM's
    values: the exporter escapes them once when it writes them, as it does the info metric's `model`."""
    (want,) = _labels(_model_page(1.0))[:1]
    assert want["model_name"] == 'C:\\models\\llama "q4"' and want["finished_reason"] == "st\\op\nx"
    s, totals = MetricsScraper("http://x:1/metrics"), ServingTotals()
    for now, v in enumerate((1.0, 5.0)):
        s.parse_page(_model_page(v), now=float(now))
        totals.observe(s)
    assert list(totals.models) == [want["model_name"]]
    assert totals.models[want["model_name"]].finished == {want["finished_reason"]: 4.0}
