"""`lynxtop check`: will this profile start, and fit, on these GPUs? Verdicts with the reason and the fix.

Pure functions over the GPU facts (count, compute capability, memory, driver, NVLink), the profile and a model
description (contract/models.py, or the config's `[[model]]`), so the command and the agent's preflight before a
start or switch give the same answer. Levels: ok, warning (vLLM starts but not as the profile means), blocking
(vLLM would refuse or fail to start: better said before the running server is stopped for a switch), and
unknown (not checked: a fact is missing). Exit code: 2 if anything blocks, 1 on a warning or unknown, else 0.

Memory fit per GPU (what vLLM's start-up profiling finds, block rounding aside):
  weights/GPU = W / (TP·PP), W = parameters × bytes per parameter of the quantization. MoE sparsity saves compute,
    not memory: every expert stays resident, so W counts all of them. With expert parallelism
    (`enable_expert_parallel`) vLLM forms an EP group of DP×TP ranks per pipeline stage and splits the routed
    experts over it, while the dense layers stay split by TP only: (W·(1-e))/(TP·PP) + W·e/(TP·PP·DP), e the
    experts' share of the weights. That is why DP8 + EP fits on 8 GPUs where DP8 alone (a full copy per GPU)
    does not.
  KV/token/GPU = bytes per token and layer × ceil(layers / PP); MLA's latent is whole on every TP rank, KV heads
    are split by TP.
  weights/GPU + overhead + KV(max_model_len × max_num_seqs) <= gpu_memory_utilization × GPU memory.
Unset keys take vLLM's defaults: gpu_memory_utilization 0.9, max_num_seqs 1024 on GPUs of 70 GiB or more (not
A100) else 256, max_model_len the model's context window.
One full-length sequence not fitting is blocking (vLLM refuses to start: the cache cannot hold max_model_len);
the configured concurrency at full context not fitting is a warning (vLLM starts and queues the rest).
Decode context parallel (-dcp D in extra_args) shards the KV cache over D of the TP ranks: KV/token/GPU / D.
Speculative decoding with the checkpoint's own draft layers (--speculative-config, method "mtp" or "dspark") adds
the draft's weights (its parameters at the profile's bytes per parameter, / TP) and one KV layer per draft layer,
and each sequence holds num_speculative_tokens more tokens of cache: max_model_len + k per sequence.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

from lynxtop.agent.serving import visible as cuda_visible
from lynxtop.agent.serving.vllm_options import ExtraOptions, extra_options
from lynxtop.contract.config import Profile
from lynxtop.contract.models import GIB, ModelSpec
from lynxtop.contract.status import NodeSet

DEFAULT_GPU_MEMORY_UTILIZATION = 0.9  # vLLM's default
# vLLM's default max_num_seqs (EngineArgs._set_default_args; its test_defaults_with_usage_context): 1024 on GPUs of
# 70 GiB or more except A100, else 256
LARGE_GPU_BYTES, LARGE_GPU_MAX_NUM_SEQS, DEFAULT_MAX_NUM_SEQS = 70 * GIB, 1024, 256
BLACKWELL_MIN_DRIVER = 570  # CUDA 12.8, the first toolkit with SM100

# Attention backends and the compute capabilities (major) they run on (reference/vllm.md).
BACKEND_ARCH: dict[str, tuple[tuple[int, ...], str]] = {
    "FLASHMLA": ((9,), "dense FlashMLA runs on SM90 (Hopper: H100/H200/H800/H20) only"),
    "FLASHMLA_SPARSE": ((9, 10), "FlashMLA-sparse runs on SM90 and SM100 (B200/GB200/B300)"),
    "CUTLASS_MLA": ((10,), "CUTLASS MLA runs on SM100 (Blackwell) only"),
    "FLASHINFER_MLA": ((10,), "FlashInfer MLA (TRT-LLM kernels) runs on SM100 (Blackwell) only"),
    "FLASH_ATTN_MLA": ((9,), "FlashAttention MLA (FA3) runs on SM90 (Hopper) only"),
}
# What to use instead, by compute capability major
_BACKEND_FOR = {9: "FLASHMLA (or FLASHMLA_SPARSE)", 10: "CUTLASS_MLA (or FLASHMLA_SPARSE for sparse attention)"}

# Weight formats and compute capability (as major*10+minor): (the least vLLM's gate accepts, the first with native
# kernels, what runs between). The gate is vllm/config/vllm.py's `capability < quant_config.get_min_capability()`
# with each QuantizationConfig's get_min_capability() (vllm/model_executor/layers/quantization/, v0.30): fp8 75,
# modelopt (FP8) 80, modelopt_fp4 75, modelopt_mixed 89, mxfp4 80, awq 75, gptq 60, the Marlin ones 75.
QUANT_ARCH: dict[str, tuple[int, int, str]] = {
    "fp8": (75, 89, "FP8 W8A8 runs on SM89 and newer (Ada, Hopper, Blackwell); SM75-86 run the FP8 weights through "
                    "Marlin W8A16 (weight-only, slower), and vLLM before v0.30 needs SM80 for fp8"),
    "modelopt": (80, 89, "ModelOpt FP8 runs natively on SM89 and newer; vLLM before v0.30 refuses it below SM89"),
    "modelopt_fp4": (75, 100, "FP4 tensor cores are SM100 and newer (Blackwell); SM75-90 run NVFP4 weights through "
                              "Marlin W4A16 (weight-only, slower), and older vLLM releases refuse them below SM100"),
    "modelopt_mixed": (89, 89, "ModelOpt mixed precision (FP8 + NVFP4) needs SM89 or newer, with no fallback"),
    "mxfp4": (80, 100, "MXFP4 runs natively on SM100 and newer; SM80-90 dequantize it (slower)"),
    "awq": (75, 75, "AWQ needs SM75 or newer"),
    "awq_marlin": (75, 75, "Marlin kernels need SM75 or newer"),
    "gptq_marlin": (75, 75, "Marlin kernels need SM75 or newer"),
    "gptq": (60, 60, "GPTQ needs SM60 or newer"),
}
# --quantization's choices in vLLM (vllm/model_executor/layers/quantization/__init__.py QuantizationMethods)
VLLM_QUANT_METHODS = frozenset(QUANT_ARCH) | {
    "fbgemm_fp8", "fp_quant", "modelopt_mxfp8", "gguf", "humming", "compressed-tensors", "bitsandbytes",
    "experts_int8", "quark", "moe_wna16", "torchao", "inc", "gpt_oss_mxfp4", "deepseek_v4_fp8", "cpu_awq", "online",
    "fp8_per_tensor", "fp8_per_block", "int8_per_channel_weight_only", "mxfp8", "marlin", "auto_awq", "auto_gptq",
}
# Weight formats the model table names that are not --quantization choices: dtypes, and NVFP4 (ModelOpt's format)
_NOT_METHODS = {"bf16": "it is a dtype: --dtype bfloat16", "bfloat16": "it is a dtype", "fp16": "it is a dtype: "
                "--dtype float16", "float16": "it is a dtype", "half": "it is a dtype", "fp32": "it is a dtype",
                "float32": "it is a dtype", "nvfp4": "vLLM's method for ModelOpt NVFP4 checkpoints is modelopt_fp4"}
# Checkpoint formats and the --quantization values vLLM accepts for them (its override_quantization_method)
_SAME_FORMAT = {"awq": {"awq", "awq_marlin", "marlin"}, "gptq": {"gptq", "gptq_marlin", "marlin"},
                "nvfp4": {"modelopt_fp4"}, "modelopt_fp4": {"modelopt_fp4"}}
_SPEC_WITHOUT_DRAFT = {"ngram", "ngram_gpu", "suffix"}  # proposers that load no weights
# DCP needs the attention backend to return the softmax LSE for decode (the model runner asserts
# `need_to_return_lse_for_decode`); these have `can_return_lse_for_decode = True` in every release read, others
# only in newer ones (CUTLASS_MLA, FLASHINFER_MLA, FLASHMLA_SPARSE) or not at all
DCP_BACKENDS = frozenset({"FLASHMLA", "TRITON_MLA"})


class Level(StrEnum):
    OK = "ok"
    WARNING = "warning"
    BLOCKING = "blocking"
    UNKNOWN = "unknown"  # not checked: a fact is missing


@dataclass(frozen=True)
class Verdict:
    check: str  # attention, flags, memory, parallelism, ray, driver, nvlink, dcp, speculative, quantization
    level: Level
    reason: str
    fix: str = ""
    numbers: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"check": self.check, "level": str(self.level), "reason": self.reason, "fix": self.fix,
                "numbers": self.numbers}


@dataclass(frozen=True)
class GpuFacts:
    index: int
    name: str
    cc: tuple[int, int] | None
    mem_total_bytes: int | None
    nvlink_count: int | None = None  # active links; None: unknown
    uuid: str | None = None  # NVML's "GPU-..." (CUDA_VISIBLE_DEVICES may name it)
    pci_bus_id: str | None = None  # CUDA_DEVICE_ORDER=PCI_BUS_ID numbers the GPUs by it


@dataclass(frozen=True)
class ClusterFacts(NodeSet):
    """Ray's view of the cluster, read on a head from its state API (agent/cluster/view.py's parse_nodes); alive, lost,
    gpus_alive and shortfall are NodeSet's, as the head's serving gate counts them."""

    error: str | None = None  # why the view could not be read; then `nodes` says nothing

    def to_json(self) -> dict[str, Any]:
        return {"error": self.error, "gpus_alive": self.gpus_alive, "nodes_alive": len(self.alive),
                "nodes": [{"node_id": n.node_id, "ip": n.ip, "name": n.name, "head": n.head, "alive": n.alive,
                           "gpus": n.gpus, "state_message": n.state_message} for n in self.nodes]}


@dataclass(frozen=True)
class NodeFacts:
    gpus: tuple[GpuFacts, ...]
    driver_version: str = ""
    ray_installed: bool | None = None  # beside the profile's executable; None: not looked
    cluster: ClusterFacts | None = None  # a head's view of its Ray cluster; None: a single node, or not looked


@dataclass(frozen=True)
class Report:
    profile: str
    model: str
    verdicts: tuple[Verdict, ...]

    @property
    def exit_code(self) -> int:
        levels = {v.level for v in self.verdicts}
        if Level.BLOCKING in levels:
            return 2
        return 1 if levels & {Level.WARNING, Level.UNKNOWN} else 0

    def lines(self, level: Level) -> list[str]:
        return [v.reason + (f" (fix: {v.fix})" if v.fix else "") for v in self.verdicts if v.level == level]

    def to_json(self) -> dict[str, Any]:
        return {"profile": self.profile, "model": self.model, "exit_code": self.exit_code,
                "verdicts": [v.to_json() for v in self.verdicts]}


def facts_from_info(gpus: Iterable[dict[str, Any]], driver_version: str = "",
                    ray_installed: bool | None = None) -> NodeFacts:
    """NodeFacts from the sampler's static() rows or the node's gpu_info() dicts (missing keys: unknown)."""
    out = []
    for i, g in enumerate(gpus):
        cc = (g["cc_major"], g.get("cc_minor") or 0) if g.get("cc_major") is not None else None
        out.append(GpuFacts(index=g.get("index", g.get("idx", i)), name=g.get("name") or "?", cc=cc,
                            mem_total_bytes=g.get("mem_total_bytes"), nvlink_count=g.get("nvlink_count"),
                            uuid=g.get("uuid"), pci_bus_id=g.get("pci_bus_id")))
        driver_version = driver_version or g.get("driver_version") or ""
    return NodeFacts(gpus=tuple(out), driver_version=driver_version, ray_installed=ray_installed)


def ray_installed(executable: str) -> bool:
    """Ray in the vLLM environment: its `ray` script beside `vllm`, or the package in that venv's site-packages."""
    bindir = Path(executable).parent
    if (bindir / "ray").exists():
        return True
    return any(bindir.parent.glob("lib/python3*/site-packages/ray/__init__.py"))


