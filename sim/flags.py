"""The command line of the simulated `vllm serve`: vLLM's flags plus `--sim-*` switches (or LYNXTOP_SIM_* env).

Unknown flags end the process with status 2 and argparse's "unrecognized arguments" message, as `vllm serve`
does, so a typo in a profile's extra_args fails the same way on the simulator as on a GPU node. Flags are read as
vLLM's FlexibleArgumentParser reads them: `_` or `-` in a name, `--flag=value`, `-O3`, and abbreviations (argparse's
allow_abbrev is on in vLLM): every vLLM 0.32 option string is registered, so a prefix resolves, or is ambiguous,
exactly as on a GPU node (`--hos 0.0.0.0` binds every interface there too).
"""

from __future__ import annotations

import argparse
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from lynxtop.sim.model import SimParams, params_with
from lynxtop.sim.vllm_options import VLLM_SERVE_OPTIONS

DEFAULT_VERSION = "0.32.0"
SHUTDOWN_TIMEOUT_SINCE = (0, 18)  # the first vLLM that takes --shutdown-timeout (reference notes)
KV_CACHE_DTYPES = ("auto", "fp8", "fp8_e4m3", "fp8_e5m2", "fp8_inc", "bfloat16")
ATTENTION_BACKENDS = (
    "FLASHMLA", "FLASHMLA_SPARSE", "CUTLASS_MLA", "FLASH_ATTN_MLA", "FLASHINFER_MLA", "TRITON_MLA",
    "FLASH_ATTN", "FLASHINFER", "TRITON_ATTN", "TORCH_SDPA", "CPU_ATTN",
)
ENV_PREFIX = "LYNXTOP_SIM_"
T = TypeVar("T")

# vLLM flags the simulator accepts and ignores (value-taking), so real profiles' extra_args keep working. Only
# flags vLLM 0.32 still has (sim/vllm_options.py): one it dropped (--swap-space, --disable-log-requests,
# --max-seq-len-to-capture, --tokenizer-pool-size, --cuda-graph-sizes) is refused here as it is there.
_IGNORED_VALUE_FLAGS = (
    "--tokenizer", "--revision", "--tokenizer-mode", "--download-dir", "--load-format", "--dtype", "--seed",
    "--cpu-offload-gb", "--max-logprobs", "--generation-config", "--chat-template",
    "--reasoning-parser", "--tool-call-parser", "--uvicorn-log-level", "--hf-overrides", "--kv-transfer-config",
    "--compilation-config", "--max-num-partial-prefills", "--long-prefill-token-threshold", "--root-path",
    "--allowed-local-media-path", "--limit-mm-per-prompt", "--mm-processor-kwargs", "--override-generation-config",
    "--data-parallel-size-local", "--data-parallel-address", "--data-parallel-rpc-port", "--data-parallel-backend",
    "--nnodes", "--node-rank", "--master-addr", "--master-port", "--scheduling-policy",
    "--code-revision",
    "--ssl-keyfile", "--ssl-certfile", "--response-role", "--lora-modules", "--prefix-caching-hash-algo",
    "--calculate-kv-scales", "--collect-detailed-traces", "--otlp-traces-endpoint", "--expert-placement-strategy",
    "--eplb-config", "--async-scheduling-config", "--logits-processors", "--structured-outputs-config",
)
_IGNORED_BOOL_FLAGS = (
    "--enforce-eager", "--enable-log-requests", "--disable-log-stats",
    "--enable-chunked-prefill", "--no-enable-chunked-prefill", "--enable-auto-tool-choice",
    "--disable-custom-all-reduce", "--enable-sleep-mode", "--headless", "--async-scheduling",
    "--disable-frontend-multiprocessing", "--enable-eplb", "--enable-dbo", "--disable-fastapi-docs",
    "--enable-prompt-tokens-details", "--enable-force-include-usage", "--disable-uvicorn-access-log",
    "--enable-request-id-headers", "--enable-log-outputs", "--skip-tokenizer-init",
)


class SimUsageError(Exception):
    """A bad --sim-* switch or LYNXTOP_SIM_* variable: the message names which, and the process exits 2."""


