"""The built-in model table `lynxtop check` sizes a profile with; a config's `[[model]]` table overrides it.

Only what a memory and parallelism check needs: parameter counts, layer count, the KV-cache shape, the attention
heads TP must divide, and the bytes one parameter takes per quantization. Sizes are bytes, counts are plain
numbers (params_b in billions).

DeepSeek-V4.1 (284B MoE): the numbers are the ones the simulator (sim/model.py, SimParams) is calibrated
with, so the check and the simulated node agree, and they follow the DeepSeek-V3 family's config.json:
- 284B parameters in all, ~37B active per token (vLLM's estimated_flops basis). MoE sparsity saves compute, not
  memory: every expert stays resident, so the weights count in full.
- 61 layers, 128 attention heads; MLA caches one latent per token and layer: kv_lora_rank 512 + qk_rope_head_dim 64
  = 576 values (BF16: 1152 bytes; vLLM's fp8 MLA layout: 512 fp8 + 4 fp32 scales + 64 BF16 rope = 656 bytes). The
  latent is not split by TP: every TP rank holds the whole cache of its layers.
- Weights as shipped (FP8 block-quantized linear layers, BF16 norms, embeddings and scales): ~296 GB, i.e. 1.042
  bytes per parameter; BF16 2.0; 4-bit AWQ/GPTQ (group 128, FP16 scale and zero) 4.25 bits = 0.53; NVFP4
  (FP8 scale per 16 values) 4.5 bits = 0.5625; GGUF Q4_K_M ~165 GB (reference/vllm.md) = 0.58.
- The routed experts are ~95 % of the weights (expert_share): with expert parallelism they are spread over the
  DP x TP ranks instead of the TP x PP ones.
- Overhead per GPU: 5.5 GiB of activations and NCCL buffers (the profiling run's peak) plus 0.9 GiB of CUDA graphs.
- Context window 163,840 tokens (vLLM's default max_model_len for it).
- Speculative decoding: the checkpoint's draft stages are DSpark, not classic MTP. vLLM (vllm/config/speculative.py)
  refuses method "mtp" (and its aliases such as "deepseek_mtp") for model_type deepseek_v41 and takes "dspark",
  whose round drafts dspark_block_size = 5 tokens (n_predict): num_speculative_tokens above 5 must be a multiple of
  it. Three stages (num_nextn_predict_layers); their size is an estimate, about one decoder layer each (284B / 61
  layers = 4.7B): 14B, loaded beside the target, with one KV cache layer per stage.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

GIB = 1024**3


@dataclass(frozen=True)
class ModelSpec:
    name: str  # the Hugging Face id a profile's `model` names (matched case-insensitively, also by its last part)
    params_b: float  # all parameters, billions (every MoE expert included)
    active_params_b: float  # parameters one token touches, billions (compute, not memory)
    layers: int
    attention_heads: int
    context_window: int
    native_quantization: str  # the quantization the checkpoint ships in (profile.quantization unset)
    bytes_per_param: dict[str, float] = field(default_factory=dict)  # quantization -> bytes per parameter
    mla_latent_dim: int = 0  # MLA: cached values per token and layer (0: not MLA)
    mla_fp8_bytes: int = 0  # MLA: bytes per token and layer with an fp8 KV cache (vLLM's layout)
    kv_heads: int = 0  # GQA/MHA: KV heads (when mla_latent_dim is 0)
    head_dim: int = 0
    expert_share: float = 0.0  # routed experts' share of the weights (0: dense)
    overhead_bytes: int = 0  # per GPU: activations, NCCL buffers, CUDA graphs
    # speculative decoding with the checkpoint's own draft layers (vLLM's --speculative-config)
    draft_method: str = ""  # the method vLLM takes for them ("mtp", "dspark"); "": the checkpoint has none
    draft_block: int = 0  # tokens one draft round proposes (vLLM's n_predict)
    draft_layers: int = 0  # draft layers, each with its own KV cache layer
    draft_params_b: float = 0.0  # their parameters, billions, loaded beside the target's

    def matches(self, model: str) -> bool:
        want = model.rstrip("/").lower()
        return want == self.name.lower() or want.rsplit("/", 1)[-1] == self.name.lower().rsplit("/", 1)[-1]

    def weights_bytes(self, quantization: str | None) -> int | None:
        """All weights at `quantization` (None: as shipped), or None when this table has no size for it."""
        per = self.bytes_per_param.get((quantization or self.native_quantization).lower())
        return None if per is None else round(self.params_b * 1e9 * per)

    def kv_bytes_per_token_layer(self, kv_cache_dtype: str | None, tp: int) -> int:
        """One token's cache in one layer on one GPU: MLA's latent is whole on every TP rank; KV heads split."""
        fp8 = bool(kv_cache_dtype and kv_cache_dtype.startswith("fp8"))
        if self.mla_latent_dim:
            return self.mla_fp8_bytes if fp8 and self.mla_fp8_bytes else self.mla_latent_dim * (1 if fp8 else 2)
        heads = max(math.ceil(self.kv_heads / max(tp, 1)), 1)
        return 2 * heads * self.head_dim * (1 if fp8 else 2)


DEEPSEEK_V41 = ModelSpec(
    name="deepseek-ai/DeepSeek-V4.1",
    params_b=284.0,
    active_params_b=37.0,
    layers=61,
    attention_heads=128,
    context_window=163_840,
    native_quantization="fp8",
    bytes_per_param={"fp8": 296 / 284, "bf16": 2.0, "fp16": 2.0, "awq": 0.53, "gptq": 0.53, "awq_marlin": 0.53,
                     "gptq_marlin": 0.53, "modelopt_fp4": 0.5625, "nvfp4": 0.5625, "gguf": 0.58},
    mla_latent_dim=576,
    mla_fp8_bytes=656,
    expert_share=0.95,
    overhead_bytes=int(5.5 * GIB) + int(0.9 * GIB),
    draft_method="dspark",
    draft_block=5,
    draft_layers=3,
    draft_params_b=14.0,
)

BUILTIN_MODELS: tuple[ModelSpec, ...] = (DEEPSEEK_V41,)


def find_model(model: str, overrides: tuple[ModelSpec, ...] = ()) -> ModelSpec | None:
    """The description of `model`: a config's own `[[model]]` first, then the built-in table."""
    return next((m for m in (*overrides, *BUILTIN_MODELS) if m.matches(model)), None)
