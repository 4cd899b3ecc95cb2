"""The status object: what `GET /v1/status` answers, typed, with its JSON form defined here and nowhere else.

The agent builds a `Status`, the API writes `to_json()`, the one client reads `Status.from_json()`, and the CLI,
the exporter, the dashboard and the demo read attributes. The JSON keys are those of docs/api.md; a key an older
or newer agent adds or lacks is ignored or defaulted on read, so the dashboard of one version reads another's agent.
The metric parts (`GpuStatus.metrics`, `HostStatus.metrics`, `ServingMetrics.values`) are keyed by the columns of
`contract/columns.py`, the one metric contract, and are flat in the JSON.

A key that is present is read with its field's type: a value of another JSON type (a string for a number, a number
for a host name) is a `RecordError` naming the field, which a client reports as an agent it cannot read, never a
crash in whatever shows the value later; a metric reading that is not a finite number (NaN, Infinity, a string,
true) is None, not read.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, ClassVar, Self, TypeVar

from lynxtop.contract.columns import GPU_METRICS, HOST_METRICS, SERVING_METRICS, names


class ServingState(StrEnum):
    STOPPED = "stopped"
    STARTING = "starting"
    READY = "ready"
    DEGRADED = "degraded"
    STOPPING = "stopping"
    BACKOFF = "backoff"
    CRASH_LOOP = "crash-loop"
    WAITING = "waiting"  # a head: the profile starts once Ray reports the GPUs it needs (TPxPPxDP)

    @property
    def serving(self) -> bool:
        """The server answers requests (ready, or degraded: up but slow or hung)."""
        return self in (ServingState.READY, ServingState.DEGRADED)

    @property
    def alive(self) -> bool:
        """A server process is meant to be alive."""
        return self in (ServingState.STARTING, ServingState.READY, ServingState.DEGRADED, ServingState.STOPPING)


class Role(StrEnum):
    """What a node is in a serving deployment: alone, the Ray head that runs `vllm serve`, or a Ray worker."""

    SINGLE = "single"
    HEAD = "head"
    WORKER = "worker"


class RayState(StrEnum):
    """The node's own `ray start --block`, as the agent supervises it (OFF on a single node)."""

    OFF = "off"
    STOPPED = "stopped"
    STARTING = "starting"
    RUNNING = "running"
    STOPPING = "stopping"
    BACKOFF = "backoff"
    CRASH_LOOP = "crash-loop"


class SlaState(StrEnum):
    OK = "ok"
    BREACH = "breach"
    UNKNOWN = "unknown"


T = TypeVar("T")


def _build(cls: type[T], d: Mapping[str, Any] | None, **nested: Any) -> T:
    """`cls` from a JSON object: known keys only, missing ones defaulted (see the module docstring), each present
    one checked against its field's type (`_checked`); the `nested` fields are the caller's, read already."""
    d = d or {}
    if not isinstance(d, Mapping):
        raise _unreadable(cls.__name__, "", f"must be a JSON object, not {type(d).__name__}")
    kw = {}
    for name, annotation, accepts in _fields_of(cls):
        if name in d and name not in nested:
            value = d[name]
            if type(value) not in accepts:  # the common case, a value of its field's type, costs no call
                value = _checked(cls, name, annotation, value)
                if value is _DEFAULT:
                    continue
            kw[name] = value
    kw.update(nested)
    for name in _required(cls):
        if name not in kw:
            raise _unreadable(cls.__name__, name, "missing (a required field)")
    return cls(**kw)


@functools.cache
def _required(cls: type) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(cls)  # type: ignore[arg-type]
                 if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING)


def _items(cls: type, name: str, d: Mapping[str, Any]) -> list[Any] | tuple[Any, ...]:
    """The JSON list `d[name]` (empty when absent or null); any other JSON type is a `RecordError`."""
    value = d.get(name)
    if value is None:
        return ()
    if not isinstance(value, list | tuple):
        raise _unreadable(cls.__name__, name, f"expected a list, got {type(value).__name__}")
    return value


_TEXT_METRICS = frozenset(m[0] for m in (*GPU_METRICS, *HOST_METRICS, *SERVING_METRICS) if m[1] == "TEXT")
_DEFAULT = object()  # `_checked`'s answer for a value that leaves the field at its default
_NUMBERS = (int, float)


@functools.cache
def _fields_of(cls: type) -> tuple[tuple[str, str, frozenset[type]], ...]:
    """Each field of `cls`: its name, its annotation (a string: this module's annotations are not evaluated), and
    the value types taken as they are (not float: a float is checked for NaN and Infinity)."""
    return tuple((f.name, f.type, _shape(f.type)[1] - {float, object})  # type: ignore[arg-type]
                 for f in dataclasses.fields(cls))  # type: ignore[arg-type]


def _annotation(cls: type, name: str) -> str:
    return next(a for n, a, _ in _fields_of(cls) if n == name)


