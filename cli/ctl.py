"""`lynxtop status|start|stop|restart|switch|ray`: thin clients of the control API, made for humans and scripts.

The blocking face of the one API client (lynxtop.contract.client) keeps these commands free of asyncio and fast to
start. Exit codes (cli/parser.py): 0 ok, 1 refused or failed, 2 usage/config, 3 agent unreachable, 4 busy,
5 the run changed since it was shown. Anything that interrupts serving asks for confirmation on a terminal (for at
most CONFIRM_TIMEOUT_S) and demands --yes elsewhere, because a 284B model takes many minutes to reload; every
serving action names the run it read (`expect_run`), so a confirmation never acts on a run it did not show. On a
Ray worker (agent.role = "worker") there is no vLLM: the agent turns start and stop into its Ray's, and so does
--wait here; `stop --cluster` on a head stops the whole cluster.
"""

from __future__ import annotations

import io
import select
import shutil
import sys
import time
from argparse import Namespace
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lynxtop.cli.config_cli import load_or_exit
from lynxtop.contract.client import (
    ALREADY_DONE,
    ANY_RUN,
    GUARDED_ACTIONS,
    AgentClient,
    AgentRefused,
    AgentUnreachable,
    AnyRun,
    parse_status,
)
from lynxtop.contract.events import EventKind
from lynxtop.contract.format import fmt_bytes, fmt_datetime, fmt_duration, fmt_ms, fmt_pct, fmt_when
from lynxtop.contract.jsonsafe import strict_dumps
from lynxtop.contract.quantile import fmt_quantile, fmt_series
from lynxtop.contract.status import (
    FEW_OBSERVATIONS,
    LOG_SILENT_SHOW_S,
    SLA_COUNT_UNKNOWN,
    AgentStatus,
    ClusterStatus,
    GpuStatus,
    HostStatus,
    RayState,
    Role,
    ServingMetrics,
    ServingState,
    ServingStatus,
    SlaStatus,
    Status,
    StoreStatus,
    gpus_text,
    held_text,
    load_phase,
    log_silent_s,
    not_served_text,
    taker_text,
)
from lynxtop.contract.terminal import terminal_safe, terminal_safe_json

if TYPE_CHECKING:
    from collections.abc import Mapping

    from lynxtop.contract.records import ActionAnswer

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_UNREACHABLE, EXIT_BUSY, EXIT_RUN_CHANGED = 0, 1, 2, 3, 4, 5
EXIT_NOT_SERVING = 6  # `status --check`: the agent answered, but serving is not READY or the agent not healthy
# A prompt left open (a forgotten terminal) must not act hours later on a node nobody looked at since.
CONFIRM_TIMEOUT_S = 120.0
POLL_S = 1.0
UNREACHABLE_GIVE_UP_S = 60.0
# nothing serves (a head WAITING for its cluster has loaded nothing yet): stopping it loses nothing
NOT_RUNNING = (ServingState.STOPPED, ServingState.CRASH_LOOP, ServingState.BACKOFF, ServingState.WAITING)
RAY_UP = (RayState.STARTING, RayState.RUNNING, RayState.STOPPING)
INDENT = " " * 9


# ---------------------------------------------------------------------------------------------- helpers


def _finish(progress: Any, done: tuple[bool, str], reason: str) -> int:
    """A waited-for action's end: its message, or the failure with the agent's reason."""
    progress.done()
    ok, message = done
    if ok:
        print(terminal_safe(message, lines=True))
        return EXIT_OK
    _err(message + (f": {terminal_safe(reason)}" if reason else "") + " (see `lynxtop status` and the events)")
    return EXIT_FAILED


def _err(msg: str) -> None:
    print(terminal_safe(f"lynxtop: {msg}", lines=True), file=sys.stderr)


def _client(args: Namespace) -> AgentClient | None:
    path = getattr(args, "socket", None)
    if not path:
        cfg = load_or_exit(args)
        if cfg is None:
            return None
        path = str(cfg.agent.socket)
    return AgentClient(str(path))


def _failed(exc: AgentUnreachable | AgentRefused) -> int:
    """Say why a call failed; the exit code for it."""
    if isinstance(exc, AgentUnreachable):
        _err(str(exc))
        return EXIT_UNREACHABLE
    _report_error(exc)
    return _exit_for(exc)


def _exit_for(exc: AgentRefused) -> int:
    if exc.status == 409 and exc.code in ALREADY_DONE:  # as `systemctl stop` of a stopped unit: the runbook goes on
        return EXIT_OK
    if exc.status == 409 and exc.code == "busy":
        return EXIT_BUSY
    if exc.status == 409 and exc.code == "run_changed":
        return EXIT_RUN_CHANGED
    if exc.status in (400, 413) or (exc.status == 404 and exc.code == "unknown_profile"):
        return EXIT_USAGE
    return EXIT_FAILED


def _report_error(exc: AgentRefused) -> None:
    if exc.status == 409 and exc.code in ALREADY_DONE:
        _err(f"{ALREADY_DONE[exc.code]}: nothing to do ({exc.message})")
        return
    _err(f"{exc.code}: {exc.message}")
    reasons = exc.details.get("reasons") or []
    for reason in reasons if isinstance(reasons, list) else []:
        print(f"  - {terminal_safe(reason)}", file=sys.stderr)
    if exc.status == 403:
        _err("control needs root, the agent's user or the agent's group; `lynxtop status` works for everyone")


def _na(v: Any, fmt: str = "{}", unit: str = "") -> str:
    return "N/A" if v is None else fmt.format(v) + unit


def _bytes(n: float | None) -> str:
    return fmt_bytes(n, decimals=1, largest="TiB")


def _ms(v: float | None) -> str:
    return fmt_ms(v, decimals=0)


