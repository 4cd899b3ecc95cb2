"""The `lynxtop` command line: one parser, subcommands dispatched to the packages that own them.

Handlers are named as 'module:function' strings and imported only when chosen, so `lynxtop status` never
pays for Textual and `lynxtop agent` never imports the dashboard.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable

DESCRIPTION = """\
lynxtop: a node agent and terminal dashboard for GPU nodes serving large models with vLLM.

With no command, opens the dashboard (live node view, latency, history, events, controls)."""

EPILOG = """\
configuration:
  --config FILE, else $LYNXTOP_CONFIG, else /etc/lynxtop/config.toml (absent = built-in defaults).
  `lynxtop config check` validates it and prints the argv of every profile.

exit codes:
  0 success (also an action already done: `stop` of a stopped node, `start` of the profile serving;
    a note on stderr says so); 1 failure (agent refused or the action failed); 2 usage or configuration
  error; 3 agent unreachable; 4 busy (another control action is in progress); 5 the run changed since
  you looked (nothing done); 6 `status --check`: serving is not READY or the agent not healthy;
  7 `check` could not check (bad --profile or option, config error, GPUs unreadable); 130 Ctrl-C
  (with --wait: the action goes on at the agent; `lynxtop stop` cancels it). `check` itself exits
  0 all good, 1 warnings, 2 blocking problems (docs/check.md).

Try `lynxtop demo` for a simulated node (no GPU needed)."""


INT64_MAX = 2**63 - 1  # SQLite's INTEGER: a run id or a LIMIT beyond it cannot even be asked for


def _int(lo: int, hi: int) -> Callable[[str], int]:
    """An integer argument within [lo, hi]: anything else is argparse's usage error (exit 2), never a traceback
    further in (SQLite's OverflowError, a year out of range)."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"invalid int value: {text!r}") from None
        if not lo <= value <= hi:
            raise argparse.ArgumentTypeError(f"must be a whole number from {lo} to {hi} (got {text})")
        return value
    return parse


def _float(lo: float, hi: float, *, above: bool = False) -> Callable[[str], float]:
    """A finite number within [lo, hi] (or (lo, hi] when `above`): nan, inf and 1e400 are refused here."""
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"invalid float value: {text!r}") from None
        if not math.isfinite(value) or value > hi or value < lo or (above and value == lo):
            low = f"above {lo:g}" if above else f"from {lo:g}"
            raise argparse.ArgumentTypeError(f"must be a number {low} to {hi:g} (got {text})")
        return value
    return parse


_SECONDS = _float(0, 10**7, above=True)  # over 100 days: more is a typo, and a timer that far overflows
_COUNT = _int(1, 10**9)  # rows to show, requests to send
_TOKENS = _int(1, 10**7)
_CONCURRENCY = _int(1, 10**6)


class _Formatter(argparse.RawDescriptionHelpFormatter):
    def __init__(self, prog: str) -> None:
        super().__init__(prog, max_help_position=32, width=100)


# The options that say which agent, config or database a command works on, and the commands each applies to.
# Every parser (the top, each command, each action) accepts all three, so one can be written before or after
# the command; each level stores into a dest of its own ("socket@1") and _resolve() merges them afterwards:
# argparse would otherwise let a subcommand's absent option (default None) overwrite the top level's value,
# which is how `lynxtop --socket A stop` once stopped the agent of the default config.
_TARGETS = {"config": "FILE", "socket": "PATH", "database": "PATH"}
_TARGET_HELP = {"config": "config file (default: $LYNXTOP_CONFIG or /etc/lynxtop/config.toml)",
                "socket": "agent control socket (default: [agent] socket from the config)",
                "database": "history database (default: [agent] database from the config)"}
