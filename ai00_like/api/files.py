"""The file-system helper routes of Ai00 (§1.9): list a folder, unzip an archive, load and
save a config.toml — POST /admin/files/{dir,ls,unzip,config/load,config/save}.

Every path a request names is relative to the folder of config.toml and must stay inside
one of the roots (the models folder, assets/tokenizer, assets/configs, the web folder;
archives unpack only into assets/unzip or assets/temp). A path that is absolute, has a
".." part, a backslash, a NUL or a percent-encoded byte, or that resolves (symlinks
followed) outside the roots, is refused with 403 before anything is read. Archives are
checked whole before one byte is written: an entry that would land outside its folder
(zip-slip), a symlink entry, or more than MAX_UNZIP_BYTES unpacked is refused, and the
bytes are counted again while unpacking in case the archive lies about its sizes.
Configs are validated with ai00_like.config before they are written, and written to a
temporary file that is then renamed over the target, so no half-written file is left; a
write the disk refuses is a 500 naming the file, with the old file as it was.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import shutil
import stat
import tempfile
import zipfile
from pathlib import Path, PurePosixPath

import msgspec
from aiohttp import web

from ..config import Config, ConfigError, parse_config
from .ai00.models import MODEL_SUFFIXES, ai00_info, file_hash
from .ai00.types import ModelFile
from .body import decode_body
from .errors import ApiError, bad_request
from .serving import Serving

log = logging.getLogger(__name__)

MAX_UNZIP_BYTES = 8 << 30  # an archive that unpacks to more than this is refused (zip bomb)
MAX_UNZIP_ENTRIES = 100_000
UNZIP_ROOTS = ("assets/unzip", "assets/temp")
_ENCODED = re.compile(r"%[0-9a-fA-F]{2}")


class DirRequest(msgspec.Struct, kw_only=True):
    path: str
    is_sha: bool = False


class UnzipRequest(msgspec.Struct, kw_only=True):
    path: str | None = None
    zip_path: str | None = None
    output: str | None = None
    target_dir: str | None = None


class ConfigLoadRequest(msgspec.Struct, kw_only=True):
    path: str


class ConfigSaveRequest(msgspec.Struct, kw_only=True):
    path: str
    config: str  # the TOML text, validated before it is written


class Roots(msgspec.Struct, kw_only=True):
    """Ours: the folders the file routes take, as paths to send them (for the web page)."""

    read: list[str]  # dir/ls, config load/save, and archives to unzip
    write: list[str]  # where archives unpack (a folder inside one of these)


class UnzipResponse(msgspec.Struct, kw_only=True):
    output: str
    files: int
    bytes: int


class ConfigFile(msgspec.Struct, kw_only=True):
    path: str
    text: str
    config: dict


# ------------------------------------------------------------------------------ confinement


def base_dir(config: Config) -> Path:
    return Path(config.base_dir).resolve()


def read_roots(config: Config) -> list[Path]:
    base = base_dir(config)
    roots = [config.model_dir, base / "assets/tokenizer", base / "assets/configs", base / "assets/www"]
    if config.web is not None:
        web_path = config.resolve(config.web.path)
        roots.append(web_path if web_path.suffix.lower() != ".zip" else web_path.parent)
    return [r.resolve() for r in roots]


def write_roots(config: Config) -> list[Path]:
    return [(base_dir(config) / r).resolve() for r in UNZIP_ROOTS]


def refused(param: str, wanted: str, why: str) -> ApiError:
    return ApiError(403, f"'{param}': {wanted!r} {why}", type="permission_error", param=param,
                    code="path_not_allowed")


def confine(config: Config, wanted: str, roots: list[Path], param: str) -> Path:
    """`wanted` (relative to the config's folder) resolved, if it stays inside one of `roots`."""
    if not wanted:
        raise bad_request(f"'{param}' must name a path", param)
    if "\x00" in wanted or "\\" in wanted or _ENCODED.search(wanted):
        raise refused(param, wanted, "contains a NUL, a backslash or a percent-encoded byte")
    pure = PurePosixPath(wanted)
    if pure.is_absolute() or wanted.startswith("~") or re.match(r"^[A-Za-z]:", wanted):
        raise refused(param, wanted, "is absolute; paths are relative to the server's folder")
    if ".." in pure.parts:
        raise refused(param, wanted, "has a '..' part")
    path = (base_dir(config) / pure).resolve()  # follows symlinks: one leading outside lands outside
    if not any(path == r or path.is_relative_to(r) for r in roots):
        allowed = ", ".join(shown(config, r) for r in roots)
        raise refused(param, wanted, f"is not inside the folders this server exposes ({allowed})")
    return path


def shown(config: Config, path: Path) -> str:
    try:
        return str(path.relative_to(base_dir(config)))
    except ValueError:
        return str(path)


def _inside_roots(path: Path, roots: list[Path]) -> bool:
    real = path.resolve()
    return any(real == r or real.is_relative_to(r) for r in roots)


async def files_roots(request: web.Request, serving: Serving) -> Roots:
    """The roots a request can name: those inside the server's folder (others would be
    absolute paths, which every route refuses); folders to read only if they exist (unzip
    creates its output's parents)."""
    config = serving.config
    base = base_dir(config)
    read = [shown(config, r) for r in read_roots(config) if r.is_relative_to(base) and r.is_dir()]
    write = [shown(config, r) for r in write_roots(config) if r.is_relative_to(base)]
    return Roots(read=list(dict.fromkeys(read)), write=write)


# ------------------------------------------------------------------------------ dir / ls


def list_dir(config: Config, folder: Path, with_sha: bool) -> list[ModelFile]:
    from ..rwkv.loader import read_model_info

    roots = read_roots(config)
    out = []
    for p in sorted(folder.iterdir()):
        # A symlink inside a root that leads outside is neither listed nor read.
        if p.name.startswith(".") or not _inside_roots(p, roots) or not p.is_file():
            continue
        info, error = None, None
        if p.suffix.lower() in MODEL_SUFFIXES:
            try:
                info = ai00_info(read_model_info(p))
            except Exception as e:  # noqa: BLE001 — a broken or foreign file is listed, with the reason
                error = str(e)
        out.append(ModelFile(path=shown(config, p.resolve()), name=p.name, size=p.stat().st_size,
                             sha=file_hash(p) if with_sha else "", info=info, error=error))
    return out


async def files_dir(request: web.Request, serving: Serving) -> list[ModelFile]:
    config = serving.config
    req = await decode_body(request, DirRequest, config.listen.max_body_bytes)
    folder = confine(config, req.path, read_roots(config), "path")
    if not folder.is_dir():
        raise ApiError(404, f"'path': no such folder: {req.path}", param="path", code="file_not_found")
    return await asyncio.to_thread(list_dir, config, folder, req.is_sha)


# ------------------------------------------------------------------------------ unzip


def check_archive(archive: zipfile.ZipFile, param: str) -> int:
    """Refuse the whole archive before writing anything; the declared unpacked size."""
    infos = archive.infolist()
    if len(infos) > MAX_UNZIP_ENTRIES:
        raise ApiError(413, f"the archive has {len(infos)} entries, more than {MAX_UNZIP_ENTRIES}", param=param,
                       code="archive_too_large")
    total = 0
    for info in infos:
        name = info.filename
        pure = PurePosixPath(name)
        if ("\\" in name or "\x00" in name or pure.is_absolute() or ".." in pure.parts
                or re.match(r"^[A-Za-z]:", name)):
            raise refused(param, name, "is an archive entry that would land outside the output folder")
        if stat.S_ISLNK(info.external_attr >> 16):
            raise refused(param, name, "is a symlink entry; archives with links are not unpacked")
        total += info.file_size
    if total > MAX_UNZIP_BYTES:
        raise ApiError(413, f"the archive unpacks to {total} bytes, more than the limit of {MAX_UNZIP_BYTES}",
                       param=param, code="archive_too_large")
    return total


def unpack(archive: zipfile.ZipFile, target: Path, param: str) -> tuple[int, int]:
    written = files = 0
    for info in archive.infolist():
        dest = target / PurePosixPath(info.filename)
        if info.is_dir():
            dest.mkdir(parents=True, exist_ok=True)
            continue
        dest.parent.mkdir(parents=True, exist_ok=True)
        with archive.open(info) as src, dest.open("xb") as out:
            while block := src.read(1 << 20):
                written += len(block)
                if written > MAX_UNZIP_BYTES:  # the sizes in the archive lied
                    raise ApiError(413, f"the archive unpacks to more than the limit of {MAX_UNZIP_BYTES} bytes",
                                   param=param, code="archive_too_large")
                out.write(block)
        files += 1
    return files, written


def unzip_into(config: Config, zip_file: Path, output: Path, param: str) -> UnzipResponse:
    with zipfile.ZipFile(zip_file) as archive:
        check_archive(archive, param)
        # Unpack beside the output, then swap it in: a refused or failed archive leaves the
        # old output as it was.
        output.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=".unzip-", dir=output.parent))
        try:
            files, written = unpack(archive, staging, param)
            if output.is_dir() and not output.is_symlink():
                shutil.rmtree(output)
            elif output.exists() or output.is_symlink():
                output.unlink()
            staging.rename(output)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
    return UnzipResponse(output=shown(config, output), files=files, bytes=written)