def _since(ms: int | None, now_ms: int | None) -> str:
    if not ms or not now_ms:
        return "-"
    return fmt_duration((now_ms - ms) / 1000, na="-")


def _clock(ms: int | None) -> str:
    """A full local time with its UTC offset: what `--since` reads back exactly (contract/format.py)."""
    return fmt_datetime(ms, seconds=True, zone=True) if ms else "-"


# ---------------------------------------------------------------------------------------------- status


def format_status(st: Status, rate: tuple[float, int] | None = None,
                  token_rates: Mapping[str, tuple[float, int]] | None = None, usual_ms: int | None = None) -> str:
    """The compact human summary of a status; every missing value shows as N/A or '-'.

    `rate` is the finished-request rate averaged over the last minutes of this run and the ms it covers (from the
    store): the status's own figure is per tick, and reads 0.0 for minutes while long requests run.
    `token_rates`: the same means of `prompt_tokens_per_s` and `generation_tokens_per_s` (a tick's prompt tokens
    come in bursts: 0 in most ticks, thousands in the next).
    `usual_ms`: how long this profile's loads usually take (`usual_load_ms`), shown while one runs.
    """
    lines: list[str] = []
    if st.agent.simulated or st.serving.simulated:
        lines.append("*** SIMULATED node: the GPUs and/or vLLM are simulated ***")
    if _idle_worker(st):
        lines.append(f"serving  none on this node: a Ray worker (vLLM runs on the head, {st.cluster.address or '?'})")
    else:
        lines += _serving_lines(st.serving, st.ts_ms, usual_ms)
    if st.serving.held is not None:  # it serves on the GPUs while the state above reads stopped
        lines.append(f"held     {held_text(st.serving.held)} left by the previous agent, serving unsupervised: "
                     "`lynxtop stop` ends it")
    if st.serving.log_problem:  # the run's output is discarded or will be: say why (a full disk, a bad directory)
        lines.append(f"run log  NOT KEPT - {st.serving.log_problem}")
    lines += cluster_lines(st.cluster, st.ts_ms)
    lines.append(_sla_line(st.sla))
    lines += _traffic_lines(st.serving_metrics, rate, token_rates)
    lines += _latency_lines(st.serving_metrics, st.serving)
    if st.serving.not_served:  # an empty column of these is this vLLM's, not "no traffic"
        its = "its columns stay" if len(st.serving.not_served) == 1 else "their columns stay"
        lines.append(f"{INDENT}{not_served_text(st.serving)} ({its} empty)")
    lines += [_gpu_line(g) for g in st.gpus]
    lines.append(_host_line(st.host))
    lines += _agent_lines(st.agent)
    return "\n".join(lines)


def usual_load_ms_at(path: str | Path | None, srv: ServingStatus) -> int | None:
    """`usual_load_ms` of the loading run's profile from the history database at `path`; None when it cannot be
    read (a missing or damaged database costs the line, never the status)."""
    if not path or not srv.profile or not Path(path).exists():
        return None
    try:
        from lynxtop.store.reader import StoreReader, usual_load_ms

        reader = StoreReader(Path(path))
        try:
            return usual_load_ms(reader, srv.profile, exclude_run=srv.run_id)
        finally:
            reader.close()
    except Exception:  # noqa: BLE001 - any fault of the database costs this line only
        return None


def _serving_lines(srv: ServingStatus, now: int | None, usual_ms: int | None = None) -> list[str]:
    state = srv.state
    head = f"serving  {state.upper()} for {_since(srv.state_since_ms, now)}"
    lines = [head + (f" ({srv.reason})" if srv.reason else "")]
    if state == ServingState.STARTING and srv.phase:
        silent = log_silent_s(srv, now)
        quiet = ""
        if silent is not None and silent >= LOG_SILENT_SHOW_S:
            quiet = (f"; LOG SILENT {fmt_duration(silent, na='-')}: no output since {_clock(srv.log_grew_ms)} "
                     "(a hung read or a stuck worker? it is not stopped for this)")
        elif silent is not None:
            quiet = f", last log output {fmt_duration(silent, na='-')} ago"
        lines.append(f"{INDENT}phase: {load_phase(srv)} for {_since(srv.phase_since_ms, now)}, "
                     f"starting for {_since(srv.started_ms, now)}{quiet}")
        if usual_ms is not None:
            lines.append(f"{INDENT}usually ready in ~{fmt_duration(usual_ms / 1000, na='-')} (profile {srv.profile}'s "
                         "recent loads: the median of its last 3 that became ready)")
    if state == ServingState.STARTING and srv.ready_timeout_s is not None and srv.ready_deadline_ms and now:
        # the agent's deadline (an adopted load's counts from its process's start), so the time left is its own
        left_s = (srv.ready_deadline_ms - now) / 1000
        lines.append(f"{INDENT}loading for {fmt_duration(srv.ready_timeout_s - left_s, na='-')} of at most "
                     f"{fmt_duration(srv.ready_timeout_s, na='-')} (readiness_timeout_s {srv.ready_timeout_s:g}): "
                     f"stopped in {fmt_duration(left_s, na='-')} unless ready")
    if state == ServingState.BACKOFF and srv.next_retry_ms:
        lines.append(f"{INDENT}next retry in {fmt_duration((srv.next_retry_ms - (now or 0)) / 1000, na='-')}, "
                     f"{srv.failures_in_window} failures in the window")
    if state == ServingState.CRASH_LOOP:
        lines.append(f"{INDENT}gave up after repeated failures: fix the cause, then `lynxtop start`")
    details = [_run_text(srv, now), f"pid {srv.pid or '-'}"]
    if srv.model:
        details.append(f"model {srv.model}")
    if srv.vllm_version:
        details.append(f"vLLM {srv.vllm_version}")
    if srv.ready_ms and state.serving:
        details.append(f"up {_since(srv.ready_ms, now)}")
    if srv.adopted:
        details.append("adopted")
    lines.append(INDENT + "  ".join(details))
    return lines


