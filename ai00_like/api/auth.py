"""Who may call what, and from where: Host and Origin checks, API keys, the admin key, CORS.

A server on 127.0.0.1 is reachable by every web page the user opens: the page's scripts can
send requests to it. `site_middleware` refuses those before any key check or handler, with
two checks in this order:

* Host (DNS rebinding: a site makes its own name resolve to 127.0.0.1, so its page is
  "same-origin" with the server): while the server listens on a loopback address, the
  Host header must name loopback (`localhost`, `*.localhost`, `127.x.y.z`, `::1`) or match
  `[listen] allowed_hosts` (`"*"` any, `".example.com"` it and its subdomains). Listening
  beyond loopback, only `allowed_hosts` is checked, when it is set: there the Host is a LAN
  name or a load balancer's. A request without Host (HTTP/1.0) passes, and so does
  `/health` (balancers' probes send whatever Host they like; it changes nothing).
* Origin: browsers send `Origin` with every cross-origin request, including the "simple"
  ones they send without a CORS preflight (a `text/plain` POST, a `no-cors` fetch), and
  those reach the handler before CORS could hide the answer. So a request with an Origin
  is refused (403 `origin_not_allowed`) unless the origin is the server's own page
  (`scheme://<Host>`, that Host having passed), the server's port under 127.0.0.1,
  localhost or [::1], or one of `[listen] cors_origins` (`"null"`, which sandboxed frames
  and file:// pages send, only when listed). `"*"` there lets every origin pass: an
  explicit opt-in, unsafe for a local server without keys. For `/admin/...`, a request
  with no Origin that the browser marks `Sec-Fetch-Site: cross-site` or `same-site` (an
  `<img>` or a link to `GET /admin/models/unload`) is refused the same way. Requests
  with neither header (SDKs, curl, other servers) pass.

Then `access_middleware`:

* CORS preflights are answered before any key check (browsers send no credentials with
  them); they allow `Authorization`, `Content-Type` and the OpenAI SDK's `x-stainless-*`
  and `openai-*` headers. `Access-Control-Allow-Origin` echoes an allowed origin (with
  `Vary: Origin`), or is `*` when `cors_origins` holds `"*"`.
* `[listen] api_keys` set: every route but `/health` and the web page needs
  `Authorization: Bearer <key>` (the admin key also passes). That includes /metrics and
  the OpenAPI document. An empty bearer token is no token (config.py refuses empty keys).
* `/admin/...` (models and files) needs `[listen] admin_key` when it is set (an API key
  does not pass); with no admin key, an API key when those are set; with neither, the
  routes are open on loopback only (api/ai00/admin.py `admin_refusal`).
* A missing or wrong key is a 401 in OpenAI's envelope; keys are compared in constant time.
* `/admin/...` bodies (POST, PUT, PATCH) must be JSON (`application/json` or `+json`), else
  415: what a page can send without a preflight is text/plain, a form or multipart. A
  request with no body and no Content-Type (`POST /admin/models/unload`) passes.
"""

from __future__ import annotations

import hmac
from urllib.parse import urlsplit

from aiohttp import web

from .ai00.admin import admin_refusal, is_loopback
from .errors import ApiError

# Routes that answer without a key: the health probe and the web page (its own handler).
OPEN_PATHS = frozenset({"/health"})
WEB_PAGE = web.AppKey("web_page_handler", object)

ALLOWED_HEADERS = frozenset({"authorization", "content-type", "accept", "x-request-id", "cache-control",
                             "last-event-id"})
ALLOWED_HEADER_PREFIXES = ("x-stainless-", "openai-")
EXPOSED_HEADERS = "X-Request-Id, Retry-After"

LOOPBACK_NAMES = ("127.0.0.1", "localhost", "::1")  # the names the server's own page may have
DEFAULT_PORTS = {"http": 80, "https": 443}
BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})


def same_secret(given: str, expected: str) -> bool:
    # Bytes, because compare_digest refuses non-ASCII str (a header may carry anything).
    return hmac.compare_digest(given.encode("utf-8", "surrogateescape"), expected.encode("utf-8"))


def bearer(request: web.Request) -> str | None:
    """The bearer token, or None: `Bearer ` with nothing after it is no key at all."""
    scheme, _, given = request.headers.get("Authorization", "").partition(" ")
    return (given.strip() or None) if scheme.lower() == "bearer" else None


def any_matches(given: str | None, keys) -> bool:
    # Every key is compared, so the time taken does not tell which one came close.
    matched = False
    for key in keys:
        matched |= given is not None and same_secret(given, key)
    return matched


def unauthorized(message: str) -> ApiError:
    return ApiError(401, message, code="invalid_api_key", headers={"WWW-Authenticate": 'Bearer realm="ai00-like"'})