_C, _CS, _CD, _CSD = ("config",), ("config", "socket"), ("config", "database"), ("config", "socket", "database")
TAKES: dict[str, tuple[str, ...]] = {
    "lynxtop.cli.dashboard_cmd:run": _CSD, "lynxtop.cli.demo:run": (), "lynxtop.cli.agent_cmd:run": _CSD,
    "lynxtop.cli.ctl:status": _CS, "lynxtop.cli.ctl:start": _CS, "lynxtop.cli.ctl:stop": _CS,
    "lynxtop.cli.ctl:restart": _CS,
    "lynxtop.cli.ctl:switch": _CS, "lynxtop.cli.ctl:ray_start": _CS, "lynxtop.cli.ctl:ray_stop": _CS,
    "lynxtop.cli.store_cli:runs": _CD, "lynxtop.cli.store_cli:export": _CD, "lynxtop.cli.check_cmd:run": _C,
    "lynxtop.cli.bench:run": _CS, "lynxtop.cli.bench:compare": _CD, "lynxtop.cli.bench:list_sweeps": _CD,
    "lynxtop.cli.config_cli:check": _C, "lynxtop.cli.events_cmd:run": _CSD,
}


def _targets(p: argparse.ArgumentParser, depth: int, handler: str) -> None:
    """--config/--socket/--database on one parser; help shown only for those its own command takes."""
    for name, metavar in _TARGETS.items():
        p.add_argument(f"--{name}", dest=f"{name}@{depth}", metavar=metavar, default=argparse.SUPPRESS,
                       help=_TARGET_HELP[name] if name in TAKES[handler] else argparse.SUPPRESS)


def _sub(subs, name: str, handler: str, help_: str, description: str | None = None,
         parent: str | None = None) -> argparse.ArgumentParser:
    """A command (or, under `parent`, one of its actions) with its handler and the target options."""
    p = subs.add_parser(name, help=help_, description=description or help_, formatter_class=_Formatter)
    p.set_defaults(handler=handler, command=f"{parent} {name}" if parent else name)
    _targets(p, 2 if parent else 1, handler)
    return p


class _Parser(argparse.ArgumentParser):
    """The top-level parser: after parsing, merges the target options of every level (see _TARGETS)."""

    def parse_known_args(self, args=None, namespace=None):  # type: ignore[override]
        argv = _join_relative_times(sys.argv[1:] if args is None else list(args))
        ns, rest = super().parse_known_args(argv, namespace)
        _resolve(self, ns)
        return ns, rest

    def parse_args(self, args=None, namespace=None):  # type: ignore[override]
        ns, rest = self.parse_known_args(args, namespace)
        if rest and getattr(ns, "handler", None) == "lynxtop.cli.check_cmd:run":  # `check`'s usage error: not 2
            self.exit(CHECK_COULD_NOT, f"lynxtop check: error: unrecognized arguments: {' '.join(rest)}\n")
        if rest:
            self.error(f"unrecognized arguments: {' '.join(rest)}")
        return ns


def _join_relative_times(argv: list[str]) -> list[str]:
    """`--from -24h` (`--to`, `--since`) reads to argparse as two options; join such values as `--from=-24h`."""
    out: list[str] = []
    i = 0
    while i < len(argv):
        nxt = argv[i + 1] if i + 1 < len(argv) else ""
        if argv[i] in ("--from", "--to", "--since") and nxt[:1] == "-" and nxt[1:2].isdigit():
            out.append(f"{argv[i]}={nxt}")
            i += 2
        else:
            out.append(argv[i])
            i += 1
    return out


def _refuse(parser: argparse.ArgumentParser, command: str, msg: str) -> None:
    """A usage error (exit 2) in one line: the top-level usage would list every command."""
    parser.exit(2, f"lynxtop {command}: error: {msg}\n")


