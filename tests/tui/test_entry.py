"""The `lynxtop` / `lynxtop dashboard` entry: bad config and a missing terminal are explained, not crashed on."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

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


# What the first frame of `lynxtop` (the Node view) does not use, each a measurable part of its start on a loaded
# machine (docs/dashboard.md, benchmarks/tui.py first_frame_s): the version's package metadata (with email, zipfile,
# csv), http.client (the blocking client's), the web server's module, help and dialogs, the other views, and what
# belongs to the agent, the store or the simulator; hashlib (OpenSSL, for masking secrets) and the contract's records
# other than the status (events, runs, profiles, processes: imported with the first answer holding one).
NOT_BEFORE_FIRST_FRAME = (
    "importlib.metadata", "email", "zipfile", "csv", "http.client", "hashlib", "_hashlib",
    "lynxtop.contract.events", "lynxtop.contract.records", "lynxtop.contract.processes",
    "aiohttp", "prometheus_client", "psutil", "uvloop", "pynvml", "textual_serve", "sqlite3",
    "lynxtop.agent", "lynxtop.store", "lynxtop.sim", "lynxtop.cli.web",
    "lynxtop.tui.screens.help", "lynxtop.tui.screens.confirm", "lynxtop.tui.screens.profile_picker",
    "lynxtop.tui.control_text", "lynxtop.tui.screens.gpu", "lynxtop.tui.screens.latency",
    "lynxtop.tui.screens.history", "lynxtop.tui.screens.events", "lynxtop.tui.screens.cluster",
    "lynxtop.tui.cluster_source",
)

_IMPORT_AS_THE_ENTRY_DOES = """
import importlib, json, sys
from lynxtop.cli.parser import build_parser
args = build_parser().parse_args([])
module_name, _ = args.handler.split(":")
importlib.import_module(module_name)
from lynxtop.tui.app import LynxtopApp  # what dashboard_cmd.run imports before app.run()
from lynxtop.tui.source import LiveSource
print(json.dumps(sorted(sys.modules)))
"""


def test_dashboard_entry_imports_nothing_its_first_frame_does_not_need():
    proc = subprocess.run([sys.executable, "-c", _IMPORT_AS_THE_ENTRY_DOES], capture_output=True, text=True,
                          timeout=120, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stderr
    loaded = set(json.loads(proc.stdout.splitlines()[-1]))
    assert "lynxtop.tui.app" in loaded and "lynxtop.cli.dashboard_cmd" in loaded  # the path really was taken
    early = sorted(m for m in loaded if any(m == n or m.startswith(n + ".") for n in NOT_BEFORE_FIRST_FRAME))
    assert early == [], f"imported before the dashboard's first frame: {early}"


def test_version_still_comes_from_the_installed_metadata():
    from importlib.metadata import version

    proc = subprocess.run([sys.executable, "-m", "lynxtop", "--version"], capture_output=True, text=True,
                          timeout=60, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == f"lynxtop {version('lynxtop')}"
    import lynxtop

    assert lynxtop.__version__ == version("lynxtop")


def test_records_imported_lazily_keep_their_names_in_the_client():
    from lynxtop.contract import client, events, processes, records

    for name, module in (("Event", events), ("GpuProcesses", processes), ("ActionAnswer", records),
                         ("ProfileList", records), ("RecordError", records), ("RunInfo", records),
                         ("read_list", records)):
        assert getattr(client, name) is getattr(module, name)
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        client.nothing  # noqa: B018
