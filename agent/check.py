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
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

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


class Level(StrEnum):
    OK = "ok"
    WARNING = "warning"
    BLOCKING = "blocking"
    UNKNOWN = "unknown"  # not checked: a fact is missing


@dataclass(frozen=True)
class Verdict:
    check: str  # attention, flags, memory, parallelism, ray, driver, nvlink
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


@dataclass(frozen=True)
class ClusterFacts(NodeSet):
    """Ray's view of the cluster, read on a head from its state API (agent/cluster.py's parse_nodes); alive, lost,
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
                            mem_total_bytes=g.get("mem_total_bytes"), nvlink_count=g.get("nvlink_count")))
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
    verdicts = [*_flags(profile), *_attention(profile, node.gpus),
                *_parallelism(profile, node.gpus, model, node.cluster),
                *_ray(profile, node), *_driver(node), *_nvlink(profile, node.gpus), _memory(profile, node.gpus, model)]
    return Report(profile=profile.name, model=profile.model, verdicts=tuple(verdicts))


def visible_gpus(profile: Profile, gpus: tuple[GpuFacts, ...]) -> tuple[GpuFacts, ...]:
    """The GPUs vLLM will see: CUDA_VISIBLE_DEVICES in the profile's env narrows them (indices or UUIDs)."""
    cvd = profile.env.get("CUDA_VISIBLE_DEVICES")
    if cvd is None:
        return gpus
    wanted = [d.strip() for d in cvd.split(",") if d.strip()]
    picked = tuple(g for g in gpus if str(g.index) in wanted)
    return picked if len(picked) == len(wanted) else gpus[:len(wanted)]


def _flags(profile: Profile) -> list[Verdict]:
    out = []
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
    needed, visible = tp * pp * dp, len(visible_gpus(profile, gpus))
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
    if visible >= needed:
        out.append(Verdict("parallelism", Level.OK, f"profile {profile.name} needs {needed} GPUs ({shape}); "
                                                    f"{visible} visible on this node", numbers=numbers))
        return out
    msg = f"profile {profile.name} needs {needed} GPUs ({shape}); {visible} visible on this node"
    if profile.distributed_executor_backend == "ray":
        out.append(Verdict("parallelism", Level.WARNING, msg + f"; the rest must come from the Ray cluster "
                                                              f"({nodes} nodes of {visible})",
                           "start Ray on the other nodes before this profile (ray start --address HEAD:6379)",
                           numbers))
    else:
        out.append(Verdict("parallelism", Level.BLOCKING, msg,
                           "lower the parallel sizes to the GPUs here, or spread the profile over "
                           f"{nodes} nodes with distributed_executor_backend = \"ray\"", numbers))
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
    shortfall = cluster.shortfall(needed)  # the serving gate's words (agent/cluster.py's ClusterWatch.missing)
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

    @property
    def kv_free(self) -> int:
        return self.budget - self.weights - self.overhead

    @property
    def kv_needed(self) -> int:
        return self.kv_per_token * self.context * self.seqs

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
                "kv_tokens": self.kv_tokens, "largest_context": self.kv_tokens,
                "largest_concurrency": self.kv_tokens // self.context, "context": self.context, "seqs": self.seqs}


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
    util = profile.gpu_memory_utilization or DEFAULT_GPU_MEMORY_UTILIZATION
    weights = weights_per_gpu(total, tp=tp, pp=pp, dp=profile.data_parallel_size,
                              expert_parallel=profile.enable_expert_parallel, expert_share=model.expert_share)
    per_token = model.kv_bytes_per_token_layer(profile.kv_cache_dtype, tp) * math.ceil(model.layers / pp)
    gpu_bytes = gpu.mem_total_bytes or 0
    return MemoryFit(gpu_bytes=gpu_bytes, budget=int(util * gpu_bytes), weights=weights,
                     overhead=model.overhead_bytes, kv_per_token=per_token,
                     context=profile.max_model_len or model.context_window,
                     seqs=profile.max_num_seqs or default_max_num_seqs(gpu))


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
    head = (f"per GPU: weights {gib(fit.weights)} + overhead {gib(fit.overhead)} + KV cache {gib(fit.kv_needed)} "
            f"({fit.seqs} x {fit.context} tokens) vs {gib(fit.budget)} "
            f"({profile.gpu_memory_utilization or DEFAULT_GPU_MEMORY_UTILIZATION:g} x {gib(fit.gpu_bytes)})")
    if fit.kv_tokens < fit.context:
        return _memory_blocking(profile, model, fit, head, smallest)
    numbers = fit.numbers()
    if fit.margin < 0:
        return Verdict("memory", Level.WARNING,
                       f"{head}: {gib(-fit.margin)} short; at full context {numbers['largest_concurrency']} of "
                       f"{fit.seqs} sequences fit at once, vLLM queues the rest",
                       f"max_num_seqs = {numbers['largest_concurrency']} for full-context requests, or max_model_len "
                       f"= {fit.kv_tokens // fit.seqs} for {fit.seqs} at once; or more GPUs", numbers)
    return Verdict("memory", Level.OK, f"{head}: fits with {gib(fit.margin)} to spare", numbers=numbers)


def _memory_blocking(profile: Profile, model: ModelSpec, fit: MemoryFit, head: str, gpu: GpuFacts) -> Verdict:
    numbers = fit.numbers()
    if fit.kv_free <= 0:
        why = f"the weights and overhead alone exceed the budget by {gib(-fit.kv_free)}"
    else:
        why = (f"one sequence of max_model_len {fit.context} needs {gib(fit.kv_per_token * fit.context)} of KV cache, "
               f"{gib(fit.kv_free)} is left: vLLM refuses to start")
    fixes = []
    if fit.kv_tokens >= 16:
        fixes.append(f"max_model_len = {fit.kv_tokens} (the largest context that fits)")
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
        if fit is not None and fit.kv_tokens >= fit.context:
            return tp
        tp *= 2
    return None