def _checked(cls: type, name: str, annotation: str, value: Any) -> Any:
    """`value` for the field `name` of `cls` annotated `annotation`, or a `RecordError` naming the field and the value.

    An agent of another version (or a buggy one) may answer a field with another JSON type ("60" for a number, 7
    for a host name): read as it is, it crashed a widget far from here and took the dashboard down; refused here,
    the client says it cannot read the agent. Leniencies that keep what an agent means: any number for a number
    field (an integer field given 1.0), and a number that is not finite (Python's JSON reads NaN and Infinity) or
    a null read as "not known": None where the field allows it, else the field's default.
    """
    optional, accepts, items = _shape(annotation)
    kind = type(value)
    if kind in accepts:
        if kind is float and not math.isfinite(value):
            return None if optional else _DEFAULT
        return value
    if value is None:
        return None if optional else _DEFAULT
    if items is not None and kind in (list, tuple) and all(isinstance(x, items) for x in value):
        return tuple(value)
    if dict in accepts and isinstance(value, Mapping):
        return value
    if object in accepts:
        return value
    words = {int: "a number", str: "a string", bool: "true or false", dict: "an object"}
    expected = " or ".join([words.get(k, k.__name__) for k in accepts if k is not float] + ["a list"] * bool(items))
    text = repr(value)
    raise _unreadable(cls.__name__, name, f"expected {expected}{' or null' if optional else ''}, got "
                      f"{text if len(text) <= 60 else text[:57] + '...'}")


_NAMED: dict[str, type] = {"str": str, "int": int, "float": float, "bool": bool, "Any": object}


@functools.cache
def _shape(annotation: str) -> tuple[bool, frozenset[type], Any]:
    """(null allowed, the JSON value types a field annotated `annotation` takes, a tuple field's item type or None);
    `object` in the types: anything (Any).

    Read from the annotation's text, which this module's few forms make simple (`int | None`, `dict[str, Any]`,
    `tuple[str, ...]`, a class of this module): `typing.get_type_hints` evaluates them, and cost a dashboard's
    first status 2 ms on its own."""
    optional, accepts, items = False, set(), None
    for arm in (a.strip() for a in annotation.split(" | ")):
        if arm == "None":
            optional = True
        elif arm in ("int", "float"):
            accepts.update((int, float))  # never bool: True is no number here
        elif arm in _NAMED:
            accepts.add(_NAMED[arm])
        elif arm.startswith("dict["):
            accepts.add(dict)
        elif arm.startswith("tuple["):
            item = arm[len("tuple["):].split(",")[0].strip()
            items = _NAMED.get(item) or globals()[item]
        else:
            accepts.add(globals()[arm])  # a class of this module: a nested field, read by its caller
    return optional, frozenset(accepts), items


def _unreadable(record: str, name: str, problem: str) -> Exception:
    """The RecordError (contract/records.py) of a status field this version cannot read; records is imported
    only then: the dashboard's first frame does without it (tests/tui/test_entry.py)."""
    from lynxtop.contract.records import RecordError

    return RecordError(record, name, problem)


def _is_number(value: Any) -> bool:
    return isinstance(value, _NUMBERS) and not isinstance(value, bool)


def metrics_of(d: Mapping[str, Any], names: tuple[str, ...]) -> dict[str, Any]:
    """The metric columns `names` of the JSON object `d`, every one a finite real number or None (not read): NaN
    and Infinity (Python's JSON reads both), true/false, a string or any other JSON type is no reading a chart or
    a format can show, and took the dashboard down where one reached it. A TEXT column (`cpu_per_core_pct`, a
    JSON array in a string) is kept as it is."""
    out = {}
    for k in names:  # once per GPU and row on every poll: types compared, no calls
        v = d.get(k)
        t = type(v)
        if t is float:
            out[k] = v if v - v == 0.0 else None  # NaN and +-Infinity give NaN
        else:
            out[k] = v if t is int or v is None or k in _TEXT_METRICS else None
    return out


_SCALARS = frozenset((str, int, float, bool, type(None)))
_FIELD_NAMES: dict[type, tuple[str, ...]] = {}  # a dataclass -> its fields' names (the classes of this module)


def _field_names(cls: type) -> tuple[str, ...]:
    """A dataclass' field names, looked up once: `dataclasses.fields` rebuilds its tuple on every call, and was
    most of `Status.to_json` (0.5 ms of a GET /v1/status at DP8, issue 29.3)."""
    names = _FIELD_NAMES.get(cls)
    if names is None:
        names = _FIELD_NAMES[cls] = tuple(f.name for f in dataclasses.fields(cls))  # type: ignore[arg-type]
    return names


def _plain(obj: Any) -> Any:
    if type(obj) in _SCALARS:  # most values: answered before any isinstance
        return obj
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {name: _plain(getattr(obj, name)) for name in _field_names(type(obj))}
    if isinstance(obj, StrEnum):
        return obj.value
    if isinstance(obj, (list, tuple)):
        return [_plain(x) for x in obj]
    if isinstance(obj, Mapping):
        return {k: _plain(v) for k, v in obj.items()}
    return obj


