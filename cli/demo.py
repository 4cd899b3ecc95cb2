"""`lynxtop demo`: a SIMULATED node on a laptop: agent, simulated vLLM + GPUs, traffic, and the dashboard.

The demo owns everything it starts and must leave nothing behind: the agent runs in its own process group,
and the demo first asks it to stop serving (POST /v1/stop), then stops the agent, then kills whatever it started
that is still there (an orphaned EngineCore, say): the processes carrying the demo's random token in their
environment, never one that merely names the state directory (an operator's `tail -f DIR/agent.log`).

Should the demo die without that clean-up (SIGKILL, the OOM killer), a watcher process it starts first sees its
end of a pipe close and does the same clean-up, temp directory included (`Lifeline`, `watch`).
"""

from __future__ import annotations

import asyncio
import contextlib
import grp
import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from argparse import Namespace
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from lynxtop.contract.client import AgentClient, AgentRefused, AgentUnreachable
from lynxtop.contract.events import EventKind
from lynxtop.contract.status import ServingState, Status
from lynxtop.contract.terminal import terminal_safe

if TYPE_CHECKING:  # imported when traffic starts: the watcher process (below) has no use for aiohttp's 20 MB
    from lynxtop.sim.loadgen import LoadGenerator

BANNER = ("lynxtop demo: this node is SIMULATED: simulated vLLM serving DeepSeek-V4.1 on 8 simulated H200 GPUs.\n"
          "No GPU is used and no model is loaded; tokens are synthetic. q or Ctrl-C stops everything.")
PROFILES = ("deepseek-v4.1-tp8", "deepseek-v4.1-tp8-fp8kv")
MODEL = "deepseek-ai/DeepSeek-V4.1"
SERVED = "deepseek-v4.1"
STATUS_EVERY_S = 2.0
# The simulator's own net for an EngineCore whose API server died: it ends by itself after this long. The demo's
# own death (SIGKILL) is covered by its watcher (Lifeline), which stops the agent and everything it started.
ORPHAN_TTL_S = 900
DEMO_TOKEN_ENV = "LYNXTOP_DEMO_TOKEN"
WATCH_FLAG = "--watch-demo"  # `python -m lynxtop.cli.demo --watch-demo FD`: the demo's watcher (Lifeline)
PORT_ATTEMPTS = 3  # ports tried for the simulated server, should another process take the one the demo picked
# LYNXTOP_SIM_* variables the demo sets itself or that its profiles' flags override: a user's have no effect
_SIM_VARS_SET = ("LYNXTOP_SIM_STATE_DIR", "LYNXTOP_SIM_ORPHAN_TTL", "LYNXTOP_SIM_STARTUP_SECONDS")


@dataclass
class DemoPaths:
    root: Path
    config: Path
    database: Path
    socket: Path
    logs: Path
    sim_state: Path
    agent_log: Path

    @classmethod
    def under(cls, root: Path) -> DemoPaths:
        return cls(root=root, config=root / "config.toml", database=root / "lynxtop.db", socket=root / "agent.sock",
                   logs=root / "logs", sim_state=root / "sim", agent_log=root / "agent.log")


def sim_executable() -> Path:
    """The `lynxtop-sim-vllm` script installed next to this Python (profiles need an absolute executable)."""
    for cand in (Path(sys.executable).parent / "lynxtop-sim-vllm", Path(shutil.which("lynxtop-sim-vllm") or "")):
        if cand.name and cand.is_file() and os.access(cand, os.X_OK):
            return cand.absolute()
    raise FileNotFoundError("the simulator's console script lynxtop-sim-vllm is not installed next to "
                            f"{sys.executable}; reinstall lynxtop (pip install -e .)")


