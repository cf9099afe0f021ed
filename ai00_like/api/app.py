"""The aiohttp application: the route table in one place, the middlewares, start and stop.

Handlers are thin: `handler(request, serving)` decodes its body into a wire struct,
sends one message to the middleware and turns the events it gets back into a response
(a wire struct, encoded here) or an SSE stream.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import signal
import ssl
import tempfile
import zipfile
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from pathlib import Path

import msgspec
from aiohttp import web

from ..config import Config
from ..middleware import Middleware
from ..response_store import StoreError
from . import auth, files, logs, operations, site_checks
from .ai00 import admin, downloads
from .ai00 import models as ai00_models
from .ai00 import types as ai00
from .anthropic import routes as anthropic
from .errors import ANTHROPIC, OLLAMA, SURFACE, error_middleware
from .ollama import routes as ollama
from .ollama_port import mark_ollama_port, ollama_root
from .oai import chat, choose, completion, embedding, models, state
from .oai import types as oai
from .responses import routes as responses
from .responses import types as resp
from .saved_states import routes as saved
from .saved_states import transfer
from .saved_states import types as saved_types
from .openapi import OPENAPI_PATH, Route, openapi_document
from .pool import LEASES
from .serving import Serving
from .sse import REQUEST

log = logging.getLogger(__name__)

SERVING = web.AppKey("serving", Serving)

# Every OpenAI route answers under each prefix: /v1 for OpenAI clients, /api/oai/v1 and
# /api/oai for clients configured for Ai00.
OPENAI_PREFIXES = ("/v1", "/api/oai/v1", "/api/oai")
OPENAI_ROUTES = [
    Route("GET", "/models", models.list_models, "List the loaded model", returns=oai.ModelList),
    # Ids may contain "/" (Hugging Face style names, e.g. a served_name "RWKV/rwkv-7-world").
    Route("GET", "/models/{model:.+}", models.retrieve_model, "The loaded model, by id, file name or alias",
          returns=oai.ModelCard),
    Route("POST", "/chat/completions", chat.chat_completions, "Chat (RWKV prompt from Ai00's template)",
          body=oai.ChatCompletionRequest, returns=oai.ChatCompletion, streams=oai.ChatCompletionChunk),
    Route("POST", "/completions", completion.completions, "Text completion, one choice per prompt",
          body=oai.CompletionRequest, returns=oai.Completion, streams=oai.Completion),
    Route("POST", "/embeddings", embedding.embeddings, "Mean last-layer hidden state, L2-normalised",
          body=oai.EmbeddingRequest, returns=oai.EmbeddingList),
    # The Responses API, its state kept between turns (api/responses, response_store).
    Route("POST", "/responses", responses.create_response, "A response; `previous_response_id` continues a stored one "
          "from its RNN state", body=resp.CreateResponse, returns=resp.Response, streams=resp.Event),
    Route("GET", "/responses/{response_id}", responses.retrieve_response, "A stored response",
          returns=resp.Response),
    Route("DELETE", "/responses/{response_id}", responses.delete_response, "Delete a stored response",
          returns=resp.DeletedResponse),
    Route("GET", "/responses/{response_id}/input_items", responses.list_input_items,
          "The input items of a stored response", returns=resp.ItemList),
    # Named conversation states, kept in the response store (ours: api/saved_states).
    Route("POST", "/saved_states", saved.save_state, "Read a text or chat messages once and keep the state (ours)",
          body=saved_types.SaveStateRequest, returns=saved_types.SavedState),
    Route("GET", "/saved_states", saved.list_saved_states, "The caller's saved states (ours)",
          returns=saved_types.SavedStateList),
    Route("POST", "/saved_states/import", transfer.import_state, "A state file (.st or .pth, the body or the form "
          "field `file`) as a saved state; ?model=&name= (ours)", returns=saved_types.SavedState),
    Route("GET", "/saved_states/{state_id}", saved.retrieve_saved_state, "A saved state (ours)",
          returns=saved_types.SavedState),
    Route("DELETE", "/saved_states/{state_id}", saved.delete_saved_state, "Delete a saved state (ours)",
          returns=saved_types.DeletedSavedState),
    Route("GET", "/saved_states/{state_id}/content", transfer.state_content, "The saved state as a state file "
          "(.st, or ?format=pth) for Ai00 and state-tuning tools (ours)"),
    # Ai00's additions to its OpenAI routes.
    Route("POST", "/chooses", choose.chooses, "Rank choices by perplexity after an input (Ai00)",
          body=oai.ChooseRequest, returns=oai.ChoiceList),
    Route("POST", "/states", state.states, "The RNN state after an input, for the `state` field (Ai00)",
          body=oai.StatesRequest, returns=oai.StateList),
]

# Ai00's own routes, at Ai00's paths.
AI00_ROUTES = [
    Route("GET", "/api/models/info", ai00_models.models_info, "Server and model status", returns=ai00.ServerStatus),
    Route("GET", "/api/models/list", ai00_models.models_list, "Files in the models folder",
          returns=list[ai00.ModelFile]),
    Route("GET", "/api/models/state", ai00_models.models_state, "Status as server-sent events, on change",
          streams=ai00.ServerStatus),
    Route("GET", "/api/adapters", ai00_models.adapters, "Compute devices", returns=list[str]),
    Route("POST", "/admin/models/load", admin.load, "Load or replace the model", body=ai00.ReloadRequest,
          returns=ai00.ServerStatus),
    Route("GET", "/admin/models/unload", admin.unload, "Unload the model", returns=ai00.ServerStatus),
    Route("POST", "/admin/models/unload", admin.unload, "Unload the model", returns=ai00.ServerStatus),
    Route("POST", "/admin/models/save", admin.save, "Write the loaded model (LoRAs merged) as safetensors in the models folder", body=ai00.SaveRequest),
    Route("GET", "/api/models/catalogue", downloads.catalogue,
          "Released models, what fits this machine and what is downloaded (ours)", returns=list[ai00.CatalogueModel]),
    Route("POST", "/admin/models/pull", downloads.pull_start, "Download a model from the hub into the models folder (ours)",
          body=ai00.PullRequest, returns=ai00.Download),
    Route("GET", "/admin/models/pull", downloads.pull_list, "The downloads and their progress (ours)",
          returns=list[ai00.Download]),
    # File-system helpers (Ai00 §1.9), every path confined to the exposed folders (files.py).
    Route("GET", "/admin/files/roots", files.files_roots, "The folders the file routes take (ours)",
          returns=files.Roots),
    Route("POST", "/admin/files/dir", files.files_dir, "Files of a folder with size, hash and model info",
          body=files.DirRequest, returns=list[ai00.ModelFile]),
    Route("POST", "/admin/files/ls", files.files_dir, "Files of a folder (as /admin/files/dir)",
          body=files.DirRequest, returns=list[ai00.ModelFile]),
    Route("POST", "/admin/files/unzip", files.files_unzip, "Unpack a zip into assets/unzip or assets/temp",
          body=files.UnzipRequest, returns=files.UnzipResponse),
    Route("POST", "/admin/files/config/load", files.config_load, "Read and validate a config.toml",
          body=files.ConfigLoadRequest, returns=files.ConfigFile),
    Route("POST", "/admin/files/config/save", files.config_save, "Validate a config.toml, then write it atomically",
          body=files.ConfigSaveRequest, returns=files.ConfigFile),
]

# Operations: Prometheus metrics and the health probe (api/operations.py).
OPS_ROUTES = [
    Route("GET", "/metrics", operations.metrics_route, "Prometheus metrics (vLLM's names under `rwkv:`)"),
    Route("GET", "/health", operations.health_route, "200 when a model is ready, 503 while loading, with none or shutting down",
          returns=operations.Health),
]


def all_routes() -> list[tuple[str, Route]]:
    """(full path, route) for every route the server answers."""
    return [(prefix + r.path, r) for prefix in OPENAI_PREFIXES for r in OPENAI_ROUTES] + \
        [(r.path, r) for r in AI00_ROUTES + OPS_ROUTES] + \
        [(r.path, replace(r, surface=OLLAMA)) for r in ollama.ROUTES] + \
        [(r.path, replace(r, surface=ANTHROPIC)) for r in anthropic.ROUTES]


_json_encode = msgspec.json.Encoder().encode


def endpoint(handler: Callable[[web.Request, Serving], Awaitable[object]], surface: str):
    async def handle(request: web.Request) -> web.StreamResponse:
        serving = request.app[SERVING]
        REQUEST.set(request)
        leases: list = []  # the models this request uses (pool.py): held until it has ended
        LEASES.set(leases)
        try:
            result = await handler(request, serving)
        finally:
            serving.pool.release(leases)
        if isinstance(result, web.StreamResponse):
            return result
        return web.Response(body=_json_encode(result), content_type="application/json")

    handle.__name__ = handler.__name__
    setattr(handle, SURFACE, surface)  # its errors' envelope, even those raised before it runs (errors.py)
    return handle


def add_routes(app: web.Application) -> None:
    for path, route in all_routes():
        app.router.add_route(route.method, path, endpoint(route.handler, route.surface))
    document = msgspec.json.encode(openapi_document(all_routes()))

    async def openapi_json(request: web.Request) -> web.Response:
        return web.Response(body=document, content_type="application/json")

    app.router.add_get(OPENAPI_PATH, openapi_json)


# ------------------------------------------------------------------------------ the web page


def _web_root(config: Config, workdir: list[Path]) -> Path | None:
    """The folder to serve at /: `[web] path` itself, or a zip unpacked to a temporary folder."""
    if config.web is None:
        return None
    path = config.resolve(config.web.path)
    if path.is_dir():
        return path
    if path.is_file() and zipfile.is_zipfile(path):
        target = Path(tempfile.mkdtemp(prefix="ai00-like-web-"))
        workdir.append(target)
        with zipfile.ZipFile(path) as archive:
            archive.extractall(target)  # zipfile drops ".." and absolute member paths
        return target
    log.warning("[web] path %s is neither a folder nor a zip file: no web page is served", path)
    return None


# Browsers refuse a module script (`<script type="module">`) sent with a type that is not
# JavaScript's, and a guess from the system's tables can be wrong (Windows' registry may say
# text/plain for .js): the page's own kinds of file are named here.
WEB_PAGE_TYPES = {
    ".html": "text/html",
    ".js": "text/javascript",
    ".mjs": "text/javascript",
    ".css": "text/css",
}


def add_web_page(app: web.Application, root: Path) -> None:
    root = root.resolve()

    async def page(request: web.Request) -> web.StreamResponse:
        wanted = (root / request.match_info["tail"]).resolve()
        if not wanted.is_relative_to(root):
            raise web.HTTPNotFound()
        if wanted.is_dir():
            wanted = wanted / "index.html"
        if not wanted.is_file():
            raise web.HTTPNotFound()
        kind = WEB_PAGE_TYPES.get(wanted.suffix.lower())
        return web.FileResponse(wanted, headers={"Content-Type": kind} if kind else None)

    app.router.add_get("/{tail:.*}", page)
    app[auth.WEB_PAGE] = page  # open without a key


# ------------------------------------------------------------------------------ the application


def make_app(config: Config, middleware: Middleware) -> web.Application:
    app = web.Application(
        # Host and Origin first: a web page's request is refused before a key check or handler sees it.
        middlewares=[logs.request_log_middleware, error_middleware, site_checks.site_middleware(SERVING),
                     ollama_root, auth.access_middleware(SERVING)],
        client_max_size=config.listen.max_body_bytes,
    )
    mark_ollama_port(app, config.ollama.address())
    app[SERVING] = Serving(config, middleware)
    add_routes(app)

    async def response_headers(request: web.Request, response: web.StreamResponse) -> None:
        site_checks.cors_headers(request, response, config.listen.cors_origins)
        await logs.add_request_id(request, response)

    app.on_response_prepare.append(response_headers)
    workdirs: list[Path] = []
    root = _web_root(config, workdirs)
    if root is not None:
        add_web_page(app, root)

    async def cleanup(_app) -> None:
        for d in workdirs:
            shutil.rmtree(d, ignore_errors=True)

    app.on_cleanup.append(cleanup)
    return app


@dataclass
class RunningServer:
    runner: web.AppRunner
    serving: Serving
    host: str
    port: int
    load_task: asyncio.Task | None
    scheme: str = "http"

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.scheme}://{host}:{self.port}"

    async def stop(self, grace: float = 0.0, drain_delay: float = 0.0) -> None:
        """Answer /health with 503 and keep serving for `drain_delay` seconds (a load balancer
        takes the replica out meanwhile), then stop accepting connections, give running
        generations `grace` seconds to finish, end the rest cleanly (finish_reason and
        [DONE]) and close every connection."""
        if self.load_task is not None and not self.load_task.done():
            self.load_task.cancel()
        self.serving.draining = True
        if drain_delay > 0:
            try:  # a second signal cuts the delay short
                await asyncio.wait_for(self.serving.hurry.wait(), drain_delay)
            except TimeoutError:
                pass
        self.serving.closing = True
        for site in list(self.runner.sites):
            await site.stop()
        cancelled = await self.serving.drain(grace)
        if cancelled:
            log.info("ended %d generations still running at the end of the grace period (%.1f s at most)", cancelled, grace)
        await self.runner.cleanup()
        if self.serving.responses is not None:
            self.serving.responses.close()


async def start_server(config: Config, middleware: Middleware, *, ip: str | None = None,
                       port: int | None = None) -> RunningServer:
    """Listen at once, then load the configured model in the background."""
    tls = tls_context(config)
    app = make_app(config, middleware)
    # handler_cancellation: a client that disconnects cancels its handler, which cancels
    # its generation (the handlers set Cancel in their `finally`).
    # shutdown_timeout: what is left after stop()'s grace period (status streams) is cut short.
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None, shutdown_timeout=1.0)
    await runner.setup()
    host = ip if ip is not None else config.listen.ip
    site = web.TCPSite(runner, host, config.listen.port if port is None else port, ssl_context=tls)
    await site.start()
    bound = site._server.sockets[0].getsockname()[1] if site._server and site._server.sockets else port
    serving = app[SERVING]
    serving.listen_host = host
    scheme = "https" if tls else "http"
    log.info("listening on %s://%s:%s (OpenAI base URL: %s://%s:%s/v1)", scheme, host, bound, scheme, host, bound)
    await _listen_for_ollama(runner, config, tls)
    load_task = serving.start_configured_load()
    return RunningServer(runner, serving, host, bound, load_task, scheme)


async def _listen_for_ollama(runner: web.AppRunner, config: Config, tls: ssl.SSLContext | None) -> None:
    address = config.ollama.address()
    if address is None:
        return
    try:
        await web.TCPSite(runner, address[0], address[1], ssl_context=tls).start()
    except OSError as e:
        await runner.cleanup()
        raise ApiStartError(f"{config.source}: ollama.listen: cannot listen on {config.ollama.listen}: "
                            f"{e.strerror or e}") from None
    log.info("listening for Ollama's clients on %s://%s", "https" if tls else "http", config.ollama.listen)


def tls_context(config: Config) -> ssl.SSLContext | None:
    """HTTPS from [listen] tls_cert and tls_key (PEM files), or None for plain HTTP."""
    listen = config.listen
    if not listen.tls_cert:
        return None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    try:
        context.load_cert_chain(config.resolve(listen.tls_cert), config.resolve(listen.tls_key))
    except (OSError, ssl.SSLError) as e:
        raise ApiStartError(f"{config.source}: listen.tls_cert/tls_key: cannot use {listen.tls_cert} and "
                            f"{listen.tls_key}: {getattr(e, 'strerror', None) or e}") from None
    return context


def serve_forever(config: Config, *, ip: str | None = None, port: int | None = None) -> None:
    """The `ai00-like` command: run until SIGINT/SIGTERM."""

    async def main() -> None:
        middleware = Middleware()
        try:
            server = await start_server(config, middleware, ip=ip, port=port)
        except ApiStartError:
            middleware.close()
            raise
        except StoreError as e:  # before OSError: a read-only store is not a port that cannot be listened on
            middleware.close()
            raise ApiStartError(str(e)) from None
        except OSError as e:
            middleware.close()
            raise ApiStartError(f"cannot listen on {ip or config.listen.ip}:{port or config.listen.port}: "
                                f"{e.strerror or e}") from None
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()

        def on_signal() -> None:
            if stop.is_set():  # a second signal: do not wait out the grace period
                server.serving.hurry.set()
            stop.set()

        for sig in (signal.SIGINT, signal.SIGTERM):
            try:
                loop.add_signal_handler(sig, on_signal)
            except (NotImplementedError, RuntimeError):
                pass
        try:
            await stop.wait()
        finally:
            grace, delay = config.listen.shutdown_grace, config.listen.drain_delay
            if delay:
                log.info("draining: /health answers 503; requests are still served for %.1f s", delay)
            log.info("shutting down: no new connections%s; running requests get %.1f s to finish",
                     f" after {delay:.1f} s" if delay else "", grace)
            await server.stop(grace, delay)
            await asyncio.to_thread(middleware.close)
            log.info("stopped")

    with asyncio.Runner(loop_factory=event_loop_factory()) as runner:
        runner.run(main())


def event_loop_factory():
    """uvloop's event loop where it is installed (not on Windows), else asyncio's own.

    Every streamed token costs the event loop a wake-up, a task switch and a socket write,
    and on a machine whose cores the model's kernels keep busy that time comes out of the
    model's: uvloop does that work in C."""
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


class ApiStartError(RuntimeError):
    """The server could not start (e.g. the port is taken); one line for the user."""
