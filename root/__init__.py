"""lynxtop: node agent and terminal dashboard for GPU nodes serving vLLM.

The package root holds only the version. Its subpackages, bottom to top (docs/architecture.md):
`contract` (shapes every part agrees on, and the control API's client), `store` (the SQLite history),
`agent` (the node agent), `sim` (a simulated vLLM and GPUs), `tui` (the dashboard) and `cli` (the commands).
"""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("lynxtop")
except PackageNotFoundError:  # imported from a source checkout that is not installed (benchmarks/nvml_real.py)
    __version__ = "0+unknown"