@dataclass(frozen=True)
class NvmlStatus:
    state: str = "error"  # ok | no-driver | error
    message: str = ""
    driver_version: str = ""
    nvml_version: str = ""


@dataclass(frozen=True)
class StoreStatus:
    path: str = ""
    queued: int | None = None
    dropped: int | None = None  # ticks lost: the queue overflowed, or the database refused them (`rejected`)
    rejected: int | None = None
    last_error: str | None = None
    wal_unlinked: str | None = None  # what was found (the store writer's words), kept until the agent restarts
    wal_unlinked_ms: int | None = None
    wal_recovered: bool | None = None
    db_swapped: str | None = None  # the database path lost or changed its file under the agent: what was done
    db_swapped_ms: int | None = None
    # History writes fail now and are retried (a full disk, a lock, a read-only remount): ticks wait in `queued`
    # up to the writer's bound, the oldest `dropped` beyond it. None from an agent older than the field.
    retrying: bool | None = None
    last_error_ms: int | None = None
    free_bytes: int | None = None  # free on the database's file system (as root can write), read every few seconds

    @property
    def not_writing(self) -> bool:
        """History is not being written now (`retrying`): what the CLI's and the dashboard's alarms say."""
        return bool(self.retrying)

    @property
    def cause(self) -> str:
        """Why history is not written, in a few words: `disk full` (SQLite's `database or disk is full`, or no
        byte free), `database locked`, `read-only` or `I/O error` from SQLite's words, else `writes failing`."""
        error = (self.last_error or "").lower()
        if "full" in error or self.free_bytes == 0:
            return "disk full"
        for words, cause in (("locked", "database locked"), ("busy", "database locked"),
                             ("readonly", "read-only"), ("i/o error", "I/O error")):
            if words in error:
                return cause
        return "writes failing"


@dataclass(frozen=True)
class ActionInfo:
    """The operator action in progress (one at a time)."""

    action: str
    profile: str | None = None
    since_ms: int | None = None
    by: str | None = None


@dataclass(frozen=True)
class AgentStatus:
    version: str = ""
    pid: int | None = None
    host: str = ""
    started_ms: int | None = None
    uptime_s: float | None = None
    simulated: bool = False
    healthy: bool = True
    missed_ticks: int = 0
    sample_interval_s: float | None = None
    gpu_late_ticks: int = 0
    failed_ticks: int = 0
    last_tick_error: str | None = None
    clock_steps: int = 0  # wall-clock steps seen (events agent.clock_step); samples keep the agent's timeline
    clock_offset_ms: int = 0  # wall clock minus the samples' timeline
    last_clock_step_ms: int | None = None  # the last step's size, positive forward
    # When the last sampling tick was written, on `Status.now_ms`'s clock (None: no tick yet, an older agent, or a
    # value that is no time): what a stalled sampler shows against, where `ts_ms` is only when the agent answered
    last_tick_ms: int | None = None
    connections: dict[str, dict[str, Any]] = field(default_factory=dict)
    descriptors: dict[str, Any] = field(default_factory=dict)
    nvml: NvmlStatus = field(default_factory=NvmlStatus)
    store: StoreStatus = field(default_factory=StoreStatus)
    action: ActionInfo | None = None
    live_restore: bool = False

    @classmethod
    def from_json(cls, d: Mapping[str, Any] | None) -> AgentStatus:
        d = d or {}
        act = d.get("action")
        return _build(cls, d, nvml=_build(NvmlStatus, d.get("nvml")), store=_build(StoreStatus, d.get("store")),
                      action=_build(ActionInfo, act) if isinstance(act, Mapping) and act.get("action") else None,
                      last_tick_ms=clock_ms(d.get("last_tick_ms")))  # read as `now_ms`: foreign, never an error


@dataclass(frozen=True)
class PhaseMark:
    phase: str
    ts_ms: int


@dataclass(frozen=True)
class LoadProgress:
    """The last progress bar of weight loading vLLM wrote to the run's log (`Loading safetensors checkpoint shards:
    45% Completed | 27/60`): a 20-minute load says how far it is, not only that it is loading weights."""
    done: int
    total: int
    pct: float


# The largest pid a Linux kernel hands out (PID_MAX_LIMIT on 64-bit): a number past it, or below 1, names no process
PID_MAX = 2**22


def _whole(value: int | float | None, low: int, high: int) -> int | None:
    """`value` as an int where it is a whole number in [low, high] (a JSON reader may send 4242.0); else None."""
    if type(value) is float and value.is_integer():
        value = int(value)
    return value if type(value) is int and low <= value <= high else None


