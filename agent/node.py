"""`lynxtop agent`: one asyncio process that wires the clock, the samplers, the supervisor, the store and the API.

Data flows one way: samplers -> store writer -> SQLite; the supervisor writes runs and events; the API reads the
status kept here and the history through a read-only StoreReader. Each tick runs the samplers of
agent/sampling.py (each gives rows and events) and writes their events through one function (`_record`).
NVML and SQLite calls run in threads, so a slow GPU or disk never stalls the control socket; a tick that is still
running when the next is due makes the next one be skipped and counted, never queued.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import gc
import logging
import os
import pwd
import signal
import socket
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from lynxtop import __version__
from lynxtop.agent import dirtrust
from lynxtop.agent.api.connguard import Episodes, FdPlan, install_loop_handler, plan_descriptors
from lynxtop.agent.clock import Timeline
from lynxtop.agent.config_source import ConfigSource
from lynxtop.agent.controller import NodeController
from lynxtop.agent.events import EventSink
from lynxtop.agent.notify import Notifier, WatchdogThread
from lynxtop.agent.reload import reload_config
from lynxtop.agent.sampling import (
    EventCollector,
    GpuSource,
    HostSource,
    ScrapeSource,
    ScrapeTarget,
    SlaSource,
)
from lynxtop.agent.serving import run as serving_run
from lynxtop.agent.serving import safefile
from lynxtop.agent.serving.health import HttpClient
from lynxtop.agent.serving.proctable import ProcTable
from lynxtop.agent.serving.supervisor import Supervisor, now_ms, server_url
from lynxtop.agent.status_view import StatusView
from lynxtop.agent.ticker import Ticker
from lynxtop.contract.config import AgentConfig, Config
from lynxtop.contract.events import Event, EventKind, Severity
from lynxtop.contract.status import Status

log = logging.getLogger("lynxtop.agent")
GC_YOUNG_THRESHOLD = 20_000

STATE_FILE = "serving.json"
LOCK_FILE = "agent.lock"
LOCK_RUNNING, LOCK_STOPPED = "running", "stopped"  # agent.lock's second word: how its agent ended
SOCKET_CHECK_S = 5.0  # how often the control socket's path is checked (a tmpfiles clean of /run removes it)


class AgentStartError(Exception):
    """The agent cannot start (database, socket, listener): the message says what and where. `exit_code`: 1, or
    2 for a mistake in how it was started (the same code as a configuration error)."""

    exit_code = 1


class AgentUsageError(AgentStartError):
    """Started the wrong way (as another user than the state directory's owner): nothing was touched."""

    exit_code = 2


class NodeGpuView:
    """The supervisor's view of the GPUs, refreshed by every tick of the sampler (no NVML call of its own)."""

    def __init__(self) -> None:
        self.nvml: dict[str, Any] = {"state": "error", "message": "not opened", "driver_version": "",
                                     "nvml_version": ""}
        self.static: list[dict[str, Any]] = []
        self.sample_ts: float | None = None
        self.pids: set[int] = set()
        self.process_rows: list[dict] = []
        # False until a tick's GPU sample: NVML's open alone lists no process (a start waits: gpu_holders.py)
        self.sampled = False

    def update(self, ts: float, process_rows: list[dict], nvml: dict[str, Any], static: list[dict], *,
               sampled: bool = True) -> None:
        """Called by the tick, on the loop or in the clock thread (a quiet tick): the sample's time is set last, so
        a reader that sees it sees its pids (one seeing the old time with new pids waits for a later sample).
        `sampled` False: NVML's open, with no process list yet."""
        self.pids = {int(r["pid"]) for r in process_rows if r.get("pid") is not None}
        self.process_rows = list(process_rows)  # GET /v1/processes
        self.nvml = nvml
        if static:
            self.static = static
        self.sampled = self.sampled or sampled
        self.sample_ts = ts

    def gpu_info(self) -> list[dict[str, Any]] | None:
        if self.nvml.get("state") != "ok":
            return None
        return [{"index": g.get("idx"), "name": g.get("name"), "cc_major": g.get("cc_major"),
                 "cc_minor": g.get("cc_minor"), "mem_total_bytes": g.get("mem_total_bytes"),
                 "nvlink_count": g.get("nvlink_count"), "driver_version": g.get("driver_version"),
                 "uuid": g.get("uuid"), "pci_bus_id": g.get("pci_bus_id")}  # CUDA_VISIBLE_DEVICES: visible.py
                for g in self.static]

    def compute_pids(self) -> tuple[float, set[int]] | None:
        if self.nvml.get("state") != "ok" or self.sample_ts is None:
            return None
        return self.sample_ts, set(self.pids)


class Node:
    """The agent: wires the store, the samplers and their clock, the supervisor, the Ray roles, the listeners and
    the status, and owns no policy; its `controller` answers the control API (agent/controller.py)."""

    def __init__(self, cfg: Config, notifier: Notifier, sim_state_dir: str | None = None):
        self.cfg = cfg
        self.notifier = notifier
        self.sim_state_dir = sim_state_dir
        self.host = socket.gethostname()
        self.started_ms = now_ms()
        self.started_mono = time.monotonic()
        self.timeline = Timeline()  # every stored timestamp: never jumps when the wall clock is stepped
        serving_run.use_clock(self.timeline.now_ms)  # runs' spans on the samples' clock
        self.simulated = bool(cfg.agent.fake_nvml)
        self.interval = cfg.agent.sample_interval_s
        # recurring failures (EMFILE, a broken sampler) are logged when they start and end, never per tick
        self.episodes = Episodes(lambda m: log.warning("%s", m))
        self.fd_plan: FdPlan | None = None
        self.gpu_view = NodeGpuView()
        # the clock (ticks, their counters, the latest rows, health) and the status built from the parts
        self.ticker = Ticker(self.interval, self.timeline, self.episodes, writer=lambda: self.writer,
                             record=self._record, context=self._tick_context, on_beat=self._beat,
                             on_done=self._on_change)
        self.view = StatusView(self)
        self.controller = NodeController(self)  # the control API's actions (agent/controller.py)
        self._members: set[int] = set()
        self._members_key: str | None = None
        self._members_at = 0.0
        self._target: ScrapeTarget | None = None  # the last scrape target given (_scrape_target)
        self.proc_table = ProcTable()  # the host tree and the run's members, read between looks
        self._stop = asyncio.Event()
        self._announced = False  # READY=1 sent: a SIGHUP reload is then told to systemd (RELOADING=1, READY=1)
        self.config = ConfigSource(cfg)  # profiles re-read in one place, shared with the supervisor
        self._lock_fd: int | None = None
        self._socket_check_at = 0.0  # monotonic time of the next look at the control socket's path
        self.writer: Any = None
        self.event_sink: EventSink | None = None  # the one event path, once the store is open
        self.sla: Any = None
        self.supervisor: Supervisor | None = None
        self.cluster: Any = None  # roles.ClusterPart on a head or worker node: its Ray and the cluster
        self.api: Any = None
        self.exporter: Any = None
        self.http = HttpClient()  # the one session to vLLM: scrape, readiness, /health, /version
        self._gpu_events = EventCollector()  # the GPU sampler's on_event; written by the tick
        self.xid_errors: dict[int, int] = {}  # GPU index -> XIDs since start (one writer: the GPU sample's XID poll)
        self._gpu_sampler: Any = None
        self._host_sampler: Any = None
        self.gpu_source: GpuSource | None = None
        self.host_source: HostSource | None = None
        self.scrape_source: ScrapeSource | None = None

    # the samplers behind the tick's sources (a test may wrap one after _open_parts)

    @property
    def sampler(self) -> Any:
        return self._gpu_sampler

    @sampler.setter
    def sampler(self, sampler: Any) -> None:
        self._gpu_sampler = sampler
        if self.gpu_source is not None:
            self.gpu_source.sampler = sampler

    @property
    def host_sampler(self) -> Any:
        return self._host_sampler

    @host_sampler.setter
    def host_sampler(self, sampler: Any) -> None:
        self._host_sampler = sampler
        if self.host_source is not None:
            self.host_source.sampler = sampler

    @property
    def gpu_late(self) -> int:
        """Ticks written without GPU rows because NVML answered too slowly."""
        return self.gpu_source.late if self.gpu_source is not None else 0

    # ------------------------------------------------------------------------------------------ wiring

    def _open_parts(self) -> None:
        from lynxtop.agent.gpu.backend import open_backend
        from lynxtop.agent.gpu.sampler import GpuSampler
        from lynxtop.agent.host import HostSampler
        from lynxtop.agent.metrics.sla import SlaTracker
        from lynxtop.store.writer import StoreWriter, linger_for

        a = self.cfg.agent
        for d in (a.database.parent, a.run_log_dir):
            try:
                d.mkdir(parents=True, exist_ok=True, mode=0o750)
            except OSError as exc:
                raise AgentStartError(f"cannot create directory {d}: {exc.strerror or exc}") from None
        refuse_untrusted_dirs(a)  # again, now they exist: one made by another user meanwhile is not used
        try:
            # lock=True: the database file itself is locked, so a second agent reaching it by another path (a
            # symlink, a hard link, a bind mount) is refused before it writes anything
            # linger: ticks share a transaction: a second of them below 1 s sampling, five at 1 s (linger_for)
            # on_event: the store's own events (a file moved aside, writes failing) take the one event path too
            # (the store may not import the agent); those of opening are handed over at start(), sink made
            self.writer = StoreWriter(a.database, retention=a.retention, clock=self.timeline.time, lock=True,
                                      linger_s=linger_for(a.sample_interval_s),
                                      on_event=lambda ev: self._record([ev]))
        except Exception as exc:  # noqa: BLE001 - StoreError and sqlite errors alike: say where
            raise AgentStartError(f"cannot open the history database {a.database}: {exc}") from None
        self.event_sink = EventSink(self.writer, log, on_write_error=self._event_not_written)
        self.writer.start()
        fake, sim_dir = a.fake_nvml, self.sim_state_dir
        from lynxtop.sim.gpus import SimScenario  # the node composes: the GPU layer never imports the simulator

        self.sampler = GpuSampler(lambda: open_backend(fake, sim_dir, SimScenario), gpm_enabled=a.gpm,
                                  on_event=self._gpu_event, on_xid=self._count_xid)
        self.host_sampler = HostSampler(a.database, table=self.proc_table)
        self.sla = SlaTracker(self.cfg.sla)
        if a.role != "single":
            from lynxtop.agent.cluster.roles import ClusterPart

            self.cluster = ClusterPart(self.cfg, self.event_sink, state_dir=a.database.parent,
                                       session=self.http.session, on_change=self._on_change, gpus=self.gpu_view)
        self.supervisor = Supervisor(self.cfg, self.writer, self.gpu_view, state_path=a.database.parent / STATE_FILE,
                                     host=self.host, simulated=self.simulated, on_change=self._on_change,
                                     http=self.http, cluster=self.cluster.watch if self.cluster else None,
                                     events=self.event_sink, config=self.config)
        self._open_sources()

    def _open_sources(self) -> None:
        """The tick's samplers, in stages: host, then NVML and the scrape side by side, then the SLA."""
        assert self.supervisor is not None
        self.gpu_source = GpuSource(self.sampler, self.gpu_view, self._upsert_gpus, self._gpu_events)
        # host and GPU (NVML) read by the ticker's clock thread itself: no executor hand-off
        self.host_source = HostSource(self.host_sampler, self._run_members, gpu=self.gpu_source)
        # a scrape is cut off before the next is due: a slow server gives a failed row, never a late tick
        every = max(self.interval, self.cfg.agent.scrape_interval_s)
        self.scrape_source = ScrapeSource(self.http, self._scrape_target, window_s=self.cfg.sla.window_s,
                                          timeout_s=max(0.1, min(2.0, every * 0.8)),
                                          interval_s=every if every > self.interval else 0.0,
                                          hang_timeout_s=self.cfg.agent.hang_timeout_s,
                                          on_new_run=self.sla.reset,  # a new run starts its own SLA window
                                          on_verdict=self.supervisor.on_verdict)
        from lynxtop.agent.metrics.sla import counts_of

        # the SLA's stand-in count where the page has no finished-request counter: the TTFT window count of the row
        self.sla.counts = counts_of(self.scrape_source)
        if not self.cfg.agent.metrics_listen:  # the lifetime totals are the exporter's alone: none, nothing kept
            from lynxtop.agent.metrics.lifetime import ServingTotals

            self.scrape_source.totals = ServingTotals(kept=False)
        self.ticker.use([[self.gpu_source, self.scrape_source], [SlaSource(self.sla)]], part=self.host_source)

    def _gpu_event(self, kind: str, severity: str, message: str, details: dict | None = None) -> None:
        """The GPU sampler's events (from its threads), kept for the next tick's one path into the store."""
        self._gpu_events(kind, severity, message, details)

    def _count_xid(self, gpu: int | None) -> None:
        """Every XID read, counted at once per GPU (one NVML could not name counts nowhere): an episode's repeats
        are told in one later event (agent/gpu/xid.py), `lynxtop_gpu_xid_errors_total` rises as they come."""
        if isinstance(gpu, int):
            self.xid_errors[gpu] = self.xid_errors.get(gpu, 0) + 1

    def _record(self, events: Iterable[Event]) -> None:
        """Every event of the agent's samplers, of the store and of the node itself takes the one event path
        (agent/events.py)."""
        for ev in events:
            self.event_sink.put(ev)

    def _event_not_written(self, ev: Event, exc: Exception) -> None:
        """A store that refuses events must not stop sampling: said once per episode, not per event."""
        self.episodes.hit("event", f"events cannot be recorded: {type(exc).__name__}: {exc}")

    def _upsert_gpus(self, static: list[dict]) -> None:
        with contextlib.suppress(Exception):
            self.writer.upsert_gpus(static, enumerated=self.sampler.enumerated)

    def _on_change(self) -> None:
        self.notifier.status(self.status_line())

    async def main(self) -> int:
        loop = asyncio.get_running_loop()
        # operators send SIGHUP for a config reload: by default it killed the agent uncleanly (no STOPPING=1, no
        # agent.stopped, vLLM left unsupervised, and systemd's Restart=on-failure does not restart a SIGHUP death)
        loop.add_signal_handler(signal.SIGHUP, lambda: reload_config(
            self.config, self.notifier if self._announced else None, self.status_line,
            self.event_sink.put if self.event_sink is not None else None))  # an event once the store is open
        self._open()
        sup = self.supervisor
        assert sup is not None
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._stop.set)
        await self._open_gpus()
        try:
            await self._start_listeners()
            if self.cluster is not None:  # a head's Ray comes first: serving waits for its cluster
                await self.cluster.boot()
            a = self.cfg.agent
            await sup.take_over(a.default_profile if a.autostart else None)
            gc.collect()
            gc.freeze()  # startup's objects live as long as the agent: later full collections need not walk them
            # a tick allocates a few thousand short-lived containers (a page's lines): at the default 700 the
            # young generation was collected every tick or two, to find nothing; cycles are rare here
            gc.set_threshold(GC_YOUNG_THRESHOLD, 20, 20)
            self.notifier.ready(self.status_line())
            self._announced = True
            await self._serve_until_stopped(loop, sup)
        finally:
            await self._close()
        return 0

    def _open(self) -> None:
        """Refuse a second agent, lock the state directory and open the store and the parts."""
        refuse_foreign_state_dir(self.cfg.agent.database.parent)  # first: the wrong user changes nothing
        refuse_untrusted_dirs(self.cfg.agent)
        if _agent_answers(self.cfg.agent.socket):
            # checked before the store is opened or anything adopted: two supervisors of one vLLM is the worst case
            raise AgentStartError(f"another agent is already running on {self.cfg.agent.socket}; stop it first "
                                  "(systemctl stop lynxtop-agent) or use another [agent] socket")
        self._unclean = previous_agent(self.cfg.agent.database.parent)  # read before this agent marks the lock
        self._lock_fd = lock_state_dir(self.cfg.agent.database.parent)
        try:
            self._open_parts()
        except BaseException:
            self._lock_fd = release_lock(self._lock_fd)
            raise

    async def _open_gpus(self) -> None:
        nvml = await asyncio.to_thread(self.sampler.open)
        static = self.sampler.static()
        self.gpu_view.update(time.monotonic(), [], nvml, static, sampled=False)  # no processes read yet
        if static:
            self._upsert_gpus(static)
        sim_note = " (SIMULATED GPUs)" if self.simulated else ""
        log.info("lynxtop agent %s on %s: NVML %s%s, %d GPU(s), database %s", __version__, self.host,
                 nvml.get("state"), sim_note, len(static), self.cfg.agent.database)
        self._record([*self._gpu_events.drain(), started_event(nvml, len(static), self.simulated, self._unclean)])

    async def _serve_until_stopped(self, loop: asyncio.AbstractEventLoop, sup: Supervisor) -> None:
        a = self.cfg.agent
        tasks = [loop.create_task(self.ticker.run(), name="clock")]
        watchdog = None
        if self.notifier.watchdog_interval_s:
            # a thread, not a task: after SIGSTOP/SIGCONT the keep-alive must not wait behind the loop's backlog
            watchdog = WatchdogThread(self.notifier, self.ticker.healthy, self.notifier.watchdog_interval_s,
                                      on_resume=self.ticker.resumed, on_unhealthy=self.ticker.log_unhealthy)
            watchdog.start()
        await self._stop.wait()
        if watchdog is not None:
            watchdog.stop()
        log.info("stopping (live_restore %s: serving %s)", "on" if a.live_restore else "off",
                 "keeps running" if a.live_restore else "is stopped first")
        self.notifier.stopping("agent stopping" + (" (serving keeps running)" if a.live_restore else ""))
        # the clock keeps sampling while serving stops: the GPU release check needs fresh samples
        await sup.shutdown(stop_serving=not a.live_restore)
        if self.cluster is not None:
            await self.cluster.shutdown(stop_ray=not a.live_restore)
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t

    async def _start_listeners(self) -> None:
        from lynxtop.agent.api.routes import ApiServer, ApiStartError, strict_dumps

        a = self.cfg.agent
        install_loop_handler(asyncio.get_running_loop(), self.episodes)
        wanted = {"api": a.api_max_connections}
        if a.metrics_listen:
            wanted["metrics"] = a.metrics_max_connections
        self.fd_plan = plan_descriptors(wanted)
        (log.warning if self.fd_plan.reduced else log.info)("%s%s", self.fd_plan.describe(), " (connection caps "
                                                            "lowered to fit the descriptor limit)"
                                                            if self.fd_plan.reduced else "")
        self.api = ApiServer(self.controller, a.socket, a.socket_group, log=lambda m: log.info("api: %s", m),
                             max_connections=self.fd_plan.caps["api"], request_timeout_s=a.request_timeout_s,
                             episodes=self.episodes)
        try:
            await self.api.start()
        except (ApiStartError, OSError) as exc:
            self.api = None
            raise AgentStartError(f"control socket {a.socket}: {exc}") from None
        if a.metrics_listen:
            from lynxtop.agent.metrics.exporter import MetricsExporter

            self.exporter = MetricsExporter(a.metrics_listen, self.status, log=lambda m: log.info("%s", m),
                                            max_connections=self.fd_plan.caps["metrics"],
                                            request_timeout_s=a.request_timeout_s, episodes=self.episodes,
                                            totals=self.view.serving_totals, reads=self._tcp_reads(),
                                            status_body=lambda: self.status_body(strict_dumps, tcp=True),
                                            last_tick=lambda: self.ticker.last_tick_unix)
            try:
                await self.exporter.start()
            except (RuntimeError, OSError) as exc:
                self.exporter = None
                raise AgentStartError(str(exc)) from None

    def _tcp_reads(self) -> Any:
        """The TCP endpoint's token-guarded reads ([agent] tcp_reads), None when off; the token read here, kept
        only in the listener."""
        a = self.cfg.agent
        if not a.tcp_reads or a.tcp_token_file is None or self.api is None:
            return None
        from lynxtop.agent.api.tcpreads import TcpReads
        from lynxtop.contract.config import read_token_file

        token, why = read_token_file(a.tcp_token_file)
        if why:
            raise AgentStartError(f"[agent] tcp_token_file: {why}")
        return TcpReads(self.api, token, self.episodes)

    async def _close(self) -> None:
        if self.scrape_source is not None:
            self.scrape_source.close()
        for part in (self.exporter, self.api):
            if part is not None:
                with contextlib.suppress(Exception):
                    await part.stop()
        await self.http.close()
        if self.sampler is not None:
            with contextlib.suppress(Exception):
                await asyncio.to_thread(self.sampler.close)
        if self.writer is not None:
            self._record([*self._gpu_events.drain(),
                          Event(EventKind.AGENT_STOPPED, Severity.INFO, f"agent stopped (pid {os.getpid()})")])
            await asyncio.to_thread(self.writer.close)
        self.controller.close()
        self._lock_fd = release_lock(self._lock_fd)  # last: a new agent may take over only once this one is done

    # ------------------------------------------------------------------------------------------ clock

    def _tick_context(self) -> tuple[int | None, int | None]:
        """(vLLM's root pid, the run id) for the next tick."""
        sup = self.supervisor
        assert sup is not None
        runs = sup.runs  # the lifecycle's own: the supervisor's forwarding __getattr__ costs a failed lookup each
        return runs.vllm_root_pid(), runs.run_id

    def _beat(self, now: float) -> None:
        """Every interval, ticking or not: recurring failures' episodes, and now and then the socket's path."""
        self.episodes.poll()
        if now >= self._socket_check_at:
            self._socket_check_at = now + SOCKET_CHECK_S
            self._check_socket()

    def _check_socket(self) -> None:
        """The control socket removed or replaced under the agent is bound again; either way an event."""
        if self.api is None:
            return
        try:
            found = self.api.check_socket()
        except Exception as exc:  # noqa: BLE001 - a failed look must not stop the clock
            self.episodes.hit("socket", f"cannot check the control socket: {type(exc).__name__}: {exc}")
            return
        if found is None:
            return
        rebound, msg = found
        self._record([Event(EventKind.AGENT_SOCKET_RECREATED if rebound else EventKind.AGENT_SOCKET_LOST,
                            Severity.WARNING if rebound else Severity.ERROR, msg,
                            details={"socket": str(self.cfg.agent.socket)})])

    def _run_members(self) -> set[int]:
        """Processes of the run outside the leader's tree (a /proc scan: every 5 s, not every tick); called in the
        ticker's clock thread, the one thread reading the process table."""
        now = time.monotonic()
        sup = self.supervisor
        token = sup.runs.run_token() if sup is not None else None
        if sup is not None and token is not None and (self._members_key != token or now - self._members_at > 5.0):
            self._members = set(sup.run_members(self.proc_table))
            self._members_key, self._members_at = token, now
        return self._members

    def _scrape_target(self) -> ScrapeTarget | None:
        """The served vLLM while it serves (ready or degraded); None otherwise: nothing to scrape."""
        sup = self.supervisor
        if sup is None:
            return None
        runs = sup.runs  # read once a tick: the lifecycle's own, not through the supervisor's __getattr__
        if not runs.state.serving:
            return None
        url = runs.url()
        if url is None:
            return None
        run_id, token = runs.run_id, runs.run_token()
        last = self._target
        if last is not None and last.url == url and last.run_id == run_id and last.run_token == token:
            return last  # the same object while the run is the same: ScrapeSource compares it by identity first
        run = runs.run  # its version names a family the page lacks (agent/metrics/served.py), no GET /version
        self._target = ScrapeTarget(url, run_id, token, vllm_version=run.vllm_version if run is not None else None)
        return self._target

    # ------------------------------------------------------------------------------------------ status

    def status_line(self) -> str:
        return self.view.line()

    def status(self) -> Status:
        return self.view.status()

    def status_body(self, dumps: Callable[[Any], str], tcp: bool = False) -> str:
        """GET /v1/status's JSON text (StatusView.body); `tcp`: the open TCP endpoint's, without callers."""
        return self.view.body(dumps, tcp=tcp)