def _run_text(srv: ServingStatus, now: int | None = None) -> str:
    """`run 12 (started 14:02:11, profile v4-tp8-h200)`: a run is one launch of vLLM; its number alone says
    nothing. Started on another day than `now` (the node's; else ours): `started 2026-12-01 14:02`, so a run of
    three days ago does not read as started today."""
    if srv.run_id is None:
        return f"profile {srv.profile or '-'}  run -"
    when = fmt_when(srv.started_ms, now or int(time.time() * 1000), False)
    started = f"started {when}, " if srv.started_ms else ""
    return f"run {srv.run_id} ({started}profile {srv.profile or '-'})"


def _idle_worker(st: Status) -> bool:
    return st.cluster.role == Role.WORKER and st.serving.state == ServingState.STOPPED and not st.serving.profile


def cluster_lines(cl: ClusterStatus, now: int | None) -> list[str]:
    """This node's Ray and, on a head, the cluster as Ray reports it; nothing on a single node."""
    if cl.role == Role.SINGLE:
        return []
    state = cl.ray_state
    where = f"head {cl.address}" if cl.role == Role.HEAD else f"worker of {cl.address or '?'}"
    line = f"ray      {state.upper()} {where}" + (f" pid {cl.ray_pid}" if cl.ray_pid else "")
    line += f" for {_since(cl.ray_since_ms, now)}"
    lines = [line + (f" ({cl.ray_reason})" if cl.ray_reason and state != RayState.RUNNING else "")]
    if state == RayState.BACKOFF and cl.ray_next_retry_ms:
        lines.append(f"{INDENT}next retry in {fmt_duration((cl.ray_next_retry_ms - (now or 0)) / 1000, na='-')}, "
                     f"{cl.ray_failures} failures in the window")
    if state in (RayState.STOPPED, RayState.CRASH_LOOP):
        how = "`lynxtop ray start`" + (" (or `lynxtop start`)" if cl.role == Role.WORKER else "")
        lines.append(f"{INDENT}" + ("gave up after repeated failures: fix the cause, then " if
                                     state == RayState.CRASH_LOOP else "start it with ") + how)
    if cl.gpus_taken:  # a worker: the processes that will make the head's vLLM ranks here run out of memory
        lines.append(_held_line(cl, now))
    if cl.role == Role.HEAD:
        lines += _cluster_view_lines(cl)
    return lines


def _held_line(cl: ClusterStatus, now: int | None) -> str:
    """`! GPUs HELD by 1 process(es) not Ray's for 5s: pid 4242 (python) GPU 3 using 20.0 GiB; ...` (docs/cluster.md,
    "A worker's GPUs taken"): the names as the agent escaped them; `status` prints the line terminal-safe."""
    holders = ", ".join(taker_text(t) + (f" using {_bytes(t.used_mem_bytes)}" if t.used_mem_bytes is not None
                                         else "") for t in cl.gpus_taken)
    since = f" for {_since(cl.gpus_taken_since_ms, now)}" if cl.gpus_taken_since_ms else ""
    return (f"{INDENT}! GPUs HELD by {len(cl.gpus_taken)} process(es) not Ray's{since}: {holders}; vLLM's ranks "
            "placed here run out of GPU memory until they exit")


def _cluster_view_lines(cl: ClusterStatus) -> list[str]:
    alive, lost = cl.alive_nodes, cl.lost_nodes
    needs = ""
    if cl.gpus_needed is not None:
        short = cl.node_set.gpus_missing(cl.gpus_needed)
        needs = f" (needs {cl.gpus_needed}" + (f": {short:g} missing" if short and cl.nodes else "") + ")"
    if not cl.nodes:
        return [f"cluster  unknown: {cl.view_error or 'not read yet'}" + needs]
    count = f"{len(alive)} of {len(alive) + len(lost)} nodes alive" if lost else f"{len(alive)} nodes"
    lines = [f"cluster  {count}, {gpus_text(cl.gpus_alive)}{needs}"
             + (f"  (last view; now unreadable: {cl.view_error})" if cl.view_error else "")]
    for n in (*alive, *lost):
        label = n.ip or n.name or n.node_id[:12]
        if n.name and n.name != label:
            label += f" ({n.name})"
        line = f"{INDENT}{label:<15}  {gpus_text(n.gpus):>7}  {'head  ' if n.head else 'worker'}  "
        if n.alive:
            line += "ALIVE"
        else:
            line += "DEAD" + (f" since {_clock(n.end_ms)}" if n.end_ms else "")
            line += f" ({n.state_message})" if n.state_message else ""
        lines.append(line)
    return lines


def _sla_line(sla: SlaStatus) -> str:
    """The SLA's state and p99s; a p99 in its histogram's lowest bucket reads as the bound it is (`<10 ms`)."""
    tp_label = "ITL" if sla.tpot_source == "itl" else "TPOT"
    ttft = fmt_quantile(sla.ttft_p99_ms, sla.ttft_lowest_bucket_ms, decimals=0)
    tpot = fmt_quantile(sla.tpot_p99_ms, sla.tpot_lowest_bucket_ms, decimals=0)
    return (f"SLA      {sla.state.upper()}  p99 TTFT {ttft} (<= {_ms(sla.ttft_threshold_ms)})  "
            f"p99 {tp_label} {tpot} (<= {_ms(sla.tpot_threshold_ms)})  "
            f"window {_na(sla.window_s, '{:g}', ' s')}{_sla_judged(sla)}")