@dataclass(frozen=True)
class Failure:
    oom: bool = False
    exit0_after_s: float | None = None
    hang_after_s: float | None = None
    # the engine hangs in its first step after an idle spell this long (0: the next request after ready), its
    # gauges never published again: as vLLM's, published when a step ends (an NCCL collective that never returns)
    hang_after_idle_s: float | None = None
    straggler_gpu: int | None = None  # this GPU of the node runs slow (thermal throttling): its TP group waits


@dataclass(frozen=True)
class ServeArgs:
    model: str
    served_model_name: str
    host: str
    port: int
    tp: int
    pp: int
    dp: int
    max_model_len: int
    max_num_seqs: int
    max_num_batched_tokens: int
    block_size: int | None
    gpu_memory_utilization: float
    kv_cache_dtype: str
    attention_backend: str | None
    enable_prefix_caching: bool
    enable_expert_parallel: bool
    quantization: str | None
    shutdown_timeout_s: float
    api_key: str | None
    speculative_tokens: int
    server_load_tracking: bool
    distributed_executor_backend: str | None
    non_default: dict[str, object]
    api_server_count: int = 1
    use_tqdm_on_load: bool = True  # vLLM's default: the checkpoint shards' progress bar
    # simulator switches
    startup_s: float = 10.0
    speed: float = 1.0
    vllm_version: str = DEFAULT_VERSION
    failure: Failure = field(default_factory=Failure)
    seed: int = 0
    params: SimParams = field(default_factory=SimParams)
    state_dir: Path = Path()
    workers: bool = True
    orphan: bool = True
    orphan_ttl_s: float = 0.0
    log_interval_s: float = 10.0
    node_gpus: int = 8

    @property
    def version_string(self) -> str:
        return f"{self.vllm_version}+sim"

    @property
    def version_tuple(self) -> tuple[int, int]:
        major, minor = self.vllm_version.split(".")[:2]
        return int(major), int(minor)


def default_state_dir() -> Path:
    """Where simulated engines publish their GPU state; the fake NVML of an agent on this host reads it."""
    if os.environ.get(ENV_PREFIX + "STATE_DIR"):
        return Path(os.environ[ENV_PREFIX + "STATE_DIR"])
    base = os.environ.get("XDG_RUNTIME_DIR") or f"/tmp/lynxtop-{os.getuid()}"
    return Path(base) / "lynxtop-sim"


def _positive_float(text: str) -> float:
    v = float(text)
    if not v > 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be > 0")
    return v