def forbidden(message: str, code: str) -> ApiError:
    return ApiError(403, message, type="permission_error", code=code)


def is_open(request: web.Request) -> bool:
    if request.path in OPEN_PATHS:
        return True
    page = request.app.get(WEB_PAGE)
    route = request.match_info.route
    return page is not None and route.handler is page


def api_key_refusal(request: web.Request, listen) -> ApiError | None:
    if not listen.api_keys or is_open(request):
        return None
    if any_matches(bearer(request), [*listen.api_keys, *([listen.admin_key] if listen.admin_key else [])]):
        return None
    if bearer(request) is None:
        return unauthorized("Missing API key: send 'Authorization: Bearer <key>' with a key from [listen] api_keys")
    return unauthorized("Invalid API key")


def admin_key_refusal(request: web.Request, listen) -> ApiError | None:
    """With [listen] admin_key set: only that key (bearer, or Ai00's `?admin_token=`)."""
    given = bearer(request)
    if given is None:
        given = request.query.get("admin_token") or None
    if given is None:
        return unauthorized("Admin routes need the admin key: 'Authorization: Bearer <[listen] admin_key>'")
    if not same_secret(given, listen.admin_key):
        return unauthorized("Invalid admin key")
    return None


def media_type_refusal(request: web.Request) -> ApiError | None:
    """Admin bodies in JSON only: a page can send text/plain or a form without a preflight."""
    if request.method not in BODY_METHODS or not request.path.startswith("/admin/"):
        return None
    given = request.headers.get("Content-Type")
    if given is None and not request.body_exists:
        return None  # nothing to decode (clients send `POST /admin/models/unload` bare)
    kind = (given or "").partition(";")[0].strip().lower()
    if kind == "application/json" or kind.endswith("+json"):
        return None
    got = f"got {given!r}" if given is not None else "got a body without a Content-Type"
    return ApiError(415, f"Admin routes take JSON bodies only: send 'Content-Type: application/json' ({got})",
                    code="unsupported_media_type")


# ------------------------------------------------------------------------------ Host and Origin


def host_name(host: str) -> str:
    """The name of a Host header's value: no port, no brackets, lower case, no final dot."""
    name = host.strip().lower()
    if name.startswith("["):
        end = name.find("]")
        return name[1:end] if end > 0 else name
    if name.count(":") == 1:  # name:port (a bare IPv6 address, not valid in Host, keeps its colons)
        name = name.partition(":")[0]
    return name.rstrip(".")


def is_loopback_name(name: str) -> bool:
    return name == "localhost" or name.endswith(".localhost") or is_loopback(name)


def host_listed(name: str, patterns: list[str]) -> bool:
    for pattern in patterns:
        wanted = pattern.strip("[]").rstrip(".").lower()
        if wanted == "*" or wanted == name:
            return True
        if wanted.startswith(".") and (name == wanted[1:] or name.endswith(wanted)):
            return True
    return False


def host_refusal(request: web.Request, serving) -> ApiError | None:
    host, allowed = request.headers.get("Host"), serving.config.listen.allowed_hosts
    if host is None or request.path in OPEN_PATHS:
        return None
    name = host_name(host)
    if is_loopback_name(name) or host_listed(name, allowed):
        return None
    if is_loopback(serving.listen_host):
        return forbidden(f"Host '{name}' is not allowed: this server listens on {serving.listen_host} and answers "
                         "only to loopback names (a defence against DNS rebinding); add the name to [listen] "
                         "allowed_hosts to reach it so", "host_not_allowed")
    if allowed:
        return forbidden(f"Host '{name}' is not allowed: add it to [listen] allowed_hosts", "host_not_allowed")
    return None  # beyond loopback with no list: a LAN name, a balancer's name


def origin_key(origin: str) -> tuple[str, str, int] | None:
    """(scheme, host, port) of an origin, so `http://LocalHost:80` and `http://localhost` match."""
    try:
        parts = urlsplit(origin.strip())
        port = parts.port
    except ValueError:
        return None
    if not parts.scheme or not parts.hostname:
        return None  # "null" among others
    scheme = parts.scheme.lower()
    return scheme, parts.hostname.rstrip("."), port if port is not None else DEFAULT_PORTS.get(scheme, 0)


def local_port(request: web.Request) -> int | None:
    """The port this request came in on (the configured one may be 0: any free port)."""
    transport = request.transport
    address = transport.get_extra_info("sockname") if transport is not None else None
    return address[1] if isinstance(address, tuple) and len(address) >= 2 else None


