"""POST /responses, GET and DELETE /responses/{id}, GET /responses/{id}/input_items.

A Responses request is read as a chat request (chat.plan_chat: the same prompt format,
reasoning, grammar and limits) and its reply as output items (output.py). A stored
response keeps the RNN state its conversation ended in (response_store): a request with
`previous_response_id` renders only its own input, as the next turn, and the model reads
it from that state. When the state is gone (dropped by the store's cap, or made by other
weights under the same model name) the stored tokens are read again first; the reply is
the same either way. That holds for a store shared by replicas too: a replica serving
other weights never uses the stored state, it rebuilds it, paying only the prefill. A
shared store that cannot be reached makes these routes answer 503, and only them.
"""

from __future__ import annotations

import asyncio
import functools
import time

import msgspec
from aiohttp import web

from ...messages import TextPiece
from ...response_store import StoredResponse, StoreUnavailable
from ..body import decode_body
from ..errors import ApiError, bad_request
from ..oai.chat import ChatPlan, plan_chat
from ..oai.generation import GenerationRun, fingerprint, run_as_sse
from ..oai.reply import ReplyReader
from ..oai.types import ChatCompletionRequest, ChatMessage
from ..serving import Serving
from ..sse import EventStream
from .items import new_id, read_input
from .output import OutputBuilder
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

_encode = msgspec.json.encode
TURN_END = b"\n\n"


def _not_found(response_id: str, param: str | None = None) -> ApiError:
    return ApiError(404, f"No response found with id '{response_id}'.", type="invalid_request_error",
                    param=param, code="not_found")


def _store(serving: Serving):
    if serving.responses is None:
        raise ApiError(404, "This server stores no responses ([responses] store = false).",
                       code="not_found")
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


class Continuation(msgspec.Struct):
    """Where a request's conversation picks up: the previous response and its state."""

    previous: StoredResponse | None = None
    state: object = None  # the RNN state after previous.tokens, or None to read them again
    announce_tools: bool = True

    def prompt(self, rendered: str, tokenizer) -> tuple[str, tuple[int, ...]]:
        """(the text the model reads, the token ids it reads first)."""
        previous = self.previous
        if previous is None:
            return rendered, ()
        last = b"".join(tokenizer.token_bytes(t) for t in (previous.tokens[-4:] + previous.tail))
        text = rendered if last.endswith(TURN_END) else "\n\n" + rendered
        return text, previous.tail if self.state is not None else previous.tokens + previous.tail


async def _continuation(serving: Serving, req: CreateResponse, tools: bytes) -> Continuation:
    if not req.previous_response_id:
        return Continuation()
    store = _store(serving)
    previous = await _ask(store.get, req.previous_response_id)
    if previous is None:
        raise _not_found(req.previous_response_id, "previous_response_id")
    model = serving.require_model(req.model)
    if previous.model != model.name:
        raise bad_request(f"previous_response_id '{previous.id}' is a response of model '{previous.model}'; this "
                          f"server serves '{model.name}'", "previous_response_id")
    state = None
    if previous.has_state and previous.fingerprint == fingerprint(model):
        state = await _ask(store.state, previous.id, fingerprint(model))
    return Continuation(previous, state, announce_tools=previous.tools != tools)


def _response(req: CreateResponse, plan: ChatPlan, ident: str, created: int, *, status: str, output: list,
              usage: ResponseUsage | None = None) -> Response:
    fmt = req.text.format if req.text and req.text.format else None
    return Response(
        id=ident, created_at=created, status=status, completed_at=int(time.time()) if status == "completed" else None,
        incomplete_details=IncompleteDetails("max_output_tokens") if status == "incomplete" else None,
        instructions=req.instructions, max_output_tokens=req.max_output_tokens, model=plan.model.name, output=output,
        parallel_tool_calls=req.parallel_tool_calls is not False, previous_response_id=req.previous_response_id,
        reasoning=ReasoningConfig(req.reasoning.effort if req.reasoning else None) if plan.reasoning else None,
        store=req.store is not False, temperature=req.temperature, text=TextConfig(
            {k: v for k, v in msgspec.to_builtins(fmt).items() if v is not None} if fmt else {"type": "text"}),
        tool_choice=msgspec.to_builtins(req.tool_choice) if req.tool_choice is not None else "auto",
        tools=[msgspec.to_builtins(t) for t in req.tools or ()], top_p=req.top_p,
        usage=usage if usage is not None else msgspec.UNSET, user=req.user if req.user is not None else msgspec.UNSET,
        metadata=req.metadata or {})


def _usage(run: GenerationRun, reply: ReplyReader) -> ResponseUsage:
    u = run.usage()
    cached = u.prompt_tokens_details.cached_tokens if u.prompt_tokens_details else 0
    return ResponseUsage(u.prompt_tokens, InputTokensDetails(cached), u.completion_tokens,
                         OutputTokensDetails(reply.reasoning_tokens), u.total_tokens)


