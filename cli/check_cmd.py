"""`lynxtop check [--profile NAME] [--json]`: the preflight verdicts of agent/serving/check.py, before anything starts.

The command opens NVML itself (read-only, the static facts only) rather than asking the agent: NVML serves any
number of processes, and the check must work where the agent is down or not installed yet. A config's
`fake_nvml` node is read the same way, so the command can be tried without a GPU. On a Ray head (agent.role =
"head") a Ray profile is judged against the GPUs Ray reports for the whole cluster, read from Ray's state API on
loopback, again without the agent.
Exit codes: 0 all good, 1 warnings (or something could not be checked), 2 blocking problems or an error.
"""

from __future__ import annotations

import dataclasses
import http.client
import json
import logging
import sys
import urllib.error
import urllib.request
from argparse import Namespace
from typing import Any

from lynxtop.agent.serving.check import (
    ClusterFacts,
    Level,
    NodeFacts,
    Report,
    check_profile,
    facts_from_info,
    gib,
    ray_installed,
)
from lynxtop.cli.config_cli import load_or_exit
from lynxtop.contract.config import Config
from lynxtop.contract.models import find_model
from lynxtop.contract.status import describe_node
from lynxtop.contract.terminal import terminal_safe

RAY_TIMEOUT_S = 3.0

_MARK = {Level.OK: "ok", Level.WARNING: "WARNING", Level.BLOCKING: "BLOCKING", Level.UNKNOWN: "unknown"}


class GpuReadError(Exception):
    pass


def read_gpus(fake_nvml: str) -> tuple[list[dict[str, Any]], str]:
    """(the sampler's static rows, driver version), or GpuReadError with the reason in words."""
    from lynxtop.agent.gpu.backend import open_backend
    from lynxtop.agent.gpu.sampler import GpuSampler
    from lynxtop.sim.gpus import SimScenario  # the command composes: a "sim" node is the simulator's

    logging.getLogger("lynxtop.gpu").addHandler(logging.NullHandler())  # the sampler logs it: say it once, below
    try:
        sampler = GpuSampler(lambda: open_backend(fake_nvml, None, SimScenario), gpm_enabled=False, xid_events=False)
    except ValueError as exc:
        raise GpuReadError(str(exc)) from None
    try:
        state = sampler.open()
        if state.get("state") != "ok":
            message = str(state.get("message", "NVML unavailable")).split("; next try")[0]
            raise GpuReadError(message.split(": GPU metrics are off")[0])  # the agent's words, not this command's
        static = sampler.static()
    finally:
        sampler.close()
    if not static:
        raise GpuReadError("NVML reports no GPUs on this node")
    return static, str(state.get("driver_version") or "")


def read_cluster(port: int, timeout_s: float = RAY_TIMEOUT_S) -> ClusterFacts:
    """Ray's view of the cluster from the head's state API on 127.0.0.1:`port`; the error in words otherwise."""
    from lynxtop.agent.cluster.view import NODES_PATH, ClusterViewError, parse_nodes

    url = f"http://127.0.0.1:{port}{NODES_PATH}"
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback: never through a proxy
    try:
        with opener.open(url, timeout=timeout_s) as resp:
            body = json.loads(resp.read())
        return ClusterFacts(nodes=tuple(parse_nodes(body)))
    except urllib.error.HTTPError as exc:
        return ClusterFacts(error=f"Ray's state API at {url} answered HTTP {exc.code}")
    except (OSError, http.client.HTTPException) as exc:  # refused, timed out, cut off
        why = getattr(exc, "reason", None) or exc or "timeout"
        return ClusterFacts(error=f"Ray's state API at {url} did not answer ({why})")
    except ValueError:
        return ClusterFacts(error=f"Ray's state API at {url} answered something that is not JSON")
    except ClusterViewError as exc:
        return ClusterFacts(error=str(exc))


def running_dashboard_port(cfg: Config) -> int | None:
    """The state API port of the Ray this node's agent started, from its record (ray.json in the state directory,
    read as the agent reads it: never through a symlink nor blocked by a FIFO), when it differs from the config's:
    a Ray adopted across a `[ray] dashboard_port` edit keeps its own (agent/cluster/raynode.py). None: no record,
    an unreadable one (not this user's to read), or the config's port."""
    from lynxtop.agent.cluster.raynode import argv_settings
    from lynxtop.agent.serving.launcher import read_record

    record, _ = read_record(cfg.agent.database.parent / "ray.json")  # RayNode.record_path's name
    value = argv_settings(record.argv).get("ray.dashboard_port", "") if record is not None else ""
    port = int(value) if value.isdigit() and 0 < int(value) < 65536 else None
    return port if port != cfg.ray.dashboard_port else None


def read_running_cluster(cfg: Config) -> tuple[int, ClusterFacts]:
    """(the port read, Ray's view): the running Ray's port first (`running_dashboard_port`), then, where nothing
    answers there (a record left by a Ray that is gone), the config's."""
    running = running_dashboard_port(cfg)
    if running is not None:
        cluster = read_cluster(running)
        if cluster.error is None:
            return running, cluster
    return cfg.ray.dashboard_port, read_cluster(cfg.ray.dashboard_port)


