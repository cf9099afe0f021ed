"""The models this server can serve, loaded or not: config.toml's sections and the files
of the models folder that no section names ([server] serve_folder).

A ServedModel is what a request's `model` field can pick: its id, the other names it
answers to, how to load it (a ModelSpec) and when to load and unload it. Which of them are
loaded at a time is the HTTP tier's policy (api/pool.py).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Literal

import msgspec

from .messages import ModelSpec
from .rwkv.loader import read_model_info

log = logging.getLogger(__name__)

MODEL_SUFFIXES = (".st", ".safetensors", ".pth", ".prefab")
PINNED = -1.0  # keep_alive that never unloads
FOLDER_KEEP_ALIVE = 300.0  # Ollama's default: five idle minutes


class ServedModel(msgspec.Struct, frozen=True, kw_only=True):
    name: str  # the id clients send, and the middleware's key
    spec: ModelSpec
    aliases: tuple[str, ...] = ()
    keep_alive: float = PINNED  # idle seconds before it is unloaded; 0 at once; -1 never
    load: Literal["startup", "on_demand"] = "on_demand"
    origin: Literal["config", "folder", "admin"] = "config"

    def names(self) -> set[str]:
        """Every name a request may use for it: its id, its file's name and stem, its aliases."""
        path = Path(self.spec.path)
        return {self.name, path.name, path.stem, *self.aliases}


class FolderModels:
    """The model files of the models folder, read again whenever the folder changes (a pull or
    an upload adds files while the server runs); a file is read once per size and mtime."""

    def __init__(self, folder: Path, *, enabled: bool, max_prompt_tokens: int, disk_cache=None):
        self.folder, self.enabled, self.max_prompt_tokens = folder, enabled, max_prompt_tokens
        self.disk_cache = disk_cache  # [cache]'s DiskCacheSpec, or None
        self._seen: dict[tuple[str, int, int], bool] = {}  # (path, size, mtime) → is a model

    def scan(self, named: set[Path], taken: set[str]) -> list[ServedModel]:
        """Files not in `named` (paths the sections use), under ids not in `taken` (which it fills)."""
        if not self.enabled or not self.folder.is_dir():
            return []
        found = []
        for path in sorted(self.folder.iterdir()):
            if path.suffix.lower() not in MODEL_SUFFIXES or path.resolve() in named or path.name in taken:
                continue
            if self._is_model(path):
                # Named as [model] names its file, by the stem, unless another model has it.
                name = path.stem if path.stem not in taken else path.name
                taken.add(name)
                # ModelSpec's defaults are [model]'s.
                spec = ModelSpec(path=str(path), name=name, models_dir=str(self.folder),
                                 max_prompt_tokens=self.max_prompt_tokens, disk_cache=self.disk_cache)
                found.append(ServedModel(name=name, spec=spec, keep_alive=FOLDER_KEEP_ALIVE, origin="folder"))
        return found

    def _is_model(self, path: Path) -> bool:
        """A state or LoRA file beside the models is not one: only a file whose tensors make a
        model is served."""
        try:
            st = path.stat()
        except OSError:
            return False
        key = (str(path), st.st_size, st.st_mtime_ns)
        if key not in self._seen:
            try:
                read_model_info(path)
                self._seen[key] = True
            except Exception as exc:  # a foreign or broken file is not served, and is said once
                log.info("%s in the models folder is not served: %s", path.name, exc)
                self._seen[key] = False
        return self._seen[key]