async def files_unzip(request: web.Request, serving: Serving) -> UnzipResponse:
    config = serving.config
    req = await decode_body(request, UnzipRequest, config.listen.max_body_bytes)
    zip_param = "zip_path" if req.zip_path else "path"
    zip_file = confine(config, req.zip_path or req.path or "", read_roots(config) + write_roots(config), zip_param)
    out_param = "target_dir" if req.target_dir else "output"
    output = confine(config, req.target_dir or req.output or "", write_roots(config), out_param)
    if output in write_roots(config):
        raise refused(out_param, req.target_dir or req.output or "", "is an unzip root itself; name a folder inside it")
    if not zip_file.is_file() or not zipfile.is_zipfile(zip_file):
        raise ApiError(404, f"'{zip_param}': no such zip file: {req.zip_path or req.path}", param=zip_param,
                       code="file_not_found")
    try:
        return await asyncio.to_thread(unzip_into, config, zip_file, output, zip_param)
    except zipfile.BadZipFile as e:
        raise bad_request(f"'{zip_param}': broken zip file: {e}", zip_param) from None
    except (FileExistsError, NotADirectoryError, IsADirectoryError) as e:  # e.g. the same name twice
        raise bad_request(f"'{zip_param}': the archive's entries clash: {e.filename and Path(e.filename).name}: "
                          f"{e.strerror}", zip_param) from None


