"""The optional second listener on Ollama's port ([ollama] listen), for apps that hard-code it.

It serves the same application as [listen]'s port: every route, the same keys and site
checks. What differs is `/`: apps (and people) check that an Ollama server runs by reading
it, and Ollama answers "Ollama is running" there.
"""

from __future__ import annotations

from aiohttp import web

from .site_checks import local_port

OLLAMA_PORT = web.AppKey("ollama_port", int)
RUNNING = "Ollama is running"


@web.middleware
async def ollama_root(request: web.Request, handler):
    port = request.app.get(OLLAMA_PORT)
    if port is not None and request.path == "/" and request.method in ("GET", "HEAD") and local_port(request) == port:
        return web.Response(text=RUNNING)
    return await handler(request)


def mark_ollama_port(app: web.Application, address: tuple[str, int] | None) -> None:
    if address is not None:
        app[OLLAMA_PORT] = address[1]