def free_port() -> int:
    """A loopback port nobody listens on now; another process may take it before the simulator binds it, which
    the agent's autostart refuses and `Demo.start_serving` answers with another port."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def port_taken(port: int) -> bool:
    """Another process holds the loopback port (a bind fails): what the simulated server would run into."""
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return True
    return False


def _group_name() -> str:
    """The operators' group for the socket: on a laptop, the user's own primary group."""
    try:
        name = grp.getgrgid(os.getgid()).gr_name
    except KeyError:
        return ""
    return name if re.fullmatch(r"[a-z_][a-z0-9_\-]{0,31}", name) else ""


def _toml_str(value: str | Path) -> str:
    return '"' + str(value).replace("\\", "\\\\").replace('"', '\\"') + '"'


def config_text(paths: DemoPaths, *, port: int, startup_seconds: float, executable: Path) -> str:
    """The demo's config: two simulator profiles on the same port (one runs at a time), everything in the state dir."""
    group = _group_name()
    sim_args = f'["--sim-startup-seconds", "{startup_seconds:g}", "--sim-state-dir", {_toml_str(paths.sim_state)}]'
    common = f"""executable = {_toml_str(executable)}
model = "{MODEL}"
served_model_name = "{SERVED}"
host = "127.0.0.1"
port = {port}
tensor_parallel_size = 8
enable_expert_parallel = true
gpu_memory_utilization = 0.9
max_model_len = 131072
max_num_batched_tokens = 2048
attention_backend = "FLASHMLA"
trust_remote_code = true
shutdown_timeout_s = 5
stop_grace_s = 20
readiness_timeout_s = {max(120.0, startup_seconds * 10):g}
extra_args = {sim_args}"""
    return f"""# Written by `lynxtop demo`: a SIMULATED node (simulated vLLM and GPUs). Safe to delete.
[agent]
database = {_toml_str(paths.database)}
socket = {_toml_str(paths.socket)}
{f'socket_group = "{group}"' if group else ''}
log_dir = {_toml_str(paths.logs)}
sample_interval_s = 1.0
fake_nvml = "sim"
default_profile = "{PROFILES[0]}"
autostart = true
# an agent that ends for whatever reason (the demo's watcher SIGTERMs it) stops the simulated server with it
live_restore = false
hang_timeout_s = 30
backoff_initial_s = 2
gpu_release_timeout_s = 30

[[profile]]
name = "{PROFILES[0]}"
description = "SIMULATED DeepSeek-V4.1 (284B MoE), TP8 on 8×H200, BF16 KV cache"
max_num_seqs = 8
kv_cache_dtype = "auto"
{common}

[[profile]]
name = "{PROFILES[1]}"
description = "SIMULATED DeepSeek-V4.1 (284B MoE), TP8 on 8×H200, FP8 KV cache (about twice the tokens)"
max_num_seqs = 12
kv_cache_dtype = "fp8"
{common}
"""


# ---------------------------------------------------------------------------------------------- processes


def _proc_mentions(pid: int, needle: str) -> bool:
    for name in ("cmdline", "environ"):
        try:
            with open(f"/proc/{pid}/{name}", "rb") as f:
                if needle.encode() in f.read():
                    return True
        except OSError:
            continue
    return False


def _ancestors() -> set[int]:
    out, pid = set(), os.getpid()
    while pid > 1 and pid not in out:
        out.add(pid)
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                raw = f.read().decode("ascii", "replace")
            pid = int(raw[raw.rfind(")") + 2:].split()[1])
        except (OSError, ValueError, IndexError):
            break
    return out


