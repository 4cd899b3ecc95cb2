"""vLLM metrics pages for scrape tests: the simulator's 0.32 families after random traffic, any DP size."""

from __future__ import annotations

import random

from prometheus_client import generate_latest

from lynxtop.sim.metrics import VllmMetrics


def sim_page(engines: int, seed: int, models: tuple[str, ...] = ("deepseek-ai/DeepSeek-V4.1",)) -> str:
    """The simulator's vLLM 0.32 families after some random traffic on every engine (and every model)."""
    rng = random.Random(seed)
    out = []
    for model in models:
        m = VllmMetrics(model_name=model, version=(0, 32), max_model_len=32768, spec_decode=True,
                        cache_info={"block_size": "16"}, engines=engines)
        for e in range(engines):
            for _ in range(rng.randint(1, 6)):
                m.on_step({"running": rng.randint(0, 16), "waiting": rng.randint(0, 9), "kv": rng.random(),
                           "it": rng.randint(1, 512), "prompt": rng.randint(0, 4000), "gen": rng.randint(0, 64),
                           "pq": 100, "ph": rng.randint(0, 100), "sd": 3, "sdt": 9, "sa": rng.randint(0, 9),
                           "first": [(1, rng.uniform(0.01, 3.0))], "itl": [rng.uniform(0.005, 0.3) for _ in range(5)],
                           "fin": [{"reason": "length", "e2e_s": rng.uniform(1, 60), "queue_s": rng.random(),
                                    "inference_s": 2.0, "prefill_s": 0.3, "decode_s": 1.7, "prompt_tokens": 900,
                                    "generation_tokens": 77, "max_tokens": 128, "tpot_s": rng.uniform(0.01, 0.2)}]},
                          e)
        out.append(_families(generate_latest(m.registry).decode()))
    # one page, as one registry with a model_name label writes it: each family once, every model's samples in it
    page = out[0]
    for other in out[1:]:
        for name, lines in other.items():
            page[name] += [x for x in lines if not x.startswith("#")]
    return "".join(line + "\n" for lines in page.values() for line in lines)


def _families(text: str) -> dict[str, list[str]]:
    """The page's lines by family (a family starts at its HELP line), in page order."""
    fams: dict[str, list[str]] = {}
    current: list[str] = []
    for line in text.splitlines():
        if line.startswith("# HELP "):
            current = fams.setdefault(line.split()[2], [])
        current.append(line)
    return fams