def _sla_judged(sla: SlaStatus) -> str:
    """What the SLA judged: how many requests, and which count (agent/metrics/sla.py): the window's finished
    requests, or, on a page without vLLM's finished-request counter, those given a first token (TTFT's count,
    requests in flight too); or that the count is unknown and a p99 past its limit was not judged."""
    n = sla.window_requests  # no breach opens on a handful of requests
    if n is None:
        return " (request count unknown: no breach judged)" if sla.reason == SLA_COUNT_UNKNOWN else ""
    few = f": no breach on fewer than {FEW_OBSERVATIONS}" if n < FEW_OBSERVATIONS else ""
    if sla.window_requests_source == "ttft":
        return (f" ({n} request{'' if n == 1 else 's'} given a first token judged"
                + (few or ": the page has no finished-request counter") + ")")
    return f" ({n} finished request{'' if n == 1 else 's'} judged{few})"  # an older agent's count is this one


def _latency_lines(sm: ServingMetrics, srv: ServingStatus) -> list[str]:
    """`latency  TTFT p50 625 ms p99 748 ms (1 req in 60 s: too few for a p99)  TPOT ... (1 req)  E2E ...`: the
    percentiles the SLA and an operator read first, each with the observations its window holds (`window_counts`;
    none from an older agent), so a p99 of one request reads as one. ITL stands in for a TPOT not served, as in
    the SLA; its count is of inter-token intervals."""
    if sm.metric("scrape_ok") != 1:
        return []
    tp = "itl" if sm.metric("tpot_p99_ms") is None and sm.metric("itl_p99_ms") is not None else "tpot"
    parts = []
    for series in ("ttft", tp, "e2e"):
        text = (f"{series.upper()} p50 {fmt_series(sm.metric, series, 'p50')} "
                f"p99 {fmt_series(sm.metric, series, 'p99')}")
        n = srv.window_count(series)
        if n is not None:
            where = f" in {srv.window_s:g} s" if not parts and srv.window_s is not None else ""
            few = ": too few for a p99" if n < FEW_OBSERVATIONS and sm.metric(f"{series}_p99_ms") is not None else ""
            text += f" ({n} {'intervals' if series == 'itl' else 'req'}{where}{few})"
        parts.append(text)
    ttft_n, done_n = srv.window_count("ttft"), srv.window_count("e2e")
    if ttft_n is not None and done_n is not None and ttft_n != done_n:
        # requests in flight: TTFT's count (observed at the first token) is not the finished requests'
        finished = "TPOT and E2E" if tp == "tpot" else "E2E"  # ITL's count is of inter-token intervals
        parts.append(f"(TTFT counts requests given a first token, {finished} finished requests)")
    return ["latency  " + "  ".join(parts)]


def _traffic_lines(sm: ServingMetrics, rate: tuple[float, int] | None = None,
                   token_rates: Mapping[str, tuple[float, int]] | None = None) -> list[str]:
    m = sm.metric
    if m("scrape_ok") is None:  # nothing scraped (not serving): no line of N/As
        return []
    if m("scrape_ok") == 0:
        return [f"traffic  metrics unreadable ({m('scrape_errors')} failed scrapes)"]
    if rate is not None:
        req = f"{rate[0]:.2f} req/s (finished, mean of {fmt_duration(rate[1] / 1000)})"
    else:  # no stored history to average: say the figure is one tick's, not a rate to trust
        req = _na(m('requests_per_s'), '{:.1f}', ' req/s finished in the last tick')
    token_rates = token_rates or {}
    gen, prompt = token_rates.get("generation_tokens_per_s"), token_rates.get("prompt_tokens_per_s")
    if gen is not None and prompt is not None:  # the same window as req/s: a tick's prompt tokens come in bursts
        tokens = (f"gen {gen[0]:.0f} tok/s  prompt {prompt[0]:.0f} tok/s "
                  f"(means of {fmt_duration(max(gen[1], prompt[1]) / 1000)})")
    else:
        tokens = (f"gen {_na(m('generation_tokens_per_s'), '{:.0f}', ' tok/s')}  "
                  f"prompt {_na(m('prompt_tokens_per_s'), '{:.0f}', ' tok/s')}" + (" (last tick)" if rate is None
                                                                                 else ""))
    return [f"traffic  {req}  {tokens}  "
            f"running {_na(m('requests_running'))}  waiting {_na(m('requests_waiting'))}  "
            f"KV {fmt_pct(m('kv_cache_usage_pct'), 1)}"]  # as the dashboard's Serving panel reads it


def _gpu_line(g: GpuStatus) -> str:
    m = g.metric
    index = "?" if g.index is None else g.index
    # SM activity (GPM) first: util is NVML's coarse "any kernel ran" figure, 99 % at 40 % of the SMs busy
    sm = f"SM {_na(m('sm_active_pct'), '{}', '%')}  " if g.gpm_supported is not False else ""
    return (f"GPU {index:<4} {g.name or '?'}  {sm}util {_na(m('util_gpu_pct'), '{}', '%')}  "
            f"mem {_bytes(m('mem_used_bytes'))}/{_bytes(m('mem_total_bytes'))}  "
            f"{_na(m('power_w'), '{}', ' W')}  {_na(m('temp_c'), '{}', ' C')}" + ("  LOST" if m("lost") else ""))


def _host_line(host: HostStatus) -> str:
    m = host.metric
    return (f"host     cpu {_na(m('cpu_pct'), '{:.0f}', '%')}  load {_na(m('load1'), '{:.2f}')}  "
            f"mem {_bytes(m('mem_used_bytes'))}/{_bytes(m('mem_total_bytes'))}  "
            f"disk free {_bytes(m('disk_free_bytes'))}")


