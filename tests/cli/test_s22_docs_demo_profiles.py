"""docs/simulator.md's description of the demo's profiles is the config `lynxtop demo` writes (session 22 docs audit: it
said `max_num_seqs = 16` where the demo writes 8)."""

from __future__ import annotations

import re
from pathlib import Path

from lynxtop.cli.demo import DemoPaths, config_text
from lynxtop.contract.config import parse_config

DOC = Path(__file__).resolve().parents[2] / "docs" / "simulator.md"


def test_the_demo_profiles_max_num_seqs_are_as_documented(tmp_path):
    doc = DOC.read_text()
    said = dict(re.findall(r"`(deepseek-v4\.1-tp8(?:-fp8kv)?)` \([^`]*`max_num_seqs = (\d+)`", doc.replace("\n", " ")))
    assert set(said) == {"deepseek-v4.1-tp8", "deepseek-v4.1-tp8-fp8kv"}, said
    paths = DemoPaths.under(tmp_path)
    cfg = parse_config(config_text(paths, port=8000, startup_seconds=8, executable=Path("/bin/true")))
    got = {p.name: p.max_num_seqs for p in cfg.profiles}
    assert got == {k: int(v) for k, v in said.items()}
