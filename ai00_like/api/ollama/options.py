"""Ollama's `options` (its Modelfile parameters) → the sampling fields of a chat request.

Every option Ollama documents is type-checked, so `{"temperature": "hot"}` is a 400 naming
`options.temperature`; those with a meaning here become chat's fields, the rest (context
size, threads, GPU layers, mirostat, …) are accepted and ignored: an RNN has no context
window to size, and the engine picks its own threads and devices. Options Ollama does not
know are ignored too, as Ollama itself only warns about them.
"""

from __future__ import annotations

import msgspec

from ..errors import bad_request, from_validation


class Options(msgspec.Struct, kw_only=True):
    # Used.
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    num_predict: int | None = None
    stop: list[str] | str | None = None
    seed: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repeat_penalty: float | None = None  # chat's repetition_penalty
    repeat_last_n: int | None = None  # its window (Ollama's default 64 is ours)
    # Accepted and ignored.
    num_keep: int | None = None
    min_p: float | None = None
    typical_p: float | None = None
    tfs_z: float | None = None
    penalize_newline: bool | None = None
    mirostat: int | None = None
    mirostat_tau: float | None = None
    mirostat_eta: float | None = None
    numa: bool | None = None
    num_ctx: int | None = None
    num_batch: int | None = None
    num_gpu: int | None = None
    main_gpu: int | None = None
    low_vram: bool | None = None
    f16_kv: bool | None = None
    logits_all: bool | None = None
    vocab_only: bool | None = None
    use_mmap: bool | None = None
    use_mlock: bool | None = None
    embedding_only: bool | None = None
    num_thread: int | None = None


_PASSED = ("temperature", "top_p", "top_k", "seed", "presence_penalty", "frequency_penalty")


def read_options(raw: dict | None) -> Options:
    """`options` checked, or a 400 naming the option."""
    try:
        return msgspec.convert(raw or {}, Options)
    except msgspec.ValidationError as e:
        error = from_validation(e)
        name = f"options.{error.param}" if error.param else "options"
        raise bad_request(error.message.replace(f"'{error.param}'", f"'{name}'"), name) from None


def chat_fields(options: Options, limit: int) -> dict:
    """The chat request's fields these options give; `limit`: the model's max_tokens_limit,
    which Ollama's "no limit" (num_predict -1 or -2) becomes."""
    fields = {name: getattr(options, name) for name in _PASSED if getattr(options, name) is not None}
    if options.stop is not None:
        fields["stop"] = options.stop
    fields.update(_repetition(options))
    if options.num_predict is not None:
        if options.num_predict == 0:
            raise bad_request("'options.num_predict' must be positive, or -1 for no limit", "options.num_predict")
        if options.num_predict > limit:
            raise bad_request(f"'options.num_predict' is too large: {options.num_predict}; this server allows at "
                              f"most {limit} (config max_tokens_limit of this model)", "options.num_predict")
        fields["max_completion_tokens"] = options.num_predict if options.num_predict > 0 else limit
    return fields


def _repetition(options: Options) -> dict:
    """`repeat_penalty` and `repeat_last_n` as chat's repetition fields; bad values are
    refused here, so that the 400 names the option the client sent."""
    fields = {}
    if options.repeat_penalty is not None:
        if not options.repeat_penalty > 0:
            raise bad_request(f"'options.repeat_penalty' must be > 0 (1 is off), got {options.repeat_penalty!r}",
                              "options.repeat_penalty")
        fields["repetition_penalty"] = options.repeat_penalty
    if options.repeat_last_n is not None:
        if options.repeat_last_n < -1:
            raise bad_request("'options.repeat_last_n' must be -1 (the whole context), 0 (off) or a token count, "
                              f"got {options.repeat_last_n}", "options.repeat_last_n")
        fields["repetition_window"] = options.repeat_last_n
    return fields