def _agent_lines(agent: AgentStatus) -> list[str]:
    nvml, store = agent.nvml, agent.store
    line = (f"agent    {agent.host or '?'}  pid {'?' if agent.pid is None else agent.pid}  up "
            f"{fmt_duration(agent.uptime_s, na='-')}  {'healthy' if agent.healthy else 'UNHEALTHY'}  "
            f"nvml {nvml.state or '?'}")
    if nvml.message:
        line += f" ({nvml.message})"
    if store.last_error:
        line += f"  store error: {store.last_error}"
    if agent.missed_ticks:
        line += f"  missed ticks {agent.missed_ticks}"
    lines = [line]
    if store.not_writing:
        lines.append(history_line(store))
    if store.wal_unlinked:
        state = "recovered" if store.wal_recovered else "NOT RECOVERED, history at risk"
        lines.append(f"store    WAL UNLINKED at {_clock(store.wal_unlinked_ms)} ({state}): {store.wal_unlinked}")
    if store.db_swapped:
        lines.append(f"store    DATABASE FILE SWAPPED at {_clock(store.db_swapped_ms)}: {store.db_swapped}")
    act = agent.action
    if act:
        by = f" by {act.by}" if act.by else ""  # a remote node's TCP status does not say who asked
        lines.append(f"action   {act.action} {act.profile or ''} in progress since {_clock(act.since_ms)}{by}")
    return lines


def history_line(store: StoreStatus) -> str:
    """`history  NOT WRITING - disk full: /var/lib/lynxtop/lynxtop.db (0 B free), 1,234 ticks queued, 56 dropped`:
    that history is lost and why, which file system to free, and how much waits (the writer's queue is bounded:
    beyond it the oldest ticks are dropped)."""
    free = f" ({_bytes(store.free_bytes)} free)" if store.free_bytes is not None else ""
    counts = [f"{n:,} ticks {word}" if word == "queued" else f"{n:,} {word}"
              for n, word in ((store.queued, "queued"), (store.dropped, "dropped")) if n is not None]
    return f"history  NOT WRITING - {store.cause}: {store.path or '?'}{free}" + "".join(f", {c}" for c in counts)


RATE_COLUMNS = ("requests_per_s", "prompt_tokens_per_s", "generation_tokens_per_s")


def _stored_rate(args: Namespace, st: Status) -> tuple[float, int] | None:
    """The finished-request rate over the last 5 minutes of this run from the history database, as the dashboard
    shows it; None when there is no database to read (the line then says its figure is one tick's)."""
    return _stored_rates(args, st).get("requests_per_s")


def _database(args: Namespace) -> str | None:
    """The history database `lynxtop status` reads: `--database`, else the config's (never another socket's)."""
    path = getattr(args, "database", None)
    if not path and not getattr(args, "socket", None):
        cfg = load_or_exit(args)  # read once already, by _client: it loads
        path = cfg.agent.database if cfg is not None else None
    return str(path) if path else None


def _stored_rates(args: Namespace, st: Status) -> dict[str, tuple[float, int]]:
    """Each of RATE_COLUMNS averaged over the last 5 minutes from the history database, clamped to the current
    run's start (its READY, else its launch: a switch's downtime and the previous run are not this run's rate):
    column -> (mean, ms covered). Empty when there is no database to read."""
    from lynxtop.tui.window_stats import RATE_WINDOW_MS, window_mean

    path = _database(args)
    if not path or not Path(path).exists() or not st.ts_ms:
        return {}
    try:
        from lynxtop.store.reader import StoreReader

        reader = StoreReader(Path(path))
        try:
            _, rows = reader.series("serving", list(RATE_COLUMNS), st.ts_ms - RATE_WINDOW_MS, st.ts_ms + 1,
                                    resolution="raw")
        finally:
            reader.close()
    except Exception:  # a database we cannot read costs these figures, never the status
        return {}
    interval_ms = int(1000 * float(st.agent.sample_interval_s or 1.0))
    start = st.serving.ready_ms or st.serving.started_ms
    out: dict[str, tuple[float, int]] = {}
    for col in RATE_COLUMNS:
        mean, span = window_mean([(int(r["ts_ms"]), r.get(col)) for r in rows], st.ts_ms,
                                 interval_ms=interval_ms, start_ms=start)
        if mean is not None:
            out[col] = (mean, span)
    return out


def status(args: Namespace) -> int:
    client = _client(args)
    if client is None:
        return EXIT_USAGE
    try:
        data = client.status_json()
        if getattr(args, "json", False):
            text = strict_dumps(data, indent=2, sort_keys=True)  # the agent's is strict already; kept so
        else:
            st = parse_status(terminal_safe_json(data), client.socket_path)  # each field escaped
            rates = _stored_rates(args, st)
            # this profile's usual load time from the history: the config's database, else the one the agent names
            usual = (usual_load_ms_at(_database(args) or st.agent.store.path, st.serving)
                     if st.serving.state == ServingState.STARTING else None)
            text = format_status(st, rates.get("requests_per_s"), rates, usual)
    except (AgentUnreachable, AgentRefused) as exc:
        return _failed(exc)
    print(terminal_safe(text, lines=True))
    return _check(parse_status(data, client.socket_path)) if getattr(args, "check", False) else EXIT_OK


def _check(st: Status) -> int:
    """`status --check` (cron, a load balancer's health script): 0 only when serving is READY and the agent healthy;
    anything else (starting, degraded, backoff, crash-loop, stopped, an unhealthy agent) is EXIT_NOT_SERVING with
    one line on stderr saying which. A node stopped on purpose is not serving either: the check says so."""
    srv = st.serving
    problems = [] if srv.state == ServingState.READY else [f"serving {srv.state}" + (f" ({srv.reason})"
                                                                                      if srv.reason else "")]
    if not st.agent.healthy:
        problems.append("agent UNHEALTHY")
    if not problems:
        return EXIT_OK
    _err(f"status --check: not serving as expected: {'; '.join(problems)}")
    return EXIT_NOT_SERVING


