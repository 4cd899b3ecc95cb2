"""Prometheus sample lines read by hand: only the lines the scraper selected, at a few microseconds each.

prometheus_client's parser costs 20-50 us a line in pure Python; a data-parallel page (8 engines) has about a
thousand lines of the families lynxtop reads, so parsing them with it took 20-50 ms a tick. This reads the same
grammar for sample lines (name, optional `{label="value",...}`, value, optional timestamp) and refuses what
prometheus_client refuses, so the numbers are the same to the last digit (tests/agent/io/test_io_promtext.py
compares both on real vLLM pages). Comment lines never reach it: the scraper matches samples by exact name.
"""

from __future__ import annotations

import re

# one label pair: name, `=`, a quoted value with \\, \" and \n escapes; pairs separated by commas
_LABELS = re.compile(r'\{\s*(?:[a-zA-Z_][a-zA-Z0-9_]*\s*=\s*"(?:[^"\\]|\\.)*"\s*(?:,\s*|(?=\})))*\}')
_LE = re.compile(r'[{,]\s*le\s*=\s*"((?:[^"\\]|\\.)*)"')
_ESCAPE = re.compile(r'\\[\\n"]')  # what a label value's text escapes (prometheus_client's parser)
_UNESCAPED = {"\\\\": "\\", "\\n": "\n", '\\"': '"'}


class SampleError(ValueError):
    """A sample line that is not Prometheus text; the message quotes it."""


_VALID: dict[str, float | None] = {}  # label blocks already checked -> their `le` (None: none or not a number)
# a DP=8 page has ~400 label blocks (~25k characters): a server inventing labels (one that changes every scrape)
# cannot grow this further; benchmarks/peer_memory.py's churn mode runs into this cap and page.py's _KNOWN's
_VALID_MAX = 25_000
_VALID_CHARS_MAX = 2 << 20  # nor can long label blocks (agent/metrics/scrape.py caps each at MAX_LABELS_CHARS)
_valid_chars = [0]  # characters of the blocks in _VALID


def split_sample(line: str, name_end: int) -> tuple[str, float]:
    """(series key: name and labels as written, value) of one sample line whose name ends at `name_end`."""
    if name_end < len(line) and line[name_end] == "{":
        cut = line.rfind("}") + 1
        block = line[name_end:cut]
        if block not in _VALID:
            m = _LABELS.fullmatch(block)
            if m is None:
                raise SampleError(f"bad labels in {line[:120]!r}")
            if len(_VALID) >= _VALID_MAX or _valid_chars[0] >= _VALID_CHARS_MAX:
                _VALID.clear()
                _valid_chars[0] = 0
            _VALID[block] = _le_text(block)
            _valid_chars[0] += len(block)
    else:
        cut = name_end
    rest = line[cut:].split()
    if not rest or "_" in rest[0] or (len(rest) > 1 and "_" in rest[-1]):
        raise SampleError(f"expected a value and an optional timestamp in {line[:120]!r}")
    try:
        value = float(rest[0])
        if len(rest) > 1:  # prometheus_client reads the last field as the timestamp
            float(rest[-1])
    except ValueError:
        raise SampleError(f"bad number in {line[:120]!r}") from None
    return line[:cut], value


def unescape(value: str) -> str:
    r"""A label value as the server meant it, from its text between the quotes: each `\\`, `\"` and `\n` read
    once, any other backslash kept (as prometheus_client's parser reads it)."""
    return _ESCAPE.sub(_unescaped, value) if "\\" in value else value


def _unescaped(m: re.Match[str]) -> str:
    return _UNESCAPED[m.group(0)]


def _le_text(block: str) -> float | None:
    m = _LE.search(block)
    if m is None:
        return None
    try:
        return float(m.group(1))
    except ValueError:
        return None


def le_of(series: str, name_end: int) -> float:
    """The `le` bound of a bucket series key (checked by split_sample); SampleError when absent or not a number."""
    le = _VALID.get(series[name_end:])
    if le is None:
        le = _le_text(series[name_end:])  # evicted, or really absent
        if le is None:
            raise SampleError(f"histogram bucket without a numeric 'le' label: {series[:120]!r}")
    return le
