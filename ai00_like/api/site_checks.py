"""Which sites may call the server: the Host and Origin checks, and CORS.

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

CORS follows the same rule: a preflight (answered by auth's `access_middleware` before any
key check, since browsers send no credentials with it) and `Access-Control-Allow-Origin`
echo an allowed origin (with `Vary: Origin`), or say `*` when `cors_origins` holds `"*"`.
Preflights allow `Authorization`, `Content-Type` and the OpenAI SDK's `x-stainless-*` and
`openai-*` headers.
"""

from __future__ import annotations

import ipaddress
from urllib.parse import urlsplit

from aiohttp import web

from .errors import ApiError

OPEN_PATHS = frozenset({"/health"})  # answered whatever the Host: load balancers' probes
LOOPBACK_NAMES = ("127.0.0.1", "localhost", "::1")  # the names the server's own page may have
DEFAULT_PORTS = {"http": 80, "https": 443}
ALLOWED_HEADERS = frozenset({"authorization", "content-type", "accept", "x-request-id", "cache-control",
                             "last-event-id", "x-api-key"})
ALLOWED_HEADER_PREFIXES = ("x-stainless-", "openai-", "anthropic-")
EXPOSED_HEADERS = "X-Request-Id, Retry-After"


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def forbidden(message: str, code: str) -> ApiError:
    return ApiError(403, message, type="permission_error", code=code)


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
    headers = {"Access-Control-Allow-Methods": "GET, POST, DELETE, OPTIONS", "Access-Control-Max-Age": "86400",
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


# ------------------------------------------------------------------------------ the middleware


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