@dataclass(frozen=True)
class HeldRun:
    """A server the agent holds but does not supervise: left serving by the previous agent, alive with its run's
    token, but not provably the server, so never adopted (agent/serving/adoption.py). It serves and holds the GPUs
    while the state reads STOPPED; `lynxtop stop` ends it. `run_id` and `pid` None: not known (or a value that is
    no run id or pid, never shown as one: an operator may `kill` what is shown)."""

    run_id: int | None = None
    profile: str = ""
    pid: int | None = None

    @classmethod
    def from_json(cls, d: Any) -> HeldRun:
        if not isinstance(d, Mapping):  # false, [], "": no "nothing held" (that is null), no held server either
            raise _unreadable("ServingStatus", "held", f"expected an object or null, got {str(d)[:60]!r}")
        held = _build(cls, d)  # another JSON type for a field (a string for the pid): refused, naming the field
        return cls(run_id=_whole(held.run_id, 1, CLOCK_MAX_MS), profile=held.profile,
                   pid=_whole(held.pid, 1, PID_MAX))


@dataclass(frozen=True)
class ServingStatus:
    state: ServingState = ServingState.STOPPED
    state_since_ms: int | None = None
    reason: str = ""
    phase: str | None = None
    phase_since_ms: int | None = None
    phases: tuple[PhaseMark, ...] = ()
    profile: str | None = None
    run_id: int | None = None
    pid: int | None = None
    model: str | None = None
    vllm_version: str | None = None
    started_ms: int | None = None
    ready_ms: int | None = None
    next_retry_ms: int | None = None
    failures_in_window: int = 0
    adopted: bool = False
    url: str | None = None
    log_problem: str | None = None
    degraded: tuple[str, ...] = ()  # what holds the run degraded: "hang", "unresponsive", "health"
    # While starting: the run's readiness_timeout_s, and when (agent timeline) it is stopped unless ready by then,
    # so a slow load shows how long it may still take. None otherwise, and from an agent older than the fields.
    ready_timeout_s: float | None = None
    ready_deadline_ms: int | None = None
    # While stopping (a stop the agent makes of a live run), both counted from `state_since_ms`: the run's vLLM
    # --shutdown-timeout (in-flight requests drain up to it; 0: aborted at once) and its stop_grace_s (what is left
    # is killed after it), so a drain shows how long it may still take. None otherwise, and from older agents.
    shutdown_timeout_s: float | None = None
    stop_grace_s: float | None = None
    # While starting: the last checkpoint shards' progress read from the run's log (None: none yet, another phase,
    # or an older agent), and when (agent timeline) the run's log last grew: a hung load (a stuck NFS read) writes
    # nothing, a slow one goes on writing. None otherwise, and from agents older than the fields.
    load_progress: LoadProgress | None = None
    log_grew_ms: int | None = None
    simulated: bool = False  # the run is lynxtop's simulated vLLM (on real GPUs too, where `agent.simulated` is not)
    # While it serves: the quantities lynxtop reads that this vLLM's page lacks (agent/metrics/served.py's keys,
    # "tpot", "prefix_hits"...), and the version serving it (None: unknown), so an empty column reads "not served",
    # not "no traffic". Empty otherwise, and from agents older than the fields.
    not_served: tuple[str, ...] = ()
    not_served_version: str | None = None
    # While it serves: per latency series (contract/columns.py LATENCY_SERIES), the observations its percentiles
    # come from, the `_count` increase of vLLM's histogram over the scraper's window of `window_s` (requests; ITL's:
    # inter-token intervals): a p99 of one request is one request, not a tail. Empty otherwise, and from older agents.
    window_counts: dict[str, Any] = field(default_factory=dict)
    window_s: float | None = None
    # A server left by the previous agent that this one holds, unsupervised (HeldRun): it serves on the GPUs while
    # `state` reads stopped. None: none (or none alive), and from agents older than the field.
    held: HeldRun | None = None
    # A state word this version does not know (a newer agent's, or garbage from a foreign endpoint), as it came:
    # `state` then reads STOPPED for the code that needs one, but the dashboard shows this word, never STOPPED (an
    # idle-looking node that is nothing of the kind). Read side only: never in the JSON (`state` carries it).
    unknown_state: str | None = None

    @classmethod
    def from_json(cls, d: Mapping[str, Any] | None) -> ServingStatus:
        d = d or {}
        if not isinstance(d, Mapping):
            return _build(cls, d)  # the RecordError of a part that is no object
        state = str(d.get("state") or ServingState.STOPPED.value)
        known = state in _STATES
        counts = d.get("window_counts")  # any other JSON type: refused by _build, naming the field
        extra = {"window_counts": window_counts_of(counts)} if isinstance(counts, Mapping) else {}
        return _build(cls, d, state=ServingState(state) if known else ServingState.STOPPED, **extra,
                      phases=tuple(_build(PhaseMark, p) for p in _items(cls, "phases", d)),
                      load_progress=_build(LoadProgress, d["load_progress"]) if d.get("load_progress") is not None
                      else None,
                      held=HeldRun.from_json(d["held"]) if d.get("held") is not None else None,
                      unknown_state=None if known else state)

    def to_json(self) -> dict[str, Any]:
        out = _plain(self)
        unknown = out.pop("unknown_state")
        if unknown is not None:  # the word as it came, so a status read back is the same status
            out["state"] = unknown
        return out

    def window_count(self, series: str) -> int | None:
        """The observations in `series`' window (its percentiles' sample size); None where not known."""
        return self.window_counts.get(series)


