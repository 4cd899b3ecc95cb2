"""Typed configuration: TOML file -> validated `Config` with `[agent]`, `[sla]` and `[[profile]]`.

Every problem is reported with the file, the dotted key and what is wrong, all at once, so an operator
fixes a config in one pass instead of one error per restart. Nothing here has side effects.
"""

from __future__ import annotations

import contextlib
import grp
import json
import math
import os
import pwd
import re
import shutil
import stat
import sys
import tomllib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from lynxtop.contract.models import BUILTIN_MODELS, GIB, ModelSpec
from lynxtop.contract.redact import is_secret_name, mask_url_credentials, redact_argv, redact_env
from lynxtop.contract.terminal import first_control, terminal_safe

DEFAULT_CONFIG_PATH = Path("/etc/lynxtop/config.toml")
CONFIG_ENV = "LYNXTOP_CONFIG"

# Environment a profile may pass to vLLM. Anything that changes what code runs (LD_PRELOAD, PYTHONPATH…) is refused.
# TMPDIR: a profile's own replaces the run's directory the agent makes (agent/serving/runtmp.py).
ENV_ALLOWED_EXACT = {"CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "OMP_NUM_THREADS", "TOKENIZERS_PARALLELISM",
                     "TMPDIR"}
ENV_ALLOWED_PREFIXES = ("VLLM_", "HF_", "NCCL_", "RAY_", "TORCH_SYMM_MEM_", "NVSHMEM_")
ENV_FORBIDDEN = {"LD_PRELOAD", "LD_LIBRARY_PATH", "PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "PATH"}
# A portable environment variable name (POSIX: letters, digits, underscore, not starting with a digit). A name
# with '=' or NUL cannot be passed to execve at all: it would fail at spawn instead of in `config check`.
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")

# sockaddr_un.sun_path holds 107 bytes plus the NUL, and the agent first binds a temporary name beside the
# socket (".NAME.PID", agent/api/routes.py) and renames it into place: that name is 2 + up to 7 (pid_max 4194304)
# bytes longer, so the configured path may have at most 107 - 9 bytes.
SUN_PATH_MAX = 107
SOCKET_PATH_MAX = SUN_PATH_MAX - len("..") - len(str(4194304))

KV_CACHE_DTYPES = ("auto", "fp8", "fp8_e4m3", "fp8_e5m2", "fp8_inc", "bfloat16")
ATTENTION_BACKENDS = (
    "FLASHMLA", "FLASHMLA_SPARSE", "CUTLASS_MLA", "FLASH_ATTN_MLA", "FLASHINFER_MLA", "TRITON_MLA",
    "FLASH_ATTN", "FLASHINFER", "TRITON_ATTN", "TORCH_SDPA", "CPU_ATTN",
)
EXECUTOR_BACKENDS = ("mp", "ray", "uni")
ROLES = ("single", "head", "worker")
# `ray start` options the typed [ray] keys own (and --block, which supervision needs): not in ray.extra_args
RAY_OWNED_FLAGS = ("--head", "--address", "--port", "--block", "--node-ip-address", "--num-gpus", "--num-cpus",
                   "--dashboard-host", "--dashboard-port", "--include-dashboard", "--temp-dir")
# `ray start` options whose value is a secret: not in ray.extra_args (argv is in every `ps`, and printed and stored)
RAY_SECRET_FLAGS = ("--redis-password",)


class ConfigError(Exception):
    """One or more problems in a config file; `problems` holds one line each: 'file: key: problem'."""

    def __init__(self, problems: list[str]):
        super().__init__("\n".join(problems))
        self.problems = problems


@dataclass(frozen=True)
class Retention:
    raw_days: float = 7
    minute_days: float = 90
    hour_days: float = 730


@dataclass(frozen=True)
class AgentConfig:
    database: Path
    socket: Path
    socket_group: str = "lynxtop"
    log_dir: Path | None = None  # per-run vLLM logs; default: <database dir>/logs
    sample_interval_s: float = 1.0
    scrape_interval_s: float = 0.0  # /metrics: 0 = every sample, else at most this often (GPUs 10 Hz, scrape 1 Hz)
    gpm: bool = True  # GPM shares counters with DCGM profiling: turn off where dcgm-exporter profiles
    live_restore: bool = True  # serving survives an agent restart; stopping it is an explicit `lynxtop stop`
    metrics_listen: str = ""  # "host:port" for the read-only Prometheus endpoint; empty = off
    default_profile: str = ""  # started when the agent starts with nothing adopted; empty = none
    autostart: bool = False
    hang_timeout_s: float = 60.0
    # a loading run whose log has not grown for this long is told once (serving.load_stalled: a hung read, say), never
    # stopped for it (readiness_timeout_s is the only stop of a load); 0: never told
    load_stall_warn_s: float = 300.0
    restart_on_hang: bool = False
    # a ready run idle this long (no request running or waiting, no token) gets one 1-token completion, which must
    # be answered within hang_timeout_s (agent/serving/idleprobe.py): an engine hung in its first step after an
    # idle spell reads 0 running, 0 waiting for ever, and the counters alone never judge it; 0: off
    idle_probe_s: float = 0.0
    backoff_initial_s: float = 5.0
    backoff_max_s: float = 300.0
    crash_loop_failures: int = 5
    crash_loop_window_s: float = 1800.0
    stable_after_s: float = 600.0
    gpu_release_timeout_s: float = 60.0
    # a start, restart or switch needs this much free space (MiB) on the run log's and the database's file
    # systems: vLLM dies on ENOSPC from its progress bars (agent/serving/diskspace.py); 0 = not checked
    min_free_mb: int = 256
    # the current run's log is capped at this size (MiB) by copy-truncate, its last part kept as <log>.1
    # (agent/serving/logcap.py): a run serves for weeks, its access lines fill a disk; 0 = no cap
    run_log_max_mb: int = 512
    # the run logs in log_dir (with their .1 parts; the current run's counts but is never removed) hold at most
    # this much (MiB) together: the oldest ended runs' go first (launcher.prune_logs, at each start); 0 = count only
    run_logs_max_total_mb: int = 10240
    # this much (MiB) is kept allocated past the end of the current run's log (fallocate, agent/serving/logreserve.py):
    # a disk that fills during a load would otherwise kill it (vLLM's progress bars re-raise ENOSPC); 0 = none
    run_log_reserve_mb: int = 64
    role: str = "single"  # single | head (runs Ray's head and vllm serve) | worker (runs only a Ray worker)
    fake_nvml: str = ""  # scenario name of the simulated GPUs ("h200x8", "a100x8", "sim"); empty = real NVML
    api_max_connections: int = 256  # control socket: open connections at most (idle ones give way)
    metrics_max_connections: int = 64  # metrics_listen: the same
    # metrics_listen also serves runs, events, logs, processes and history to the holder of the token in
    # tcp_token_file (another node's dashboard, docs/cluster.md); off by default
    tcp_reads: bool = False
    tcp_token_file: Path | None = None
    request_timeout_s: float = 10.0  # both listeners: a request's header or body, or an idle connection
    # env names whose values are secret besides *TOKEN*, *KEY*, *SECRET*, *PASSWORD*, *CREDENTIAL* (contract/redact)
    secret_env: tuple[str, ...] = ()
    retention: Retention = field(default_factory=Retention)

    @property
    def run_log_dir(self) -> Path:
        return self.log_dir if self.log_dir is not None else self.database.parent / "logs"


@dataclass(frozen=True)
class RayConfig:
    """`[ray]`: the node's `ray start --block`, supervised by the agent on the head and worker roles."""

    executable: str = ""  # the `ray` CLI; empty: the one beside the agent's Python, else the first on PATH
    head_address: str = ""  # worker: the head's GCS address, host:port
    port: int = 6379  # head: the GCS port workers join
    node_ip_address: str = ""  # this node's address as the cluster sees it; empty: Ray picks one
    num_gpus: int | None = None  # declared to Ray; unset: Ray counts the node's GPUs
    num_cpus: int | None = None
    dashboard_port: int = 8265  # head: Ray's dashboard and state API, bound to 127.0.0.1 only
    temp_dir: Path | None = None  # Ray's session files; unset: <database dir>/rt (docs/cluster.md)
    view_interval_s: float = 2.0  # head: how often Ray's view of the nodes is read
    stop_grace_s: float = 45.0  # Ray drains for up to 30 s on SIGTERM before it stops its processes
    env: dict[str, str] = field(default_factory=dict)
    extra_args: tuple[str, ...] = ()


@dataclass(frozen=True)
class SlaConfig:
    ttft_p99_ms: float = 2000.0
    tpot_p99_ms: float = 150.0
    window_s: float = 60.0


@dataclass(frozen=True)
class Profile:
    name: str
    executable: str
    model: str
    served_model_name: str = ""
    host: str = "127.0.0.1"
    port: int = 8000
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    data_parallel_size: int = 1
    enable_expert_parallel: bool = False
    gpu_memory_utilization: float | None = None
    max_model_len: int | None = None
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    block_size: int | None = None
    kv_cache_dtype: str | None = None
    attention_backend: str | None = None
    enable_prefix_caching: bool | None = None
    quantization: str | None = None
    trust_remote_code: bool = False
    distributed_executor_backend: str | None = None
    shutdown_timeout_s: int = 30
    extra_args: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)  # after read_secret_env: env_file's and credentials' too
    env_file: Path | None = None  # KEY=VALUE lines kept out of the config (mode 0600/0640; read_env_file)
    env_credentials: dict[str, str] = field(default_factory=dict)  # env name -> systemd credential name
    secret_env: tuple[str, ...] = ()  # names masked beyond the patterns: [agent] secret_env, env_file, credentials
    readiness_timeout_s: float = 1800.0
    stop_grace_s: float = 60.0
    description: str = ""

    @property
    def gpus_needed(self) -> int:
        """GPUs the profile occupies: one per tensor x pipeline x data parallel rank."""
        return self.tensor_parallel_size * self.pipeline_parallel_size * self.data_parallel_size

    @property
    def uses_ray(self) -> bool:
        return self.distributed_executor_backend == "ray"

    def argv(self) -> list[str]:
        """The exact argv of `vllm serve` for this profile; no shell ever sees it."""
        argv = [self.executable, "serve", self.model, "--host", self.host, "--port", str(self.port)]
        if self.served_model_name:
            argv += ["--served-model-name", self.served_model_name]
        for key, flag in _INT_FLAGS:
            value = getattr(self, key)
            if key.endswith("parallel_size") and value == 1:
                continue
            if value is not None:
                argv += [flag, str(value)]
        if self.gpu_memory_utilization is not None:
            argv += ["--gpu-memory-utilization", f"{self.gpu_memory_utilization:g}"]
        if self.enable_expert_parallel:
            argv.append("--enable-expert-parallel")
        if self.kv_cache_dtype:
            argv += ["--kv-cache-dtype", self.kv_cache_dtype]
        if self.attention_backend:
            argv += ["--attention-backend", self.attention_backend]
        if self.enable_prefix_caching is not None:
            argv.append("--enable-prefix-caching" if self.enable_prefix_caching else "--no-enable-prefix-caching")
        if self.quantization:
            argv += ["--quantization", self.quantization]
        if self.trust_remote_code:
            argv.append("--trust-remote-code")
        if self.distributed_executor_backend:
            argv += ["--distributed-executor-backend", self.distributed_executor_backend]
        if self.shutdown_timeout_s:
            argv += ["--shutdown-timeout", str(self.shutdown_timeout_s)]
        argv += list(self.extra_args)
        return argv

    def shown_argv(self) -> list[str]:
        """argv() as it may be served, printed or stored: a URL's credentials masked (vLLM gets argv() itself)."""
        return redact_argv(self.argv())

    def flags(self) -> dict[str, str]:
        """Profile options as flag -> value (for diffs shown before a switch), as shown_argv shows them."""
        out: dict[str, str] = {}
        shown = self.shown_argv()
        argv = shown[3:]
        i = 0
        while i < len(argv):
            tok = argv[i]
            if i + 1 < len(argv) and not argv[i + 1].startswith("--"):
                out[tok] = argv[i + 1]
                i += 2
            else:
                out[tok] = "on"
                i += 1
        out["executable"] = shown[0]
        out["model"] = shown[2]
        for k, v in sorted(self.shown_env().items()):
            out[f"env {k}"] = v
        return out

    def shown_env(self) -> dict[str, str]:
        """The env as it may be served, printed or stored: every secret value masked (`***<short hash>`)."""
        return redact_env(self.env, self.secret_env)