def _utilization(text: str) -> float:
    v = float(text)
    if not 0 < v <= 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be in (0, 1]")
    return v


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="vllm serve", description="vLLM-compatible SIMULATED server (lynxtop)")
    p.add_argument("model_tag", metavar="MODEL")
    p.add_argument("--model", dest="model_flag")
    p.add_argument("--host", default="127.0.0.1")  # vLLM: 0.0.0.0; loopback unless asked
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--served-model-name", nargs="+")
    p.add_argument("-tp", "--tensor-parallel-size", type=int, default=1)
    p.add_argument("-pp", "--pipeline-parallel-size", type=int, default=1)
    p.add_argument("-dp", "--data-parallel-size", type=int, default=1)
    p.add_argument("--max-model-len", type=int)
    p.add_argument("--max-num-seqs", type=int)
    p.add_argument("--max-num-batched-tokens", type=int)
    p.add_argument("--block-size", type=int)
    p.add_argument("--gpu-memory-utilization", "--device-memory-utilization", type=_utilization, default=0.9)
    p.add_argument("--kv-cache-dtype", choices=KV_CACHE_DTYPES, default="auto")
    p.add_argument("--attention-backend", choices=ATTENTION_BACKENDS)
    p.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("-ep", "--enable-expert-parallel", action=argparse.BooleanOptionalAction, default=False)
    p.add_argument("-q", "--quantization")
    p.add_argument("--trust-remote-code", action=argparse.BooleanOptionalAction, default=False)
    p.add_argument("--distributed-executor-backend", choices=("mp", "ray", "uni", "external_launcher"))
    p.add_argument("--shutdown-timeout", type=float)  # None: not given (refused before 0.18: parse_serve_args)
    p.add_argument("--api-key")
    p.add_argument("--api-server-count", "-asc", type=int)  # default: the DP size, as in vLLM
    p.add_argument("--speculative-config")
    p.add_argument("--enable-server-load-tracking", action="store_true")
    # the checkpoint shards' progress bar (tqdm, on stderr): on a full log disk it kills the load (sim/vlog.py)
    p.add_argument("--use-tqdm-on-load", action=argparse.BooleanOptionalAction, default=True)
    for flag in _IGNORED_VALUE_FLAGS:
        p.add_argument(flag, dest="ignored_" + flag.strip("-").replace("-", "_"), help=argparse.SUPPRESS)
    for flag in _IGNORED_BOOL_FLAGS:
        p.add_argument(flag, dest="ignored_" + flag.strip("-").replace("-", "_"), action="store_true",
                       help=argparse.SUPPRESS)
    # the rest of vLLM's flags, so abbreviations match the same candidates as in vLLM (value optional: a boolean
    # is followed by the next flag, a value-taking flag by its value)
    for flag in VLLM_SERVE_OPTIONS:
        if flag not in p._option_string_actions:  # noqa: SLF001 - the registry argparse itself consults
            p.add_argument(flag, dest="ignored_" + flag.strip("-").replace("-", "_"), nargs="?", const=True,
                           help=argparse.SUPPRESS)
    sim = p.add_argument_group("simulator (also LYNXTOP_SIM_<NAME> environment variables; flags win)")
    sim.add_argument("--sim-startup-seconds", type=float, help="model load time (default 10)")
    sim.add_argument("--sim-speed", type=_positive_float, help="clock speed-up factor (default 1)")
    sim.add_argument("--sim-vllm-version",
                     help=f"vLLM version to imitate (default {DEFAULT_VERSION}; 0.10 prints the old names)")
    sim.add_argument("--sim-fail", action="append",
                     help="oom | exit0-after=S | hang-after=S | hang-after-idle=S | hang-on-next-request | "
                          "straggler=GPU (repeatable)")
    sim.add_argument("--sim-seed", type=int)
    sim.add_argument("--sim-param", action="append", metavar="KEY=VALUE", help="override a model parameter")
    sim.add_argument("--sim-state-dir", help="where the EngineCore publishes GPU state")
    sim.add_argument("--sim-workers", action=argparse.BooleanOptionalAction, default=None,
                     help="start VLLM::Worker_TP<k> processes (default: on when TP·PP > 1)")
    sim.add_argument("--sim-orphan", action=argparse.BooleanOptionalAction, default=None,
                     help="EngineCore survives a SIGKILL of the API server, as real vLLM's does (default on)")
    sim.add_argument("--sim-orphan-ttl", type=float, help="an orphaned EngineCore exits after S seconds (0 = never)")
    sim.add_argument("--sim-log-interval", type=float, help="seconds between throughput log lines (default 10)")
    sim.add_argument("--sim-gpus", type=int, help="GPUs on the simulated node (default 8)")
    return p


_SIM_ENV = {  # env suffix -> (dest, kind)
    "STARTUP_SECONDS": ("sim_startup_seconds", "float"),
    "SPEED": ("sim_speed", "float"),
    "VLLM_VERSION": ("sim_vllm_version", "str"),
    "FAIL": ("sim_fail", "list"),
    "SEED": ("sim_seed", "int"),
    "PARAM": ("sim_param", "list"),
    "STATE_DIR": ("sim_state_dir", "str"),
    "WORKERS": ("sim_workers", "bool"),
    "ORPHAN": ("sim_orphan", "bool"),
    "ORPHAN_TTL": ("sim_orphan_ttl", "float"),
    "LOG_INTERVAL": ("sim_log_interval", "float"),
    "GPUS": ("sim_gpus", "int"),
}