def gib(n: float) -> str:
    return f"{n / GIB:.1f} GiB"


# ---------------------------------------------------------------------------------------------- the checks


def check_profile(profile: Profile, node: NodeFacts, model: ModelSpec | None) -> Report:
    opts = extra_options(profile.extra_args)
    verdicts = [*_flags(profile), *_attention(profile, node.gpus),
                *_parallelism(profile, node.gpus, model, node.cluster), *_dcp(profile, model, opts),
                *_speculative(profile, model, opts), *_quantization(profile, visible_gpus(profile, node.gpus), model),
                *_ray(profile, node), *_driver(node), *_nvlink(profile, node.gpus), _memory(profile, node.gpus, model)]
    return Report(profile=profile.name, model=profile.model, verdicts=tuple(verdicts))


def visible_gpus(profile: Profile, gpus: tuple[GpuFacts, ...]) -> tuple[GpuFacts, ...]:
    """The GPUs vLLM will see, in CUDA's order (visible.py: the profile's env over this process's environment)."""
    return visible_with_problem(profile, gpus)[0]


def visible_with_problem(profile: Profile, gpus: tuple[GpuFacts, ...]) -> tuple[tuple[GpuFacts, ...], str | None]:
    """visible_gpus, and what hides GPUs CUDA_VISIBLE_DEVICES names (an invalid entry, an empty value), with where
    the value comes from. Not mappable here (MIG devices, UUIDs or bus ids unknown): as many GPUs as it names."""
    env = cuda_visible.effective_env(profile.env)
    rows = [{"index": g.index, "uuid": g.uuid, "pci_bus_id": g.pci_bus_id} for g in gpus]
    picked, problem = cuda_visible.visible_gpus(env, rows)
    cvd = env.get(cuda_visible.CVD)
    if picked is None:
        return (gpus if cvd is None else gpus[:len([d for d in cvd.split(",") if d.strip()])]), None
    by_index = {g.index: g for g in gpus}
    if problem is not None and cuda_visible.CVD not in profile.env:
        problem += " (not set in the profile's env: inherited from the environment)"
    return tuple(by_index[i] for i in picked), problem


