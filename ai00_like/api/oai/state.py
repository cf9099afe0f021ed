"""POST states (Ai00's /states) and the `state` request field that takes its output back.

A state travels as Ai00 lays it out: `shape` is `[n_embd, rows, n_layer, 1]` with the
first dimension varying fastest, `data` the flat floats. Per layer the rows are the
time-mix shift, then the WKV state, then the channel-mix shift: for v5–v7 the WKV matrix
of each head fills `head_size` rows (row i, column h·head_size + j holds S[h, i, j] in the
engine's own orientation, see rwkv/state.py), for v4 its three vectors aa, bb, pp.
What /states returns, the `state` field of chat, completions, chooses and states accepts.
"""

from __future__ import annotations

import base64

import numpy as np
from aiohttp import web

from ...messages import Failed, ModelInfoEvent, ReadState, StateRead
from ...rwkv.info import ModelInfo
from ...rwkv.state import State
from ..body import decode_body
from ..channel import EventChannel
from ..errors import ApiError, bad_request, from_failed
from ..serving import Serving
from .types import EmbeddingUsage, StateData, StateList, StateRef, StatesRequest

NIL_STATE = "00000000-0000-0000-0000-000000000000"  # Ai00's "no state": the default one


def _rows(info: ModelInfo) -> int:
    return 5 if info.version == "4" else info.head_size + 2


def state_shape(info: ModelInfo) -> list[int]:
    return [info.n_embd, _rows(info), info.n_layer, 1]


def encode_state(state: State, info: ModelInfo) -> np.ndarray:
    """The state as Ai00's flat float32 array (see the module docstring)."""
    L, C = info.n_layer, info.n_embd
    grid = np.empty((L, _rows(info), C), dtype=np.float32)
    grid[:, 0] = state.att_shift
    if info.version == "4":
        grid[:, 1:4] = state.wkv  # [L, 3, C]
    else:
        H, N = info.n_head, info.head_size
        grid[:, 1:-1] = state.wkv.transpose(0, 2, 1, 3).reshape(L, N, H * N)  # [L, H, N, N] → [L, N, H·N]
    grid[:, -1] = state.ffn_shift
    return grid.reshape(-1)


def decode_state(flat: np.ndarray, info: ModelInfo) -> State:
    L, C = info.n_layer, info.n_embd
    grid = flat.reshape(L, _rows(info), C)
    if info.version == "4":
        wkv = grid[:, 1:4].copy()
    else:
        H, N = info.n_head, info.head_size
        wkv = grid[:, 1:-1].reshape(L, N, H, N).transpose(0, 2, 1, 3).copy()
    return State(grid[:, 0].copy(), np.ascontiguousarray(wkv), grid[:, -1].copy())


def requested_state(ref: str | StateRef | None, model: ModelInfoEvent) -> str | State | None:
    """The `state` field as the middleware takes it: an id, a name, a `.state` file in the
    models folder, or a State sent inline. Configured ids and names are checked here so the
    error names the field; file names are checked by the middleware, which owns the folder."""
    if isinstance(ref, StateRef):
        if ref.data is not None:
            return _inline_state(ref, model.info)
        ref = ref.id or ref.name or ref.path
    if not ref or ref == NIL_STATE:
        return None
    if ref.endswith(".state") or any(ref in (s.id, s.name) for s in model.states):
        return ref
    known = ", ".join(s.name or s.id for s in model.states) or "none are configured"
    raise bad_request(f"Unknown state '{ref}' (configured states: {known}; or name a .state file in the models "
                      "folder, or send the data /states returns)", "state", code="state_not_found")


def _inline_state(ref: StateRef, info: ModelInfo) -> State:
    want = state_shape(info)
    if ref.shape is not None and list(ref.shape) != want:
        raise bad_request(f"'state.shape' {ref.shape} does not fit this model; expected {want}", "state.shape")
    if isinstance(ref.data, str):
        try:
            raw = base64.b64decode(ref.data, validate=True)
        except ValueError:
            raise bad_request("'state.data' is neither a list of numbers nor base64", "state.data") from None
        flat = np.frombuffer(raw, dtype="<f4") if len(raw) % 4 == 0 else np.empty(0, np.float32)
    else:
        flat = np.asarray(ref.data, dtype=np.float32)
    if flat.size != int(np.prod(want)):
        raise bad_request(f"'state.data' has {flat.size} values; this model's state has {int(np.prod(want))} "
                          f"(shape {want})", "state.data")
    if not np.isfinite(flat).all():
        raise bad_request("'state.data' must be finite numbers", "state.data")
    return decode_state(flat.astype(np.float32), info)


def joined(value: str | list[str]) -> str:
    return value if isinstance(value, str) else "".join(value)  # Ai00 concatenates list inputs


async def states(request: web.Request, serving: Serving) -> StateList:
    req = await decode_body(request, StatesRequest, serving.config.listen.max_body_bytes)
    model = await serving.model_for(req.model, keep_alive=req.keep_alive)
    initial = requested_state(req.state, model)
    channel = EventChannel()
    serving.middleware.send(ReadState(joined(req.input), channel.reply(), state=initial, model=model.name))
    result = await channel.first()
    if isinstance(result, Failed):
        raise from_failed(result, param="state" if initial is not None else None)
    if not isinstance(result, StateRead):
        raise ApiError(500, f"unexpected reply {type(result).__name__}")
    flat = encode_state(result.state, model.info)
    data = base64.b64encode(flat.astype("<f4").tobytes()).decode("ascii") if req.encoding_format == "base64" \
        else flat.tolist()
    usage = EmbeddingUsage(prompt_tokens=result.prompt_tokens, total_tokens=result.prompt_tokens)
    return StateList(model=model.name, data=[StateData(index=0, data=data, shape=state_shape(model.info))],
                     usage=usage)
