"""`lynxtop status|start|stop|restart|switch`: thin clients of the control API, made for humans and scripts.

Plain http.client over AF_UNIX keeps these commands free of asyncio and fast to start. Exit codes (cli/parser.py):
0 ok, 1 refused or failed, 2 usage/config, 3 agent unreachable, 4 busy. Anything that interrupts serving asks
for confirmation on a terminal and demands --yes elsewhere, because a 284B model takes many minutes to reload.
"""

from __future__ import annotations

import http.client
import json
import socket
import sys
import time
from argparse import Namespace
from datetime import datetime
from typing import Any

from lynxtop.config_cli import load_or_exit

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_UNREACHABLE, EXIT_BUSY = 0, 1, 2, 3, 4
POLL_S = 1.0
NOT_RUNNING = ("stopped", "crash-loop", "backoff")


class Unreachable(Exception):
    """The agent cannot be reached; the message says where and the likely reason."""


class _UnixHTTPConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float):
        super().__init__("localhost", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(self._path)
        except OSError:
            sock.close()
            raise
        self.sock = sock


class AgentClient:
    """One request per connection: the agent may restart between two polls of --wait."""

    def __init__(self, path: str, timeout: float = 15.0):
        self.path = path
        self.timeout = timeout

    def request(self, method: str, url: str, body: dict[str, Any] | None = None) -> tuple[int, dict[str, Any]]:
        conn = _UnixHTTPConnection(self.path, self.timeout)
        try:
            payload = json.dumps(body).encode() if body is not None else None
            headers = {"Content-Type": "application/json"} if payload is not None else {}
            conn.request(method, url, body=payload, headers=headers)
            resp = conn.getresponse()
            raw = resp.read()
        except FileNotFoundError:
            raise Unreachable(f"no agent socket at {self.path} (is lynxtop-agent running? "
                              "systemctl status lynxtop-agent)") from None
        except ConnectionRefusedError:
            raise Unreachable(f"nothing answers on {self.path} (the agent is not running or is restarting)") from None
        except PermissionError:
            raise Unreachable(f"permission denied on {self.path}: join the agent's group "
                              "(sudo usermod -aG lynxtop $USER, then log in again) or use sudo") from None
        except TimeoutError:
            raise Unreachable(f"the agent at {self.path} did not answer within {self.timeout:g} s") from None
        except (OSError, http.client.HTTPException) as exc:
            raise Unreachable(f"cannot talk to the agent at {self.path}: {exc}") from None
        finally:
            conn.close()
        try:
            data = json.loads(raw) if raw else {}
        except ValueError:
            raise Unreachable(f"the agent at {self.path} answered HTTP {resp.status} with something that is not "
                              "JSON (is this a lynxtop agent socket?)") from None
        return resp.status, data if isinstance(data, dict) else {"value": data}


# ---------------------------------------------------------------------------------------------- helpers


def _err(msg: str) -> None:
    print(f"lynxtop: {msg}", file=sys.stderr)


def _client(args: Namespace) -> AgentClient | None:
    path = getattr(args, "socket", None)
    if not path:
        cfg = load_or_exit(args)
        if cfg is None:
            return None
        path = str(cfg.agent.socket)
    return AgentClient(str(path))


def _exit_for(status: int, data: dict[str, Any]) -> int:
    code = data.get("error")
    if 200 <= status < 300:
        return EXIT_OK
    if status == 409 and code == "busy":
        return EXIT_BUSY
    if status in (400, 413) or (status == 404 and code == "unknown_profile"):
        return EXIT_USAGE
    return EXIT_FAILED


def _report_error(status: int, data: dict[str, Any]) -> None:
    message = data.get("message") or f"HTTP {status}"
    _err(f"{data.get('error', 'error')}: {message}")
    details = data.get("details") or {}
    for reason in details.get("reasons", []) if isinstance(details, dict) else []:
        print(f"  - {reason}", file=sys.stderr)
    if status == 403:
        _err("control needs root, the agent's user or the agent's group; `lynxtop status` works for everyone")


def fmt_duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    s = int(max(0, seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{(s % 3600) // 60:02d}m"
    return f"{s // 86400}d{(s % 86400) // 3600:02d}h"


def _fmt_bytes(n: float | None) -> str:
    if n is None:
        return "N/A"
    for unit, size in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(n) >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n:.0f} B"


def _na(v: Any, fmt: str = "{}", unit: str = "") -> str:
    return "N/A" if v is None else fmt.format(v) + unit


def _ms(v: float | None) -> str:
    if v is None:
        return "N/A"
    return f"{v / 1000:.2f} s" if v >= 1000 else f"{v:.0f} ms"


def _since(ms: int | None, now_ms: int | None) -> str:
    if not ms or not now_ms:
        return "-"
    return fmt_duration((now_ms - ms) / 1000)


def _clock(ms: int | None) -> str:
    if not ms:
        return "-"
    return datetime.fromtimestamp(ms / 1000).strftime("%Y-%m-%d %H:%M:%S")


# ---------------------------------------------------------------------------------------------- status


def format_status(st: dict[str, Any]) -> str:
    """The compact human summary of a status object; every missing value shows as N/A or '-'."""
    now = st.get("ts_ms")
    agent = st.get("agent") or {}
    srv = st.get("serving") or {}
    sla = st.get("sla") or {}
    sm = st.get("serving_metrics") or {}
    host = st.get("host") or {}
    lines: list[str] = []
    if agent.get("simulated"):
        lines.append("*** SIMULATED node: the GPUs and/or vLLM are simulated ***")
    state = srv.get("state", "unknown")
    head = f"serving  {state.upper()} for {_since(srv.get('state_since_ms'), now)}"
    if srv.get("reason"):
        head += f" ({srv['reason']})"
    lines.append(head)
    if state == "starting" and srv.get("phase"):
        lines.append(f"         phase: {srv['phase']} for {_since(srv.get('phase_since_ms'), now)}, "
                     f"starting for {_since(srv.get('started_ms'), now)}")
    if state == "backoff" and srv.get("next_retry_ms"):
        lines.append(f"         next retry in {fmt_duration((srv['next_retry_ms'] - (now or 0)) / 1000)}, "
                     f"{srv.get('failures_in_window', 0)} failures in the window")
    if state == "crash-loop":
        lines.append("         gave up after repeated failures: fix the cause, then `lynxtop start`")
    details = [f"profile {srv.get('profile') or '-'}", f"run {srv.get('run_id') or '-'}",
               f"pid {srv.get('pid') or '-'}"]
    if srv.get("model"):
        details.append(f"model {srv['model']}")
    if srv.get("vllm_version"):
        details.append(f"vLLM {srv['vllm_version']}")
    if srv.get("ready_ms") and state in ("ready", "degraded"):
        details.append(f"up {_since(srv['ready_ms'], now)}")
    if srv.get("adopted"):
        details.append("adopted")
    lines.append("         " + "  ".join(details))
    if sla:
        tp_label = "TPOT" if sla.get("tpot_source", "tpot") == "tpot" else "ITL"
        lines.append(
            f"SLA      {str(sla.get('state', 'unknown')).upper()}  p99 TTFT {_ms(sla.get('ttft_p99_ms'))} "
            f"(<= {_ms(sla.get('ttft_threshold_ms'))})  p99 {tp_label} {_ms(sla.get('tpot_p99_ms'))} "
            f"(<= {_ms(sla.get('tpot_threshold_ms'))})  window {_na(sla.get('window_s'), '{:g}', ' s')}")
    if sm.get("scrape_ok") is not None:  # None: nothing scraped (not serving)
        if sm.get("scrape_ok") == 0:
            lines.append(f"traffic  metrics unreadable ({sm.get('scrape_errors')} failed scrapes)")
        else:
            lines.append(
                f"traffic  {_na(sm.get('requests_per_s'), '{:.1f}', ' req/s')}  "
                f"gen {_na(sm.get('generation_tokens_per_s'), '{:.0f}', ' tok/s')}  "
                f"prompt {_na(sm.get('prompt_tokens_per_s'), '{:.0f}', ' tok/s')}  "
                f"running {_na(sm.get('requests_running'))}  waiting {_na(sm.get('requests_waiting'))}  "
                f"KV {_na(sm.get('kv_cache_usage_pct'), '{:.0f}', '%')}")
    for g in st.get("gpus") or []:
        lost = "  LOST" if g.get("lost") else ""
        lines.append(
            f"GPU {g.get('index', '?'):<4} {g.get('name') or '?'}  util {_na(g.get('util_gpu_pct'), '{}', '%')}  "
            f"mem {_fmt_bytes(g.get('mem_used_bytes'))}/{_fmt_bytes(g.get('mem_total_bytes'))}  "
            f"{_na(g.get('power_w'), '{}', ' W')}  {_na(g.get('temp_c'), '{}', ' C')}{lost}")
    if host:
        lines.append(
            f"host     cpu {_na(host.get('cpu_pct'), '{:.0f}', '%')}  load {_na(host.get('load1'), '{:.2f}')}  "
            f"mem {_fmt_bytes(host.get('mem_used_bytes'))}/{_fmt_bytes(host.get('mem_total_bytes'))}  "
            f"disk free {_fmt_bytes(host.get('disk_free_bytes'))}")
    nvml = agent.get("nvml") or {}
    store = agent.get("store") or {}
    health = "healthy" if agent.get("healthy", True) else "UNHEALTHY"
    agent_line = (f"agent    {agent.get('host', '?')}  pid {agent.get('pid', '?')}  up "
                  f"{fmt_duration(agent.get('uptime_s'))}  {health}  nvml {nvml.get('state', '?')}")
    if nvml.get("message"):
        agent_line += f" ({nvml['message']})"
    if store.get("last_error"):
        agent_line += f"  store error: {store['last_error']}"
    if agent.get("missed_ticks"):
        agent_line += f"  missed ticks {agent['missed_ticks']}"
    lines.append(agent_line)
    if store.get("wal_unlinked"):
        state = "recovered" if store.get("wal_recovered") else "NOT RECOVERED, history at risk"
        lines.append(f"store    WAL UNLINKED at {_clock(store.get('wal_unlinked_ms'))} ({state}): "
                     f"{store['wal_unlinked']}")
    action = agent.get("action")
    if action:
        lines.append(f"action   {action.get('action')} {action.get('profile') or ''} in progress since "
                     f"{_clock(action.get('since_ms'))} by {action.get('by', '?')}")
    return "\n".join(lines)


def status(args: Namespace) -> int:
    client = _client(args)
    if client is None:
        return EXIT_USAGE
    try:
        code, data = client.request("GET", "/v1/status")
    except Unreachable as exc:
        _err(str(exc))
        return EXIT_UNREACHABLE
    if code != 200:
        _report_error(code, data)
        return _exit_for(code, data)
    if getattr(args, "json", False):
        print(json.dumps(data, indent=2, sort_keys=True))
    else:
        print(format_status(data))
    return EXIT_OK


# ---------------------------------------------------------------------------------------------- actions


def _confirm(action: str, target: str | None, st: dict[str, Any], assume_yes: bool) -> int | None:
    """None to go ahead, else the exit code (aborted, or --yes missing without a terminal)."""
    srv = st.get("serving") or {}
    state = srv.get("state", "unknown")
    if action == "stop" and state in NOT_RUNNING:
        return None  # nothing is serving: nothing to lose
    if assume_yes:
        return None
    what = {"stop": "This stops serving; the model must load again to serve (minutes).",
            "restart": "This restarts serving; the model reloads (minutes).",
            "switch": "This restarts serving; the model reloads (minutes)."}[action]
    now = st.get("ts_ms")
    current = (f"Now: {state} for {_since(srv.get('state_since_ms'), now)}, profile "
               f"{srv.get('profile') or '-'}, run {srv.get('run_id') or '-'}.")
    if not sys.stdin.isatty():
        _err(f"{action} interrupts serving and needs confirmation: pass --yes when not on a terminal")
        return EXIT_USAGE
    expected = target if action == "switch" else "y"
    prompt = f"Type the profile name ({target})" if action == "switch" else "Type y"
    print(f"{current}\n{what}")
    try:
        answer = input(f"{prompt} to confirm: ").strip()
    except EOFError:
        answer = ""
    if answer != expected and not (expected == "y" and answer.lower() in ("y", "yes")):
        _err("not confirmed; nothing changed")
        return EXIT_FAILED
    return None


def _act(args: Namespace, action: str, profile: str | None = None) -> int:
    client = _client(args)
    if client is None:
        return EXIT_USAGE
    try:
        code, before = client.request("GET", "/v1/status")
        if code != 200:
            _report_error(code, before)
            return _exit_for(code, before)
        if action in ("stop", "restart", "switch"):
            refused = _confirm(action, profile, before, getattr(args, "yes", False))
            if refused is not None:
                return refused
        body = {"profile": profile} if profile else {}
        code, data = client.request("POST", f"/v1/{action}", body)
    except Unreachable as exc:
        _err(str(exc))
        return EXIT_UNREACHABLE
    if code != 202:
        _report_error(code, data)
        return _exit_for(code, data)
    print(data.get("message") or f"{action} accepted")
    if not getattr(args, "wait", False):
        return EXIT_OK
    return wait_for(client, action, before)


def wait_for(client: AgentClient, action: str, before: dict[str, Any], poll_s: float | None = None) -> int:
    """Poll status until the action is done: ready (a new run for restart/switch), stopped, or failed."""
    poll = POLL_S if poll_s is None else poll_s
    srv0 = before.get("serving") or {}
    run0 = srv0.get("run_id")
    was_running = srv0.get("state") not in NOT_RUNNING
    tty = sys.stdout.isatty()
    last_line = ""
    seen_progress = False
    unreachable_since: float | None = None
    while True:
        time.sleep(poll)
        try:
            code, st = client.request("GET", "/v1/status")
            unreachable_since = None
        except Unreachable as exc:
            unreachable_since = unreachable_since or time.monotonic()
            if time.monotonic() - unreachable_since > 60:
                _err(f"gave up waiting: {exc}")
                return EXIT_UNREACHABLE
            continue
        if code != 200:
            _report_error(code, st)
            return EXIT_FAILED
        srv = st.get("serving") or {}
        state = srv.get("state")
        in_action = bool((st.get("agent") or {}).get("action"))
        new_run = srv.get("run_id") != run0 or not was_running
        line = f"{state}"
        if srv.get("phase") and state == "starting":
            line += f" ({srv['phase']})"
        line += f"  {_since(srv.get('state_since_ms'), st.get('ts_ms'))}  profile {srv.get('profile') or '-'}"
        if line != last_line or tty:
            if tty:
                print(f"\r\033[K{line}", end="", flush=True)
            elif line.split("  ")[0] != last_line.split("  ")[0]:
                print(line, flush=True)
            last_line = line
        if state in ("starting", "stopping"):
            seen_progress = True
        done = _outcome(action, state, in_action, new_run, seen_progress)
        if done is None:
            continue
        if tty:
            print()
        ok, message = done
        if ok:
            print(message)
            return EXIT_OK
        reason = srv.get("reason") or ""
        _err(message + (f": {reason}" if reason else "") + " (see `lynxtop status` and the events)")
        return EXIT_FAILED


def _outcome(action: str, state: str | None, in_action: bool, new_run: bool,
             seen_progress: bool) -> tuple[bool, str] | None:
    if action == "stop":
        if state == "stopped" and not in_action:
            return True, "stopped"
        return None
    if in_action:
        return None
    if state == "ready" and new_run:
        return True, "ready"
    if state == "degraded" and new_run:
        return False, "serving came up degraded"
    if state in ("backoff", "crash-loop") and (seen_progress or new_run):
        return False, f"{action} failed (state {state})"
    if state == "stopped" and seen_progress:
        return False, f"{action} failed: serving stopped"
    return None


def start(args: Namespace) -> int:
    return _act(args, "start", getattr(args, "profile", None))


def stop(args: Namespace) -> int:
    return _act(args, "stop")


def restart(args: Namespace) -> int:
    return _act(args, "restart")


def switch(args: Namespace) -> int:
    return _act(args, "switch", args.profile)