def own_origins(request: web.Request) -> set[tuple[str, str, int]]:
    """The server's own page: scheme://Host (checked before this), and its port under the loopback names."""
    own = set()
    host = request.headers.get("Host")
    if host and (key := origin_key(f"{request.scheme}://{host}")) is not None:
        own.add(key)
    port = local_port(request)
    if port is not None:
        own.update((scheme, name, port) for scheme in ("http", "https") for name in LOOPBACK_NAMES)
    return own


def origin_allowed(request: web.Request, origins: list[str]) -> bool:
    origin = request.headers.get("Origin")
    if origin is None or "*" in origins or origin in origins:
        return True
    key = origin_key(origin)
    return key is not None and (key in own_origins(request) or key in {origin_key(o) for o in origins})


def origin_refusal(request: web.Request, origins: list[str]) -> ApiError | None:
    origin = request.headers.get("Origin")
    if origin is None:
        # No Origin, yet the browser says another site's page sent it (an <img>, a link):
        # harmless for reads, but GET /admin/models/unload acts.
        where = request.headers.get("Sec-Fetch-Site", "")
        if request.path.startswith("/admin/") and "*" not in origins and where in ("cross-site", "same-site"):
            return forbidden("Admin routes cannot be called from another site's page (Sec-Fetch-Site: "
                             f"{where})", "origin_not_allowed")
        return None
    if origin_allowed(request, origins):
        return None
    return forbidden(f"Origin '{origin}' is not allowed: only this server's own page may call it from a browser; "
                     "add the origin to [listen] cors_origins to let that page call it", "origin_not_allowed")


# ------------------------------------------------------------------------------ CORS


def allowed_origin(request: web.Request, origins: list[str]) -> str | None:
    """The Access-Control-Allow-Origin value for this request's Origin, or None."""
    if "*" in origins:
        return "*"
    origin = request.headers.get("Origin")
    if origin and origin_allowed(request, origins):
        return origin
    return None


def allowed_request_headers(requested: str) -> str:
    names = [h.strip() for h in requested.split(",") if h.strip()]
    ok = [h for h in names if h.lower() in ALLOWED_HEADERS or h.lower().startswith(ALLOWED_HEADER_PREFIXES)]
    return ", ".join(ok or ["Authorization", "Content-Type"])


def preflight(request: web.Request, origins: list[str]) -> web.Response:
    headers = {"Access-Control-Allow-Methods": "GET, POST, OPTIONS", "Access-Control-Max-Age": "86400",
               "Vary": "Origin"}
    origin = allowed_origin(request, origins)
    if origin is None:  # a preflight without Origin: not from a browser
        return web.Response(status=403, headers=headers, text="a CORS preflight needs an Origin header")
    headers["Access-Control-Allow-Origin"] = origin
    headers["Access-Control-Allow-Headers"] = allowed_request_headers(
        request.headers.get("Access-Control-Request-Headers", ""))
    return web.Response(status=204, headers=headers)


def cors_headers(request: web.Request, response: web.StreamResponse, origins: list[str]) -> None:
    if "Origin" not in request.headers:
        return
    if "*" not in origins:  # the answer depends on the Origin: caches must keep them apart
        response.headers.setdefault("Vary", "Origin")
    origin = allowed_origin(request, origins)
    if origin is not None:
        response.headers.setdefault("Access-Control-Allow-Origin", origin)
        response.headers.setdefault("Access-Control-Expose-Headers", EXPOSED_HEADERS)


# ------------------------------------------------------------------------------ the middlewares


def refusal(request: web.Request, serving) -> ApiError | None:
    listen = serving.config.listen
    if request.path.startswith("/admin/"):
        if listen.admin_key:
            return admin_key_refusal(request, listen)
        if listen.api_keys:
            return api_key_refusal(request, listen)
        return admin_refusal(request, serving)  # the loopback rule, when no key is set at all
    return api_key_refusal(request, listen)


def site_middleware(serving_key):
    """Host, then Origin: before preflights, keys and handlers (see the module's docstring)."""

    @web.middleware
    async def site(request: web.Request, handler):
        serving = request.app[serving_key]
        problem = host_refusal(request, serving) or origin_refusal(request, serving.config.listen.cors_origins)
        if problem is not None:
            raise problem
        return await handler(request)

    return site


def access_middleware(serving_key):
    @web.middleware
    async def access(request: web.Request, handler):
        serving = request.app[serving_key]
        if request.method == "OPTIONS" and "Access-Control-Request-Method" in request.headers:
            return preflight(request, serving.config.listen.cors_origins)
        if serving.closing and not is_open(request):
            raise ApiError(503, "The server is shutting down.", code="shutting_down",
                           headers={"Connection": "close", "Retry-After": "5"})
        problem = refusal(request, serving) or media_type_refusal(request)
        if problem is not None:
            raise problem
        return await handler(request)

    return access