_INT_FLAGS = (
    ("tensor_parallel_size", "--tensor-parallel-size"),
    ("pipeline_parallel_size", "--pipeline-parallel-size"),
    ("data_parallel_size", "--data-parallel-size"),
    ("max_model_len", "--max-model-len"),
    ("max_num_seqs", "--max-num-seqs"),
    ("max_num_batched_tokens", "--max-num-batched-tokens"),
    ("block_size", "--block-size"),
)
# vLLM option strings owned by typed profile keys (flag -> key): setting one again through extra_args would make
# two sources of truth, and vLLM takes the last. Aliases and `--no-` forms are vLLM 0.32's (engine/arg_utils.py;
# booleans are argparse.BooleanOptionalAction). `--uds` is here because vLLM then ignores host and port.
OWNED_FLAGS: dict[str, str] = {flag: key for key, flag in _INT_FLAGS} | {
    "--host": "host", "--port": "port", "--uds": "host/port", "--served-model-name": "served_model_name",
    "--model": "model", "--gpu-memory-utilization": "gpu_memory_utilization",
    "--device-memory-utilization": "gpu_memory_utilization",
    "--enable-expert-parallel": "enable_expert_parallel", "--no-enable-expert-parallel": "enable_expert_parallel",
    "--kv-cache-dtype": "kv_cache_dtype", "--attention-backend": "attention_backend",
    "--enable-prefix-caching": "enable_prefix_caching", "--no-enable-prefix-caching": "enable_prefix_caching",
    "--quantization": "quantization", "--trust-remote-code": "trust_remote_code",
    "--no-trust-remote-code": "trust_remote_code", "--distributed-executor-backend": "distributed_executor_backend",
    "--shutdown-timeout": "shutdown_timeout_s",
    "-tp": "tensor_parallel_size", "-pp": "pipeline_parallel_size", "-dp": "data_parallel_size",
    "-q": "quantization", "-ep": "enable_expert_parallel",
}


def owned_flag_use(token: str) -> str | None:
    """Why `token` (one extra_args item) would set a flag that a typed key owns, or None if it does not.

    vLLM's parser (FlexibleArgumentParser, vllm/utils/argparse_utils.py) turns `_` into `-` in a long flag's name
    (up to the first `.`), splits `--flag=value`, reads `--flag.key v` as `--flag '{"key": v}'`, and, being an
    argparse parser with allow_abbrev left on, expands any unambiguous prefix: `--hos` is `--host`, `-t` is `-tp`.
    So a token is refused when its normalised name is an owned flag or a prefix of one (an ambiguous prefix would
    only make vLLM exit, so it is refused as well), and `-qVALUE` (a one-letter option with its value attached).
    """
    if len(token) < 2 or token[0] != "-" or token == "--" or re.fullmatch(r"-\d*\.?\d+([eE][-+]?\d+)?", token):
        return None  # a value (or a negative number), not a flag
    written = token.split("=", 1)[0]
    if written.startswith("--"):
        name = "--" + written[2:].split(".", 1)[0].replace("_", "-")
        candidates = [f for f in OWNED_FLAGS if f.startswith("--")]
    else:
        name = written
        candidates = [f for f in OWNED_FLAGS if not f.startswith("--")]
        attached = _attached_value(token, name, candidates)
        if attached:
            return attached
    if name in OWNED_FLAGS:
        how = "" if name == written else f" (vLLM reads it as {name})"
        return f"{token}{how} is owned by the typed key {OWNED_FLAGS[name]}"
    return _prefix_use(token, name, candidates)


# vLLM flags whose value is a secret, and the variable vLLM reads it from instead: in argv it would be in every
# `ps`, in the runs' argv and in the API (the env is masked: contract/redact.py).
SECRET_FLAGS = {"--api-key": "VLLM_API_KEY", "--hf-token": "HF_TOKEN"}


def secret_flag_use(token: str) -> str | None:
    """Why `token` (one extra_args item) would put a secret in vLLM's argv, or None; the token is not quoted when it
    carries the value (`--api-key=...`)."""
    if not token.startswith("--"):
        return None
    name = "--" + token.split("=", 1)[0][2:].split(".", 1)[0].replace("_", "-")
    hits = [f for f in SECRET_FLAGS if f.startswith(name) and len(name) > len("--") + 2]
    if not hits:
        return None
    return (f"{name} (vLLM reads it as {hits[0]}) would put a secret in vLLM's command line, which every user "
            f"sees in ps and lynxtop serves and stores; set {SECRET_FLAGS[hits[0]]} in env, env_file or "
            "env_credentials instead (its value is masked)")


# vLLM flags that make it serve HTTPS (uvicorn turns TLS on with either), and vLLM 0.32's other `--ssl-` option strings
# (for its prefix expansion: `--ssl-k` is `--ssl-keyfile`, `--ssl-c` is ambiguous and only makes vLLM exit). The
# agent's health probe and scrape speak plain HTTP to the run (agent/serving/watch.py server_url): with TLS on, no
# readiness answer ever comes and the run is killed at readiness_timeout_s.
TLS_FLAGS = ("--ssl-keyfile", "--ssl-certfile")
_SSL_OPTIONS = (*TLS_FLAGS, "--ssl-ca-certs", "--ssl-cert-reqs", "--ssl-ciphers")


