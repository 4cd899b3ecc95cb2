"""A real aiohttp server on a free loopback port for a test's stand-in endpoints (vLLM pages, /health)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from aiohttp import web

from support.ports import free_port


def metrics_app(page: list[str]) -> web.Application:
    """A vLLM stand-in whose /metrics is `page[0]` at each read (the test rewrites it between scrapes); nothing
    else is served (a /version or /health read gets 404)."""
    async def metrics(_req: web.Request) -> web.Response:
        return web.Response(text=page[0], content_type="text/plain")

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    return app


@asynccontextmanager
async def serving(app: web.Application, host: str = "127.0.0.1") -> AsyncIterator[str]:
    """Yields the base URL. Port 0 lets the kernel choose, so tests running at once never collide."""
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, host, 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"http://{host}:{port}"
    finally:
        await runner.cleanup()


@asynccontextmanager
async def web_dashboard(argv: list[str]) -> AsyncIterator[int]:
    """`lynxtop dashboard --web`'s server (cli/web.py `make_server`) on a free loopback port, each tab's app `argv`;
    yields the port. Chosen before the start: the page it serves names it."""
    from lynxtop.cli.web import make_server  # only here: the agent tests' stand-in pages need none of it

    port = free_port()
    server = make_server(argv, "127.0.0.1", port)
    runner = web.AppRunner(await server._make_app())
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        yield port
    finally:
        await runner.cleanup()
