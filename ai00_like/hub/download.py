"""Fetching a model file from the Hugging Face hub (or a mirror: `HF_ENDPOINT`; gated
repositories: `HF_TOKEN`) into the models folder, with huggingface_hub.

The download goes to `.downloads/OWNER--REPO--NAME.DIGEST.part` inside the folder (one per
repository and file), appended to from where it stopped: huggingface_hub's `http_get` resumes
a connection that breaks within one pull, and the next pull resumes what a killed or failed
one left. Once whole, the file's SHA-256 is checked against the hub's and only then is it
renamed to its final name. So a file under its final name is always whole and verified, and
an interrupted pull costs only what was left.

HF_TOKEN goes only to the hub's own origin (HF_ENDPOINT's scheme, host and port): a file the
hub redirects elsewhere (a CDN) is fetched without it. Before any byte is fetched, the
folder's free space is checked against what the file still needs.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path
from urllib.parse import urljoin, urlsplit

STAGING = ".downloads"
_SHA256_HEX = 64
_DEFAULT_PORTS = {"http": 80, "https": 443}


class PullError(Exception):
    """Why a pull failed, in one line; `missing` when the hub has no such file, `code` a
    short name of the reason for an API's error (None: the hub could not be asked)."""

    def __init__(self, message: str, *, missing: bool = False, code: str | None = None):
        super().__init__(message)
        self.missing, self.code = missing, code


def partial_path(folder: Path, repo: str, filename: str) -> Path:
    """Where a download of `filename` of `repo` into `folder` grows until it is whole. Keyed
    by the repository and the whole path in it, so that two repositories' (or folders')
    files of one name never append to each other; the digest keeps apart what the readable
    part might not (a name with `--` in it)."""
    digest = hashlib.sha256(f"{repo}/{filename}".encode()).hexdigest()[:12]
    return folder / STAGING / f"{repo.replace('/', '--')}--{Path(filename).name}.{digest}.part"


def still_needed(folder: Path, repo: str, filename: str, size: int | None) -> int:
    """Bytes the disk must still take for the file: none once it is under its final name
    (pull checks it then), else its size less what its partial file holds."""
    if size is None or (folder / Path(filename).name).exists():
        return 0
    part = partial_path(folder, repo, filename)
    held = part.stat().st_size if part.exists() else 0
    return size - held if held <= size else size  # a longer part is not this file's: it starts over


def check_room(folder: Path, repo: str, filename: str, size: int | None) -> None:
    """Raise PullError (code `insufficient_storage`) when the folder's disk has less free
    space than the file still needs: better refused at once than failing at 90 %."""
    needed = still_needed(folder, repo, filename, size)
    if needed <= 0:
        return
    free = shutil.disk_usage(_existing(folder)).free
    if needed > free:
        raise PullError(f"{repo}/{filename} needs {_size(needed)} more but {folder} has {_size(free)} free: "
                        "free some space or pull into another folder", code="insufficient_storage")


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

    metadata, endpoint = hub_file(repo, filename)
    if on_size is not None:
        on_size(metadata.size)
    final = folder / Path(filename).name
    part = partial_path(folder, repo, filename)
    if final.exists():
        if final.stat().st_size == metadata.size and _matches(final, metadata.etag):
            return final
        raise PullError(f"{final} exists and is not the hub's {filename}: move it away first")
    check_room(folder, repo, filename, metadata.size)
    try:
        part.parent.mkdir(parents=True, exist_ok=True)
        with open(part, "ab") as f:
            if f.tell() > metadata.size:  # not this file's beginning: start over
                f.truncate(0)
            http_get(metadata.location, f, resume_size=f.tell(), headers=_headers_for(metadata.location, endpoint),
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


def _existing(folder: Path) -> Path:
    """The folder, or its nearest ancestor that exists: the folder is made only once the
    download starts, and until then the disk it will be on is its ancestor's."""
    folder = folder.absolute()
    while not folder.exists() and folder.parent != folder:
        folder = folder.parent
    return folder


def _size(n: int) -> str:
    return f"{n / 1e9:.2f} GB" if n >= 10**8 else f"{n / 1e6:.2f} MB"


def _headers_for(url: str, endpoint: str) -> dict[str, str]:
    """huggingface_hub's headers for a GET of `url`, with HF_TOKEN only when `url` is on the
    hub's own origin: a signed CDN URL needs no token, and a token must not reach a host
    that is not the hub (huggingface_hub's own downloads drop it the same way)."""
    from huggingface_hub.utils import build_hf_headers

    ours = _origin(urljoin(endpoint + "/", url)) == _origin(endpoint)
    return build_hf_headers(token=None if ours else False)


def _origin(url: str) -> tuple[str, str, int | None]:
    parsed = urlsplit(url)
    scheme = parsed.scheme.lower()
    return scheme, (parsed.hostname or "").lower(), parsed.port or _DEFAULT_PORTS.get(scheme)