def tls_flag_use(token: str) -> str | None:
    """Why `token` (one extra_args item) would make vLLM serve HTTPS, which the agent cannot probe, or None."""
    if not token.startswith("--"):
        return None
    name = "--" + token.split("=", 1)[0][2:].split(".", 1)[0].replace("_", "-")
    hits = [f for f in _SSL_OPTIONS if f.startswith(name)] if len(name) > len("--ssl-") else []
    if not hits or any(f not in TLS_FLAGS for f in hits) or len(hits) > 1:
        return None
    how = "" if name == hits[0] else f" (vLLM reads it as {hits[0]})"
    return (f"{name}{how} would make vLLM serve HTTPS: TLS termination is not supported by the agent's health probe "
            "and metrics scrape, which speak plain HTTP on the run's host and port, so the run would never be ready; "
            "terminate TLS in a proxy in front of vLLM instead")


# vLLM's `--config FILE.yaml`: its parser (FlexibleArgumentParser._pull_args_from_config) reads the YAML's keys as
# long flags when the run starts. Those flags are never seen by this validation (owned, TLS and secret flags would all
# pass), and the file could change between `config check` and a start, so the option is refused in every spelling
# vLLM's parser reads as it. `--conf` is the shortest prefix of it no other vLLM 0.32 flag but `--config-format` shares
# (`--con` is also `--convert`): vLLM exits on the ambiguity, and a vLLM without --config-format would take it.
CONFIG_FILE_FLAG = "--config"
_CONFIG_FILE_SHORTEST = "--conf"


def config_file_use(token: str, following: str | None = None) -> str | None:
    """Why `token` (one extra_args item; `following`: the item after it) would hand vLLM a config file, or None.

    Refused rather than expanded here: a YAML read at check time could differ from the one vLLM reads at start."""
    if not token.startswith("--"):
        return None
    written, eq, value = token.partition("=")
    name = "--" + written[2:].split(".", 1)[0].replace("_", "-")
    if not (CONFIG_FILE_FLAG.startswith(name) and name.startswith(_CONFIG_FILE_SHORTEST)):
        return None
    file = value if eq else following
    if written == CONFIG_FILE_FLAG and file and not file.startswith("-"):
        shown = f"{CONFIG_FILE_FLAG} {file}"
    else:
        how = "a prefix of" if name != CONFIG_FILE_FLAG else "read by vLLM as" if name != written else ""
        shown = f"{written} ({how} {CONFIG_FILE_FLAG})" if how else written
    return (f"{shown} hands vLLM a config file (YAML whose keys it reads as flags when the run starts): those flags "
            "are never checked (a host, port or parallel size a typed key owns, TLS, an api key would pass) and the "
            "file can change after the check; put those flags in the profile instead (its typed keys, or extra_args "
            "for the others), where they are checked")


def dotted_conflict(args: Sequence[str], flag: str | None = None) -> str | None:
    """Why two `--flag.key value` uses in `args` contradict each other, or None; `flag`: only that flag's uses.

    vLLM's parser reads `--flag.a.b v` as `--flag '{"a": {"b": v}}'` (v as JSON if it parses, else the string) and
    merges the uses in order: one that sets a key inside `a` after `--flag.a` gave `a` a value that is not a JSON
    object replaces that value (vLLM logs a warning at most), so one of the two is lost. Refused here, so that
    `config check` and `lynxtop check` (agent/serving/vllm_options.py) say the same.
    """
    leaves: dict[tuple[str, ...], str] = {}  # (flag, key, ...) -> the flag as written that set a non-object there
    i = 0
    while i < len(args):
        tok = args[i]
        written = tok.split("=", 1)[0]
        head, dot, rest = written[2:].partition(".")
        name = "--" + head.replace("_", "-")
        if not written.startswith("--") or not dot or (flag is not None and name != flag):
            i += 1
            continue
        if "=" in tok:
            value, i = tok.split("=", 1)[1], i + 1
        elif i + 1 < len(args):
            value, i = args[i + 1], i + 2
        else:
            return None  # no value: said where it is read (vLLM: "expected one argument")
        path = (name, *rest.split("."))
        for n in range(2, len(path)):
            if path[:n] in leaves:
                return (f"{written} sets a key inside {'.'.join(path[1:n])}, which {leaves[path[:n]]} set before to "
                        "a value that is not a JSON object: vLLM would replace that value; give one of them")
        try:
            parsed: Any = json.loads(value)
        except (ValueError, RecursionError):
            parsed = value
        leaves = {p: w for p, w in leaves.items() if p[:len(path)] != path}  # this value replaces what was inside
        leaves |= {leaf: written for leaf in _leaves(path, parsed)}
    return None


def _leaves(path: tuple[str, ...], value: Any) -> list[tuple[str, ...]]:
    """The paths under `path` that hold a value other than a JSON object (`path` itself if `value` is not one)."""
    if not isinstance(value, dict):
        return [path]
    return [leaf for k, v in value.items() for leaf in _leaves((*path, str(k)), v)]


def _attached_value(token: str, name: str, candidates: list[str]) -> str | None:
    """`-qfp8` is `-q fp8`: a one-letter owned option with its value attached."""
    attached = [f for f in candidates if len(f) == 2 and name.startswith(f) and name != f]
    if not attached:
        return None
    return f"{token} is {attached[0]} {name[2:]} (value attached), owned by the typed key {OWNED_FLAGS[attached[0]]}"


def _prefix_use(token: str, name: str, candidates: list[str]) -> str | None:
    """vLLM expands an unambiguous prefix (`--hos`) to the whole flag; an ambiguous one only makes it exit."""
    hits = sorted(f for f in candidates if f.startswith(name))
    if not hits or len(name) <= (2 if name.startswith("--") else 1):
        return None
    keys = sorted({OWNED_FLAGS[f] for f in hits})
    return (f"{token} is a prefix of {', '.join(hits)} (vLLM expands an unambiguous prefix to the whole flag), "
            f"owned by the typed key{'s' if len(keys) > 1 else ''} {', '.join(keys)}")


@dataclass(frozen=True)
class Config:
    path: Path | None
    agent: AgentConfig
    sla: SlaConfig
    profiles: tuple[Profile, ...]
    models: tuple[ModelSpec, ...] = ()  # `[[model]]`: descriptions for `lynxtop check`, before the built-in table
    ray: RayConfig = field(default_factory=RayConfig)
    # what read_secret_env found worth telling but not refusing (secrets others may read): 'file: key: warning'
    warnings: tuple[str, ...] = field(default=(), compare=False)

    def profile(self, name: str) -> Profile | None:
        return next((p for p in self.profiles if p.name == name), None)


# ---------------------------------------------------------------------------------------------- defaults


def default_state_dir() -> Path:
    if os.environ.get("STATE_DIRECTORY"):
        return Path(os.environ["STATE_DIRECTORY"].split(":")[0])
    if os.geteuid() == 0:
        return Path("/var/lib/lynxtop")
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "lynxtop"


def default_socket_path() -> Path:
    if os.environ.get("RUNTIME_DIRECTORY"):
        return Path(os.environ["RUNTIME_DIRECTORY"].split(":")[0]) / "agent.sock"
    if os.geteuid() == 0:
        return Path("/run/lynxtop/agent.sock")
    base = os.environ.get("XDG_RUNTIME_DIR")
    return (Path(base) / "lynxtop" if base else default_state_dir()) / "agent.sock"


def resolve_config_path(cli_value: str | None) -> tuple[Path, bool]:
    """The config path and whether the user named it (a named file must exist; the default may be absent)."""
    if cli_value:
        return Path(cli_value), True
    if os.environ.get(CONFIG_ENV):
        return Path(os.environ[CONFIG_ENV]), True
    return DEFAULT_CONFIG_PATH, False


# ---------------------------------------------------------------------------------------------- validation


class _Checker:
    def __init__(self, source: str):
        self.source = source
        self.problems: list[str] = []

    def error(self, key: str, problem: str) -> None:
        # a key, a label or a value may come from the file: the message shows its control characters escaped
        self.problems.append(terminal_safe(f"{self.source}: {key}: {problem}"))

    def table(self, data: dict[str, Any], prefix: str, spec: dict[str, Callable[[str, Any], Any]]) -> dict:
        out: dict[str, Any] = {}
        for key, value in data.items():
            dotted = f"{prefix}.{key}" if prefix else key
            if key not in spec:
                known = ", ".join(sorted(spec))
                self.error(dotted, f"unknown key (known keys: {known})")
                continue
            try:
                out[key] = spec[key](dotted, value)
            except _Bad as exc:
                self.error(dotted, str(exc))
        return out


class _Bad(Exception):
    pass


