"""POST chooses (Ai00's /chooses): rank choices as continuations of an input by perplexity.

The score of a choice is its mean negative log-likelihood per token after the input
(lower is better); with `calibrate`, minus the same for the choice on its own, so that
choices that are likely anywhere do not win by that alone. Ranks count from 0.
"""

from __future__ import annotations

import math

from aiohttp import web

from ...messages import Choose, Chosen, Failed
from ..body import decode_body
from ..channel import EventChannel
from ..errors import ApiError, bad_request, from_failed
from ..serving import Serving
from ..saved_states.use import saved_state
from .state import joined, requested_state
from .types import ChoiceList, ChooseRequest, EmbeddingUsage, RankedChoice

MAX_CHOICES = 1024


async def chooses(request: web.Request, serving: Serving) -> ChoiceList:
    req = await decode_body(request, ChooseRequest, serving.config.listen.max_body_bytes)
    if not req.choices:
        raise bad_request("'choices' must not be empty", "choices")
    if len(req.choices) > MAX_CHOICES:
        raise bad_request(f"'choices' has {len(req.choices)} items; at most {MAX_CHOICES} are allowed", "choices")
    model = await serving.model_for(req.model, keep_alive=req.keep_alive)
    initial = await saved_state(serving, request, req.state, model) or requested_state(req.state, model)
    channel = EventChannel()
    serving.middleware.send(Choose(joined(req.input), tuple(req.choices), channel.reply(), calibrate=req.calibrate,
                                   state=initial, model=model.name))
    result = await channel.first()
    if isinstance(result, Failed):
        raise from_failed(result, param="state" if initial is not None else None)
    if not isinstance(result, Chosen):
        raise ApiError(500, f"unexpected reply {type(result).__name__}")
    order = sorted(range(len(req.choices)), key=lambda i: result.perplexities[i])
    data = [
        RankedChoice(index=i, rank=rank, choice=req.choices[i],
                     perplexity=result.perplexities[i] if math.isfinite(result.perplexities[i]) else None)
        for rank, i in enumerate(order)
    ]
    usage = EmbeddingUsage(prompt_tokens=result.prompt_tokens, total_tokens=result.prompt_tokens)
    return ChoiceList(model=model.name, data=data, usage=usage)