def _apply_env(ns: argparse.Namespace, env: dict[str, str]) -> None:
    for suffix, (dest, kind) in _SIM_ENV.items():
        name = ENV_PREFIX + suffix
        if name not in env or getattr(ns, dest) is not None:
            continue
        raw = env[name].strip()
        try:
            if kind == "float":
                value: object = float(raw)
            elif kind == "int":
                value = int(raw)
            elif kind == "bool":
                if raw.lower() not in ("1", "0", "true", "false", "yes", "no", "on", "off"):
                    raise ValueError
                value = raw.lower() in ("1", "true", "yes", "on")
            elif kind == "list":
                value = [x for x in re.split(r"[,\s]+", raw) if x]
            else:
                value = raw
        except ValueError:
            raise SimUsageError(f"environment variable {name}={raw!r}: expected a {kind}") from None
        setattr(ns, dest, value)


def _parse_failures(items: list[str], node_gpus: int) -> Failure:
    oom = False
    exit0 = hang = idle_hang = None
    straggler = None
    for item in items:
        key, _, val = item.partition("=")
        try:
            if key == "oom" and not val:
                oom = True
            elif key == "exit0-after":
                exit0 = float(val)
            elif key == "hang-after":
                hang = float(val)
            elif key == "hang-after-idle":
                idle_hang = float(val)
            elif key == "hang-on-next-request" and not val:
                idle_hang = 0.0
            elif key == "straggler":
                straggler = int(val)
                if not 0 <= straggler < node_gpus:
                    raise ValueError
            else:
                raise ValueError
            if any(v is not None and not v >= 0 for v in (exit0, hang, idle_hang)):  # NaN fails too
                raise ValueError
        except ValueError:
            raise SimUsageError(f"--sim-fail {item!r}: expected oom, exit0-after=SECONDS, hang-after=SECONDS, "
                                f"hang-after-idle=SECONDS, hang-on-next-request or straggler=GPU "
                                f"(0..{node_gpus - 1})") from None
    return Failure(oom=oom, exit0_after_s=exit0, hang_after_s=hang, hang_after_idle_s=idle_hang,
                   straggler_gpu=straggler)


def _spec_tokens(raw: str | None) -> int:
    if not raw:
        return 0
    m = re.search(r'"?num_speculative_tokens"?\s*[:=]\s*(\d+)', raw)
    return int(m.group(1)) if m else 1


def _normalize(argv: list[str]) -> list[str]:
    """As vLLM's FlexibleArgumentParser.parse_args: `_` becomes `-` in a long flag's name (before any `=` and up to
    the first `.`), and `-O3` / `-O 3` mean `--optimization-level 3`."""
    out: list[str] = []
    for i, a in enumerate(argv):
        if a.startswith("--"):
            name, eq, val = a.partition("=")
            head, dot, tail = name[2:].partition(".")
            out.append("--" + head.replace("_", "-") + dot + tail + eq + val)
        elif a.startswith("-O") and a != "-O":
            out += ["--optimization-level", a[3:] if a[2] == "=" else a[2:]]
        elif a == "-O" and i + 1 < len(argv) and argv[i + 1] in {"0", "1", "2", "3"}:
            out.append("--optimization-level")
        else:
            out.append(a)
    return out


def _config_file_args(path: str) -> list[str]:
    """`--config FILE.yaml`: flat `long-flag-name: value` lines (the subset vLLM configs use) as argv."""
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise SimUsageError(f"--config {path}: cannot read: {exc}") from None
    out: list[str] = []
    for n, raw in enumerate(lines, 1):
        line = raw.split(" #", 1)[0].rstrip() if not raw.lstrip().startswith("#") else ""
        if not line.strip():
            continue
        m = re.fullmatch(r"([A-Za-z0-9_\-]+)\s*:\s*(.*)", line.strip())
        json_valued = m is not None and m.group(1).replace("_", "-").endswith("-config")  # JSON strings
        nested = m is None or raw[:1].isspace() or (
            m.group(2).startswith(("[", "{", "-", "|", ">")) and not json_valued)
        if nested:
            raise SimUsageError(f"--config {path}:{n}: expected 'flag-name: value' (the simulator reads flat "
                                f"YAML only), got {raw.strip()!r}")
        assert m is not None
        key, value = m.group(1).replace("_", "-"), m.group(2).strip()
        if not json_valued:
            value = value.strip("'\"")
        if value.lower() == "true":
            out.append(f"--{key}")
        elif value.lower() == "false":
            if key == "enable-prefix-caching":
                out.append("--no-enable-prefix-caching")
        else:
            out += [f"--{key}", value]
    return out