def refuse_foreign_state_dir(d: Path) -> None:
    """Refuse to run as another user than the state directory's owner (`sudo lynxtop agent` by hand while the
    service runs as User=lynxtop): that agent would adopt the run and rewrite serving.json as its own 0640 file,
    which the service's agent then cannot read (the live model left unsupervised), and a run it started would be
    one no lynxtop command can stop. Nor one its owner lets group or others write (dirtrust): they could plant a
    serving.json whose `members` the agent then kills. Checked before anything in the directory is opened or
    created; a directory not there yet is created by this agent, so it is its own."""
    try:
        owner = d.stat().st_uid
    except FileNotFoundError:
        return
    except OSError:
        return  # not readable by this user: lock_state_dir says so with the path
    me = os.geteuid()
    if owner == me:
        # the owner's, but one others may write (a `chmod 1777`, a database put in /tmp) lets them plant a record
        if why := dirtrust.problem(d, "the state directory", "[agent] database"):
            raise AgentUsageError(why)
        return
    try:
        name = pwd.getpwuid(owner).pw_name
    except KeyError:
        name = f"#{owner}"
    raise AgentUsageError(
        f"the state directory {d} belongs to {dirtrust.user(owner)} but this agent runs as {dirtrust.user(me)}; "
        f"nothing was changed. Run it as the owner (sudo -u {name} lynxtop agent ...) or through systemd "
        "(systemctl start lynxtop-agent)")