# `vllm serve` flags that older vLLM took and vLLM 0.32 (the newest whose option list was read: sim/vllm_options.py)
# does not: flag -> (what it was, what to do). A profile written for an older vLLM still carries them; the newer
# vLLM exits 2 with "unrecognized arguments" at every start. Refused where the vLLM beside the profile's executable
# is 0.32 or newer, else a warning (the node may run an older vLLM that takes it).
# tests/agent/test_s23_vllm_drift_flags.py checks each is absent from 0.32 and each replacement present.
_SPEC_FIX = "use --speculative-config '{\"model\": ..., \"num_speculative_tokens\": N}' instead"
REMOVED_FLAGS: dict[str, tuple[str, str]] = {
    "--swap-space": ("the V0 engine's CPU swap space", "remove it (the V1 engine has no CPU swap space)"),
    "--disable-log-requests": ("requests are no longer logged by default",
                               "remove it (--enable-log-requests turns request logging on)"),
    "--speculative-model": ("speculative decoding's old flags", _SPEC_FIX),
    "--num-speculative-tokens": ("speculative decoding's old flags", _SPEC_FIX),
    "--num-scheduler-steps": ("the V0 engine's multi-step scheduling", "remove it"),
    "--guided-decoding-backend": ("renamed with structured outputs",
                                  "use --structured-outputs-config.backend NAME instead"),
    "--task": ("split into runner and convert", "use --runner (generate, pooling) or --convert instead"),
    "--max-seq-len-to-capture": ("CUDA graph capture by sequence length",
                                 "use --max-cudagraph-capture-size instead"),
    "--cuda-graph-sizes": ("renamed", "use --cudagraph-capture-sizes instead"),
    "--tokenizer-pool-size": ("the V0 tokenizer pool", "remove it"),
    "--use-v2-block-manager": ("the V0 block manager switch", "remove it"),
    "--preemption-mode": ("the V0 engine's preemption by swapping", "remove it"),
    "--disable-async-output-proc": ("the V0 engine's output processing switch", "remove it"),
    "--worker-use-ray": ("the old Ray switch", "use --distributed-executor-backend ray instead"),
}


SHUTDOWN_TIMEOUT_SINCE = (0, 18)  # the first vLLM that takes --shutdown-timeout (reference notes)
REMOVED_BY = (0, 32)  # REMOVED_FLAGS are known gone from this version on (its option list was read)


def installed_vllm_version(executable: str) -> str | None:
    """The version of the vLLM package in the profile's environment, from its dist-info beside `vllm` (pip's
    virtualenv layout, as `ray_installed` looks), read from METADATA without importing vLLM (seconds, and CUDA);
    None where there is none, several, or it cannot be read: then nothing is judged by version."""
    try:
        found = list(Path(executable).parent.parent.glob("lib/python3*/site-packages/vllm-*.dist-info/METADATA"))
        if len(found) != 1:
            return None
        with found[0].open(encoding="utf-8", errors="replace") as f:
            head = f.read(65536)
    except OSError:
        return None
    for line in head.splitlines():
        if line.startswith("Version:"):
            version = line[len("Version:"):].strip()
            return version if version and len(version) <= 64 and version.isprintable() else None
        if not line:  # the headers end at the first blank line
            break
    return None


def _minor(version: str | None) -> tuple[int, int] | None:
    """(major, minor) of a version string ("0.10.2", "0.11.0rc1", "0.33.1+cu128"); None when it has none."""
    m = re.match(r"(\d+)\.(\d+)", version or "")
    return (int(m.group(1)), int(m.group(2))) if m else None