_STATES = frozenset(s.value for s in ServingState)
# A percentile over fewer observations than this is shown with its count (`n=1` in the dashboard's Serving panel,
# "too few for a p99" in `lynxtop status`): a p99 of fewer than 100 is not a 99th percentile, and below this it is
# a handful of requests. The SLA's own rule (agent/metrics/sla.py MIN_REQUESTS): no breach opens on fewer.
FEW_OBSERVATIONS = 20
# SlaStatus.reason where a p99 past its limit is not judged because the page gives no request count to judge by
SLA_COUNT_UNKNOWN = ("request count unknown: the page has no finished-request counter and no TTFT window count was "
                     "read, so a p99 past its limit is not judged")


def window_counts_of(d: Mapping[str, Any]) -> dict[str, int]:
    """The counts an agent sent that are counts (whole numbers in [0, 2**53)); any other value (a string, true, -1,
    2.5, Infinity, 2**64) is left out: never shown as a sample size."""
    out = {}
    for k, v in d.items():
        if type(v) is int and 0 <= v < 2**53:
            out[str(k)] = v
        elif type(v) is float and math.isfinite(v) and 0 <= v < 2**53 and v.is_integer():
            out[str(k)] = int(v)
    return out


@dataclass(frozen=True)
class SlaStatus:
    state: SlaState = SlaState.UNKNOWN
    since_ms: int | None = None
    ttft_p99_ms: float | None = None
    tpot_p99_ms: float | None = None
    ttft_threshold_ms: float | None = None
    tpot_threshold_ms: float | None = None
    window_s: float | None = None
    tpot_source: str | None = None
    breached: tuple[str, ...] = ()
    worst_ttft_p99_ms: float | None = None  # in the JSON only while in breach
    worst_tpot_p99_ms: float | None = None
    # the lowest bucket's bound of the histograms the p99s come from: a p99 at or below it is only known to be at
    # most it (contract/quantile.py), and is not judged against a threshold below it
    ttft_lowest_bucket_ms: float | None = None
    tpot_lowest_bucket_ms: float | None = None
    # requests in the window the state was judged over (no breach opens on fewer than FEW_OBSERVATIONS), and which
    # count that is (`window_requests_source`): "finished" (vLLM's finished-request counter), or "ttft" where the
    # page has no such counter (the TTFT histogram's count: requests given a first token, those in flight too);
    # None where neither is known, and from older agents (whose count, where given, is of finished requests)
    window_requests: int | None = None
    window_requests_source: str | None = None
    # why the state is unknown (no latency data, a p99 the histogram cannot place, too few requests, a request count
    # unknown); "" otherwise, and from older agents
    reason: str = ""

    @classmethod
    def from_json(cls, d: Mapping[str, Any] | None) -> SlaStatus:
        d = d or {}
        state = str(d.get("state") or "unknown")
        return _build(cls, d, state=SlaState(state) if state in {s.value for s in SlaState} else SlaState.UNKNOWN)

    def to_json(self) -> dict[str, Any]:
        out = _plain(self)
        if self.state != SlaState.BREACH:
            out.pop("worst_ttft_p99_ms")
            out.pop("worst_tpot_p99_ms")
        return out


GPU_METRIC_NAMES = names(GPU_METRICS)
HOST_METRIC_NAMES = names(HOST_METRICS)
SERVING_METRIC_NAMES = names(SERVING_METRICS)


@dataclass(frozen=True)
class GpuStatus:
    """One GPU: what it is, and every GPU_METRICS column of the latest tick (None: not read)."""

    index: int | None = None
    name: str | None = None
    uuid: str | None = None
    pci_bus_id: str | None = None
    arch: str | None = None
    gpm_supported: bool | None = None
    nvlink_count: int | None = None
    xid_errors: int = 0  # XID critical errors NVML reported since the agent started (a counter for Prometheus)
    metrics: dict[str, Any] = field(default_factory=dict)

    def metric(self, name: str) -> Any:
        return self.metrics.get(name)

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> GpuStatus:
        return _build(cls, d, metrics=metrics_of(d, GPU_METRIC_NAMES))

    def to_json(self) -> dict[str, Any]:
        out = {name: getattr(self, name) for name in _field_names(type(self)) if name != "metrics"}
        out.update({k: self.metrics.get(k) for k in GPU_METRIC_NAMES})
        return out


@dataclass(frozen=True)
class _MetricRow:
    """One tick's row of metric columns, every column present (None: not read); flat in the JSON."""

    NAMES: ClassVar[tuple[str, ...]] = ()
    metrics: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if set(self.metrics) != set(self.NAMES):  # frozen: complete the row once, here
            object.__setattr__(self, "metrics", {k: self.metrics.get(k) for k in self.NAMES})

    def metric(self, name: str) -> Any:
        return self.metrics.get(name)

    @classmethod
    def from_json(cls, d: Mapping[str, Any] | None) -> Self:
        d = d or {}
        if not isinstance(d, Mapping):
            raise _unreadable(cls.__name__, "", f"must be a JSON object, not {type(d).__name__}")
        return cls(metrics=metrics_of(d, cls.NAMES))

    def to_json(self) -> dict[str, Any]:
        return {k: self.metrics.get(k) for k in self.NAMES}


