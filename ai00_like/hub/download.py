"""Fetching a model file from the Hugging Face hub (or a mirror: `HF_ENDPOINT`; gated
repositories: `HF_TOKEN`) into the models folder, with huggingface_hub.

The download goes to `.downloads/NAME.part` inside the folder, appended to from where it
stopped: huggingface_hub's `http_get` resumes a connection that breaks within one pull, and
the next pull resumes what a killed or failed one left. Once whole, the file's SHA-256 is
checked against the hub's and only then is it renamed to its final name. So a file under
its final name is always whole and verified, and an interrupted pull costs only what was
left.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

STAGING = ".downloads"
_SHA256_HEX = 64


class PullError(Exception):
    """Why a pull failed, in one line; `missing` when the hub has no such file."""

    def __init__(self, message: str, *, missing: bool = False):
        super().__init__(message)
        self.missing = missing


def partial_path(folder: Path, filename: str) -> Path:
    """Where a download of `filename` into `folder` grows until it is whole."""
    return folder / STAGING / f"{Path(filename).name}.part"


def hub_file(repo: str, filename: str):
    """The hub's metadata of the file (size, SHA-256, where to get it), and the endpoint
    asked: raises PullError with `missing` set when the hub has no such file."""
    import huggingface_hub
    from huggingface_hub import constants, get_hf_file_metadata, hf_hub_url
    from huggingface_hub.errors import EntryNotFoundError, GatedRepoError, HfHubHTTPError, RepositoryNotFoundError

    huggingface_hub.utils.logging.set_verbosity_error()  # its retry warnings: our one line says it all
    # HF_ENDPOINT read now, not when huggingface_hub was imported: a server's pulls follow it.
    endpoint = os.environ.get("HF_ENDPOINT", "").rstrip("/") or constants.ENDPOINT
    where = f"{repo}/{filename} at {endpoint}"
    try:
        return get_hf_file_metadata(hf_hub_url(repo, filename, endpoint=endpoint)), endpoint
    except (RepositoryNotFoundError, EntryNotFoundError, GatedRepoError) as e:
        kind = "gated (set HF_TOKEN)" if isinstance(e, GatedRepoError) else "not on the hub"
        raise PullError(f"{where} is {kind}", missing=True) from None
    except HfHubHTTPError as e:
        raise PullError(f"the hub refused {where}: {_first_line(e)}") from None
    except Exception as e:  # the connection's errors, whatever httpx's version calls them
        raise PullError(f"could not reach the hub for {where}: {type(e).__name__}: {_first_line(e)}") from None


def pull(repo: str, filename: str, folder: Path, on_size=None) -> Path:
    """Download `filename` of `repo` into `folder` (made if missing) and return its path.
    `on_size(bytes)` hears the file's size once the hub has given it."""
    from huggingface_hub.file_download import http_get
    from huggingface_hub.utils import build_hf_headers

    metadata, endpoint = hub_file(repo, filename)
    if on_size is not None:
        on_size(metadata.size)
    final = folder / Path(filename).name
    part = partial_path(folder, filename)
    if final.exists():
        if final.stat().st_size == metadata.size and _matches(final, metadata.etag):
            return final
        raise PullError(f"{final} exists and is not the hub's {filename}: move it away first")
    try:
        part.parent.mkdir(parents=True, exist_ok=True)
        with open(part, "ab") as f:
            if f.tell() > metadata.size:  # not this file's beginning: start over
                f.truncate(0)
            http_get(metadata.location, f, resume_size=f.tell(), headers=build_hf_headers(),
                     expected_size=metadata.size, displayed_filename=final.name)
    except Exception as e:  # the connection's and the disk's errors, whatever httpx's version calls them
        raise PullError(f"could not download {repo}/{filename} at {endpoint}: {type(e).__name__}: "
                        f"{_first_line(e)} (a retry resumes)") from None
    if not _matches(part, metadata.etag):
        part.unlink()
        raise PullError(f"{filename} from {endpoint} does not match the hub's SHA-256; it was removed")
    os.replace(part, final)
    _tidy(part.parent)
    return final


def _matches(path: Path, etag: str | None) -> bool:
    """Whether the file's SHA-256 is the hub's. A large (LFS) file's ETag is its SHA-256;
    a small file's is git's blob hash, which says nothing here: then only the size was
    checked."""
    if not etag or len(etag) != _SHA256_HEX:
        return True
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 22):
            digest.update(block)
    return digest.hexdigest() == etag


def _tidy(staging: Path) -> None:
    """Remove the staging folder once no unfinished download is left in it."""
    if not any(staging.iterdir()):
        shutil.rmtree(staging, ignore_errors=True)


def _first_line(error: Exception) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__
