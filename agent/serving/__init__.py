"""Serving: one `vllm serve` run from start to stop, and the policy around it.

Owns the run's processes (launch, identity, members, orphans), readiness and health, start-up phases, backoff and
crash loops, switching between profiles and `lynxtop check`'s preflight. Writes nothing to the store directly:
rows and events leave through the node's sinks.
"""