# ---------------------------------------------------------------------------------------------- actions


def _interruption(action: str, st: Status, cluster: bool) -> tuple[str, str] | None:
    """(what the action interrupts, the node's state now) for the confirmation; None when nothing runs that it
    would stop (nothing to lose, nothing to ask)."""
    srv, cl = st.serving, st.cluster
    ray_now = f"Now: Ray {cl.ray_state} for {_since(cl.ray_since_ms, st.ts_ms)} on this {cl.role} ({cl.address})."
    if cluster:
        if srv.state in NOT_RUNNING and cl.ray_state not in RAY_UP:
            return None
        return ("This stops serving, then Ray on every worker, then on this head; each node's Ray must then be "
                "started again (`lynxtop ray start` here, `lynxtop start` on each worker) and the model load again "
                "(minutes).", ray_now)
    if cl.role == Role.WORKER and action in ("restart", "switch"):
        return None  # a worker serves nothing: nothing to confirm, and its agent's refusal names the head
    if cl.role == Role.WORKER and action in ("stop", "ray/stop"):
        if cl.ray_state not in RAY_UP:
            return None
        return (f"This stops Ray on this worker: a model the head ({cl.address}) serves across the cluster loses "
                "this node's GPUs and fails.", ray_now)
    if action == "stop" and srv.state in NOT_RUNNING and srv.held is not None:
        # stopped for the agent, but a server it holds serves on the GPUs: the stop ends it and its load
        return (f"This stops {held_text(srv.held)}, left serving by the previous agent and not supervised: its "
                "processes get SIGTERM, SIGKILL after the grace; the model must load again to serve (minutes).",
                f"Now: {srv.state} for {_since(srv.state_since_ms, st.ts_ms)} (nothing supervised), but "
                f"{held_text(srv.held)} serves unsupervised.")
    if action == "ray/stop" or (action == "stop" and srv.state in NOT_RUNNING):
        return None  # nothing is serving: nothing to lose (a head refuses ray/stop by itself)
    what = {"stop": "This stops serving; the model must load again to serve (minutes).",
            "restart": "This restarts serving; the model reloads (minutes).",
            "switch": "This restarts serving; the model reloads (minutes)."}[action]
    return what, (f"Now: {srv.state} for {_since(srv.state_since_ms, st.ts_ms)}, profile "
                  f"{srv.profile or '-'}, run {srv.run_id or '-'}.")


def _confirm(action: str, target: str | None, st: Status, assume_yes: bool, cluster: bool = False,
             client: AgentClient | None = None) -> int | None:
    """None to go ahead, else the exit code (aborted, no answer in time, the run changed while the prompt waited,
    or --yes missing without a terminal). `client`: to look at the run again once answered."""
    found = _interruption(action, st, cluster)
    if found is None or assume_yes:
        return None
    what, current = found
    if not sys.stdin.isatty():
        name = "stop --cluster" if cluster else action.replace("/", " ")
        _err(f"{name} interrupts {'Ray' if st.cluster.role == Role.WORKER or cluster else 'serving'} and needs "
             "confirmation: pass --yes when not on a terminal")
        return EXIT_USAGE
    expected = target if action == "switch" else "y"
    prompt = f"Type the profile name ({target})" if action == "switch" else "Type y"
    print(f"{terminal_safe(current)}\n{terminal_safe(what)}")  # both quote the agent's status (a profile name)
    answer = _ask(f"{prompt} to confirm (within {CONFIRM_TIMEOUT_S:g} s): ", CONFIRM_TIMEOUT_S)
    if answer is None:
        _err(f"no answer within {CONFIRM_TIMEOUT_S:g} s: nothing done")
        return EXIT_FAILED
    if answer != expected and not (expected == "y" and answer.lower() in ("y", "yes")):
        _err("not confirmed; nothing changed")
        return EXIT_FAILED
    return _still_shown(client, st) if client is not None and action in GUARDED_ACTIONS else None


def _ask(prompt: str, timeout_s: float) -> str | None:
    """The answer typed (stripped), "" at end of input, None when nothing came within `timeout_s`.

    On a real terminal the wait is bounded with select(); a stdin without a file descriptor (a test's stand-in)
    is read as it is, with input()."""
    try:
        fd = sys.stdin.fileno()
    except (OSError, ValueError, io.UnsupportedOperation):
        fd = None
    if fd is None:
        try:
            return input(prompt).strip()
        except EOFError:
            return ""
    print(prompt, end="", flush=True)
    ready, _, _ = select.select([fd], [], [], timeout_s)
    if not ready:
        print()
        return None
    return sys.stdin.readline().strip()


def _still_shown(client: AgentClient, shown: Status) -> int | None:
    """After the answer: the run the prompt showed is still the current one, else the refusal's exit code. The
    agent checks again when the request lands (expect_run), which closes the race left after this look."""
    now = client.status().serving
    was = shown.serving
    if now.run_id == was.run_id:
        return None
    _err(f"run_changed: {_run_changed(was, now)}")
    return EXIT_RUN_CHANGED


def _run_changed(was: ServingStatus, now: ServingStatus) -> str:
    saw = f"run {was.run_id} ({was.profile or '-'})" if was.run_id is not None else "no run"
    cur = f"run {now.run_id} ({now.profile or '-'}, {now.state})" if now.run_id is not None else f"no run ({now.state})"
    return f"the run changed since you looked: you saw {saw}, now {cur}; nothing done"


def _ray_goal(action: str, before: Status, cluster: bool) -> str | None:
    """What --wait waits for when the action acts on Ray: "running" or "stopped"; None for serving actions."""
    if cluster or action == "ray/stop" or (action == "stop" and before.cluster.role == Role.WORKER):
        return "stopped"
    if action == "ray/start" or (action == "start" and before.cluster.role == Role.WORKER):
        return "running"
    return None


