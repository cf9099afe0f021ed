"""Token sampling for the backend: Ai00's samplers, vectorised over a batch.

Per request and step (ai00-reference §3.2, in this order):

1. the multiplicative repetition penalty on the last tokens (any sampler, when asked
   for), then subtract Ai00's repetition penalties (Nucleus, Typical);
2. give tokens a grammar mask disallows -inf;
3. add `logit_bias` (-100 is a ban);
4. softmax over the whole vocabulary, then the request's algorithm: greedy (argmax) when
   temperature is 0, else Nucleus, Typical or Mirostat; temperature is a power 1/T on the
   kept probabilities, as in Ai00;
5. record the chosen token (penalties decay and grow; Mirostat moves its threshold).

Usage::

    options = options_from_openai(sampler=req.sampler, temperature=req.temperature, ...)
    sampler = RequestSampler(options, vocab_size, model_tokens)
    ...
    step = sample_batch([s1, s2, ...], logits)   # logits: float32 [B, vocab], or B rows
    step.tokens, step.logprobs, step.top_logprobs
"""

from .batch import BatchSample, sample_batch
from .errors import SamplerError
from .penalties import TokenCounts
from .fused import warm_up as warm_up_sampler
from .params import (
    Mirostat,
    Nucleus,
    SamplerParams,
    SamplingOptions,
    Typical,
    options_from_openai,
)
from .request import RequestSampler

__all__ = [
    "BatchSample",
    "Mirostat",
    "Nucleus",
    "RequestSampler",
    "SamplerError",
    "SamplerParams",
    "SamplingOptions",
    "TokenCounts",
    "Typical",
    "options_from_openai",
    "sample_batch",
    "warm_up_sampler",
]
