"""POST /api/chat and /api/generate.

Both are planned by chat.plan_chat (translate.py reads them as chat requests); a `raw`
generate is planned as completions are (its prompt as given, no template, no thinking).
An empty request only loads its model, or with keep_alive 0 unloads it, as Ollama's do.
"""

from __future__ import annotations

import msgspec
from aiohttp import web

from ..body import decode_body
from ..errors import bad_request
from ..keep_alive import keep_alive_seconds
from ..oai.chat import DEFAULT_MAX_TOKENS, ChatPlan, plan_chat
from ..oai.generation import max_tokens, sampling_options, stop_strings
from ..oai.prompt import ChatPrompt
from ..oai.structured import structured_output
from ..oai.types import ChatCompletionRequest
from ..serving import Serving
from .reply import Piece
from .names import served_name
from .translate import as_chat, chat_request, generate_request, refuse_unsupported
from .turn import Clock, Shape, Turn, chat_object, generate_object
from .types import ChatRequest, GenerateRequest, GenerationFields


async def chat(request: web.Request, serving: Serving):
    req = await decode_body(request, ChatRequest, serving.config.listen.max_body_bytes)
    if not req.messages:
        return await _load_or_unload(serving, req, chat_object)
    clock = Clock()
    model = await clock.model(serving, req)
    chat_req, messages = chat_request(req, model)
    plan = await plan_chat(serving, chat_req, messages)
    return await Turn(serving, plan, clock, chat_object).answer(request, req.stream)


async def generate(request: web.Request, serving: Serving):
    req = await decode_body(request, GenerateRequest, serving.config.listen.max_body_bytes)
    refuse_unsupported(req)
    if not req.prompt:
        return await _load_or_unload(serving, req, generate_object)
    clock = Clock()
    model = await clock.model(serving, req)
    if req.raw:
        plan = await _plan_raw(as_chat(req, model), req.prompt, model)
    else:
        chat_req, messages = generate_request(req, model)
        plan = await plan_chat(serving, chat_req, messages)
    return await Turn(serving, plan, clock, generate_object).answer(request, req.stream)


async def _plan_raw(req: ChatCompletionRequest, prompt: str, model) -> ChatPlan:
    """A raw prompt's plan, as completions plan theirs: the text as given, and of `format`
    the answer alone (no thinking, no tools, no stop string unless asked)."""
    if req.reasoning_effort is not None or (req.chat_template_kwargs or {}).get("enable_thinking"):
        raise bad_request("'think' does not apply to a raw prompt: write the thinking tags into it", "think")
    structure = await structured_output(req, model, chat=False)
    options = msgspec.structs.replace(sampling_options(req, logprobs=None, top_logprobs=None),
                                      grammar=structure.grammar)
    budget = max_tokens(req.max_completion_tokens, DEFAULT_MAX_TOKENS, model.spec.max_tokens_limit,
                        field="options.num_predict", minimum=1)
    return ChatPlan(model, ChatPrompt(prompt, ""), "", structure, options, budget, stop_strings(req, ()))


async def _load_or_unload(serving: Serving, req: GenerationFields, shape: Shape):
    """Ollama's way to load a model (a request with nothing to answer) or, with keep_alive 0,
    to unload it. A model the configuration pins (keep_alive -1) is not unloaded by a request."""
    name = served_name(serving, req.model)
    if keep_alive_seconds(req.keep_alive) == 0:
        entry = serving.pool.find(name)
        if entry.served.keep_alive < 0:
            raise bad_request(f"\"{entry.name}\" is kept loaded by the server's configuration (keep_alive = -1); "
                              "a request cannot unload it", "keep_alive")
        if entry.info is not None:
            await serving.unload(entry.name)
        return shape(entry.name, Piece(), done=True, done_reason="unload")
    model = await serving.model_for(name, stream=False, keep_alive=req.keep_alive)
    return shape(model.name, Piece(), done=True, done_reason="load")