def _removed_flags(args: Iterable[str], version: str | None) -> list[Verdict]:
    """One verdict per extra_args flag that vLLM 0.32 no longer takes, named as written, with its replacement:
    refused where the installed vLLM is 0.32 or newer (it would exit at every start), else a warning."""
    out = []
    minor = _minor(version)
    gone = minor is not None and minor >= REMOVED_BY
    installed = f"; the installed vLLM is {version}" if version else ""
    for token in args:
        written = token.split("=", 1)[0]
        if not written.startswith("--"):
            continue
        name = "--" + written[2:].split(".", 1)[0].replace("_", "-")  # vLLM reads `_` as `-` in a long flag's name
        if name not in REMOVED_FLAGS:
            continue
        what, fix = REMOVED_FLAGS[name]
        shown = token if len(token) <= 80 else token[:80] + "..."
        out.append(Verdict("flags", Level.BLOCKING if gone else Level.WARNING,
                           f"{shown} in extra_args: vLLM 0.32 (the newest version checked) has no {name} ({what})"
                           f"{installed}; a vLLM without it exits with 'unrecognized arguments' at every start, "
                           "which the agent retries into a crash loop",
                           fix if gone else f"{fix}, or keep it only while this node runs a vLLM that still takes it"))
    return out


def _shutdown_timeout(profile: Profile, version: str | None) -> list[Verdict]:
    """shutdown_timeout_s (default 30) passes --shutdown-timeout, which vLLM before 0.18 does not take."""
    minor = _minor(version)
    if not profile.shutdown_timeout_s or minor is None or minor >= SHUTDOWN_TIMEOUT_SINCE:
        return []
    n = profile.shutdown_timeout_s
    return [Verdict("flags", Level.BLOCKING,
                    f"shutdown_timeout_s = {n} passes --shutdown-timeout {n}, which vLLM takes from 0.18 on; the vLLM "
                    f"installed beside {profile.executable} is {version}: it would exit with 'unrecognized arguments' "
                    "at every start",
                    "set shutdown_timeout_s = 0 in the profile (a stop then aborts the requests in flight), or "
                    "upgrade vLLM to 0.18 or newer")]


def _flags(profile: Profile) -> list[Verdict]:
    version = installed_vllm_version(profile.executable)
    out = _removed_flags(profile.extra_args, version) + _shutdown_timeout(profile, version)
    if any(a.split("=", 1)[0] == "--enable-flashmla" for a in profile.extra_args):
        out.append(Verdict("flags", Level.BLOCKING,
                           "--enable-flashmla is not a vLLM flag (it is SGLang's): vLLM exits with 'unrecognized "
                           "arguments'",
                           "remove it from extra_args; choose the backend with attention_backend = \"FLASHMLA\" "
                           "(vLLM's --attention-backend FLASHMLA, SM90 only) or FLASHMLA_SPARSE (SM90 and SM100)"))
    if "VLLM_ATTENTION_BACKEND" in profile.env:
        out.append(Verdict("flags", Level.WARNING,
                           "VLLM_ATTENTION_BACKEND is deprecated and ignored by recent vLLM",
                           f"set attention_backend = \"{profile.env['VLLM_ATTENTION_BACKEND']}\" (--attention-backend) "
                           "and drop the variable"))
    return out


def _attention(profile: Profile, gpus: tuple[GpuFacts, ...]) -> list[Verdict]:
    backend = profile.attention_backend
    if not backend:
        return [Verdict("attention", Level.OK, "no attention backend set: vLLM picks one for the GPU")]
    if backend not in BACKEND_ARCH:
        return [Verdict("attention", Level.OK, f"attention backend {backend}: no architecture limit known")]
    majors, fact = BACKEND_ARCH[backend]
    known = [g for g in gpus if g.cc is not None]
    if not known:
        return [Verdict("attention", Level.UNKNOWN, f"attention backend {backend}: GPU architecture unknown; {fact}")]
    bad = sorted({f"{g.name} (SM{g.cc[0]}{g.cc[1]})" for g in known if g.cc and g.cc[0] not in majors})
    if not bad:
        archs = ", ".join(sorted({f"{g.name} (SM{g.cc[0]}{g.cc[1]})" for g in known if g.cc}))
        return [Verdict("attention", Level.OK, f"attention backend {backend} runs on {archs}")]
    major = known[0].cc[0] if known[0].cc else 0
    instead = _BACKEND_FOR.get(major, "TRITON_MLA, or leave attention_backend unset so vLLM picks one")
    return [Verdict("attention", Level.BLOCKING, f"attention backend {backend} does not fit {', '.join(bad)}: {fact}",
                    f"attention_backend = {instead} (vLLM's --attention-backend)")]


def _parallelism(profile: Profile, gpus: tuple[GpuFacts, ...], model: ModelSpec | None,
                 cluster: ClusterFacts | None = None) -> list[Verdict]:
    tp, pp, dp = profile.tensor_parallel_size, profile.pipeline_parallel_size, profile.data_parallel_size
    shown, problem = visible_with_problem(profile, gpus)
    needed, visible = tp * pp * dp, len(shown)
    shape = f"tensor {tp} x pipeline {pp} x data {dp}"
    out = []
    if model is not None and model.attention_heads % tp:
        out.append(Verdict("parallelism", Level.BLOCKING,
                           f"{model.name} has {model.attention_heads} attention heads; tensor parallel {tp} does not "
                           "divide them (vLLM refuses)", "a tensor_parallel_size that divides the heads"))
    nodes = math.ceil(needed / visible) if visible else 0
    numbers = {"gpus_needed": needed, "gpus_visible": visible, "nodes_needed": nodes}
    if cluster is not None and profile.distributed_executor_backend == "ray":
        out.append(_cluster_verdict(profile, needed, shape, cluster, numbers))
        return out
    msg = f"profile {profile.name} needs {needed} GPUs ({shape}); {visible} visible on this node"
    span = f" (0-{len(gpus) - 1})" if gpus else ""
    cvd_fix = (f"correct {cuda_visible.CVD}: GPU indices{span}, UUIDs or unique UUID prefixes (nvidia-smi -L), "
               "every entry valid")
    if problem is not None:
        msg += f": {problem}"
    if visible >= needed:
        level = Level.OK if problem is None else Level.WARNING
        out.append(Verdict("parallelism", level, msg, cvd_fix if problem else "", numbers=numbers))
        return out
    if profile.distributed_executor_backend == "ray":
        out.append(Verdict("parallelism", Level.WARNING, msg + f"; the rest must come from the Ray cluster "
                                                              f"({nodes} nodes of {visible})",
                           "start Ray on the other nodes before this profile (ray start --address HEAD:6379)",
                           numbers))
    else:
        out.append(Verdict("parallelism", Level.BLOCKING, msg,
                           cvd_fix if problem else "lower the parallel sizes to the GPUs here, or spread the profile "
                           f"over {nodes} nodes with distributed_executor_backend = \"ray\"", numbers))
    return out


