"""The README's `[agent]` table lists every key the config accepts (session 22 docs audit: `tcp_reads` and
`tcp_token_file`, which open history and logs to a token holder, were only in docs/cluster.md)."""

from __future__ import annotations

import re
from pathlib import Path

from lynxtop.contract import config as C

README = Path(__file__).resolve().parents[2] / "README.md"


def _agent_table() -> str:
    text = README.read_text()
    start = text.index("### `[agent]`")
    return text[start:text.index("### `[ray]`", start)]


def test_every_agent_key_is_in_the_readme_table():
    table = _agent_table()
    listed = set(re.findall(r"`([a-z_]+)`", table))
    missing = sorted(k for k in C._AGENT_SPEC if k not in listed)
    assert missing == [], f"[agent] keys the config accepts but README's table omits: {missing}"