def _act(args: Namespace, action: str, profile: str | None = None, cluster: bool = False,
         reason: str | None = None) -> int:
    if profile is not None and not profile.strip():
        # `lynxtop start "$PROFILE"` with PROFILE unset must not start the default profile (a load of minutes)
        _err(f"profile: the name given is empty ({profile!r}); name a profile (`lynxtop config check` lists "
             "them), or give none to use the default")
        return EXIT_USAGE
    client = _client(args)
    if client is None:
        return EXIT_USAGE
    extra = {"cluster": True} if cluster else {}
    if reason:
        extra["reason"] = reason
    try:
        before = client.status()
        if before.cluster.role == Role.WORKER and profile and action in ("start", "switch"):
            # said here: the agent's API would first answer that the worker's config has no such profile
            _err(f"role: this node is a Ray worker: it serves no vLLM (profile {profile!r} runs on the head, "
                 f"{before.cluster.address}); `lynxtop start` here, with no profile, starts its Ray")
            return EXIT_FAILED
        if action in ("stop", "restart", "switch", "ray/stop"):
            refused = _confirm(action, profile, before, getattr(args, "yes", False), cluster, client)
            if refused is not None:
                return refused
        sent_ms = int(time.time() * 1000)
        # the run this command read (and showed in its "Now:" line): the agent refuses if another is current
        data = _post(client, action, profile, before.serving.run_id if action in GUARDED_ACTIONS else ANY_RUN, extra)
    except AgentRefused as exc:
        if exc.code == "already_starting" and getattr(args, "wait", False):
            _report_error(exc)  # the load (or Ray's start) under way is the one asked for: --wait waits for it
            goal = _ray_goal(action, before, cluster)
            if goal is not None:  # Ray's start: its running, not serving (a worker serves nothing)
                return _interruptible(action, lambda: wait_for_ray(client, goal, cluster))
            return _interruptible(action, lambda: wait_for(client, action, before, same_run=True))
        return _failed(exc)
    except AgentUnreachable as exc:
        return _failed(exc)
    # accepted: from here a Ctrl-C (even before the wait begins) ends only this command, and says so
    return _interruptible(action, lambda: _accepted(args, client, data, before, action, profile, cluster, sent_ms))


def _accepted(args: Namespace, client: AgentClient, data: ActionAnswer, before: Status, action: str,
              profile: str | None, cluster: bool, sent_ms: int) -> int:
    """What follows an accepted action: what it acts on, then with `--wait` the wait for its outcome."""
    print(terminal_safe(data.message or f"{action} accepted", lines=True))
    print(terminal_safe(_acted_on(client, before, action, profile)))
    if not getattr(args, "wait", False):
        return EXIT_OK
    goal = _ray_goal(action, before, cluster)
    if goal is None:
        return wait_for(client, action, before)
    code = wait_for_ray(client, goal, cluster)
    if cluster and code == EXIT_OK:
        _print_cluster_stop(client, sent_ms)
    return code


def _interruptible(action: str, wait: Callable[[], int]) -> int:
    """`wait()`, with Ctrl-C ending only the waiting: the action was accepted and goes on at the agent (a load of
    many minutes), which the operator must be told, and how to cancel it; exit 130 as for any SIGINT."""
    try:
        return wait()
    except KeyboardInterrupt:
        print(file=sys.stderr)  # off the progress line a terminal shows
        undo = ("`lynxtop ray stop` (or `lynxtop stop` on a worker) stops it" if action.startswith("ray/")
                else "`lynxtop stop` cancels it" if action != "stop" else "serving stops anyway")
        _err(f"interrupted: stopped waiting only; the {action.replace('/', ' ')} continues on the agent "
             f"({undo}; `lynxtop status` shows how it goes)")
        return 130


def _post(client: AgentClient, action: str, profile: str | None, seen: int | None | AnyRun,
          extra: dict[str, Any]) -> ActionAnswer:
    """The action, guarded by the run read; an agent older than the guard (still running the previous version
    after an upgrade) refuses the field, and is asked again without it, as every earlier lynxtop asked it."""
    try:
        return client.action(action, profile, expect_run=seen, **extra)
    except AgentRefused as exc:
        if seen is ANY_RUN or exc.code != "unknown_field" or "expect_run" not in exc.message:
            raise
    _err("warning: the agent predates the run check (restart it to get it: it keeps serving with live restore); "
         "sent without it")
    return client.action(action, profile, **extra)


def _acted_on(client: AgentClient, before: Status, action: str, profile: str | None) -> str:
    """Which agent a mutating command reached, so a --socket or --config that went astray shows at once."""
    line = f"agent: {client.socket_path}, node {before.agent.host or '?'}"
    if not action.startswith("ray/"):
        # a stop of a held server acts on its profile; `(the default)` is what a start without one loads, and
        # said after a stop it named a profile nothing acted on
        held = before.serving.held
        name = profile or before.serving.profile or (held.profile if held is not None else "")
        line += f", profile {name or ('(the default)' if action == 'start' else '-')}"
    return line


