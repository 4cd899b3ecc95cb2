"""GET of a vLLM server's /metrics page and /version, within a size cap and a timeout.

Owns the HTTP side of a scrape: the URLs, the timeout and the page size limit. Invariants: a page over
MAX_PAGE_BYTES is cut off unread (announced or streamed), never buffered whole; only a 200 is a page (a redirect
is not followed); every failure is a sentence naming the URL (the failed row's error), never an exception to the
caller. A plain http:// page is read over the fetcher's own kept-alive connection (agent/metrics/pageconn.py:
aiohttp's client was a fifth of a DP=8 scrape's CPU); other URLs (https, credentials in the URL) through the
agent's aiohttp session.
"""

from __future__ import annotations

import asyncio
import json
from urllib.parse import urlsplit

import aiohttp

from lynxtop.agent.metrics.pageconn import AnswerRefused, PageConnection, PageTooLarge, StatusRefused
from lynxtop.agent.serving.health import read_capped, version_of

# aiohttp asks for gzip by default; a server that honours it (prometheus_client's own ASGI app does; vLLM 0.32's
# instrumentator handler does not) would compress a DP=8 page (~0.3 MB) on its event loop for the agent to inflate.
_PLAIN = {"Accept-Encoding": "identity"}
MAX_PAGE_BYTES = 8 * 1024 * 1024  # a DP=8 page with two API servers is ~0.5 MiB; past this it is cut off unread


class PageFetcher:
    """Reads one server's pages; `url` is its /metrics, `base_url` the server (a trailing /metrics dropped)."""

    def __init__(self, url: str, timeout_s: float):
        base = url.rstrip("/")
        if base.endswith("/metrics"):
            base = base[: -len("/metrics")]
        self.base_url = base
        self.url = base + "/metrics"
        self.timeout_s = timeout_s
        self.conn = _direct(self.url)  # None: read through the session

    async def get(self, session: aiohttp.ClientSession) -> bytes | str:
        """The page's bytes, or why it could not be read (the failed row's error)."""
        if self.conn is not None:
            return await self._get_direct(self.conn)
        try:
            async with session.get(self.url, headers=_PLAIN, allow_redirects=False,
                                   timeout=aiohttp.ClientTimeout(total=self.timeout_s)) as resp:
                if resp.status != 200:
                    return f"HTTP {resp.status} from {self.url}"
                if (resp.content_length or 0) > MAX_PAGE_BYTES:
                    return (f"page cut off: {resp.content_length} bytes announced, over the {MAX_PAGE_BYTES} "
                            f"byte limit, at {self.url}")
                if resp.content_length is not None:  # announced within the limit, and the parser keeps to it
                    return await resp.read()
                chunks: list[bytes] = []
                size = 0
                async for chunk in resp.content.iter_chunked(1 << 16):  # read(n) may stop early: loop to EOF
                    size += len(chunk)
                    if size > MAX_PAGE_BYTES:
                        return f"page cut off: larger than {MAX_PAGE_BYTES} bytes at {self.url}"
                    chunks.append(chunk)
                return b"".join(chunks)
        except TimeoutError:
            return f"page cut off: timed out after {self.timeout_s:g} s reading {self.url}"
        except aiohttp.ClientError as exc:
            return f"cannot read {self.url}: {exc or type(exc).__name__}"
        except OSError as exc:
            return f"cannot read {self.url}: {exc}"

    async def _get_direct(self, conn: PageConnection) -> bytes | str:
        try:
            async with asyncio.timeout(self.timeout_s):
                return await conn.get(MAX_PAGE_BYTES)
        except StatusRefused as exc:
            return f"HTTP {exc.status} from {self.url}"
        except PageTooLarge as exc:  # the words of the session's path above
            return (f"{exc}, at {self.url}" if exc.announced is not None else f"{exc} at {self.url}")
        except AnswerRefused as exc:
            return f"cannot read {self.url}: {exc}"
        except TimeoutError:
            return f"page cut off: timed out after {self.timeout_s:g} s reading {self.url}"
        except asyncio.IncompleteReadError as exc:
            return f"cannot read {self.url}: the answer ended after {len(exc.partial)} of {exc.expected} bytes"
        except (OSError, asyncio.LimitOverrunError, ValueError) as exc:
            return f"cannot read {self.url}: {exc or type(exc).__name__}"

    def close(self) -> None:
        """Drop the kept connection (a scraper replaced or stopped)."""
        if self.conn is not None:
            self.conn.close()

    async def version(self, session: aiohttp.ClientSession) -> str | None:
        """vLLM's version from GET /version, or None when it cannot be read (or is not one: agent/serving/health.py)."""
        try:
            async with session.get(
                self.base_url + "/version", timeout=aiohttp.ClientTimeout(total=self.timeout_s)
            ) as resp:
                if resp.status != 200:
                    return None
                body = await read_capped(resp)
            data = None if body is None else json.loads(body)
        except (aiohttp.ClientError, OSError, TimeoutError, ValueError):
            return None
        return version_of(data)


def _direct(url: str) -> PageConnection | None:
    """The kept connection for a plain http:// URL; None for one the session reads (https, credentials)."""
    try:
        parts = urlsplit(url)
        port = parts.port or 80
    except ValueError:
        return None  # the session gives the failed scrape its message
    if parts.scheme != "http" or not parts.hostname or parts.username is not None:
        return None
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    return PageConnection(parts.hostname, port, target)
