"""POST embeddings, computed by the RWKV model itself.

Each vector is the mean over the input's tokens of the last layer's output after the final
layer norm (`ln_out`, the hidden state the head reads), L2-normalised, so cosine
similarity is a dot product. Its length is the model's `n_embd`.
"""

from __future__ import annotations

import base64

import numpy as np
from aiohttp import web

from ...messages import Embed, Embeddings, Failed
from ..body import decode_body
from ..channel import EventChannel
from ..errors import ApiError, bad_request, from_failed
from ..serving import Serving
from .types import EmbeddingItem, EmbeddingList, EmbeddingRequest, EmbeddingUsage

MAX_INPUTS = 2048  # OpenAI's limit per request


def _texts(req: EmbeddingRequest) -> list[str]:
    if isinstance(req.input, str):
        return [req.input]
    if not req.input:
        raise bad_request("'input' must not be an empty list", "input")
    if len(req.input) > MAX_INPUTS:
        raise bad_request(f"'input' has {len(req.input)} items; at most {MAX_INPUTS} are allowed", "input")
    for i, item in enumerate(req.input):
        if not isinstance(item, str):
            # LangChain's OpenAIEmbeddings sends tiktoken ids unless check_embedding_ctx_length=False;
            # ids of another vocabulary mean nothing to this model.
            raise bad_request("Inputs given as token ids are not supported; send the text (LangChain: "
                              "OpenAIEmbeddings(check_embedding_ctx_length=False))", f"input[{i}]")
    return req.input


async def embeddings(request: web.Request, serving: Serving) -> EmbeddingList:
    req = await decode_body(request, EmbeddingRequest, serving.config.listen.max_body_bytes)
    texts = _texts(req)
    model = await serving.model_for(req.model, keep_alive=req.keep_alive)
    if req.dimensions is not None and req.dimensions != model.info.n_embd:
        raise bad_request(f"'dimensions' must be {model.info.n_embd} (this model's size) or left out; "
                          "shortened embeddings are not supported", "dimensions")
    channel = EventChannel()
    serving.middleware.send(Embed(tuple(texts), channel.reply(), model=model.name))
    result = await channel.first()
    if isinstance(result, Failed):
        raise from_failed(result)
    if not isinstance(result, Embeddings):
        raise ApiError(500, f"unexpected reply {type(result).__name__}")
    data = []
    for i, vector in enumerate(result.vectors):
        vector = np.asarray(vector, dtype=np.float32)
        if req.encoding_format == "base64":
            value = base64.b64encode(vector.astype("<f4").tobytes()).decode("ascii")
        else:
            value = vector.tolist()
        data.append(EmbeddingItem(index=i, embedding=value))
    usage = EmbeddingUsage(prompt_tokens=result.prompt_tokens, total_tokens=result.prompt_tokens)
    return EmbeddingList(data=data, model=model.name, usage=usage)