def _describe(value: Any) -> str:
    kind = {bool: "boolean", int: "integer", float: "number", str: "string", list: "array", dict: "table"}
    return f"{kind.get(type(value), type(value).__name__)} {value!r}"


def _int(lo: int | None = None, hi: int | None = None):
    def conv(key: str, v: Any) -> int:
        if isinstance(v, bool) or not isinstance(v, int):
            raise _Bad(f"expected an integer, got {_describe(v)}")
        if lo is not None and v < lo or hi is not None and v > hi:
            raise _Bad(f"{v} is out of range ({lo}..{hi})")
        return v

    return conv


def _float(lo: float | None = None, hi: float | None = None, lo_open: bool = False):
    """Every float key of the config goes through here: TOML's nan and inf are refused once, for all of them
    (nan compares false with every bound, so a range check alone let `sample_interval_s = nan` through)."""

    def conv(key: str, v: Any) -> float:
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise _Bad(f"expected a number, got {_describe(v)}")
        try:
            v = float(v)
        except OverflowError:  # an integer past 1.8e308: not quoted, it may have hundreds of digits
            raise _Bad(f"an integer of {len(str(abs(v)))} digits is too large for a number") from None
        if not math.isfinite(v):
            raise _Bad(f"{v} is not a finite number (nan and inf are refused)")
        if (lo is not None and (v <= lo if lo_open else v < lo)) or (hi is not None and v > hi):
            raise _Bad(f"{v:g} is out of range ({'>' if lo_open else ''}{lo:g}..{hi:g})")
        return v

    return conv


def _off_or_float(lo: float, hi: float):
    """A number of seconds where 0 means off: 0, or lo..hi (a probe every second would be load, not a check)."""
    within = _float(lo, hi)

    def conv(key: str, v: Any) -> float:
        if not isinstance(v, bool) and isinstance(v, (int, float)) and v == 0:
            return 0.0
        try:
            return within(key, v)
        except _Bad as exc:
            if "out of range" in str(exc):
                raise _Bad(f"{float(v):g} is out of range (0 = off, or {lo:g}..{hi:g})") from None
            raise

    return conv


def _bool(key: str, v: Any) -> bool:
    if not isinstance(v, bool):
        raise _Bad(f"expected true or false, got {_describe(v)}")
    return v


def _no_control(what: str, v: str) -> None:
    """Control characters (C0, DEL, C1, bidi controls) are refused in every string: argv cannot carry a NUL,
    and a name or description is printed by `config check`, `lynxtop status` and the dashboard."""
    found = first_control(v)
    if found:
        raise _Bad(f"{what}holds the control character {found}; control characters are refused")


def _str(pattern: str | None = None, choices: tuple[str, ...] | None = None, allow_empty: bool = True,
         flag_safe: bool = True):
    def conv(key: str, v: Any) -> str:
        if not isinstance(v, str):
            raise _Bad(f"expected a string, got {_describe(v)}")
        if not v and not allow_empty:
            raise _Bad("must not be empty")
        if flag_safe and v.startswith("-"):
            raise _Bad(f"{v!r} starts with '-' and would be read by vLLM as a flag")
        _no_control("", v)
        if choices is not None and v not in choices:
            raise _Bad(f"{v!r} is not one of: {', '.join(choices)}")
        if pattern is not None and v and not re.fullmatch(pattern, v):
            raise _Bad(f"{v!r} is not valid (expected {pattern})")
        return v

    return conv


def _path(absolute: bool = False):
    base = _str(allow_empty=False)

    def conv(key: str, v: Any) -> Path:
        s = base(key, v)
        try:
            p = Path(s).expanduser()
        except RuntimeError:  # `~name/...` for a user this system does not know
            user = s[1:].split("/", 1)[0]
            raise _Bad(f"{s!r} starts with ~{user}, but " + (f"there is no user {user}" if user else
                       "this user has no home directory") + " to expand it to") from None
        if absolute and not p.is_absolute():
            raise _Bad(f"{s!r} is a relative path; give an absolute path")
        return p

    return conv


def _listen(key: str, v: Any) -> str:
    s = _str()(key, v)
    if s and not re.fullmatch(r"(\[[0-9a-fA-F:]+\]|[A-Za-z0-9.\-]+):\d{1,5}", s):
        raise _Bad(f"{s!r} is not host:port (for example '127.0.0.1:9464')")
    if s and not 0 < int(s.rsplit(":", 1)[1]) < 65536:
        raise _Bad(f"port in {s!r} is out of range (1..65535)")
    return s


# scheme://USERINFO@ in an argument: the userinfo runs to the authority's last '@', as contract/redact.py reads it
_URL_USERINFO = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*://(?P<userinfo>[^/?#\s\"'<>]*)@")
# where a secret may go instead of an argument: names masked wherever env is served, printed or stored (redact.py)
_SECRET_ENV_HINT = ("a name holding TOKEN, KEY, SECRET, PASSWORD or CREDENTIAL, or one listed in [agent] "
                    "secret_env, is masked")


def url_userinfo_use(args: Sequence[str], i: int, program: str = "vLLM") -> str | None:
    """Why `args[i]` (an extra_args item) would put a URL's credentials (`scheme://USER:PASSWORD@`, or
    `scheme://TOKEN@`: a userinfo of any kind) in a command line, or None. Said without the item itself (it holds
    the secret): its position and the flag it belongs to.

    lynxtop masks such a userinfo wherever it shows argv, but the child's /proc/PID/cmdline is readable by every
    local user and serving.json keeps argv as run, so it is refused like `--api-key`. A user part alone is refused
    too: a userinfo without ':' is most often a token itself (`https://ghp_...@github.com`), and telling a user
    name from a token is guesswork. Only an empty one (`https://@host`, `https://:@host`) holds nothing."""
    arg = args[i]
    if "://" not in arg or not any(m.group("userinfo").strip(":") for m in _URL_USERINFO.finditer(arg)):
        return None
    flag = arg.split("=", 1)[0] if arg.startswith("-") and "=" in arg else \
        args[i - 1] if i > 0 and args[i - 1].startswith("-") else None
    of = f" (the value of {flag.split('=', 1)[0]})" if flag else ""
    return (f"item {i + 1}{of} holds a URL with credentials (scheme://USER@ or scheme://USER:PASSWORD@; not "
            f"shown): they would sit in {program}'s command line, read by every local user (ps, /proc/PID/cmdline), "
            "and in the agent's state files (serving.json)")


def _extra_args(key: str, v: Any) -> tuple[str, ...]:
    if not isinstance(v, list) or not all(isinstance(a, str) for a in v):
        raise _Bad(f"expected an array of strings, got {_describe(v)}")
    for i, a in enumerate(v):
        if not a:
            raise _Bad("an argument is empty")
        _no_control(f"argument {a!r} ", a)
        why = owned_flag_use(a)
        if why:
            raise _Bad(f"{why}; use the typed key instead of extra_args")
        why = secret_flag_use(a) or tls_flag_use(a) or config_file_use(a, v[i + 1] if i + 1 < len(v) else None)
        if why:
            raise _Bad(why)
        why = url_userinfo_use(v, i)
        if why:
            raise _Bad(f"{why}; give it to vLLM through its environment instead, where vLLM reads it from a variable: "
                       f"env_file or env_credentials (always secret), or env ({_SECRET_ENV_HINT})")
    why = dotted_conflict(v)
    if why:
        raise _Bad(why)
    return tuple(v)


def env_name_problem(name: str) -> str | None:
    """Why `name` cannot be set in a profile's env (inline, env_file or credential), or None."""
    if not ENV_NAME.fullmatch(name):
        return (f"variable name {name!r} is not a valid environment variable name (letters, digits and _, "
                "not starting with a digit; no '=' or NUL)")
    if name in ENV_FORBIDDEN or not (name in ENV_ALLOWED_EXACT or name.startswith(ENV_ALLOWED_PREFIXES)):
        return (f"variable {name} is not allowed (allowed: {', '.join(sorted(ENV_ALLOWED_EXACT))} "
                f"and names starting with {', '.join(ENV_ALLOWED_PREFIXES)})")
    return None


def _secret_env(key: str, v: Any) -> tuple[str, ...]:
    """[agent] secret_env: more names whose values are never served, printed, logged or stored."""
    if not isinstance(v, list) or not all(isinstance(n, str) for n in v):
        raise _Bad(f"expected an array of environment variable names, got {_describe(v)}")
    for name in v:
        if not ENV_NAME.fullmatch(name):
            raise _Bad(f"{name!r} is not a valid environment variable name (letters, digits and _, "
                       "not starting with a digit)")
    return tuple(dict.fromkeys(v))


