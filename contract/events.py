"""Every event kind the agent records, in one dotted naming scheme, with the kinds older agents stored.

Events reach the store by one path (`agent.events.EventSink`, which alone calls `StoreWriter.record(Event)`),
and the dashboard and alert rules filter by these names, so a kind exists only once it is listed here. Kinds
stored under an older name are mapped on read (`canonical_kind`), so an earlier agent's history reads the same.
A kind a newer agent added reads as a generic event (`UnknownKind`, shown as it is) when it is well-formed; one
that is not (control characters, too long, not a string) is refused, naming it.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Hashable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from lynxtop.contract.records import RecordError, strict_fields


class Severity(StrEnum):
    INFO = "info"
    WARNING = "warning"
    ERROR = "error"
    CRITICAL = "critical"


def log_level(severity: str) -> int:
    """The journal level of an event of `severity` (a `Severity` or its text): the one mapping every part that logs
    an event uses (the agent's sink; the GPU sampler's reporter where no sink is wired), so a level never disagrees."""
    return {"critical": logging.ERROR, "error": logging.ERROR, "warning": logging.WARNING}.get(severity, logging.INFO)


class EventKind(StrEnum):
    # the agent itself
    AGENT_STARTED = "agent.started"
    AGENT_STOPPED = "agent.stopped"
    AGENT_AUTOSTART_HELD = "agent.autostart_held"
    AGENT_AUTOSTART_FAILED = "agent.autostart_failed"
    AGENT_STATE_FILE = "agent.state_file"
    AGENT_SOCKET_RECREATED = "agent.socket_recreated"  # the control socket's path was removed or replaced: bound again
    AGENT_SOCKET_LOST = "agent.socket_lost"  # ... and could not be bound again (a file or another agent is there)
    AGENT_CLOCK_STEP = "agent.clock_step"  # the wall clock was stepped; the samples' timeline was not
    AGENT_CONFIG_RELOADED = "agent.config_reloaded"  # SIGHUP: the config file re-read (details.file, .profiles)
    AGENT_CONFIG_RELOAD_FAILED = "agent.config_reload_failed"  # ... refused, the config in use kept (.problems)
    # operator actions
    ACTION_START = "action.start"
    ACTION_STOP = "action.stop"
    ACTION_RESTART = "action.restart"
    ACTION_SWITCH = "action.switch"
    ACTION_SWITCH_DONE = "action.switch.done"
    ACTION_SWITCH_FAILED = "action.switch.failed"
    # the agent died mid-switch or mid-restart (details.action); the next one finishes it
    ACTION_SWITCH_INTERRUPTED = "action.switch.interrupted"
    ACTION_FAILED = "action.failed"
    PREFLIGHT_WARNING = "preflight.warning"
    # the supervised vLLM
    SERVING_STARTING = "serving.starting"
    SERVING_PHASE = "serving.phase"
    SERVING_READY = "serving.ready"
    SERVING_START_FAILED = "serving.start_failed"
    SERVING_READINESS_TIMEOUT = "serving.readiness_timeout"
    SERVING_EXITED = "serving.exited"
    SERVING_CRASH = "serving.crash"
    SERVING_BACKOFF = "serving.backoff"
    SERVING_CRASH_LOOP = "serving.crash_loop"
    SERVING_STOPPED = "serving.stopped"
    SERVING_UNKILLABLE = "serving.unkillable"
    SERVING_ORPHANS = "serving.orphans"
    SERVING_CLEANUP = "serving.cleanup"
    SERVING_ADOPTED = "serving.adopted"
    SERVING_NOT_ADOPTED = "serving.not_adopted"
    SERVING_ADOPTED_UNKNOWN_PROFILE = "serving.adopted_unknown_profile"
    SERVING_ADOPTED_PROFILE_CHANGED = "serving.adopted_profile_changed"
    SERVING_PORT_IN_USE = "serving.port_in_use"  # another process listens on the profile's port: no start, not ready
    SERVING_GPU_RELEASE_TIMEOUT = "serving.gpu_release_timeout"
    SERVING_GPU_RELEASE_UNKNOWN = "serving.gpu_release_unknown"
    SERVING_LOG_UNWRITABLE = "serving.log_unwritable"
    SERVING_LOG_WRITABLE = "serving.log_writable"
    # a loading run's log silent for load_stall_warn_s (a hung read): a warning only, the load is never stopped for it;
    # info when its output resumes
    SERVING_LOAD_STALLED = "serving.load_stalled"
    SERVING_LOAD_RESUMED = "serving.load_resumed"
    # the agent met an unexpected error watching a run or handling its exit (a bug, not an operator's action)
    SERVING_WATCH_ERROR = "serving.watch_error"
    SERVING_DEGRADED_HANG = "serving.degraded.hang"  # requests wait or run, no token for hang_timeout_s
    SERVING_DEGRADED_HEALTH = "serving.degraded.health"  # GET /health failing while serving
    SERVING_RECOVERED_HANG = "serving.recovered.hang"
    SERVING_RECOVERED_HEALTH = "serving.recovered.health"
    # the idle probe (idle_probe_s) cannot ask this run (its key refused, a model without completions): info, once
    SERVING_IDLE_PROBE_OFF = "serving.idle_probe_off"
    # multi-node: the node's Ray (head or worker) and, on the head, the cluster as Ray sees it
    RAY_STARTING = "ray.starting"
    RAY_RUNNING = "ray.running"
    RAY_EXITED = "ray.exited"
    RAY_BACKOFF = "ray.backoff"
    RAY_CRASH_LOOP = "ray.crash_loop"
    RAY_STOPPED = "ray.stopped"
    RAY_ADOPTED = "ray.adopted"
    CLUSTER_NODE_LOST = "cluster.node_lost"
    CLUSTER_NODE_JOINED = "cluster.node_joined"
    CLUSTER_WAITING = "cluster.waiting"  # serving waits for Ray to report the GPUs the profile needs
    CLUSTER_WHOLE = "cluster.whole"
    CLUSTER_VIEW_FAILED = "cluster.view_failed"
    CLUSTER_VIEW_RESTORED = "cluster.view_restored"
    CLUSTER_STOP = "cluster.stop"  # `lynxtop stop --cluster`: what each node answered
    # GPUs and NVML
    GPU_LOST = "gpu.lost"
    GPU_RECOVERED = "gpu.recovered"
    GPU_XID = "gpu.xid"
    GPU_GPM_DISABLED = "gpu.gpm_disabled"
    GPU_SETUP_FAILED = "gpu.setup_failed"  # a GPU or its GPM/XID events left out of an NVML initialisation by a bug
    GPU_UNREADABLE = "gpu.unreadable"  # every reading of a GPU (not lost) failed for a few ticks and seconds
    GPU_READABLE = "gpu.readable"  # ... readings came back (details.lasted_s)
    # an NVML (re)open found other boards at known indices (details.changes: gpu, old_uuid, new_uuid; a board gone at
    # start-up: seen_until_ms, one back: absent_since_ms): history is by index, so a GPU's series continue with
    # another board's readings from here
    GPU_IDENTITY_CHANGED = "gpu.identity_changed"
    NVML_REINIT = "nvml.reinit"
    NVML_UNAVAILABLE = "nvml.unavailable"
    NVML_AVAILABLE = "nvml.available"  # NVML, unavailable since the agent started, sampled cleanly for a while
    NVML_NO_PERMISSION = "nvml.no_permission"
    NVML_MISSING_FUNCTION = "nvml.missing_function"
    # the /metrics scrape and the SLA
    SCRAPE_OUTAGE = "scrape.outage"
    SCRAPE_RECOVERED = "scrape.recovered"
    SCRAPE_COUNTER_RESET = "scrape.counter_reset"
    SCRAPE_BAD_VALUE = "scrape.bad_value"  # values on the page that are no reading (NaN, infinite, out of range)
    SCRAPE_OVER_LIMIT = "scrape.over_limit"  # a part of the page over a cap was left out (docs/sampling.md)
    # a family lynxtop reads is not on the page (this vLLM version does not serve it): once per run and quantity
    SCRAPE_NOT_SERVED = "scrape.not_served"
    SLA_BREACH = "sla.breach"
    SLA_RECOVERED = "sla.recovered"  # a breach ended: the data shows p99 TTFT and TPOT back within the limits
    SLA_UNKNOWN = "sla.unknown"  # a breach no longer judged: no latency data in the window (idle, unreachable, stopped)
    # the history store
    STORE_WAL_UNLINKED = "store.wal_unlinked"
    STORE_WAL_RECOVERED = "store.wal_recovered"
    STORE_MOVED_ASIDE = "store.moved_aside"  # a damaged or foreign file was moved aside; a fresh one started
    STORE_WRITE_FAILED = "store.write_failed"  # writes fail (full disk, I/O error): ticks wait in memory
    STORE_WRITES_RESUMED = "store.writes_resumed"
    STORE_TICKS_DROPPED = "store.ticks_dropped"  # the writer lags (queue full, no write error): oldest ticks dropped
    STORE_WRITER_CAUGHT_UP = "store.writer_caught_up"  # ... no tick dropped for a while (details.dropped_ticks)
    STORE_DB_UNLINKED = "store.db_unlinked"  # the database path lost the writer's file (rm, mv): a fresh one
    STORE_DB_REPLACED = "store.db_replaced"  # the path names another file (a restored backup): written from now
    STORE_LEGACY = "store"  # read only: what older agents stored for any of the writer's troubles (see below)


# kinds stored by agents before the dotted scheme; read as their new name
LEGACY_KINDS: dict[str, EventKind] = {
    "xid": EventKind.GPU_XID,
    "gpu_lost": EventKind.GPU_LOST,
    "gpu_recovered": EventKind.GPU_RECOVERED,
    "gpm_disabled": EventKind.GPU_GPM_DISABLED,
    "nvml_reinit": EventKind.NVML_REINIT,
    "nvml_unavailable": EventKind.NVML_UNAVAILABLE,
    "nvml_no_permission": EventKind.NVML_NO_PERMISSION,
    "nvml_missing_function": EventKind.NVML_MISSING_FUNCTION,
    "scrape_outage": EventKind.SCRAPE_OUTAGE,
    "scrape_recovered": EventKind.SCRAPE_RECOVERED,
    "scrape_counter_reset": EventKind.SCRAPE_COUNTER_RESET,
    "sla_breach": EventKind.SLA_BREACH,
    "sla_recovered": EventKind.SLA_RECOVERED,
}
# Older stores also hold kind "store" for the writer's three troubles above; it stays "store" on read
# (EventKind.STORE_LEGACY), since one old name cannot tell which of the three new ones it was.


# A newer agent's kind this version reads: dotted words of ASCII letters, digits, _ and - (what EventKind's names
# are), short enough for a table column. Nothing else: a kind is printed as it is, in the terminal and the dashboard.
KIND_MAX = 64
_WELL_FORMED = re.compile(r"[A-Za-z0-9_-]+(?:\.[A-Za-z0-9_-]+)+")


class UnknownKind(str):
    """A kind this version does not know, read from a newer agent (its store rows or its answers): kept and shown
    as it is, matched by nothing that needs a known kind. Only readers make one (`Event.from_json`); an `Event`
    constructed with a plain unknown string is still refused, so this version writes only the kinds above."""

    __slots__ = ()

    def __new__(cls, kind: str) -> UnknownKind:
        problem = kind_problem(kind)
        if problem is not None:
            raise RecordError("Event", "kind", problem)
        return super().__new__(cls, kind)

    @property
    def value(self) -> str:
        """As `EventKind.value`: the name (callers may read either)."""
        return str.__str__(self)


def kind_problem(kind: object) -> str | None:
    """Why `kind` can be read neither as a known kind nor as a newer agent's; None when it can."""
    if not isinstance(kind, str):
        return f"expected a string (a dotted name such as serving.ready), got {_short(kind)}"
    if canonical_kind(kind) in _KIND_VALUES or (len(kind) <= KIND_MAX and _WELL_FORMED.fullmatch(kind)):
        return None
    return (f"unknown kind {_short(kind)}, and not a well-formed one: a newer agent's kind is read when it is "
            f"dotted words of ASCII letters, digits, _ and - (such as serving.ready), at most {KIND_MAX} characters")


