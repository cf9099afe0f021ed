"""POST, GET and DELETE /v1/saved_states: read a text once and keep the state it leaves.

The text is `input` (raw, as /states reads it) or chat `messages`, rendered as chat renders
them (with `tools` announced before them, and earlier calls as text, tools.with_tools) but
without the assistant's prompt, so that a chat from the state whose messages
continue them reads exactly what one chat of all the messages would. The state is read by
the backend through the prefix cache (ReadState, as /states), from the model's own state or
from `state` (a saved one: a fork), and stored in the response store (response_store/saved.py)
for the caller's key, with which tools it announced (tools_digest): a chat from it that
offers the same tools does not announce them again. GET lists only the caller's own.
"""

from __future__ import annotations

import time

from aiohttp import web

from ...identity import fingerprint
from ...messages import Failed, ModelInfoEvent, NamedState, ReadState, StateRead
from ...response_store import SavedStateRecord
from ...rwkv.state import State
from ..body import decode_body
from ..channel import EventChannel
from ..errors import ApiError, bad_request, from_failed
from ..oai.prompt import render_chat
from ..oai.state import joined, requested_state
from ..oai.structured import offered_tools
from ..oai.tools import tools_digest, with_tools
from ..responses.items import new_id
from ..responses.owners import caller_of
from ..serving import Serving
from .types import DeletedSavedState, SavedState, SavedStateList, SaveStateRequest
from .use import ask, find, load, not_found, partition, saved_id, saved_states

MAX_NAME = 256


def wire(record: SavedStateRecord) -> SavedState:
    return SavedState(id=record.id, name=record.name, model=record.model, tokens=record.tokens, bytes=record.bytes,
                      created_at=record.created, last_used_at=int(record.used))


def checked_name(name: str | None) -> str | None:
    if name is not None and (len(name) > MAX_NAME or not name.isprintable()):
        raise bad_request(f"'name' must be printable text of at most {MAX_NAME} characters", "name")
    return name or None


def _text(req: SaveStateRequest, read: str) -> tuple[str, str]:
    """(the text to read, the tools turn the state will have read: tools_digest). `read`:
    the one the starting state has read, not announced again (a fork's, as chat's)."""
    if (req.input is None) == (req.messages is None):
        raise bad_request("Give the text to read as either 'input' (raw text) or 'messages' (chat messages)",
                          "input", code="missing_required_field")
    if req.messages is not None:
        offered = offered_tools(req)
        if offered and tools_digest(offered) == read:
            offered = None
        rendered = render_chat(with_tools(req.messages, offered), req.names, req.template, assistant_prompt=False)
        return rendered.prompt, tools_digest(offered) if offered else read
    if req.tools is not None or req.tool_choice is not None:
        raise bad_request("'tools' go with 'messages', which chat renders them before; 'input' is read as it is",
                          "tools" if req.tools is not None else "tool_choice")
    text = joined(req.input)
    if not text:
        raise bad_request("'input' is empty; give the text the state should read", "input")
    return text, read


async def _start(serving: Serving, request: web.Request, req: SaveStateRequest, model: ModelInfoEvent):
    """(the initial state for the read, the tokens it holds already, its tools turn)."""
    state_id = saved_id(req.state)
    if state_id is None:
        return requested_state(req.state, model), 0, ""
    parent, state = await load(serving, request, state_id, model)
    return NamedState(partition(state_id), state), parent.tokens, parent.tools


async def keep(serving: Serving, request: web.Request, model: ModelInfoEvent, state: State, *, tokens: int,
               name: str | None, tools: str = "") -> SavedState:
    """Store `state` as a new saved state of the caller's."""
    now = time.time()
    record = SavedStateRecord(id=new_id("state"), model=model.name, fingerprint=fingerprint(model),
                              version=model.info.version, tokens=tokens, bytes=state.nbytes, created=int(now),
                              used=now, owner=caller_of(request, serving.config.listen).owner, name=name, tools=tools)
    await ask(saved_states(serving).put, record, state)
    return wire(record)


async def save_state(request: web.Request, serving: Serving) -> SavedState:
    req = await decode_body(request, SaveStateRequest, serving.config.listen.max_body_bytes)
    saved_states(serving)  # a server without a store says so before it reads anything
    name = checked_name(req.name)
    _text(req, "")  # a malformed request is refused before a model is loaded for it
    model = await serving.model_for(req.model, keep_alive=req.keep_alive)
    initial, tokens, read = await _start(serving, request, req, model)
    text, tools = _text(req, read)
    channel = EventChannel()
    serving.middleware.send(ReadState(text, channel.reply(), state=initial, model=model.name))
    result = await channel.first()
    if isinstance(result, Failed):
        raise from_failed(result, param="state" if initial is not None else "input")
    if not isinstance(result, StateRead):
        raise ApiError(500, f"unexpected reply {type(result).__name__}")
    return await keep(serving, request, model, result.state, tokens=tokens + result.prompt_tokens, name=name,
                      tools=tools)


async def list_saved_states(request: web.Request, serving: Serving) -> SavedStateList:
    records = await ask(saved_states(serving).list, caller_of(request, serving.config.listen))
    return SavedStateList(data=[wire(r) for r in records])


async def retrieve_saved_state(request: web.Request, serving: Serving) -> SavedState:
    return wire(await find(serving, request, request.match_info["state_id"]))


async def delete_saved_state(request: web.Request, serving: Serving) -> DeletedSavedState:
    state_id = request.match_info["state_id"]
    if not await ask(saved_states(serving).delete, state_id, caller_of(request, serving.config.listen)):
        raise not_found(state_id)
    return DeletedSavedState(id=state_id)