def refuse_untrusted_dirs(a: AgentConfig) -> None:
    """Refuse a control socket or run log directory another user owns or may write (dirtrust): the first lets
    that user swap the socket or plant the record copy beside it, the second plant files the agent prunes and
    serves. Checked before anything is made in them; one not there yet is made by this agent, its own. The
    socket's may be sticky (/tmp): the record copy there is read only when the agent owns it."""
    for d, what, setting, sticky_ok in ((a.socket.parent, "the control socket's directory", "[agent] socket", True),
                                        (a.run_log_dir, "the run log directory", "[agent] log_dir", False)):
        if why := dirtrust.problem(d, what, setting, sticky_ok=sticky_ok):
            raise AgentUsageError(why)


def lock_state_dir(d: Path) -> int:
    """Hold an exclusive lock on the state directory for the agent's life.

    The socket check before it is racy: two agents started at once both pass it, then both adopt or autostart
    (two vLLMs on one set of GPUs). The lock closes that window; the kernel drops it when the agent dies.
    The directory is writable by the service user, which vLLM runs as: agent.lock is opened without following a
    symlink (one to /etc/shadow would have had root's agent truncate it) and used only if it is a regular file.
    """
    refuse_foreign_state_dir(d)
    try:
        d.mkdir(parents=True, exist_ok=True, mode=0o750)
    except OSError as exc:
        raise AgentStartError(f"cannot create directory {d}: {exc.strerror or exc}") from None
    refuse_foreign_state_dir(d)  # again: one another user made first between the check and the mkdir
    lock = d / LOCK_FILE
    try:
        fd = safefile.open_regular(lock, os.O_RDWR | os.O_CREAT, 0o640, refused="not used")
    except safefile.StateFileError as exc:
        raise AgentStartError(f"{exc}; the agent does not start: remove it (rm {lock}) and start again") from None
    except OSError as exc:
        raise AgentStartError(f"cannot create the agent lock {lock}: {exc.strerror or exc}") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        holder = (os.read(fd, 32).decode(errors="replace").split() or ["?"])[0]
        os.close(fd)
        raise AgentStartError(f"another agent (pid {holder}) is already running with the state directory {d} "
                              f"(it holds {lock}); stop it first (systemctl stop lynxtop-agent)") from None
    _mark_lock(fd, LOCK_RUNNING)
    return fd  # held until the agent has closed everything (Node._close)


