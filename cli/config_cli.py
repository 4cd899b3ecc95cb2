"""`lynxtop config check` and the shared 'load the config or explain why not' helper for commands."""

from __future__ import annotations

import json
import shlex
import sys
from argparse import Namespace
from pathlib import Path

from lynxtop.contract.config import (
    Config,
    ConfigError,
    config_as_dict,
    host_problems,
    load_config,
    ray_executable,
    socket_path_problem,
)
from lynxtop.contract.redact import redact_argv
from lynxtop.contract.terminal import terminal_safe

# Commands that also check this node (each profile's executable exists and is executable): the agent, and
# `config check`, which must give the agent's verdict word for word. Clients (status, stop, the dashboard) only
# need the socket path, and may run where vLLM is not installed.
_HOST_CHECKED = ("lynxtop.cli.agent_cmd:run", "lynxtop.cli.config_cli:check")


def load_or_exit(args: Namespace, host: bool | None = None) -> Config | None:
    """The config for a command, or None after printing every problem (the caller exits 2).

    One validation for `config check` and `lynxtop agent`: both get parse_config's checks, the env_files and
    credentials read (read_secret_env) and host_problems, printed the same way.
    """
    if host is None:
        host = getattr(args, "handler", None) in _HOST_CHECKED
    try:
        cfg = load_config(getattr(args, "config", None), secrets=host)  # env_file and credentials: host only
        problems = host_problems(cfg) if host else []
        override = getattr(args, "socket", None)
        if host and override:  # `lynxtop agent --socket PATH` replaces [agent] socket: the same check applies
            try:
                problem = socket_path_problem(Path(override).expanduser().absolute())
            except RuntimeError:  # `~name/...` for a user this system does not know
                problem = f"{override!r}: no such user's home directory to expand ~ to"
            problems += [f"--socket: {problem}"] if problem else []
    except ConfigError as exc:
        problems = exc.problems
    for line in () if problems else cfg.warnings:  # secrets others may read: told at every load, not refused
        print(terminal_safe(f"lynxtop: config warning: {line}"), file=sys.stderr)
    for line in problems:
        print(terminal_safe(f"lynxtop: config error: {line}"), file=sys.stderr)  # it may quote the file
    return None if problems else cfg


def _say(text: str = "") -> None:
    """What `config check` prints, escaped: it quotes the file (a path, a name, a key the TOML made up)."""
    print(terminal_safe(text, lines=True))


def check(args: Namespace) -> int:
    cfg = load_or_exit(args, host=True)
    if cfg is None:
        return 2
    data = config_as_dict(cfg)
    if args.json:
        # the secret-exposure warnings, as stderr words them (load_or_exit said them there too): a script reading
        # the JSON alone must not take a config whose token every user reads for a clean one
        _say(json.dumps(data | {"warnings": list(cfg.warnings)}, indent=2))
        return 0
    _say(f"config: {data['path'] or '(no file: built-in defaults)'} — valid")
    _say("\n[agent]")
    for k, v in data["agent"].items():
        if k != "retention":
            _say(f"  {k} = {v!r}")
    _say("  retention = " + ", ".join(f"{k}={v:g}" for k, v in data["agent"]["retention"].items()))
    _say("\n[sla]")
    for k, v in data["sla"].items():
        _say(f"  {k} = {v:g}")
    if cfg.agent.role != "single":
        _print_ray(cfg)
    if not cfg.profiles:
        why = ("a Ray worker runs no vLLM; the head's profile uses its GPUs through Ray" if cfg.agent.role == "worker"
               else "the agent will sample the node but serve nothing")
        _say(f"\n(no profiles: {why})")
    for p in cfg.profiles:
        _say(f"\n[[profile]] {p.name}" + (f" — {p.description}" if p.description else ""))
        _say(f"  argv: {shlex.join(p.shown_argv())}")  # a URL's credentials masked, as the env's secrets
        if p.env:  # secret values masked (***<short hash>): this output gets pasted into tickets
            _say("  env:  " + " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(p.shown_env().items())))
        if p.env_file is not None or p.env_credentials:
            _say("  secrets from: " + ", ".join(
                ([f"env_file {p.env_file}"] if p.env_file is not None else [])
                + [f"{k} from credential {c}" for k, c in sorted(p.env_credentials.items())]))
        _say(f"  readiness timeout {p.readiness_timeout_s:g} s, stop grace {p.stop_grace_s:g} s")
    return 0


def _print_ray(cfg: Config) -> None:
    """The [ray] table with what the agent will run: `ray start`'s exact argv, as for a profile."""
    from lynxtop.agent.cluster.raynode import ray_argv  # agent code only for a head or worker config

    data = config_as_dict(cfg)["ray"]
    _say(f"\n[ray] (agent.role = {cfg.agent.role!r}: the agent supervises this node's Ray)")
    for k, v in data.items():
        if k not in ("env", "extra_args"):
            _say(f"  {k} = {v!r}")
    exe, why = ray_executable(cfg.ray)
    _say(f"  ray: {exe}" + (f" ({why})" if why else ""))
    _say(f"  argv: {shlex.join(redact_argv(ray_argv(cfg)))}")
    if cfg.ray.env:
        _say("  env:  " + " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(data["env"].items())))