async def _keep(serving: Serving, req: CreateResponse, plan: ChatPlan, response: Response, items: list[dict],
                tools: bytes, continuation: Continuation, run: GenerationRun) -> None:
    """Store the finished response (unless `store` is false) with the state it ended in."""
    finished = run.choices[0].finished
    if req.store is False or serving.responses is None or finished is None or finished.state is None:
        return
    previous = continuation.previous
    earlier = previous.tokens if previous is not None and continuation.state is not None else ()
    record = StoredResponse(id=response.id, model=plan.model.name, fingerprint=fingerprint(plan.model),
                            created=response.created_at, response=_encode(response), input_items=_encode(items),
                            tools=tools, tokens=earlier + finished.fed, tail=finished.unfed, has_state=True)
    await _ask(serving.responses.put, record, finished.state)


async def create_response(request: web.Request, serving: Serving):
    req = await decode_body(request, CreateResponse, serving.config.listen.max_body_bytes)
    if serving.responses is None:  # a server without a store keeps nothing, and says so
        req = msgspec.structs.replace(req, store=False)
    chat = _as_chat(req)
    messages, items = read_input(req.input)
    if req.instructions:
        messages.insert(0, ChatMessage(role="system", content=req.instructions))
    if req.store is not False:  # a store that is down is said before the reply is made, not after
        await _ask(serving.responses.check)
    tools = _encode(req.tools or [])
    continuation = await _continuation(serving, req, tools)
    plan = await plan_chat(serving, chat, messages, announce_tools=continuation.announce_tools)
    text, prefix = continuation.prompt(plan.rendered.prompt, plan.model.tokenizer)
    run = GenerationRun(serving, plan.model, [text], n=1, options=plan.options, max_tokens=plan.budget,
                        stop=plan.stop, model_text=plan.rendered.model_text, state=continuation.state,
                        prefix=prefix, keep_state=req.store is not False and serving.responses is not None)
    ident, created = new_id("resp"), int(time.time())
    if req.stream:
        return await _stream(request, serving, req, plan, run, (ident, created), items, tools, continuation)
    result = (await run.collect())[0]
    reply, builder = plan.reader(), OutputBuilder()
    builder.push(reply.opened)
    for piece, count in zip(result.text, result.piece_tokens):
        builder.push(reply.push(piece, count))
    builder.push(reply.finish())
    builder.finish(cut=result.finish == "length")
    status = "incomplete" if result.finish == "length" else "completed"
    response = _response(req, plan, ident, created, status=status, output=builder.items, usage=_usage(run, reply))
    await _keep(serving, req, plan, response, items, tools, continuation, run)
    return response


async def _stream(request: web.Request, serving: Serving, req: CreateResponse, plan: ChatPlan, run: GenerationRun,
                  made: tuple[str, int], items: list[dict], tools: bytes, continuation: Continuation):
    """The response as typed server-sent events."""
    ident, created = made

    async def write(out: EventStream, pieces) -> None:
        reply, builder = plan.reader(), OutputBuilder()
        pending = _response(req, plan, ident, created, status="in_progress", output=[])
        for event in [builder.response_event("created", pending), builder.response_event("in_progress", pending),
                      *builder.push(reply.opened)]:
            await out.send_typed(event)
        async for _, piece in pieces:
            if isinstance(piece, TextPiece):
                for event in builder.push(reply.push(piece.text, len(piece.tokens))):
                    await out.send_typed(event)
        cut = run.choices[0].finish == "length"
        for event in builder.push(reply.finish()) + builder.finish(cut):
            await out.send_typed(event)
        response = _response(req, plan, ident, created, status="incomplete" if cut else "completed",
                             output=builder.items, usage=_usage(run, reply))
        await _keep(serving, req, plan, response, items, tools, continuation, run)  # stored before it is announced
        await out.send_typed(builder.response_event("incomplete" if cut else "completed", response))
        await out.done(marker=False)

    return await run_as_sse(request, run, serving.config.listen.ping_interval, write)


async def retrieve_response(request: web.Request, serving: Serving):
    response_id = request.match_info["response_id"]
    record = await _ask(_store(serving).get, response_id)
    if record is None:
        raise _not_found(response_id)
    return web.Response(body=record.response, content_type="application/json")


async def delete_response(request: web.Request, serving: Serving) -> DeletedResponse:
    response_id = request.match_info["response_id"]
    if not await _ask(_store(serving).delete, response_id):
        raise _not_found(response_id)
    return DeletedResponse(id=response_id)


async def list_input_items(request: web.Request, serving: Serving) -> ItemList:
    response_id = request.match_info["response_id"]
    record = await _ask(_store(serving).get, response_id, touch=False)
    if record is None:
        raise _not_found(response_id)
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