def _profiles(cfg: Config, name: str | None) -> list:
    if name is None:
        return list(cfg.profiles)
    prof = cfg.profile(name)
    if prof is None:
        known = ", ".join(p.name for p in cfg.profiles) or "none configured"
        raise LookupError(f"unknown profile {name!r} (known: {known})")
    return [prof]


# Exit 2 is this command's verdict "blocking problems" (a CI gate acts on it): not being able to check at all (a
# typo in --profile, a config error, NVML unreadable) is another code, so the gate can tell a typo from a misfit.
EXIT_COULD_NOT_CHECK = 7


def run(args: Namespace) -> int:
    cfg = load_or_exit(args, host=False)
    if cfg is None:
        return EXIT_COULD_NOT_CHECK
    try:
        profiles = _profiles(cfg, getattr(args, "profile", None))
        if not profiles:
            raise LookupError("the config has no [[profile]] to check")
        static, driver = read_gpus(cfg.agent.fake_nvml)
    except (LookupError, GpuReadError) as exc:
        print(terminal_safe(f"lynxtop check: {exc}"), file=sys.stderr)
        return EXIT_COULD_NOT_CHECK
    node = facts_from_info(static, driver)
    role = cfg.agent.role
    state_port = cfg.ray.dashboard_port
    if role == "head" and any(p.uses_ray for p in profiles):  # the agent may be down: ask Ray itself
        state_port, cluster = read_running_cluster(cfg)
        node = dataclasses.replace(node, cluster=cluster)
    reports = [check_profile(p, dataclasses.replace(node, ray_installed=ray_installed(p.executable)),
                             find_model(p.model, cfg.models)) for p in profiles]
    code = max(r.exit_code for r in reports)
    if args.json:
        print(json.dumps({"gpus": static, "driver_version": driver, "role": role,
                          "cluster": node.cluster.to_json() if node.cluster is not None else None,
                          "exit_code": code, "reports": [r.to_json() for r in reports]}, indent=2))
    else:
        _say(node_line(node, simulated=bool(cfg.agent.fake_nvml)))  # NVML's words
        if role != "single":
            _say(role_line(cfg, node.cluster, state_port))  # Ray's words
        for r in reports:
            print_report(r)
        _say(f"\nresult: exit {code} ({('all good', 'warnings', 'blocking problems')[code]})")
    return code


def _say(text: str) -> None:
    print(terminal_safe(text, lines=True))


def node_line(node: NodeFacts, simulated: bool) -> str:
    kinds: dict[str, int] = {}
    for g in node.gpus:
        cc = f"SM{g.cc[0]}{g.cc[1]}" if g.cc else "SM?"
        mem = gib(g.mem_total_bytes) if g.mem_total_bytes else "memory ?"
        key = f"{terminal_safe(g.name)} ({cc}, {mem})"
        kinds[key] = kinds.get(key, 0) + 1
    gpus = ", ".join(f"{n} x {k}" for k, n in kinds.items())
    return f"node: {gpus}; driver {node.driver_version or '?'}" + (" (simulated node)" if simulated else "")


def role_line(cfg: Config, cluster: ClusterFacts | None, state_port: int | None = None) -> str:
    """The node's part in a Ray cluster and, on a head, the cluster as Ray reports it; `state_port`: where Ray's
    view was read (the running Ray's, when not the config's)."""
    r = cfg.ray
    if cfg.agent.role == "worker":
        return f"role: Ray worker of {r.head_address} (serves no vLLM: its profiles run on the head)"
    port = state_port or r.dashboard_port
    api = f"127.0.0.1:{port}" + (f", the running Ray's; the config says {r.dashboard_port}: it applies when Ray "
                                 "is restarted" if port != r.dashboard_port else "")
    line = f"role: Ray head (GCS {r.node_ip_address or '127.0.0.1'}:{r.port}, state API {api})"
    if cluster is None:
        return line
    if cluster.error is not None:
        return f"{line}\ncluster: unknown: {terminal_safe(cluster.error)}"
    nodes = ", ".join(terminal_safe(describe_node(n)) for n in cluster.alive)  # Ray's words, one line each
    line += f"\ncluster: Ray reports {cluster.gpus_alive:g} GPUs on {len(cluster.alive)} node(s): {nodes or 'none'}"
    for n in cluster.lost:
        line += f"\n  lost: {terminal_safe(describe_node(n))}: {terminal_safe(n.state_message or 'dead')}"
    return line


def print_report(report: Report) -> None:
    _say(f"\nprofile {report.profile} ({report.model}):")
    for v in report.verdicts:
        _say(f"  {_MARK[v.level]:<9}{v.check:<11} {terminal_safe(v.reason)}")  # it may quote Ray or NVML
        if v.fix and v.level != Level.OK:
            _say(f"  {'':<21}fix: {terminal_safe(v.fix)}")