def _env_credentials(key: str, v: Any) -> dict[str, str]:
    """env name -> the name of a systemd credential (LoadCredential=NAME:PATH), read from $CREDENTIALS_DIRECTORY."""
    if not isinstance(v, dict):
        raise _Bad(f"expected a table NAME = \"credential name\", got {_describe(v)}")
    for name, cred in v.items():
        problem = env_name_problem(name)
        if problem:
            raise _Bad(problem)
        if not isinstance(cred, str) or not re.fullmatch(r"[A-Za-z0-9_.@\-]{1,255}", cred) or cred in (".", ".."):
            got = f"a string of {len(cred)} characters" if isinstance(cred, str) else _describe(cred)
            raise _Bad(f"the credential of {name} must be a systemd credential name (letters, digits, . _ - @; "
                       f"no '/'), got {got} (not shown: it may be the secret itself)")
    return dict(v)


def _env(key: str, v: Any) -> dict[str, str]:
    if not isinstance(v, dict):
        raise _Bad(f"expected a table, got {_describe(v)}")
    out: dict[str, str] = {}
    for name, value in v.items():
        problem = env_name_problem(name)
        if problem:
            raise _Bad(problem)
        if not isinstance(value, (str, int)) or isinstance(value, bool):
            raise _Bad(f"value of {name} must be a string, got {_describe(value)}")
        _no_control(f"the value of {name} ", str(value))  # the value itself is never quoted: it may be a secret
        out[name] = str(value)
    return out


_RETENTION_SPEC = {
    "raw_days": _float(0, 36500, lo_open=True),
    "minute_days": _float(0, 36500, lo_open=True),
    "hour_days": _float(0, 36500, lo_open=True),
}

_AGENT_SPEC: dict[str, Callable[[str, Any], Any]] = {
    "database": _path(absolute=True),
    "socket": _path(absolute=True),
    "socket_group": _str(pattern=r"[a-z_][a-z0-9_\-]{0,31}", allow_empty=False),
    "log_dir": _path(absolute=True),
    "sample_interval_s": _float(0.1, 60),
    "scrape_interval_s": _float(0, 600),
    "gpm": _bool,
    "live_restore": _bool,
    "metrics_listen": _listen,
    "default_profile": _str(),
    "autostart": _bool,
    "hang_timeout_s": _float(5, 86400),
    "load_stall_warn_s": _float(0, 86400),
    "restart_on_hang": _bool,
    "idle_probe_s": _off_or_float(5, 86400),
    "backoff_initial_s": _float(0.1, 3600),
    "backoff_max_s": _float(0.1, 86400),
    "crash_loop_failures": _int(1, 1000),
    "crash_loop_window_s": _float(1, 7 * 86400),
    "stable_after_s": _float(1, 7 * 86400),
    "gpu_release_timeout_s": _float(1, 3600),
    "min_free_mb": _int(0, 1 << 20),
    "run_log_max_mb": _int(0, 1 << 20),
    "run_logs_max_total_mb": _int(0, 1 << 24),
    "run_log_reserve_mb": _int(0, 1 << 20),
    "role": _str(choices=ROLES),
    "fake_nvml": _str(choices=("", "h200x8", "a100x8", "b200x8", "sim", "lost", "missing", "nodriver")),
    "api_max_connections": _int(1, 65536),
    "metrics_max_connections": _int(1, 65536),
    "tcp_reads": _bool,
    "tcp_token_file": _path(absolute=True),
    "request_timeout_s": _float(0.1, 3600),
    "secret_env": _secret_env,
}

def _address(key: str, v: Any) -> str:
    s = _listen(key, v)
    if s and s.rsplit(":", 1)[0] in ("0.0.0.0", "[::]", "localhost"):
        raise _Bad(f"{s!r} names no particular host: give the head's address as the workers reach it")
    return s


def _ray_extra_args(key: str, v: Any) -> tuple[str, ...]:
    if not isinstance(v, list) or not all(isinstance(a, str) for a in v):
        raise _Bad(f"expected an array of strings, got {_describe(v)}")
    for i, a in enumerate(v):
        if not a:
            raise _Bad("an argument is empty")
        _no_control(f"argument {a!r} ", a)
        why = url_userinfo_use(v, i, "`ray start`")
        if why:
            raise _Bad(f"{why}; give it through [ray] "
                       f"env instead, where Ray reads it from a variable ({_SECRET_ENV_HINT})")
        name = a.split("=", 1)[0].replace("_", "-")
        if name in RAY_OWNED_FLAGS:
            raise _Bad(f"{a} is set by the agent or by a typed [ray] key; use the key instead of extra_args")
        if name in RAY_SECRET_FLAGS:  # the token is not quoted: `--redis-password=...` carries the secret
            raise _Bad(f"{name} would put a secret in `ray start`'s command line, which every user sees in ps and "
                       "lynxtop prints and stores")
    return tuple(v)


_RAY_SPEC: dict[str, Callable[[str, Any], Any]] = {
    "executable": _path(absolute=True),
    "head_address": _address,
    "port": _int(1, 65535),
    "node_ip_address": _str(pattern=r"[0-9a-fA-F.:]+"),
    "num_gpus": _int(0, 1024),
    "num_cpus": _int(0, 65536),
    "dashboard_port": _int(1, 65535),
    "temp_dir": _path(absolute=True),
    "view_interval_s": _float(0.2, 600),
    "stop_grace_s": _float(1, 3600),
    "env": _env,
    "extra_args": _ray_extra_args,
}

_SLA_SPEC = {
    "ttft_p99_ms": _float(0, 3_600_000, lo_open=True),
    "tpot_p99_ms": _float(0, 3_600_000, lo_open=True),
    "window_s": _float(5, 3600),
}

_PROFILE_SPEC: dict[str, Callable[[str, Any], Any]] = {
    "name": _str(pattern=r"[A-Za-z0-9][A-Za-z0-9._\-]{0,63}", allow_empty=False),
    "description": _str(flag_safe=False),
    "executable": _path(absolute=True),
    "model": _str(allow_empty=False),
    "served_model_name": _str(),
    "host": _str(pattern=r"[A-Za-z0-9.\-:\[\]]+", allow_empty=False),
    "port": _int(1, 65535),
    "tensor_parallel_size": _int(1, 1024),
    "pipeline_parallel_size": _int(1, 1024),
    "data_parallel_size": _int(1, 1024),
    "enable_expert_parallel": _bool,
    "gpu_memory_utilization": _float(0, 1, lo_open=True),
    "max_model_len": _int(16, 16 * 1024 * 1024),
    "max_num_seqs": _int(1, 65536),
    "max_num_batched_tokens": _int(1, 16 * 1024 * 1024),
    "block_size": _int(1, 1024),
    "kv_cache_dtype": _str(choices=KV_CACHE_DTYPES),
    "attention_backend": _str(choices=ATTENTION_BACKENDS),
    "enable_prefix_caching": _bool,
    "quantization": _str(pattern=r"[A-Za-z0-9_\-]+"),
    "trust_remote_code": _bool,
    "distributed_executor_backend": _str(choices=EXECUTOR_BACKENDS),
    "shutdown_timeout_s": _int(0, 3600),
    "extra_args": _extra_args,
    "env": _env,
    "env_file": _path(absolute=True),
    "env_credentials": _env_credentials,
    "readiness_timeout_s": _float(1, 7 * 86400),
    "stop_grace_s": _float(1, 7200),
}


def parse_config(text: str, source: str = "<config>", path: Path | None = None) -> Config:
    """Validate TOML text; raises ConfigError listing every problem."""
    chk = _Checker(source)
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError([f"{source}: not valid TOML: {exc}"]) from None
    except ValueError as exc:  # an integer of more digits than Python converts (sys.get_int_max_str_digits)
        why = f"an integer has more than {sys.get_int_max_str_digits()} digits" if "digits" in str(exc) else exc
        raise ConfigError([f"{source}: not valid TOML here: a value cannot be read ({why})"]) from None
    except RecursionError:
        raise ConfigError([f"{source}: not valid TOML here: arrays or tables nested too deep"]) from None
    known_top = {"agent", "sla", "profile", "model", "ray"}
    for key in data:
        if key not in known_top:
            chk.error(key, f"unknown section (known: {', '.join(sorted(known_top))})")
    agent = _parse_agent(chk, _table_or_empty(chk, data, "agent", "expected a table [agent]"))
    sla = SlaConfig(**chk.table(_table_or_empty(chk, data, "sla", "expected a table [sla]"), "sla", _SLA_SPEC))
    profiles_raw = data.get("profile", [])
    if not isinstance(profiles_raw, list):
        chk.error("profile", "expected an array of tables [[profile]]")
        profiles_raw = []
    profiles, seen = _parse_profiles(chk, profiles_raw, agent.secret_env)
    if agent.default_profile and agent.default_profile not in seen:
        chk.error("agent.default_profile", f"no profile named {agent.default_profile!r}")
    models = _parse_models(chk, data.get("model", []))
    ray = _parse_ray(chk, _table_or_empty(chk, data, "ray", "expected a table [ray]"), agent)
    if chk.problems:
        raise ConfigError(chk.problems)
    return Config(path=path, agent=agent, sla=sla, profiles=tuple(profiles), models=models, ray=ray)