class _Progress:
    """The state line while waiting: rewritten in place on a terminal, one line per state change elsewhere."""

    def __init__(self) -> None:
        self.tty = sys.stdout.isatty()
        self.last = ""

    def show(self, st: Status) -> None:
        srv = st.serving
        line = f"{srv.state}" + (f" ({load_phase(srv)})" if srv.phase and srv.state == ServingState.STARTING
                                  else "")
        if srv.state == ServingState.WAITING and srv.reason:  # what the head still waits for, as it changes
            line += f" ({srv.reason})"
        line += f"  {_since(srv.state_since_ms, st.ts_ms)}  profile {srv.profile or '-'}"
        self.show_line(line)

    def show_line(self, line: str) -> None:
        """`line`: its first field (up to two spaces) is the state; the rest (a duration) changes every poll."""
        line = terminal_safe(line)  # the agent's words: only the \r and erase below reach the terminal as such
        if line == self.last and not self.tty:
            return
        if self.tty:  # one screen line, or \r rewrites only its last part
            width = shutil.get_terminal_size().columns - 1
            print(f"\r\033[K{line[:width]}", end="", flush=True)
        elif line.split("  ")[0] != self.last.split("  ")[0]:
            print(line, flush=True)
        self.last = line

    def done(self) -> None:
        if self.tty:
            print()


def _poll(client: AgentClient, poll: float) -> Status | int:
    """The next status, waiting out an agent restart (up to a minute); an exit code when giving up."""
    unreachable_since: float | None = None
    while True:
        time.sleep(poll)
        try:
            return client.status()
        except AgentUnreachable as exc:
            unreachable_since = unreachable_since or time.monotonic()
            if time.monotonic() - unreachable_since > UNREACHABLE_GIVE_UP_S:
                _err(f"gave up waiting: {exc}")
                return EXIT_UNREACHABLE
        except AgentRefused as exc:
            _report_error(exc)
            return EXIT_FAILED


def wait_for(client: AgentClient, action: str, before: Status, poll_s: float | None = None,
             same_run: bool = False) -> int:
    """Poll status until the action is done: ready (a new run for restart/switch), stopped, or failed.
    `same_run`: the run already loading is the one waited for (a start found it starting)."""
    poll = POLL_S if poll_s is None else poll_s
    run0 = before.serving.run_id
    was_running = before.serving.state not in NOT_RUNNING
    progress = _Progress()
    seen_progress = False
    while True:
        st = _poll(client, poll)
        if isinstance(st, int):
            return st
        srv = st.serving
        progress.show(st)
        seen_progress = seen_progress or srv.state in (ServingState.STARTING, ServingState.STOPPING)
        new_run = same_run or srv.run_id != run0 or not was_running
        done = _outcome(action, srv.state, st.agent.action is not None, new_run, seen_progress)
        if done is not None:
            return _finish(progress, done, srv.reason)


def _outcome(action: str, state: ServingState | None, in_action: bool, new_run: bool,
             seen_progress: bool) -> tuple[bool, str] | None:
    if action == "stop":
        if state == ServingState.STOPPED and not in_action:
            return True, "stopped"
        return None
    if in_action:
        return None
    if state == ServingState.READY and new_run:
        return True, "ready"
    if state == ServingState.DEGRADED and new_run:
        return False, "serving came up degraded"
    if state in (ServingState.BACKOFF, ServingState.CRASH_LOOP) and (seen_progress or new_run):
        return False, f"{action} failed (state {state})"
    if state == ServingState.STOPPED and seen_progress:
        return False, f"{action} failed: serving stopped"
    return None


def _ray_line(st: Status, cluster: bool) -> str:
    cl = st.cluster
    line = f"ray {cl.ray_state}" + (f" ({cl.ray_reason})" if cl.ray_state in (RayState.BACKOFF,) else "")
    if cluster:
        line = f"serving {st.serving.state}, {line}"
    return line + f"  {_since(cl.ray_since_ms, st.ts_ms)}"


def _ray_outcome(goal: str, st: Status, cluster: bool) -> tuple[bool, str] | None:
    cl = st.cluster
    if goal == "running":
        if cl.ray_state == RayState.RUNNING:
            return True, f"Ray running ({cl.role}, {cl.address})"
        if cl.ray_state in (RayState.CRASH_LOOP, RayState.STOPPED):  # start set STARTING before it answered
            return False, f"Ray did not start (state {cl.ray_state})"
        return None  # starting, or backoff: it retries by itself
    if cl.ray_state in RAY_UP:
        return None
    if cluster and (st.serving.state not in (ServingState.STOPPED, ServingState.CRASH_LOOP)
                    or st.agent.action is not None):
        return None
    return True, "cluster stopped" if cluster else "Ray stopped"


def wait_for_ray(client: AgentClient, goal: str, cluster: bool = False, poll_s: float | None = None) -> int:
    """Poll status until this node's Ray is running or stopped (a cluster stop: serving stopped too)."""
    poll = POLL_S if poll_s is None else poll_s
    progress = _Progress()
    while True:
        st = _poll(client, poll)
        if isinstance(st, int):
            return st
        progress.show_line(_ray_line(st, cluster))
        done = _ray_outcome(goal, st, cluster)
        if done is not None:
            return _finish(progress, done, st.cluster.ray_reason)


def _print_cluster_stop(client: AgentClient, since_ms: int) -> None:
    """What each worker answered: the head records it in a cluster.stop event (best effort: the history may be
    unavailable, and the stop is done anyway)."""
    try:
        events = client.events(since_ms - 1, limit=1000)
    except (AgentUnreachable, AgentRefused):
        return
    for ev in events:
        if ev.kind == EventKind.CLUSTER_STOP and "nodes" in (ev.details or {}):
            print(terminal_safe(ev.message, lines=True))


def start(args: Namespace) -> int:
    return _act(args, "start", getattr(args, "profile", None))


def stop(args: Namespace) -> int:
    return _act(args, "stop", cluster=getattr(args, "cluster", False))


def restart(args: Namespace) -> int:
    return _act(args, "restart")


def switch(args: Namespace) -> int:
    return _act(args, "switch", args.profile)


def ray_start(args: Namespace) -> int:
    return _act(args, "ray/start")


def ray_stop(args: Namespace) -> int:
    return _act(args, "ray/stop", reason=getattr(args, "reason", None))