def _resolve(parser: argparse.ArgumentParser, ns: argparse.Namespace) -> None:
    """One value per target option, wherever it was written; refused (exit 2) where the command does not take
    it, or when two positions give different values."""
    command = getattr(ns, "command", None) or "dashboard"
    takes = TAKES.get(ns.handler, _CSD)
    for name in _TARGETS:
        given = {}
        for depth in range(3):
            value = vars(ns).pop(f"{name}@{depth}", None)
            if value is not None:
                given[depth] = value
        if given and name not in takes:
            _refuse(parser, command, f"--{name} does not apply to `lynxtop {command}` ("
                    + (f"it takes {', '.join('--' + t for t in takes)})" if takes else
                       "it takes none of --config, --socket, --database)"))
        if len(set(given.values())) > 1:
            shown = " and ".join(repr(v) for v in given.values())
            _refuse(parser, command, f"--{name} given twice with different values ({shown}); give it once")
        setattr(ns, name, next(iter(given.values())) if given else None)


class _Version(argparse._VersionAction):
    """--version, the version looked up only when asked for: it comes from the package metadata, which every other
    command (the dashboard's first frame first) would pay ~0.1 s to import."""

    def __call__(self, parser, namespace, values, option_string=None):  # noqa: ANN001
        from lynxtop import __version__

        self.version = f"lynxtop {__version__}"
        super().__call__(parser, namespace, values, option_string)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="lynxtop", description=DESCRIPTION, epilog=EPILOG, formatter_class=_Formatter)
    parser.add_argument("--version", action=_Version)
    _targets(parser, 0, "lynxtop.cli.dashboard_cmd:run")
    _dashboard_options(parser)
    parser.set_defaults(handler="lynxtop.cli.dashboard_cmd:run")
    subs = parser.add_subparsers(title="commands", metavar="COMMAND", parser_class=argparse.ArgumentParser)

    p = _sub(subs, "dashboard", "lynxtop.cli.dashboard_cmd:run",
             "open the dashboard (the default when no command is given)")
    _dashboard_options(p)

    p = _sub(subs, "demo", "lynxtop.cli.demo:run",
             "run a SIMULATED node: agent, simulated vLLM and GPUs, traffic, and the dashboard",
             "Start the agent on a temporary state directory with profiles that run the simulated vLLM server\n"
             "(DeepSeek-V4.1 on 8 simulated H200s), drive varied traffic, and open the dashboard.\n"
             "Nothing here touches a GPU. q or Ctrl-C stops everything.")
    p.add_argument("--no-tui", action="store_true", help="print status lines instead of opening the dashboard")
    p.add_argument("--duration", type=_SECONDS, metavar="SECONDS", help="stop by itself after SECONDS")
    p.add_argument("--state-dir", metavar="DIR", help="keep the demo's database and logs in DIR (default: a temp dir)")
    p.add_argument("--startup-seconds", type=_float(0, 3600), default=8.0, metavar="S",
                   help="simulated model load time (default: %(default)s)")

    p = _sub(subs, "agent", "lynxtop.cli.agent_cmd:run", "run the node agent (what systemd starts)",
             "Run the node agent in the foreground: sampling, vLLM supervision, history, control socket.")

    p = _sub(subs, "status", "lynxtop.cli.ctl:status", "show the agent's view of the node")
    p.add_argument("--json", action="store_true", help="print the raw JSON status")
    p.add_argument("--check", action="store_true",
                   help="exit 0 only if serving is READY and the agent healthy, else 6 (crash-loop, backoff, "
                        "starting, degraded, stopped, unhealthy), with the reason on stderr")

    for name, help_ in (("start", "start serving (the current profile, or PROFILE)"),
                        ("stop", "stop serving (the model must load again to serve)"),
                        ("restart", "restart serving (the model loads again: minutes for a large model)")):
        p = _sub(subs, name, f"lynxtop.cli.ctl:{name}", help_)
        if name == "start":
            p.add_argument("profile", nargs="?", help="profile to start (default: the current or default profile; "
                                                      "none on a Ray worker, where start starts its Ray)")
        if name == "stop":
            p.add_argument("--cluster", action="store_true",
                           help="on a Ray head: stop serving, then every worker's Ray, then this head's Ray")
        p.add_argument("-y", "--yes", action="store_true", help="do not ask for confirmation")
        p.add_argument("--wait", action="store_true", help="wait until the action finishes (ready, or stopped); "
                       "Ctrl-C stops only the waiting: the action continues on the agent (`lynxtop stop` cancels "
                       "a start or restart)")

    p = _sub(subs, "switch", "lynxtop.cli.ctl:switch", "stop the current profile and start another",
             "Preflight PROFILE, stop the current run, wait for the GPUs to be freed, start PROFILE as a new run.")
    p.add_argument("profile", help="name of the profile to switch to")
    p.add_argument("-y", "--yes", action="store_true", help="do not ask for confirmation")
    p.add_argument("--wait", action="store_true", help="wait until the new run is ready or has failed; Ctrl-C "
                   "stops only the waiting: the switch continues on the agent (`lynxtop stop` cancels it)")

    _ray(subs)

    p = _sub(subs, "runs", "lynxtop.cli.store_cli:runs", "list the recorded runs (one per server start)")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument("--limit", type=_COUNT, default=50, metavar="N",
                   help="show the newest N runs (default: %(default)s)")

    p = _sub(subs, "events", "lynxtop.cli.events_cmd:run", "show the agent's events, newest last",
             "Show the agent's events (crashes, SLA breaches, actions, GPU trouble), newest last, in local time.\n"
             "Read through the agent's socket when it answers, else from the history database (read-only).")
    p.add_argument("--since", metavar="T", help="only events from T on: -1h, -30m, -7d, ISO-8601 (UTC unless an "
                                                "offset is given) or epoch milliseconds")
    p.add_argument("--severity", choices=("info", "warning", "error", "critical"), metavar="LEVEL",
                   help="only events of at least this severity: info, warning, error, critical")
    p.add_argument("--kind", metavar="PREFIX", help="only kinds starting with PREFIX: a family (serving.) or a kind "
                                                    "(sla.breach)")
    p.add_argument("--run", type=_int(1, INT64_MAX), metavar="N", help="only events of run N")
    p.add_argument("--limit", type=_COUNT, default=50, metavar="N",
                   help="show the newest N matching events (default: %(default)s)")
    p.add_argument("--json", action="store_true", help="one JSON object per line")
    p.add_argument("--utc", action="store_true", help="show times in UTC instead of local time")

    p = _sub(subs, "export", "lynxtop.cli.store_cli:export", "export history to CSV",
             "Export history as CSV (header row, ISO-8601 UTC time and epoch ms, empty for missing readings).\n"
             "Choose a run or a time range. Times are ISO-8601 (2026-12-01T10:00, UTC unless an offset is given)\n"
             "or epoch milliseconds.")
    sel = p.add_mutually_exclusive_group(required=True)
    sel.add_argument("--run", type=_int(1, INT64_MAX), metavar="N", help="export the time span of run N")
    sel.add_argument("--from", dest="time_from", metavar="T", help="start of the range")
    p.add_argument("--to", dest="time_to", metavar="T", help="end of the range (default: now)")
    p.add_argument("--table", choices=("gpu", "host", "serving", "events", "runs", "all"), default="gpu",
                   help="what to export (default: %(default)s; 'all' needs -o DIR)")
    p.add_argument("--resolution", choices=("raw", "1m", "1h"), default="raw",
                   help="samples, or the stored rollups: whole buckets only, the newest minute or hour not yet "
                        "rolled up is left out (default: raw)")
    p.add_argument("-o", "--output", metavar="FILE", help="write to FILE (default: standard output)")
    p.add_argument("--force", action="store_true", help="overwrite an existing FILE")
    p.add_argument("--raw", action="store_true",
                   help="write text cells verbatim (default: a text cell starting with = + - @ tab or CR gets a "
                        "leading ' so spreadsheets do not run it as a formula)")

    p = _sub(subs, "check", "lynxtop.cli.check_cmd:run", "preflight: GPU architecture, attention backend, memory fit",
             "Check each profile (or --profile NAME) against this node's GPUs and the model's size: attention\n"
             "backend vs architecture, memory per GPU, TP x PP x DP vs the GPUs, Ray for several nodes.\n"
             "Exit 0 all good, 1 warnings, 2 blocking problems; 7 could not check (a bad --profile or option,\n"
             "a config error, GPUs unreadable). See docs/check.md.")
    p.add_argument("--profile", metavar="NAME", help="check this profile only (default: every profile)")
    p.add_argument("--json", action="store_true", help="print JSON")
    # its own usage errors are "could not check" too: exit 2 is a blocking problem here (a CI gate's verdict)
    p.exit = _exit_could_not_check(p.exit)  # type: ignore[method-assign]

    _bench(subs)

    p = _sub(subs, "config", "lynxtop.cli.config_cli:check", "configuration tools")
    csubs = p.add_subparsers(title="config commands", metavar="ACTION", required=True)
    c = _sub(csubs, "check", "lynxtop.cli.config_cli:check",
             "validate the config and print it with the exact argv of each profile", parent="config")
    c.add_argument("--json", action="store_true", help="print JSON")
    return parser