def _parse_ray(chk: _Checker, raw: dict[str, Any], agent: AgentConfig) -> RayConfig:
    vals = chk.table(raw, "ray", _RAY_SPEC)
    if "executable" in vals:
        vals["executable"] = str(vals["executable"])
    if agent.role == "worker":
        if not vals.get("head_address"):
            chk.error("ray.head_address", "is required on a worker (agent.role = \"worker\"): the head's host:port")
        if agent.default_profile or agent.autostart:
            chk.error("agent.role", "a worker serves no vLLM (the head does): remove default_profile and autostart")
    elif agent.role == "head" and vals.get("head_address"):
        chk.error("ray.head_address", "is for workers; the head's own address is ray.node_ip_address and ray.port")
    return RayConfig(**vals)


def _table_or_empty(chk: _Checker, data: dict[str, Any], key: str, expected: str) -> dict[str, Any]:
    raw = data.get(key, {})
    if not isinstance(raw, dict):
        chk.error(key, expected)
        return {}
    return raw


def _parse_agent(chk: _Checker, agent_raw: dict[str, Any]) -> AgentConfig:
    retention_raw = agent_raw.get("retention", {})
    agent_raw = {k: v for k, v in agent_raw.items() if k != "retention"}
    agent_vals = chk.table(agent_raw, "agent", _AGENT_SPEC)
    if not isinstance(retention_raw, dict):
        chk.error("agent.retention", "expected a table [agent.retention]")
        retention_raw = {}
    retention = Retention(**chk.table(retention_raw, "agent.retention", _RETENTION_SPEC))
    if retention.raw_days > retention.minute_days or retention.minute_days > retention.hour_days:
        chk.error("agent.retention", "expected raw_days <= minute_days <= hour_days")
    agent_vals.setdefault("database", default_state_dir() / "lynxtop.db")
    socket_from_file = "socket" in agent_vals
    agent_vals.setdefault("socket", default_socket_path())
    problem = socket_path_problem(agent_vals["socket"])
    if problem:
        chk.error("agent.socket", problem + ("" if socket_from_file else " (the default; set [agent] socket)"))
    if agent_vals.get("backoff_max_s", 300.0) < agent_vals.get("backoff_initial_s", 5.0):
        chk.error("agent.backoff_max_s", "must be >= agent.backoff_initial_s")
    if agent_vals.get("tcp_reads"):
        if not agent_vals.get("metrics_listen"):
            chk.error("agent.tcp_reads", "needs agent.metrics_listen: the reads are served on that listener")
        if agent_vals.get("tcp_token_file") is None:
            chk.error("agent.tcp_reads", "needs agent.tcp_token_file: reads over TCP are served only to the holder "
                      "of its token (for example `openssl rand -hex 32 > FILE; chmod 600 FILE`)")
    return AgentConfig(retention=retention, **agent_vals)


def _parse_profiles(chk: _Checker, profiles_raw: list[Any],
                    secret_env: tuple[str, ...] = ()) -> tuple[list[Profile], dict[str, int]]:
    """The valid profiles, and where each name was first seen (index); `secret_env`: [agent] secret_env."""
    profiles: list[Profile] = []
    seen: dict[str, int] = {}
    for i, raw in enumerate(profiles_raw):
        label = f"profile[{i}]"
        if not isinstance(raw, dict):
            chk.error(label, "expected a table")
            continue
        if isinstance(raw.get("name"), str):
            label = f"profile[{i}] ({raw['name']})"
        vals = chk.table(raw, label, _PROFILE_SPEC)
        missing = [k for k in ("name", "executable", "model") if k not in raw]
        for k in missing:
            chk.error(f"{label}.{k}", "is required")
        if missing or len(vals) != len(raw):
            continue
        vals["executable"] = str(vals["executable"])
        name = vals["name"]
        if name in seen:
            chk.error(f"{label}.name", f"duplicate profile name {name!r} (first in profile[{seen[name]}])")
            continue
        seen[name] = i
        shutdown = vals.get("shutdown_timeout_s", 30)
        vals.setdefault("stop_grace_s", float(shutdown + 30))
        if vals["stop_grace_s"] < shutdown:
            chk.error(f"{label}.stop_grace_s", f"must be >= shutdown_timeout_s ({shutdown}) so draining can finish")
            continue
        both = sorted(set(vals.get("env", {})) & set(vals.get("env_credentials", {})))
        if both:
            chk.error(f"{label}.env_credentials", f"{', '.join(both)} is also set in env: give a variable one source")
            continue
        vals["secret_env"] = tuple(dict.fromkeys([*secret_env, *vals.get("env_credentials", {})]))
        profiles.append(Profile(**vals))
    return profiles, seen


def _bytes_per_param(key: str, v: Any) -> dict[str, float]:
    if not isinstance(v, dict) or not v:
        raise _Bad(f"expected a table quantization = bytes per parameter, got {_describe(v)}")
    number = _float(0, 8, lo_open=True)
    return {str(q).lower(): number(f"{key}.{q}", b) for q, b in v.items()}


_MODEL_SPEC: dict[str, Callable[[str, Any], Any]] = {
    "name": _str(allow_empty=False),
    "params_b": _float(0, 100_000, lo_open=True),
    "active_params_b": _float(0, 100_000, lo_open=True),
    "layers": _int(1, 10_000),
    "attention_heads": _int(1, 100_000),
    "context_window": _int(16, 16 * 1024 * 1024),
    "native_quantization": _str(pattern=r"[A-Za-z0-9_\-]+", allow_empty=False),
    "bytes_per_param": _bytes_per_param,
    "mla_latent_dim": _int(0, 1_000_000),
    "mla_fp8_bytes": _int(0, 1_000_000),
    "kv_heads": _int(0, 100_000),
    "head_dim": _int(0, 100_000),
    "expert_share": _float(0, 1),
    "overhead_gib": _float(0, 10_000),
}
_MODEL_REQUIRED = ("params_b", "layers", "attention_heads", "context_window", "native_quantization", "bytes_per_param")


def _parse_models(chk: _Checker, raw: Any) -> tuple[ModelSpec, ...]:
    """`[[model]]` tables: a name the built-in table knows overrides only the keys given; a new one needs its size,
    its layers and its KV shape (mla_latent_dim, or kv_heads and head_dim)."""
    if not isinstance(raw, list):
        chk.error("model", "expected an array of tables [[model]]")
        return ()
    seen: list[tuple[int, ModelSpec]] = []  # (index in the file, spec) of each accepted one
    for i, table in enumerate(raw):
        label = f"model[{i}]" + (f" ({table['name']})" if isinstance(table, dict) and "name" in table else "")
        if not isinstance(table, dict):
            chk.error(label, "expected a table")
            continue
        vals = chk.table(table, label, _MODEL_SPEC)
        if len(vals) != len(table) or "name" not in vals:
            if "name" not in table:
                chk.error(f"{label}.name", "is required")
            continue
        spec = _model_from(chk, label, vals)
        if spec is None:
            continue
        # find_model takes the first that matches: a later one that an earlier one matches would never be used
        earlier = next(((j, m) for j, m in seen if m.matches(spec.name) or spec.matches(m.name)), None)
        if earlier is not None:
            j, m = earlier
            also = "" if m.name == spec.name else f" as {m.name!r}: a model is found by its name or its last part"
            chk.error(f"{label}.name", f"duplicate model name {spec.name!r} (first in model[{j}]{also})")
            continue
        seen.append((i, spec))
    return tuple(spec for _, spec in seen)


def _model_from(chk: _Checker, label: str, vals: dict[str, Any]) -> ModelSpec | None:
    if "overhead_gib" in vals:
        vals["overhead_bytes"] = int(vals.pop("overhead_gib") * GIB)
    base = next((m for m in BUILTIN_MODELS if m.matches(vals["name"])), None)
    if base is not None:
        merged = {f.name: getattr(base, f.name) for f in fields(ModelSpec)} | vals
        merged["bytes_per_param"] = base.bytes_per_param | vals.get("bytes_per_param", {})
        return ModelSpec(**merged)
    missing = [k for k in _MODEL_REQUIRED if k not in vals]
    if not vals.get("mla_latent_dim") and not (vals.get("kv_heads") and vals.get("head_dim")):
        missing.append("mla_latent_dim (or kv_heads and head_dim)")
    for k in missing:
        chk.error(f"{label}.{k}", "is required for a model the built-in table does not know")
    if missing:
        return None
    vals.setdefault("active_params_b", vals["params_b"])
    if vals["native_quantization"].lower() not in vals["bytes_per_param"]:
        chk.error(f"{label}.bytes_per_param", f"has no entry for native_quantization {vals['native_quantization']!r}")
        return None
    return ModelSpec(**vals)