def _live(pid: int) -> bool:
    """Not a zombie (a zombie's /proc entries stay until its parent reaps it)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read().decode("ascii", "replace")
    except OSError:
        return False
    return raw[raw.rfind(")") + 2:].split()[:1] not in (["Z"], ["X"])


def _pids(spare: set[int]) -> list[int]:
    return [int(n) for n in os.listdir("/proc") if n.isdigit() and int(n) not in spare]


def processes_of(root: Path) -> list[int]:
    """Live processes whose command line or environment names the demo's state directory: for checks that the
    demo left nothing behind, never for choosing what to kill (an operator's `tail -f DIR/agent.log` names it too).

    The demo itself and its ancestors (a shell that ran `lynxtop demo --state-dir DIR`) are never included.
    """
    needle = str(root).rstrip("/") + "/"
    return [pid for pid in _pids(_ancestors()) if _live(pid) and _proc_mentions(pid, needle)]


def _has_token(pid: int, token: str) -> bool:
    """`pid`'s environment holds this demo's token: it was started by the demo or by what the demo started (the
    agent, vLLM, its workers inherit the environment). Nobody types a random token by accident."""
    entry = f"{DEMO_TOKEN_ENV}={token}".encode()
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return entry in f.read().split(b"\0")
    except OSError:
        return False


def processes_started_by(token: str) -> list[int]:
    """Live processes carrying the demo's token (`Demo.token`) in their environment."""
    return [pid for pid in _pids(_ancestors()) if _live(pid) and _has_token(pid, token)]


def kill_all(token: str, grace_s: float = 5.0) -> list[int]:
    """SIGTERM, then SIGKILL, every process the demo started (its token in their environment), and the process
    group of one that leads a group it made; returns the pids that needed it. A process that merely names the
    state directory (`tail -f DIR/agent.log`, `watch sqlite3 DIR/lynxtop.db`) and its shell are left alone."""
    victims = processes_started_by(token)
    if not victims:
        return []
    own_group = os.getpgrp()
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in processes_started_by(token):
            with contextlib.suppress(OSError):
                pgid = os.getpgid(pid)
                if pgid != own_group and pgid == pid:  # a leader with the token: its group is the demo's
                    os.killpg(pgid, sig)
                else:
                    os.kill(pid, sig)
        deadline = time.monotonic() + (grace_s if sig == signal.SIGTERM else 2.0)
        while processes_started_by(token) and time.monotonic() < deadline:
            time.sleep(0.1)
        if not processes_started_by(token):
            break
    return victims


def sim_variables(environ: Mapping[str, str]) -> dict[str, str]:
    """The user's LYNXTOP_SIM_* variables that reach the simulator through the agent (docs/simulator.md: a
    feature, e.g. LYNXTOP_SIM_FAIL=hang-after=60 for a demo of a hang), so the demo can name them."""
    return {k: v for k, v in sorted(environ.items()) if k.startswith("LYNXTOP_SIM_") and k not in _SIM_VARS_SET}


DEMO_PREFIX = "lt-demo-"  # of the demo's state directory in the temp dir


def make_temp_root() -> Path:
    """The demo's state directory when no --state-dir is given; DemoSetupError says where and what to do."""
    try:
        # short: a run's TMPDIR, <root>/run-tmp/<8 hex>, must leave room for socket paths (agent/serving/runtmp.py
        # MAX_LEN); "/tmp/lynxtop-demo-XXXXXXXX/..." was 4 bytes over and every start said so
        return Path(tempfile.mkdtemp(prefix=DEMO_PREFIX))
    except OSError as exc:  # no usable temp dir anywhere (gettempdir), or the chosen one refuses the mkdir
        where = f" in {tempfile.tempdir}" if tempfile.tempdir else ""
        raise DemoSetupError(f"cannot create a temporary state directory{where}: {exc.strerror or exc}; set TMPDIR "
                             "to a writable directory, or pass --state-dir DIR") from None


class DemoSetupError(Exception):
    """The environment cannot hold a demo (no usable temp directory): a usage error, status 2."""


class DashboardError(RuntimeError):
    """The dashboard failed or crashed: the demo still cleans up, then exits 1."""


class Lifeline:
    """A pipe from the demo to a watcher process, so what the demo started ends with it however it ends.

    The demo holds the write end; the watcher (`watch`, in its own session: a Ctrl-C or `kill -9 -PGID` meant
    for the demo does not reach it) blocks on the read end. The demo tells it the token, the state directory and
    the agent's pid, and "done" once its own clean-up is over. EOF without "done" means the demo died (SIGKILL,
    the OOM killer): the watcher then does the clean-up itself. A pipe, not PR_SET_PDEATHSIG, which fires when
    the parent *thread* ends and would take the agent down with whichever thread happened to start it.
    """

    def __init__(self) -> None:
        self.proc: subprocess.Popen[bytes] | None = None
        self._fd: int | None = None

    def start(self, **job: Any) -> None:
        read, write = os.pipe()  # both close-on-exec: only the watcher gets the read end (pass_fds)
        try:
            self.proc = subprocess.Popen([sys.executable, "-m", "lynxtop.cli.demo", WATCH_FLAG, str(read)],
                                         pass_fds=(read,), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                         cwd="/", start_new_session=True)
        except BaseException:
            os.close(write)
            raise
        finally:
            os.close(read)
        self._fd = write
        self.tell(**job)

    def tell(self, **fields: Any) -> None:
        if self._fd is None:
            return
        with contextlib.suppress(OSError):  # the watcher is gone: nothing more to tell
            os.write(self._fd, json.dumps(fields).encode() + b"\n")

    def release(self) -> None:
        """The demo cleaned up itself: the watcher ends without doing anything."""
        self.tell(done=True)
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        if self.proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=5)


