"""A saved state for the request that names it: found for its caller, checked against the
model, and given with a prefix-cache partition of its own.

Chat, completions, chooses and the Responses API take a saved state's id in `state` (a
string `state_…`, or `{"id": "state_…"}`); anything else is what `requested_state` reads
(a configured state, a `.state` file, inline data). A saved state belongs to the key that
saved it: another key's is a 404, as one that does not exist. Every request from one saved
state shares its partition `saved:<id>`, so a second chat with the same first message
finds it in the prefix cache.
"""

from __future__ import annotations

import asyncio
import functools

from aiohttp import web

from ...identity import fingerprint
from ...messages import ModelInfoEvent, NamedState
from ...response_store import SavedStateRecord, StoreFull, StoreUnavailable
from ...rwkv.state import State
from ..errors import ApiError, bad_request
from ..oai.types import StateRef
from ..responses.owners import caller_of

PREFIX = "state_"


def saved_id(ref) -> str | None:
    """The saved state's id `ref` names, or None when it names something else."""
    if isinstance(ref, StateRef) and ref.data is None:
        ref = ref.id
    return ref if isinstance(ref, str) and ref.startswith(PREFIX) else None


def saved_states(serving):
    """The store's saved states; a 400 saying what to turn on when there is no store."""
    if serving.responses is None:
        raise bad_request(f"This server keeps no saved states ({serving.store_off}); saved states live in the "
                          "response store: set [responses] store = true (and a writable [responses] path, or a "
                          "[store] url) in config.toml", None, code="store_disabled")
    return serving.responses.saved


async def ask(method, *args):
    """A store call off the event loop (a shared store is a network round trip away)."""
    try:
        return await asyncio.get_running_loop().run_in_executor(None, functools.partial(method, *args))
    except StoreUnavailable as e:
        raise ApiError(503, str(e), code="store_unavailable") from None
    except StoreFull as e:
        raise ApiError(507, str(e), code="store_full") from None


def not_found(state_id: str, param: str | None = None) -> ApiError:
    return ApiError(404, f"No saved state found with id '{state_id}'.", type="invalid_request_error", param=param,
                    code="state_not_found")


async def find(serving, request: web.Request, state_id: str, param: str | None = None) -> SavedStateRecord:
    record = await ask(saved_states(serving).get, state_id, caller_of(request, serving.config.listen))
    if record is None:
        raise not_found(state_id, param)
    return record


async def read_tools(serving, request: web.Request, ref) -> str:
    """The tools turn (oai.tools.tools_digest) the saved state `ref` names has read; "" when
    it names none, or another kind of state. An unknown id is left for `load` to refuse."""
    state_id = saved_id(ref)
    if state_id is None or serving.responses is None:
        return ""
    record = await ask(serving.responses.saved.get, state_id, caller_of(request, serving.config.listen))
    return record.tools if record is not None else ""


async def load(serving, request: web.Request, state_id: str, model: ModelInfoEvent,
               param: str = "state") -> tuple[SavedStateRecord, State]:
    """The caller's saved state for a request on `model`, its last use marked now."""
    record = await find(serving, request, state_id, param)
    if record.fingerprint != fingerprint(model):
        raise bad_request(f"'{param}': the saved state '{state_id}' was made by model '{record.model}' "
                          f"({record.fingerprint}); this request runs on '{model.name}' ({fingerprint(model)}), "
                          "which cannot continue it", param, code="state_model_mismatch")
    store = saved_states(serving)
    state = await ask(store.state, record)
    if state is None:
        raise ApiError(404, f"The saved state '{state_id}' has lost its data (its file is gone or damaged); "
                            "delete it and save it again", param=param, code="state_not_found")
    await ask(store.touch, state_id)
    return record, state


async def saved_state(serving, request: web.Request, ref, model: ModelInfoEvent) -> NamedState | None:
    """The saved state the `state` field names, as the middleware takes it; None when it
    names something else (which `oai.state.requested_state` reads)."""
    state_id = saved_id(ref)
    if state_id is None:
        return None
    _, state = await load(serving, request, state_id, model)
    return NamedState(partition(state_id), state)


def partition(state_id: str) -> str:
    return "saved:" + state_id
