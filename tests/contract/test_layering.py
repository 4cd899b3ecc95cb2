"""The one-way layering of docs/architecture.md, checked on the source: a wrong import fails here, not in review.

contract <- store <- agent <- cli; contract <- tui <- cli; the package root is only the version. The simulator
(sim/) sees only the GPU backend protocol and the contract, and the agent reaches the simulator at one seam (the
node picking the "sim" GPU scenario). The dashboard talks to the agent through the one client (contract/client.py)
and reads the store, never the agent's insides; nothing below the commands imports them.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = {"contract": "lynxtop.contract", "store": "lynxtop.store", "agent": "lynxtop.agent", "tui": "lynxtop.tui",
            "sim": "lynxtop.sim", "cli": "lynxtop.cli", "root": "lynxtop"}
AGENT = ("lynxtop.agent", "lynxtop.store", "lynxtop.contract", "lynxtop.__version__")

# (folder glob, what its modules may import of the project); a prefix allows its submodules too. First match wins.
RULES: list[tuple[str, tuple[str, ...]]] = [
    ("contract/*.py", ("lynxtop.contract",)),
    ("store/*.py", ("lynxtop.store", "lynxtop.contract")),
    ("sim/*.py", ("lynxtop.sim", "lynxtop.agent.gpu.protocol", "lynxtop.contract")),
    ("agent/gpu/*.py", ("lynxtop.agent.gpu", "lynxtop.contract")),
    ("agent/node.py", (*AGENT, "lynxtop.sim.gpus")),  # the one seam: the node picks the simulated GPU scenario
    ("agent/**/*.py", AGENT),
    ("tui/**/*.py", ("lynxtop.tui", "lynxtop.contract", "lynxtop.store.reader", "lynxtop.store.export",
                     "lynxtop.store.errors", "lynxtop.store")),
    ("root/*.py", ("lynxtop.cli.__main__",)),
]


def project_imports(path: Path) -> set[str]:
    """Every `lynxtop...` name the module imports, at any depth (lazy imports in functions count too)."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "lynxtop":
            if node.module == "lynxtop":  # `from lynxtop import x`: x is a module or __version__
                out.update(f"lynxtop.{a.name}" for a in node.names)
            else:  # `from pkg import x`: x may be a module of pkg, so both names are checked
                out.add(node.module)
                out.update(f"{node.module}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.split(".")[0] == "lynxtop")
    return out


def _allowed(name: str, prefixes: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def _cases() -> list[tuple[str, tuple[str, ...]]]:
    seen: set[Path] = set()
    cases = []
    for pattern, allowed in RULES:
        for path in sorted(ROOT.glob(pattern)):
            if path not in seen and "__pycache__" not in path.parts:
                seen.add(path)
                cases.append((str(path.relative_to(ROOT)), allowed))
    return cases


@pytest.mark.parametrize(("module", "allowed"), _cases(), ids=[c[0] for c in _cases()])
def test_module_imports_only_its_layer_and_below(module, allowed):
    bad = sorted(n for n in project_imports(ROOT / module) if not _allowed(n, allowed))
    assert not bad, f"{module} imports {bad}; its layer may import only {allowed} (docs/architecture.md)"


def test_the_rules_cover_every_module_but_the_commands():
    covered = {c[0] for c in _cases()}
    every = {str(p.relative_to(ROOT)) for top in PACKAGES for p in (ROOT / top).rglob("*.py")
             if "__pycache__" not in p.parts}
    assert every - covered == {p for p in every if p.startswith("cli/") and p != "contract/client.py"}


def test_the_check_catches_a_wrong_import(tmp_path):
    fake = tmp_path / "x.py"
    fake.write_text("def f():\n    from lynxtop.agent.node import Node\n    from lynxtop.cli import ctl\n")
    assert project_imports(fake) == {"lynxtop.agent.node", "lynxtop.agent.node.Node", "lynxtop.cli", "lynxtop.cli.ctl"}
    tui_rule = dict(RULES)["tui/**/*.py"]
    assert not _allowed("lynxtop.agent.node", tui_rule) and not _allowed("lynxtop.cli.ctl", tui_rule)
    assert not _allowed("lynxtop.cli.ctl", AGENT) and not _allowed("lynxtop.sim.server", AGENT)