def _expand_config(argv: list[str]) -> list[str]:
    """Insert a config file's flags before the command line's, so the command line wins (as in vLLM)."""
    for i, a in enumerate(argv):
        if a == "--config" or a.startswith("--config="):
            path = a.split("=", 1)[1] if "=" in a else (argv[i + 1] if i + 1 < len(argv) else "")
            if not path:
                raise SimUsageError("--config: expected a file name")
            rest = argv[:i] + argv[i + (1 if "=" in a else 2):]
            positional = [rest[0]] if rest and not rest[0].startswith("-") else []
            return positional + _config_file_args(path) + rest[len(positional):]
    return argv


def parse_serve_args(argv: list[str], env: dict[str, str] | None = None) -> ServeArgs:
    """argv after 'serve'. argparse errors exit 2 (as vLLM); SimUsageError for bad simulator switches."""
    env = dict(os.environ) if env is None else env
    parser = build_parser()
    args = _normalize(_expand_config(argv))
    ns = parser.parse_args(args)
    _apply_env(ns, env)
    _refuse_by_version(parser, ns, args)
    _check_sizes(parser, ns)
    model = ns.model_flag or ns.model_tag
    params = _sim_params(ns.sim_param or [])
    defaults = build_parser().parse_args([model])
    non_default = {k: v for k, v in vars(ns).items()
                   if not k.startswith("sim_") and k != "model_tag" and getattr(defaults, k, None) != v}
    serve = _serve_fields(ns, model, params)
    if not serve["api_key"]:  # vLLM: `--api-key` wins over VLLM_API_KEY (the agent passes the key this way)
        serve["api_key"] = env.get("VLLM_API_KEY") or None
    return ServeArgs(model=model, non_default=non_default, **serve, **_sim_fields(ns, params))


def _refuse_by_version(parser: argparse.ArgumentParser, ns: argparse.Namespace, args: list[str]) -> None:
    """A flag the imitated vLLM does not have yet: --shutdown-timeout before 0.18 exits 2 with argparse's
    "unrecognized arguments", naming the tokens as written, as that vLLM does."""
    if ns.shutdown_timeout is None:
        return
    major, minor = (int(x) for x in _sim_version(ns.sim_vllm_version).split(".")[:2])
    if (major, minor) >= SHUTDOWN_TIMEOUT_SINCE:
        return
    given: list[str] = []
    for i, a in enumerate(args):
        name = a.split("=", 1)[0]
        if len(name) > 4 and "--shutdown-timeout".startswith(name):  # the flag or its abbreviation
            given += [a] if "=" in a or i + 1 >= len(args) else [a, args[i + 1]]
    parser.error("unrecognized arguments: " + " ".join(given or ["--shutdown-timeout"]))


def _check_sizes(parser: argparse.ArgumentParser, ns: argparse.Namespace) -> None:
    """Sizes vLLM's own parser refuses (argparse's message and status 2)."""
    for name, v in (("--tensor-parallel-size", ns.tensor_parallel_size), ("--pipeline-parallel-size",
                    ns.pipeline_parallel_size), ("--data-parallel-size", ns.data_parallel_size)):
        if v < 1:
            parser.error(f"argument {name}: must be >= 1, got {v}")
    for name, v in (("--max-model-len", ns.max_model_len), ("--max-num-seqs", ns.max_num_seqs),
                    ("--max-num-batched-tokens", ns.max_num_batched_tokens), ("--block-size", ns.block_size)):
        if v is not None and v < 1:
            parser.error(f"argument {name}: must be >= 1, got {v}")
    if ns.api_server_count is not None and ns.api_server_count < 1:  # 0 = headless, not simulated
        parser.error(f"argument --api-server-count: must be >= 1, got {ns.api_server_count}")
    if not 0 < ns.port < 65536:
        parser.error(f"argument --port: {ns.port} is out of range 1..65535")


