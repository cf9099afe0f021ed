"""Who may call what: API keys, the admin key, CORS.

* `[listen] api_keys` set: every route but `/health` and the web page needs
  `Authorization: Bearer <key>` (the admin key also passes). That includes /metrics and
  the OpenAPI document.
* `/admin/...` (models and files) needs `[listen] admin_key` when it is set (an API key
  does not pass); with no admin key, an API key when those are set; with neither, the
  routes are open on loopback only (api/ai00/admin.py `admin_refusal`).
* A missing or wrong key is a 401 in OpenAI's envelope; keys are compared in constant time.
* CORS: `[listen] cors_origins` (default `["*"]`, as Ai00). Preflights are answered before
  any key check (browsers send no credentials with them) and allow `Authorization`,
  `Content-Type` and the OpenAI SDK's `x-stainless-*` and `openai-*` headers.
"""

from __future__ import annotations

import hmac

from aiohttp import web

from .ai00.admin import admin_refusal
from .errors import ApiError

# Routes that answer without a key: the health probe and the web page (its own handler).
OPEN_PATHS = frozenset({"/health"})
WEB_PAGE = web.AppKey("web_page_handler", object)

ALLOWED_HEADERS = frozenset({"authorization", "content-type", "accept", "x-request-id", "cache-control",
                             "last-event-id"})
ALLOWED_HEADER_PREFIXES = ("x-stainless-", "openai-")
EXPOSED_HEADERS = "X-Request-Id, Retry-After"


def same_secret(given: str, expected: str) -> bool:
    # Bytes, because compare_digest refuses non-ASCII str (a header may carry anything).
    return hmac.compare_digest(given.encode("utf-8", "surrogateescape"), expected.encode("utf-8"))


def bearer(request: web.Request) -> str | None:
    scheme, _, given = request.headers.get("Authorization", "").partition(" ")
    return given.strip() if scheme.lower() == "bearer" else None


def any_matches(given: str | None, keys) -> bool:
    # Every key is compared, so the time taken does not tell which one came close.
    matched = False
    for key in keys:
        matched |= given is not None and same_secret(given, key)
    return matched


def unauthorized(message: str) -> ApiError:
    return ApiError(401, message, code="invalid_api_key", headers={"WWW-Authenticate": 'Bearer realm="ai00-like"'})


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


# ------------------------------------------------------------------------------ CORS


def allowed_origin(origin: str | None, origins: list[str]) -> str | None:
    """The Access-Control-Allow-Origin value for this request's Origin, or None."""
    if "*" in origins:
        return "*"
    if origin and origin in origins:
        return origin
    return None


def allowed_request_headers(requested: str) -> str:
    names = [h.strip() for h in requested.split(",") if h.strip()]
    ok = [h for h in names if h.lower() in ALLOWED_HEADERS or h.lower().startswith(ALLOWED_HEADER_PREFIXES)]
    return ", ".join(ok or ["Authorization", "Content-Type"])


def preflight(request: web.Request, origins: list[str]) -> web.Response:
    headers = {"Access-Control-Allow-Methods": "GET, POST, OPTIONS", "Access-Control-Max-Age": "86400",
               "Vary": "Origin"}
    origin = allowed_origin(request.headers.get("Origin"), origins)
    if origin is None:
        return web.Response(status=403, headers=headers, text="origin not allowed ([listen] cors_origins)")
    headers["Access-Control-Allow-Origin"] = origin
    headers["Access-Control-Allow-Headers"] = allowed_request_headers(
        request.headers.get("Access-Control-Request-Headers", ""))
    return web.Response(status=204, headers=headers)


def cors_headers(request: web.Request, response: web.StreamResponse, origins: list[str]) -> None:
    origin = allowed_origin(request.headers.get("Origin"), origins)
    if origin is None:
        return
    response.headers.setdefault("Access-Control-Allow-Origin", origin)
    response.headers.setdefault("Access-Control-Expose-Headers", EXPOSED_HEADERS)
    if origin != "*":
        response.headers.setdefault("Vary", "Origin")


# ------------------------------------------------------------------------------ the middleware


def refusal(request: web.Request, serving) -> ApiError | None:
    listen = serving.config.listen
    if request.path.startswith("/admin/"):
        if listen.admin_key:
            return admin_key_refusal(request, listen)
        if listen.api_keys:
            return api_key_refusal(request, listen)
        return admin_refusal(request, serving)  # the loopback rule, when no key is set at all
    return api_key_refusal(request, listen)


def access_middleware(serving_key):
    @web.middleware
    async def access(request: web.Request, handler):
        serving = request.app[serving_key]
        if request.method == "OPTIONS" and "Access-Control-Request-Method" in request.headers:
            return preflight(request, serving.config.listen.cors_origins)
        if serving.closing and not is_open(request):
            raise ApiError(503, "The server is shutting down.", code="shutting_down",
                           headers={"Connection": "close", "Retry-After": "5"})
        problem = refusal(request, serving)
        if problem is not None:
            raise problem
        return await handler(request)

    return access
