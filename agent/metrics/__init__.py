"""Serving metrics: vLLM's /metrics page read into rows, SLA state, and the agent's own Prometheus endpoint.

Owns the scrape (text parsing, histogram differences and quantiles), counters kept across vLLM restarts, and the
exporter's page. Pure readers of what the samplers produced; never starts or stops anything.
"""