@dataclass(frozen=True)
class HostStatus(_MetricRow):
    """Every HOST_METRICS column of the latest tick."""

    NAMES: ClassVar[tuple[str, ...]] = HOST_METRIC_NAMES


@dataclass(frozen=True)
class ServingMetrics(_MetricRow):
    """Every SERVING_METRICS column of the latest scrape (all None while nothing is scraped)."""

    NAMES: ClassVar[tuple[str, ...]] = SERVING_METRIC_NAMES


@dataclass(frozen=True)
class EngineLoad:
    """One data-parallel engine's load on the last page read: an engine falling behind is what DP operators hunt."""

    engine: str
    running: int | None = None
    waiting: int | None = None
    kv_cache_usage_pct: float | None = None

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> EngineLoad:
        return _build(cls, {"engine": "", **d})


@dataclass(frozen=True)
class ClusterNode:
    """One node as Ray's state API reports it (the head reads it; a node lost stays listed, not alive)."""

    node_id: str
    ip: str = ""
    name: str = ""
    head: bool = False
    alive: bool = True
    gpus: float = 0.0
    state_message: str | None = None  # Ray's reason for a dead node
    start_ms: int | None = None
    end_ms: int | None = None

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> ClusterNode:
        return _build(cls, {"node_id": "", **d})


@dataclass(frozen=True)
class GpuTaker:
    """A process on a Ray worker's GPUs that is not Ray's (another team's job, a notebook, a leftover vLLM), as the
    worker's agent tells it: vLLM's ranks placed there would run out of GPU memory (agent/cluster/gpus.py)."""

    pid: int
    name: str = ""  # /proc comm, escaped by the agent ("?": /proc does not show it, e.g. a container's)
    gpus: tuple[int, ...] = ()  # the GPUs it is on (empty: the view did not say)
    used_mem_bytes: int | None = None

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> GpuTaker:
        return _build(cls, {"pid": 0, **d})


def held_text(held: HeldRun) -> str:
    """`run 12 (profile dsv41, pid 4242)`: a server the agent holds, worded alike by `lynxtop status`, its stop's
    confirmation and the dashboard's dialogs; `?` for what the agent did not say."""
    return (f"run {held.run_id if held.run_id is not None else '?'} (profile {held.profile or '?'}, pid "
            f"{held.pid if held.pid is not None else '?'})")


def taker_text(t: GpuTaker) -> str:
    """`pid 4242 (python) GPU 3`: one process holding a worker's GPUs, worded alike by `lynxtop status` and the
    dashboard (the name as the agent escaped it: a caller that renders markup must not parse it)."""
    text = f"pid {t.pid}" + (f" ({t.name})" if t.name else "")
    if t.gpus:
        text += f" GPU{'s' if len(t.gpus) > 1 else ''} {','.join(map(str, t.gpus))}"
    return text


def gpus_text(n: float) -> str:
    """A GPU count in words: "1 GPU", "8 GPUs", "0.5 GPUs"."""
    return f"{n:g} GPU" + ("" if n == 1 else "s")


def describe_node(n: ClusterNode) -> str:
    """One node for an operator: its address (else its name, else its id's start), its GPUs, the head marked."""
    return f"{n.ip or n.name or n.node_id[:8]} ({gpus_text(n.gpus)}{', head' if n.head else ''})"


@dataclass(frozen=True)
class NodeSet:
    """Ray's view of the cluster as a set of nodes: which are alive, which were lost, the GPUs alive, and what a
    profile still lacks. The one place of this arithmetic: the status (ClusterStatus), `lynxtop check` and the
    head's serving gate all read it here, so they count and word it alike."""

    nodes: tuple[ClusterNode, ...] = ()

    @property
    def alive(self) -> tuple[ClusterNode, ...]:
        return tuple(n for n in self.nodes if n.alive)

    @property
    def lost(self) -> tuple[ClusterNode, ...]:
        """Dead nodes with no live node of their kind (head or worker) at their address.

        Ray keeps a restarted node's old entry, DEAD, beside the new one for as long as its GCS lives: that entry is
        history, not a node missing now. (A worker beside the head on one host, as in tests, is told apart by kind.)
        """
        alive = {(n.ip, n.head) for n in self.nodes if n.alive}
        return tuple(n for n in self.nodes if not n.alive and (n.ip, n.head) not in alive)

    @property
    def gpus_alive(self) -> float:
        return sum(n.gpus for n in self.nodes if n.alive)

    def gpus_missing(self, needed: float) -> float:
        """GPUs the alive nodes lack for `needed` (0 when they have enough)."""
        return max(needed - self.gpus_alive, 0)

    def shortfall(self, needed: float) -> str | None:
        """None when the alive nodes have `needed` GPUs; else, in words, what Ray has and what is missing, e.g.
        "8 on 1 node(s) [10.0.0.1 (8 GPUs, head)]; 8 missing; lost: 10.0.0.2 (8 GPUs): <Ray's reason>"
        (the caller says whose count it is: "it has ...", "Ray reports ...")."""
        missing = self.gpus_missing(needed)
        if not missing:
            return None
        alive = self.alive
        text = (f"{self.gpus_alive:g} on {len(alive)} node(s) [{', '.join(map(describe_node, alive))}]; "
                f"{missing:g} missing")
        if lost := self.lost:
            text += "; lost: " + ", ".join(f"{describe_node(n)}: {n.state_message or 'dead'}" for n in lost)
        return text