def _cluster_verdict(profile: Profile, needed: int, shape: str, cluster: ClusterFacts,
                     numbers: dict[str, Any]) -> Verdict:
    """A Ray profile on a head: Ray's own count of the cluster's GPUs decides (vLLM places its workers there)."""
    msg = f"profile {profile.name} needs {needed} GPUs ({shape})"
    if cluster.error is not None:
        return Verdict("parallelism", Level.UNKNOWN,
                       f"{msg}; Ray's view of the cluster cannot be read: {cluster.error}",
                       "is this head's Ray running? `lynxtop status` shows it, `lynxtop ray start` starts it", numbers)
    alive, have = cluster.alive, cluster.gpus_alive
    numbers = numbers | {"gpus_cluster": have, "nodes_alive": len(alive), "nodes_lost": len(cluster.lost)}
    shortfall = cluster.shortfall(needed)  # the serving gate's words (agent/cluster/view.py's ClusterWatch.missing)
    if shortfall is None:
        return Verdict("parallelism", Level.OK, f"{msg}; Ray reports {have:g} GPUs on {len(alive)} node"
                                                f"{'' if len(alive) == 1 else 's'}", numbers=numbers)
    return Verdict("parallelism", Level.WARNING, f"{msg}; Ray reports {shortfall}",
                   "run the agent with agent.role = \"worker\" and ray.head_address = this head on the missing "
                   "nodes (`lynxtop start` there if their Ray is stopped); the head holds the profile, waiting, "
                   "until Ray has the GPUs", numbers)


def _ray(profile: Profile, node: NodeFacts) -> list[Verdict]:
    needed = profile.tensor_parallel_size * profile.pipeline_parallel_size * profile.data_parallel_size
    if profile.distributed_executor_backend != "ray" and needed <= len(visible_gpus(profile, node.gpus)):
        return []
    if node.ray_installed is None:
        return [Verdict("ray", Level.UNKNOWN, "a multi-node profile needs Ray; not looked for")]
    if not node.ray_installed:
        return [Verdict("ray", Level.WARNING, f"a multi-node profile needs Ray; none found beside {profile.executable}",
                        "pip install 'ray[default]' into the vLLM environment, then `ray start --head --port 6379` "
                        "here and `ray start --address HEAD:6379` on the other nodes")]
    where = ("the agent runs it on this head and each worker (agent.role)" if node.cluster is not None
             else "start it on every node first")
    return [Verdict("ray", Level.OK, f"Ray is installed in the vLLM environment ({where})")]


def _driver(node: NodeFacts) -> list[Verdict]:
    if not node.driver_version:
        return []
    try:
        major = int(node.driver_version.split(".")[0])
    except ValueError:
        return []
    blackwell = [g for g in node.gpus if g.cc and g.cc[0] >= 10]
    if blackwell and major < BLACKWELL_MIN_DRIVER:
        return [Verdict("driver", Level.BLOCKING, f"driver {node.driver_version} is older than R{BLACKWELL_MIN_DRIVER}"
                                                  f", the first with Blackwell support ({blackwell[0].name})",
                        f"install driver {BLACKWELL_MIN_DRIVER} or newer")]
    return [Verdict("driver", Level.OK, f"driver {node.driver_version}")]


def _nvlink(profile: Profile, gpus: tuple[GpuFacts, ...]) -> list[Verdict]:
    if profile.tensor_parallel_size < 2 or not gpus:
        return []
    used = visible_gpus(profile, gpus)
    if any(g.nvlink_count is None for g in used):
        return []
    without = [g.index for g in used if not g.nvlink_count]
    if without:
        return [Verdict("nvlink", Level.WARNING,
                        f"GPUs {without} have no active NVLink: tensor parallel {profile.tensor_parallel_size} "
                        "all-reduces over PCIe, several times slower per token",
                        "use NVLink-connected GPUs for tensor parallelism, or data/pipeline parallelism across PCIe")]
    links = min(g.nvlink_count or 0 for g in used)
    return [Verdict("nvlink", Level.OK, f"NVLink: {links} active links per GPU")]


# ---------------------------------------------------------------------------------------------- extra_args options


def _dcp(profile: Profile, model: ModelSpec | None, opts: ExtraOptions) -> list[Verdict]:
    """Decode context parallel reuses the TP ranks (vllm/config/parallel.py: `tp % dcp`), and for GQA shards only
    the KV heads' duplicates (docs/serving/context_parallel_deployment.md: dcp in [1, tp / kv heads])."""
    if opts.dcp_error:
        return [Verdict("dcp", Level.BLOCKING, opts.dcp_error,
                        "-dcp N with N dividing tensor_parallel_size, or drop it")]
    dcp, tp = opts.dcp, profile.tensor_parallel_size
    if dcp == 1:
        return []
    if opts.pcp != 1:
        return [Verdict("dcp", Level.UNKNOWN, f"{opts.dcp_token} with prefill context parallel {opts.pcp}: vLLM's DCP "
                                              "rule is then different (1, PCP or TP x PCP); not checked")]
    divisors = [d for d in range(1, tp + 1) if tp % d == 0]
    if tp % dcp:
        return [Verdict("dcp", Level.BLOCKING,
                        f"decode context parallel {dcp} ({opts.dcp_token}) does not divide tensor parallel {tp}: DCP "
                        f"shards the KV cache over the TP ranks, and vLLM refuses ('tp_size={tp} must be divisible "
                        f"by dcp_size={dcp}')", f"-dcp one of {', '.join(map(str, divisors))}")]
    if model is not None and not model.mla_latent_dim and model.kv_heads:
        heads = model.kv_heads
        if tp <= heads:
            return [Verdict("dcp", Level.BLOCKING,
                            f"{model.name} has {heads} KV heads and tensor parallel {tp} splits them without copies: "
                            f"DCP has nothing to shard, and vLLM refuses ('tensor parallel size {tp} must be greater "
                            f"than total num kv heads {heads} when enable decode context parallel')",
                            f"drop {opts.dcp_token}, or tensor_parallel_size above {heads}")]
        if dcp > tp // heads:
            return [Verdict("dcp", Level.BLOCKING,
                            f"decode context parallel {dcp} is above tensor parallel {tp} / {heads} KV heads = "
                            f"{tp // heads}, vLLM's bound for a GQA model", f"-dcp {tp // heads} or less")]
    backend = profile.attention_backend
    if backend and backend not in DCP_BACKENDS:
        return [Verdict("dcp", Level.WARNING,
                        f"decode context parallel {dcp} with attention backend {backend}: DCP needs a backend that "
                        "returns the softmax LSE for decode, and vLLM releases differ for this one (older ones "
                        "refuse: 'DCP requires attention impls to return the softmax lse for decode')",
                        f"attention_backend = {' or '.join(sorted(DCP_BACKENDS))}, or a vLLM whose {backend} has it")]
    return [Verdict("dcp", Level.OK, f"decode context parallel {dcp}: the KV cache is sharded over {dcp} of the {tp} "
                                     f"TP ranks, each GPU holds 1/{dcp} of it", numbers={"dcp": dcp})]


