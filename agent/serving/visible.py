"""The GPUs a profile's vLLM will see, by NVML index: one reading for the GPUs-taken look and `lynxtop check`.

CUDA reads CUDA_VISIBLE_DEVICES from the environment vLLM is started with: the profile's env over the agent's own
(launcher.child_env, the very merge the launch uses), so an agent started with `Environment=CUDA_VISIBLE_DEVICES=4,5`
serves on GPUs 4 and 5 and is checked there. CUDA's rules (CUDA programming guide, CUDA_VISIBLE_DEVICES):
- entries are CUDA indices, full GPU UUIDs or unique UUID prefixes (`GPU-8932f937`), or MIG UUIDs;
- the first entry that names no GPU (an index past the last, `-1`, a UUID of no GPU here, a prefix of several) is
  invalid: it and every entry after it are hidden (`0,2,-1,1` shows GPUs 0 and 2);
- an empty value hides every GPU;
- CUDA_DEVICE_ORDER=PCI_BUS_ID numbers the GPUs by PCI bus id; otherwise FASTEST_FIRST, which NVML cannot tell:
  taken as NVML's index order (on a node of identical GPUs it is PCI order in practice, as NVML's is).
MIG UUIDs are not mapped to their GPUs here: every GPU counts (None), as does a fact the rows lack (UUIDs, bus ids).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from lynxtop.agent.serving.launcher import child_env

CVD = "CUDA_VISIBLE_DEVICES"
ORDER = "CUDA_DEVICE_ORDER"
_INDEX = re.compile(r"[0-9]+")


def effective_env(profile_env: Mapping[str, str], base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment vLLM is started with (launcher.child_env: `base`, default this process's, under the
    profile's env); the token is a placeholder, never read here."""
    return child_env(profile_env, "", base)


def _order(env: Mapping[str, str], gpus: Sequence[Mapping[str, Any]]) -> list[int] | None:
    """NVML indices in CUDA's numbering; None: PCI order asked for but some GPU's bus id is unknown."""
    indices = [g.get("index") for g in gpus]
    if env.get(ORDER, "").strip().upper() != "PCI_BUS_ID":
        return sorted(i for i in indices if isinstance(i, int))
    if any(not g.get("pci_bus_id") or not isinstance(g.get("index"), int) for g in gpus):
        return None
    return [g["index"] for g in sorted(gpus, key=lambda g: str(g["pci_bus_id"]).lower())]


def _by_uuid(entry: str, gpus: Sequence[Mapping[str, Any]]) -> tuple[int | None, str | None]:
    """(NVML index, None) for a UUID or unique prefix; (None, why) when it names no GPU or several."""
    want = entry.lower()
    hits = [g["index"] for g in gpus if str(g.get("uuid") or "").lower().startswith(want)]
    if len(hits) == 1:
        return hits[0], None
    if not hits:
        return None, "matches no GPU's UUID here"
    return None, f"is an ambiguous UUID prefix: it matches {len(hits)} GPUs ({', '.join(map(str, hits))})"


def visible_gpus(env: Mapping[str, str], gpus: Sequence[Mapping[str, Any]] | None
                 ) -> tuple[list[int] | None, str | None]:
    """(the NVML indices CUDA shows under `env`, in CUDA's order; None: all GPUs, or not knowable here, problem).

    `env`: the effective environment (effective_env). `gpus`: rows with `index`, `uuid`, `pci_bus_id` (the node
    view's gpu_info, or the sampler's static rows with `idx`). `problem`: what hides GPUs the value names (an
    invalid entry, an empty value), for the operator; None when every entry is a GPU."""
    cvd = env.get(CVD)
    if cvd is None:
        return None, None
    if not cvd.strip():
        return [], f"{CVD} is empty: CUDA shows no GPU"
    rows = [dict(g, index=g.get("index", g.get("idx"))) for g in gpus or []]
    if not rows:
        return None, None  # no GPU facts: nothing to map the entries to
    entries = [e.strip() for e in cvd.split(",")]
    if any(e.upper().startswith("MIG-") for e in entries):
        return None, None
    order = _order(env, rows)
    if order is None:
        return None, None
    if any(e.upper().startswith("GPU-") for e in entries) and any(not g.get("uuid") for g in rows):
        return None, None
    out: list[int] = []
    for n, entry in enumerate(entries):
        why: str | None = None
        if _INDEX.fullmatch(entry):
            if int(entry) < len(order):
                index: int | None = order[int(entry)]
            else:
                index, why = None, f"is not a CUDA index here ({len(order)} GPUs: 0-{len(order) - 1})"
        elif entry.upper().startswith("GPU-"):
            index, why = _by_uuid(entry, rows)
        else:
            index, why = None, "is neither a GPU index nor a GPU UUID"
        if index is None:
            rest = entries[n + 1:]
            hidden = f" and the {len(rest)} after it ({','.join(rest)})" if rest else ""
            return out, (f"{CVD}={cvd}: entry {entry or '(empty)'} {why}; CUDA hides it{hidden}, so "
                         f"{len(out)} GPU(s) are visible")
        if index not in out:
            out.append(index)
    return out, None
