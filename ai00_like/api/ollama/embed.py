"""POST /api/embed and the older POST /api/embeddings, onto the embeddings of the OpenAI route
(the model's mean last-layer hidden state, L2-normalised: oai/embedding.py)."""

from __future__ import annotations

import time

import numpy as np
from aiohttp import web

from ...messages import Embed, Embeddings, Failed
from ..body import decode_body
from ..channel import EventChannel
from ..errors import ApiError, bad_request, from_failed
from ..oai.embedding import MAX_INPUTS
from ..serving import Serving
from .options import read_options
from .names import served_name
from .types import EmbeddingsRequest, EmbedRequest, EmbedResponse, EmbeddingsResponse


async def _embed(serving: Serving, name: str, texts: list[str], keep_alive) -> tuple[str, Embeddings, int]:
    """(model name, vectors, load nanoseconds)."""
    before = time.monotonic_ns()
    model = await serving.model_for(served_name(serving, name), keep_alive=keep_alive)
    load = time.monotonic_ns() - before
    channel = EventChannel()
    serving.middleware.send(Embed(tuple(texts), channel.reply(), model=model.name))
    result = await channel.first()
    if isinstance(result, Failed):
        raise from_failed(result, "input")
    if not isinstance(result, Embeddings):
        raise ApiError(500, f"unexpected reply {type(result).__name__}")
    return model.name, result, load


def _vectors(result: Embeddings) -> list[list[float]]:
    return [np.asarray(v, dtype=np.float32).tolist() for v in result.vectors]


async def embed(request: web.Request, serving: Serving) -> EmbedResponse:
    start = time.monotonic_ns()
    req = await decode_body(request, EmbedRequest, serving.config.listen.max_body_bytes)
    read_options(req.options)
    texts = [req.input] if isinstance(req.input, str) else req.input
    if not texts:
        raise bad_request("'input' must not be empty", "input")
    if len(texts) > MAX_INPUTS:
        raise bad_request(f"'input' has {len(texts)} items; at most {MAX_INPUTS} are allowed", "input")
    # Any length is embedded whole (an RNN has no window to cut to), so `truncate` changes nothing.
    name, result, load = await _embed(serving, req.model, texts, req.keep_alive)
    size = len(result.vectors[0]) if result.vectors else 0
    if req.dimensions is not None and req.dimensions != size:
        raise bad_request(f"'dimensions' must be {size} (this model's size) or left out; shortened embeddings "
                          "are not supported", "dimensions")
    return EmbedResponse(model=name, embeddings=_vectors(result), total_duration=time.monotonic_ns() - start,
                         load_duration=load, prompt_eval_count=result.prompt_tokens)


async def embeddings(request: web.Request, serving: Serving) -> EmbeddingsResponse:
    req = await decode_body(request, EmbeddingsRequest, serving.config.listen.max_body_bytes)
    read_options(req.options)
    _, result, _ = await _embed(serving, req.model, [req.prompt], req.keep_alive)
    return EmbeddingsResponse(_vectors(result)[0])