def _ray(subs) -> None:
    """`lynxtop ray start|stop`: this node's Ray on the head and worker roles (docs/api.md, multi-node)."""
    p = _sub(subs, "ray", "lynxtop.cli.ctl:ray_start", "this node's Ray (agent.role head or worker)",
             "Start or stop the Ray the agent supervises on this node. On a worker, `lynxtop start`/`stop` do the\n"
             "same; a head's Ray stops only with `lynxtop stop --cluster` (serving first, then the workers).")
    rsubs = p.add_subparsers(title="ray commands", metavar="ACTION", required=True)
    for name, help_ in (("start", "start this node's Ray (also after a crash loop or a cluster stop)"),
                        ("stop", "stop this node's Ray (a worker; kept stopped until started again)")):
        c = _sub(rsubs, name, f"lynxtop.cli.ctl:ray_{name}", help_, parent="ray")
        if name == "stop":
            c.add_argument("--reason", help="why, for the agent's events")
            c.add_argument("-y", "--yes", action="store_true", help="do not ask for confirmation")
        c.add_argument("--wait", action="store_true", help="wait until Ray is running, or stopped")


def _bench(subs) -> None:
    """`lynxtop bench` (a sweep), `bench compare A B`, `bench list` (docs/bench.md)."""
    p = _sub(subs, "bench", "lynxtop.cli.bench:run", "measure throughput and latency against concurrency",
             "Stream synthetic requests at the served model (the URL from the agent, or --url) at each level of a\n"
             "sweep; print a table and a chart, store each level in the history (through the agent), and with\n"
             "--save-result write one `vllm bench serve --save-result` file per level. Ctrl-C keeps finished levels.")
    p.add_argument("--url", help="server base URL (default: the agent's serving URL)")
    p.add_argument("--model", help="model name to request (default: the served model)")
    p.add_argument("--api-key", help="bearer token for the server (vLLM's --api-key); without it, VLLM_API_KEY, else "
                   "OPENAI_API_KEY is read: better, as a command line is seen by every local user (ps). The server "
                   "refusing the key (HTTP 401/403) is exit 1")
    p.add_argument("--input-len", type=_TOKENS, default=128, metavar="N", help="prompt tokens (default: %(default)s)")
    p.add_argument("--output-len", type=_TOKENS, default=128, metavar="N",
                   help="output tokens, ignore_eos (default: %(default)s)")
    p.add_argument("--prompts", metavar="FILE", help="text prompts: JSON lines with \"prompt\", or one a line")
    lv = p.add_mutually_exclusive_group()
    lv.add_argument("--concurrency", type=_CONCURRENCY, nargs="+", metavar="C",
                    help="concurrency levels (default: 1 2 4 8 16 32 64)")
    lv.add_argument("--request-rate", type=_float(0, 10**6, above=True), nargs="+", metavar="R",
                    help="request rates per second instead")
    p.add_argument("--max-concurrency", type=_CONCURRENCY, metavar="C", help="cap in flight with --request-rate")
    p.add_argument("--requests", type=_COUNT, metavar="N", help="requests per level (default: 4 x concurrency, min 8)")
    p.add_argument("--rounds", type=_COUNT, metavar="K", help="instead of --requests: K requests per stream of a level")
    p.add_argument("--duration", type=_SECONDS, metavar="S", help="run each level for S seconds instead")
    p.add_argument("--warmup", type=_int(0, 10**9), default=2, metavar="N",
                   help="warm-up requests (default: %(default)s)")
    p.add_argument("--seed", type=_int(0, INT64_MAX), default=0, help="prompt seed (default: %(default)s)")
    p.add_argument("--timeout", type=_SECONDS, default=600.0, metavar="S", help="per request (default: %(default)s)")
    p.add_argument("--name", default="random", help="label stored with the sweep (default: %(default)s)")
    p.add_argument("--json", metavar="FILE", help="write the levels as a JSON array (vllm bench serve keys)")
    p.add_argument("--save-result", action="store_true",
                   help="write one `vllm bench serve --save-result` file per level (vLLM's keys and names)")
    p.add_argument("--result-dir", metavar="DIR", help="where --save-result writes (default: the current directory)")
    p.add_argument("--label", help="--save-result: the files' label and name prefix (default: openai)")
    p.add_argument("--no-store", action="store_true", help="do not store the results in the history")
    bsubs = p.add_subparsers(title="bench commands", metavar="ACTION")
    c = _sub(bsubs, "compare", "lynxtop.cli.bench:compare", "two stored sweeps side by side, per level, in percent",
             parent="bench")
    c.add_argument("run_a", metavar="RUN_A", help="sweep id, or a run number (its newest sweep)")
    c.add_argument("run_b", metavar="RUN_B", help="sweep id, or a run number (its newest sweep)")
    c.add_argument("--json", action="store_true", help="print JSON")
    c = _sub(bsubs, "list", "lynxtop.cli.bench:list_sweeps", "the stored sweeps, newest first", parent="bench")
    c.add_argument("--limit", type=_COUNT, default=20, metavar="N", help="show N sweeps (default: %(default)s)")
    c.add_argument("--json", action="store_true", help="print JSON")