def socket_path_problem(path: Path) -> str | None:
    """Why the agent could not listen on `path` as its control socket, or None (pure: no file is touched)."""
    size = len(os.fsencode(path))
    if size > SOCKET_PATH_MAX:
        return (f"control socket path {str(path)!r} is {size} bytes; at most {SOCKET_PATH_MAX} fit (a unix socket "
                f"path holds {SUN_PATH_MAX} bytes and the agent binds a temporary name beside it first)")
    return None


def executable_problem(path: str) -> str | None:
    """Why `path` cannot be started as `vllm serve` by this user, or None.

    It looks at the file system, so it is not part of parse_config (clients and a config reload need none of
    it); `config check` and the agent's start-up both call it through host_problems, and say the same thing.
    """
    p = Path(path)
    try:
        st = p.stat()
    except FileNotFoundError:
        try:
            return f"{path} is a symbolic link to {os.readlink(p)!r}, which does not exist"
        except OSError:  # not a link (or gone meanwhile)
            return f"{path} does not exist"
    except OSError as exc:
        return f"{path} cannot be checked: {exc.strerror or exc}"
    if stat.S_ISDIR(st.st_mode):
        return f"{path} is a directory, not an executable file"
    if not stat.S_ISREG(st.st_mode):
        return f"{path} is not a regular file"
    if not os.access(p, os.X_OK):
        uid = os.geteuid()
        try:
            who = f"user {pwd.getpwuid(uid).pw_name} (uid {uid})"
        except KeyError:
            who = f"uid {uid}"
        return f"{path} is not executable by {who} (mode {stat.S_IMODE(st.st_mode):o})"
    return None


def host_problems(cfg: Config) -> list[str]:
    """Problems of a valid config on this node: each profile's executable must exist and be executable here.

    Lines read like ConfigError's ('file: key: problem'). The agent refuses to start on any of them, and
    `config check` reports the same lines, so a config that checks valid is one the agent runs.
    """
    source = str(cfg.path) if cfg.path else "<config>"
    out = []
    for i, prof in enumerate(cfg.profiles):
        problem = executable_problem(prof.executable)
        if problem:
            out.append(f"{source}: profile[{i}] ({prof.name}).executable: {problem}")
    if cfg.agent.role != "single":
        ray, why = ray_executable(cfg.ray)
        problem = why or executable_problem(ray)
        if problem:
            out.append(f"{source}: ray.executable: {problem} (agent.role = {cfg.agent.role!r} supervises Ray; "
                       "install lynxtop[ray])")
    return out


def ray_executable(ray: RayConfig) -> tuple[str, str | None]:
    """The `ray` CLI to run, and why there is none: the configured one, the one beside this Python, or PATH's."""
    if ray.executable:
        return ray.executable, None
    beside = Path(sys.executable).parent / "ray"
    if beside.exists():
        return str(beside), None
    found = shutil.which("ray")
    if found:
        return found, None
    return "ray", f"no `ray` beside {sys.executable} nor on PATH (set ray.executable)"


ENV_FILE_MODES = (0o600, 0o640)
SECRET_FILE_MAX_BYTES = 1 << 16  # an env_file or a credential: far more than any token
CREDENTIALS_ENV = "CREDENTIALS_DIRECTORY"  # systemd's LoadCredential= directory (systemd.exec(5), "Credentials")


def _user(uid: int) -> str:
    try:
        return f"user {pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"


def _read_secret_file(path: Path) -> tuple[os.stat_result | None, bytes, str | None]:
    """(its stat, its bytes, why it cannot be used): opened once and checked on that open file, never a FIFO's
    endless wait; never more than SECRET_FILE_MAX_BYTES read."""
    try:
        with open(os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY), "rb") as f:
            st = os.fstat(f.fileno())
            if not stat.S_ISREG(st.st_mode):
                return st, b"", "is not a regular file"
            data = f.read(SECRET_FILE_MAX_BYTES + 1)
    except OSError as exc:
        return None, b"", f"cannot be read: {exc.strerror or exc}"
    if len(data) > SECRET_FILE_MAX_BYTES:
        return st, b"", f"is larger than {SECRET_FILE_MAX_BYTES} bytes"
    return st, data, None


def _secret_file_problem(st: os.stat_result, path: Path, what: str, check_owner: bool = True) -> str | None:
    """Why a file of secrets cannot be used: one anyone else could write or read (env_file's rule)."""
    mode = stat.S_IMODE(st.st_mode)
    if check_owner and st.st_uid not in (os.geteuid(), 0):
        return (f"is owned by {_user(st.st_uid)}; {what} must be owned by the agent's user "
                f"({_user(os.geteuid())}) or root")
    if mode not in ENV_FILE_MODES:
        return f"has mode {mode:04o}; {what} holds secrets: give it mode 0600 or 0640 (chmod 600 {path})"
    return None


TOKEN_MIN_CHARS = 16  # `openssl rand -hex 32` gives 64


def read_token_file(path: Path, check_owner: bool = True) -> tuple[str, str | None]:
    """The bearer token in `path` ([agent] tcp_token_file, the dashboard's --node-token-file), and why it cannot
    be used: env_file's rule (a regular file of mode 0600 or 0640 owned by this user or root), one line of at
    least TOKEN_MIN_CHARS printable characters, a trailing newline dropped. A problem never shows the token.

    `check_owner` False: the dashboard, which only sends the token, reads the agent's own file (owned by the
    agent's user, 0640 with the operators' group); its mode is still checked."""
    st, data, why = _read_secret_file(path)
    if st is not None and why is None:
        why = _secret_file_problem(st, path, "a token file", check_owner)
    if why is None:
        token, why = _secret_text(data)
    if why is None:
        if len(token) < TOKEN_MIN_CHARS:
            why = (f"holds {len(token)} characters; a token needs at least {TOKEN_MIN_CHARS} "
                   "(openssl rand -hex 32)")
        elif first_control(token) or token != token.strip():
            why = "holds a control character or surrounding spaces; give one line, the token alone"
        else:
            return token, None
    return "", f"{path}: {why}"