def _short(value: object) -> str:
    """`repr`, cut: control characters come out escaped, and a long value does not flood the message."""
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def canonical_kind(kind: str) -> str:
    """The dotted name of a stored kind (an unknown kind is kept as stored: `Event` then names it unknown)."""
    return LEGACY_KINDS[kind].value if kind in LEGACY_KINDS else kind


def stored_kinds(kind: str) -> list[str]:
    """Every name under which events of `kind` may be stored (for a filter on the store)."""
    return [kind, *[old for old, new in LEGACY_KINDS.items() if new.value == kind]]


@dataclass(frozen=True)
class Event:
    """One event: what a sampler, the supervisor or the store reports; written as one row of `events`.

    Only kinds of `EventKind` (an older name is mapped) and severities of `Severity` can be made, so nothing, a test
    fixture included, writes a kind the dashboard and alert rules do not know. `from_json` reads what a newer agent
    wrote too: a well-formed kind this version lacks becomes an `UnknownKind` (a generic event, never an error that
    hides the other events); a missing field, a malformed kind or a field of the wrong type is an error naming it
    (contract/records.py), an unknown key is ignored.
    """

    kind: EventKind | UnknownKind
    severity: Severity
    message: str
    details: dict[str, Any] | None = None
    run_id: int | None = None
    ts_ms: int | None = None  # None: the time it is written
    id: int | None = field(default=None, compare=False)  # set once stored
    # held in the agent's memory, not in the database yet (writes failing: StoreWriter.pending_events); optional
    # in JSON: present only when true, so a stored event's JSON is as before and an older reader ignores the key
    pending: bool = field(default=False, compare=False)

    def __post_init__(self) -> None:
        kind = canonical_kind(str(self.kind))
        if kind in _KIND_VALUES:
            object.__setattr__(self, "kind", EventKind(kind))  # frozen: the members, once, here
        elif not isinstance(self.kind, UnknownKind):  # a reader's, checked when made
            raise RecordError("Event", "kind", _unknown(str(self.kind)))
        if str(self.severity) not in _SEV_VALUES:
            raise RecordError("Event", "severity", f"{str(self.severity)!r} is not one of "
                              f"{', '.join(_SEV_VALUES_ORDERED)}")
        object.__setattr__(self, "severity", Severity(str(self.severity)))

    @property
    def known(self) -> bool:
        """Whether this version knows the kind (False: a newer agent's, shown as a generic event)."""
        return isinstance(self.kind, EventKind)

    def to_json(self) -> dict[str, Any]:
        out = {"id": self.id, "ts_ms": self.ts_ms, "run_id": self.run_id, "kind": str(self.kind),
               "severity": str(self.severity), "message": self.message, "details": self.details}
        if self.pending:
            out["pending"] = True
        return out

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Event:
        """Strict: kind, severity and message required, each field of its type; a stored old kind is mapped, a
        newer agent's well-formed one kept as an `UnknownKind`, a malformed one refused naming it."""
        if isinstance(d, Mapping) and "kind" in d:
            problem = kind_problem(d["kind"])
            if problem is not None:
                raise RecordError("Event", "kind", problem)
            kind = canonical_kind(d["kind"])
            d = {**d, "kind": EventKind(kind) if kind in _KIND_VALUES else UnknownKind(kind)}
        return cls(**strict_fields(cls, d))


def identity(ev: Event) -> Hashable:
    """What an event held by the agent (`pending`, no id yet) and its stored row share: time, run, kind, severity,
    message and details. A reader that sees both (the agent's `GET /v1/events`, the dashboard merging the database
    with the agent's held events) lists the event once, from the database (agent/api/pending.py)."""
    details = json.dumps(ev.details, sort_keys=True, default=str) if ev.details is not None else None
    return (ev.ts_ms, ev.run_id, str(ev.kind), str(ev.severity), ev.message, details)


def _unknown(kind: str) -> str:
    """An `Event` made with a kind not in EventKind: this version writes only its own kinds."""
    return f"unknown kind {_short(kind)} (not in EventKind: add it there before writing it)"


_KIND_VALUES = frozenset(k.value for k in EventKind)
_SEV_VALUES_ORDERED = tuple(s.value for s in Severity)
_SEV_VALUES = frozenset(_SEV_VALUES_ORDERED)
