"""Issue 25.3: what `lynxtop bench` prints from the server (a failure's reason) and from the database (a sweep's
profile and vLLM version) reaches the terminal escaped, one line each."""

from __future__ import annotations

import re

from lynxtop.__main__ import main
from lynxtop.cli.bench_load import Level, LevelRun, RequestResult
from lynxtop.cli.bench_stats import summarize
from lynxtop.cli.bench_view import table
from lynxtop.store.writer import StoreWriter

EVIL = "\x1b[2J\x1b]0;owned\x07\u202e\nforged line"
SHOWN = "\\x1b[2J\\x1b]0;owned\\x07\\u202e\\nforged line"
CONTROLS = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def test_a_failure_reason_from_the_server_is_shown_escaped():
    s = summarize(LevelRun(Level(concurrency=8), results=[RequestResult(error="HTTP 500: " + EVIL)], duration_s=1.0))
    text = table([s])
    assert not CONTROLS.search(text) and f"1 failed: HTTP 500: {SHOWN}" in text
    assert not any(line.startswith("forged") for line in text.splitlines())


def test_stored_sweeps_list_and_compare_show_the_database_words_escaped(tmp_path, capsys):
    db = tmp_path / "h.db"
    with StoreWriter(db) as w:
        for bench_id in ("sweep-a", "sweep-b"):
            w.add_bench_result({"run_id": 3, "bench_id": bench_id, "profile": "p" + EVIL, "vllm_version": "0.99" + EVIL,
                                "name": "random", "concurrency": 1, "ts_ms": 1, "output_tokens_per_s": 10.0})
    assert main(["bench", "list", "--database", str(db)]) == 0
    out = capsys.readouterr().out
    assert not CONTROLS.search(out) and f"p{SHOWN}" in out and f"vLLM 0.99{SHOWN}" in out
    assert len(out.splitlines()) == 2
    assert main(["bench", "compare", "sweep-a", "sweep-b", "--database", str(db)]) == 0
    out = capsys.readouterr().out
    assert not CONTROLS.search(out) and f"A = sweep-a (run 3, p{SHOWN}, vLLM 0.99{SHOWN})" in out
    assert not any(line.startswith("forged") for line in out.splitlines())
