"""`lynxtop check [--profile NAME] [--json]`: the preflight verdicts of agent/check.py, before anything starts.

The command opens NVML itself (read-only, the static facts only) rather than asking the agent: NVML serves any
number of processes, and the check must work where the agent is down or not installed yet. A config's
`fake_nvml` node is read the same way, so the command can be tried without a GPU.
Exit codes: 0 all good, 1 warnings (or something could not be checked), 2 blocking problems or an error.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import sys
from argparse import Namespace
from typing import Any

from lynxtop.agent.check import Level, NodeFacts, Report, check_profile, facts_from_info, gib, ray_installed
from lynxtop.config_cli import load_or_exit
from lynxtop.contract.config import Config
from lynxtop.contract.models import find_model

_MARK = {Level.OK: "ok", Level.WARNING: "WARNING", Level.BLOCKING: "BLOCKING", Level.UNKNOWN: "unknown"}


class GpuReadError(Exception):
    pass


def read_gpus(fake_nvml: str) -> tuple[list[dict[str, Any]], str]:
    """(the sampler's static rows, driver version), or GpuReadError with the reason in words."""
    from lynxtop.agent.gpu.backend import open_backend
    from lynxtop.agent.gpu.sampler import GpuSampler
    from lynxtop.agent.sim.gpus import SimScenario  # the command composes: a "sim" node is the simulator's

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


def _profiles(cfg: Config, name: str | None) -> list:
    if name is None:
        return list(cfg.profiles)
    prof = cfg.profile(name)
    if prof is None:
        known = ", ".join(p.name for p in cfg.profiles) or "none configured"
        raise LookupError(f"unknown profile {name!r} (known: {known})")
    return [prof]


def run(args: Namespace) -> int:
    cfg = load_or_exit(args, host=False)
    if cfg is None:
        return 2
    try:
        profiles = _profiles(cfg, getattr(args, "profile", None))
        if not profiles:
            raise LookupError("the config has no [[profile]] to check")
        static, driver = read_gpus(cfg.agent.fake_nvml)
    except (LookupError, GpuReadError) as exc:
        print(f"lynxtop check: {exc}", file=sys.stderr)
        return 2
    node = facts_from_info(static, driver)
    reports = [check_profile(p, dataclasses.replace(node, ray_installed=ray_installed(p.executable)),
                             find_model(p.model, cfg.models)) for p in profiles]
    code = max(r.exit_code for r in reports)
    if args.json:
        print(json.dumps({"gpus": static, "driver_version": driver, "exit_code": code,
                          "reports": [r.to_json() for r in reports]}, indent=2))
    else:
        print(node_line(node, simulated=bool(cfg.agent.fake_nvml)))
        for r in reports:
            print_report(r)
        print(f"\nresult: exit {code} ({('all good', 'warnings', 'blocking problems')[code]})")
    return code


def node_line(node: NodeFacts, simulated: bool) -> str:
    kinds: dict[str, int] = {}
    for g in node.gpus:
        cc = f"SM{g.cc[0]}{g.cc[1]}" if g.cc else "SM?"
        mem = gib(g.mem_total_bytes) if g.mem_total_bytes else "memory ?"
        key = f"{g.name} ({cc}, {mem})"
        kinds[key] = kinds.get(key, 0) + 1
    gpus = ", ".join(f"{n} x {k}" for k, n in kinds.items())
    return f"node: {gpus}; driver {node.driver_version or '?'}" + (" (simulated node)" if simulated else "")


def print_report(report: Report) -> None:
    print(f"\nprofile {report.profile} ({report.model}):")
    for v in report.verdicts:
        print(f"  {_MARK[v.level]:<9}{v.check:<12}{v.reason}")
        if v.fix and v.level != Level.OK:
            print(f"  {'':<21}fix: {v.fix}")