CHECK_COULD_NOT = 7  # `lynxtop check` could not check: docs/check.md


def _exit_could_not_check(exit_: Callable[..., None]) -> Callable[..., None]:
    """`check`'s parser exit: a usage error (status 2 from argparse) becomes CHECK_COULD_NOT; --help stays 0."""
    def exit_check(status: int = 0, message: str | None = None) -> None:
        exit_(CHECK_COULD_NOT if status == 2 else status, message)
    return exit_check


def _dashboard_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--readonly", action="store_true", help="dashboard: hide and refuse start/stop/restart/switch")
    p.add_argument("--utc", action="store_true", help="dashboard: show times in UTC instead of local time")
    web = p.add_mutually_exclusive_group()
    web.add_argument("--web", metavar="HOST:PORT",
                     help="dashboard: serve it to a browser on a loopback HOST:PORT instead (textual-serve; reach "
                          "it over `ssh -L`), read-only unless --web-control")
    web.add_argument("--web-listen", metavar="HOST:PORT",
                     help="as --web, on any address (not only loopback): anyone who reaches it sees this node")
    p.add_argument("--node-port", type=_int(1, 65535), metavar="PORT",
                   help="dashboard on a Ray head: the port of the other nodes' read-only endpoint (default: the port "
                        "of this config's [agent] metrics_listen)")
    p.add_argument("--node-token-file", metavar="PATH",
                   help="dashboard on a Ray head: the other nodes' read token (their [agent] tcp_token_file), for "
                        "their history, events, logs and processes (default: this config's [agent] tcp_token_file)")
    p.add_argument("--web-control", action="store_true",
                   help="--web: let the browser start/stop/restart/switch (only if you may control the agent)")
