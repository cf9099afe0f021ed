"""POST /admin/models/load, GET|POST /admin/models/unload, POST /admin/models/save.

Every path a request names must lie inside [model] path (Ai00 checks the model path but
not the tokenizer path; we check both), and errors name it relative to that folder, never
by the server's absolute path. A load builds the new model while the old one
keeps serving and answers when it is ready; a failed load leaves the old one in place.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path

from aiohttp import web

from ...messages import Failed, LoraSpec, ModelSpec, Save, StateSpec
from ...rwkv import DEVICES, check_device
from ...rwkv.quant import quant_options
from ..body import decode_body
from ..channel import EventChannel
from ..errors import ApiError, bad_request, from_failed
from ..serving import Serving
from ..keep_alive import keep_alive_seconds
from .models import server_status
from .types import ReloadRequest, SaveRequest, SaveResponse, ServerStatus, UnloadRequest


def inside(root: Path, wanted: str, param: str, *, must_exist: bool = True) -> Path:
    """`wanted` (relative to `root`, or absolute) as a path that stays inside `root`."""
    root = root.resolve()
    path = (root / wanted).resolve()
    if not path.is_relative_to(root):
        raise ApiError(403, f"'{param}' must name a file inside the models folder", param=param,
                       code="path_not_allowed")
    if must_exist and not path.is_file():
        raise ApiError(404, f"'{param}': no such file: {wanted}", param=param, code="file_not_found")
    return path


def reload_spec(req: ReloadRequest, serving: Serving) -> ModelSpec:
    config, root = serving.config, serving.config.model_dir
    device = req.device or config.model.device
    try:
        check_device(device)
    except ValueError:
        raise bad_request(f"'device' must be one of {', '.join(DEVICES)} or an adapter index, got '{device}'",
                          "device") from None
    model = config.model
    try:
        precision, quant, quant_type = quant_options(
            req.precision or model.precision, model.quant if req.quant is None else req.quant,
            req.quant_type or model.quant_type)
    except ValueError as e:
        raise bad_request(str(e), "precision" if "precision" in str(e) else "quant" if "quant must" in str(e)
                          else "quant_type") from None
    for name, value in (("max_batch", req.max_batch), ("token_chunk_size", req.token_chunk_size)):
        if value is not None and value < 1:
            raise bad_request(f"'{name}' must be >= 1, got {value}", name)
    if req.tokenizer_path:
        tokenizer = str(inside(root, req.tokenizer_path, "tokenizer_path"))
    else:
        tokenizer = str(config.resolve(config.tokenizer.path)) if config.tokenizer.path else None
    states = []
    for i, s in enumerate(req.state):
        path = inside(root, s.path, f"state[{i}].path")
        states.append(StateSpec(str(path), s.id or str(uuid.uuid5(uuid.NAMESPACE_URL, f"ai00-like-state:{s.path}")),
                                s.name or path.name, s.default))
    return ModelSpec(
        path=str(inside(root, req.model_path, "model_path")),
        tokenizer=tokenizer,
        device=device,
        precision=precision,
        quant=quant,
        quant_type=quant_type,
        quant_head=model.quant_head if req.quant_head is None else req.quant_head,
        exact=model.exact,
        max_batch=req.max_batch or config.model.max_batch,
        max_tokens_limit=config.model.max_tokens_limit,
        token_chunk_size=req.token_chunk_size or config.model.token_chunk_size,
        loras=tuple(LoraSpec(str(inside(root, lora.path, f"lora[{i}].path")), lora.alpha)
                    for i, lora in enumerate(req.lora)),
        states=tuple(states),
        cache_bytes=config.model.cache_bytes,
        checkpoint_interval=config.model.checkpoint_interval,
        name=req.served_name,
        models_dir=str(root),
        max_prompt_tokens=config.listen.max_prompt_tokens,
        thinking=req.thinking or config.model.thinking,
        reasoning_effort=req.reasoning_effort or config.model.reasoning_effort,
        disk_cache=config.disk_cache(),
    )


async def load(request: web.Request, serving: Serving) -> ServerStatus:
    """Load a model under its served name (a new name adds a model; a loaded one's old copy
    serves until the new one is ready); with `model` alone, load a model the server serves."""
    req = await decode_body(request, ReloadRequest, serving.config.listen.max_body_bytes)
    if sum(s.default for s in req.state) > 1:
        raise bad_request("at most one state may have default = true", "state")
    if not req.model_path:
        if not req.model:
            raise bad_request("name the model to load: 'model' (a served model) or 'model_path' (a file)",
                              "model_path", code="missing_required_field")
        entry = serving.pool.find(req.model)
        await serving.pool.ensure_loaded(entry)
    else:
        entry = serving.pool.entry_for(reload_spec(req, serving))
        await serving.load(entry.served.spec)
        # As Ai00's load replaces its one model, the file loaded becomes the model that
        # requests without `model` get (the page's chat among them).
        serving.pool.make_default(entry)
    if req.keep_alive is not None:
        serving.pool.set_keep_alive(entry, keep_alive_seconds(req.keep_alive), admin=True)
    return await server_status(serving, entry.name)


async def unload(request: web.Request, serving: Serving) -> ServerStatus:
    """Unload one model (`model` in the body or the query) or, named none, every model; each
    once its running requests have ended."""
    req = await decode_body(request, UnloadRequest, serving.config.listen.max_body_bytes) \
        if request.method == "POST" and request.can_read_body else UnloadRequest()
    await serving.unload(req.model or request.query.get("model"))
    return await server_status(serving)


async def save(request: web.Request, serving: Serving) -> SaveResponse:
    """Write the loaded model, LoRAs merged, as safetensors inside the models folder.

    Ai00 writes a CBOR "prefab" of its quantised GPU model; ours is a plain official-layout
    .st that every loader (ours, Ai00's converter path, the reference after conversion) reads.
    """
    req = await decode_body(request, SaveRequest, serving.config.listen.max_body_bytes)
    name = req.path or req.model_path
    if not name:
        raise bad_request("'path' must name the file to write, inside the models folder", "path")
    root = serving.config.model_dir.resolve()
    target = inside(root, name, "path", must_exist=False)
    check_save_target(target, target.relative_to(root))
    model = await serving.model_for(req.model)
    channel = EventChannel()
    serving.middleware.send(Save(str(target), channel.reply(), req.dtype, model=model.name))
    event = await channel.first()
    if isinstance(event, Failed):
        # The middleware's reason names no path; the client learns the one it gave.
        if event.kind == "bad_request":
            raise bad_request(f"'path': cannot write {target.relative_to(root)}: {event.message}", "path",
                              code="not_writable")
        raise from_failed(event, "path")
    return SaveResponse(path=str(Path(event.path).relative_to(root)), bytes=event.bytes)


def check_save_target(target: Path, shown: Path) -> None:
    """The client's mistakes, told before any writing starts and in the models folder's terms
    (`shown`: the path relative to it), never with the server's absolute paths."""
    if target.exists():
        if target.is_dir():
            raise bad_request(f"'path': {shown} is a folder; name the file to write", "path")
        raise ApiError(409, f"'path': {shown} exists already; saving never overwrites a file", param="path",
                       code="file_exists")
    folder, shown_folder = target.parent, shown.parent
    if not folder.is_dir():
        why = f"'{shown_folder}' is a file, not a folder" if folder.exists() else \
            f"there is no folder '{shown_folder}' in the models folder"
        raise bad_request(f"'path': cannot write {shown}: {why}", "path", code="folder_not_found")
    if not os.access(folder, os.W_OK):
        raise bad_request(f"'path': cannot write {shown}: the folder '{shown_folder}' is not writable by the "
                          "server", "path", code="not_writable")


# ------------------------------------------------------------------------------ who may use them