def _method(spec: dict[str, Any]) -> str:
    """The speculative method as vLLM names it: unnamed is "draft_model", and every "<model>_mtp" of its
    MTPModelTypes is an alias of "mtp" (vllm/config/speculative.py)."""
    method = str(spec.get("method") or "draft_model")
    return "mtp" if method.endswith("_mtp") else method


def own_draft(profile: Profile, model: ModelSpec | None, opts: ExtraOptions) -> tuple[int, int] | None:
    """(draft layers, speculative tokens) when the profile drafts with the checkpoint's own draft layers as the model
    table describes them (memory counts them); None otherwise."""
    spec = opts.spec
    if spec is None or opts.spec_error or model is None or not model.draft_method or spec.get("model"):
        return None
    if _method(spec) != model.draft_method:
        return None
    k = spec.get("num_speculative_tokens", model.draft_block)
    return (model.draft_layers, k) if isinstance(k, int) and not isinstance(k, bool) and k > 0 else None


def _speculative(profile: Profile, model: ModelSpec | None, opts: ExtraOptions) -> list[Verdict]:
    """vllm/config/speculative.py: SpeculativeConfig.__post_init__ and _verify_args, as they refuse a config."""
    if opts.spec_error:
        return [Verdict("speculative", Level.BLOCKING, opts.spec_error,
                        '--speculative-config \'{"method": "...", "num_speculative_tokens": N}\'')]
    spec = opts.spec
    if spec is None:
        return []
    tp, method, k = profile.tensor_parallel_size, _method(spec), spec.get("num_speculative_tokens")
    if "tensor_parallel_size" in spec:
        return [Verdict("speculative", Level.BLOCKING, "--speculative-config has tensor_parallel_size, which vLLM "
                                                       "refuses there", "draft_tensor_parallel_size (1 or the TP)")]
    if spec.get("draft_tensor_parallel_size") not in (None, 1, tp):
        return [Verdict("speculative", Level.BLOCKING,
                        f"draft_tensor_parallel_size {spec['draft_tensor_parallel_size']!r}: vLLM takes only 1 or the "
                        f"target's tensor parallel size {tp}",
                        f"draft_tensor_parallel_size 1 or {tp}, or leave it out")]
    if k is not None and (not isinstance(k, int) or isinstance(k, bool) or k < 1):
        return [Verdict("speculative", Level.BLOCKING, f"num_speculative_tokens {k!r}: vLLM takes a whole number "
                                                       "above 0", '"num_speculative_tokens": 1 or more')]
    if method in _SPEC_WITHOUT_DRAFT:
        return [Verdict("speculative", Level.OK, f"speculative decoding by {method}: no draft weights to load")]
    if spec.get("model"):
        return [Verdict("speculative", Level.UNKNOWN, f"speculative decoding by {method} with draft "
                                                      f"{spec['model']}: not in the model table, its memory is not "
                                                      "counted")]
    if method not in ("mtp", "dspark"):
        return [Verdict("speculative", Level.BLOCKING,
                        f"speculative method {method} without a draft model: vLLM refuses ('num_speculative_tokens was "
                        "provided but without speculative model')",
                        'name the draft ("model"), or the checkpoint\'s own draft layers ("method": "mtp" or '
                        '"dspark"), or "method": "ngram"')]
    if model is None:
        return [Verdict("speculative", Level.UNKNOWN,
                        f"speculative method {method}: {profile.model} is not in the model table, whether its "
                        "checkpoint has such draft layers is not checked", "describe it in a [[model]] table")]
    return [_own_draft_verdict(model, spec, method, k)]


def _own_draft_verdict(model: ModelSpec, spec: dict[str, Any], method: str, k: int | None) -> Verdict:
    written = spec.get("method")
    if not model.draft_method:
        return Verdict("speculative", Level.BLOCKING, f"{model.name} ships no draft layers: method {written} has "
                                                      "nothing to load", '"method": "ngram", or a separate draft '
                                                                         'model, or no --speculative-config')
    if method != model.draft_method:
        return Verdict("speculative", Level.BLOCKING,
                       f"{model.name}'s draft layers are {model.draft_method}, not {method}: vLLM refuses method "
                       f"{written!r} for this architecture", f'"method": "{model.draft_method}"')
    block = model.draft_block
    k = block if k is None else k
    if block and k > block and k % block:
        return Verdict("speculative", Level.BLOCKING,
                       f"num_speculative_tokens {k}: one {method} round drafts {block} tokens, and above that vLLM "
                       f"needs a multiple of it ('num_speculative_tokens:{k} must be divisible by n_predict={block}')",
                       f'"num_speculative_tokens": {block * (k // block)} or {block * (k // block + 1)}')
    return Verdict("speculative", Level.OK,
                   f"speculative decoding by {method}: {k} tokens a step from the checkpoint's {model.draft_layers} "
                   f"draft layers ({model.draft_params_b:g}B parameters, counted in memory)",
                   numbers={"num_speculative_tokens": k, "draft_layers": model.draft_layers})