def previous_agent(d: Path) -> int | None:
    """The pid of the agent before this one if it did not stop cleanly (killed, crashed, the node lost power),
    from agent.lock as it left it; None when it stopped (or it is unknown: no file, an older agent's bare pid).
    Read before this agent locks and marks the file."""
    try:
        fd = safefile.open_regular(d / LOCK_FILE, os.O_RDONLY, 0, refused="not read")
    except (safefile.StateFileError, OSError):
        return None
    try:
        words = os.read(fd, 64).decode(errors="replace").split()
    except OSError:
        return None
    finally:
        os.close(fd)
    if len(words) == 2 and words[1] == LOCK_RUNNING and words[0].isascii() and words[0].isdigit():
        return int(words[0])
    return None


def release_lock(fd: int | None) -> None:
    """agent.lock marked as left by a clean stop (a start that failed is one too), then unlocked: None, the
    descriptor the caller keeps."""
    if fd is not None:
        _mark_lock(fd, LOCK_STOPPED)
        os.close(fd)
    return None


def started_event(nvml: dict, gpus: int, simulated: bool, unclean: int | None) -> Event:
    """`agent.started`; a warning when the agent before this one did not stop cleanly: without it the history's
    gap (its last seconds of samples and events lost, nothing written until now) had no event saying why."""
    sim_note = " (SIMULATED GPUs)" if simulated else ""
    text = f"agent {__version__} started (pid {os.getpid()}){sim_note}"
    details: dict[str, Any] = {"nvml": nvml, "gpus": gpus, "simulated": simulated}
    if unclean is None:
        return Event(EventKind.AGENT_STARTED, Severity.INFO, text, details=details)
    text += (f"; the previous agent (pid {unclean}) did not stop cleanly (killed, crashed or the node lost power): "
             "the history has a gap up to now and its last seconds of samples may be lost")
    return Event(EventKind.AGENT_STARTED, Severity.WARNING, text, details={**details, "previous_pid": unclean,
                                                                        "previous_stop": "unclean"})


def _mark_lock(fd: int, state: str) -> None:
    """agent.lock says which agent holds it and whether it is running or stopped cleanly (`previous_agent`)."""
    try:
        if os.fstat(fd).st_nlink == 1:  # a hard link to another file is locked but never written
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()} {state}\n".encode(), 0)
    except OSError as exc:  # a full disk: the next start cannot tell a clean stop, nothing else depends on it
        log.warning("could not mark the agent lock %s: %s", state, exc.strerror or exc)


def _agent_answers(path: Path) -> bool:
    """True when something accepts connections on the control socket path (a live agent)."""
    if not path.exists():
        return False
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(1.0)
        try:
            s.connect(str(path))
        except OSError:
            return False
    return True


__all__ = ["AgentStartError", "AgentUsageError", "Node", "NodeGpuView", "reload_config", "server_url"]
