"""The `lynxtop` command line: one parser, subcommands dispatched to the packages that own them.

Handlers are named as 'module:function' strings and imported only when chosen, so `lynxtop status` never
pays for Textual and `lynxtop agent` never imports the dashboard.
"""

from __future__ import annotations

import argparse

from lynxtop import __version__

DESCRIPTION = """\
lynxtop: a node agent and terminal dashboard for GPU nodes serving large models with vLLM.

With no command, opens the dashboard (live node view, latency, history, events, controls)."""

EPILOG = """\
configuration:
  --config FILE, else $LYNXTOP_CONFIG, else /etc/lynxtop/config.toml (absent = built-in defaults).
  `lynxtop config check` validates it and prints the argv of every profile.

exit codes:
  0 success; 1 failure (agent refused or the action failed); 2 usage or configuration error;
  3 agent unreachable; 4 busy (another control action is in progress).

Try `lynxtop demo` for a simulated node (no GPU needed)."""


class _Formatter(argparse.RawDescriptionHelpFormatter):
    def __init__(self, prog: str) -> None:
        super().__init__(prog, max_help_position=32, width=100)


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", metavar="FILE",
                   help="config file (default: $LYNXTOP_CONFIG or /etc/lynxtop/config.toml)")


def _socket(p: argparse.ArgumentParser) -> None:
    p.add_argument("--socket", metavar="PATH", help="agent control socket (default: [agent] socket from the config)")


def _database(p: argparse.ArgumentParser) -> None:
    p.add_argument("--database", metavar="PATH", help="history database (default: [agent] database from the config)")


def _sub(subs, name: str, handler: str, help_: str, description: str | None = None) -> argparse.ArgumentParser:
    p = subs.add_parser(name, help=help_, description=description or help_, formatter_class=_Formatter)
    p.set_defaults(handler=handler)
    _common(p)
    return p


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="lynxtop", description=DESCRIPTION, epilog=EPILOG, formatter_class=_Formatter)
    parser.add_argument("--version", action="version", version=f"lynxtop {__version__}")
    _common(parser)
    _socket(parser)
    _database(parser)
    _dashboard_options(parser)
    parser.set_defaults(handler="lynxtop.dashboard_cmd:run")
    subs = parser.add_subparsers(title="commands", metavar="COMMAND")

    p = _sub(subs, "dashboard", "lynxtop.dashboard_cmd:run",
             "open the dashboard (the default when no command is given)")
    _socket(p)
    _database(p)
    _dashboard_options(p)

    p = _sub(subs, "demo", "lynxtop.demo:run",
             "run a SIMULATED node: agent, simulated vLLM and GPUs, traffic, and the dashboard",
             "Start the agent on a temporary state directory with profiles that run the simulated vLLM server\n"
             "(DeepSeek-V4.1 on 8 simulated H200s), drive varied traffic, and open the dashboard.\n"
             "Nothing here touches a GPU. q or Ctrl-C stops everything.")
    p.add_argument("--no-tui", action="store_true", help="print status lines instead of opening the dashboard")
    p.add_argument("--duration", type=float, metavar="SECONDS", help="stop by itself after SECONDS")
    p.add_argument("--state-dir", metavar="DIR", help="keep the demo's database and logs in DIR (default: a temp dir)")
    p.add_argument("--startup-seconds", type=float, default=8.0, metavar="S",
                   help="simulated model load time (default: %(default)s)")

    p = _sub(subs, "agent", "lynxtop.agent_cmd:run", "run the node agent (what systemd starts)",
             "Run the node agent in the foreground: sampling, vLLM supervision, history, control socket.")
    _socket(p)
    _database(p)

    p = _sub(subs, "status", "lynxtop.ctl:status", "show the agent's view of the node")
    _socket(p)
    p.add_argument("--json", action="store_true", help="print the raw JSON status")

    for name, help_ in (("start", "start serving (the current profile, or PROFILE)"),
                        ("stop", "stop serving (the model must load again to serve)"),
                        ("restart", "restart serving (the model loads again: minutes for a large model)")):
        p = _sub(subs, name, f"lynxtop.ctl:{name}", help_)
        _socket(p)
        if name == "start":
            p.add_argument("profile", nargs="?", help="profile to start (default: the current or default profile)")
        p.add_argument("-y", "--yes", action="store_true", help="do not ask for confirmation")
        p.add_argument("--wait", action="store_true", help="wait until the action finishes (ready, or stopped)")

    p = _sub(subs, "switch", "lynxtop.ctl:switch", "stop the current profile and start another",
             "Preflight PROFILE, stop the current run, wait for the GPUs to be freed, start PROFILE as a new run.")
    _socket(p)
    p.add_argument("profile", help="name of the profile to switch to")
    p.add_argument("-y", "--yes", action="store_true", help="do not ask for confirmation")
    p.add_argument("--wait", action="store_true", help="wait until the new run is ready or has failed")

    p = _sub(subs, "runs", "lynxtop.store_cli:runs", "list the recorded runs (one per server start)")
    _database(p)
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument("--limit", type=int, default=50, metavar="N", help="show the newest N runs (default: %(default)s)")

    p = _sub(subs, "export", "lynxtop.store_cli:export", "export history to CSV",
             "Export history as CSV (header row, ISO-8601 UTC time and epoch ms, empty for missing readings).\n"
             "Choose a run or a time range. Times are ISO-8601 (2026-12-01T10:00, UTC unless an offset is given)\n"
             "or epoch milliseconds.")
    _database(p)
    sel = p.add_mutually_exclusive_group(required=True)
    sel.add_argument("--run", type=int, metavar="N", help="export the time span of run N")
    sel.add_argument("--from", dest="time_from", metavar="T", help="start of the range")
    p.add_argument("--to", dest="time_to", metavar="T", help="end of the range (default: now)")
    p.add_argument("--table", choices=("gpu", "host", "serving", "events", "runs", "all"), default="gpu",
                   help="what to export (default: %(default)s; 'all' needs -o DIR)")
    p.add_argument("--resolution", choices=("raw", "1m", "1h"), default="raw", help="samples or rollups (default: raw)")
    p.add_argument("-o", "--output", metavar="FILE", help="write to FILE (default: standard output)")
    p.add_argument("--force", action="store_true", help="overwrite an existing FILE")
    p.add_argument("--raw", action="store_true",
                   help="write text cells verbatim (default: a text cell starting with = + - @ tab or CR gets a "
                        "leading ' so spreadsheets do not run it as a formula)")

    p = _sub(subs, "config", "lynxtop.config_cli:check", "configuration tools")
    csubs = p.add_subparsers(title="config commands", metavar="ACTION", required=True)
    c = _sub(csubs, "check", "lynxtop.config_cli:check",
             "validate the config and print it with the exact argv of each profile")
    c.add_argument("--json", action="store_true", help="print JSON")
    return parser


def _dashboard_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--readonly", action="store_true", help="dashboard: hide and refuse start/stop/restart/switch")
    p.add_argument("--utc", action="store_true", help="dashboard: show times in UTC instead of local time")
