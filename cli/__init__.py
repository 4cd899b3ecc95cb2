"""lynxtop: node agent and terminal dashboard for GPU nodes serving vLLM."""

__version__ = "0.1.0"