def watch(fd: int, err: IO[str] | None = None) -> int:
    """The watcher: wait for the demo's end of the lifeline to close; unless it said "done", stop the agent
    (SIGTERM: with live_restore off it stops the simulated server first), kill what the demo started that still
    runs, remove the temp state directory, and say so."""
    for sig in (signal.SIGINT, signal.SIGHUP):  # the demo's terminal going away is the demo's business
        signal.signal(sig, signal.SIG_IGN)
    job: dict[str, Any] = {}
    try:
        with open(fd, "rb") as lifeline:
            for line in lifeline:
                with contextlib.suppress(ValueError):
                    job.update(json.loads(line))
                if job.get("done"):
                    return 0
    except OSError as exc:
        print(f"lynxtop demo watcher: cannot read the demo's lifeline (descriptor {fd}): {exc.strerror}",
              file=err or sys.stderr)
        return 2
    token, root = job.get("token"), job.get("root")
    if not isinstance(token, str) or not isinstance(root, str):
        return 0  # the demo died before it started anything
    agent = job.get("agent")
    stopped = isinstance(agent, int) and _has_token(agent, token)
    if stopped:
        with contextlib.suppress(OSError):
            os.killpg(agent, signal.SIGTERM)
        deadline = time.monotonic() + 40  # the agent's stop of the simulated server: shutdown_timeout + grace
        while _live(agent) and time.monotonic() < deadline:
            time.sleep(0.2)
    stopped = bool(kill_all(token)) or stopped
    if job.get("keep"):
        files = f"its database, config and logs are kept in {root}"
    else:
        shutil.rmtree(root, ignore_errors=True)
        files = f"removed {root}" if not os.path.exists(root) else f"could not remove {root}"
    what = "stopped the agent and the simulated server" if stopped else "found nothing of it running"
    with contextlib.suppress(OSError, ValueError):
        print(terminal_safe(f"lynxtop demo: the demo (pid {job.get('demo')}) ended without stopping its SIMULATED "
                            f"node; its watcher {what} and {files}"), file=err or sys.stderr, flush=True)
    return 0


