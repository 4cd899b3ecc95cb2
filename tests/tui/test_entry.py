"""The `lynxtop` / `lynxtop dashboard` entry: bad config and a missing terminal are explained, not crashed on."""

from __future__ import annotations

import subprocess
import sys

from lynxtop.cli.dashboard_cmd import run
from lynxtop.cli.parser import build_parser


def test_no_terminal_is_explained(capsys, sock_dir):
    args = build_parser().parse_args(["--socket", str(sock_dir / "a.sock"), "--database", str(sock_dir / "h.db")])
    assert run(args) == 2
    err = capsys.readouterr().err
    assert "needs a terminal" in err and "lynxtop status" in err


def test_bad_config_exits_2_with_the_key(tmp_path):
    cfg = tmp_path / "bad.toml"
    cfg.write_text("[agent]\nsample_interval_s = 'fast'\n")
    proc = subprocess.run([sys.executable, "-m", "lynxtop", "--config", str(cfg)], capture_output=True, text=True,
                          timeout=60, stdin=subprocess.DEVNULL)
    assert proc.returncode == 2
    assert "sample_interval_s" in proc.stderr and "Traceback" not in proc.stderr
