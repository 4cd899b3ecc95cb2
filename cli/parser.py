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
            p.add_argument("profile", nargs="?", help="profile to start (default: the current or default profile; "
                                                      "none on a Ray worker, where start starts its Ray)")
        if name == "stop":
            p.add_argument("--cluster", action="store_true",
                           help="on a Ray head: stop serving, then every worker's Ray, then this head's Ray")
        p.add_argument("-y", "--yes", action="store_true", help="do not ask for confirmation")
        p.add_argument("--wait", action="store_true", help="wait until the action finishes (ready, or stopped)")

    p = _sub(subs, "switch", "lynxtop.ctl:switch", "stop the current profile and start another",
             "Preflight PROFILE, stop the current run, wait for the GPUs to be freed, start PROFILE as a new run.")
    _socket(p)
    p.add_argument("profile", help="name of the profile to switch to")
    p.add_argument("-y", "--yes", action="store_true", help="do not ask for confirmation")
    p.add_argument("--wait", action="store_true", help="wait until the new run is ready or has failed")

    _ray(subs)

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

    p = _sub(subs, "check", "lynxtop.check_cmd:run", "preflight: GPU architecture, attention backend, memory fit",
             "Check each profile (or --profile NAME) against this node's GPUs and the model's size: attention\n"
             "backend vs architecture, memory per GPU, TP x PP x DP vs the GPUs, Ray for several nodes.\n"
             "Exit 0 all good, 1 warnings, 2 blocking problems. See docs/check.md.")
    p.add_argument("--profile", metavar="NAME", help="check this profile only (default: every profile)")
    p.add_argument("--json", action="store_true", help="print JSON")

    _bench(subs)

    p = _sub(subs, "config", "lynxtop.config_cli:check", "configuration tools")
    csubs = p.add_subparsers(title="config commands", metavar="ACTION", required=True)
    c = _sub(csubs, "check", "lynxtop.config_cli:check",
             "validate the config and print it with the exact argv of each profile")
    c.add_argument("--json", action="store_true", help="print JSON")
    return parser


def _ray(subs) -> None:
    """`lynxtop ray start|stop`: this node's Ray on the head and worker roles (docs/api.md, multi-node)."""
    p = _sub(subs, "ray", "lynxtop.ctl:ray_start", "this node's Ray (agent.role head or worker)",
             "Start or stop the Ray the agent supervises on this node. On a worker, `lynxtop start`/`stop` do the\n"
             "same; a head's Ray stops only with `lynxtop stop --cluster` (serving first, then the workers).")
    rsubs = p.add_subparsers(title="ray commands", metavar="ACTION", required=True)
    for name, help_ in (("start", "start this node's Ray (also after a crash loop or a cluster stop)"),
                        ("stop", "stop this node's Ray (a worker; kept stopped until started again)")):
        c = _sub(rsubs, name, f"lynxtop.ctl:ray_{name}", help_)
        _socket(c)
        if name == "stop":
            c.add_argument("--reason", help="why, for the agent's events")
            c.add_argument("-y", "--yes", action="store_true", help="do not ask for confirmation")
        c.add_argument("--wait", action="store_true", help="wait until Ray is running, or stopped")


def _bench(subs) -> None:
    """`lynxtop bench` (a sweep), `bench compare A B`, `bench list` (docs/bench.md)."""
    p = _sub(subs, "bench", "lynxtop.bench:run", "measure throughput and latency against concurrency",
             "Stream synthetic requests at the served model (the URL from the agent, or --url) at each level of a\n"
             "sweep; print a table and a chart, store each level in the history (through the agent), and with\n"
             "--json write `vllm bench serve --save-result` keys, one object per level. Ctrl-C keeps finished levels.")
    _socket(p)
    p.add_argument("--url", help="server base URL (default: the agent's serving URL)")
    p.add_argument("--model", help="model name to request (default: the served model)")
    p.add_argument("--api-key", help="bearer token for the server")
    p.add_argument("--input-len", type=int, default=128, metavar="N", help="prompt tokens (default: %(default)s)")
    p.add_argument("--output-len", type=int, default=128, metavar="N",
                   help="output tokens, ignore_eos (default: %(default)s)")
    p.add_argument("--prompts", metavar="FILE", help="text prompts: JSON lines with \"prompt\", or one a line")
    lv = p.add_mutually_exclusive_group()
    lv.add_argument("--concurrency", type=int, nargs="+", metavar="C",
                    help="concurrency levels (default: 1 2 4 8 16 32 64)")
    lv.add_argument("--request-rate", type=float, nargs="+", metavar="R", help="request rates per second instead")
    p.add_argument("--max-concurrency", type=int, metavar="C", help="cap in flight with --request-rate")
    p.add_argument("--requests", type=int, metavar="N", help="requests per level (default: 4 x concurrency, min 8)")
    p.add_argument("--rounds", type=int, metavar="K", help="instead of --requests: K requests per stream of a level")
    p.add_argument("--duration", type=float, metavar="S", help="run each level for S seconds instead")
    p.add_argument("--warmup", type=int, default=2, metavar="N", help="warm-up requests (default: %(default)s)")
    p.add_argument("--seed", type=int, default=0, help="prompt seed (default: %(default)s)")
    p.add_argument("--timeout", type=float, default=600.0, metavar="S", help="per request (default: %(default)s)")
    p.add_argument("--name", default="random", help="label stored with the sweep (default: %(default)s)")
    p.add_argument("--json", metavar="FILE", help="write the levels as JSON (vllm bench serve keys)")
    p.add_argument("--no-store", action="store_true", help="do not store the results in the history")
    bsubs = p.add_subparsers(title="bench commands", metavar="ACTION")
    c = _sub(bsubs, "compare", "lynxtop.bench:compare", "two stored sweeps side by side, per level, in percent")
    _database(c)
    c.add_argument("run_a", metavar="RUN_A", help="sweep id, or a run number (its newest sweep)")
    c.add_argument("run_b", metavar="RUN_B", help="sweep id, or a run number (its newest sweep)")
    c.add_argument("--json", action="store_true", help="print JSON")
    c = _sub(bsubs, "list", "lynxtop.bench:list_sweeps", "the stored sweeps, newest first")
    _database(c)
    c.add_argument("--limit", type=int, default=20, metavar="N", help="show N sweeps (default: %(default)s)")


def _dashboard_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--readonly", action="store_true", help="dashboard: hide and refuse start/stop/restart/switch")
    p.add_argument("--utc", action="store_true", help="dashboard: show times in UTC instead of local time")
