"""lynxtop: node agent and terminal dashboard for GPU nodes serving vLLM.

The package root holds only the version. Its subpackages, bottom to top (docs/architecture.md):
`contract` (shapes every part agrees on, and the control API's client), `store` (the SQLite history),
`agent` (the node agent), `sim` (a simulated vLLM and GPUs), `tui` (the dashboard) and `cli` (the commands).
"""

from __future__ import annotations

from typing import Any


def __getattr__(name: str) -> Any:
    """`__version__`, read from the installed metadata when first asked for: importlib.metadata (with email,
    zipfile and csv) costs ~0.1 s of every start, and the dashboard's first frame never shows the version."""
    if name != "__version__":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from importlib.metadata import PackageNotFoundError, version

    try:
        value = version("lynxtop")
    except PackageNotFoundError:  # imported from a source checkout that is not installed (benchmarks/nvml_real.py)
        value = "0+unknown"
    globals()["__version__"] = value  # looked up once
    return value