# ------------------------------------------------------------------------------ config load / save


def _config_path(config: Config, wanted: str) -> Path:
    path = confine(config, wanted, read_roots(config), "path")
    if path.suffix.lower() != ".toml":
        raise refused("path", wanted, "is not a .toml file")
    return path


async def config_load(request: web.Request, serving: Serving) -> ConfigFile:
    config = serving.config
    req = await decode_body(request, ConfigLoadRequest, config.listen.max_body_bytes)
    path = _config_path(config, req.path)
    if not path.is_file():
        raise ApiError(404, f"'path': no such file: {req.path}", param="path", code="file_not_found")
    text = path.read_text(encoding="utf-8", errors="replace")
    try:
        parsed = parse_config(text, source=req.path, base_dir=path.parent)
    except ConfigError as e:
        raise bad_request(str(e), "path", code="invalid_config") from None
    as_dict = msgspec.to_builtins(parsed)
    as_dict.pop("base_dir", None)
    as_dict.pop("source", None)
    return ConfigFile(path=shown(config, path), text=text, config=as_dict)


def _umask() -> int:
    """The process's umask, read without changing it (os.umask would, for every thread)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    return 0o022


def write_atomically(path: Path, text: str) -> None:
    # mkstemp makes a 0600 file; the renamed file keeps the mode of the one it replaces
    # (or, when new, the mode open() would give it).
    try:
        mode = stat.S_IMODE(path.stat().st_mode)
    except FileNotFoundError:
        mode = 0o666 & ~_umask()
    fd, temp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            os.fchmod(f.fileno(), mode)
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(temp, path)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise


async def config_save(request: web.Request, serving: Serving) -> ConfigFile:
    config = serving.config
    req = await decode_body(request, ConfigSaveRequest, config.listen.max_body_bytes)
    path = _config_path(config, req.path)
    if not path.parent.is_dir():
        raise ApiError(404, f"'path': no such folder: {shown(config, path.parent)}", param="path",
                       code="file_not_found")
    if path.exists() and not path.is_file():
        raise bad_request(f"'path': {req.path} is not a file", "path")
    try:
        parsed = parse_config(req.config, source=req.path, base_dir=path.parent)
    except ConfigError as e:
        raise bad_request(str(e), "config", code="invalid_config") from None
    try:
        await asyncio.to_thread(write_atomically, path, req.config)
    except OSError as e:  # the disk's fault, not the request's: the old file is left as it was
        log.warning("config save: could not write %s: %s", path, e)
        raise ApiError(500, f"'path': could not write {shown(config, path)}: {e.strerror or e}", param="path",
                       code="write_failed") from None
    as_dict = msgspec.to_builtins(parsed)
    as_dict.pop("base_dir", None)
    as_dict.pop("source", None)
    return ConfigFile(path=shown(config, path), text=req.config, config=as_dict)
