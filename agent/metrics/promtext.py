"""Prometheus sample lines read by hand: only the lines the scraper selected, at a few microseconds each.

prometheus_client's parser costs 20-50 us a line in pure Python; a data-parallel page (8 engines) has about a
thousand lines of the families lynxtop reads, so parsing them with it took 20-50 ms a tick. This reads the same
grammar for sample lines (name, optional `{label="value",...}`, value, optional timestamp) and refuses what
prometheus_client refuses, so the numbers are the same to the last digit (tests/agent/io/test_io_promtext.py
compares both on real vLLM pages). Comment lines never reach it: the scraper matches samples by exact name.
"""

from __future__ import annotations

import re
from functools import lru_cache

# one label pair: name, `=`, a quoted value with \\, \" and \n escapes; pairs separated by commas
_LABELS = re.compile(r'\{\s*(?:[a-zA-Z_][a-zA-Z0-9_]*\s*=\s*"(?:[^"\\]|\\.)*"\s*(?:,\s*|(?=\})))*\}')
# The same pair, for reading values: blanks and value characters never a newline, so a reader of a page's lines
# (`label_reader(lines=True)`) cannot run from one line into the next; a sample line has no newline anyway.
_WS = r"[^\S\n]*"
_VALUE = r'"((?:[^"\\\n]|\\.)*)"'  # the value as written, between its quotes (a `\"` does not end it)
_PAIR = re.compile(rf"{_WS}([a-zA-Z_][a-zA-Z0-9_]*){_WS}={_WS}{_VALUE}{_WS}(?:,|(?=\}}))")
_SKIP = rf'(?:{_WS}[a-zA-Z_][a-zA-Z0-9_]*{_WS}={_WS}"(?:[^"\\\n]|\\.)*"{_WS},)*?'  # whole pairs before the one read
_CLOSE = re.compile(rf"{_WS}\}}")
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


def label_reader(name: str, *, lines: bool = False) -> re.Pattern[str]:
    """A pattern whose group 1 is label `name`'s value as written, matched at a label block's `{`.

    It walks the block pair by pair from the `{`, each pair skipped whole (name, `=`, its quoted value with its
    escapes), so `name` is only ever read where a pair starts: a value holding `,engine=` or `\\",le=\\"` is never
    taken for a label (a search of the text was). One C match, what a search cost. `lines=True`: found by
    `findall` over many lines, one value a line (the first pair named so, as the line's own reader reads it)."""
    pattern = rf"\{{{_SKIP}{_WS}{re.escape(name)}{_WS}={_WS}{_VALUE}"
    return re.compile(r"^[^{\n]*" + pattern, re.MULTILINE) if lines else re.compile(pattern)


_LE = label_reader("le")


@lru_cache(maxsize=64)
def _reader(name: str) -> re.Pattern[str]:
    return label_reader(name)


def label_value(series: str, name: str) -> str | None:
    """Label `name` of a series key (its name and labels as a page wrote them), escapes read; None without it.

    For keys read before (checked by `split_sample`); callers on a hot path cache the result per key."""
    start = series.find("{")
    m = _reader(name).match(series, start) if start >= 0 else None
    return unescape(m.group(1)) if m else None


def labels_of(series: str) -> dict[str, str]:
    """Every label of a series key, escapes read, found pair by pair from its `{` (the first of a repeated name,
    as `label_value` reads it); SampleError when its labels are not Prometheus text."""
    start = series.find("{")
    if start < 0:
        return {}
    out: dict[str, str] = {}
    pos = start + 1
    while (m := _PAIR.match(series, pos)) is not None:
        out.setdefault(m.group(1), unescape(m.group(2)))
        pos = m.end()
    if _CLOSE.fullmatch(series, pos) is None:
        raise SampleError(f"bad labels in {series[:120]!r}")
    return out


def _le_text(block: str) -> float | None:
    m = _LE.match(block)
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