def _quantization(profile: Profile, gpus: tuple[GpuFacts, ...], model: ModelSpec | None) -> list[Verdict]:
    """The weight format against the checkpoint and each GPU's compute capability (vLLM's gate, QUANT_ARCH)."""
    asked = (profile.quantization or "").lower()
    native = model.native_quantization.lower() if model is not None else ""
    if asked in _NOT_METHODS:
        fix = (f"leave quantization unset: vLLM reads the checkpoint's own format ({native})" if native
               else "leave quantization unset: vLLM reads the checkpoint's own format")
        return [Verdict("quantization", Level.BLOCKING,
                        f"quantization {profile.quantization!r} is not a --quantization choice of vLLM "
                        f"({_NOT_METHODS[asked]}): it exits with 'invalid choice'",
                        fix + ("; --quantization modelopt_fp4 for an NVFP4 checkpoint" if asked == "nvfp4" else ""))]
    out = []
    if asked and asked not in VLLM_QUANT_METHODS:
        out.append(Verdict("quantization", Level.WARNING, f"quantization {profile.quantization!r} is not among vLLM's "
                                                          "--quantization choices this check knows: vLLM exits with "
                                                          "'invalid choice' unless your version has it"))
    checkpoint = native if native not in _NOT_METHODS or native == "nvfp4" else ""
    if asked and checkpoint and asked not in _SAME_FORMAT.get(checkpoint, {checkpoint}):
        official = model is not None and profile.model.rstrip("/").lower() == model.name.lower()
        out.append(Verdict("quantization", Level.BLOCKING if official else Level.WARNING,
                           f"{profile.model} ships {checkpoint} weights; vLLM refuses another --quantization "
                           f"('Quantization method specified in the model config ({checkpoint}) does not match the "
                           f"quantization method specified in the `quantization` argument ({asked})')"
                           + ("" if official else " if this checkpoint is the table's"),
                           f"leave quantization unset (the checkpoint's {checkpoint}), or point model at a "
                           f"checkpoint quantized with {asked}"))
    method = asked or {"nvfp4": "modelopt_fp4"}.get(checkpoint, checkpoint)
    if method in QUANT_ARCH:
        out.append(_quant_arch(method, "" if asked else " (as shipped)", gpus))
    return out


def _quant_arch(method: str, how: str, gpus: tuple[GpuFacts, ...]) -> Verdict:
    least, native, fact = QUANT_ARCH[method]
    known = [g for g in gpus if g.cc is not None]
    if not known:
        return Verdict("quantization", Level.UNKNOWN, f"{method} weights{how}: GPU architecture unknown; {fact}")
    names = sorted({f"{g.name} (SM{g.cc[0]}{g.cc[1]})" for g in known if g.cc})
    low = min(g.cc[0] * 10 + g.cc[1] for g in known if g.cc)
    if low < least:
        return Verdict("quantization", Level.BLOCKING,
                       f"{method} weights{how} on {', '.join(names)}: vLLM refuses ('The quantization method {method} "
                       f"is not supported for the current GPU. Minimum capability: {least}. Current capability: "
                       f"{low}.'); {fact}", "a checkpoint in bf16 or a format these GPUs run, or newer GPUs")
    if low < native:
        return Verdict("quantization", Level.WARNING, f"{method} weights{how} on {', '.join(names)}: no native "
                                                      f"kernels below SM{native}; {fact}",
                       f"expect lower throughput than on SM{native}+, or a format these GPUs run natively")
    return Verdict("quantization", Level.OK, f"{method} weights{how} run natively on {', '.join(names)}")


# ---------------------------------------------------------------------------------------------- memory