@dataclass(frozen=True)
class ClusterStatus:
    """The node's role, its Ray, and on the head the cluster as Ray sees it."""

    role: Role = Role.SINGLE
    ray_state: RayState = RayState.OFF
    ray_reason: str = ""
    ray_since_ms: int | None = None
    ray_pid: int | None = None
    ray_next_retry_ms: int | None = None
    ray_failures: int = 0  # failures in the crash-loop window
    address: str = ""  # the head's GCS address (host:port)
    nodes: tuple[ClusterNode, ...] = ()  # head only
    view_ms: int | None = None  # when Ray's view was last read
    view_error: str | None = None  # why it could not be read, while it cannot
    gpus_needed: int | None = None  # what the profile being started or served needs (TPxPPxDP)
    # a worker: processes on its GPUs that are not Ray's, and since when (absent from older agents: none)
    gpus_taken: tuple[GpuTaker, ...] = ()
    gpus_taken_since_ms: int | None = None

    @property
    def node_set(self) -> NodeSet:
        return NodeSet(self.nodes)

    @property
    def alive_nodes(self) -> tuple[ClusterNode, ...]:
        return self.node_set.alive

    @property
    def lost_nodes(self) -> tuple[ClusterNode, ...]:
        return self.node_set.lost

    @property
    def gpus_alive(self) -> float:
        return self.node_set.gpus_alive

    @classmethod
    def from_json(cls, d: Mapping[str, Any] | None) -> ClusterStatus:
        d = d or {}
        role, ray = str(d.get("role") or "single"), str(d.get("ray_state") or "off")
        return _build(cls, d, role=Role(role) if role in _ROLES else Role.SINGLE,
                      ray_state=RayState(ray) if ray in _RAY_STATES else RayState.OFF,
                      nodes=tuple(ClusterNode.from_json(n) for n in _items(cls, "nodes", d) if isinstance(n, Mapping)),
                      gpus_taken=tuple(GpuTaker.from_json(t) for t in _items(cls, "gpus_taken", d)
                                       if isinstance(t, Mapping)))


_ROLES = frozenset(r.value for r in Role)
_RAY_STATES = frozenset(s.value for s in RayState)


# The plausible range of a node's clock in epoch milliseconds: anything else (2^64, a negative number) is no time
# to count from. 2^53: the last whole number a JSON reader of any language keeps exactly.
CLOCK_MAX_MS = 2**53 - 1


def clock_ms(value: Any) -> int | None:
    """A foreign clock reading in epoch ms, or None: a whole or finite number in [0, CLOCK_MAX_MS]; NaN, Infinity,
    true, a string, anything else is absent (never a RecordError: the field only refines the answer's times)."""
    if type(value) is float and math.isfinite(value):
        value = int(value)
    return value if type(value) is int and 0 <= value <= CLOCK_MAX_MS else None