def _sim_params(items: list[str]) -> SimParams:
    params_raw: dict[str, str] = {}
    for item in items:
        key, eq, val = item.partition("=")
        if not eq:
            raise SimUsageError(f"--sim-param {item!r}: expected KEY=VALUE")
        params_raw[key.strip()] = val.strip()
    try:
        return params_with(params_raw)
    except ValueError as exc:
        raise SimUsageError(f"--sim-param: {exc}") from None


def _serve_fields(ns: argparse.Namespace, model: str, params: SimParams) -> dict[str, object]:
    """ServeArgs' vLLM fields, with vLLM's defaults where a flag is absent."""
    return dict(
        served_model_name=ns.served_model_name[0] if ns.served_model_name else model, host=ns.host, port=ns.port,
        tp=ns.tensor_parallel_size, pp=ns.pipeline_parallel_size, dp=ns.data_parallel_size,
        max_model_len=ns.max_model_len or params.default_max_model_len,
        max_num_seqs=ns.max_num_seqs or params.default_max_num_seqs,
        max_num_batched_tokens=ns.max_num_batched_tokens or params.default_max_num_batched_tokens,
        block_size=ns.block_size, gpu_memory_utilization=ns.gpu_memory_utilization,
        kv_cache_dtype=ns.kv_cache_dtype, attention_backend=ns.attention_backend,
        enable_prefix_caching=ns.enable_prefix_caching, enable_expert_parallel=ns.enable_expert_parallel,
        quantization=ns.quantization, shutdown_timeout_s=max(ns.shutdown_timeout or 0.0, 0.0), api_key=ns.api_key,
        speculative_tokens=_spec_tokens(ns.speculative_config), server_load_tracking=ns.enable_server_load_tracking,
        distributed_executor_backend=ns.distributed_executor_backend,
        api_server_count=_or(ns.api_server_count, ns.data_parallel_size), use_tqdm_on_load=ns.use_tqdm_on_load,
    )


def _or(value: T | None, default: T) -> T:
    return default if value is None else value


def _sim_version(raw: str | None) -> str:
    version = raw or DEFAULT_VERSION
    if not re.fullmatch(r"\d+\.\d+(\.\d+)?", version):
        raise SimUsageError(f"--sim-vllm-version {version!r}: expected MAJOR.MINOR[.PATCH], e.g. 0.10 or 0.32.0")
    return version + ".0" if version.count(".") == 1 else version


def _sim_fields(ns: argparse.Namespace, params: SimParams) -> dict[str, object]:
    """ServeArgs' simulator switches, checked (SimUsageError names the bad one)."""
    version = _sim_version(ns.sim_vllm_version)
    startup = _or(ns.sim_startup_seconds, 10.0)
    if startup < 0:
        raise SimUsageError(f"--sim-startup-seconds {startup:g}: must be >= 0")
    for name, v in (("--sim-orphan-ttl", ns.sim_orphan_ttl), ("--sim-log-interval", ns.sim_log_interval)):
        if v is not None and v < 0:
            raise SimUsageError(f"{name} {v:g}: must be >= 0")
    if ns.sim_speed is not None and not ns.sim_speed > 0:
        raise SimUsageError(f"--sim-speed {ns.sim_speed:g}: must be > 0")
    gpus = _or(ns.sim_gpus, 8)
    if not 1 <= gpus <= 64:
        raise SimUsageError(f"--sim-gpus {gpus}: must be 1..64")
    return dict(
        startup_s=startup, speed=ns.sim_speed or 1.0, vllm_version=version,
        failure=_parse_failures(ns.sim_fail or [], gpus), seed=ns.sim_seed or 0, params=params,
        state_dir=Path(ns.sim_state_dir) if ns.sim_state_dir else default_state_dir(),
        workers=_or(ns.sim_workers, ns.tensor_parallel_size * ns.pipeline_parallel_size > 1),
        orphan=_or(ns.sim_orphan, True), orphan_ttl_s=ns.sim_orphan_ttl or 0.0,
        log_interval_s=_or(ns.sim_log_interval, 10.0), node_gpus=gpus,
    )
