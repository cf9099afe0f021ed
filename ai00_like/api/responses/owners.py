"""Whose stored responses a request may see: the caller's key decides, as a project's key
does at OpenAI.

With no keys configured everything belongs to `anonymous`, which is every caller. With
`[listen] api_keys`, each key owns what it stored (recorded as a digest of the key), and
another key's response is a 404, exactly like one that does not exist. The admin key sees
every response.
"""

from __future__ import annotations

from aiohttp import web

from ...response_store import Caller, key_owner
from ..auth import given_key, same_secret


def caller_of(request: web.Request, listen) -> Caller:
    given = given_key(request)
    if not given:
        return Caller()
    if listen.admin_key and same_secret(given, listen.admin_key):
        return Caller("admin", sees_all=True)
    owner = None
    for key in listen.api_keys:  # every key is compared: the time taken tells nothing
        if same_secret(given, key):
            owner = key_owner(key)
    return Caller(owner) if owner else Caller()
