"""Compare at 80 columns: the demo showed two rows both labelled "serving.prompt_toke." (prompt_tokens_per_s and
prompt_tokens cut to one width), so the operator could not tell which figure was which. A label too long for its
column must wrap, whole, never be cut."""

from __future__ import annotations

from rich.console import Console

from lynxtop.tui.screens.compare import compare_table


def _run(run_id: int, per_s: float, total: int) -> dict:
    return {"id": run_id, "profile": "deepseek-v4.1-tp8", "model": "deepseek-ai/DeepSeek-V4.1",
            "log_path": "/tmp/lynxtop-demo-xvzvuc34/logs/20261207T101008Z_deepseek-v4.1-tp8_5b7a1c2e.log",
            "summary": {"serving": {"requests_per_s": 0.36, "prompt_tokens_per_s": per_s, "prompt_tokens": total,
                                    "generation_tokens_per_s": 27.7}}}


def test_long_labels_are_whole_at_the_80_column_dialog_width():
    console = Console(width=74, record=True, color_system=None)  # the Compare dialog's body at 80x24
    console.print(compare_table(_run(2, 80.4, 20330), _run(1, 122.0, 365)))
    text = console.export_text()
    # a wrapped label reads whole once each table row's label cell is joined up
    labels = "".join(line.split("│")[1].strip() for line in text.splitlines() if line.count("│") >= 3)
    for label in ("serving.requests_per_s", "serving.prompt_tokens_per_s", "serving.prompt_tokens",
                  "serving.generation_tokens_per_s"):
        assert label in labels, text
    assert "…" not in "".join(line.split("│")[1] for line in text.splitlines() if line.count("│") >= 3), text