def _secret_text(data: bytes) -> tuple[str, str | None]:
    """A one-value secret file's text (a token file, a systemd credential): UTF-8, one trailing newline dropped
    (`echo` and editors add it), or why not. The problem names the byte, never the text: it may be the secret."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        return "", f"is not UTF-8 text (byte {exc.start})"
    return text.removesuffix("\n").removesuffix("\r"), None


def read_env_file(path: Path) -> tuple[dict[str, str], list[str]]:
    """An env_file's variables, and its problems ('PATH: problem' or 'PATH:LINE: problem').

    It holds secrets, so it is refused unless it is a regular file of mode 0600 or 0640 owned by the agent's
    user (this process's) or root. Accepted lines: `NAME=VALUE` (NAME as a profile's env allows, from the first
    column; VALUE verbatim to the end of the line, one pair of enclosing '…' or "…" removed; no escapes, no
    $expansion, no `export`), blank lines and lines starting with `#`; a CRLF line end is read as LF. A problem
    never shows a value, nor a line that is not NAME=VALUE: it may hold the secret.
    """
    st, data, why = _read_secret_file(path)
    if st is not None and why is None:
        why = _secret_file_problem(st, path, "an env_file")
    if why is None:
        try:
            return _env_lines(path, data.decode("utf-8"))
        except UnicodeDecodeError as exc:
            why = f"is not UTF-8 text (byte {exc.start})"
    return {}, [f"{path}: {why}"]


def _env_lines(path: Path, text: str) -> tuple[dict[str, str], list[str]]:
    out: dict[str, str] = {}
    first: dict[str, int] = {}
    problems: list[str] = []
    for n, line in enumerate(text.split("\n"), 1):
        line = line.removesuffix("\r")
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        name, eq, value = line.partition("=")
        problem = None
        if not eq:
            problem = "expected NAME=VALUE; this line has no '=' (it is not shown: it may hold a secret)"
        elif not ENV_NAME.fullmatch(name):
            problem = ("the text before '=' is not an environment variable name (letters, digits and _ from the "
                       "first column, not starting with a digit; no spaces, no `export`)")
        elif env_name_problem(name):
            problem = env_name_problem(name)
        elif name in first:
            problem = f"{name} is set again (first on line {first[name]})"
        else:
            if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
                value = value[1:-1]
            found = first_control(value)
            if found:
                problem = f"the value of {name} holds the control character {found}; control characters are refused"
        if problem:
            problems.append(f"{path}:{n}: {problem}")
            continue
        first[name] = n
        out[name] = value
    return out, problems


def read_credential(name: str) -> tuple[str, str | None]:
    """A systemd credential's value (LoadCredential=NAME:PATH puts it in $CREDENTIALS_DIRECTORY/NAME, readable by
    the service alone), and why it cannot be used. One trailing newline is dropped, as `echo` and editors add it."""
    directory = os.environ.get(CREDENTIALS_ENV)
    if not directory:
        return "", (f"${CREDENTIALS_ENV} is not set: systemd sets it for the agent's unit when the unit has "
                    f"LoadCredential={name}:PATH (see systemd/lynxtop-agent.service); run the agent, or this check, "
                    "under that unit, or use env_file")
    path = Path(directory) / name
    _, data, why = _read_secret_file(path)
    if why is None:
        value, why = _secret_text(data)
    if why is None:
        found = first_control(value)
        if not found:
            return value, None
        why = f"holds the control character {found}; control characters are refused"
    return "", f"credential {name} ({path}) {why}"


def _group_name(gid: int) -> str:
    try:
        return grp.getgrgid(gid).gr_name
    except KeyError:
        return str(gid)


def _read_by_others(st: os.stat_result, operators: str) -> str | None:
    """Who besides the file's owner reads a file of secrets: every user, the operators' group, or None (nobody of
    those: a group-readable file of another group is left alone, as env_file's rule allows 0640)."""
    mode = stat.S_IMODE(st.st_mode)
    if mode & stat.S_IROTH:
        return "every local user"
    try:
        gid = grp.getgrnam(operators).gr_gid
    except KeyError:  # no such group here: the agent cannot give the socket to it either
        return None
    if mode & stat.S_IRGRP and st.st_gid == gid:
        return f"the operators' group {operators} (agent.socket_group)"
    return None


def _readable_secret(path: Path, st: os.stat_result, operators: str) -> str | None:
    """'PATH is readable by WHO (mode, group, owner)' for a file of secrets others read, else None."""
    who = _read_by_others(st, operators)
    if who is None:
        return None
    return (f"{path} is readable by {who} (mode {stat.S_IMODE(st.st_mode):04o}, group {_group_name(st.st_gid)}, "
            f"owned by {_user(st.st_uid)})")


def secret_exposure_warnings(cfg: Config) -> list[str]:
    """Secrets that the operators' group (`[agent] socket_group`) or every local user can read in a file: an
    env_file, a credential, or a secret written inline in env (a profile's, [ray]'s) of a config file they read.

    lynxtop shows those values to the operators only masked; a file they read gives them the value itself. Told,
    not refused (the agent and `config check` say it at every load): the README's own install
    (root:lynxtop 0640, the agent's group being the operators') did exactly this, and an upgraded agent must not
    refuse to start a model over it. Lines read like ConfigError's; none shows a value. Looks at the files on
    disk, so it runs with the secrets (read_secret_env), on the config as parsed (env not yet merged)."""
    source = str(cfg.path) if cfg.path else "<config>"
    operators = cfg.agent.socket_group
    uid = os.geteuid()
    try:
        owner = pwd.getpwuid(uid).pw_name
    except KeyError:
        owner = str(uid)
    out: list[str] = []

    def fix(path: Path) -> str:
        return f"chown {owner} {path} && chmod 600 {path}"

    for i, prof in enumerate(cfg.profiles):
        label = f"{source}: profile[{i}] ({prof.name})"
        if prof.env_file is not None:
            with contextlib.suppress(OSError):  # unreadable: read_env_file refuses it with the reason
                why = _readable_secret(prof.env_file, os.stat(prof.env_file), operators)
                if why:
                    out.append(f"{label}.env_file: {why}: they read every secret in it, which lynxtop shows them "
                               f"only masked; make it the agent's user's alone ({fix(prof.env_file)}), or use "
                               "env_credentials with systemd's LoadCredential=")
        directory = os.environ.get(CREDENTIALS_ENV)
        for name, cred in prof.env_credentials.items() if directory else ():
            path = Path(directory) / cred
            with contextlib.suppress(OSError):  # absent: read_credential refuses it with the reason
                why = _readable_secret(path, os.stat(path), operators)
                if why:
                    out.append(f"{label}.env_credentials.{name}: {why}: they read the secret, which lynxtop shows "
                               f"them only masked; systemd's LoadCredential= gives it to the service alone (mode "
                               f"0400); elsewhere: {fix(path)}")
    inline = [(f"{source}: profile[{i}] ({p.name}).env", p.env) for i, p in enumerate(cfg.profiles)]
    inline.append((f"{source}: ray.env", cfg.ray.env))
    found = [(key, names) for key, env in inline
             if (names := [k for k, v in env.items() if is_secret_name(k, cfg.agent.secret_env)
                           or mask_url_credentials(v) != v])]
    if found and cfg.path is not None:
        with contextlib.suppress(OSError):
            why = _readable_secret(cfg.path, os.stat(cfg.path), operators)
            if why:
                for key, names in found:
                    are = "is a secret" if len(names) == 1 else "are secrets"
                    out.append(f"{key}: {', '.join(names)} {are} written in the config file, and {why}: they read "
                               f"the value, which lynxtop shows them only masked; move it to an env_file of mode "
                               f"0600 owned by the agent's user ({owner}), or to env_credentials with systemd's "
                               f"LoadCredential= (or make the config the agent's user's alone: {fix(cfg.path)})")
    return out


def read_secret_env(cfg: Config) -> Config:
    """`cfg` with each profile's env_file and env_credentials read into its env, their names masked everywhere.

    The agent (start-up, and each start or switch that re-reads the config) and `config check` call it through
    load_config(secrets=True), so they give the same verdict; clients never read the secrets. ConfigError lists
    every problem, as parse_config's do.
    """
    source = str(cfg.path) if cfg.path else "<config>"
    problems: list[str] = []
    profiles = []
    for i, prof in enumerate(cfg.profiles):
        label = f"{source}: profile[{i}] ({prof.name})"
        env, secret = dict(prof.env), list(prof.secret_env)
        if prof.env_file is not None:
            values, bad = read_env_file(prof.env_file)
            problems += [f"{label}.env_file: {p}" for p in bad]
            both = sorted(set(values) & (set(prof.env) | set(prof.env_credentials)))
            if both:
                problems.append(f"{label}.env_file: {prof.env_file}: {', '.join(both)} is also set in env or "
                                "env_credentials: give a variable one source")
            env |= values
            secret += values
        for name, cred in prof.env_credentials.items():
            value, why = read_credential(cred)
            if why:
                problems.append(f"{label}.env_credentials.{name}: {why}")
            env[name] = value
        profiles.append(replace(prof, env=env, secret_env=tuple(dict.fromkeys(secret))))
    if cfg.agent.tcp_reads and cfg.agent.tcp_token_file is not None:
        _, why = read_token_file(cfg.agent.tcp_token_file)  # checked only: the agent reads it when it listens
        if why:
            problems.append(f"{source}: agent.tcp_token_file: {why}")
    if problems:
        raise ConfigError([terminal_safe(p) for p in problems])
    warnings = secret_exposure_warnings(cfg)  # cfg as parsed: its env holds only what the file writes inline
    return replace(cfg, profiles=tuple(profiles), warnings=tuple(terminal_safe(w) for w in warnings))


def load_config(cli_value: str | None = None, secrets: bool = False) -> Config:
    """Load from --config, $LYNXTOP_CONFIG or the default path; a missing default file means defaults.

    `secrets`: read each profile's env_file and credentials too (read_secret_env): the agent and `config check`
    do; a client (status, the dashboard) needs only the socket and may not be allowed to read them."""
    path, named = resolve_config_path(cli_value)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        if named:
            raise ConfigError([f"{path}: config file not found"]) from None
        return parse_config("", source=f"{path} (absent, defaults)", path=None)
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError([f"{path}: cannot read config file: {exc}"]) from None
    cfg = parse_config(text, source=str(path), path=path)
    return read_secret_env(cfg) if secrets else cfg


def config_as_dict(cfg: Config) -> dict[str, Any]:
    """Plain data for `lynxtop config check` and the API (paths as strings)."""

    def conv(obj: Any) -> Any:
        if hasattr(obj, "__dataclass_fields__"):
            return {f.name: conv(getattr(obj, f.name)) for f in fields(obj)}
        if isinstance(obj, Path):
            return str(obj)
        if isinstance(obj, (list, tuple)):
            return [conv(x) for x in obj]
        if isinstance(obj, dict):
            return {k: conv(v) for k, v in obj.items()}
        return obj

    # every env as shown_env: a secret value is masked here for `config check --json` and everything after
    # and every argument with a URL's credentials masked (redact_argv)
    ray = conv(cfg.ray) | {"env": redact_env(cfg.ray.env, cfg.agent.secret_env),
                           "extra_args": redact_argv(cfg.ray.extra_args)}
    return {"path": str(cfg.path) if cfg.path else None, "agent": conv(cfg.agent), "sla": conv(cfg.sla),
            "ray": ray,
            "profiles": [conv(p) | {"argv": p.shown_argv(), "extra_args": redact_argv(p.extra_args),
                                    "env": p.shown_env()} for p in cfg.profiles]}
