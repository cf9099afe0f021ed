"""Who may call what: API keys, the admin key, JSON bodies for the admin routes.

The site checks (Host, Origin, CORS) run before these, in api/site_checks.py. Then
`access_middleware`:

* CORS preflights are answered (site_checks.preflight) before any key check: browsers send no
  credentials with them.
* `[listen] api_keys` set: every route but `/health` and the web page needs
  `Authorization: Bearer <key>` or, as Anthropic's clients send it, `x-api-key: <key>`
  (the admin key also passes). That includes /metrics and the OpenAPI document. An empty
  token is no token (config.py refuses empty keys).
* `/admin/...` (models and files) and Ollama's `/api/pull` and `/api/delete` (they too
  download and delete models) need `[listen] admin_key` when it is set (an API key
  does not pass); with no admin key, an API key when those are set; with neither, the
  routes are open on loopback only (`admin_refusal` below).
* A missing or wrong key is a 401 in OpenAI's envelope; keys are compared in constant time.
* `/admin/...` bodies (POST, PUT, PATCH) must be JSON (`application/json` or `+json`), else
  415: what a page can send without a preflight is text/plain, a form or multipart. A
  request with no body and no Content-Type (`POST /admin/models/unload`) passes.
"""

from __future__ import annotations

import hmac

from aiohttp import web

from . import site_checks
from .errors import ApiError

# Routes that answer without a key: the health probe and the web page (its own handler).
OPEN_PATHS = site_checks.OPEN_PATHS
WEB_PAGE = web.AppKey("web_page_handler", object)
BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})
# Ollama's routes that change the models folder: admin routes under another name.
OLLAMA_ADMIN_PATHS = frozenset({"/api/pull", "/api/delete"})


def same_secret(given: str, expected: str) -> bool:
    # Bytes, because compare_digest refuses non-ASCII str (a header may carry anything).
    return hmac.compare_digest(given.encode("utf-8", "surrogateescape"), expected.encode("utf-8"))


def bearer(request: web.Request) -> str | None:
    """The bearer token, or None: `Bearer ` with nothing after it is no key at all."""
    scheme, _, given = request.headers.get("Authorization", "").partition(" ")
    return (given.strip() or None) if scheme.lower() == "bearer" else None


def given_key(request: web.Request) -> str | None:
    """The key a request carries: a bearer token, else Anthropic's `x-api-key` header."""
    return bearer(request) or request.headers.get("x-api-key", "").strip() or None


def is_admin_route(request: web.Request) -> bool:
    return request.path.startswith("/admin/") or request.path in OLLAMA_ADMIN_PATHS


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
    given = given_key(request)
    if any_matches(given, [*listen.api_keys, *([listen.admin_key] if listen.admin_key else [])]):
        return None
    if given is None:
        return unauthorized("Missing API key: send 'Authorization: Bearer <key>' (or 'x-api-key: <key>') with a key "
                            "from [listen] api_keys")
    return unauthorized("Invalid API key")


def admin_key_refusal(request: web.Request, listen) -> ApiError | None:
    """With [listen] admin_key set: only that key (bearer, or Ai00's `?admin_token=`)."""
    given = given_key(request)
    if given is None:
        given = request.query.get("admin_token") or None
    if given is None:
        return unauthorized("Admin routes need the admin key: 'Authorization: Bearer <[listen] admin_key>'")
    if not same_secret(given, listen.admin_key):
        return unauthorized("Invalid admin key")
    return None


def media_type_refusal(request: web.Request) -> ApiError | None:
    """Admin bodies in JSON only: a page can send text/plain or a form without a preflight."""
    if request.method not in BODY_METHODS or not is_admin_route(request):
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


# ------------------------------------------------------------------------------ the middlewares


def refusal(request: web.Request, serving) -> ApiError | None:
    listen = serving.config.listen
    if is_admin_route(request):
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
            return site_checks.preflight(request, serving.config.listen.cors_origins)
        if serving.closing and not is_open(request):
            raise ApiError(503, "The server is shutting down.", code="shutting_down",
                           headers={"Connection": "close", "Retry-After": "5"})
        problem = refusal(request, serving) or media_type_refusal(request)
        if problem is not None:
            raise problem
        return await handler(request)

    return access


def admin_refusal(request: web.Request, serving) -> ApiError | None:
    """With no key configured at all (api/auth.py checks the keys): admin routes are open
    only while the server listens on loopback; listening beyond it, they are closed (Ai00
    ships them open to everyone)."""
    if not site_checks.is_loopback(serving.listen_host):
        return ApiError(403, f"Admin routes are closed: the server listens on {serving.listen_host}, beyond this "
                        "machine, and no [listen] admin_key is set", type="permission_error",
                        code="admin_key_required")
    return None