@dataclass(frozen=True)
class Status:
    ts_ms: int | None = None
    # The agent's clock (its samples' timeline, as every *_ms of the status) when it answered: the dashboard counts
    # from it, plus its own time since the answer came, so another node's ages and durations are on that node's
    # clock whatever the skew between the two (docs/dashboard.md). None: an older agent, a replay.
    now_ms: int | None = None
    agent: AgentStatus = field(default_factory=AgentStatus)
    serving: ServingStatus = field(default_factory=ServingStatus)
    sla: SlaStatus = field(default_factory=SlaStatus)
    gpus: tuple[GpuStatus, ...] = ()
    host: HostStatus = field(default_factory=HostStatus)
    serving_metrics: ServingMetrics = field(default_factory=ServingMetrics)
    engines: tuple[EngineLoad, ...] = ()  # per data-parallel engine; the totals are in serving_metrics
    cluster: ClusterStatus = field(default_factory=ClusterStatus)

    def to_json(self) -> dict[str, Any]:
        return {**self.head_json(), **self.tick_json()}

    def head_json(self) -> dict[str, Any]:
        """The JSON's first keys: what may change at any moment (an action, a state, the listeners' counts)."""
        return {
            "cluster": _plain(self.cluster),
            "ts_ms": self.ts_ms,
            "now_ms": self.now_ms,
            "agent": _plain(self.agent),
            "serving": self.serving.to_json(),
            "sla": self.sla.to_json(),
        }

    def tick_json(self) -> dict[str, Any]:
        """The JSON's last keys: what only a sampling tick or a scrape changes (the agent encodes them once per
        tick for every poller: `join_json`)."""
        return {
            "gpus": [g.to_json() for g in self.gpus],
            "host": self.host.to_json(),
            "serving_metrics": self.serving_metrics.to_json(),
            "engines": [_plain(e) for e in self.engines],
        }

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Status:
        if not isinstance(d, Mapping):
            raise ValueError(f"a status must be a JSON object, not {type(d).__name__}")
        return cls(ts_ms=_checked(cls, "ts_ms", _annotation(cls, "ts_ms"), d.get("ts_ms")),
                   now_ms=clock_ms(d.get("now_ms")),
                   agent=AgentStatus.from_json(d.get("agent")),
                   serving=ServingStatus.from_json(d.get("serving")), sla=SlaStatus.from_json(d.get("sla")),
                   gpus=tuple(GpuStatus.from_json(g) for g in _items(cls, "gpus", d) if isinstance(g, Mapping)),
                   host=HostStatus.from_json(d.get("host")),
                   serving_metrics=ServingMetrics.from_json(d.get("serving_metrics")),
                   engines=tuple(EngineLoad.from_json(e) for e in _items(cls, "engines", d) if isinstance(e, Mapping)),
                   cluster=ClusterStatus.from_json(d.get("cluster")))


_NOT_SERVED_WORDS = {"prefix_queries": "prefix cache queries", "prefix_hits": "prefix cache hits",
                     "kv_usage": "KV-cache usage", "generation_tokens": "generation tokens",
                     "prompt_tokens": "prompt tokens", "requests": "finished requests", "running": "running requests",
                     "waiting": "waiting requests"}


def not_served_text(serving: ServingStatus) -> str:
    """`not served by vLLM 0.10.2: TPOT, prefix cache hits` ("" when every quantity is served): a latency series
    by its short name, the rest in words. One wording for `lynxtop status` and the dashboard."""
    if not serving.not_served:
        return ""
    names = ", ".join(_NOT_SERVED_WORDS.get(k, k.upper()) for k in serving.not_served)
    return f"not served by vLLM {serving.not_served_version or '(version unknown)'}: {names}"


LOG_SILENT_SHOW_S = 60.0  # a loading run's log silent this long reads as silent (a slow load writes more often)


def load_phase(serving: ServingStatus, short: bool = False) -> str:
    """`loading weights 27/60 shards (45%)`: the phase, with the checkpoint shards' progress while they load;
    `short`: `loading weights 27/60` (the dashboard header's 80 columns). "" without a phase. One wording for
    `lynxtop status` and the dashboard."""
    lp = serving.load_progress
    if lp is None or serving.phase != "loading weights":
        return serving.phase or ""
    if short:
        return f"{serving.phase} {lp.done}/{lp.total}"
    return f"{serving.phase} {lp.done}/{lp.total} shards ({lp.pct:.0f}%)"


def log_silent_s(serving: ServingStatus, now_ms: int | None) -> float | None:
    """How long a loading run's log has not grown (None: not loading, no clock, or an agent older than the field);
    shown as silent from LOG_SILENT_SHOW_S."""
    if serving.state != ServingState.STARTING or serving.log_grew_ms is None or not now_ms:
        return None
    return max(0.0, (now_ms - serving.log_grew_ms) / 1000)


def join_json(head: str, tick: str) -> str:
    """`json.dumps(status.to_json())` from `json.dumps(status.head_json())` and `json.dumps(status.tick_json())`
    (default separators), to the byte: the two objects' members joined in the order `to_json` gives them."""
    return head[:-1] + ", " + tick[1:]


CALLER_KEYS = frozenset({"by"})  # who asked for an action: "uid 1000 (alice) pid 4242" (agent/api/peercred.py)


# a caller as agent/api/peercred.py describes one, in free text ("stopped by uid 1000 (alice) pid 4242")
_CALLER_TEXT = re.compile(r"uid \d+ \([^()]*\) pid \d+")


def without_callers(tree: Any) -> Any:
    """A status JSON tree (or part of one) without who asked for an action (`CALLER_KEYS`, at any depth, and the
    caller named in free text such as `serving.reason`: "an operator").

    For the open TCP `GET /v1/status` (Prometheus, the fleet view; no token): it says what is in progress, not
    which local user and process asked for it. The control socket's status, read by its operators, keeps it."""
    if isinstance(tree, Mapping):
        return {k: without_callers(v) for k, v in tree.items() if k not in CALLER_KEYS}
    if isinstance(tree, list):
        return [without_callers(v) for v in tree]
    if isinstance(tree, str) and "uid " in tree:
        return _CALLER_TEXT.sub("an operator", tree)
    return tree
