"""The structure of a vLLM /metrics page, values left out: what a faithful simulator must reproduce."""

from __future__ import annotations

import re

from prometheus_client.parser import text_string_to_metric_families

SIM_ONLY = ("lynxtop_",)  # the simulator's own family, saying it is simulated
_NAME = re.compile(r"^([^\s{]+)")
_LABEL = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"')
# label values that are part of the structure (the others, like cache_config_info's, follow the model)
_KEY_LABELS = ("engine", "finished_reason", "reason", "source", "sleep_state", "handler", "method", "status")


def families(text: str) -> dict[str, str]:
    """Family name -> type, the simulator's own families left out."""
    return {f.name: f.type for f in text_string_to_metric_families(text) if not f.name.startswith(SIM_ONLY)}


def label_sets(text: str) -> dict[str, set[frozenset[str]]]:
    """Sample name -> the label-name sets it appears with."""
    out: dict[str, set[frozenset[str]]] = {}
    for f in text_string_to_metric_families(text):
        for s in f.samples:
            if not s.name.startswith(SIM_ONLY):
                out.setdefault(s.name, set()).add(frozenset(s.labels))
    return out


def engines(text: str) -> dict[str, set[str]]:
    """vllm: sample name -> its engine label values."""
    out: dict[str, set[str]] = {}
    for f in text_string_to_metric_families(text):
        for s in f.samples:
            if s.name.startswith("vllm:") and "engine" in s.labels:
                out.setdefault(s.name, set()).add(s.labels["engine"])
    return out


def sample_order(text: str, prefix: str = "vllm:") -> dict[str, list[tuple]]:
    """Family -> its sample lines as (name, label names in line order, key label values), in page order."""
    out: dict[str, list[tuple]] = {}
    family = ""
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            family = line.split()[2]
            continue
        if not line or line.startswith("#") or not line.startswith(prefix):
            continue
        name = _NAME.match(line).group(1)  # type: ignore[union-attr]
        labels = _LABEL.findall(line[len(name):line.rfind("}") + 1]) if "{" in line else []
        key = tuple(v for k, v in labels if k in _KEY_LABELS)
        out.setdefault(family, []).append((name, tuple(k for k, _ in labels), key))
    return out


def family_order(text: str) -> list[tuple[str, str]]:
    """(name, type) of every `# TYPE` line, in page order."""
    return [(line.split()[2], line.split()[3]) for line in text.splitlines()
            if line.startswith("# TYPE ") and not line.split()[2].startswith(SIM_ONLY)]


def skeleton(text: str) -> list[str]:
    """The page line by line with the values left out: HELP and TYPE lines, then each sample's name and labels
    (cache_config_info's and python_info's label values follow the model and the interpreter: names only)."""
    out = []
    for line in text.splitlines():
        name = line.split(" ", 3)[2] if line.startswith(("# HELP ", "# TYPE ")) else line
        if not line or name.startswith(SIM_ONLY):
            continue
        if not line.startswith("#"):
            line = line.rsplit(" ", 1)[0]
            if line.startswith(("vllm:cache_config_info{", "python_info{")):
                line = line[:line.index("{")] + str(sorted(k for k, _ in _LABEL.findall(line)))
        out.append(line)
    return out