class Demo:
    def __init__(self, root: Path, *, startup_seconds: float, keep: bool, out: IO[str] | None = None):
        self.paths = DemoPaths.under(root)
        self.startup_seconds = startup_seconds
        self.keep = keep
        self.out = out or sys.stdout
        self.port = free_port()
        self.token = secrets.token_hex(16)  # in the environment of everything the demo starts: see kill_all
        self.agent: subprocess.Popen[bytes] | None = None
        self._agent_log: IO[bytes] | None = None
        self.lifeline = Lifeline()
        self._traffic_stop: asyncio.Event | None = None
        self._traffic_loop: asyncio.AbstractEventLoop | None = None
        self._traffic_thread: threading.Thread | None = None
        self.loadgen: LoadGenerator | None = None

    def say(self, text: str) -> bool:
        """Print a line; False if the output is gone (SIGHUP, a closed SSH pipe): never abort the clean-up."""
        try:
            print(text, file=self.out, flush=True)
        except (OSError, ValueError):
            return False
        return True

    # -- set-up

    def write_config(self) -> Path:
        p = self.paths
        for d in (p.root, p.logs, p.sim_state):
            # private whatever the umask: the agent refuses a state or log directory others may write (0775
            # under a umask of 0002)
            d.mkdir(parents=True, exist_ok=True, mode=0o750)
        p.config.write_text(config_text(p, port=self.port, startup_seconds=self.startup_seconds,
                                        executable=sim_executable()), encoding="utf-8")
        return p.config

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env["LYNXTOP_SIM_STATE_DIR"] = str(self.paths.sim_state)  # the agent's fake NVML reads it
        env["LYNXTOP_SIM_ORPHAN_TTL"] = str(ORPHAN_TTL_S)
        env[DEMO_TOKEN_ENV] = self.token
        # the simulated EngineCore and workers retitle themselves as vLLM's do, and setproctitle overwrites their
        # /proc/PID/environ with the title's room; its own switch keeps it, so the demo's token still finds them
        env["SPT_NOENV"] = "1"
        env.pop("LYNXTOP_CONFIG", None)
        return env

    def start_watcher(self) -> None:
        """The Lifeline's watcher, before anything else starts; without one the demo runs, and says what a kill
        of it would leave."""
        try:
            self.lifeline.start(token=self.token, root=str(self.paths.root), keep=self.keep, demo=os.getpid())
        except OSError as exc:
            self.say(terminal_safe(f"lynxtop demo: warning: cannot start the watcher that cleans up should the demo "
                                   f"be killed ({exc}); a SIGKILL of the demo would leave its processes running"))

    def start_agent(self) -> None:
        if self._agent_log is None:
            self._agent_log = open(self.paths.agent_log, "ab")  # noqa: SIM115 - closed in teardown
        cmd = [sys.executable, "-m", "lynxtop", "agent", "--config", str(self.paths.config)]
        self.agent = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=self._agent_log,
                                      stderr=subprocess.STDOUT, env=self.env(), start_new_session=True)
        self.lifeline.tell(agent=self.agent.pid)

    def start_serving(self) -> None:
        """Start the agent, which autostarts the first profile. The port was free when the demo picked it; if
        another process took it since, the agent refuses (port in use) and the demo moves to another port."""
        for attempt in range(1, PORT_ATTEMPTS + 1):
            self.start_agent()
            self.wait_agent()
            refused = self.autostart_refusal()
            if refused is None:
                return
            if not port_taken(self.port) or attempt == PORT_ATTEMPTS:
                raise RuntimeError(f"the agent did not start the simulated server: {refused}")
            taken = self.port
            self.stop_agent()
            self.port = free_port()
            self.write_config()
            self.say(terminal_safe(f"lynxtop demo: port {taken}, free when the demo picked it, is now in use by "
                                   f"another process; moving the simulated server to port {self.port}"))

    def autostart_refusal(self, timeout_s: float = 20.0) -> str | None:
        """The agent's message if its autostart was refused or held (a port in use, say); None once serving
        started, or if neither is known within timeout_s (the status lines and the dashboard show the rest)."""
        refusals = (EventKind.AGENT_AUTOSTART_FAILED, EventKind.AGENT_AUTOSTART_HELD)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                client = self.client(2.0)
                st = client.status()
                if st.serving.state != ServingState.STOPPED:
                    return None
                for event in client.events(since_ms=st.agent.started_ms):
                    if event.kind in refusals:
                        return event.message
            except (AgentRefused, AgentUnreachable):
                pass  # the agent's exit is wait_agent's and the status lines' to report
            if self.agent is not None and self.agent.poll() is not None:
                return None
            time.sleep(0.3)
        return None

    def wait_agent(self, timeout_s: float = 60.0) -> None:
        deadline = time.monotonic() + timeout_s
        last = ""
        while time.monotonic() < deadline:
            if self.agent is not None and self.agent.poll() is not None:
                raise RuntimeError(f"the agent exited with status {self.agent.returncode}; its log "
                                   f"({self.paths.agent_log}) ends with:\n{self.agent_log_tail()}")
            try:
                self.client(2.0).status()
                return
            except AgentRefused as exc:
                last = f"HTTP {exc.status}"
            except AgentUnreachable as exc:
                last = str(exc)
            time.sleep(0.2)
        raise RuntimeError(f"the agent did not answer on {self.paths.socket} within {timeout_s:g} s ({last})")

    def agent_log_tail(self, lines: int = 15) -> str:
        try:
            return "\n".join(self.paths.agent_log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    # -- traffic

    def start_traffic(self, time_scale: float = 1.0) -> None:
        # A healthy node first; the dashboard's load key raises it to the pattern that breaches the SLA.
        from lynxtop.sim.loadgen import DEMO_CALM, DEMO_PATTERN, LoadGenerator

        self.loadgen = LoadGenerator(f"http://127.0.0.1:{self.port}", pattern=DEMO_CALM, time_scale=time_scale)
        self.loadgen.raised_pattern = DEMO_PATTERN
        ready = threading.Event()

        def main() -> None:
            loop = asyncio.new_event_loop()
            self._traffic_loop = loop
            self._traffic_stop = asyncio.Event()
            ready.set()
            assert self.loadgen is not None
            try:
                loop.run_until_complete(self.loadgen.run(self._traffic_stop))
            finally:
                loop.close()

        self._traffic_thread = threading.Thread(target=main, name="demo-traffic", daemon=True)
        self._traffic_thread.start()
        ready.wait(5)

    def toggle_load(self) -> str:
        """The dashboard's load key (demo only): raise the simulated load until the SLA breaches, or lower it."""
        if self.loadgen is None:
            return "no simulated traffic running"
        self.loadgen.set_raised(not self.loadgen.raised)
        return ("load raised: bursts of 20 and a long context; expect an SLA breach" if self.loadgen.raised
                else "load lowered to the healthy default")

    def stop_traffic(self) -> None:
        if self._traffic_loop is not None and self._traffic_stop is not None:
            with contextlib.suppress(RuntimeError):
                self._traffic_loop.call_soon_threadsafe(self._traffic_stop.set)
        if self._traffic_thread is not None:
            self._traffic_thread.join(timeout=10)

    # -- status

    def client(self, timeout_s: float) -> AgentClient:
        return AgentClient(self.paths.socket, timeout_s)

    def status_line(self, st: Status) -> str:
        """One plain line of the node's state, marked SIMULATED; escaped, as it carries the agent's text (a stop
        reason names other processes' command lines)."""
        srv, sm, gpus = st.serving, st.serving_metrics.metric, st.gpus

        def num(v: Any, fmt: str, unit: str = "") -> str:
            return "N/A" if v is None else f"{v:{fmt}}{unit}"

        mem = sum(g.metric("mem_used_bytes") or 0 for g in gpus) / 2**30
        util = [g.metric("util_gpu_pct") for g in gpus if g.metric("util_gpu_pct") is not None]
        power = sum(g.metric("power_w") or 0 for g in gpus)
        if srv.state == ServingState.STARTING:
            note = srv.phase or ""
        else:  # why it is stopped, backing off or degraded (a port another process holds, say)
            note = "" if srv.state == ServingState.READY else srv.reason[:200]
        phase = f" ({note})" if note else ""
        traffic = self.loadgen.stats if self.loadgen else None
        avg = num(sum(util) / len(util) if util else None, ".0f", "%")
        done = traffic.completed if traffic else 0
        line = (f"[SIMULATED] {time.strftime('%H:%M:%S')} serving={srv.state}{phase} profile={srv.profile or '-'} "
                f"| run {num(sm('requests_running'), 'd')} wait {num(sm('requests_waiting'), 'd')} "
                f"| gen {num(sm('generation_tokens_per_s'), '.1f', ' tok/s')} "
                f"| TTFT p99 {num(sm('ttft_p99_ms'), '.0f', ' ms')} "
                f"TPOT p99 {num(sm('tpot_p99_ms'), '.0f', ' ms')} SLA {st.sla.state} "
                f"| GPUs {len(gpus)} util {avg} (avg) "
                f"mem {mem:.0f} GiB power {power:.0f} W (sums over {len(gpus)} GPUs) "
                f"| traffic {traffic.phase if traffic else '-'} done {done}")
        return terminal_safe(line)

    def print_status_until(self, deadline: float | None) -> None:
        """A status line every few seconds until the deadline, the agent's exit, or the output going away (an SSH
        session without a terminal that closed: nobody reads, and nobody could press Ctrl-C)."""
        while deadline is None or time.monotonic() < deadline:
            try:
                line = self.status_line(self.client(2.0).status())
            except AgentRefused as exc:
                line = f"[SIMULATED] agent answered HTTP {exc.status}"
            except AgentUnreachable as exc:
                line = terminal_safe(f"[SIMULATED] agent unreachable: {exc}")
            if not self.say(line):
                return
            if self.agent is not None and self.agent.poll() is not None:
                self.say(f"the agent exited with status {self.agent.returncode}; log tail:\n"
                         + terminal_safe(self.agent_log_tail(), lines=True))
                return
            left = STATUS_EVERY_S if deadline is None else min(STATUS_EVERY_S, deadline - time.monotonic())
            if left > 0:
                time.sleep(left)

    # -- teardown

    def stop_serving(self, timeout_s: float = 30.0) -> None:
        """Ask the agent to stop the simulated server and wait for it: its own exit would too (live_restore is off
        in the demo's config), but an agent that hangs in its exit would not, and this says what it is doing."""
        try:
            self.client(5.0).action("stop")
        except AgentRefused:
            pass  # nothing to stop, or already stopping: wait for the state below
        except AgentUnreachable:
            return
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                if self.client(2.0).status().serving.state in (ServingState.STOPPED, ServingState.CRASH_LOOP):
                    return
            except AgentRefused:
                pass
            except AgentUnreachable:
                return
            time.sleep(0.2)

    def stop_agent(self, timeout_s: float = 15.0) -> None:
        if self.agent is None:
            return
        with contextlib.suppress(OSError):
            os.killpg(self.agent.pid, signal.SIGTERM)
        try:
            self.agent.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(OSError):
                os.killpg(self.agent.pid, signal.SIGKILL)
            self.agent.wait(timeout=5)
        with contextlib.suppress(OSError):  # the group may outlive its leader
            os.killpg(self.agent.pid, signal.SIGKILL)

    def teardown(self) -> list[int]:
        self.say("lynxtop demo: stopping traffic, the simulated server and the agent (a few seconds)...")
        self.stop_traffic()
        self.stop_serving()
        self.stop_agent()
        leftovers = kill_all(self.token)
        if self._agent_log is not None:
            self._agent_log.close()
        if not self.keep:
            shutil.rmtree(self.paths.root, ignore_errors=True)
        else:
            self.say(terminal_safe(f"lynxtop demo: stopped; database, config and logs kept in {self.paths.root}"))
        self.lifeline.release()
        return leftovers


def _tui_app() -> Any:
    try:
        from lynxtop.tui.app import LynxtopApp
    except ImportError:
        return None
    return LynxtopApp


def run(args: Namespace) -> int:
    """Handler of `lynxtop demo`."""
    duration = getattr(args, "duration", None)
    if duration is not None and duration <= 0:
        print(f"lynxtop demo: --duration must be > 0 seconds, got {duration:g}", file=sys.stderr)
        return 2
    startup = getattr(args, "startup_seconds", 8.0)
    if startup is None or startup < 0:
        print(f"lynxtop demo: --startup-seconds must be >= 0, got {startup}", file=sys.stderr)
        return 2
    try:
        import lynxtop.agent.node  # noqa: F401 - the demo needs the agent
    except ImportError as exc:
        print(f"lynxtop demo: the agent is not available in this build ({exc})", file=sys.stderr)
        return 1
    given = getattr(args, "state_dir", None)
    if given:
        root = Path(given).expanduser().absolute()
        if root.exists() and not root.is_dir():
            print(f"lynxtop demo: --state-dir {root} exists and is not a directory", file=sys.stderr)
            return 2
    else:
        try:
            root = make_temp_root()
        except DemoSetupError as exc:
            print(terminal_safe(f"lynxtop demo: {exc}"), file=sys.stderr)
            return 2
    try:
        demo = Demo(root, startup_seconds=startup, keep=bool(given))
        demo.write_config()
    except OSError as exc:
        print(terminal_safe(f"lynxtop demo: cannot prepare {root}: {exc}"), file=sys.stderr)
        if not given:
            shutil.rmtree(root, ignore_errors=True)
        return 1
    print(BANNER, flush=True)
    print(terminal_safe(f"lynxtop demo: state in {root}; agent log {demo.paths.agent_log}"), flush=True)
    passed = sim_variables(os.environ)
    if passed:
        print(terminal_safe("lynxtop demo: passing your " + " ".join(f"{k}={v}" for k, v in passed.items())
                            + " to the simulator (docs/simulator.md); unset " + ("it" if len(passed) == 1 else "them")
                            + " for the usual demo"), flush=True)
    no_tui = bool(getattr(args, "no_tui", False))
    no_terminal = None if no_tui else _no_terminal()
    if no_terminal and no_terminal.startswith("TERM"):
        print(f"lynxtop demo: {no_terminal}: this terminal cannot draw the dashboard, so printing a status line "
              f"every {STATUS_EVERY_S:g} s instead; Ctrl-C or SIGTERM stops the demo. For the dashboard set TERM "
              "to the terminal's type (TERM=xterm-256color); --no-tui asks for these lines.", flush=True)
    elif no_terminal:
        print(f"lynxtop demo: no terminal ({no_terminal}), so no dashboard: printing a status line every "
              f"{STATUS_EVERY_S:g} s instead; Ctrl-C or SIGTERM stops the demo. For the dashboard run it in a "
              "terminal (over SSH: ssh -t HOST lynxtop demo); --no-tui asks for these lines.", flush=True)
    deadline = time.monotonic() + duration if duration else None
    previous_term = signal.signal(signal.SIGTERM, _term_as_interrupt)
    previous_hup = signal.signal(signal.SIGHUP, _term_as_interrupt)  # the SSH session went away
    # Ctrl-C is how the demo is stopped: an "ignore" inherited from whatever started it (a harness, a script's
    # background job) would leave a foreground demo that only SIGTERM can end
    previous_int = signal.signal(signal.SIGINT, signal.default_int_handler)
    code = 0
    try:
        demo.start_watcher()
        demo.start_serving()
        demo.start_traffic()
        app_cls = None if no_tui or no_terminal else _tui_app()
        if app_cls is None:
            if not no_tui and not no_terminal:
                print("lynxtop demo: the dashboard is not available in this build; printing status lines.", flush=True)
            demo.print_status_until(deadline)
        else:
            _run_dashboard(app_cls, demo, duration)
    except KeyboardInterrupt:
        pass
    except RuntimeError as exc:  # the agent did not come up or refused, the dashboard failed: said, then clean-up
        with contextlib.suppress(OSError, ValueError):
            print(terminal_safe(f"lynxtop demo: {exc}", lines=True), file=sys.stderr, flush=True)
        code = 1
    finally:
        # finish the clean-up even if asked twice: an interrupted teardown is what leaves orphans behind
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        try:
            demo.teardown()
        finally:
            signal.signal(signal.SIGTERM, previous_term)
            signal.signal(signal.SIGINT, previous_int)
            signal.signal(signal.SIGHUP, previous_hup)
    return code


def _term_as_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def _no_terminal() -> str | None:
    """Why the dashboard cannot run here (None: it can): it reads keys from stdin and draws on stderr, on a
    terminal that moves its cursor, as `lynxtop dashboard` checks; drawn into a pipe or a dumb terminal it is
    kilobytes of escape codes a second."""
    for name, stream in (("stdin", sys.stdin), ("stderr", sys.__stderr__)):
        try:
            tty = stream is not None and stream.isatty()
        except ValueError:  # closed
            tty = False
        if not tty:
            return f"{name} is not a terminal"
    from lynxtop.cli.dashboard_cmd import term_problem

    return term_problem(os.environ)  # TERM unset or dumb: a terminal that cannot draw it


def _run_dashboard(app_cls: Any, demo: Demo, duration: float | None) -> None:
    """Run the dashboard until q, Ctrl-C or the duration; DashboardError if it failed or crashed (Textual has
    then shown the error), so that the demo exits 1 after its clean-up."""
    app = app_cls(socket_path=str(demo.paths.socket), database_path=str(demo.paths.database), readonly=False,
                  utc=False, demo_load=demo.toggle_load, simulated=True)  # SIMULATED from the first frame
    timer = None
    if duration:
        timer = threading.Timer(duration, lambda: app.call_from_thread(app.exit))
        timer.daemon = True
        timer.start()
    try:
        app.run()
    except Exception as exc:  # noqa: BLE001 - the driver could not start, say: one line, then the clean-up
        raise DashboardError(f"the dashboard failed ({type(exc).__name__}: {exc})") from None
    finally:
        if timer is not None:
            timer.cancel()
    code = app.return_code or 0
    if code:
        raise DashboardError(f"the dashboard ended with an error (status {code}; the error is shown above); "
                             "the demo stops the simulated node all the same")


if __name__ == "__main__":  # the watcher's entry, started by Lifeline.start only
    if len(sys.argv) != 3 or sys.argv[1] != WATCH_FLAG or not sys.argv[2].isdigit():
        print(f"usage: python -m lynxtop.cli.demo {WATCH_FLAG} FD (the demo's own watcher; run `lynxtop demo`)",
              file=sys.stderr)
        sys.exit(2)
    sys.exit(watch(int(sys.argv[2])))