@dataclass(frozen=True)
class MemoryFit:
    """One GPU's budget for `profile` (bytes); see the module docstring for the formulas."""

    gpu_bytes: int
    budget: int  # gpu_memory_utilization x GPU memory
    weights: int  # this GPU's share
    overhead: int
    kv_per_token: int  # this GPU's bytes per token (all its layers)
    context: int
    seqs: int
    lookahead: int = 0  # speculative tokens each sequence holds beyond its context

    @property
    def per_seq(self) -> int:
        return self.context + self.lookahead

    @property
    def kv_free(self) -> int:
        return self.budget - self.weights - self.overhead

    @property
    def kv_needed(self) -> int:
        return self.kv_per_token * self.per_seq * self.seqs

    @property
    def kv_tokens(self) -> int:
        return max(self.kv_free // self.kv_per_token, 0)

    @property
    def margin(self) -> int:
        return self.kv_free - self.kv_needed

    def numbers(self) -> dict[str, int]:
        return {"gpu_bytes": self.gpu_bytes, "budget_bytes": self.budget, "weights_bytes": self.weights,
                "overhead_bytes": self.overhead, "kv_bytes_per_token": self.kv_per_token,
                "kv_needed_bytes": self.kv_needed, "kv_free_bytes": self.kv_free, "margin_bytes": self.margin,
                "kv_tokens": self.kv_tokens, "largest_context": max(self.kv_tokens - self.lookahead, 0),
                "largest_concurrency": self.kv_tokens // self.per_seq, "context": self.context, "seqs": self.seqs,
                "lookahead": self.lookahead}


def weights_per_gpu(total: int, *, tp: int, pp: int, dp: int, expert_parallel: bool, expert_share: float) -> int:
    shards = max(tp * pp, 1)
    if not expert_parallel or not expert_share:
        return total // shards
    experts = total * expert_share
    return round((total - experts) / shards + experts / (shards * max(dp, 1)))


def default_max_num_seqs(gpu: GpuFacts) -> int:
    large = (gpu.mem_total_bytes or 0) >= LARGE_GPU_BYTES and "a100" not in gpu.name.lower()
    return LARGE_GPU_MAX_NUM_SEQS if large else DEFAULT_MAX_NUM_SEQS


def memory_fit(profile: Profile, model: ModelSpec, gpu: GpuFacts, *, tp: int | None = None) -> MemoryFit | None:
    """The budget of one GPU, or None when the model table has no size for the profile's quantization."""
    total = model.weights_bytes(profile.quantization)
    if total is None:
        return None
    tp = tp or profile.tensor_parallel_size
    pp = profile.pipeline_parallel_size
    opts = extra_options(profile.extra_args)
    dcp = opts.dcp if not opts.dcp_error and opts.pcp == 1 and tp % opts.dcp == 0 else 1  # else blocking elsewhere
    util = profile.gpu_memory_utilization or DEFAULT_GPU_MEMORY_UTILIZATION
    weights = weights_per_gpu(total, tp=tp, pp=pp, dp=profile.data_parallel_size,
                              expert_parallel=profile.enable_expert_parallel, expert_share=model.expert_share)
    layer_bytes = model.kv_bytes_per_token_layer(profile.kv_cache_dtype, tp)
    per_token = -(-layer_bytes * math.ceil(model.layers / pp) // dcp)  # DCP: each rank 1/dcp of the tokens
    lookahead = 0
    draft = own_draft(profile, model, opts)
    if draft is not None:  # on the last pipeline stage; counted on every GPU, as the smallest may hold it
        layers, lookahead = draft
        draft_tp = (opts.spec or {}).get("draft_tensor_parallel_size") or tp
        weights += round(model.draft_params_b * 1e9 * total / (model.params_b * 1e9) / draft_tp)
        per_token += layer_bytes * layers
    gpu_bytes = gpu.mem_total_bytes or 0
    return MemoryFit(gpu_bytes=gpu_bytes, budget=int(util * gpu_bytes), weights=weights,
                     overhead=model.overhead_bytes, kv_per_token=per_token,
                     context=profile.max_model_len or model.context_window,
                     seqs=profile.max_num_seqs or default_max_num_seqs(gpu), lookahead=lookahead)


def _memory(profile: Profile, gpus: tuple[GpuFacts, ...], model: ModelSpec | None) -> Verdict:
    if model is None:
        return Verdict("memory", Level.UNKNOWN, f"model {profile.model} is not in the model table: memory fit not "
                                                "checked", "describe it in a [[model]] table of the config")
    sized = [g for g in visible_gpus(profile, gpus) if g.mem_total_bytes]
    if not sized:
        return Verdict("memory", Level.UNKNOWN, "GPU memory unknown: memory fit not checked")
    smallest = min(sized, key=lambda g: g.mem_total_bytes or 0)
    fit = memory_fit(profile, model, smallest)
    if fit is None:
        return Verdict("memory", Level.UNKNOWN, f"no bytes per parameter for quantization {profile.quantization!r} "
                                                f"of {model.name}: memory fit not checked",
                       "add it to bytes_per_param in a [[model]] table")
    extra = f" + {fit.lookahead} speculative" if fit.lookahead else ""
    head = (f"per GPU: weights {gib(fit.weights)} + overhead {gib(fit.overhead)} + KV cache {gib(fit.kv_needed)} "
            f"({fit.seqs} x {fit.context}{extra} tokens) vs {gib(fit.budget)} "
            f"({profile.gpu_memory_utilization or DEFAULT_GPU_MEMORY_UTILIZATION:g} x {gib(fit.gpu_bytes)})")
    if fit.kv_tokens < fit.per_seq:
        return _memory_blocking(profile, model, fit, head, smallest)
    numbers = fit.numbers()
    if fit.margin < 0:
        return Verdict("memory", Level.WARNING,
                       f"{head}: {gib(-fit.margin)} short; at full context {numbers['largest_concurrency']} of "
                       f"{fit.seqs} sequences fit at once, vLLM queues the rest",
                       f"max_num_seqs = {numbers['largest_concurrency']} for full-context requests, or max_model_len "
                       f"= {fit.kv_tokens // fit.seqs - fit.lookahead} for {fit.seqs} at once; or more GPUs", numbers)
    return Verdict("memory", Level.OK, f"{head}: fits with {gib(fit.margin)} to spare", numbers=numbers)


def _memory_blocking(profile: Profile, model: ModelSpec, fit: MemoryFit, head: str, gpu: GpuFacts) -> Verdict:
    numbers = fit.numbers()
    if fit.kv_free <= 0:
        why = f"the weights and overhead alone exceed the budget by {gib(-fit.kv_free)}"
    else:
        why = (f"one sequence of max_model_len {fit.context} needs {gib(fit.kv_per_token * fit.per_seq)} of KV cache, "
               f"{gib(fit.kv_free)} is left: vLLM refuses to start")
    fixes = []
    if numbers["largest_context"] >= 16:
        fixes.append(f"max_model_len = {numbers['largest_context']} (the largest context that fits)")
    tp_needed = _tp_that_fits(profile, model, gpu)
    if tp_needed:
        gpus = tp_needed * profile.pipeline_parallel_size * profile.data_parallel_size
        numbers["gpus_needed_to_fit"] = gpus
        fixes.append(f"tensor_parallel_size = {tp_needed} ({gpus} GPUs of {gib(fit.gpu_bytes)})")
    if not (profile.kv_cache_dtype or "").startswith("fp8"):
        fixes.append('kv_cache_dtype = "fp8"')
    return Verdict("memory", Level.BLOCKING, f"{head}: {why}", "; or ".join(fixes) or "more or larger GPUs", numbers)


def _tp_that_fits(profile: Profile, model: ModelSpec, gpu: GpuFacts) -> int | None:
    """The smallest power-of-two TP, above the profile's, whose GPUs hold the weights and one full sequence."""
    tp = profile.tensor_parallel_size * 2
    while tp <= 1024:
        fit = memory_fit(profile, model, gpu, tp=tp)
        if fit is not None and fit.kv_tokens >= fit.per_seq:
            return tp
        tp *= 2
    return None
