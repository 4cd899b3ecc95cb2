"""The HTTP families prometheus-fastapi-instrumentator adds to vLLM's /metrics page.

vLLM attaches `Instrumentator(excluded_handlers=[...]).add()` with the library's default metrics: five families,
registered in this order, with these labels and buckets. Probes (/metrics, /health, /load, /version…) are not
counted, and a request that matches no route counts under handler "none", as the instrumentator groups it.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram, Summary

EXCLUDED_HANDLERS = frozenset({"/metrics", "/health", "/load", "/ping", "/version", "/server_info"})
HIGHR_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1, 1.5, 2, 2.5, 3, 3.5, 4, 4.5, 5, 7.5, 10, 30,
                 60)
LOWR_BUCKETS = (0.1, 0.5, 1)
_SIZE_NOTE = "Only value of header is respected. Otherwise ignored. No percentile calculated. "


class HttpMetrics:
    """http_requests_total, http_request_size_bytes, http_response_size_bytes and the two latency histograms."""

    def __init__(self, registry: CollectorRegistry):
        self.requests = Counter("http_requests", "Total number of requests by method, status and handler.",
                                ("method", "status", "handler"), registry=registry)
        self.request_size = Summary("http_request_size_bytes",
                                    "Content length of incoming requests by handler. " + _SIZE_NOTE, ("handler",),
                                    registry=registry)
        self.response_size = Summary("http_response_size_bytes",
                                     "Content length of outgoing responses by handler. " + _SIZE_NOTE, ("handler",),
                                     registry=registry)
        self.latency_highr = Histogram("http_request_duration_highr_seconds",
                                       "Latency with many buckets but no API specific labels. Made for more "
                                       "accurate percentile calculations. ", buckets=HIGHR_BUCKETS,
                                       registry=registry)
        self.latency_lowr = Histogram("http_request_duration_seconds",
                                      "Latency with only few buckets by handler. Made to be only used if "
                                      "aggregation by handler is important. ", ("method", "handler"),
                                      buckets=LOWR_BUCKETS, registry=registry)

    def observe(self, handler: str | None, method: str, status: int, seconds: float, request_bytes: int,
                response_bytes: int) -> None:
        """One finished request; `handler` is the route template (None: no route matched)."""
        handler = handler or "none"
        if handler in EXCLUDED_HANDLERS:
            return
        self.requests.labels(method, f"{status // 100}xx", handler).inc()
        self.request_size.labels(handler).observe(request_bytes)
        self.response_size.labels(handler).observe(response_bytes)  # a stream has no Content-Length: 0
        self.latency_highr.observe(seconds)
        self.latency_lowr.labels(method, handler).observe(seconds)
