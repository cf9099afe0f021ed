"""POST /responses, GET and DELETE /responses/{id}, GET /responses/{id}/input_items.

A Responses request is read as a chat request (chat.plan_chat: the same prompt format,
reasoning, grammar and limits) and its reply as output items (output.py). A stored
response keeps the RNN state its conversation ended in (response_store), and a request
with `previous_response_id` continues from it (continuation.py). That holds for a store
shared by replicas too: a replica serving other weights never uses the stored state, it
rebuilds it, paying only the prefill. Stored responses belong to the key that made them
(owners.py). A store that cannot be reached makes these routes answer 503, and only them;
one that fails to keep a finished reply does not take the reply away (`_keep`).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time

import msgspec
from aiohttp import web

from ...identity import fingerprint
from ...messages import Finished, TextPiece
from ...response_store import Caller, StoredResponse, StoreUnavailable
from ...sampler import TokenCounts
from ..body import decode_body
from ..errors import ApiError, bad_request
from ..oai.chat import ChatPlan, plan_chat
from ..oai.generation import GenerationRun, run_as_sse
from ..oai.reply import ReplyReader
from ..oai.types import ChatCompletionRequest, ChatMessage
from ..saved_states.use import read_tools, saved_state
from ..serving import Serving
from ..sse import EventStream
from . import continuation
from .continuation import Continuation, not_found
from .items import new_id, read_input
from .output import OutputBuilder
from .owners import caller_of
from .types import (
    CreateResponse,
    DeletedResponse,
    IncompleteDetails,
    InputTokensDetails,
    ItemList,
    OutputTokensDetails,
    ReasoningConfig,
    Response,
    ResponseUsage,
    TextConfig,
)

log = logging.getLogger(__name__)
_encode = msgspec.json.encode
STORE_HEADER = "X-Ai00-Store"  # "failed": the reply is given, but it could not be stored


def _store(serving: Serving):
    if serving.responses is None:
        raise ApiError(404, f"This server stores no responses ({serving.store_off}).", code="not_found")
    return serving.responses


async def _ask(method, *args, **kwargs):
    """A store call off the event loop (a shared store is a network round trip away)."""
    try:
        return await asyncio.get_running_loop().run_in_executor(None, functools.partial(method, *args, **kwargs))
    except StoreUnavailable as e:
        raise ApiError(503, str(e), code="store_unavailable") from None


def _as_chat(req: CreateResponse) -> ChatCompletionRequest:
    """The request's generation fields as chat's."""
    fields: dict = {"model": req.model, "temperature": req.temperature, "top_p": req.top_p, "seed": req.seed,
                    "max_completion_tokens": req.max_output_tokens, "parallel_tool_calls": req.parallel_tool_calls,
                    "reasoning_effort": req.reasoning.effort if req.reasoning else None}
    if req.tools:
        for i, tool in enumerate(req.tools):
            if tool.type != "function":
                raise bad_request(f"tools[{i}].type '{tool.type}' is not supported: this server runs function "
                                  "tools only", f"tools[{i}].type")
        fields["tools"] = [{"type": "function", "function": {"name": t.name, "description": t.description,
                                                             "parameters": t.parameters, "strict": t.strict}}
                           for t in req.tools]
    choice = req.tool_choice
    if choice is not None and not isinstance(choice, str):
        if choice.type != "function" or not choice.name:
            raise bad_request(f"tool_choice type '{choice.type}' is not supported; use none, auto, required or "
                              "a function", "tool_choice")
        choice = {"type": "function", "function": {"name": choice.name}}
    fields["tool_choice"] = choice
    fmt = req.text.format if req.text and req.text.format else None
    if fmt is not None and fmt.type != "text":
        fields["response_format"] = {"type": fmt.type, "json_schema": {"name": fmt.name, "schema": fmt.schema,
                                                                       "strict": fmt.strict}}
    return msgspec.convert(fields, ChatCompletionRequest)


async def _continuation(serving: Serving, req: CreateResponse, caller: Caller, tools: bytes) -> Continuation:
    if req.previous_response_id is None:
        return Continuation()
    if not req.previous_response_id:
        raise bad_request("'previous_response_id' is empty; leave it out to start a new conversation",
                          "previous_response_id")
    # A conversation continues on the model that made it, unless the request names another.
    requested = req.model
    if not requested and (previous := await _ask(_store(serving).get, req.previous_response_id, caller)) is not None:
        requested = previous.model
    model = await serving.model_for(requested, stream=bool(req.stream), keep_alive=req.keep_alive)
    return await continuation.find(_store(serving), _ask, req.previous_response_id, caller=caller, model=model,
                                   tools=tools)


async def _from_saved(serving: Serving, request: web.Request, req: CreateResponse, plan: ChatPlan) -> Continuation:
    """A new conversation that starts from a saved state (`state`, ours)."""
    if req.previous_response_id is not None:
        raise bad_request("Give either 'previous_response_id' or 'state', not both: a continued conversation "
                          "starts from its previous response's state", "state")
    named = await saved_state(serving, request, req.state, plan.model)
    if named is None:
        raise bad_request(f"'state' must be a saved state's id (state_…, from /v1/saved_states), got '{req.state}'",
                          "state")
    return Continuation(state=named)


class ResponseTurn(msgspec.Struct, kw_only=True):
    """One request's turn of a conversation, from its reading to its record: what its
    generation, its Response and its stored record are made of, so that the steps between
    pass this and not a list of its parts."""

    req: CreateResponse
    plan: ChatPlan
    caller: Caller
    continuation: Continuation
    seed: TokenCounts  # the penalties' starting counts
    items: list[dict]  # the input items, as stored
    tools: bytes  # the request's tools, encoded: as stored, and to tell whether they changed
    ident: str = msgspec.field(default_factory=lambda: new_id("resp"))
    created: int = msgspec.field(default_factory=lambda: int(time.time()))

    def generation(self, serving: Serving) -> GenerationRun:
        """The reply's run, read from the previous response's state where there is one."""
        req, plan = self.req, self.plan
        text, prefix = self.continuation.prompt(plan.rendered.prompt, plan.model.tokenizer)
        return GenerationRun(serving, plan.model, [text], n=1, options=plan.options, max_tokens=plan.budget,
                             stop=plan.stop, model_text=self.seed, state=self.continuation.state, prefix=prefix,
                             keep_state=req.store is not False and serving.responses is not None)

    def response(self, *, status: str, output: list, usage: ResponseUsage | None = None) -> Response:
        req, plan = self.req, self.plan
        fmt = req.text.format if req.text and req.text.format else None
        return Response(
            id=self.ident, created_at=self.created, status=status,
            completed_at=int(time.time()) if status == "completed" else None,
            incomplete_details=IncompleteDetails("max_output_tokens") if status == "incomplete" else None,
            instructions=req.instructions, max_output_tokens=req.max_output_tokens, model=plan.model.name,
            output=output, parallel_tool_calls=req.parallel_tool_calls is not False,
            previous_response_id=req.previous_response_id,
            reasoning=ReasoningConfig(req.reasoning.effort if req.reasoning else None) if plan.reasoning else None,
            store=req.store is not False, temperature=req.temperature, text=TextConfig(
                {k: v for k, v in msgspec.to_builtins(fmt).items() if v is not None} if fmt else {"type": "text"}),
            tool_choice=msgspec.to_builtins(req.tool_choice) if req.tool_choice is not None else "auto",
            tools=[msgspec.to_builtins(t) for t in req.tools or ()], top_p=req.top_p,
            usage=usage if usage is not None else msgspec.UNSET,
            user=req.user if req.user is not None else msgspec.UNSET, metadata=req.metadata or {})

    def record(self, response: Response, finished: Finished) -> StoredResponse:
        """The stored record of `response`, the reply `finished` ended this turn with."""
        plan = self.plan
        history = continuation.after_reply(self.seed, response.output, plan.options, plan.model.tokenizer)
        own = StoredResponse(id=response.id, model=plan.model.name, fingerprint=fingerprint(plan.model),
                             created=response.created_at, response=_encode(response), input_items=_encode(self.items),
                             tools=self.tools, tokens=(), tail=finished.unfed, owner=self.caller.owner,
                             history=history.to_bytes(), has_state=True)
        return self.continuation.record(own, finished.fed)


async def _open_turn(request: web.Request, serving: Serving, req: CreateResponse) -> ResponseTurn:
    """The request read as its conversation's next turn: its input, where the conversation
    picks up, and the chat plan of its reply."""
    chat = _as_chat(req)
    messages, items = read_input(req.input)
    if req.instructions:
        messages.insert(0, ChatMessage(role="system", content=req.instructions))
    if req.store is not False:  # a store that is down is said before the reply is made, not after
        await _ask(serving.responses.check)
    caller, tools = caller_of(request, serving.config.listen), _encode(req.tools or [])
    cont = await _continuation(serving, req, caller, tools)
    if cont.previous is not None:
        chat = msgspec.structs.replace(chat, model=cont.previous.model)
    plan = await plan_chat(serving, chat, messages, announce_tools=cont.announce_tools,
                           read_tools=await read_tools(serving, request, req.state))
    if req.state is not None:
        cont = await _from_saved(serving, request, req, plan)
    seed = continuation.penalty_seed(cont.previous, messages, plan.options, plan.model.tokenizer)
    return ResponseTurn(req=req, plan=plan, caller=caller, continuation=cont, seed=seed, items=items, tools=tools)


def _usage(run: GenerationRun, reply: ReplyReader) -> ResponseUsage:
    u = run.usage()
    cached = u.prompt_tokens_details.cached_tokens if u.prompt_tokens_details else 0
    return ResponseUsage(u.prompt_tokens, InputTokensDetails(cached), u.completion_tokens,
                         OutputTokensDetails(reply.reasoning_tokens), u.total_tokens)


async def _keep(serving: Serving, turn: ResponseTurn, response: Response, run: GenerationRun) -> bool:
    """Store the finished response (unless `store` is false) with the state it ended in.
    False when the store failed: the reply is given all the same, and the failure is
    logged and counted, since a client that saw an error would only generate it again."""
    finished = run.choices[0].finished
    if turn.req.store is False or serving.responses is None or finished is None or finished.state is None:
        return True
    record = turn.record(response, finished)
    try:
        await asyncio.get_running_loop().run_in_executor(None, serving.responses.put, record, finished.state)
    except StoreUnavailable as e:
        log.warning("response %s was given but not stored: %s", response.id, e)
        serving.metrics.store_failures.labels(turn.plan.model.name, serving.metrics.replica).inc()
        return False
    return True


def _finished(response: Response, stored: bool) -> Response:
    return response if stored else msgspec.structs.replace(response, store=False)


async def create_response(request: web.Request, serving: Serving):
    req = await decode_body(request, CreateResponse, serving.config.listen.max_body_bytes)
    if serving.responses is None:  # a server without a store keeps nothing, and says so
        req = msgspec.structs.replace(req, store=False)
    turn = await _open_turn(request, serving, req)
    run = turn.generation(serving)
    if req.stream:
        return await _stream(request, serving, turn, run)
    result = (await run.collect())[0]
    reply, builder = turn.plan.reader(), OutputBuilder()
    builder.push(reply.opened)
    for piece, count in zip(result.text, result.piece_tokens):
        builder.push(reply.push(piece, count))
    builder.push(reply.finish())
    builder.finish(cut=result.finish == "length")
    status = "incomplete" if result.finish == "length" else "completed"
    response = turn.response(status=status, output=builder.items, usage=_usage(run, reply))
    if await _keep(serving, turn, response, run):
        return response
    return web.Response(body=_encode(_finished(response, False)), content_type="application/json",
                        headers={STORE_HEADER: "failed"})


async def _stream(request: web.Request, serving: Serving, turn: ResponseTurn, run: GenerationRun):
    """The response as typed server-sent events, ending with response.completed (or
    .incomplete), or with an error event when the reply cannot be finished."""

    async def write(out: EventStream, pieces) -> None:
        reply, builder = turn.plan.reader(), OutputBuilder()
        pending = turn.response(status="in_progress", output=[])
        for event in [builder.response_event("created", pending), builder.response_event("in_progress", pending),
                      *builder.push(reply.opened)]:
            await out.send_typed(event)
        try:
            async for _, piece in pieces:
                if isinstance(piece, TextPiece):
                    for event in builder.push(reply.push(piece.text, len(piece.tokens))):
                        await out.send_typed(event)
        except ApiError as e:  # the generation failed after the stream began
            await out.send_typed(builder.error_event(e.code, e.message, e.param))
            await out.done(marker=False)
            return
        cut = run.choices[0].finish == "length"
        for event in builder.push(reply.finish()) + builder.finish(cut):
            await out.send_typed(event)
        response = turn.response(status="incomplete" if cut else "completed", output=builder.items,
                                 usage=_usage(run, reply))
        stored = await _keep(serving, turn, response, run)  # stored before it is announced
        await out.send_typed(builder.response_event("incomplete" if cut else "completed", _finished(response, stored)))
        await out.done(marker=False)

    return await run_as_sse(request, run, serving.config.listen.ping_interval, write)


async def retrieve_response(request: web.Request, serving: Serving):
    response_id = request.match_info["response_id"]
    record = await _ask(_store(serving).get, response_id, caller_of(request, serving.config.listen))
    if record is None:
        raise not_found(response_id)
    return web.Response(body=record.response, content_type="application/json")


async def delete_response(request: web.Request, serving: Serving) -> DeletedResponse:
    response_id = request.match_info["response_id"]
    if not await _ask(_store(serving).delete, response_id, caller_of(request, serving.config.listen)):
        raise not_found(response_id)
    return DeletedResponse(id=response_id)


async def list_input_items(request: web.Request, serving: Serving) -> ItemList:
    response_id = request.match_info["response_id"]
    record = await _ask(_store(serving).get, response_id, caller_of(request, serving.config.listen), touch=False)
    if record is None:
        raise not_found(response_id)
    items = msgspec.json.decode(record.input_items)
    query = request.query
    order = query.get("order", "desc")
    if order not in ("asc", "desc"):
        raise bad_request(f"'order' must be asc or desc, got '{order}'", "order")
    try:
        limit = int(query.get("limit", "20"))
    except ValueError:
        limit = 0
    if not 1 <= limit <= 100:
        raise bad_request(f"'limit' must be between 1 and 100, got '{query.get('limit')}'", "limit")
    if order == "desc":
        items.reverse()
    if "after" in query:
        ids = [i["id"] for i in items]
        if query["after"] not in ids:
            raise bad_request(f"'after': no input item '{query['after']}' in this response", "after")
        items = items[ids.index(query["after"]) + 1:]
    page = items[:limit]
    return ItemList(data=page, has_more=len(items) > limit, first_id=page[0]["id"] if page else None,
                    last_id=page[-1]["id"] if page else None)
